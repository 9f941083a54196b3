"""CPU-heavy work on a large model is shared out among threads (``wire/workers.py``): the same results as
on one thread, in order, and a failure in any run is the caller's."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pytest

from daemons.sl import merge
from wire import workers
from wire.tensors import FlatState, chunk_digest, make_manifest

BIG = workers.PARALLEL_BYTES + 3 * (1 << 20)  # a model several threads work on


def test_a_small_model_stays_on_one_thread_and_a_large_one_uses_at_most_a_thread_per_core() -> None:
    assert workers.threads_for(workers.PARALLEL_BYTES - 1) == 1
    assert 1 <= workers.threads_for(BIG) <= min(workers.cores(), workers.MAX_THREADS)
    assert workers.threads_for(1 << 40) == min(workers.cores(), workers.MAX_THREADS)


def test_runs_are_joined_in_order_and_run_on_other_threads_too() -> None:
    seen: set[str] = set()

    def double(run: Sequence[int]) -> list[int]:
        seen.add(threading.current_thread().name)
        return [2 * x for x in run]

    assert workers.run_split(double, list(range(100)), 4) == [2 * x for x in range(100)]
    assert threading.current_thread().name in seen and len(seen) >= 2
    assert workers.run_split(double, [7], 4) == [14]
    assert workers.run_split(double, [], 4) == []


def test_a_failing_run_fails_the_call_once_every_run_has_ended() -> None:
    ended: list[int] = []

    def work(run: Sequence[int]) -> list[int]:
        if 5 in run:
            raise ValueError("row 5 is bad")
        ended.extend(run)
        return list(run)

    with pytest.raises(ValueError, match="row 5 is bad"):
        workers.run_split(work, list(range(40)), 4)
    assert sorted(ended) == [x for x in range(40) if x >= 10]  # the other three runs all finished


def _rows(peers: int, nbytes: int) -> tuple[list[np.ndarray], list[merge.TensorLayout]]:
    rng = np.random.default_rng(3)
    floats = nbytes // 4 - 1024
    layout: list[merge.TensorLayout] = [
        ("w", "float32", (floats,), 0, floats * 4),
        ("steps", "int64", (8,), floats * 4, 64),
        ("h", "bfloat16", (500,), floats * 4 + 64, 1000),
    ]
    total = floats * 4 + 64 + 1024
    rows = []
    for _ in range(peers):
        row = np.zeros(total, dtype=np.uint8)
        row[: floats * 4] = rng.standard_normal(floats).astype(np.float32).view(np.uint8)
        row[floats * 4 : floats * 4 + 64] = rng.integers(0, 1000, 8).astype(np.int64).view(np.uint8)
        row[floats * 4 + 64 : floats * 4 + 1064] = (
            rng.integers(0, 1 << 14, 500).astype(np.uint16).view(np.uint8)
        )
        rows.append(row)
    return rows, layout


@pytest.mark.parametrize("method", merge.MERGE_METHODS)
def test_a_merge_on_several_threads_gives_the_bytes_of_one_thread(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows, layout = _rows(5, BIG)
    weights = [1.0, 2.0, 1.0, 3.0, 1.0]
    monkeypatch.setattr(merge, "threads_for", lambda nbytes: 1)
    alone = merge.merge_flat(rows, layout, weights, method)
    monkeypatch.setattr(merge, "threads_for", lambda nbytes: 4)
    shared = merge.merge_flat(rows, layout, weights, method)
    assert shared.tobytes() == alone.tobytes()


def test_a_nan_in_the_last_block_is_found_on_several_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    rows, layout = _rows(1, BIG)
    row = rows[0]
    floats = row[: layout[0][4]].view(np.float32)
    floats[-3] = np.nan
    floats[-1] = np.inf
    monkeypatch.setattr(merge, "threads_for", lambda nbytes: 4)
    assert merge.find_non_finite(row, layout) == ("w", 2)
    floats[-3] = floats[-1] = 0.0
    assert merge.find_non_finite(row, layout) is None


def test_chunk_hashes_on_several_threads_are_each_chunks_own() -> None:
    raw = np.random.default_rng(5).integers(0, 256, 9 * (1 << 16) + 17, dtype=np.uint8)
    flat = FlatState.from_arrays({"x": raw})
    manifest = make_manifest(flat, "t", chunk_size=1 << 16)
    chunks = [flat.buffer[i : i + (1 << 16)].tobytes() for i in range(0, flat.total, 1 << 16)]
    assert len(chunks) == 10
    assert list(manifest.chunks) == [chunk_digest(c) for c in chunks]


async def test_small_work_runs_on_the_event_loop_and_large_work_on_a_worker_thread() -> None:
    here = threading.get_ident()
    assert await workers.off_loop_if_large(workers.INLINE_BYTES, threading.get_ident) == here
    assert await workers.off_loop_if_large(workers.INLINE_BYTES + 1, threading.get_ident) != here
    assert await workers.off_loop_if_large(100, threading.get_ident, limit=99) != here
