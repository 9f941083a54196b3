"""The SL's part in sync rounds: check in, wait for the ledger to close the round, merge when leader,
load the merged model whose digest the ledger recorded.

Weights never go through the ledger: a node keeps what it checked in servable (``StateHolder``); the
leader pulls every participant's weights, merges them off the event loop, holds the result and records
its digest; participants pull the merged weights from the leader and check them against that digest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from contracts.rounds import leader_order
from contracts.views import BRIEF_CHECKINS, find_round, listed_rounds
from daemons.bus import Bus, BusError
from daemons.bus.transfer import StateHolder, TransferError, fetch_state
from daemons.ledger_client import LedgerClient, Rejected, Watch
from daemons.settings import flag_from_env, seconds_from_env
from daemons.sl.buffers import MODEL_BUFFERS
from daemons.sl.dataplane import DataPlaneClient, Endpoint, Offers, PushedCheckin, Served, parse_address
from daemons.sl.merge import MergeError, MergeOptions, Rows, TensorLayout, merge_flat
from daemons.sl.roundtimes import RoundTimer
from daemons.sl.screening import Exclusion, merge_weights, required_rows, screen
from daemons.sl.secure_round import SecureRounds, round_info
from daemons.sl.secure_round import lead as lead_secure
from wire.tensors import FlatState, Manifest, TensorSpec, make_manifest
from wire.workers import INLINE_BYTES

__all__ = ["RoundEngine", "RoundResult"]


class _Prefetch(NamedTuple):
    """A pull of a leader's merged model of round ``number``."""

    leader: str
    task: asyncio.Task[tuple[FlatState, Manifest] | None]
    among: tuple[str, ...] | None  # the participants it asked a merge of before the close, or None
    number: int


log = logging.getLogger("swarm.sl.rounds")
_REREAD_AFTER = 10.0
# How long a leader reads its round again while its SN's copy of the chain has not closed it yet
# (a clustered SN that forwards writes may be a block behind the sealer whose event it reacted to).
_LAGGING_READ_WAIT = 10.0
_LAGGING_READ_POLL = 0.05
_UNCONFIRMED_KEPT = 8  # early-taken merged models whose record is awaited, at most
_DATAPLANE_RETRY = 60.0  # seconds a peer whose data plane failed is pulled from through the broker
# How long the leader of a final round waits for another participant to take the merged model before it
# records it (well inside the default leader timeout of 30 s; the participants ask for it as it closes).
FINAL_HANDOVER_WAIT = 10.0
CHECKIN_DEFER = 0.5
"""Seconds a check-in waits at most for the round's early path to end (its merge in hand, or given up):
``SWARM_SL_CHECKIN_DEFER``, 0 for none. It waits ``EARLY_SPAN`` times the median of the node's last
``EARLY_KEPT`` early paths, within that bound, and not at all before it went on early once. The ledger's
part of a round (the check-ins' block, their receipts and events) then runs beside training, not beside
the merge; a round whose early path stalls (a peer gone, a straggler) reaches the ledger that much later."""
EARLY_SPAN = 3.0
RELAY_WAIT = 0.5
"""Seconds a participant that pushed its check-in with its row waits for the predicted leader's relay
of it to show in the round's events before it submits it itself (a leader gone or mistaken)."""
ROWS_WAIT = 0.25
"""Seconds the predicted leader waits for its participants' rows, and the check-ins pushed with them,
before it submits its own check-in with those here: well inside ``RELAY_WAIT``, so that a participant
does not give up on a relay that is on its way (and send the SN a duplicate)."""
RELAY_PAUSE_MAX = 64
"""After a relay of our check-in failed to show, we push none with the next 2, 4, ... rounds' rows (at
most this many) and submit them ourselves: a node whose check-ins the leader cannot relay (one that
lags a round behind the others) pays ``RELAY_WAIT`` seldom, not every round."""
EARLY_KEPT = 8


