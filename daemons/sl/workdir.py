"""The SL's own directory, in memory where the host has ``/dev/shm``: its local socket and the weight
buffers its pool shares with the ML program and lends to the peers of this host.

An SL removes its directory when it ends. One that was killed cannot, and its buffers (the model's size,
8 to 12 of them) would stay in memory until the host restarts, so every SL holds a lock on a file in its
directory for as long as it runs (the kernel lets go of it when the process dies, however it dies), and
removes, as it starts, the directories of this user's SLs whose lock nobody holds.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from wire.shared import memory_dir

__all__ = ["PREFIX", "sl_directory"]

log = logging.getLogger("swarm.sl.workdir")

PREFIX = "swarm-sl-"
_ALIVE = ".alive"  # locked while the SL runs
_UNLOCKED_GRACE = 60.0  # a directory with no lock file yet may be an SL starting now


@contextlib.contextmanager
def sl_directory(parent: Path | None = None) -> Iterator[Path]:
    """A new private (0700) directory for this SL in ``parent`` (``/dev/shm`` where the host has it,
    else the temporary directory), locked while in use and removed after; the directories of dead SLs
    there are removed first."""
    parent = parent or Path(memory_dir() or tempfile.gettempdir())
    remove_dead(parent)
    directory = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
    locking = directory / f"{_ALIVE}-new"  # named .alive once locked: nobody can lock it before us
    alive = os.open(locking, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(alive, fcntl.LOCK_EX)
        locking.rename(directory / _ALIVE)
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        os.close(alive)


def remove_dead(parent: Path) -> list[Path]:
    """Remove this user's SL directories in ``parent`` whose SL is gone; those removed."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            if entry.name.startswith(PREFIX) and _dead(entry):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    if removed:
        log.info("removed %d directories of SLs that ended without removing them", len(removed))
    return removed


def _dead(directory: Path) -> bool:
    """Whether ``directory`` is ours and its SL gone: nobody holds its lock, or it has none and is old."""
    try:
        info = directory.lstat()
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        return False
    try:
        fd = os.open(directory / _ALIVE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:  # made by an SL that locks nothing (older), or one starting right now
        return time.time() - info.st_mtime > _UNLOCKED_GRACE
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # its SL runs
    finally:
        os.close(fd)
    return True
