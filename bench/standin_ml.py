"""A lightweight stand-in ML program: the SwarmCallback protocol with a numpy "model", no torch.

It is a real ML program to its SL (``SwarmCallbackBase`` with a numpy platform part), so every sync goes
through the same socket, ledger round, transfers and merge as a torch program's, while the process costs
a few MB and no CPU for training. Environment:

- ``MODEL_BYTES``: size of the float32 model (split into 16 tensors and a step counter);
- ``ROUNDS``: syncs after ``on_train_begin``; ``WORK_S``: seconds of pretend local training before each
  (a sleep, as if on the node's own hardware); ``MIN_PEERS``;
- ``RESULT``: JSON file for ``{"sync_s": [...], "done": [...], "timings": {...}}`` (duration and end time
  of every sync; the callback's ``timings``, where its syncs spent their time);
- ``SECURE=1``: train with ``secureAggregation=True``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from swarmlearning.client.swarm import SwarmCallbackBase
from wire.tensors import FlatState

__all__ = ["NumpyCallback", "make_model"]

TENSORS = 16


def make_model(nbytes: int, seed: int) -> dict[str, np.ndarray]:
    """A float32 model of about ``nbytes`` in ``TENSORS`` tensors, plus an int64 step counter."""
    rng = np.random.default_rng(seed)
    per = max(nbytes // 4 // TENSORS, 1)
    model = {f"layer{i}.weight": rng.standard_normal(per, dtype=np.float32) for i in range(TENSORS)}
    model["steps"] = np.zeros((), dtype=np.int64)
    return model


class NumpyCallback(SwarmCallbackBase):
    """SwarmCallback for a dict of numpy arrays (``model=``)."""

    platform = "NUMPY"

    def _validate_platform(self, kwargs: dict[str, Any]) -> None:
        model = kwargs.get("model")
        if not isinstance(model, dict):
            raise TypeError("NumpyCallback: model must be a dict of numpy arrays")
        self.arrays: dict[str, np.ndarray] = model

    def _collect_weights(self, reuse: FlatState | None) -> FlatState:
        return FlatState.from_arrays(self.arrays, reuse=reuse)

    def _load_weights(self, flat: FlatState) -> None:
        for spec in flat.specs:
            np.copyto(self.arrays[spec.name], flat.view(spec))

    def _loss_and_metric(self) -> tuple[float | None, float | None]:
        return None, None


def main() -> None:
    """Begin, ``ROUNDS`` syncs (each after ``WORK_S`` of pretend training), end; write the timings."""
    env = os.environ
    rounds, work = int(env.get("ROUNDS", "10")), float(env.get("WORK_S", "0"))
    model = make_model(int(env.get("MODEL_BYTES", "100000")), int(env.get("SEED", "0")))
    secure = {"secureAggregation": True} if env.get("SECURE") == "1" else {}
    callback = NumpyCallback(1, int(env.get("MIN_PEERS", "2")), model=model, totalEpochs=1, **secure)
    callback.on_train_begin()
    sync_s, done = [], []
    seed = int(env.get("SEED", "0"))
    for _ in range(rounds):
        time.sleep(work)
        model["layer0.weight"][:64] += 0.01 * (seed + 1)  # each node's model changes its own way
        model["steps"] += 1
        start = time.perf_counter()
        callback.on_batch_end()
        sync_s.append(time.perf_counter() - start)
        done.append(time.time())
    callback.on_train_end()
    Path(env["RESULT"]).write_text(json.dumps({"sync_s": sync_s, "done": done, "timings": callback.timings}))


if __name__ == "__main__":
    main()
