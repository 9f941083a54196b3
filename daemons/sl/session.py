"""What the SL does for each request of its ML program: ``hello``, ``begin``, ``sync``, ``progress``, ``end``.

Every answer to ``begin``, ``sync`` and ``end`` carries weights back: the merged model (or the node's
own when a round ended without a merge). Errors become an ``error`` frame whose message the ML raises.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from daemons.attachment import Attachment
from daemons.bus import BusError
from daemons.ledger_client import LedgerClient, Rejected
from daemons.settings import seconds_from_env
from daemons.sl.merge import MERGE_METHODS, MergeOptions
from daemons.sl.privacy.dp import DPError, DPSettings, SitePrivacy
from daemons.sl.rounds import RoundEngine, RoundResult
from wire import CodecError
from wire.frames import layout_from_wire
from wire.tensors import FlatState

__all__ = ["MLSession", "ProgressPacing", "SessionSettings", "progress_interval"]

log = logging.getLogger("swarm.sl.session")

Reply = tuple[dict[str, Any], FlatState | None]
# The ledger forgot this node's membership (a partition, a new SN): join again and retry.
_LAPSED = ("must join it first", "must send node.register first", "is not registered")


@dataclass(frozen=True)
class SessionSettings:
    """Node-level settings from the SL's environment (the reference's SL_* variables)."""

    admin: bool = True
    quorum_wait: float = 5.0
    leader_timeout: float = 30.0
    trim_ratio: float = 0.1
    max_update_norm: float = 0.0
    straggler_timeout: float = 600.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> SessionSettings:
        """``SL_MAKE_ME_ADMIN``, ``SL_WAIT_FOR_FULL_QUORUM_SECONDS``, ``SL_LEADER_FAILURE_BASE_TIMEOUT``,
        ``SL_MERGE_TRIM_RATIO`` and ``SL_MAX_UPDATE_NORM`` (0: no bound); the first node to join a contract
        fixes the last two (with the merge method) for all of it. ``SL_STRAGGLER_TIMEOUT_SECONDS``: how long
        the others, once finished, wait for a member that sends nothing (a hung ML program) before the
        ledger skips it."""
        source = os.environ if env is None else env
        admin = source.get("SL_MAKE_ME_ADMIN", "true").strip().lower() not in ("false", "0", "no", "off")
        return cls(
            admin=admin,
            quorum_wait=float(source.get("SL_WAIT_FOR_FULL_QUORUM_SECONDS", cls.quorum_wait)),
            leader_timeout=float(source.get("SL_LEADER_FAILURE_BASE_TIMEOUT", cls.leader_timeout)),
            trim_ratio=float(source.get("SL_MERGE_TRIM_RATIO", cls.trim_ratio)),
            max_update_norm=float(source.get("SL_MAX_UPDATE_NORM", cls.max_update_norm)),
            straggler_timeout=float(source.get("SL_STRAGGLER_TIMEOUT_SECONDS", cls.straggler_timeout)),
        )


class MLSession:
    """One ML program's session with this SL."""

    def __init__(
        self,
        ledger: LedgerClient,
        engine_factory: Any,
        settings: SessionSettings,
        attachment: Attachment | None = None,
    ) -> None:
        self.ledger = ledger
        self._engine_factory = engine_factory
        self.settings = settings
        self.attachment = attachment
        self.rejoined = False
        if attachment is not None:
            attachment.on_reattach(self._note_rejoin)
        self.engine: RoundEngine | None = None
        self.params: dict[str, Any] = {}
        self.final: RoundResult | None = None
        self.ended = False
        self.privacy: SitePrivacy | None = None  # differential privacy of this site's updates, when asked
        self._report: asyncio.Task[None] | None = None  # the last progress report, being recorded
        self._reporting = ProgressPacing()  # which syncs' progress is worth a transaction
        self.refusal: str | None = None  # set by refuse(): every request is answered with it
        self._serving: set[asyncio.Task[Any]] = set()

    @property
    def contract(self) -> str:
        """The training contract of this session."""
        return str(self.params.get("contract", ""))

    def _note_rejoin(self) -> None:
        self.rejoined = True
        if self.engine is not None:
            self.engine.note_rejoin()

    def refuse(self, message: str) -> None:
        """Answer every request of the ML program with the error ``message`` from now on, the ones in
        flight too (this node can no longer take part: its certificate expires, say)."""
        self.refusal = message
        for task in self._serving:
            task.cancel()

    async def handle(self, header: dict[str, Any], payload: np.ndarray | None) -> Reply:
        """Answer one request (or the refusal, once ``refuse`` was called)."""
        if self.refusal is not None:
            return _error(self.refusal)
        task = asyncio.current_task()
        assert task is not None  # noqa: S101 - called from a task
        self._serving.add(task)
        try:
            return await self._answer(header, payload)
        except asyncio.CancelledError:
            if self.refusal is None or task.cancelling() > 1:  # not (only) refuse()'s cancel
                raise
            task.uncancel()
            return _error(self.refusal)
        finally:
            self._serving.discard(task)

    async def _answer(self, header: dict[str, Any], payload: np.ndarray | None) -> Reply:
        """Answer one request; never raises for the ML's mistakes or the swarm's refusals.

        When the ledger forgot this node (a partition, an SN restart), the node joins again and the
        request is retried: a sync then starts from the swarm's latest merged model. A sync that fails
        on the bus (a broker or peer outage) is retried the same way until the client's patience
        (``SWARM_SN_DEADLINE``) runs out.
        """
        loop = asyncio.get_running_loop()
        patience = self.ledger.patience
        deadline = loop.time() + patience.deadline
        rejoined = False
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._handle(header, payload)
            except Rejected as exc:
                lapsed = any(text in exc.reason for text in _LAPSED)
                if self.attachment is None or not lapsed or rejoined:
                    return await self._completed_without_us(header, exc) or self._refused(exc)
                rejoined = True
                await self.attachment.reattach(exc.reason)
            except BusError as exc:
                op = header.get("op")
                if op not in ("begin", "sync") or loop.time() >= deadline:
                    log.error("%s failed: %s", op, exc)
                    return _error(f"{op} failed: {exc}")
                log.warning("%s failed (%s); retrying from the swarm's latest model", op, exc)
                self.rejoined = op == "sync"
                await asyncio.sleep(patience.backoff(attempt))

    async def _completed_without_us(self, header: dict[str, Any], exc: Rejected) -> Reply | None:
        """The contract completed while this node was away (cut off, hung, paused): it ends with the
        swarm's final model, or says that no node serves it any more (None: the contract is not
        COMPLETE)."""
        op = header.get("op")
        if self.engine is None or op not in ("begin", "sync", "end", "progress"):
            return None
        try:
            final = self.final or await self.engine.final_model()
        except BusError as error:
            log.error("the contract completed without this node and its final model is gone: %s", error)
            return _error(f"{exc.reason}; no node serves its final model any more ({error})")
        if final is None:
            return None
        self.final = final
        if op == "progress":
            return {"op": "ok"}, None
        log.warning(
            "%s was refused (%s): contract %s completed without this node; it ends with the swarm's final "
            "model %s",
            op,
            exc.reason,
            self.contract,
            final.digest[:16],
        )
        self.ended = op == "end"
        if self.privacy is not None:
            self.privacy.loaded(final.flat)
        return self._reply(final, training_over=True), final.flat

    @staticmethod
    def _refused(exc: Rejected) -> Reply:
        log.error("the ledger refused %s: %s", exc.kind, exc.reason)
        return _error(exc.reason)

    async def _handle(self, header: dict[str, Any], payload: np.ndarray | None) -> Reply:
        op = header.get("op")
        if op == "hello":
            await self._reported()
        try:
            if op == "hello":
                return await self._hello(header)
            if self.engine is None:
                return _error(f"{op!r} before 'hello': the SwarmCallback must open the session first")
            if op in ("begin", "sync", "end"):
                return await self._exchange(str(op), header, _flat(header, payload))
            if op == "progress":  # an epoch's end: the ML program goes on while it is recorded
                self._reporting.reported(header)
                self._report_later(header)
                return {"op": "ok"}, None
            return _error(f"unknown request {op!r}")
        except (Rejected, BusError):
            raise
        except (CodecError, ValueError) as exc:  # DPError included
            log.error("%s failed: %s", op, exc)
            return _error(f"{op} failed: {exc}")
        except Exception as exc:
            log.exception("%s failed", op)
            return _error(f"{op} failed in the SL: {type(exc).__name__}: {exc}")

    async def _hello(self, header: dict[str, Any]) -> Reply:
        params = header.get("params")
        if not isinstance(params, dict) or not isinstance(params.get("contract"), str):
            return _error("hello needs 'params' with the training contract")
        method = str(params.get("merge_method", "mean")).lower()
        if method not in MERGE_METHODS:
            return _error(f"mergeMethod {method!r} is not one of {', '.join(MERGE_METHODS)}")
        try:
            dp = DPSettings.from_params(params)
        except DPError as exc:
            return _error(str(exc))
        self.privacy = SitePrivacy(dp) if dp is not None else None
        secure = params.get("secure_aggregation") is True
        if secure and method != "mean":
            return _error(f"secureAggregation works only with mergeMethod 'mean', not {method!r}")
        self.params = params
        join = {
            "sync_frequency": int(params.get("sync_frequency") or 1),
            "min_peers": int(params.get("min_peers") or 1),
            "node_weightage": float(params.get("node_weightage") or 1),
            "merge_method": method,
            "total_epochs": int(params.get("total_epochs") or 0),
            "admin": self.settings.admin,
            "quorum_wait": self.settings.quorum_wait,
            "leader_timeout": self.settings.leader_timeout,
            "trim_ratio": self.settings.trim_ratio,
            "max_update_norm": self.settings.max_update_norm,
            "straggler_timeout": self.settings.straggler_timeout,
            "secure_aggregation": secure,
        }
        body: dict[str, Any] = {"contract": self.contract, "params": join}
        if isinstance(header.get("layout"), list):
            body["layout"] = [list(item[:3]) for item in header["layout"] if isinstance(item, list)]
        await self.ledger.submit("contract.join", body)
        if self.attachment is not None:
            self.attachment.remember("contract.join", body)
        options = MergeOptions(trim_ratio=self.settings.trim_ratio)
        self.engine = self._engine_factory(
            self.contract, method, options, self.settings.max_update_norm, secure=secure
        )
        log.info(
            "ML program (pid %s, %s) joined contract %s",
            header.get("pid"),
            header.get("platform"),
            self.contract,
        )
        return {"op": "ok", "uid": self.ledger.bus.uid, "contract": self.contract}, None

    def _weight(self, header: dict[str, Any]) -> tuple[int, float]:
        samples = int(header.get("samples") or 0)
        weightage = float(self.params.get("node_weightage") or 1)
        return samples, weightage * samples if samples > 0 else weightage

    async def _exchange(self, op: str, header: dict[str, Any], flat: FlatState) -> Reply:
        assert self.engine is not None  # noqa: S101 - checked by handle
        samples, weight = self._weight(header)
        if self.privacy is not None and op != "begin":
            # DP: the trained model leaves the ML process only clipped and noised (begin's is untrained)
            flat = (await asyncio.to_thread(self.privacy.release, flat)).flat
            if op == "end":
                await self._progress(header)  # the epsilon of the last release, while still active
        if op == "begin":
            result = await self.engine.begin(flat, samples=samples, weight=weight)
        elif op == "sync" and self.rejoined:
            self.rejoined = False  # back after the ledger lost us: continue from the swarm's model
            result = await self.engine.begin(flat, samples=samples, weight=weight)
            log.info("rejoined the swarm from model %s (round %s)", result.digest[:16], result.round)
            await self._progress(header)
        elif op == "sync":
            result = await self.engine.sync(flat, samples=samples, weight=weight)
            # recorded while the ML program trains on and the next round starts (the SN seals it with
            # that round's check-ins); awaited at the end of the next begin or end
            if self._reporting.due(header):
                self._report_later(header)
        else:
            unreported = self._reporting.unreported()
            if unreported is not None and op == "end" and self.privacy is None:
                # the last loss and metric: sealed with our contract.done (the SN holds a report alone)
                self._report_later(unreported)
            mode = str(header.get("mode") or "snapshot")
            result = await self.engine.finish(flat, mode=mode, samples=samples, weight=weight)
            self.final, self.ended = result, True
        if self.privacy is not None:
            self.privacy.loaded(result.flat)
        if op != "sync":
            await self._reported()
        return self._reply(result, training_over=op == "end"), result.flat

    def _reply(self, result: RoundResult, *, training_over: bool) -> dict[str, Any]:
        return {
            "op": "ok",
            "digest": result.digest,
            "round": result.round,
            "merged": result.merged,
            "final": result.final,
            "training_over": training_over,
            "next_sync_interval": int(self.params.get("sync_frequency") or 1),
            "layout": [s.as_list() for s in result.flat.specs],
        }

    def _report_later(self, header: dict[str, Any]) -> None:
        """Record ``header``'s progress in the background, after the reports before it: the SN holds a
        report until a round closes (up to its check-in hold), which the ML program must not wait for."""
        self._report = asyncio.get_running_loop().create_task(self._progress_after(self._report, header))

    async def _progress_after(self, previous: asyncio.Task[None] | None, header: dict[str, Any]) -> None:
        await _settle_report(previous)
        await self._progress(header)

    async def _reported(self) -> None:
        """Wait for the progress reports in flight; a failure to record one is only logged."""
        report, self._report = self._report, None
        await _settle_report(report)

    async def _progress(self, header: dict[str, Any]) -> None:
        if header.get("epochs_done") is None:
            return
        body = {
            "contract": self.contract,
            "epochs_done": int(header.get("epochs_done") or 0),
            "total_epochs": int(header.get("total_epochs") or self.params.get("total_epochs") or 0),
            "loss": _number(header.get("loss")),
            "metric": _number(header.get("metric")),
        }
        if self.privacy is not None:
            body["epsilon"] = self.privacy.epsilon
        await self.ledger.submit("contract.progress", body)


