"""A replicating SN: copies the sentinel's chain block by block, verifying each, and forwards writes.

It subscribes to the sentinel's block feed first and then catches up by height, so no block is missed;
a gap (a block that does not follow the head) triggers another catch-up.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from contracts.block import BlockError, decode_block
from contracts.blockstore import ChainError
from contracts.ledger import Ledger
from daemons.aio import raise_if_cancelling
from daemons.bus import Bus, BusError
from daemons.ledger_client import find_sn
from daemons.sn.chain import LocalChain
from daemons.sn.forward import forward_write
from wire import CodecError

__all__ = ["Replica"]

log = logging.getLogger("swarm.sn.replica")


class Replica:
    """Follows the sentinel's chain."""

    def __init__(self, bus: Bus, chain: LocalChain, sentinel_uid: str | None) -> None:
        self._bus = bus
        self._chain = chain
        self._sentinel_uid = sentinel_uid
        self.sentinel = ""
        self._advanced = asyncio.Condition()
        self._appending = asyncio.Lock()
        self._reconnected = asyncio.Event()
        bus.notify_reconnects(self._reconnected)

    @property
    def ledger(self) -> Ledger:
        """The local copy of the chain."""
        assert self._chain.ledger is not None  # noqa: S101 - set by start()
        return self._chain.ledger

    async def start(self, ledger: Ledger | None) -> Ledger:
        """Find the sentinel and make sure a local chain (at least its genesis) exists."""
        self.sentinel = self._sentinel_uid or await find_sn(self._bus, timeout=60)
        if self.sentinel == self._bus.uid:
            raise SystemExit("swarm sn: this SN has no ledger and is not the sentinel (use --sentinel)")
        if ledger is not None:
            return ledger
        reply = await self._bus.request(self.sentinel, "blocks", {"start": 0}, timeout=30)
        genesis = reply["blocks"][0]
        chain = self._chain
        ledger = await asyncio.to_thread(Ledger.from_genesis, chain.path, genesis, verifier=chain.verifier)
        log.info("replicating the ledger of %s into %s", self.sentinel, chain.path)
        return ledger

    async def follow(self) -> None:
        """Apply the sentinel's blocks as they come, until cancelled."""
        topic = self._bus.topics.events(self.sentinel, "block")
        async with self._bus.subscribe(topic, maxsize=100_000) as sub, asyncio.TaskGroup() as group:
            await self.catch_up()
            group.create_task(self._catch_up_after_reconnects(), name="sn.replica.reconnects")
            async for message in sub:
                raise_if_cancelling()
                try:
                    env = self._bus.open(message)
                except CodecError as exc:
                    log.warning("ignored a bad block message: %s", exc)
                    continue
                height, raw = env.body.get("height"), env.body.get("raw")
                if not isinstance(height, int) or not isinstance(raw, bytes) or height <= self.ledger.height:
                    continue
                if height == self.ledger.height + 1:
                    await self._append(raw)
                else:
                    await self.catch_up()

    async def _catch_up_after_reconnects(self) -> None:
        """Blocks sealed while we were disconnected were published to nobody: fetch them."""
        while True:
            await self._reconnected.wait()
            self._reconnected.clear()
            await self.catch_up()

    async def catch_up(self) -> None:
        """Fetch and append every block the sentinel has beyond our head."""
        while True:
            try:
                reply = await self._bus.request(self.sentinel, "blocks", {"start": self.ledger.height + 1})
            except BusError as exc:
                log.warning("cannot catch up with %s: %s", self.sentinel, exc)
                return
            blocks = reply.get("blocks") or []
            for raw in blocks:
                await self._append(raw)
            if not blocks or self.ledger.height >= int(reply.get("head", 0)):
                return

    async def _append(self, raw: bytes) -> None:
        async with self._appending:
            try:
                await asyncio.to_thread(self._append_locked, raw)
            except ChainError as exc:
                if self._is_old(raw):
                    return  # the feed and a catch-up both delivered it
                log.error("refused a block from %s: %s", self.sentinel, exc)
                return
        async with self._advanced:
            self._advanced.notify_all()

    def _is_old(self, raw: bytes) -> bool:
        try:
            return decode_block(raw).height <= self.ledger.height
        except BlockError:
            return False

    def _append_locked(self, raw: bytes) -> None:
        with self._chain.lock:
            self.ledger.append_block(raw)

    async def forward(self, raw: bytes) -> dict[str, Any]:
        """Submit a write to the sentinel; return (or refuse a resent one the ledger holds) once our copy
        holds its block (read your writes)."""
        return await forward_write(self._bus, self.sentinel, raw, self._reach, timeout=30)

    async def reach(self, height: int, timeout: float) -> bool:
        """True once our copy holds block ``height`` (within ``timeout`` seconds)."""
        async with self._advanced:
            try:
                async with asyncio.timeout(timeout):
                    await self._advanced.wait_for(lambda: self.ledger.height >= height)
            except TimeoutError:
                return False
        return True

    async def _reach(self, height: int) -> None:
        """Wait (at most 10 s) until our copy holds block ``height``."""
        if not await self.reach(height, timeout=10):
            log.warning("block %d has not reached this replica yet", height)
