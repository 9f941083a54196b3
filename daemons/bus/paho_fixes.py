"""Two measured fixes of paho-mqtt's socket I/O for large messages (weight chunks are 1-4 MB).

paho re-slices an outgoing packet on every partial ``send()``, copying the rest of it each time
(quadratic in the packet size); a ``memoryview`` makes those slices free. It also asks ``recv()`` for
the whole remainder of an incoming packet, so every call allocates (and maps) a buffer of megabytes;
reading at most 256 KiB per call avoids that. See shared/reference/mqtt.md, section 0, and bench/bus.py.
"""

from __future__ import annotations

from typing import Any

import paho.mqtt.client as paho

__all__ = ["apply"]

_RECV_CAP = 256 * 1024
_MARK = "_open_swarm_patched"


def apply() -> None:
    """Patch paho's Client once (idempotent)."""
    client: Any = paho.Client
    if getattr(client, _MARK, False):
        return
    queue_packet = client._packet_queue
    recv = client._sock_recv

    def _packet_queue(self: Any, command: int, packet: Any, mid: int, qos: int, info: Any = None) -> Any:
        if len(packet) > 65536 and not isinstance(packet, memoryview):
            packet = memoryview(packet)
        return queue_packet(self, command, packet, mid, qos, info)

    def _sock_recv(self: Any, bufsize: int) -> bytes:
        return recv(self, min(bufsize, _RECV_CAP))  # type: ignore[no-any-return]

    client._packet_queue = _packet_queue
    client._sock_recv = _sock_recv
    setattr(client, _MARK, True)
