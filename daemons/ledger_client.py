"""Talking to the SN: find it, submit signed transactions, query views, watch entity events.

Used by the SL, the SWOP and swci alike. Events are ``nodes/<sn>/ev/<entity>/<key>`` envelopes with
``{entity, key, height, view}``; a watch subscribes before it reads the current view, so no change is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from contracts.history import HistoryIndex
from daemons.aio import raise_if_cancelling
from daemons.bus import Bus, BusError, RemoteError
from daemons.bus.session import Subscription
from wire import CodecError, encode_envelope, make_envelope

__all__ = ["Event", "LedgerClient", "Rejected", "Watch", "find_sn"]

EVENT_KIND = "event"


class Rejected(BusError):
    """The ledger refused a transaction; ``reason`` is written for the user."""

    def __init__(self, kind: str, reason: str) -> None:
        self.kind, self.reason = kind, reason
        super().__init__(reason)


@dataclass(frozen=True, slots=True)
class Event:
    """A change of one ledger entity, with its new view."""

    entity: str
    key: str
    height: int
    view: Any


async def find_sn(bus: Bus, *, timeout: float = 30.0, prefer: str | None = None) -> str:
    """The uid of an online SN on ``bus``'s network (the sentinel first, or ``prefer``)."""
    found: dict[str, dict[str, Any]] = {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with bus.subscribe(bus.topics.presence(), maxsize=100_000) as sub:
        while True:
            choice = _pick_sn(found, prefer)
            if choice is not None:
                return choice
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise BusError(
                    f"no SN is online on network {bus.config.network!r} at {bus.config.broker} "
                    f"after {timeout:g} s; is `swarm sn` running there?"
                )
            try:
                async with asyncio.timeout(remaining):
                    message = await sub.get()
            except TimeoutError:
                continue
            with contextlib.suppress(CodecError):
                env = bus.open(message)
                if env.kind == "presence" and env.role == "sn" and env.sender != bus.uid:
                    found[env.sender] = env.body


def _pick_sn(found: dict[str, dict[str, Any]], prefer: str | None) -> str | None:
    online = {uid: body for uid, body in found.items() if body.get("state") == "online"}
    if prefer is not None:
        return prefer if prefer in online else None
    sentinels = sorted(uid for uid, body in online.items() if body.get("sentinel"))
    if sentinels:
        return sentinels[0]
    return min(online) if online else None


class Watch:
    """Events of one entity kind (and key), newest first-come, duplicates and stale ones dropped."""

    def __init__(self, bus: Bus, sub: Subscription, entity: str) -> None:
        self._bus = bus
        self._sub = sub
        self._entity = entity
        self._seen: dict[str, int] = {}

    def seen(self, key: str, height: int) -> None:
        """Record that the view of ``key`` at ``height`` is known (from a query)."""
        self._seen[key] = max(self._seen.get(key, -1), height)

    async def next(self, timeout: float | None = None) -> Event:
        """The next newer event; raises TimeoutError after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            remaining = None if deadline is None else max(deadline - loop.time(), 0.0)
            raise_if_cancelling()
            async with asyncio.timeout(remaining):
                message = await self._sub.get()
            event = self._parse(message)
            if event is not None and event.height > self._seen.get(event.key, -1):
                self._seen[event.key] = event.height
                return event

    def _parse(self, message: Any) -> Event | None:
        try:
            env = self._bus.open(message)
        except CodecError:
            return None
        body = env.body
        if env.kind != EVENT_KIND or env.role != "sn" or body.get("entity") != self._entity:
            return None
        key, height = body.get("key"), body.get("height")
        if not isinstance(key, str) or not isinstance(height, int):
            return None
        return Event(self._entity, key, height, body.get("view"))


class LedgerClient:
    """Requests to one SN on a bus session."""

    def __init__(self, bus: Bus, sn_uid: str, *, timeout: float = 30.0) -> None:
        self.bus = bus
        self.sn = sn_uid
        self.timeout = timeout

    @classmethod
    async def connect(cls, bus: Bus, *, timeout: float = 30.0, prefer: str | None = None) -> LedgerClient:
        """Find an SN on the network and talk to it."""
        return cls(bus, await find_sn(bus, timeout=timeout, prefer=prefer))

    async def submit(
        self, kind: str, body: dict[str, Any], *, timeout: float | None = None
    ) -> dict[str, Any]:
        """Sign and submit a transaction; returns its receipt or raises Rejected with the reason."""
        bus = self.bus
        env = make_envelope(
            f"tx:{kind}", body, sender=bus.uid, role=bus.role, signer=bus.signer, voucher=bus.voucher
        )
        try:
            result = await bus.request(
                self.sn, "submit", {"tx": encode_envelope(env)}, timeout=timeout or self.timeout, role="sn"
            )
        except RemoteError as exc:
            if exc.code == "rejected":
                raise Rejected(kind, exc.message) from None
            raise
        return dict(result or {})

    async def query(self, query_name: str, /, *, timeout: float | None = None, **args: Any) -> Any:
        """A read of the ledger's state (see contracts.views.QUERIES for the names and arguments)."""
        body = {"name": query_name, "args": args}
        return await self.bus.request(self.sn, "query", body, timeout=timeout or self.timeout, role="sn")

    async def status(self) -> dict[str, Any]:
        """The SN's own status: uid, height, head, sentinel, version."""
        return dict(await self.bus.request(self.sn, "status", {}, timeout=self.timeout, role="sn"))

    async def blocks(self, start: int) -> tuple[list[bytes], int]:
        """Stored blocks from height ``start`` on (a batch, not necessarily to the head) and the head."""
        reply = await self.bus.request(self.sn, "blocks", {"start": start}, timeout=self.timeout)
        raw, head = reply.get("blocks"), reply.get("head")
        if (
            not isinstance(raw, list)
            or not all(isinstance(b, bytes) for b in raw)
            or not isinstance(head, int)
        ):
            raise BusError(f"SN {self.sn!r} sent a malformed blocks reply")
        return raw, head

    async def read_history(self, index: HistoryIndex) -> HistoryIndex:
        """Fold the blocks ``index`` has not seen yet, up to the head (decoding off the event loop).

        Raises:
            BusError: the SN cannot be reached, or it sent a block that does not decode or follow.
        """
        while True:
            raw, head = await self.blocks(index.height + 1)
            if raw:
                try:
                    await asyncio.to_thread(index.add_all, raw)
                except ValueError as exc:  # BlockError: the reply is not the chain
                    raise BusError(f"SN {self.sn!r} sent a block the history cannot use: {exc}") from None
            if not raw or index.height >= head:
                return index

    async def history(self, contract: str, run: int | None = None) -> dict[str, Any]:
        """Every progress report and merged round of ``contract`` (``run``: 0-based; None: the latest
        run with records) as plain data: ``{contract, run, runs, records}``; read from the chain."""
        index = await self.read_history(HistoryIndex())
        chosen = index.latest_run(contract) if run is None else run
        records = [r.as_dict() for r in index.records(contract, chosen)]
        return {"contract": contract, "run": chosen, "runs": index.runs(contract), "records": records}

    @contextlib.asynccontextmanager
    async def watch(self, entity: str, key: str = "+") -> AsyncIterator[Watch]:
        """Subscribe to the events of ``entity`` (``key`` or all keys) for the duration of the block."""
        topic = self.bus.topics.events("+", entity, key)
        async with self.bus.subscribe(topic, maxsize=10_000) as sub:
            yield Watch(self.bus, sub, entity)
