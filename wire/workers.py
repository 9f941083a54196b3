"""Threads for the CPU-heavy work on one model: hashing its chunks, screening and merging rows.

BLAKE3 and numpy release the GIL while they work, so threads use the cores a machine has: one pool per
process, as many threads as cores (at most ``MAX_THREADS``), started on first use. Work on a small model
stays on the calling thread, where handing it over would cost more than it saves.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

__all__ = [
    "INLINE_BYTES",
    "MAX_THREADS",
    "PARALLEL_BYTES",
    "cores",
    "cut",
    "off_loop_if_large",
    "run_split",
    "threads_for",
]

MAX_THREADS = 8
PARALLEL_BYTES = 1 << 23  # a model of fewer bytes is hashed, screened and merged on one thread
INLINE_BYTES = 2 << 20  # hashing, copying or merging fewer bytes stays on the event loop (cheaper)
_BYTES_PER_THREAD = 1 << 22

_T = TypeVar("_T")
_R = TypeVar("_R")
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads_for(nbytes: int) -> int:
    """How many threads screen or merge a model of ``nbytes``: one below ``PARALLEL_BYTES``, else one
    per 4 MiB, at most one per core and ``MAX_THREADS``."""
    if nbytes < PARALLEL_BYTES:
        return 1
    return max(1, min(cores(), MAX_THREADS, nbytes // _BYTES_PER_THREAD))


async def off_loop_if_large(nbytes: int, fn: Callable[[], _R], *, limit: int = INLINE_BYTES) -> _R:
    """``fn()``, work on ``nbytes``: on the calling event loop up to ``limit`` bytes (handing small work
    to a thread costs more than it saves), else on a worker thread."""
    if nbytes <= limit:
        return fn()
    return await asyncio.to_thread(fn)


def _shared_pool() -> ThreadPoolExecutor:
    global _pool  # noqa: PLW0603 - one pool per process, made on first use
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="model-work")
        return _pool


def cut(items: Sequence[_T], count: int) -> list[Sequence[_T]]:
    """``items`` in ``count`` runs of consecutive items, their lengths at most one apart."""
    bounds = [len(items) * k // count for k in range(count + 1)]
    return [items[bounds[k] : bounds[k + 1]] for k in range(count)]


def run_split(fn: Callable[[Sequence[_T]], list[_R]], items: Sequence[_T], threads: int) -> list[_R]:
    """``fn`` over ``items`` cut into ``threads`` runs of consecutive items (the calling thread takes the
    first), the results joined in order. ``fn`` must not wait for this pool itself."""
    count = max(1, min(threads, len(items)))
    if count == 1:
        return fn(items)
    runs = cut(items, count)
    futures = [_shared_pool().submit(fn, run) for run in runs[1:]]
    try:
        results = fn(runs[0])
    finally:
        wait(futures)  # every run ends before this returns, whichever failed
    for future in futures:
        results.extend(future.result())
    return results
