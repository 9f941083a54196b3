"""An SN of a clustered ledger: follows the replicated chain (``ChainLog``) into its own SQLite copy,
and seals while it holds the sealer lease.

- **Opening**: the local chain must be a prefix of the replicated one (or the replicated one is empty
  and this is the sentinel: it puts its chain, or a new genesis, into the stream).
- **Following**: every block of the stream is verified (links, signatures, transactions) and its sealer
  must be the genesis sealer or an SN registered in the chain before it: an SN that is not in the swarm
  cannot seal.
- **Leading**: an eligible SN (the genesis sealer, or registered) campaigns for the lease; the winner
  catches up to the stream's head, then runs the sealing role until it loses the lease or is fenced.
- **Writes** that reach an SN that does not seal are forwarded to the one that does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import nats.errors
import nats.js.errors

from contracts.block import BlockError, decode_block
from contracts.blockstore import ChainError
from contracts.ledger import Ledger
from daemons.bus import Bus, BusError, RpcError
from daemons.sn.chain import LocalChain
from daemons.sn.chainlog import ChainLog, ChainLogError, Fenced, failure_text
from daemons.sn.forward import forward_write
from wire import SignerLike

__all__ = ["ClusterRole"]

log = logging.getLogger("swarm.sn.cluster")
SealingRole = Callable[[Ledger], Coroutine[Any, Any, None]]
FEED_WAIT = 0.5  # s: the stream's feed brings a new block within this unless its consumer is made again
FETCH_AT_MOST = 64  # blocks read one by one when the feed lags; a longer backlog is the feed's to bring
# s: the longest a forwarded write waits to learn who seals, and then for the sealer's answer. Together
# below a client's wait for one answer (Patience.attempt, 5 s), so that in a failover a client hears
# "failover" from this live SN and asks it again, instead of hearing nothing and moving to another SN
# (which may be the sealer that was cut off, its presence still online).
SEALER_LOOKUP_WAIT = 1.0
FORWARD_WAIT = 2.5


class ClusterRole:
    """Replication and sealer election of one SN on a ``ChainLog``."""

    def __init__(
        self,
        chain: LocalChain,
        bus: Bus,
        chainlog: ChainLog,
        signer: SignerLike | None,
        *,
        sentinel: bool,
    ) -> None:
        self._chain = chain
        self._bus = bus
        self.log = chainlog
        self._signer = signer
        self._sentinel = sentinel
        self._advanced = asyncio.Condition()
        self.sealing = False
        self.fenced = asyncio.Event()
        self._revision = 0

    @property
    def ledger(self) -> Ledger:
        """The local copy."""
        assert self._chain.ledger is not None  # noqa: S101 - set by open()
        return self._chain.ledger

    # ------------------------------------------------------------------ opening
    async def open(self) -> Ledger:
        """A local chain that agrees with the replicated one (created or migrated when needed)."""
        chain = self._chain
        while True:
            head = await self.log.height()
            if chain.ledger is None and head >= 0:
                genesis = await self.log.block(0)
                chain.ledger = await asyncio.to_thread(
                    Ledger.from_genesis, chain.path, genesis, verifier=chain.verifier
                )
                log.info("replicating the clustered ledger into %s", chain.path)
            elif chain.ledger is None and self._sentinel:
                chain.ledger = await asyncio.to_thread(self._create)
            elif chain.ledger is None:
                log.info("waiting for the sentinel to put the genesis block into the cluster")
                await asyncio.sleep(1.0)
                continue
            if head < 0 and self._sentinel:
                if not await self._publish_local():
                    continue  # another sentinel won the race: start again from its chain
                head = await self.log.height()
            await self._check_prefix(head)
            return self.ledger

    def _create(self) -> Ledger:
        return Ledger.create(
            self._chain.path,
            sealer=self._signer,
            sealer_uid=self._bus.uid,
            verifier=self._chain.verifier,
            now=time.time(),
        )

    async def _publish_local(self) -> bool:
        """Put the local chain into the empty stream (a single-host swarm moving to a cluster)."""
        for height, raw in enumerate(self.ledger.raw_blocks(0)):
            try:
                await self.log.append(height, raw)
            except Fenced:
                if height > 0:
                    raise
                log.warning("another SN created the clustered ledger first; using its chain")
                self.ledger.close()
                self._chain.path.unlink(missing_ok=True)
                self._chain.ledger = None
                return False
        log.info("put %d blocks of %s into the cluster", self.ledger.height + 1, self._chain.path)
        return True

    async def _check_prefix(self, head: int) -> None:
        mine = self.ledger.height
        if mine > head:
            raise ChainError(
                head + 1,
                f"the local chain has {mine - head} block(s) beyond the clustered ledger's head {head}; "
                "they were never replicated: move this ledger away and start again",
                self._chain.path,
            )
        if mine >= 0 and await self.log.block(mine) != self.ledger.raw_blocks(mine, mine + 1)[0]:
            msg = f"block {mine} differs from the clustered ledger's (a fork)"
            raise ChainError(mine, msg, self._chain.path)

    # ---------------------------------------------------------------- following
    async def follow(self) -> None:
        """Append the stream's blocks as they come, until cancelled."""
        async for height, raw in self.log.follow(self.ledger.height):
            if height <= self.ledger.height:
                if raw != self.ledger.raw_blocks(height, height + 1)[0]:
                    raise ChainError(height, f"block {height} of the cluster differs from ours (a fork)")
                continue
            await self._take(height, raw)

    async def _take(self, height: int, raw: bytes) -> None:
        """Append block ``height`` of the stream to our copy and wake those waiting for it.

        Raises:
            ChainError: its sealer may not seal here, or it does not verify or extend our chain.
        """
        problem = self._foreign_sealer(raw)
        if problem is not None:
            raise ChainError(height, f"block {height} is refused: {problem}", self._chain.path)
        await asyncio.to_thread(self._append, raw)
        async with self._advanced:
            self._advanced.notify_all()

    def _append(self, raw: bytes) -> None:
        with self._chain.lock:
            if decode_block(raw).height == self.ledger.height + 1:  # not sealed here meanwhile
                self.ledger.append_block(raw)

    def _foreign_sealer(self, raw: bytes) -> str | None:
        """Why the block's sealer may not seal here (None when it may)."""
        try:
            sealer = decode_block(raw).sealer
        except BlockError as exc:
            return str(exc)
        if sealer == decode_block(self.ledger.raw_blocks(0, 1)[0]).sealer:
            return None
        node = self.ledger.state.nodes.get(sealer)
        if node is None or node.role != "sn":
            return f"its sealer {sealer!r} is not an SN of this swarm"
        return None

    async def reach(self, height: int, timeout: float) -> bool:
        """True once the local chain holds ``height`` (within ``timeout``): from the stream's feed or, when
        that lags, from the stream itself. The feed's ordered consumer is made again after the NATS node it
        read from died, which took 10-16 s while the stream, on the surviving nodes, had the block."""
        if await self.wait_for(height, timeout=min(FEED_WAIT, timeout)):
            return True
        deadline = time.monotonic() + max(timeout - FEED_WAIT, 0.0)
        before = self.ledger.height
        if height - before <= FETCH_AT_MOST:
            try:
                await self._fetch_up_to(height)
            except (nats.errors.Error, TimeoutError) as exc:
                log.info("cannot read block %d from the stream yet: %s", height, failure_text(exc))
        if self.ledger.height > before:
            log.info("read blocks %d-%d from the stream: its feed lags", before + 1, self.ledger.height)
        return await self.wait_for(height, timeout=max(deadline - time.monotonic(), 0.0))

    async def _fetch_up_to(self, height: int) -> None:
        """Append the blocks after our head up to ``height``, read one by one from the stream and taken as
        ``follow`` takes them (a block ``follow`` brings as well is then only compared)."""
        while self.ledger.height < height:
            number = self.ledger.height + 1
            try:
                await self._take(number, await self.log.block(number))
            except (BlockError, ChainError) as exc:  # follow meets it too, and stops this SN
                reason = exc.reason if isinstance(exc, ChainError) else str(exc)
                log.warning("%s (read from the stream; this SN waits for its feed)", reason)
                return

    async def wait_for(self, height: int, timeout: float) -> bool:
        """True once the local chain holds ``height``."""
        async with self._advanced:
            try:
                async with asyncio.timeout(timeout):
                    await self._advanced.wait_for(lambda: self.ledger.height >= height)
            except TimeoutError:
                return False
        return True

    # ------------------------------------------------------------------ leading
    def eligible(self) -> bool:
        """The genesis sealer, or an SN registered in the chain."""
        uid = self._bus.uid
        node = self.ledger.state.nodes.get(uid)
        return (node is not None and node.role == "sn") or uid == decode_block(
            self.ledger.raw_blocks(0, 1)[0]
        ).sealer

    async def lead(self, sealing_role: SealingRole) -> None:
        """Campaign for the lease whenever it is free; seal while holding it. Until cancelled."""
        pause = self.log.lease / 6
        while True:
            if not self.eligible():
                await asyncio.sleep(pause)
                continue
            try:
                revision = await self.log.campaign()
            except (nats.errors.Error, TimeoutError) as exc:
                log.warning("cannot campaign for the sealer lease: %s", exc)
                revision = None
            if revision is None:
                await asyncio.sleep(pause)
                continue
            try:
                await self._seal_while_leading(revision, sealing_role)
            except (nats.errors.Error, TimeoutError) as exc:  # e.g. our NATS node died: campaign again
                log.warning("cannot seal now: %s; campaigning again", failure_text(exc))
                await asyncio.sleep(pause)

    async def _seal_while_leading(self, revision: int, sealing_role: SealingRole) -> None:
        started = time.monotonic()
        head = await self.log.height()
        await self.reach(head, timeout=60)
        log.warning("this SN seals now (lease won; caught up to block %d)", head)
        self.fenced.clear()
        self.sealing = True
        self._revision = revision
        try:
            async with asyncio.TaskGroup() as group:
                role = group.create_task(sealing_role(self.ledger), name="sn.sealing")
                await self._keep_lease()
                role.cancel()
        except asyncio.CancelledError:  # the SN stops: hand the lease over now, not when it expires
            with contextlib.suppress(Exception):
                await asyncio.shield(self.log.release(self._revision))
            raise
        except ExceptionGroup as group_exc:
            stopped, rest = group_exc.split((Fenced, ChainLogError, nats.errors.Error, TimeoutError))
            if rest is not None:
                raise rest from None
            assert stopped is not None  # noqa: S101 - one of the two parts is not None
            log.warning("stopped sealing: %s", stopped.exceptions[0])
        finally:
            self.sealing = False
        log.warning("this SN no longer seals (held the lease %.1f s)", time.monotonic() - started)

    async def _keep_lease(self) -> None:
        """Renew every third of the lease; return when it is lost (or the sealer was fenced)."""
        every = self.log.lease / 3
        while not self.fenced.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every):
                    await self.fenced.wait()
            if self.fenced.is_set():
                return
            try:
                async with asyncio.timeout(every):
                    self._revision = await self.log.renew(self._revision)
            except (nats.js.errors.KeyWrongLastSequenceError, nats.errors.Error, TimeoutError) as exc:
                log.warning("lost the sealer lease: %s", failure_text(exc))
                return

    # --------------------------------------------------------------- forwarding
    async def forward(self, raw: bytes) -> dict[str, Any]:
        """Submit a write to the SN that seals; return (or refuse a resent one the ledger holds) once our
        copy holds its block."""
        try:
            async with asyncio.timeout(SEALER_LOOKUP_WAIT):
                sealer = await self.log.sealer()
        except (nats.errors.Error, TimeoutError) as exc:  # JetStream has no quorum this moment
            reason = failure_text(exc)
            raise RpcError("failover", f"cannot tell which SN seals now ({reason}); try again") from None
        if sealer is None or sealer == self._bus.uid:
            raise RpcError("failover", "no SN seals right now (a failover is under way); try again")
        try:
            return await forward_write(self._bus, sealer, raw, self._reach, timeout=FORWARD_WAIT)
        except BusError as exc:
            raise RpcError("failover", f"the sealing SN {sealer!r} did not answer: {exc}") from None

    async def _reach(self, height: int) -> None:
        """Wait (at most 10 s) until our copy holds block ``height`` (read your writes)."""
        if not await self.reach(height, timeout=10):
            log.warning("block %d has not reached this SN yet", height)
