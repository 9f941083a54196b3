"""aiomqtt's Client, handing each incoming message to a callback as paho reads it.

aiomqtt puts every message in a queue, and its ``messages`` iterator takes each one off with a new task
and an ``asyncio.wait`` (for the message or a disconnect); the bus then queues it again for its
subscriptions. Handing paho's message straight to the bus leaves one queue and no task per message:
incoming messages are most of what an SL and the SN receive in a sync round. ``messages`` still yields
nothing and ends with ``MqttError`` when the connection drops, so the bus waits on it as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import aiomqtt
import paho.mqtt.client as paho

__all__ = ["Deliver", "DirectClient"]

log = logging.getLogger("swarm.bus")

Deliver = Callable[[str, bytes, bool], None]
"""Takes a message's topic, payload and retain flag, on the event loop's thread; must not block."""


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
