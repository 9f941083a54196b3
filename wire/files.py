"""Reading files a user or a peer hands us: regular files only, never more than a limit, never blocking.

``CREATE TASK FROM /dev/zero`` must not read forever and a FIFO must not hang the shell: the file's type
and size are checked before a byte is read (on the opened descriptor, so a path swapped in between is
caught too), and at most ``limit`` bytes are ever read.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

__all__ = [
    "MAX_CERT_FILE_BYTES",
    "MAX_TEXT_FILE_BYTES",
    "UnsafeFileError",
    "read_bounded",
    "read_bounded_stream",
]

MAX_TEXT_FILE_BYTES = 4 << 20  # task definitions, SWOP profiles, swci scripts
MAX_CERT_FILE_BYTES = 1 << 20  # PEM keys and certificates


class UnsafeFileError(OSError):
    """A file we refuse to read: not a regular file, or larger than the limit (``strerror`` says which)."""


def _kind(mode: int) -> str:
    kinds = {
        stat.S_ISDIR: "a directory",
        stat.S_ISFIFO: "a FIFO (named pipe)",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISSOCK: "a socket",
    }
    return next((name for test, name in kinds.items() if test(mode)), "not a regular file")


def _size_text(limit: int) -> str:
    return f"{limit / (1 << 20):g} MiB" if limit >= 1 << 20 else f"{limit:,} bytes"


def _check(mode: int, size: int, path: str | os.PathLike[str], limit: int) -> None:
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory, expected a file", os.fspath(path))
    if not stat.S_ISREG(mode):
        raise UnsafeFileError(errno.EINVAL, f"is {_kind(mode)}, expected a regular file", os.fspath(path))
    if size > limit:
        message = f"is {size:,} bytes, over the limit of {_size_text(limit)}"
        raise UnsafeFileError(errno.EFBIG, message, os.fspath(path))


def read_bounded(path: str | os.PathLike[str], limit: int = MAX_TEXT_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes.

    Raises:
        FileNotFoundError, PermissionError, IsADirectoryError: as ``open`` would.
        UnsafeFileError: a FIFO, a device, a socket, or a file over ``limit`` (nothing is read).
    """
    info = os.stat(path)  # stat never blocks, whatever the file is
    _check(info.st_mode, info.st_size, path, limit)
    # O_NONBLOCK: opening a FIFO that was swapped in after the check must not wait for a writer.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        _check(info.st_mode, info.st_size, path, limit)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return _read_at_most(handle, limit, path)
    finally:
        os.close(fd)


def read_bounded_stream(
    stream: BinaryIO, limit: int = MAX_TEXT_FILE_BYTES, *, name: str = "<stdin>"
) -> bytes:
    """At most ``limit`` bytes of an open stream (standard input); more is refused, not truncated."""
    return _read_at_most(stream, limit, name)


def _read_at_most(stream: BinaryIO, limit: int, path: str | os.PathLike[str]) -> bytes:
    data = stream.read(limit + 1)
    if len(data) > limit:
        message = f"holds more than {_size_text(limit)}, the limit"
        raise UnsafeFileError(errno.EFBIG, message, os.fspath(path))
    return data
