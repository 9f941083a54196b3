"""Model-sized byte buffers used again, round after round, once nothing holds them any more.

Every round an SL fills several buffers the size of the model: its own row taken from the buffer it
shares with the ML program, the rows pushed to it as a leader, the merge's output, the merged model it
receives. Fresh memory of that size comes from the kernel as new pages, which it zeroes on first touch:
16 % of all the CPU a 45 MB round cost (``perf record -a`` of ``bench/rounds.py``), more than hashing.
``BufferPool.take`` hands out a buffer it made before when nothing else refers to it any more (CPython
counts the references: every array view, memoryview and FlatState of it holds one), else a new one.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

__all__ = ["MODEL_BUFFERS", "BufferPool"]

_MIN_POOLED = 1 << 20  # smaller buffers come cheaply from the heap


def _refs_when_unused() -> int:
    """What ``sys.getrefcount`` says of a list's item that nothing else holds (interpreters differ)."""
    probe = [np.empty(0, dtype=np.uint8)]
    return sys.getrefcount(probe[0])


_UNUSED_REFS = _refs_when_unused()


class BufferPool:
    """Up to ``max_bytes`` of uint8 buffers, each handed out again once nobody holds it."""

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes = max_bytes
        self._buffers: list[np.ndarray] = []
        self._lock = threading.Lock()  # merges and copies take buffers on worker threads

    @property
    def pooled_bytes(self) -> int:
        """Bytes of all the buffers the pool keeps (in use or not)."""
        return sum(b.nbytes for b in self._buffers)

    def take(self, nbytes: int) -> np.ndarray:
        """A 1-D uint8 array of ``nbytes`` (its contents are whatever was there before)."""
        if nbytes < _MIN_POOLED:
            return np.empty(nbytes, dtype=np.uint8)
        with self._lock:
            for index in range(len(self._buffers)):
                if self._buffers[index].nbytes == nbytes and self._unused(index):
                    return self._buffers[index]
            buffer = np.empty(nbytes, dtype=np.uint8)
            self._make_room(nbytes)
            if self.pooled_bytes + nbytes <= self.max_bytes:
                self._buffers.append(buffer)
            return buffer

    def take_rows(self, rows: int, nbytes: int) -> np.ndarray:
        """A (rows, nbytes) uint8 matrix, as ``take``."""
        return self.take(rows * nbytes).reshape(rows, nbytes)

    def _unused(self, index: int) -> bool:
        return sys.getrefcount(self._buffers[index]) == _UNUSED_REFS

    def _make_room(self, nbytes: int) -> None:
        """Forget unused buffers (of other sizes: the model changed) until ``nbytes`` more fit."""
        index = 0
        while index < len(self._buffers) and self.pooled_bytes + nbytes > self.max_bytes:
            if self._unused(index):
                del self._buffers[index]
            else:
                index += 1


MODEL_BUFFERS = BufferPool()
