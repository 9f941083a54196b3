"""The SN enforces ``REVOKE IDENTITY`` beyond the ledger: on its bus and in the broker it manages.

The ledger already rejects every transaction of a revoked identity. :class:`LedgerRevocations` makes the
SN's bus drop that identity's messages too (``bus.refused``), straight from the ledger's state.
:func:`enforce_in_broker` keeps the managed mosquitto's ACL in step: at start and after every
``identity`` event the revoked identities are denied everything, and mosquitto reloads its ACL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from daemons.aio import raise_if_cancelling
from daemons.broker import ManagedBroker
from daemons.bus import Bus
from daemons.sn.chain import LocalChain
from wire import CodecError

__all__ = ["LedgerRevocations", "enforce_in_broker"]

log = logging.getLogger("swarm.sn.revocations")


class LedgerRevocations:
    """``identity in revocations``: whether the SN's ledger has revoked it (a live view of the chain)."""

    def __init__(self, chain: LocalChain) -> None:
        self._chain = chain

    def __contains__(self, identity: object) -> bool:
        ledger = self._chain.ledger
        return ledger is not None and identity in ledger.state.revoked

    def current(self) -> frozenset[str]:
        """Every identity revoked so far."""
        ledger = self._chain.ledger
        return frozenset(ledger.state.revoked) if ledger is not None else frozenset()


async def enforce_in_broker(bus: Bus, revocations: LedgerRevocations, broker: ManagedBroker | None) -> None:
    """Keep ``broker`` refusing the revoked identities until cancelled (nothing to do without one)."""
    if broker is None:
        return
    applied = broker.revoked
    announced: set[str] = set()  # from events, in case this SN's copy of the chain is behind
    async with bus.subscribe(bus.topics.events("+", "identity", "+"), maxsize=10_000) as events:
        while True:
            raise_if_cancelling()
            wanted = revocations.current() | announced
            if wanted != applied:
                applied = wanted
                if not await asyncio.to_thread(broker.refuse, wanted):
                    log.warning(
                        "the %s broker cannot refuse revoked identities (%s); the nodes' buses drop "
                        "their messages",
                        broker.engine,
                        "no TLS identities" if broker.settings.tls is None else "no ACL reload",
                    )
            message = await events.get()
            with contextlib.suppress(CodecError):
                env = bus.open(message)
                key = env.body.get("key")
                if env.kind == "event" and env.role == "sn" and isinstance(key, str):
                    announced.add(key)