class ProgressPacing:
    """Which syncs report their progress (``contract.progress``, a ledger transaction): the first, the
    first of each epoch, and then at most one every ``SWARM_PROGRESS_INTERVAL`` seconds (default 1), so
    that a sync every few batches does not double the ledger's work; the last one left out is reported
    when training ends."""

    def __init__(self, interval: float | None = None) -> None:
        self.interval = progress_interval() if interval is None else interval
        self._last_at: float | None = None
        self._last_epoch: object = None
        self._pending: dict[str, Any] | None = None

    def due(self, header: dict[str, Any], now: float | None = None) -> bool:
        """Whether this sync's progress is reported (else it is kept as the last unreported one)."""
        now = time.monotonic() if now is None else now
        epoch = header.get("epochs_done")
        if self._last_at is None or epoch != self._last_epoch or now - self._last_at >= self.interval:
            self._last_at, self._last_epoch, self._pending = now, epoch, None
            return True
        self._pending = header
        return False

    def reported(self, header: dict[str, Any], now: float | None = None) -> None:
        """``header``'s progress (an epoch's end) is reported: it counts as the last report, and a sync's
        left out before it is older news."""
        self._last_at = time.monotonic() if now is None else now
        self._last_epoch, self._pending = header.get("epochs_done"), None

    def unreported(self) -> dict[str, Any] | None:
        """The progress of the last sync that was not reported, if any (then forgotten)."""
        pending, self._pending = self._pending, None
        return pending


async def _settle_report(report: asyncio.Task[None] | None) -> None:
    """Wait for a progress report; a failure to record it is only logged."""
    if report is None:
        return
    try:
        await report
    except BusError as exc:  # Rejected too: a report is for watching, training goes on without it
        log.warning("a progress report was not recorded: %s", exc)


def progress_interval() -> float:
    """``SWARM_PROGRESS_INTERVAL`` seconds between progress reports (0: every sync), default 1."""
    return seconds_from_env("SWARM_PROGRESS_INTERVAL", 1.0)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _flat(header: dict[str, Any], payload: np.ndarray | None) -> FlatState:
    if payload is None:
        raise ValueError("the request carries no weights")
    specs = layout_from_wire(header.get("layout"), payload.nbytes, what="weights from the ML program")
    return FlatState(specs, payload)


def _error(message: str) -> Reply:
    return {"op": "error", "message": message}, None
