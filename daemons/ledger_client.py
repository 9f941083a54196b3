"""Talking to the SN: find it, submit signed transactions, query views, watch entity events.

Used by the SL, the SWOP and swci alike. Events are ``nodes/<sn>/ev/<entity>/<key>`` envelopes with
``{entity, key, height, view}``; a watch subscribes before it reads the current view, so no change is lost.

An SN or broker outage is not an error here: a request that gets no answer is retried with backoff, on
another online SN when there is one, until the client's ``Patience`` runs out (``SWARM_SN_DEADLINE``
seconds, 300 by default); each retry logs one line. A reconnect of the bus (the SN's broker is back)
ends the wait before a retry at once. A transaction resent after a lost answer that the ledger already
holds counts as accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contracts.history import HistoryIndex
from contracts.tx import is_duplicate
from contracts.views import listed_rounds
from daemons.aio import raise_if_cancelling
from daemons.bus import Bus, BusError, RemoteError
from daemons.bus.endpoint import Message
from daemons.bus.session import Subscription
from wire import CodecError, Envelope, encode_envelope, make_envelope

__all__ = ["Event", "LedgerClient", "Patience", "Rejected", "Watch", "find_sn"]

log = logging.getLogger("swarm.ledger_client")
EVENT_KIND = "event"
_SETTLE = 0.5  # seconds to hear the other SNs' retained presence before choosing among them
# Refusals that are about the moment, not the transaction: no SN seals right now (another will), or the
# SN cannot store blocks now (its disk is full).
_RETRIED = frozenset({"failover", "unavailable"})


@dataclass(frozen=True, slots=True)
class Patience:
    """How long a client keeps retrying through an SN or broker outage before it gives up.

    ``deadline``: seconds a call may take, retries included; ``attempt``: the longest wait for one
    answer; retries back off from ``backoff_base`` up to ``backoff_cap`` seconds, with jitter, except
    after an SN answered that it cannot serve now (a failover under way, or it cannot store blocks): that
    SN is alive and answers at once, and it serves again within seconds of the cause going, so such a
    call is tried again within ``answered_cap`` seconds, not 10 s later. After a failover answer it is
    the same SN (it forwards to the new sealer once there is one; another SN would answer the same) until
    it has answered so for ``failover_stay`` seconds.
    """

    deadline: float = 300.0
    attempt: float = 5.0
    backoff_base: float = 0.5
    backoff_cap: float = 10.0
    answered_cap: float = 1.0
    failover_stay: float = 15.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Patience:
        """``SWARM_SN_DEADLINE`` (seconds) overrides the deadline."""
        text = (os.environ if env is None else env).get("SWARM_SN_DEADLINE", "").strip()
        if not text:
            return cls()
        try:
            deadline = float(text)
        except ValueError:
            raise ValueError(f"SWARM_SN_DEADLINE={text!r} is not a number of seconds") from None
        if not deadline > 0:
            raise ValueError(f"SWARM_SN_DEADLINE={text!r} must be more than 0 seconds")
        return cls(deadline=deadline, attempt=min(5.0, deadline))

    def backoff(self, attempt: int, *, answered: bool = False) -> float:
        """Seconds to wait before retry number ``attempt`` (1, 2, ...); ``answered``: the last failure was
        an SN's answer that it cannot serve now (not a silence)."""
        cap = min(self.backoff_cap, self.answered_cap) if answered else self.backoff_cap
        return random.uniform(self.backoff_base / 2, min(cap, self.backoff_base * 2**attempt))


@dataclass(slots=True)
class _RetryReport:
    """The log lines of one call's retries: a warning for each new failure, a quieter line each time
    the same one repeats (an SN cut off, a failover of several seconds), and one line when the call
    gets through after them."""

    method: str
    started: float
    last: str = ""

    def failed(self, sn: str, failure: BusError, left: float) -> None:
        text = str(failure)
        level = logging.INFO if text == self.last else logging.WARNING
        self.last = text
        what = "%s to SN %r failed (%s); retrying, for up to %.0f s more"
        log.log(level, what, self.method, sn, text, left)

    def answered(self, sn: str, retries: int, now: float) -> None:
        if retries:
            log.info(
                "%s answered by SN %r after %d %s, %.1f s",
                self.method,
                sn,
                retries,
                "retry" if retries == 1 else "retries",
                now - self.started,
            )


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