def relay_checkins_enabled() -> bool:
    """``SWARM_SL_RELAY_CHECKINS=true``: the predicted leader relays its participants' check-ins (off by
    default: with it, ``bench/faults.py``'s ``partition`` row does not yet meet its target reliably;
    ``docs/ledger.md``)."""
    return flag_from_env("SWARM_SL_RELAY_CHECKINS")


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What a sync gave: the weights to continue with, their digest, and which round made them."""

    flat: FlatState
    digest: str
    round: int | None
    final: bool = False
    merged: bool = True


@dataclass(frozen=True, slots=True)
class _Prediction:
    """The round a node expects next: its number, participants (sorted) and leader, if the participants
    of the last round check in again (the usual case)."""

    number: int
    participants: tuple[str, ...]
    leader: str


@dataclass(frozen=True, slots=True)
class _EarlyMerge:
    """A merge of the predicted participants' pushed rows, made by the predicted leader before the
    ledger closed the round; used when the close names the same rows (``matches``)."""

    number: int
    rows: dict[str, tuple[str, float | None]]  # participant -> (digest, weight) of the row merged
    merged: FlatState
    manifest: Manifest
    contributors: list[str]
    excluded: list[Exclusion]

    def matches(self, rnd: dict[str, Any], checkins: dict[str, dict[str, Any]]) -> bool:
        """Whether the ledger closed round ``rnd`` with exactly the rows this merge took."""
        if rnd.get("round") != self.number or set(rnd.get("participants") or ()) != set(self.rows):
            return False
        return all(
            uid in checkins
            and not checkins[uid].get("init")
            and checkins[uid].get("digest") == digest
            and (weight is None or checkins[uid].get("weight") == weight)
            for uid, (digest, weight) in self.rows.items()
        )


@dataclass(slots=True)
class _Part:
    """One check-in of ours, followed on the ledger (after we went on early, in the background)."""

    flat: FlatState
    manifest: Manifest
    body: dict[str, Any]
    keep_own: bool
    public: bool  # a merged model resent: nothing of ours to keep private
    previous: asyncio.Task[RoundResult] | None  # the follow of our last check-in, if it still ran
    prediction: _Prediction | None
    rejoins: int = 0  # the engine's count of re-attachments when the check-in was sent
    # the check-in before ours, while it was followed still: the next sync's early path waits for its
    # close (then drops it), so that going on early runs at most one round ahead of the ledger
    prior: tuple[_Part, asyncio.Task[RoundResult]] | None = None
    # True once the ledger closed the round we checked in to; False when the follow ended without that
    closed: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    # the round we checked in to, as the view that closed it had it
    closed_round: dict[str, Any] | None = None
    gone_early: RoundResult | None = None
    signed: bytes | None = None  # our check-in's envelope, signed before the early path began
    relayed_by: str | None = None  # the predicted leader that took it with our row to relay; None: we submit
    # as the predicted leader: the check-ins the participants pushed with the rows we merge early, once here
    pushed: asyncio.Future[dict[str, PushedCheckin]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    @property
    def digest(self) -> str:
        """The digest we check in."""
        return self.manifest.digest.hex()


_Following = tuple[_Part, "asyncio.Task[RoundResult]"]


async def _closed_before(following: _Following | None, *, failed_after: bool = True) -> None:
    """Wait until the round of an earlier check-in closed, raising what following it raised: the ledger
    takes a node's next check-in only once the round it checked in to has closed. With ``failed_after``
    False, a failure after the ledger closed that round is not raised (it is the next follow's to see)."""
    if following is None:
        return
    part, task = following
    await asyncio.wait((part.closed, task), return_when=asyncio.FIRST_COMPLETED)
    if not failed_after and part.closed.done() and part.closed.result():
        return
    if task.done() and not task.cancelled() and task.exception() is not None:
        task.result()


def _participants(rnd: dict[str, Any]) -> tuple[str, ...]:
    """A round's participants in one order (sorted), as predictions and early merges name them."""
    return tuple(sorted(str(uid) for uid in rnd.get("participants") or ()))


def _checkins(rnd: dict[str, Any] | None) -> dict[str, str]:
    """The check-ins (uid -> digest) a round's view lists (none in the brief of a large round)."""
    return {str(c.get("uid")): str(c.get("digest")) for c in (rnd or {}).get("checkins") or ()}


def _lacks(rnd: dict[str, Any] | None, uid: str) -> bool:
    """Whether ``rnd`` is open and ``uid`` is not among its check-ins."""
    return (
        rnd is not None
        and rnd.get("status") == "OPEN"
        and all(c.get("uid") != uid for c in rnd.get("checkins") or [])
    )


def _has_closed(view: dict[str, Any], number: int) -> bool:
    """Whether round ``number`` is past its close in a rounds view."""
    rnd = find_round(view, number)
    if rnd is not None:
        return rnd.get("status") != "OPEN"
    return int((view.get("open") or {}).get("round") or 0) > number


async def _settled(task: asyncio.Task[RoundResult] | None) -> None:
    """Wait for the follow of an earlier check-in to end; its failures are only logged (we went on)."""
    if task is None:
        return
    try:
        await task
    except asyncio.CancelledError:
        if not task.cancelled():
            raise
    except Exception as exc:
        log.warning("following an earlier round failed: %s", exc)


def _still_sealing(recording: asyncio.Task[None]) -> bool:
    """Whether a ``round.merged`` we submitted waits for its block still; a failure is logged once done."""
    if not recording.done():
        return True
    if not recording.cancelled() and recording.exception() is not None:
        log.error("recording one of our merges failed: %r", recording.exception())
    return False


async def _early_result(merging: asyncio.Task[_EarlyMerge | None]) -> RoundResult | None:
    """Our early merge as a round result (None when it could not be made)."""
    try:
        early = await asyncio.shield(merging)
    except Exception:
        log.exception("merging the pushed rows early failed; the round is led at its close")
        return None
    return None if early is None else RoundResult(early.merged, early.manifest.digest.hex(), early.number)


@dataclass(frozen=True, slots=True)
class _Merged:
    """A leader's merge: the model, its manifest (hashed on the thread that merged it), the rows it took
    and the ones it left out."""

    flat: FlatState
    manifest: Manifest
    contributors: list[str]
    excluded: list[Exclusion]


def _merge_described(
    rows: Rows,
    layout: list[TensorLayout],
    specs: Sequence[TensorSpec],
    factors: list[float],
    method: str,
    options: MergeOptions,
    hash: str,
) -> tuple[FlatState, Manifest]:
    """Merge ``rows`` and hash the result with ``hash`` in one call on one worker thread (MergeError as
    ``merge_flat``)."""
    flat = FlatState(tuple(specs), merge_flat(rows, layout, factors, method, options=options))
    return flat, make_manifest(flat, "held", hash=hash)


def _merges_inline(method: str, model_bytes: int, rows: int) -> bool:
    """Whether a merge stays on the event loop: the weighted mean of rows of at most 4 x ``INLINE_BYTES``
    (8 MiB) together, about 1 ms (4 rows of 1.6 MB). Handed to a worker thread, such a merge made the
    round 1-3 ms longer; the robust methods cost 10-50 times as much per byte and always go to one."""
    return method.lower() == "mean" and model_bytes * rows <= 4 * INLINE_BYTES


class _CannotMerge(Exception):
    """Too few usable rows, or a merge that failed: the leader fails the round at once."""

    def __init__(self, reason: str, excluded: Sequence[Exclusion]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.excluded = list(excluded)


async def _debug_merge_delay() -> None:
    """Fault injection for tests and demos of leader failure: ``SWARM_DEBUG_MERGE_DELAY`` seconds of
    waiting before each merge a leader makes (at the close, or early)."""
    delay = float(os.environ.get("SWARM_DEBUG_MERGE_DELAY") or 0)
    if delay > 0:
        log.warning("SWARM_DEBUG_MERGE_DELAY: waiting %g s before merging", delay)
        await asyncio.sleep(delay)


async def _stop(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel those of ``tasks`` that still run and wait for them to end; how they ended is theirs
    (each logs what matters)."""
    for task in tasks:
        if task is not None and not task.done():
            task.cancel()
    for task in tasks:
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


@dataclass(slots=True)
class _Shown:
    """The newest rounds view read while a check-in waits for the event that lists it."""

    view: dict[str, Any] = field(default_factory=dict)


def _gave(task: asyncio.Task[Any] | None) -> bool:
    """Whether ``task`` (an early path) ended with a result."""
    return (
        task is not None
        and task.done()
        and not task.cancelled()
        and task.exception() is None
        and task.result() is not None
    )


def _round_listing(view: dict[str, Any], uid: str, digest: str | None, since: int) -> int | None:
    """The round from ``since`` on whose check-ins in ``view`` hold ``uid``'s of ``digest`` (of any
    digest when None), or None."""
    for rnd in listed_rounds(view):
        if int(rnd.get("round") or 0) < since:
            continue
        checkins = rnd.get("checkins") or ()
        if any(c.get("uid") == uid and digest in (None, c.get("digest")) for c in checkins):
            return int(rnd["round"])
    return None


def _leading_view(view: dict[str, Any], number: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``view`` and closed round ``number`` in it, when the view has what the round's leader needs: the
    round's check-ins and the open round's ``min_peers`` (a read has them; so has an event of a round
    of at most ``BRIEF_CHECKINS``); else None."""
    rnd = find_round(view, number)
    if rnd is None or rnd.get("status") != "CLOSED" or "checkins" not in rnd:
        return None
    open_round = view.get("open")
    if open_round is not None and "min_peers" not in open_round:
        return None
    return view, rnd


def fetch_refusal(rnd: dict[str, Any] | None, requester: str, uid: str, contract: str) -> str | None:
    """Why ``requester`` may not fetch what ``uid`` checked in to round ``rnd``; None for its leader."""
    leader = (rnd or {}).get("leader")
    if leader is not None and leader == requester:
        return None
    number = (rnd or {}).get("round", "?")
    return (
        f"{requester!r} may not fetch the weights {uid!r} checked in to round {number} of {contract!r}: "
        f"only that round's leader ({leader or 'none yet'}) may"
    )


def waiting_for(open_round: dict[str, Any] | None, number: int) -> str | None:
    """A line saying whom open round ``number`` waits for, when it is short of ``min_peers``."""
    if not open_round or open_round.get("round") != number:
        return None
    need = int(open_round.get("min_peers") or 1)
    checked = sorted(c["uid"] for c in open_round.get("checkins") or [])
    if len(checked) >= need:
        return None
    missing = [uid for uid in open_round.get("expected") or [] if uid not in checked]
    names = ", ".join(checked)
    head = f"round {number} waits for {need} peers (minPeers); {len(checked)} checked in ({names})"
    if missing:
        return f"{head}; waiting for {', '.join(missing)} to check in"
    return f"{head}; no other member is online: start {need - len(checked)} more node(s) or lower minPeers"


def layout_difference(mine: Sequence[TensorSpec], theirs: Sequence[TensorSpec]) -> str | None:
    """None when two layouts agree, else which tensor differs and how."""
    a = {s.name: s for s in mine}
    b = {s.name: s for s in theirs}
    for name in sorted(set(a) | set(b)):
        if name not in b:
            return f"tensor {name!r} is missing"
        if name not in a:
            return f"tensor {name!r} is extra"
        if (a[name].dtype, a[name].shape) != (b[name].dtype, b[name].shape):
            return (
                f"tensor {name!r} is {b[name].dtype}{list(b[name].shape)}, "
                f"expected {a[name].dtype}{list(a[name].shape)}"
            )
    return None


class RoundEngine:
    """Sync rounds of one node in one training contract."""

    def __init__(
        self,
        bus: Bus,
        ledger: LedgerClient,
        holder: StateHolder,
        contract: str,
        *,
        merge_method: str = "mean",
        merge_options: MergeOptions | None = None,
        max_update_norm: float = 0.0,
        fetch_timeout: float = 10.0,
        secure: SecureRounds | None = None,
        dataplane: DataPlaneClient | None = None,
        offers: Offers | None = None,
        served: Served | None = None,
    ) -> None:
        self.bus = bus
        self.ledger = ledger
        self.holder = holder
        self.contract = contract
        self.merge_method = merge_method
        self.merge_options = merge_options or MergeOptions()
        self.max_update_norm = max_update_norm
        self.fetch_timeout = fetch_timeout
        self.checkin_defer = seconds_from_env("SWARM_SL_CHECKIN_DEFER", CHECKIN_DEFER)
        self.relay_checkins = relay_checkins_enabled()
        self._relay_misses = 0  # relays of our check-in in a row that did not show
        self._relay_paused = 0  # rounds left whose check-in we submit ourselves after a miss
        self._early_spans: deque[float] = deque(maxlen=EARLY_KEPT)  # seconds our last early paths took
        self.secure = secure  # secure aggregation: own models are offered masked, never served
        self.dataplane = dataplane
        self.offers = offers  # rows peers pushed to this node's data plane, for the rounds it leads
        self.served = served  # who took which model from this node's data plane (None: it is off)
        self._endpoints: dict[str, Endpoint | None] = {}
        self._retry_at: dict[str, float] = {}
        self.latest: RoundResult | None = None
        self.checked_in: dict[bytes, int] = {}  # digest of our pre-merge weights -> round number
        self.rounds_led = 0
        self.rounds_done = 0
        self._timer = RoundTimer()
        self._last_close: tuple[int, tuple[str, ...], str] | None = None  # round, participants, leader
        self._led_rounds: list[int] = []  # the rounds this node led lately (each at most once)
        self._recordings: list[asyncio.Task[None]] = []  # our merges' round.merged, being sealed
        self._unconfirmed: dict[int, str] = {}  # round -> the merged digest taken before the ledger's
        self._prefetch: _Prefetch | None = None
        # as the predicted leader of a round: the prediction and our merge of the rows pushed for it
        self._early_merges: dict[int, tuple[_Prediction, asyncio.Task[_EarlyMerge | None]]] = {}
        self._following: _Following | None = None  # our last check-in, followed after we went on early
        self._pinned_rows: dict[int, bytes] = {}  # round -> our row, kept servable until it finished
        self.rejoins = 0  # times the ledger lost this node and it joined again

    def note_rejoin(self) -> None:
        """The ledger lost this node (it marked it offline, which drops its check-in from the open round)
        and the node registered and joined again: a round we follow is checked in to again if needed."""
        self.rejoins += 1

    @property
    def uid(self) -> str:
        """This node."""
        return self.bus.uid

    # ------------------------------------------------------------ entry points
    async def begin(self, flat: FlatState, *, samples: int, weight: float) -> RoundResult:
        """The first sync: load the latest merged model, or take part in the init round; when no node
        holds the latest merged model any more, take part in the next round with ``flat``."""
        await self._settle()
        while True:
            model = await self.ledger.query("contract.model", name=self.contract)
            latest = model.get("latest") if isinstance(model, dict) else None
            if latest:
                number = int(latest["round"])
                sources = [latest["leader"], *await self._holders(number)]
                try:
                    result = await self._load(latest["digest"], sources, number)
                except BusError as exc:
                    # Its leader died before a participant pulled it: as they do, go on with our own
                    # model into the next round (whose merge makes one model again).
                    log.warning("round %d: %s; taking part in the next round with our own model", number, exc)
                    return await self._take_part(flat, samples=samples, weight=weight, init=False)
                log.info("starting from the swarm's model %s of round %s", result.digest[:16], result.round)
                return result
            try:
                return await self._take_part(flat, samples=samples, weight=weight, init=True)
            except Rejected as exc:
                if "latest" not in exc.reason and "merged model" not in exc.reason:
                    raise
                log.info("a merged model appeared meanwhile: %s", exc.reason)

    async def sync(self, flat: FlatState, *, samples: int, weight: float) -> RoundResult:
        """A regular sync: merge with whoever checks in to the open round."""
        return await self._take_part(flat, samples=samples, weight=weight, init=False)

    async def finish(self, flat: FlatState, *, mode: str, samples: int, weight: float) -> RoundResult:
        """Training is over here: keep contributing ``mode``'s model until the final round merges."""
        await self._settle_following()
        # contract.done is sealed at once, with the round.merged of ours the SN holds for a round's close
        await self.ledger.submit("contract.done", {"contract": self.contract, "mode": mode})
        await self._settle_recording()
        own = self.latest.flat if mode == "active" and self.latest is not None else flat
        weight = 0.0 if mode == "inactive" else weight
        async with self.ledger.watch("round", self.contract, keep=True) as watch:
            while True:
                status = await self.ledger.query("contract.status", name=self.contract)
                if status.get("status") == "COMPLETE" and status.get("final_digest"):
                    return await self._load_final(status)
                view = await self.ledger.query("contract.rounds", name=self.contract)
                if self._should_join(view, status):
                    result = await self._take_part(
                        own, samples=samples, weight=weight, init=False, keep_own=True
                    )
                    if result.final:
                        return result
                    continue
                with contextlib.suppress(TimeoutError):
                    await watch.next(timeout=5.0)

    async def _holders(self, number: int) -> list[str]:
        """Nodes that loaded the merged model of round ``number`` (they keep it servable)."""
        view = await self.ledger.query("contract.rounds", name=self.contract)
        rnd = find_round(view, number) or {}
        return [uid for uid in rnd.get("participants") or [] if uid != rnd.get("leader")]

    def _should_join(self, view: dict[str, Any], status: dict[str, Any]) -> bool:
        """A finished node joins an open round others are in, the final round, or any when no one trains."""
        open_round = view.get("open")
        if not open_round:
            return False
        checked_in = {c["uid"] for c in open_round.get("checkins") or []}
        if self.uid in checked_in:
            return False
        return bool(open_round.get("final") or checked_in or status.get("active") == 0)

    async def final_model(self) -> RoundResult | None:
        """The contract's final model, when it completed (None while it trains). Raises BusError when
        no node serves it any more."""
        status = await self.ledger.query("contract.status", name=self.contract)
        if status.get("status") == "COMPLETE" and status.get("final_digest"):
            return await self._load_final(status)
        return None

    async def _load_final(self, status: dict[str, Any]) -> RoundResult:
        digest = str(status["final_digest"])
        latest = status.get("latest_model") or {}
        leader = latest.get("leader")
        return await self._load(digest, [leader] if leader else [], latest.get("round"), final=True)

    # ----------------------------------------------------------------- a round
    async def _take_part(
        self, flat: FlatState, *, samples: int, weight: float, init: bool, keep_own: bool = False
    ) -> RoundResult:
        """Check in ``flat`` and take part in the round: go on with the merged model of the predicted
        leader as soon as it has it (before the ledger closes the round, which is followed meanwhile), or
        with whatever the ledger's round gives."""
        timer = self._timer = RoundTimer()
        if self.secure is not None:  # the digest only: the model itself leaves masked (secure_round.py)
            manifest = await asyncio.to_thread(make_manifest, flat, "held", hash=self.holder.hash)
        else:
            manifest = await self.holder.add(flat)
        digest = manifest.digest.hex()
        public = self.latest is not None and self.latest.digest == digest  # a merged model, resent
        timer.mark("hash")
        previous, self._following = self._following, None
        # Our check-in waits for the close of the round of our last one (``_follow``); the early path
        # only for the close of the round before that, so the ledger's close is off a round's path.
        if previous is not None:
            prior, previous[0].prior = previous[0].prior, None
            try:
                await _closed_before(prior, failed_after=False)
            except BaseException:
                await _stop(previous[1])  # its check-in waited for that round: it ended with it
                raise
        body = {
            "contract": self.contract,
            "digest": digest,
            "samples": samples,
            "weight": weight,
            "init": init,
        }
        prediction = None if public or self.secure is not None else self._prediction()
        may_go_early = (
            prediction is not None and not keep_own and not init and self.uid in prediction.participants
        )
        previous_follow = previous[1] if previous else None
        signed = self._signed_checkin(body, prediction) if may_go_early else None
        part = _Part(
            flat,
            manifest,
            body,
            keep_own,
            public,
            previous_follow,
            prediction,
            self.rejoins,
            previous,
            signed=signed,
        )
        loop = asyncio.get_running_loop()
        source: asyncio.Task[RoundResult | None] | None = None
        if (
            prediction is not None
            and prediction.leader == self.uid
            and self.offers is not None
            and may_go_early
        ):
            merging = loop.create_task(self._merge_early(part, prediction, weight))
            self._early_merges[prediction.number] = (prediction, merging)
            source = loop.create_task(_early_result(merging))
        elif prediction is not None:
            source = loop.create_task(self._offer(part, prediction, weight, fetch=may_go_early))
        wait = self._checkin_wait() if may_go_early else 0.0
        following = loop.create_task(self._follow(part, previous, source, wait))
        started = loop.time()
        try:
            result = await self._race(part, following, source)
        except BaseException:
            early = self._early_merges.pop(prediction.number, None) if prediction else None
            await _stop(following, early[1] if early else None)
            raise
        finally:
            await _stop(source)
        if part.gone_early is not None:
            self._early_spans.append(loop.time() - started)
            self._following = (part, following)
            timer.mark("early")
            timer.report(result.round)
        self.rounds_done += 1
        return result

    async def _race(
        self,
        part: _Part,
        following: asyncio.Task[RoundResult],
        source: asyncio.Task[RoundResult | None] | None,
    ) -> RoundResult:
        """The first of: the ledger's round (``following``), or the merged model of the predicted
        participants from the predicted leader (``source``, before the close)."""
        waiting: set[asyncio.Task[Any]] = {following} if source is None else {following, source}
        while True:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if following in done:
                return following.result()
            waiting.discard(source)
            try:
                got = None if source is None or source.cancelled() else source.result()
            except Exception:
                log.exception("taking the merged model early failed; following the ledger's round")
                got = None
            if got is not None and not following.done():
                return self._go_early(part, got)

    def _go_early(self, part: _Part, result: RoundResult) -> RoundResult:
        """Go on with the merged model of the predicted round before the ledger closes it; the ledger's
        record of it is checked when it comes (``_confirm``)."""
        prediction = part.prediction
        assert prediction is not None  # noqa: S101 - only predicted rounds go early
        raw = bytes.fromhex(result.digest)
        self.checked_in.pop(raw, None)  # a merged model is anyone's to fetch
        if self._prefetch is not None and self._prefetch.task.done():
            self._prefetch = None
        self.latest = part.gone_early = result
        self._unconfirmed[prediction.number] = result.digest
        self._pin_row(prediction.number, part.manifest.digest)
        if self._last_close is None or self._last_close[0] < prediction.number:
            self._last_close = (prediction.number, prediction.participants, prediction.leader)
        log.info("round %d: going on with the merged model %s before the ledger closed the round",
                 result.round, result.digest[:16])  # fmt: skip
        return result

    def _checkin_wait(self) -> float:
        """Seconds a check-in waits for the round's early path (``CHECKIN_DEFER``)."""
        if not self._early_spans:
            return 0.0
        return min(self.checkin_defer, EARLY_SPAN * statistics.median(self._early_spans))

    async def _follow(
        self, part: _Part, previous: _Following | None, going_early: asyncio.Task[Any] | None, wait: float
    ) -> RoundResult:
        """Our check-in, on the ledger: submitted once the round of our ``previous`` one closed (the
        ledger takes a node's next check-in only then) and the early path ``going_early`` ended (``wait``
        seconds at most), then followed until the round gives us a model (or, once we went on early,
        until it closed and, were we its leader, our merge was recorded)."""
        relayable = part.signed is not None  # a leader may relay it before we look: subscribed first
        if not relayable:
            await self._ready_to_check_in(previous, going_early, wait)
        async with self.ledger.watch("round", self.contract, keep=True) as watch:
            if relayable:
                await self._ready_to_check_in(previous, going_early, wait)
            receipt, view = await self._submit_checkin(part, watch, going_early, previous)
            number = self._checked_in(part, receipt)
            # The watch was subscribed before the checkin, so the events of its block and of every later
            # one arrive; only a resent checkin (its first answer lost) reads the rounds again.
            if receipt.get("duplicate"):
                view = await self.ledger.query("contract.rounds", name=self.contract)
            # The last round, followed to its close. Not its round.merged: the SN seals that with a later
            # round's close (sealer.py), which may need a check-in that comes after this round's result.
            await _settled(part.previous)
            leading: asyncio.Task[RoundResult | None] | None = None
            try:
                while True:
                    if not part.closed.done() and _has_closed(view, number):
                        part.closed_round = find_round(view, number)
                        part.closed.set_result(True)
                    self._confirm(view)
                    await self._lead_replaced(view, number)
                    rnd = find_round(view, number)
                    if part.rejoins != self.rejoins and _lacks(rnd, self.uid):
                        view = await self._check_in_again(part, number)
                        rnd = find_round(view, number)
                    result, leading = await self._follow_step(part, view, rnd, number, leading)
                    if result is not None:
                        return result
                    racing = None if part.gone_early else self._racing(rnd, leading, part.keep_own)
                    view = await self._next_view(watch, number, racing) or view
            finally:
                if not part.closed.done():
                    part.closed.set_result(False)
                if part.gone_early is None:  # else the prefetch is a later round's
                    await self._stop_prefetch()
                early = self._early_merges.pop(part.prediction.number, None) if part.prediction else None
                await _stop(leading, early[1] if early else None)

    async def _ready_to_check_in(
        self, previous: _Following | None, going_early: asyncio.Task[Any] | None, wait: float
    ) -> None:
        """Until the round of our last check-in closed, and our early path ended (``wait`` s at most)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        await _closed_before(previous)
        if going_early is not None and wait > 0:
            await asyncio.wait((going_early,), timeout=max(deadline - loop.time(), 0.0))

    async def _submit_checkin(
        self,
        part: _Part,
        watch: Watch,
        going_early: asyncio.Task[Any] | None,
        previous: _Following | None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Submit our check-in: its receipt, and the newest rounds view an event gave meanwhile ({} when
        none came). Once we went on early, the check-in records a round we are past, and the event of
        the block that took it lists it (a predicted round of at most ``BRIEF_CHECKINS``): that event is
        the receipt. The predicted leader submits the check-ins its participants pushed with their rows
        with its own (``_relayed``); a participant whose check-in the leader took waits for it there
        (whether or not its early path ended in time), ``RELAY_WAIT`` seconds at most, then submits it
        itself (at once when the leader's own shows without it: ``_relay_shown``). A quiet submit asks
        the SN to answer only a failure; a round that stays open longer than the RPC's first resend gets
        the answer."""
        prediction = part.prediction
        relayed = await self._relayed(part, previous)
        submit = partial(self.ledger.submit, "round.checkin", part.body, signed=part.signed, relayed=relayed)
        gone_early = _gave(going_early)
        brief = prediction is not None and len(prediction.participants) <= BRIEF_CHECKINS
        if prediction is None or not brief or (part.relayed_by is None and not gone_early):
            return await submit(), {}
        shown = _Shown()
        if part.relayed_by is not None:  # relayed whether or not our early path ended in time
            receipt = await self._relay_shown(watch, part, prediction.number, shown)
            if receipt is not None:
                return receipt, shown.view
        looking = asyncio.get_running_loop().create_task(
            self._checkin_shown(watch, part.digest, prediction.number, shown)
        )
        try:
            receipt = await (submit(seen=looking) if gone_early else submit())
        finally:
            await _stop(looking)
        return receipt, shown.view

    async def _relay_shown(
        self, watch: Watch, part: _Part, since: int, shown: _Shown
    ) -> dict[str, Any] | None:
        """The receipt of our check-in that ``part.relayed_by`` took to relay, from the event of the block
        that took it; None when it did not show within ``RELAY_WAIT``, or an event lists the relayer's
        own check-in without ours (it submitted without it: a wrong guess of which round ours joins, or
        our row came after it gave up waiting): we submit it ourselves then, and push none for the next
        2, 4, ... rounds (``RELAY_PAUSE_MAX``)."""
        relayer = part.relayed_by
        assert relayer is not None  # noqa: S101 - only a relayed check-in is waited for
        looking = asyncio.get_running_loop().create_task(
            self._checkin_shown(watch, part.digest, since, shown, passed_over_by=relayer)
        )
        try:
            done, _ = await asyncio.wait((looking,), timeout=RELAY_WAIT)
        finally:
            await _stop(looking)
        receipt = looking.result() if done else None
        if receipt:
            self._relay_misses = 0
            return receipt
        self._relay_misses += 1
        self._relay_paused = min(2**self._relay_misses, RELAY_PAUSE_MAX)
        why = (
            "checked in without our check-in"
            if done
            else f"did not relay our check-in within {RELAY_WAIT:g} s"
        )
        log.info("round %d: %s %s; submitting it ourselves, and the next %d rounds' too",
                 since, relayer, why, self._relay_paused)  # fmt: skip
        part.relayed_by = None
        return None

    def _signed_checkin(self, body: dict[str, Any], prediction: _Prediction | None) -> bytes | None:
        """Our check-in, signed now for the predicted leader to relay with its own: in a round whose
        events list its check-ins (at most ``BRIEF_CHECKINS``), where we take our receipt; None (we
        submit it ourselves) unless ``SWARM_SL_RELAY_CHECKINS`` is on, or for a while after a relay of
        ours failed (``RELAY_PAUSE_MAX``)."""
        if not self.relay_checkins or prediction is None or len(prediction.participants) > BRIEF_CHECKINS:
            return None
        if self._relay_paused:
            self._relay_paused -= 1
            return None
        return self.ledger.sign("round.checkin", body)

    async def _relayed(self, part: _Part, previous: _Following | None) -> list[bytes]:
        """As the predicted leader: the check-ins our round's participants pushed with their rows, to
        submit with ours (waiting for the rows ``ROWS_WAIT`` seconds at most, well inside the participants'
        wait for the relay). Only those whose check-in before (``PushedCheckin.after``) the round our last
        one joined lists, now closed: the ledger then puts them in the open round, as it does ours."""
        prediction = part.prediction
        if prediction is None or prediction.leader != self.uid or part.signed is None or self.offers is None:
            return []
        if not part.pushed.done():
            await asyncio.wait((part.pushed,), timeout=ROWS_WAIT)
        if part.pushed.done():
            pushed = part.pushed.result()
        else:  # rows still to come: the check-ins of those here
            others = [uid for uid in prediction.participants if uid != self.uid]
            pushed = self.offers.checkins(prediction.number, others)
        closed = _checkins(previous[0].closed_round if previous is not None else None)
        return [
            checkin.envelope
            for uid, checkin in pushed.items()
            if checkin.after is None or closed.get(uid) == checkin.after.hex()
        ]

    async def _checkin_shown(
        self, watch: Watch, digest: str, since: int, shown: _Shown, *, passed_over_by: str | None = None
    ) -> dict[str, Any]:
        """The receipt of our check-in of ``digest`` (in round ``since`` or a later one) as the rounds
        events show it; every view read is kept in ``shown``. With ``passed_over_by``: {} as soon as a
        round from ``since`` on lists that node's check-in and not ours."""
        while True:
            event = await watch.next()
            shown.view = dict(event.view)
            number = _round_listing(shown.view, self.uid, digest, since)
            if number is not None:
                return {"contract": self.contract, "round": number, "height": event.height}
            if passed_over_by is not None and _round_listing(shown.view, passed_over_by, None, since):
                return {}

    async def _next_view(
        self, watch: Watch, number: int, early: asyncio.Task[Any] | None = None
    ) -> dict[str, Any] | None:
        """The next rounds view, or None when ``early`` (our own merge, or the leader's merged model
        pulled early) ends first."""
        if early is None or early.done():
            return await self._next_event(watch, number)
        viewing = asyncio.ensure_future(self._next_event(watch, number))
        try:
            await asyncio.wait((viewing, early), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not viewing.done():
                viewing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await viewing
        return viewing.result() if not viewing.cancelled() else None

    async def _next_event(self, watch: Watch, number: int) -> dict[str, Any]:
        """The next rounds view: from an event, or read again after a quiet spell (an event can be
        lost while the bus reconnects, since sessions are clean); a spell in a round short of its
        quorum logs whom it waits for."""
        try:
            return dict((await watch.next(timeout=_REREAD_AFTER)).view)
        except TimeoutError:
            view = dict(await self.ledger.query("contract.rounds", name=self.contract))
        waiting = waiting_for(view.get("open"), number)
        if waiting:
            log.info("%s", waiting)
        return view

    async def _step(
        self,
        view: dict[str, Any],
        rnd: dict[str, Any] | None,
        number: int,
        part: _Part,
        leading: asyncio.Task[RoundResult | None] | None,
    ) -> tuple[RoundResult | None, asyncio.Task[RoundResult | None] | None]:
        """React to the latest ``view`` of our round ``rnd``; a result ends the round for us."""
        own, digest, keep_own = part.flat, part.digest, part.keep_own
        if rnd is None:
            return None, leading
        status = rnd.get("status")
        if status != "OPEN" and "close_wait" not in self._timer.steps:
            self._timer.mark("close_wait")
        if status == "CLOSED":
            if self.uid not in (rnd.get("participants") or []):
                log.warning("round %d closed without this node; continuing with its own model", number)
                return RoundResult(own, digest, number, merged=False), leading
            idle = leading is None or leading.done()
            leader = str(rnd.get("leader") or "")
            if self._last_close is None or self._last_close[0] < number:
                self._last_close = (number, _participants(rnd), leader)
            if leader == self.uid and idle and number not in self._led_rounds:
                leading = asyncio.get_running_loop().create_task(self._lead_safely(number, own, seen=view))
            elif leader and leader != self.uid and (not keep_own or rnd.get("final")):
                await self._start_prefetch(leader, number, closed=_participants(rnd))
            return None, leading
        if status == "ABANDONED":
            log.warning("round %d was abandoned (%s); continuing with own model", number, rnd.get("reason"))
            return RoundResult(own, digest, number, merged=False), leading
        if status != "MERGED":
            return None, leading
        if keep_own and not rnd.get("final"):
            return RoundResult(own, digest, number, merged=False), leading
        self._timer.mark("merged_wait")
        final = bool(rnd.get("final"))
        result = await self._prefetched(str(rnd["digest"]), number, _participants(rnd), final=final)
        if result is None:
            result = await self._load_merged(rnd, number, own, digest, final=final)
        self._timer.mark("load")
        return result, leading

    async def _follow_step(
        self,
        part: _Part,
        view: dict[str, Any],
        rnd: dict[str, Any] | None,
        number: int,
        leading: asyncio.Task[RoundResult | None] | None,
    ) -> tuple[RoundResult | None, asyncio.Task[RoundResult | None] | None]:
        """React to the latest view of our round; a result ends the follow."""
        if part.gone_early is not None:
            if leading is not None:
                # We began leading this round at its close and then went on with our early merge: the
                # lead records that merge; ending the follow now would cancel it unrecorded.
                await asyncio.wait((leading,))
            done = await self._after_early(view, rnd, number, part)
            return (part.gone_early if done else None), leading
        result, leading = await self._step(view, rnd, number, part, leading)
        if result is None:
            result = self._early(rnd, leading, part.keep_own)
        if result is not None and result.final and leading is not None:
            # The final merge we lead is recorded: its answer may come after the round's event, and ending
            # the follow would cancel the lead before it saw it; a lost answer is not waited for long.
            await asyncio.wait((leading,), timeout=FINAL_HANDOVER_WAIT)
        if result is not None:
            self._timer.report(number)
        return result, leading

    def _checked_in(self, part: _Part, receipt: dict[str, Any]) -> int:
        """The round the ledger took our check-in into; our row stays servable to its leader."""
        if "round" not in receipt:  # a resent check-in the ledger holds, in a round it no longer lists
            raise BusError("the ledger holds this node's check-in but no longer lists its round")
        number = int(receipt["round"])
        if self.secure is not None:
            self.secure.offer(self.contract, number, part.flat)
        held = {d: n for d, n in self.checked_in.items() if self.holder.get(d) is not None}
        self.checked_in = {**held, part.manifest.digest: number} if not part.public else held
        if part.gone_early is None:
            self._timer.mark("checkin")
        relayed = f" (relayed by {part.relayed_by})" if part.relayed_by is not None else ""
        log.info("checked in model %s to round %d of %s%s", part.digest[:16], number, self.contract, relayed)
        return number

    async def _check_in_again(self, part: _Part, number: int) -> dict[str, Any]:
        """Our check-in to open round ``number`` was dropped while the ledger had this node offline (it
        joined again since): check the same model in again, so that the round can close (with us); the
        rounds view after it. Raises BusError when the round closed meanwhile (the sync starts again)."""
        part.rejoins = self.rejoins
        view = dict(await self.ledger.query("contract.rounds", name=self.contract))
        if not _lacks(find_round(view, number), self.uid):
            return view
        log.warning("round %d: the ledger dropped our check-in while it had this node offline; checking in "
                    "again", number)  # fmt: skip
        receipt = await self.ledger.submit("round.checkin", part.body)
        if receipt.get("round") != number:
            raise BusError(f"round {number} closed without this node while it was offline")
        return dict(await self.ledger.query("contract.rounds", name=self.contract))

    async def _after_early(
        self, view: dict[str, Any], rnd: dict[str, Any] | None, number: int, part: _Part
    ) -> bool:
        """Round ``number`` once we went on from it early: True when nothing is left for us to do in it
        (it closed, and we merged it if we lead it; or it ended), False while it is open."""
        if rnd is None or rnd.get("status") != "CLOSED":
            return _has_closed(view, number)  # open still, ended, or long gone from the views
        leader = str(rnd.get("leader") or "")
        self._closed_as(number, rnd, part.prediction)
        if leader == self.uid and number not in self._led_rounds:
            await self._lead_safely(number, part.flat, going_on=False, seen=view)
        return True

    def _closed_as(self, number: int, rnd: dict[str, Any], predicted: _Prediction | None) -> None:
        """Round ``number``, which we went on from early as ``predicted``, closed as ``rnd``: the base of
        our next prediction (``_prediction``). Going on early, we may have predicted a later round from
        the participants we guessed for this one; when the ledger's differ, that later round's
        prediction takes the ledger's (and the leader their order names). Else a wrong guess (a node
        back from a partition, one gone) would repeat itself round after round, each early merge of a
        set of rows the ledger never closes a round with."""
        participants, leader = _participants(rnd), str(rnd.get("leader") or "")
        last = self._last_close
        if last is None or last[0] <= number:
            self._last_close = (number, participants, leader)
        elif predicted is not None and participants != predicted.participants == last[1]:
            later = last[0]
            self._last_close = (later, participants, leader_order(self.contract, later, participants)[0])
            log.info("round %d closed with %s, not the %s we predicted; predicting from them again",
                     number, ", ".join(participants), ", ".join(predicted.participants))  # fmt: skip

    async def _lead_replaced(self, view: dict[str, Any], current: int) -> None:
        """Lead the earlier rounds the ledger handed to us after we went on from them (their leader
        died before recording its merge): we keep the rows we checked in to them servable."""
        rows = {number: digest for digest, number in self.checked_in.items()}
        for rnd in view.get("closed") or []:
            number = int(rnd.get("round") or 0)
            if number >= current or rnd.get("leader") != self.uid or number in self._led_rounds:
                continue
            own = self.holder.get(rows[number]) if number in rows else None
            if own is not None and rnd.get("status") == "CLOSED":
                log.info("round %d was handed to us after we went on from it; merging it", number)
                await self._lead_safely(number, own, going_on=False, seen=view)

    def _racing(
        self, rnd: dict[str, Any] | None, leading: asyncio.Task[RoundResult | None] | None, keep_own: bool
    ) -> asyncio.Task[Any] | None:
        """What may end a closed round for us before the ledger records its merge: our own merge as its
        leader, or the leader's merged model pulled early; None when only the ledger can."""
        if not self._may_go_early(rnd, keep_own):
            return None
        if leading is not None:
            return leading
        return self._prefetch.task if self._prefetch is not None else None

    def _early(
        self, rnd: dict[str, Any] | None, leading: asyncio.Task[RoundResult | None] | None, keep_own: bool
    ) -> RoundResult | None:
        """The merged model of a closed round that is not final, as soon as we have it: merged here, or
        pushed by the leader the ledger named (checked against the ledger's digest later, ``_confirm``)."""
        if rnd is None or not self._may_go_early(rnd, keep_own):
            return None
        if leading is not None:
            return leading.result() if leading.done() and not leading.cancelled() else None
        pending = self._prefetch
        if (
            pending is None
            or (pending.leader, pending.number) != (rnd.get("leader"), int(rnd.get("round") or 0))
            or not pending.task.done()
        ):
            return None
        got = None if pending.task.cancelled() else pending.task.result()
        if got is None:
            return None  # kept, done: we wait for the ledger's record and pull then
        self._prefetch = None
        flat, manifest = got
        self.holder.keep(flat, manifest)
        self.checked_in.pop(manifest.digest, None)
        number = int(rnd["round"])
        result = self.latest = RoundResult(flat, manifest.digest.hex(), number)
        self._unconfirmed[number] = result.digest
        self._timer.mark("merged_wait")
        return result

    def _may_go_early(self, rnd: dict[str, Any] | None, keep_own: bool) -> bool:
        return rnd is not None and rnd.get("status") == "CLOSED" and not rnd.get("final") and not keep_own

    def _pin_row(self, number: int, digest: bytes) -> None:
        """Keep the row we checked in to round ``number`` servable until the ledger finished that round
        (we went on before: a replacement leader may still pull it)."""
        self.holder.pin(digest)
        self._pinned_rows[number] = digest

    def _confirm(self, view: dict[str, Any]) -> None:
        """Check the merged models taken before the ledger recorded them against what it recorded: a
        mismatch (the leader died after sending it, and another merged the round) is logged; the next
        round's merge starts every node from one model again."""
        for number, digest in list(self._unconfirmed.items()):
            rnd = find_round(view, number) or {}
            status = rnd.get("status")
            if status == "MERGED" and rnd.get("digest") == digest:
                del self._unconfirmed[number]
            elif status in ("MERGED", "ABANDONED"):
                del self._unconfirmed[number]
                recorded = (
                    f"records model {str(rnd.get('digest'))[:16]}"
                    if status == "MERGED"
                    else (f"abandoned it ({rnd.get('reason')})")
                )
                log.warning(
                    "round %d: we went on with the merged model %s its leader sent; the ledger %s; "
                    "the next round's merge heals it",
                    number,
                    digest[:16],
                    recorded,
                )
        for number in sorted(self._unconfirmed)[:-_UNCONFIRMED_KEPT]:
            del self._unconfirmed[number]  # long finished; the ledger's record of it is not in our views
        for number in [n for n in self._pinned_rows if n not in self._unconfirmed]:
            self.holder.unpin(self._pinned_rows.pop(number))

    async def _load_merged(
        self, rnd: dict[str, Any], number: int, own: FlatState, digest: str, *, final: bool
    ) -> RoundResult:
        """Round ``number``'s merged model, from its leader or else from any participant that loaded it.

        When none serves it (the leader died between ``round.merged`` and the pulls), a non-final round
        goes on with this node's own model, which it checks in to the next round; a final round fails.
        """
        sources = [rnd.get("leader"), *(rnd.get("contributors") or []), *(rnd.get("participants") or [])]
        try:
            return await self._load(str(rnd["digest"]), [str(s) for s in sources if s], number, final=final)
        except BusError as exc:
            if final:
                raise
            log.warning("round %d: %s; continuing with own model into the next round", number, exc)
            return RoundResult(own, digest, number, merged=False)

    async def _load(
        self, digest: str, sources: Sequence[str], number: int | None, *, final: bool = False
    ) -> RoundResult:
        """The merged model ``digest``: held already, or pulled from the first source that has it."""
        raw = bytes.fromhex(digest)
        flat = self.holder.get(raw)
        errors: list[str] = []
        for source in dict.fromkeys(s for s in sources if s != self.uid):
            if flat is not None:
                break
            try:
                flat = await self._pull(source, raw, keep=True)
            except TransferError as exc:
                errors.append(str(exc))
        if flat is None:
            raise BusError(
                f"cannot load merged model {digest[:16]}: " + ("; ".join(errors) or "no source holds it")
            )
        result = RoundResult(flat, digest, number, final=final)
        self.latest = result
        self.checked_in.pop(raw, None)  # a merged model is anyone's to fetch, even if it equals a row
        return result

    async def may_fetch(
        self, digest: bytes, requester: str, *, identity: str | None = None, height: int | None = None
    ) -> str | None:
        """Why ``requester`` may not fetch ``digest`` from us, or None when it may.

        Our pre-merge weights go only to the leader of the round we checked them in to (read from the
        ledger, so a replacement leader is let in); merged models go to anyone. ``identity``: the CN the
        requester proved (the data plane's mutual TLS); it must be the identity the ledger binds
        ``requester`` to. (Over the bus the signed envelope proves the sender.) ``height``: the newest
        block the requester saw (the close that made it leader): the round is read at least there.
        """
        number = self.checked_in.get(digest)
        if number is None or requester == self.uid:
            return None
        if identity is not None:
            node = await self.ledger.query("node", uid=requester)
            bound = node.get("identity") if isinstance(node, dict) else None
            if bound != identity:
                return f"{requester!r} belongs to identity {bound!r}, not to the certificate {identity!r}"
        refusal = None
        for attempt in range(2):  # our SN may not have seen the round close yet: read again once
            if attempt:
                await asyncio.sleep(0.5)
            view = await self.ledger.query("contract.rounds", name=self.contract, at_least=height or 0)
            refusal = fetch_refusal(find_round(view, number), requester, self.uid, self.contract)
            if refusal is None:
                return None
        return refusal

    # -------------------------------------------------------------- leading
    async def _lead_safely(
        self, number: int, own: FlatState, *, going_on: bool = True, seen: dict[str, Any] | None = None
    ) -> RoundResult | None:
        """Lead round ``number``; the merged model when this node may go on with it before the ledger
        records it (a round that is not final), else None. ``going_on``: false when we went on from
        this round already (we only merge and record it). ``seen``: the rounds view that named us,
        led from without a read when it has the round's check-ins (``_leading_view``)."""
        self._led_rounds = [*self._led_rounds[-15:], number]
        try:
            return await self._lead(number, own, going_on=going_on, seen=seen)
        except asyncio.CancelledError:
            raise
        except Rejected as exc:
            log.warning("round %s: the ledger refused our merge: %s", number, exc.reason)
        except Exception as exc:
            log.exception("round %s: leading failed", number)
            with contextlib.suppress(Exception):  # at once, not at the deadline; else the deadline does
                await self._fail(number, _CannotMerge(f"{type(exc).__name__}: {exc}", []))
        return None

    async def _lead(
        self, number: int, own: FlatState, *, going_on: bool = True, seen: dict[str, Any] | None = None
    ) -> RoundResult | None:
        timer = self._timer if going_on else RoundTimer()
        known = _leading_view(seen, number) if seen is not None else None
        view, rnd = known if known is not None else await self._read_closed(number)
        timer.mark("lead_query")
        if rnd is None or rnd.get("leader") != self.uid or rnd.get("status") != "CLOSED":
            return None  # replaced meanwhile
        checkins = {c["uid"]: c for c in rnd.get("checkins") or []}
        participants = [uid for uid in rnd.get("participants") or [] if uid in checkins]
        log.info("leading round %d of %s with %d participants", number, self.contract, len(participants))
        need = required_rows(
            int((view.get("open") or {}).get("min_peers") or 1), final=bool(rnd.get("final"))
        )
        early = await self._early_merge_for(rnd, checkins, need)
        if early is not None:
            log.info("round %d: merged before its close, from the rows pushed to us", number)
            timer.mark("merge")
            return await self._conclude(
                rnd,
                early.merged,
                early.manifest,
                early.contributors,
                early.excluded,
                timer,
                going_on=going_on,
            )
        await _debug_merge_delay()
        if rnd.get("init") or all(checkins[uid].get("init") for uid in participants):
            done = _Merged(own, await self.holder.add(own), [self.uid], [])
        elif self.secure is not None and participants != [self.uid]:
            info = round_info(self.contract, number, rnd)
            merged, contributors = await lead_secure(
                self.bus, self.secure, info, own, timeout=self.fetch_timeout
            )
            done = _Merged(merged, await self.holder.add(merged), contributors, [])
        else:
            try:
                done = await self._merge_round(participants, checkins, own, need, timer)
            except _CannotMerge as exc:
                await self._fail(number, exc)
                return None
            self.holder.keep(done.flat, done.manifest)
        timer.mark("merge")
        return await self._conclude(
            rnd, done.flat, done.manifest, done.contributors, done.excluded, timer, going_on=going_on
        )

    async def _read_closed(
        self, number: int, wait: float = _LAGGING_READ_WAIT
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The rounds view and round ``number`` in it, read again for up to ``wait`` seconds while the SN
        shows the round not yet closed: the close that made us its leader came from the sealer's event,
        and a clustered SN that forwards writes may read from a copy a block behind (it catches up in
        moments). Taken for a replaced leader, such a read left the round to its leader timeout (30 s).
        A read names the newest block we saw and such an SN waits for it (``LedgerClient.height``), so
        this reads again only where that wait ran out, or where the SN predates it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            view = await self.ledger.query("contract.rounds", name=self.contract)
            rnd = find_round(view, number)
            if (rnd is not None and rnd.get("status") != "OPEN") or loop.time() >= deadline:
                return view, rnd
            await asyncio.sleep(_LAGGING_READ_POLL)

    async def _conclude(
        self,
        rnd: dict[str, Any],
        merged: FlatState,
        manifest: Manifest,
        contributors: list[str],
        excluded: list[Exclusion],
        timer: RoundTimer,
        *,
        going_on: bool = True,
    ) -> RoundResult | None:
        """Serve our merge of closed round ``rnd`` and record it: the merged model to go on with at once
        in a round that is not final (recorded meanwhile), None in the final one (recorded first) and
        when we went on from this round already (not ``going_on``)."""
        number = int(rnd["round"])
        self.checked_in.pop(manifest.digest, None)  # what we merged is public, even if it equals a row
        # participants pull it meanwhile: those that asked for it by round, and those that asked for a
        # merge of exactly these participants before the close
        self.holder.announce(self.contract, number, manifest.digest)
        self.holder.announce(self.contract, number, manifest.digest, _participants(rnd))
        body = {
            "contract": self.contract,
            "round": number,
            "digest": manifest.digest.hex(),
            "contributors": contributors,
            "excluded": [e.wire() for e in excluded],
            "taken": self._all_took(manifest.digest, rnd),
        }
        self.rounds_led += 1
        if rnd.get("final"):  # one final digest on every node: the final round waits for the ledger
            await self._hand_over(number, manifest.digest, rnd.get("participants") or [], timer)
            await self._record(body)
            timer.mark("merged_tx")
            if os.environ.get("SWARM_DEBUG_KILL_AFTER_MERGED") == "final":  # fault injection for tests
                log.warning("SWARM_DEBUG_KILL_AFTER_MERGED: dying right after recording the final merge")
                os.kill(os.getpid(), signal.SIGKILL)
            return None
        # The round's model is ours: go on with it while the ledger seals round.merged (with the next
        # round's close; awaited at the end, see _settle).
        self._recordings = [task for task in self._recordings if _still_sealing(task)]
        self._recordings.append(asyncio.get_running_loop().create_task(self._record(body)))
        if not going_on:
            return None
        result = RoundResult(merged, manifest.digest.hex(), number)
        if self.latest is None or (self.latest.round or 0) <= number:  # not when we went on past it
            self.latest = result
        return result

    def _all_took(self, digest: bytes, rnd: dict[str, Any]) -> bool:
        """Whether every other participant of ``rnd`` took the merged model ``digest`` from our data
        plane already (as in a round they went on from early): then none waits for our round.merged,
        and the SN may seal it with the next round's close."""
        others = {str(uid) for uid in rnd.get("participants") or []} - {self.uid}
        return self.served is not None and others <= self.served.takers(digest)

    async def _hand_over(
        self, number: int, digest: bytes, participants: Sequence[str], timer: RoundTimer
    ) -> None:
        """Before recording a final round's merge, wait (at most ``FINAL_HANDOVER_WAIT`` s) until another
        participant took the merged model from our data plane (they ask for it as the round closes), so
        that a node alive holds the final digest should we die right after recording it. Dying before,
        the ledger hands the round to the next leader, which merges it again. No wait when our data plane
        is off."""
        others = {str(uid) for uid in participants} - {self.uid}
        if self.served is None or not others:
            return
        if not await self.served.wait(digest, others, FINAL_HANDOVER_WAIT):
            log.warning("round %d: no other participant took the final model from us within %g s; "
                        "recording it all the same", number, FINAL_HANDOVER_WAIT)  # fmt: skip
        timer.mark("handover")

    async def _record(self, body: dict[str, Any]) -> None:
        """Submit ``round.merged``; a refusal or an outage is logged (the ledger's leader deadline then
        hands the round to the next leader, whose merge the next round starts from)."""
        number = body["round"]
        try:
            await self.ledger.submit("round.merged", body)
        except Rejected as exc:
            log.warning("round %s: the ledger refused our merge: %s", number, exc.reason)
            return
        except BusError as exc:
            log.warning("round %s: our merge was not recorded: %s", number, exc)
            return
        log.info("round %d merged from %d models: %s", number, len(body["contributors"]), body["digest"][:16])

    async def _settle(self) -> None:
        """Wait until our last check-in was followed to its close and the ``round.merged`` of each of
        our merges is sealed (or refused)."""
        await self._settle_following()
        await self._settle_recording()

    async def _settle_following(self) -> None:
        """Wait until our last check-in was followed to its close."""
        following, self._following = self._following, None
        await _settled(following[1] if following else None)

    async def _settle_recording(self) -> None:
        """Wait until the ``round.merged`` of each of our merges is sealed (or refused)."""
        recordings, self._recordings = self._recordings, []
        for recording in recordings:
            await recording

    async def _fail(self, number: int, failure: _CannotMerge) -> None:
        """Abandon round ``number`` at once, saying why, rather than let it wait out the deadline."""
        log.warning("round %d: cannot merge: %s; abandoning it", number, failure.reason)
        body = {
            "contract": self.contract,
            "round": number,
            "reason": failure.reason[:500],
            "excluded": [e.wire() for e in failure.excluded],
        }
        await self.ledger.submit("round.failed", body)

    async def _merge_round(
        self,
        participants: list[str],
        checkins: dict[str, dict[str, Any]],
        own: FlatState,
        need: int,
        timer: RoundTimer,
    ) -> _Merged:
        """Fetch every participant's row, leave out the unusable ones and merge the rest.

        Raises:
            _CannotMerge: fewer than ``need`` rows are usable, or the merge itself failed.
        """
        rows = MODEL_BUFFERS.take_rows(len(participants), own.total)
        fetched = await asyncio.gather(
            *(
                self._fetch_row(uid, checkins[uid]["digest"], rows[i], own)
                for i, uid in enumerate(participants)
            )
        )
        timer.mark("pull")
        excluded = [Exclusion(uid, why) for uid, why in zip(participants, fetched, strict=True) if why]
        arrived = [i for i, why in enumerate(fetched) if why is None]
        weights = {uid: checkins[uid].get("weight") for uid in participants}
        return await self._screen_and_merge(participants, rows, arrived, excluded, weights, own, need)

    async def _screen_and_merge(
        self,
        participants: list[str],
        rows: Rows,
        arrived: list[int],
        excluded: list[Exclusion],
        weights: dict[str, Any],
        own: FlatState,
        need: int,
    ) -> _Merged:
        """Merge the ``arrived`` rows (indices into ``rows``: a matrix or a list of flat buffers, one per
        participant) with the participants' ``weights``. When the merge refuses one (NaN, inf, another
        layout), or the contract bounds the update norm, screen them first and merge the usable ones.

        Raises:
            _CannotMerge: fewer than ``need`` rows are usable, or the merge itself failed.
        """
        layout = [(s.name, s.dtype, s.shape, s.offset, s.nbytes) for s in own.specs]
        base = self.latest.flat.buffer if self.latest and self.latest.flat.specs == own.specs else None
        if len(arrived) >= need and not (self.max_update_norm > 0 and base is not None):
            # The usual round: every row is fine. merge_flat refuses NaN and inf itself (the robust methods
            # check every row first, the mean its zero-weight rows and its result, where any other
            # non-finite value shows) and a row of another layout: whatever screen() would leave out
            # without a norm bound. So merge at once, reading the rows once, and screen only when refused.
            with contextlib.suppress(MergeError):
                done = await self._merge(rows, arrived, participants, weights, layout, own)
                return _Merged(*done, [participants[i] for i in arrived], excluded)
        screened = await asyncio.to_thread(
            screen,
            [rows[i] for i in arrived],
            [participants[i] for i in arrived],
            layout,
            base=base,
            max_update_norm=self.max_update_norm,
        )
        excluded += screened.excluded
        for exclusion in screened.excluded:
            log.warning("leaving %s out of the merge: %s", exclusion.uid, exclusion.reason)
        keep = [arrived[i] for i in screened.keep]
        if len(keep) < need:
            reason = f"{len(keep)} of {len(participants)} rows are usable, {need} needed"
            raise _CannotMerge(reason, excluded)
        try:
            done = await self._merge(rows, keep, participants, weights, layout, own)
        except MergeError as exc:
            raise _CannotMerge(f"merge failed: {exc}", excluded) from None
        return _Merged(*done, [participants[i] for i in keep], excluded)

    async def _merge(
        self,
        rows: Rows,
        keep: list[int],
        participants: list[str],
        weights: dict[str, Any],
        layout: list[TensorLayout],
        own: FlatState,
    ) -> tuple[FlatState, Manifest]:
        """``_merge_described`` of the rows ``keep`` indexes, with their weights: on the event loop when it
        is cheap (``_merges_inline``), else on a worker thread."""
        factors = merge_weights(self.merge_method, [weights[participants[i]] for i in keep])
        kept_rows = rows if len(keep) == len(rows) else [rows[i] for i in keep]  # views, never a copy
        method, options, hash = self.merge_method, self.merge_options, self.holder.hash
        args = (kept_rows, layout, own.specs, factors, method, options, hash)
        if _merges_inline(self.merge_method, own.total, len(keep)):
            return _merge_described(*args)
        return await asyncio.to_thread(_merge_described, *args)

    async def _fetch_row(self, uid: str, digest: str, row: np.ndarray, own: FlatState) -> str | None:
        """Put ``uid``'s checked-in weights in ``row``; why not (and a log line) when they cannot be used."""
        if uid == self.uid:
            row[:] = own.buffer
            return None
        held = self.holder.get(bytes.fromhex(digest))
        if held is None and self.offers is not None:  # pushed to us while its check-in was sealed
            held = await self.offers.take(bytes.fromhex(digest), self.fetch_timeout)
        if held is not None and held.specs == own.specs:  # a model we hold already (same digest)
            row[:] = held.buffer
            return None
        try:
            flat = await self._pull(uid, bytes.fromhex(digest), spare=row)
        except (TransferError, BusError) as exc:
            log.warning("leaving %s out of the merge: %s", uid, exc)
            return f"its model could not be fetched: {exc}"
        problem = layout_difference(own.specs, flat.specs)
        if problem is not None or flat.total != own.total:
            why = f"its model differs: {problem or 'size differs'}"
            log.warning("leaving %s out of the merge: %s", uid, why)
            return why
        if flat.buffer is not row:
            row[:] = flat.buffer
        return None

    # ------------------------------------------------------------- pushing
    def _prediction(self) -> _Prediction | None:
        """The next round if the participants of the last one check in again (the usual case); None
        when the last round's leader was not the first of its participants' order (admins lead, or it
        was replaced): then nothing is pushed or merged early."""
        if self._last_close is None:
            return None
        number, participants, leader = self._last_close
        if not participants or leader_order(self.contract, number, participants)[0] != leader:
            return None
        ordered = leader_order(self.contract, number + 1, participants)
        return _Prediction(number + 1, tuple(sorted(participants)), ordered[0])

    async def _offer(
        self, part: _Part, prediction: _Prediction, weight: float, *, fetch: bool
    ) -> RoundResult | None:
        """Push the model we check in to the predicted leader, so that it has our row (and merges)
        before the round closes; with ``fetch``, with our signed check-in for it to relay (naming our
        check-in before, whose round may be open still), then take that merge from it: the round's
        result when it comes before the ledger's close. A wrong guess or a failure costs only the push
        (the leader pulls as before)."""
        leader = prediction.leader
        if leader == self.uid or self.dataplane is None:
            return None
        endpoint = await self._endpoint(leader)
        if endpoint is None:
            return None
        number = prediction.number if fetch else None  # a row for an early merge only if we go early too
        after = part.prior[0].manifest.digest if part.prior is not None else None
        checkin = PushedCheckin(part.signed, after) if fetch and part.signed is not None else None
        try:
            await self.dataplane.offer(
                endpoint,
                part.flat,
                part.manifest,
                number=number,
                weight=weight,
                checkin=checkin,
                idle_timeout=self.fetch_timeout,
            )
        except TransferError as exc:
            log.info("could not push our model to %s (it pulls it if it leads): %s", leader, exc)
            return None
        except Exception:  # a push only saves the leader a pull: it never fails the round
            log.exception("pushing our model to %s failed", leader)
            return None
        if checkin is not None:
            part.relayed_by = leader
        closed = self._last_close is not None and self._last_close[0] >= prediction.number
        if not fetch or closed or (self._prefetch is not None and self._prefetch.number == prediction.number):
            return None
        await self._start_prefetch(leader, prediction.number, among=prediction.participants)
        pending = self._prefetch
        got = await asyncio.shield(pending.task) if pending is not None else None
        if got is None:
            return None
        merged, merged_manifest = got
        return RoundResult(merged, merged_manifest.digest.hex(), prediction.number)

    async def _merge_early(self, part: _Part, prediction: _Prediction, weight: float) -> _EarlyMerge | None:
        """As the predicted leader: merge the rows the predicted participants push, as soon as all are
        here, and serve the result to those who ask for a merge of exactly them. None when it cannot
        (a row of another layout, too few usable rows): the round is then led as usual at its close.
        The check-ins pushed with the rows are kept for our own check-in to relay (``part.pushed``)."""
        assert self.offers is not None  # noqa: S101 - checked by the caller
        own, digest = part.flat, part.digest
        number, participants = prediction.number, list(prediction.participants)
        others = [uid for uid in participants if uid != self.uid]
        offered = await self.offers.rows(number, others)
        part.pushed.set_result(self.offers.checkins(number, others))  # before their next pushes replace them
        if len(offered) < len(others):
            return None  # a push broke off: the round is led as usual
        await _debug_merge_delay()
        rows: list[np.ndarray] = []  # the pushed buffers themselves: never copied on the event loop
        kept: dict[str, tuple[str, float | None]] = {}
        for uid in participants:
            if uid == self.uid:
                rows.append(own.buffer)
                kept[uid] = (digest, weight)
                continue
            row = offered[uid]
            if row.flat.specs != own.specs:
                return None
            rows.append(row.flat.buffer)
            kept[uid] = (row.digest.hex(), row.weight)
        weights = {uid: w for uid, (_, w) in kept.items()}
        try:
            done = await self._screen_and_merge(
                participants, rows, list(range(len(participants))), [], weights, own, 1
            )
        except _CannotMerge:
            return None
        self.holder.keep(done.flat, done.manifest)
        self.holder.announce(self.contract, number, done.manifest.digest, prediction.participants)
        if os.environ.get("SWARM_DEBUG_KILL_AFTER_MERGED") == "early":  # fault injection for tests
            await self._die_after_handing_over(number, done.manifest.digest, others, own_digest=digest)
        return _EarlyMerge(number, kept, done.flat, done.manifest, done.contributors, done.excluded)

    async def _die_after_handing_over(
        self, number: int, merged: bytes, others: list[str], *, own_digest: str
    ) -> None:
        """Fault injection (``SWARM_DEBUG_KILL_AFTER_MERGED=early``, from round 3 on, in a round of 3
        participants or more): die once another participant took our early merge and the ledger holds
        our check-in, so that the ledger names us leader of a round the others went on from, and must
        hand it to one of them."""
        if number < 3 or len(others) < 2 or self.served is None:
            return
        await self.served.wait(merged, set(others), FINAL_HANDOVER_WAIT)
        for _ in range(100):
            if self.checked_in.get(bytes.fromhex(own_digest)) == number:
                break
            await asyncio.sleep(0.1)
        log.warning(
            "SWARM_DEBUG_KILL_AFTER_MERGED: dying right after handing over the early merge of round %d",
            number,
        )
        os.kill(os.getpid(), signal.SIGKILL)

    async def _early_merge_for(
        self, rnd: dict[str, Any], checkins: dict[str, dict[str, Any]], need: int
    ) -> _EarlyMerge | None:
        """Our merge made before the close, when the close names exactly its rows (waiting for it to
        end, since all those rows are here); None when there is none or it does not fit."""
        early_merge = self._early_merges.get(int(rnd.get("round") or 0))
        if early_merge is None or self.offers is None:
            return None
        prediction, task = early_merge  # keyed by its round: only the participants may differ
        if prediction.participants != _participants(rnd):
            return None
        others = [uid for uid in prediction.participants if uid != self.uid]
        if not task.done() and not self.offers.coming(prediction.number, others):
            return None  # a participant pushed nothing for this round: no early merge can fit
        try:
            async with asyncio.timeout(self.fetch_timeout):
                early = await asyncio.shield(task)
        except TimeoutError:
            log.warning("round %s: the early merge did not end in %g s; merging as usual",
                        rnd.get("round"), self.fetch_timeout)  # fmt: skip
            return None
        except Exception:
            log.exception("round %s: the early merge failed; merging as usual", rnd.get("round"))
            return None
        if early is None or not early.matches(rnd, checkins) or len(early.contributors) < need:
            return None
        return early

    # ------------------------------------------------------------- prefetch
    async def _start_prefetch(
        self,
        leader: str,
        number: int,
        *,
        among: tuple[str, ...] | None = None,
        closed: tuple[str, ...] | None = None,
    ) -> None:
        """Ask ``leader``'s data plane for its merge of round ``number`` now, so that the model is here
        (or on its way) when the ledger records its digest: before the close, the merge of exactly
        ``among`` (the predicted participants); once the ledger ``closed`` the round with these
        participants, a pull asked before it is kept only when it named the same ones."""
        current = self._prefetch
        if self.dataplane is None or (
            current is not None
            and (current.leader, current.number) == (leader, number)
            and current.among in (None, closed)
        ):
            return
        await self._stop_prefetch()  # a pull of another round or leader is of no use any more
        task = asyncio.get_running_loop().create_task(self._prefetch_from(leader, number, among))
        self._prefetch = _Prefetch(leader, task, among, number)

    async def _prefetch_from(
        self, leader: str, number: int, among: tuple[str, ...] | None
    ) -> tuple[FlatState, Manifest] | None:
        endpoint = await self._endpoint(leader)
        if endpoint is None or self.dataplane is None:
            return None
        try:
            flat, manifest = await self.dataplane.fetch_result(
                endpoint, self.contract, number, among=among, idle_timeout=self.fetch_timeout
            )
        except TransferError as exc:
            log.info("round %d: no early pull of the merged model from %s: %s", number, leader, exc)
            return None
        self.holder.keep(flat, manifest)  # servable at once: should the leader die, we hand it on
        return flat, manifest

    async def _prefetched(
        self, digest: str, number: int, participants: tuple[str, ...], *, final: bool
    ) -> RoundResult | None:
        """The merged model pulled early, when it is the one whose digest the ledger recorded. A pull of
        another round, or of a merge of other participants than the round's (asked before its close,
        whose event we may not have seen), never gives it: stopped, not waited for."""
        pending, self._prefetch = self._prefetch, None
        if pending is None:
            return None
        if pending.number != number or pending.among not in (None, participants):
            await _stop(pending.task)
            return None
        try:
            async with asyncio.timeout(self.fetch_timeout):
                got = await pending.task
        except TimeoutError:
            return None
        if got is None:
            return None
        flat, manifest = got
        if manifest.digest.hex() != digest:
            log.warning("round %d: %s sent model %s early, the ledger says %s", number, pending.leader,
                        manifest.digest.hex()[:16], digest[:16])  # fmt: skip
            return None
        self.holder.keep(flat, manifest)
        result = RoundResult(flat, digest, number, final=final)
        self.latest = result
        return result

    async def _stop_prefetch(self) -> None:
        pending, self._prefetch = self._prefetch, None
        await _stop(pending.task if pending is not None else None)

    # -------------------------------------------------------------- pulling
    async def _pull(
        self, uid: str, digest: bytes, *, spare: np.ndarray | None = None, keep: bool = False
    ) -> FlatState:
        """The model ``digest`` from ``uid``: over its data plane when it has one, else (or when that
        fails) through the broker. ``keep``: keep it servable here."""
        endpoint = await self._endpoint(uid) if self.dataplane is not None else None
        if endpoint is not None and self.dataplane is not None:
            try:
                flat, manifest = await self.dataplane.fetch(
                    endpoint, digest, spare=spare, idle_timeout=self.fetch_timeout, height=self.ledger.height
                )
            except TransferError as exc:
                log.warning("pulling from %s through the broker: its data plane failed: %s", uid, exc)
                self._endpoints[uid] = None  # the broker for a while; then its address is read again
                self._retry_at[uid] = asyncio.get_running_loop().time() + _DATAPLANE_RETRY
            else:
                if keep:
                    self.holder.keep(flat, manifest)
                return flat
        return await fetch_state(
            self.bus,
            uid,
            digest,
            spare=spare,
            idle_timeout=self.fetch_timeout,
            keep=self.holder if keep else None,
            height=self.ledger.height,
        )

    async def _endpoint(self, uid: str) -> Endpoint | None:
        """The data plane ``uid`` registered (looked up once, and again a while after it failed), or None."""
        retry_at = self._retry_at.get(uid)
        if retry_at is not None and asyncio.get_running_loop().time() >= retry_at:
            del self._retry_at[uid], self._endpoints[uid]
        if uid not in self._endpoints:
            try:
                node = await self.ledger.query("node", uid=uid, timeout=self.fetch_timeout)
            except BusError as exc:
                log.info("no data plane address for %s: %s", uid, exc)
                return None
            self._endpoints[uid] = parse_address(node.get("address") if isinstance(node, dict) else None)
        return self._endpoints[uid]
