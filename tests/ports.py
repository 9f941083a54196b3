"""Ports that tests stop and start a server on again, with nothing else able to take them in between.

``free_port()`` asks the kernel for a port from the ephemeral range, which is also where every outgoing
connection gets its local port. A port a test leaves closed for a while (an SN killed for 35 s, a broker
restarted) can be handed in that time to any client connection on the machine, and the server's restart
then fails with "Address already in use". The ports here lie below the ephemeral range, which the kernel
never hands out on its own, and each pytest-xdist worker takes its own slice of them, in turn. (Where
the ephemeral range starts too low to leave room below it, the kernel picks, as ``free_port()`` does.)
"""

from __future__ import annotations

import functools
import itertools
import os
import socket
from pathlib import Path

from daemons.broker import free_port

__all__ = ["restartable_port"]

_FLOOR = 10_000  # well above the ports of system services
_SLICES = 16  # room for this many xdist workers before two share a slice
_DEFAULT_EPHEMERAL_LOW = 32_768


def _ephemeral_low(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_LOW


@functools.cache
def _worker_slice() -> range:
    """The ports of this xdist worker (``gw3`` takes the fourth slice; gw0's without xdist); empty where
    the ephemeral range starts too low to leave room below it."""
    low = _ephemeral_low()
    if low - _FLOOR < _SLICES * 100:
        return range(0)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % _SLICES if worker.isdigit() else 0
    width = (low - _FLOOR) // _SLICES
    return range(_FLOOR + index * width, _FLOOR + (index + 1) * width)


@functools.cache
def _ports_in_turn() -> itertools.cycle[int]:
    return itertools.cycle(_worker_slice())


def _is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def restartable_port(host: str = "127.0.0.1") -> int:
    """A free port below the ephemeral range, not handed out again by this process for a long while;
    where there is no room below that range (or nothing free in it), one the kernel picks."""
    for _ in range(len(_worker_slice())):
        port = next(_ports_in_turn())
        if _is_free(host, port):
            return port
    return free_port(host)