async def find_sn(
    bus: Bus, *, timeout: float = 30.0, prefer: str | None = None, avoid: str | None = None
) -> str:
    """The uid of an online SN on ``bus``'s network (the sentinel first, or ``prefer``).

    ``avoid`` (an SN that did not answer) is chosen only when no other SN shows up within a moment.
    """
    found: dict[str, dict[str, Any]] = {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    settle = loop.time() + min(_SETTLE, timeout)
    # kept: no SUBSCRIBE and UNSUBSCRIBE per search (a failover searches often; on NATS each one is a
    # write to its session store); the bus hands a new block the presences the broker sent before
    async with bus.subscribe(bus.topics.presence(), maxsize=100_000, keep=True) as sub:
        while True:
            now = loop.time()
            choice = _pick_sn(found, prefer, avoid if now < settle else None)
            if choice is not None:
                return choice
            if now >= deadline:
                raise BusError(
                    f"no SN is online on network {bus.config.network!r} at {bus.config.broker} "
                    f"after {timeout:g} s; is `swarm sn` running there?"
                )
            until = deadline if now >= settle else min(settle, deadline)
            try:
                async with asyncio.timeout(max(until - now, 0.01)):
                    message = await sub.get()
            except TimeoutError:
                continue
            with contextlib.suppress(CodecError):
                env = bus.open(message)
                if env.kind == "presence" and env.role == "sn" and env.sender != bus.uid:
                    found[env.sender] = env.body


def _pick_sn(found: dict[str, dict[str, Any]], prefer: str | None, avoid: str | None = None) -> str | None:
    online = {uid: body for uid, body in found.items() if body.get("state") == "online" and uid != avoid}
    if prefer is not None:
        return prefer if prefer in online else None
    sentinels = sorted(uid for uid, body in online.items() if body.get("sentinel"))
    if sentinels:
        return sentinels[0]
    return min(online) if online else None


class OpenedEvents:
    """The last few event messages a bus session received, each opened (decoded and verified) once
    however many watches of it get that message: a node's follow of one round and of the next watch the
    same events for a moment."""

    def __init__(self, bus: Bus, size: int = 16) -> None:
        self._bus = bus
        self._size = size
        self._opened: OrderedDict[int, tuple[Message, Envelope | None]] = OrderedDict()

    def open(self, message: Message) -> Envelope | None:
        """``message``'s envelope, or None when it does not open (``Bus.open``)."""
        key = id(message)  # the entry holds the message, so its id is not reused while it is here
        kept = self._opened.get(key)
        if kept is not None and kept[0] is message:
            return kept[1]
        try:
            env: Envelope | None = self._bus.open(message)
        except CodecError:
            env = None
        self._opened[key] = (message, env)
        if len(self._opened) > self._size:
            self._opened.popitem(last=False)
        return env


class Watch:
    """Events of one entity kind (and key), newest first-come, duplicates and stale ones dropped."""

    def __init__(
        self,
        bus: Bus,
        sub: Subscription,
        entity: str,
        on_height: Callable[[int], None] | None = None,
        opened: OpenedEvents | None = None,
    ) -> None:
        """``on_height``: told the block height of every event that arrives (``LedgerClient.saw``);
        ``opened``: the envelopes of messages other watches opened already."""
        self._sub = sub
        self._entity = entity
        self._seen: dict[str, int] = {}
        self._on_height = on_height
        self._opened = opened or OpenedEvents(bus, size=1)

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
            if event is not None and self._on_height is not None:
                self._on_height(event.height)
            if event is not None and event.height > self._seen.get(event.key, -1):
                self._seen[event.key] = event.height
                return event

    def _parse(self, message: Message) -> Event | None:
        env = self._opened.open(message)
        if env is None:
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

    def __init__(
        self, bus: Bus, sn_uid: str, *, timeout: float | None = None, patience: Patience | None = None
    ) -> None:
        """``timeout`` alone bounds every call (no retry beyond it, as a shell wants); without it the
        client is as patient as ``patience`` (``SWARM_SN_DEADLINE``), as a daemon wants."""
        self.bus = bus
        self.sn = sn_uid
        self.timeout = timeout or 30.0
        if patience is None and timeout is not None:
            patience = Patience(deadline=timeout, attempt=timeout)
        self.patience = patience or Patience.from_env()
        # The newest block this client knows of (from an event or a receipt). Every read names it, and an
        # SN whose copy of the chain is behind it waits for that block before answering: a client reads
        # at least what the sealer's events told it, whichever SN of a cluster it asks.
        self.height = 0
        self._events = OpenedEvents(bus)

    def saw(self, height: int) -> None:
        """Note that the chain holds block ``height`` (from an event or a receipt)."""
        self.height = max(self.height, height)

    @classmethod
    async def connect(
        cls,
        bus: Bus,
        *,
        timeout: float = 30.0,
        prefer: str | None = None,
        patience: Patience | None = None,
    ) -> LedgerClient:
        """Find an SN on the network (waiting up to ``timeout`` seconds) and talk to it."""
        return cls(bus, await find_sn(bus, timeout=timeout, prefer=prefer), patience=patience)

    def sign(self, kind: str, body: dict[str, Any]) -> bytes:
        """The signed envelope of a transaction of ours, to submit later (``submit``'s ``signed``) or to
        have a peer relay (``relayed``)."""
        bus = self.bus
        env = make_envelope(
            f"tx:{kind}", body, sender=bus.uid, role=bus.role, signer=bus.signer, voucher=bus.voucher
        )
        return encode_envelope(env)

    async def submit(
        self,
        kind: str,
        body: dict[str, Any],
        *,
        timeout: float | None = None,
        seen: asyncio.Future[dict[str, Any]] | None = None,
        signed: bytes | None = None,
        relayed: Sequence[bytes] = (),
    ) -> dict[str, Any]:
        """Sign and submit a transaction; returns its receipt or raises Rejected with the reason.

        The same envelope is resent through an outage; when the ledger says it holds it already (an
        answer was lost), that is its acceptance. ``seen``: the receipt as an event shows it (the
        transaction in a block); the SN then answers only a failure or a resend. ``signed``: the
        envelope ``sign`` made of it, which a peer may have relayed already (the ledger holding it is
        its acceptance too). ``relayed``: peers' signed check-ins, submitted with it (``docs/protocol.md``).
        """
        payload: dict[str, Any] = {"tx": self.sign(kind, body) if signed is None else signed}
        if relayed:
            payload["relayed"] = list(relayed)
        may_hold = signed is not None  # a peer may have relayed it

        def note_retry() -> None:
            nonlocal may_hold
            may_hold = True

        try:
            result = await self._call("submit", payload, timeout, on_retry=note_retry, settled=seen)
        except RemoteError as exc:
            if exc.code != "rejected":
                raise
            if not (may_hold and is_duplicate(exc.message)):  # replies go out once the block is stored
                raise Rejected(kind, exc.message) from None
            log.info("%s is in the ledger already: its first answer was lost, or a peer relayed it (%s)",
                     kind, exc.message)  # fmt: skip
            return await self._duplicate_receipt(kind, body)
        receipt = dict(result or {})
        if isinstance(receipt.get("height"), int):
            self.saw(receipt["height"])
        return receipt

    async def _duplicate_receipt(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        receipt: dict[str, Any] = {"duplicate": True}
        if kind == "round.checkin":  # the one receipt with content: which round the checkin joined
            view = await self.query("contract.rounds", name=body["contract"])
            for rnd in listed_rounds(view):
                checkins = rnd.get("checkins") or []
                if any(c.get("uid") == self.bus.uid and c.get("digest") == body["digest"] for c in checkins):
                    receipt.update(contract=body["contract"], round=rnd["round"])
        return receipt

    async def query(
        self, query_name: str, /, *, timeout: float | None = None, at_least: int = 0, **args: Any
    ) -> Any:
        """A read of the ledger's state (see contracts.views.QUERIES for the names and arguments), from a
        state that holds at least the newest block this client saw (``height``), or block ``at_least``
        (one a peer saw; not kept for later reads)."""
        body: dict[str, Any] = {"name": query_name, "args": args}
        height = max(self.height, at_least)
        if height:
            body["height"] = height
        return await self._call("query", body, timeout)

    async def status(self) -> dict[str, Any]:
        """The SN's own status: uid, height, head, sentinel, version."""
        return dict(await self._call("status", {}, None))

    async def _call(
        self,
        method: str,
        body: dict[str, Any],
        timeout: float | None,
        *,
        on_retry: Callable[[], None] | None = None,
        settled: asyncio.Future[Any] | None = None,
    ) -> Any:
        """``method`` on the SN, retried through outages (on another SN when one is online); ``settled``:
        its result known another way (``Bus.request``)."""
        loop = asyncio.get_running_loop()
        patience = self.patience
        give_up_after = patience.deadline if timeout is None else min(patience.deadline, timeout)
        deadline = loop.time() + give_up_after
        attempt = 0
        report = _RetryReport(method, loop.time())
        failover_since: float | None = None  # when this SN began answering that a failover is under way
        while True:
            raise_if_cancelling()  # a cancellation swallowed below (aiomqtt's wait_for) still ends us
            reconnects = self.bus.reconnects
            wait = min(timeout or self.timeout, patience.attempt, max(deadline - loop.time(), 0.1))
            try:
                reply = await self.bus.request(
                    self.sn, method, body, timeout=wait, role="sn", settled=settled
                )
            except RemoteError as exc:
                if exc.code not in _RETRIED:
                    raise
                failure: BusError = exc
            except BusError as exc:  # no answer (RequestTimeout), or not connected
                failure = exc
            else:
                report.answered(self.sn, attempt, loop.time())
                return reply
            raise_if_cancelling()
            now = loop.time()
            if now >= deadline:
                if give_up_after >= patience.attempt:
                    log.error("%s: giving up after %g s: %s", method, give_up_after, failure)
                raise failure
            attempt += 1
            report.failed(self.sn, failure, deadline - now)
            failover = isinstance(failure, RemoteError) and failure.code == "failover"
            failover_since = (failover_since or now) if failover else None
            delay = patience.backoff(attempt, answered=isinstance(failure, RemoteError))
            await self._pause(min(delay, max(deadline - loop.time(), 0.0)), reconnects)
            if on_retry is not None:
                on_retry()
            if failover_since is None or now - failover_since >= patience.failover_stay:
                await self._choose_sn()
                failover_since = None  # the failover of another SN, if it answers so, counts afresh
            raise_if_cancelling()

    async def _pause(self, seconds: float, reconnects: int) -> None:
        """Back off before a retry: ``seconds``, or until the bus reconnects (it may have already, since
        it had ``reconnects``): the SN's broker is back, and the SN with it, most likely."""
        if self.bus.reconnects == reconnects:
            await self.bus.wait_reconnect(seconds)

    async def _choose_sn(self) -> None:
        """After a failure: another online SN if there is one (failover), else the same one (always
        while the bus is down: then no SN is reachable, and a subscription would wait for the bus)."""
        if not self.bus.connected:
            return
        with contextlib.suppress(BusError):
            chosen = await find_sn(self.bus, timeout=2.0, avoid=self.sn)
            if chosen != self.sn:
                log.warning("switching from SN %r to SN %r", self.sn, chosen)
                self.sn = chosen

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
    async def watch(self, entity: str, key: str = "+", *, keep: bool = False) -> AsyncIterator[Watch]:
        """Subscribe to the events of ``entity`` (``key`` or all keys) for the duration of the block;
        ``keep``: the broker keeps the subscription for the next watch (``Bus.subscribe``)."""
        topic = self.bus.topics.events("+", entity, key)
        async with self.bus.subscribe(topic, maxsize=10_000, keep=keep) as sub:
            yield Watch(self.bus, sub, entity, self.saw, self._events)
