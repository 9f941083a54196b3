"""paho's socket I/O under aiomqtt as ``daemons/bus/paho_fixes.py`` changes it, against a real mosquitto."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiomqtt
import numpy as np

from daemons.broker import ManagedBroker
from daemons.bus import paho_fixes

paho_fixes.apply()  # as importing the bus does


@asynccontextmanager
async def _pair(broker: ManagedBroker) -> AsyncIterator[tuple[aiomqtt.Client, aiomqtt.Client, str]]:
    """A subscriber and a publisher on ``broker``, and a topic of this test's own."""
    address, topic = broker.address, f"paho-fixes/{uuid.uuid4().hex}"
    async with (
        aiomqtt.Client(address.host, address.port, identifier=f"sub-{uuid.uuid4().hex[:8]}") as sub,
        aiomqtt.Client(address.host, address.port, identifier=f"pub-{uuid.uuid4().hex[:8]}") as pub,
    ):
        await sub.subscribe(topic, qos=1)
        yield sub, pub, topic


async def _received(sub: aiomqtt.Client, count: int) -> list[bytes]:
    """The payloads of the next ``count`` messages (5 s at most)."""
    payloads: list[bytes] = []
    async with asyncio.timeout(5):
        async for message in sub.messages:
            assert isinstance(message.payload, bytes)
            payloads.append(message.payload)
            if len(payloads) == count:
                return payloads
    raise AssertionError("the subscription ended")


def _paho(client: aiomqtt.Client) -> Any:
    return client._client  # the paho Client that aiomqtt drives


async def test_a_packet_queued_on_the_event_loop_goes_to_the_socket_at_once(mosquitto: ManagedBroker) -> None:
    async with _pair(mosquitto) as (sub, pub, topic):
        info = _paho(pub).publish(topic, b"now", qos=0)
        assert info.is_published()  # written before publish() returned, not on a later pass of the loop
        assert not _paho(pub)._registered_write  # and the loop is not left watching the socket
        await pub.publish(topic, b"then", qos=1)  # the acknowledged kind too
        assert await _received(sub, 2) == [b"now", b"then"]


async def test_what_the_socket_does_not_take_at_once_follows_in_order(mosquitto: ManagedBroker) -> None:
    big = np.random.default_rng(0).integers(0, 256, 6 * 1024 * 1024, dtype=np.uint8).tobytes()
    async with _pair(mosquitto) as (sub, pub, topic):
        _paho(pub)._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)  # takes part of big
        # On loopback the kernel may still take a whole payload at once when the broker reads as fast as
        # we write (its receive buffer grows up to tcp_rmem's maximum): publish until one is taken in part.
        payloads: list[bytes] = []
        infos: list[Any] = []
        while not infos or infos[-1].is_published():
            assert len(payloads) < 8, "the socket took 8 payloads of 6 MiB whole"
            payloads.append(bytes([len(payloads)]) + big[1:])
            infos.append(_paho(pub).publish(topic, payloads[-1], qos=0))
        second = _paho(pub).publish(topic, b"after", qos=0)  # queued behind the rest of the last one
        assert not second.is_published()
        assert await _received(sub, len(payloads) + 1) == [*payloads, b"after"]
        assert all(info.is_published() for info in infos) and second.is_published()


async def test_inside_a_paho_callback_a_packet_waits_for_the_event_loop(mosquitto: ManagedBroker) -> None:
    async with _pair(mosquitto) as (sub, pub, topic):
        lock = _paho(pub)._in_callback_mutex  # held while paho runs a callback; a finished write takes it
        with lock:
            info = _paho(pub).publish(topic, b"queued", qos=0)
            assert not info.is_published()
        assert await _received(sub, 1) == [b"queued"]
        assert info.is_published()


async def test_a_packet_queued_off_the_event_loops_thread_waits_for_it(mosquitto: ManagedBroker) -> None:
    async with _pair(mosquitto) as (sub, pub, topic):
        await asyncio.to_thread(_paho(pub).publish, topic, b"from a thread", 0)  # as paho's connect does
        assert await _received(sub, 1) == [b"from a thread"]
