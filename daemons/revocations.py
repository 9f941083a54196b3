"""Revoked identities, followed from the ledger, so that a node's bus drops their messages.

``REVOKE IDENTITY <cn>`` records ``identity.revoke`` in the ledger; the SN publishes an ``identity``
event for it. :func:`follow_revocations` keeps a node's ``bus.refused`` up to date: it subscribes to those
events first, then reads the current list (``identities.revoked``), so that none is missed. A revocation
is permanent, so the set only grows.
"""

from __future__ import annotations

import asyncio
import logging

from daemons.aio import raise_if_cancelling
from daemons.bus import BusError
from daemons.ledger_client import LedgerClient

__all__ = ["follow_revocations"]

log = logging.getLogger("swarm.revocations")
_RETRY_SECONDS = 5.0


async def follow_revocations(ledger: LedgerClient, refused: set[str]) -> None:
    """Add every revoked identity to ``refused`` until cancelled.

    A lost SN is waited for (the watch is set up again every few seconds); nothing here ends the node.
    """
    while True:
        raise_if_cancelling()
        try:
            async with ledger.watch("identity") as watch:
                views = await ledger.query("identities.revoked")
                _add(refused, {str(v["identity"]) for v in views if isinstance(v, dict)})
                while True:
                    event = await watch.next()
                    if isinstance(event.view, dict) and event.view.get("identity") == event.key:
                        _add(refused, {event.key})
        except BusError as exc:
            log.info("following revocations: %s; trying again in %g s", exc, _RETRY_SECONDS)
            await asyncio.sleep(_RETRY_SECONDS)


def _add(refused: set[str], identities: set[str]) -> None:
    new = identities - refused
    if new:
        refused.update(new)
        log.warning("identities revoked: %s; their messages are dropped from now on", ", ".join(sorted(new)))
