"""Swarm benchmark: the sync overhead of the mnist-pyt example at syncFrequency 128 with 4 nodes,
and the leader's mean merge throughput as a ratio of memcpy.

Each node trains the example's CNN on 8,192 private images (the bundled digits, shifted and noised) for
two epochs, so it syncs every 128 batches for real; the program records the wall time spent inside
sync rounds (``SwarmCallback.timings``). Overhead = time in sync rounds / time of the training loop.
Run: ``.venv/bin/python bench/swarm.py``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import ROOT, make_row, print_rows
from bench.processes import Processes
from bench.swarm_setup import start_sl, start_sn

NODES = 4
PER_NODE = 8192
EPOCHS = 2
SYNC_FREQUENCY = 128
PROGRAM = ROOT / "examples" / "mnist-pyt" / "model" / "mnist_pyt.py"


def node_data(seed: int, count: int = PER_NODE) -> dict[str, np.ndarray]:
    """``count`` 28x28 digit images for one node: the bundled digits, randomly shifted, with noise."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    base = np.pad(np.kron(digits.images, np.ones((3, 3))), ((0, 0), (2, 2), (2, 2))) * 255.0 / 16.0
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(base), count)
    shifted = np.stack([np.roll(base[i], tuple(rng.integers(-2, 3, 2)), axis=(0, 1)) for i in pick])
    noisy = np.clip(shifted + rng.normal(0, 12, shifted.shape), 0, 255).astype(np.uint8)
    test = np.clip(base[:400], 0, 255).astype(np.uint8)
    return {
        "x_train": noisy,
        "y_train": digits.target[pick].astype(np.uint8),
        "x_test": test,
        "y_test": digits.target[:400].astype(np.uint8),
    }


def run_example(work: Path) -> list[dict[str, Any]]:
    """Train the example on 4 standalone SLs; returns each node's result.json."""
    env = {"DATA_DIR": "data", "SCRATCH_DIR": "scratch", "MAX_EPOCHS": EPOCHS,
           "MIN_PEERS": NODES, "SYNC_FREQUENCY": SYNC_FREQUENCY, "SEED": 0}  # fmt: skip
    uids = [f"sl-{i}" for i in range(1, NODES + 1)]
    with Processes(work / "logs") as procs:
        port = start_sn(procs, work / "sn")
        for i, uid in enumerate(uids, start=1):
            data = node_data(i)
            (work / uid / "data").mkdir(parents=True)
            np.savez(
                work / uid / "data" / "mnist.npz",
                x_train=data["x_train"], y_train=data["y_train"],
                x_test=data["x_test"], y_test=data["y_test"],
            )  # fmt: skip
            start_sl(procs, port, uid, program=PROGRAM, work=work, env=env)
        for uid in uids:
            if procs.started[uid].wait(900) != 0:
                raise RuntimeError(f"{uid} failed:\n{procs.output(uid)[-2000:]}")
    return [json.loads((work / uid / "scratch" / "result.json").read_text()) for uid in uids]


def overhead_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sync share of the training loop, averaged over the nodes."""
    loop = [r["seconds"] - r["swarm"]["begin"] - r["swarm"]["end"] for r in results]
    sync = [r["swarm"]["sync"] for r in results]
    share = float(np.mean([s / t for s, t in zip(sync, loop, strict=True)]))
    syncs = int(results[0]["swarm"]["syncs"])
    train_only = float(np.mean([t - s for s, t in zip(sync, loop, strict=True)]))
    mean_sync = float(np.mean(sync))
    accuracy = float(np.mean([r["accuracy"] for r in results]))
    note = (
        f"share of the loop {share * 100:.1f} %; {syncs} syncs per node, mean sync "
        f"{mean_sync / max(syncs, 1) * 1000:.0f} ms; final accuracy {accuracy:.3f}; "
        f"identical final digests: {len({r['digest'] for r in results}) == 1}"
    )
    return [
        make_row(
            f"sync overhead: mnist-pyt, {NODES} nodes, syncFrequency {SYNC_FREQUENCY}",
            mean_sync,
            "s in sync rounds",
            "local training time (same run)",
            train_only,
            target="ratio <= 0.1",
            note=note,
        )
    ]


def merge_rows() -> list[dict[str, Any]]:
    """The mean merge of 8 peers of a 45 MB model vs memcpy (bench/merge.py)."""
    from bench import merge

    rows = [r for r in merge.measure() if r.get("case") == "mean" and r.get("model_mb", 0) > 40]
    return [
        make_row(
            f"mean merge of {merge.PEERS} peers, {row['model_mb']:.0f} MB model",
            row["input_gb_s"],
            "GB/s of input",
            "memcpy (np.copyto)",
            row["memcpy_gb_s"],
            target="ratio >= 0.5",
        )
        for row in rows[:1]
    ]


def run() -> list[dict[str, Any]]:
    """The sync-overhead row (``make bench`` has the merge rows from bench/merge.py)."""
    with tempfile.TemporaryDirectory(prefix="bench-swarm-") as tmp:
        results = run_example(Path(tmp))
    return overhead_rows(results)


def main() -> None:
    print_rows("swarm", run() + merge_rows())


if __name__ == "__main__":
    main()
