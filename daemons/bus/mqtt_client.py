"""aiomqtt's Client, handing each incoming message to a callback as paho reads it.

aiomqtt puts every message in a queue, and its ``messages`` iterator takes each one off with a new task
and an ``asyncio.wait`` (for the message or a disconnect); the bus then queues it again for its
subscriptions. Handing paho's message straight to the bus leaves one queue and no task per message:
incoming messages are most of what an SL and the SN receive in a sync round. ``messages`` still yields
nothing and ends with ``MqttError`` when the connection drops, so the bus waits on it as before.

A call waiting for the broker's answer ends when the connection drops: aiomqtt leaves a QoS-1 publish
waiting for its PUBACK (a subscribe for its SUBACK) until its timeout, 30 s by default
(``BusConfig.publish_timeout``), although no connection can bring it any more: a request published as
its SN restarted waited that long before it was sent again. So does a connection closed before the
broker's CONNACK (a TLS broker resetting a plain client): aiomqtt waited out its connect timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import aiomqtt
import paho.mqtt.client as paho
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

__all__ = ["ClosedBeforeConnack", "Deliver", "DirectClient"]

log = logging.getLogger("swarm.bus")

Deliver = Callable[[str, bytes, bool], None]
"""Takes a message's topic, payload and retain flag, on the event loop's thread; must not block."""


class ClosedBeforeConnack(aiomqtt.MqttError):
    """The connection closed before the broker answered it; paho logged why, when it could tell."""


class DirectClient(aiomqtt.Client):
    """An ``aiomqtt.Client`` whose incoming messages go to ``deliver`` instead of its queue."""

    def __init__(self, *args: Any, deliver: Deliver, **kwargs: Any) -> None:
        self._deliver = deliver
        super().__init__(*args, **kwargs)

    def _on_message(self, client: paho.Client, userdata: Any, message: paho.MQTTMessage) -> None:
        """paho's ``on_message``, called while it reads the socket (an exception here would end the
        connection, so a failing delivery is logged instead)."""
        try:
            self._deliver(message.topic, bytes(message.payload), bool(message.retain))
        except Exception:
            log.exception("a message on %r could not be delivered", message._topic[:200])

    def _on_disconnect(
        self,
        client: paho.Client,
        userdata: Any,
        flags: paho.DisconnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None = None,
    ) -> None:
        """aiomqtt's ``on_disconnect``; then every call waiting for the broker's answer ends at once."""
        if not self._connected.done():  # connecting: __aenter__ raises it now, not at its timeout
            unanswered = ClosedBeforeConnack("the connection closed before the broker answered")
            self._connected.set_exception(unanswered)
            self._connected.exception()  # read here too: a second call of paho's finds no one waiting
        super()._on_disconnect(client, userdata, flags, reason_code, properties)
        if self._disconnected.done() and not self._disconnected.cancelled():
            # seen here: when the connection dropped before the bus iterated messages (while it
            # subscribed on connecting), nothing else reads it and asyncio would log it as an error
            self._disconnected.exception()
        for waiting in (*self._pending_publishes.values(), *self._pending_unsubscribes.values()):
            waiting.set()  # a publish sees it was not acknowledged; the broker forgot the subscription
        for subscribing in self._pending_subscribes.values():
            if not subscribing.done():
                subscribing.set_exception(aiomqtt.MqttError("the connection to the broker was lost"))

    async def publish(
        self,
        /,
        topic: str,
        payload: aiomqtt.types.PayloadType = None,
        qos: int = 0,
        retain: bool = False,
        properties: Properties | None = None,
        *args: Any,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> None:
        """aiomqtt's ``publish``, except that a message the broker did not acknowledge before the
        connection dropped raises ``MqttError`` (aiomqtt's returns once woken, as if it had been), and
        without aiomqtt's optional bound on concurrent calls, which the bus does not set."""
        info = self._client.publish(topic, payload, qos, retain, properties, *args, **kwargs)
        if info.rc != paho.MQTT_ERR_SUCCESS:
            raise aiomqtt.MqttCodeError(info.rc, "Could not publish message")
        if info.is_published():
            return
        confirmation = asyncio.Event()
        with self._pending_call(info.mid, confirmation, self._pending_publishes):
            await self._wait_for(confirmation.wait(), timeout=timeout)
        if not info.is_published():
            raise aiomqtt.MqttError("the connection to the broker was lost before it acknowledged a message")
