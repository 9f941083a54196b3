"""What request/reply needs of a bus session: messages, bounded subscriptions and the Endpoint protocol.

``daemons.bus.session.Bus`` implements ``Endpoint``; ``daemons.bus.rpc`` is written against it, so the two
modules do not import each other.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from daemons.bus.topics import Topics
from wire import Envelope

__all__ = ["Endpoint", "Message", "Subscription"]

log = logging.getLogger("swarm.bus")


@dataclass(frozen=True, slots=True)
class Message:
    """One message received on a subscription."""

    topic: str
    payload: bytes
    retain: bool = False


class Subscription:
    """A bounded queue of the messages matching one topic filter."""

    def __init__(self, topic_filter: str, maxsize: int) -> None:
        self.filter = topic_filter
        self.dropped = 0
        self._queue: asyncio.Queue[Message] = asyncio.Queue(maxsize)

    def offer(self, message: Message) -> None:
        """Queue a message; when the queue is full, drop it and log (never block the reader)."""
        try:
            self._queue.put_nowait(message)
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning("subscription %s is full: dropped a message on %s", self.filter, message.topic)

    async def get(self) -> Message:
        """The next message."""
        return await self._queue.get()

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message]:
        while True:
            yield await self._queue.get()


class Endpoint(Protocol):
    """The part of a bus session that request/reply uses."""

    @property
    def uid(self) -> str: ...

    @property
    def topics(self) -> Topics: ...

    def add_subscription(self, topic_filter: str, *, maxsize: int = 1000) -> Subscription: ...

    def open(self, message: Message) -> Envelope: ...

    def encode(
        self,
        kind: str,
        body: dict[str, Any],
        *,
        reply_to: str | None = None,
        corr: str | None = None,
    ) -> bytes: ...

    async def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int | None = None,
        retain: bool = False,
        timeout: float | None = None,
    ) -> None: ...
