"""Weight buffers that the ML program and its SL share (files mapped by both), so that weights cross
the local socket without being copied through it or between buffers: the ML program flattens its model
straight into a buffer its SL lent it, and the SL answers with the merged model in the buffer where the
merge or the transfer from the leader put it (``daemons.sl.local_server`` says who may write where when).

The SL creates the files, private to its user (0600, in its own 0700 directory, in memory where
``/dev/shm`` exists), and removes them when the ML program goes; the frames on the socket only name the
buffer (``"shm": <path>``) instead of carrying the bytes.
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
                _reserve(fd, nbytes)
            elif os.fstat(fd).st_size != nbytes:
                raise CodecError(f"shared buffer {path} holds {os.fstat(fd).st_size} bytes, not {nbytes}")
            self._map = mmap.mmap(fd, nbytes)
        except BaseException:
            if create:  # a file nobody can use
                path.unlink(missing_ok=True)
            raise
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


def _reserve(fd: int, nbytes: int) -> None:
    """Size a new file and take its memory now: a full ``/dev/shm`` (64 MiB in a default container) then
    fails here with ENOSPC, where a sparse file would kill the first process to touch a missing page with
    SIGBUS."""
    os.ftruncate(fd, nbytes)
    if hasattr(os, "posix_fallocate"):  # Linux; elsewhere the sparse file has to do
        os.posix_fallocate(fd, 0, nbytes)
