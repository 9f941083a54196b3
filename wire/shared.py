"""A weight buffer that the ML program and its SL share (a file mapped by both), so that weights cross
the local socket without being copied through it: the ML program flattens its model straight into the
buffer, the SL takes its copy from there and writes the merged model back into it.

The SL creates the file, private to its user (0600, in its own 0700 directory, in memory where
``/dev/shm`` exists), and removes it when the ML program goes; the frames on the socket only say
``"shm": true`` instead of carrying the bytes.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from wire.errors import CodecError
from wire.tensors import MAX_STATE_BYTES

__all__ = ["SharedBuffer", "memory_dir"]


def memory_dir() -> str | None:
    """``/dev/shm`` when this host has one we may write to (files there live in memory), else None."""
    shm = "/dev/shm"  # noqa: S108 - a private directory is made inside it, see SharedBuffer
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


class SharedBuffer:
    """``nbytes`` bytes of a mapped file, seen as a uint8 array."""

    def __init__(self, path: Path, nbytes: int, *, create: bool) -> None:
        if not 0 < nbytes <= MAX_STATE_BYTES:
            raise CodecError(f"shared buffer of {nbytes} bytes is outside 1..{MAX_STATE_BYTES}")
        self.path = path
        self.nbytes = nbytes
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, nbytes)
            elif os.fstat(fd).st_size != nbytes:
                raise CodecError(f"shared buffer {path} holds {os.fstat(fd).st_size} bytes, not {nbytes}")
            self._map = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        self.array: np.ndarray = np.frombuffer(self._map, dtype=np.uint8)

    @classmethod
    def create(cls, directory: Path, name: str, nbytes: int) -> SharedBuffer:
        """A new buffer in ``directory`` (OSError when it cannot be made)."""
        return cls(directory / name, nbytes, create=True)

    @classmethod
    def attach(cls, path: str | Path, nbytes: int) -> SharedBuffer:
        """The buffer the other side made at ``path`` (OSError/CodecError when it is not that)."""
        return cls(Path(path), nbytes, create=False)

    def remove(self) -> None:
        """Delete the file (the mappings stay valid until they are dropped)."""
        self.path.unlink(missing_ok=True)
