"""The C allocator told to keep the memory the SL frees, instead of giving it back to the kernel at once.

Each round an SL allocates and frees buffers of megabytes: what asyncio's transports hold of a model
being sent, the frames' bytes. glibc's malloc serves blocks above 128 KiB with fresh ``mmap`` and
``munmap``s them when freed, and gives back its heap's free top beyond 128 KiB, so each round's buffers
arrive as new pages that the kernel must zero: 113,000 page faults in 3 s of 45 MB rounds across the 4
SLs of ``bench/rounds.py``, 1,800 with the settings below (``/proc/<pid>/stat``). Model-sized buffers
are recycled by ``daemons/sl/buffers.py``; above 32 MiB malloc still maps memory of its own.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

__all__ = ["keep_freed_memory"]

log = logging.getLogger("swarm.sl.malloc")

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest: blocks up to this come from the heap
TRIM_THRESHOLD = 256 << 20  # the heap's free top is given back beyond this


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; False (and nothing done) where the C
    library is not glibc or refuses."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    if not done:
        log.debug("malloc kept its defaults (mallopt refused)")
    return done
