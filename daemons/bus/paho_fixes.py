"""Three measured fixes of paho-mqtt's socket I/O under aiomqtt.

Large messages (weight chunks are 1-4 MB): paho re-slices an outgoing packet on every partial
``send()``, copying the rest of it each time (quadratic in the packet size); a ``memoryview`` makes those
slices free. It also asks ``recv()`` for the whole remainder of an incoming packet, so every call
allocates (and maps) a buffer of megabytes; reading at most 256 KiB per call avoids that. See
shared/reference/mqtt.md, section 0, and bench/bus.py.

Small messages: with an event loop outside it, paho never writes a packet when it is queued; it asks
aiomqtt to watch the socket for writability (a ``call_soon_threadsafe``, an ``epoll_ctl`` and a pass of
the loop later the packet goes out, then the socket is unwatched again). Every publish and every
acknowledgement of a QoS-1 message took that trip: 11-14 % of the CPU of an SN and of an SL in a sync
round (``bench/rounds.py``). A packet queued on the loop's thread behind nothing now goes to the socket at
once, and the loop's writer only sends what the socket did not take.
"""

from __future__ import annotations

import asyncio
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
        if not _may_write_now(self):
            return queue_packet(self, command, packet, mid, qos, info)
        self._registered_write = True  # queue_packet must not ask the event loop to watch the socket
        try:
            rc = queue_packet(self, command, packet, mid, qos, info)
        finally:
            self._registered_write = False
        try:
            self.loop_write()  # what the socket does not take now, the event loop's writer sends later
        except Exception:  # the event loop's writer meets it again and reports it as aiomqtt does
            self._call_socket_register_write()
        return rc

    def _sock_recv(self: Any, bufsize: int) -> bytes:
        return recv(self, min(bufsize, _RECV_CAP))  # type: ignore[no-any-return]

    client._packet_queue = _packet_queue
    client._sock_recv = _sock_recv
    setattr(client, _MARK, True)


def _may_write_now(client: Any) -> bool:
    """Whether a packet can go to the socket at once: on the event loop's thread, connected, nothing
    queued before it, and not inside one of paho's callbacks (whose lock a finished write takes)."""
    if client._sock is None or client._registered_write or client._out_packet:
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # paho's connect runs on an executor thread
        return False
    if not client._in_callback_mutex.acquire(False):
        return False
    client._in_callback_mutex.release()
    return True
