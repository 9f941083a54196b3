"""Group commit: transactions that arrive together are sealed into one block, durable before any ack.

Sealing (decode, verify signatures, apply, SQLite commit with fsync) runs in a worker thread, so the
event loop keeps answering queries and pings while a block is written. After each block the SN
publishes one event per changed entity and the raw block for replicas.

One durable write per round: round check-ins and progress reports are held (not answered) for up to
``hold`` seconds, until the held check-ins let their round close; they are then sealed in one block
with the ``round.close`` that they make due. A leader's ``round.merged`` that every other participant
took already (``taken``), but the final or the init round's, waits with them, so a round's close and
the merge of the round before share one block. Any other transaction, or the end of the hold, seals
what is held at once, in arrival order.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from contracts.blockstore import StorageError
from contracts.ledger import Accepted, Ledger, SealResult
from contracts.machine import due_actions
from contracts.rounds import completes_round, record_may_wait
from contracts.state import State
from contracts.tx import Rejection
from contracts.views import entity_view
from daemons.aio import raise_if_cancelling
from daemons.bus import Bus
from daemons.settings import seconds_from_env
from daemons.sn.chainlog import ChainLog, ChainLogError
from wire import CodecError, SignerLike, decode_envelope, encode_envelope, make_envelope

__all__ = ["REQUESTS_AT_ONCE", "NotSealed", "Outcome", "Sealer", "StoreFailed"]

log = logging.getLogger("swarm.sn.sealer")
MAX_BATCH = 2000
# Requests the SN answers at once (its RPC bound). A held check-in keeps its request open until its round
# can close, so with fewer slots than a batch may hold, a swarm larger than the slots would keep its last
# check-ins out until the hold ran out, and its round out of that block: no fewer than MAX_BATCH.
REQUESTS_AT_ONCE = MAX_BATCH
DEFAULT_HOLD = 0.5  # seconds a check-in may wait for the rest of its round (SWARM_SN_CHECKIN_HOLD)
_DEFERRABLE = ("tx:round.checkin", "tx:contract.progress")
_MERGED = "tx:round.merged"

OnBlock = Callable[[SealResult], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class StoreFailed:
    """The block holding a transaction could not be written (a full disk): nothing was accepted, retry."""

    reason: str


@dataclass(frozen=True, slots=True)
class NotSealed:
    """The block could not be put into the clustered ledger (another SN seals now): nothing was
    accepted; the client sends it again, to whichever SN seals."""

    reason: str


Outcome = Accepted | Rejection | StoreFailed | NotSealed


@dataclass(slots=True)
class _Pending:
    raw: bytes
    future: asyncio.Future[Outcome]
    kind: str = ""
    sender: str = ""
    contract: str = ""
    round: int | None = None
    taken: bool = False

    def __post_init__(self) -> None:
        """What the hold needs to know, read without verifying (sealing verifies)."""
        try:
            env = decode_envelope(self.raw, what="transaction")
        except CodecError:
            return
        self.kind, self.sender = env.kind, env.sender
        contract, number = env.body.get("contract"), env.body.get("round")
        self.contract = contract if isinstance(contract, str) else ""
        self.round = number if type(number) is int else None
        self.taken = env.body.get("taken") is True

    def deferrable(self, state: State) -> bool:
        """A check-in or a progress report, which may wait for the rest of its round; or a merge that
        every other participant took already (``taken``: no node waits for its record) and that may wait
        for the next round's close (``record_may_wait``: not the final or the init round's)."""
        if not self.contract:
            return False
        if self.kind == _MERGED:
            return self.taken and self.round is not None and record_may_wait(state, self.contract, self.round)
        return self.kind in _DEFERRABLE


def _closes_a_round(state: State, batch: list[_Pending]) -> bool:
    """Whether the check-ins in ``batch`` complete a round of ``state`` (so it closes in their block)."""
    senders: dict[str, set[str]] = {}
    for pending in batch:
        if pending.kind == "tx:round.checkin":
            senders.setdefault(pending.contract, set()).add(pending.sender)
    return any(completes_round(state, name, uids) for name, uids in senders.items())


def hold_from_env() -> float:
    """``SWARM_SN_CHECKIN_HOLD`` seconds (0: seal every batch at once), default ``DEFAULT_HOLD``."""
    return seconds_from_env("SWARM_SN_CHECKIN_HOLD", DEFAULT_HOLD)


class Sealer:
    """Seals submitted envelopes into blocks, in arrival order."""

    def __init__(
        self,
        ledger: Ledger,
        bus: Bus,
        signer: SignerLike | None,
        lock: threading.Lock | None = None,
        chainlog: ChainLog | None = None,
        hold: float | None = None,
    ) -> None:
        self.ledger = ledger
        self.hold = hold_from_env() if hold is None else hold
        self._chainlog = chainlog
        self._loop = asyncio.get_running_loop() if chainlog is not None else None
        self._lock = lock or threading.Lock()
        self.bus = bus
        self.signer = signer
        self.blocks_sealed = 0
        self.changed = asyncio.Event()
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._failing_since: float | None = None

    async def submit(self, raw: bytes) -> Outcome:
        """Queue one envelope; returns once its block is on disk, or it was rejected, or not stored."""
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(raw, future))
        return await future

    async def submit_own(self, kind: str, body: dict[str, object]) -> Outcome:
        """Submit a transaction of the SN itself (liveness, round timers)."""
        env = make_envelope(f"tx:{kind}", body, sender=self.bus.uid, role="sn", signer=self.signer)
        return await self.submit(encode_envelope(env))

    async def run(self) -> None:
        """Seal until cancelled."""
        while True:
            raise_if_cancelling()
            batch = await self._next_batch()
            try:
                result = await asyncio.to_thread(self._seal, [p.raw for p in batch])
            except ChainLogError as exc:  # not replicated, so not stored: another SN seals now
                self._refuse(batch, NotSealed(f"not sealed: {exc}"))
                raise
            except StorageError as exc:  # e.g. a full disk: refuse for now, keep running, try the next batch
                self._refuse(batch, StoreFailed(f"the SN cannot store blocks now ({exc}); try again later"))
                continue
            except Exception as exc:  # the block was not stored: nothing was accepted
                log.exception("sealing a block of %d transactions failed", len(batch))
                self._refuse(batch, Rejection(f"the SN could not store the block: {exc}"))
                continue
            if self._failing_since is not None:
                log.info("blocks are stored again (after %.0f s)", time.monotonic() - self._failing_since)
                self._failing_since = None
            for pending, outcome in zip(batch, result.results, strict=True):
                if not pending.future.done():
                    pending.future.set_result(outcome)
            if result.height is not None:
                self.blocks_sealed += 1
                self.changed.set()
                await self._announce(result)

    async def _next_batch(self) -> list[_Pending]:
        """What arrived, in order; check-ins, progress reports and a merge held until a round can close."""
        batch: list[_Pending] = []
        loop = asyncio.get_running_loop()
        until: float | None = None
        while True:
            try:
                async with asyncio.timeout_at(until):
                    batch.append(await self._queue.get())
            except TimeoutError:
                return batch  # held long enough: seal them as they are
            while len(batch) < MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            state = self.ledger.state
            if self.hold <= 0 or len(batch) >= MAX_BATCH or not all(p.deferrable(state) for p in batch):
                return batch
            if _closes_a_round(state, batch):
                return batch
            if until is None:
                until = loop.time() + self.hold

    def _follow_up(self, state: State, time: float) -> list[bytes]:
        """In the sealing thread: the ``round.close`` transactions the batch made due, for its block."""
        return [
            encode_envelope(
                make_envelope(f"tx:{kind}", body, sender=self.bus.uid, role="sn", signer=self.signer)
            )
            for kind, body in due_actions(state, time)
            if kind == "round.close"
        ]

    def _refuse(self, batch: list[_Pending], outcome: StoreFailed | NotSealed | Rejection) -> None:
        if isinstance(outcome, StoreFailed) and self._failing_since is None:
            self._failing_since = time.monotonic()
            log.error("%s; %d transaction(s) refused, they can be sent again", outcome.reason, len(batch))
        for pending in batch:
            if not pending.future.done():
                pending.future.set_result(outcome)

    def _seal(self, envelopes: list[bytes]) -> SealResult:
        replicate = self._replicate if self._chainlog is not None else None
        with self._lock:
            return self.ledger.seal(
                envelopes,
                sealer=self.signer,
                sealer_uid=self.bus.uid,
                now=time.time(),
                replicate=replicate,
                follow_up=self._follow_up,
            )

    def _replicate(self, height: int, raw: bytes) -> None:
        """In the sealing thread: the block goes into the clustered ledger before it is stored here."""
        assert self._chainlog is not None  # noqa: S101 - only set up with a chain log
        assert self._loop is not None  # noqa: S101
        future = asyncio.run_coroutine_threadsafe(self._chainlog.append(height, raw), self._loop)
        try:
            future.result(timeout=15)
        except TimeoutError:
            future.cancel()
            raise ChainLogError(f"block {height} was not appended within 15 s") from None

    async def _announce(self, result: SealResult) -> None:
        """Publish the new block (for replicas) and the view of every entity it changed."""
        assert result.height is not None  # noqa: S101 - only called for a sealed block
        topics, uid = self.bus.topics, self.bus.uid
        try:
            block = {"height": result.height, "raw": result.raw}
            await self.bus.send(topics.event(uid, "block"), "block", block)
            state = self.ledger.state
            for kind, key in result.changes:
                view = entity_view(state, kind, key)
                body = {"entity": kind, "key": key, "height": result.height, "view": view}
                await self.bus.send(topics.event(uid, kind, key), "event", body)
        except Exception:
            log.exception("could not publish the events of block %s", result.height)
