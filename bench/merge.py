"""Benchmark the merge methods on 8 peers against memcpy measured in the same run.

Ratio = merge input bytes/s (peers x model bytes / merge time) divided by memcpy bytes/s
(``np.copyto`` of one model buffer, best of several). Run: ``.venv/bin/python bench/merge.py``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import bench_parser, make_row
from daemons.sl.merge import MergeOptions, TensorLayout, merge_flat

__all__ = ["measure", "run"]

PEERS = 8
SIZES_MB = (1.6, 45.0)
# (label, method, equal weights?, options); trim_ratio 0.125 drops 1 low + 1 high of 8 peers.
CASES: tuple[tuple[str, str, bool, MergeOptions], ...] = (
    ("mean", "mean", False, MergeOptions()),
    ("coordmedian", "coordmedian", False, MergeOptions()),
    ("coordmedian w=1", "coordmedian", True, MergeOptions()),
    ("geomedian", "geomedian", False, MergeOptions()),
    ("trimmedmean", "trimmedmean", False, MergeOptions(trim_ratio=0.125)),
    ("krum", "krum", False, MergeOptions()),
)


def _model_layout(target_bytes: int) -> tuple[list[TensorLayout], int]:
    """A ResNet-like layout: 3x3 convs, each followed by BatchNorm (four float32, one int64)."""
    channels = 64 if target_bytes < 8_000_000 else 256
    layout: list[TensorLayout] = []
    offset = 0

    def add(name: str, label: str, shape: tuple[int, ...]) -> None:
        nonlocal offset
        nbytes = int(np.prod(shape)) * (8 if label == "int64" else 4)
        layout.append((name, label, shape, offset, nbytes))
        offset = -(-(offset + nbytes) // 64) * 64

    block = 0
    while offset < target_bytes - 4 * channels * channels * 9:
        add(f"layer{block}.conv.weight", "float32", (channels, channels, 3, 3))
        for part in ("weight", "bias", "running_mean", "running_var"):
            add(f"layer{block}.bn.{part}", "float32", (channels,))
        add(f"layer{block}.bn.num_batches_tracked", "int64", ())
        block += 1
    add("fc.weight", "float32", (max(1, (target_bytes - offset) // 4 - 16),))
    return layout, offset


def _rows(layout: list[TensorLayout], total: int, rng: np.random.Generator) -> np.ndarray:
    """Random peers: normal float32 weights, small int64 counters, zero padding."""
    rows = np.zeros((PEERS, total), dtype=np.uint8)
    for _, label, shape, offset, nbytes in layout:
        if label == "int64":
            values: np.ndarray = rng.integers(0, 1000, (PEERS, *shape), dtype=np.int64)
        else:
            values = rng.standard_normal((PEERS, *shape), dtype=np.float32)
        rows[:, offset : offset + nbytes] = values.reshape(PEERS, -1).view(np.uint8)
    return rows


def _best(fn: Callable[[], object], min_repeats: int = 3, budget_s: float = 0.5) -> float:
    """Best time of at least ``min_repeats`` runs, repeating while under ``budget_s``."""
    times: list[float] = []
    while len(times) < min_repeats or sum(times) < budget_s:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _bench_size(size_mb: float, rng: np.random.Generator) -> list[dict[str, Any]]:
    layout, total = _model_layout(int(size_mb * 1e6))
    rows = _rows(layout, total, rng)
    weighted = [float(w) for w in rng.integers(1, 10, PEERS)]
    out = np.empty(total, dtype=np.uint8)
    model = rows[0].copy()
    memcpy = total / _best(lambda: np.copyto(out, model), 10)
    results = []
    for label, method, equal, options in CASES:
        weights = [1.0] * PEERS if equal else weighted
        seconds = _best(partial(merge_flat, rows, layout, weights, method, out=out, options=options))
        rate = PEERS * total / seconds
        results.append(
            {
                "model_mb": total / 1e6,
                "peers": PEERS,
                "tensors": len(layout),
                "case": label,
                "method": method,
                "seconds": seconds,
                "input_gb_s": rate / 1e9,
                "memcpy_gb_s": memcpy / 1e9,
                "ratio_vs_memcpy": rate / memcpy,
            }
        )
    return results


def measure() -> list[dict[str, Any]]:
    """Time every method for 8 peers at each model size; one dict per (size, case)."""
    rng = np.random.default_rng(0)
    return [row for size in SIZES_MB for row in _bench_size(size, rng)]


def run() -> list[dict[str, Any]]:
    """Table rows: the mean merge at both sizes (target >= 0.5 of memcpy), every other method at 45 MB."""
    rows = []
    for r in measure():
        if r["case"] != "mean" and r["model_mb"] < 10:
            continue
        rows.append(
            make_row(
                f"{r['case']} merge of {PEERS} peers, {r['model_mb']:.1f} MB model",
                r["input_gb_s"], "GB/s", "memcpy (np.copyto) of one model", r["memcpy_gb_s"],
                target="ratio >= 0.5" if r["case"] == "mean" else "",
                note=f"input bytes/s ({PEERS} x model / merge time); {r['seconds'] * 1e3:.1f} ms per merge",
            )
        )  # fmt: skip
    return rows


def main() -> None:
    """Print the table."""
    bench_parser(__doc__).parse_args()
    rows = measure()
    print(f"merge of {PEERS} peers; ratio = merge input B/s / memcpy B/s (target: mean >= 0.5)")
    header = ("model", "tensors", "method", "time ms", "input GB/s", "memcpy GB/s", "ratio")
    print("{:>8} {:>7} {:<16} {:>9} {:>10} {:>11} {:>6}".format(*header))
    for r in rows:
        print(
            f"{r['model_mb']:>5.1f} MB {r['tensors']:>7} {r['case']:<16} {r['seconds'] * 1e3:>9.1f} "
            f"{r['input_gb_s']:>10.2f} {r['memcpy_gb_s']:>11.2f} {r['ratio_vs_memcpy']:>6.2f}"
        )


if __name__ == "__main__":
    main()
