"""Keeps a node known to the ledger: registers it again, and replays its enrolment or contract join,
whenever the ledger shows it offline or does not know it.

That happens after a partition (the SN marked the node offline when its will fired), after the SN was
restarted on a fresh ledger, or when another SN took over. The checks are triggered by a bus reconnect,
by an SN coming online, by an event saying this node went offline, and, as a backstop, every
``check_every`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from daemons.aio import raise_if_cancelling
from daemons.bus import BusError, RemoteError
from daemons.ledger_client import LedgerClient, Rejected
from wire import CodecError

__all__ = ["Attachment"]

log = logging.getLogger("swarm.attachment")


class Attachment:
    """The transactions that make this node part of the swarm, replayed when the ledger lost them."""

    def __init__(
        self, ledger: LedgerClient, registration: dict[str, Any], *, check_every: float = 30.0
    ) -> None:
        self._ledger = ledger
        self._steps: dict[str, dict[str, Any]] = {"node.register": registration}
        self._check_every = check_every
        self._check = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []
        self._lock = asyncio.Lock()
        self.reattached = 0

    def remember(self, kind: str, body: dict[str, Any]) -> None:
        """Replay ``kind`` with ``body`` (after the registration) whenever the node is re-attached."""
        self._steps[kind] = body

    def on_reattach(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after each re-attachment."""
        self._listeners.append(listener)

    async def attach(self, *, strict: bool = False) -> None:
        """Submit every step in order (the first time, and again after the ledger lost the node).

        Raises:
            Rejected: with ``strict`` (the first time), when the ledger refuses a step.
        """
        async with self._lock:
            for kind, body in list(self._steps.items()):
                try:
                    await self._ledger.submit(kind, body)
                except Rejected as exc:
                    if strict:
                        raise
                    log.warning("%s again was refused: %s", kind, exc.reason)

    async def reattach(self, why: str) -> None:
        """Attach again and tell the listeners (a lapsed member then starts from the swarm's model)."""
        log.warning("the ledger lost this node (%s): registering it again", why)
        await self.attach()
        self.reattached += 1
        for listener in self._listeners:
            listener()

    async def run(self) -> None:
        """Check whenever there is a reason to, until cancelled."""
        bus = self._ledger.bus
        bus.notify_reconnects(self._check)
        async with asyncio.TaskGroup() as group:
            group.create_task(self._watch_sn_presence(), name=f"attachment[{bus.uid}].sn-presence")
            group.create_task(self._watch_own_node(), name=f"attachment[{bus.uid}].node")
            while True:
                raise_if_cancelling()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._check_every):
                        await self._check.wait()
                self._check.clear()
                try:
                    why = await self._lost()
                    if why is not None:
                        await self.reattach(why)
                except BusError as exc:
                    log.warning("cannot check this node's registration: %s", exc)

    async def _lost(self) -> str | None:
        """Why the ledger does not count this node as online (None when it does)."""
        try:
            node = await self._ledger.query("node", uid=self._ledger.bus.uid)
        except RemoteError as exc:
            if exc.code == "not-found":
                return f"SN {self._ledger.sn!r} does not know it"
            raise
        if not node.get("online"):
            return f"it is marked offline: {node.get('offline_reason') or 'no reason given'}"
        return None

    async def _watch_sn_presence(self) -> None:
        """An SN that comes online may hold a fresh ledger (restarted, replaced)."""
        bus = self._ledger.bus
        async with bus.subscribe(bus.topics.presence(), maxsize=10_000) as sub:
            async for message in sub:
                raise_if_cancelling()
                with contextlib.suppress(CodecError):
                    env = bus.open(message)
                    if env.role == "sn" and env.body.get("state") == "online" and not message.retain:
                        self._check.set()

    async def _watch_own_node(self) -> None:
        async with self._ledger.watch("node", self._ledger.bus.uid) as watch:
            while True:
                event = await watch.next()
                if isinstance(event.view, dict) and not event.view.get("online"):
                    self._check.set()
