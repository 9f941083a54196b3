"""A small real trial for end-to-end tests: a softmax regression in numpy on generated data.

Parameters (environment): LR (learning rate), STEPS, BOOTSTRAP_SEED (train on a bootstrap sample when
set), HOLD (seconds to wait before training, so that a test can kill the run). It writes its pid to
``pid`` in its working directory, and reports ``val_error`` and the class probabilities of two probe
samples with ``swarmlearning.trial.report_trial``.
"""

import os
import time
from pathlib import Path

import numpy as np

from swarmlearning.trial import report_trial

Path("pid").write_text(str(os.getpid()))
time.sleep(float(os.environ.get("HOLD", "0")))
lr = float(os.environ.get("LR", "0.1"))
steps = int(os.environ.get("STEPS", "60"))
data_rng = np.random.default_rng(7)
x = data_rng.normal(size=(300, 4))
y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(int) + (x[:, 2] > 1).astype(int)
train_x, train_y, val_x, val_y = x[:200], y[:200], x[200:], y[200:]
if "BOOTSTRAP_SEED" in os.environ:
    pick = np.random.default_rng(int(os.environ["BOOTSTRAP_SEED"])).integers(0, 200, 200)
    train_x, train_y = train_x[pick], train_y[pick]
w = np.zeros((4, 3))


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


for _ in range(steps):
    p = softmax(train_x @ w)
    p[np.arange(len(train_y)), train_y] -= 1
    w -= lr * train_x.T @ p / len(train_y)
val_error = float(np.mean(softmax(val_x @ w).argmax(axis=1) != val_y))
probes = val_x[:2]
report_trial(
    {"val_error": val_error, "lr": lr}, probabilities=softmax(probes @ w).tolist(), probes=probes.tolist()
)
