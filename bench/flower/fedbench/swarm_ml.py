"""The swarm side of the Flower comparison: the same rounds as the Flower ClientApp, with SwarmCallback.

Run by each SL (spawned by the SWOP) as ``python3 model/swarm_ml.py``. Environment: ``MNIST_PYT`` (the
example's model program), ``DATA_DIR`` (this node's shard), ``PARTITION``, ``ROUNDS``, ``LOCAL_EPOCHS``,
``BATCH_SIZE``, ``MIN_PEERS``, ``RESULT_DIR``. After every ``LOCAL_EPOCHS`` whole epochs the node merges with
its peers (one sync round); partition 0 tests the final swarm model and every node writes ``node<P>.json``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import task  # the module beside this file (bench/flower/fedbench/task.py)

from swarmlearning.pyt import SwarmCallback


def main() -> None:
    """Train ``ROUNDS`` rounds of ``LOCAL_EPOCHS`` epochs, merging after each, then test the final model."""
    env = os.environ
    partition, rounds = int(env["PARTITION"]), int(env["ROUNDS"])
    batch_size = int(env["BATCH_SIZE"])
    train_ds, test_ds = task.load_shard(env["DATA_DIR"])
    steps = task.round_steps(train_ds, local_epochs=int(env["LOCAL_EPOCHS"]), batch_size=batch_size)
    model = task.make_net()
    swarm = SwarmCallback(
        syncFrequency=steps,
        minPeers=int(env["MIN_PEERS"]),
        model=model,
        totalEpochs=rounds,  # one on_epoch_end (progress report) per round
        sampleCount=len(train_ds),
        mergeMethod="mean",
    )
    swarm.on_train_begin()
    round_done = []
    for rnd in range(1, rounds + 1):
        for _ in task.train_round(
            model, train_ds, partition=partition, rnd=rnd, steps=steps, batch_size=batch_size
        ):
            swarm.on_batch_end()
        round_done.append(time.time())
        swarm.on_epoch_end(rnd - 1)  # progress for the ledger: one report per round
    swarm.on_train_end()
    result = {"partition": partition, "round_done": round_done, "end": time.time()}
    if partition == 0:
        result["accuracy"] = task.evaluate(model, test_ds)
        result["end"] = time.time()
    out = Path(env["RESULT_DIR"]) / f"node{partition}.json"
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
