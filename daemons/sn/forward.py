"""A write sent on by an SN that does not seal: to the SN that does, answered once the block it went into
has reached the local copy of the chain (so that its sender reads what it wrote, here)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from contracts.tx import duplicate_block
from daemons.bus import Bus, RemoteError, RpcError

__all__ = ["forward_write"]


async def forward_write(
    bus: Bus, sealer: str, raw: bytes, reach: Callable[[int], Awaitable[None]], *, timeout: float
) -> dict[str, Any]:
    """Submit the envelope ``raw`` to ``sealer`` and return its answer once ``reach(height)`` returns for
    the block it went into. The sealer's refusal is raised as RpcError; the refusal of a resent envelope
    the ledger holds already is raised once ``reach`` has returned for the block that holds it. Raises
    BusError when the sealer does not answer."""
    try:
        result = dict(await bus.request(sealer, "submit", {"tx": raw}, timeout=timeout))
    except RemoteError as exc:
        held_in = duplicate_block(exc.message)
        if held_in is not None:
            await reach(held_in)
        raise RpcError(exc.code, exc.message) from None
    await reach(int(result.get("height", 0)))
    return result
