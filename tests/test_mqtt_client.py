"""``daemons.bus.mqtt_client.DirectClient`` against a real mosquitto: messages go to the callback as
paho reads them, a failing callback costs one message, and ``messages`` still ends with the connection."""

from __future__ import annotations

import asyncio
import uuid

import aiomqtt
import pytest

from daemons.broker import ManagedBroker
from daemons.bus.mqtt_client import Deliver, DirectClient
from tests.conftest import eventually


def _client(broker: ManagedBroker, deliver: Deliver) -> DirectClient:
    address, identifier = broker.address, f"direct-{uuid.uuid4().hex[:8]}"
    return DirectClient(address.host, address.port, identifier=identifier, deliver=deliver)


async def test_messages_reach_the_callback_in_order_with_their_retain_flag(mosquitto: ManagedBroker) -> None:
    topic = f"direct/{uuid.uuid4().hex}"
    got: list[tuple[str, bytes, bool]] = []
    address = mosquitto.address
    async with aiomqtt.Client(address.host, address.port) as pub:
        await pub.publish(f"{topic}/kept", b"retained", qos=1, retain=True)
        async with _client(mosquitto, lambda *m: got.append(m)) as sub:
            await sub.subscribe(f"{topic}/#", qos=1)
            for i in range(20):
                await pub.publish(f"{topic}/n", str(i).encode(), qos=1)
            assert await eventually(lambda: len(got) == 21)
            assert len(sub.messages) == 0  # nothing went through aiomqtt's queue
        await pub.publish(f"{topic}/kept", b"", qos=1, retain=True)  # clear the retained message
    assert got[0] == (f"{topic}/kept", b"retained", True)
    assert got[1:] == [(f"{topic}/n", str(i).encode(), False) for i in range(20)]


async def test_a_failing_callback_costs_its_message_not_the_connection(
    mosquitto: ManagedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    topic = f"direct/{uuid.uuid4().hex}"
    got: list[bytes] = []

    def deliver(_topic: str, payload: bytes, _retain: bool) -> None:
        if payload == b"bad":
            raise ValueError("cannot take it")
        got.append(payload)

    address = mosquitto.address
    async with aiomqtt.Client(address.host, address.port) as pub, _client(mosquitto, deliver) as sub:
        await sub.subscribe(topic, qos=1)
        for payload in (b"one", b"bad", b"two"):
            await pub.publish(topic, payload, qos=1)
        assert await eventually(lambda: got == [b"one", b"two"])
        await sub.publish(topic, b"three", qos=1)  # still connected
        assert await eventually(lambda: got == [b"one", b"two", b"three"])
    assert "could not be delivered" in caplog.text and "cannot take it" in caplog.text


async def test_messages_ends_with_the_connection(fresh_mosquitto: ManagedBroker) -> None:
    async with _client(fresh_mosquitto, lambda *m: None) as sub:
        await sub.subscribe("direct/#", qos=1)
        fresh_mosquitto.stop()
        async with asyncio.timeout(10):
            with pytest.raises(aiomqtt.MqttError):
                await _drain(sub)


async def _drain(client: aiomqtt.Client) -> None:
    async for _ in client.messages:
        pass
