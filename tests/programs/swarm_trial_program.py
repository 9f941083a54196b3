"""A tiny real SWARM-mode trial: a 2-layer net on synthetic data trained with SwarmCallback in the trial's
own training contract, reporting its validation error with ``swarmlearning.trial.report_trial``.

Parameters (environment): LR, HIDDEN (width), MIN_PEERS, EPOCHS, BATCHES. Each node's data is drawn
from the host path of its private data directory (``data`` in its working directory), so nodes differ.
``FAIL_FIRST_UNDER``: the first attempt of trial 0 exits 3 on a node whose data path contains it.
"""

import hashlib
import os
from pathlib import Path

import torch

from swarmlearning.pyt import SwarmCallback
from swarmlearning.trial import report_trial, trial_contract

torch.set_num_threads(1)
env = os.environ.get
data_path = str(Path("data").resolve())
fail_under = env("FAIL_FIRST_UNDER")
first = env("SWARM_TRIAL_INDEX") == "0" and env("SWARM_TRIAL_ATTEMPT") == "1"
if fail_under and fail_under in data_path and first:
    print("failing the first attempt on purpose", flush=True)
    raise SystemExit(3)
seed = int(hashlib.sha256(data_path.encode()).hexdigest()[:8], 16)
torch.manual_seed(0)  # the same initial model on every node
hidden = int(env("HIDDEN", "8"))
model = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2))
data = torch.randn(192, 8, generator=torch.Generator().manual_seed(100 + seed))
labels = (data[:, 0] + data[:, 1] > 0).long()
train_x, train_y, val_x, val_y = data[:128], labels[:128], data[128:], labels[128:]
opt = torch.optim.SGD(model.parameters(), lr=float(env("LR", "0.1")))
loss_fn = torch.nn.CrossEntropyLoss()
epochs, batches = int(env("EPOCHS", "1")), int(env("BATCHES", "4"))
callback = SwarmCallback(
    2,
    int(env("MIN_PEERS", "2")),
    trainingContract=trial_contract(),
    model=model,
    totalEpochs=epochs,
)
callback.on_train_begin()
for epoch in range(epochs):
    for b in range(batches):
        x, y = train_x[b * 32 : b * 32 + 32], train_y[b * 32 : b * 32 + 32]
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        callback.on_batch_end(b)
    callback.on_epoch_end(epoch)
callback.on_train_end()
with torch.no_grad():
    out = model(val_x)
    val_error = float((out.argmax(dim=1) != val_y).float().mean())
    probabilities = torch.softmax(out[:2], dim=1).tolist()
report_trial(
    {"val_error": val_error, "loss": float(loss_fn(out, val_y))},
    probabilities=probabilities,
    probes=val_x[:2].tolist(),
)
