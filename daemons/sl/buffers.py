"""Model-sized byte buffers used again, round after round, once nothing holds them any more.

Every round an SL fills several buffers the size of the model: its own row taken from the buffer it
shares with the ML program, the rows pushed to it as a leader, the merge's output, the merged model it
receives. Fresh memory of that size comes from the kernel as new pages, which it zeroes on first touch:
16 % of all the CPU a 45 MB round cost (``perf record -a`` of ``bench/rounds.py``), more than hashing.
``BufferPool.take`` hands out a buffer it made before when nothing else refers to it any more (CPython
counts the references: every array view, memoryview and FlatState of it holds one), else a new one.

While an ML program shares weights with its SL (``share``), the pool makes the buffers of its model's size
as files that program can map (``wire.shared``): whatever buffer the merged model ends up in (the merge's
output, the transfer from the leader, the node's own row), the SL names it to the program instead of
copying it into one shared buffer (``file_of``).
"""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

import numpy as np

from wire.errors import CodecError
from wire.shared import SharedBuffer

log = logging.getLogger("swarm.sl.buffers")

__all__ = ["FILE_PREFIX", "MODEL_BUFFERS", "BufferPool"]

FILE_PREFIX = "weights-"  # the names of the files the pool makes

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
        self._sharing: dict[int, Path] = {}  # size -> directory where buffers of that size are made as files
        # address -> file and size of each pooled buffer made as a shared file
        self._files: dict[int, tuple[Path, int]] = {}
        self._made = 0  # files made so far (their names)

    @property
    def pooled_bytes(self) -> int:
        """Bytes of all the buffers the pool keeps (in use or not)."""
        return sum(b.nbytes for b in self._buffers)

    def take(self, nbytes: int) -> np.ndarray:
        """A 1-D uint8 array of ``nbytes`` (its contents are whatever was there before)."""
        if nbytes < _MIN_POOLED and nbytes not in self._sharing:
            return np.empty(nbytes, dtype=np.uint8)
        with self._lock:
            for index in range(len(self._buffers)):
                if self._buffers[index].nbytes == nbytes and self._unused(index):
                    return self._buffers[index]
            self._make_room(nbytes)
            shared = nbytes in self._sharing  # kept whatever their bytes: a file must be removed
            if not shared and self.pooled_bytes + nbytes > self.max_bytes:
                return np.empty(nbytes, dtype=np.uint8)
            buffer = self._new(nbytes)
            self._buffers.append(buffer)
            return buffer

    def share(self, nbytes: int, directory: Path) -> None:
        """Make the buffers of ``nbytes`` bytes taken from now on as files in ``directory``."""
        with self._lock:
            self._sharing[nbytes] = directory

    def unshare(self, nbytes: int) -> None:
        """Stop making files of ``nbytes`` bytes; remove those made and forget them (whoever still uses
        one keeps its mapping until done with it)."""
        with self._lock:
            self._sharing.pop(nbytes, None)
            made = [b for b in self._buffers if b.nbytes == nbytes and b.ctypes.data in self._files]
            for buffer in made:
                self._files.pop(buffer.ctypes.data)[0].unlink(missing_ok=True)
            self._buffers = [b for b in self._buffers if all(b is not m for m in made)]

    def file_of(self, array: np.ndarray) -> Path | None:
        """The shared file whose whole mapping ``array`` is (a view of it all counts), if any."""
        with self._lock:
            made = self._files.get(array.ctypes.data)
        fits = made is not None and made[1] == array.nbytes and array.flags.c_contiguous
        return made[0] if made is not None and fits else None

    def _new(self, nbytes: int) -> np.ndarray:
        """A buffer for the pool: a shared file's mapping while its size is shared, else the heap's."""
        directory = self._sharing.get(nbytes)
        if directory is None:
            return np.empty(nbytes, dtype=np.uint8)
        self._made += 1
        try:
            shared = SharedBuffer.create(directory, f"{FILE_PREFIX}{self._made}", nbytes)
        except (OSError, CodecError) as exc:
            del self._sharing[nbytes]  # said once; what is made already stays shared
            log.warning("no more weight buffers of %d bytes shared with the ML program: %s", nbytes, exc)
            return np.empty(nbytes, dtype=np.uint8)
        self._files[shared.array.ctypes.data] = (shared.path, nbytes)
        return shared.array  # its mapping lives as long as the array (its base)

    def take_rows(self, rows: int, nbytes: int) -> np.ndarray:
        """A (rows, nbytes) uint8 matrix, as ``take``."""
        return self.take(rows * nbytes).reshape(rows, nbytes)

    def _unused(self, index: int) -> bool:
        return sys.getrefcount(self._buffers[index]) == _UNUSED_REFS

    def _make_room(self, nbytes: int) -> None:
        """Forget unused buffers (of other sizes: the model changed) until ``nbytes`` more fit; those of
        a shared size stay (they are as many as were ever in use at once)."""
        index = 0
        while index < len(self._buffers) and self.pooled_bytes + nbytes > self.max_bytes:
            buffer = self._buffers[index]
            if buffer.nbytes not in self._sharing and self._unused(index):
                made = self._files.pop(buffer.ctypes.data, None)
                if made is not None:  # made while its size was shared
                    made[0].unlink(missing_ok=True)
                del self._buffers[index]
            else:
                index += 1


MODEL_BUFFERS = BufferPool()
