"""SwarmCallbackBase: parameters and hooks of the reference system's SwarmCallback, any ML platform.

A platform subclass (``swarmlearning.pyt``) supplies: collect the model's weights into a flat buffer,
load weights from one, name its platform, and (optionally) compute validation loss/metric on at most N
batches. Everything else — validation of the parameters, the sync schedule (adaptive or not), when to
evaluate ``adsValData``, talking to the SL, the log lines — is here.

What validation costs: ``adsValData`` feeds the loss/metric shown for progress and adaptive sync. It is
evaluated on at most ``adsValBatches`` batches (default ``DEFAULT_VAL_BATCHES``; ``None``: the whole set)
— once per epoch when adaptive sync is off, once per sync round when it is on — never in loopback.

Overlapped sync (``overlapSync=True`` or ``SWARM_OVERLAP_SYNC=true``; ours, not the reference's): a sync
sends the weights and training goes on at once; the next sync (or the epoch's end, or the train's end)
takes the merge in as ``model += merged - sent``, keeping what the model learnt meanwhile, and sends
again. The round's time is hidden behind ``syncFrequency`` batches; each merge reaches the model one
sync later. The end of training is a blocking round as always: every node ends with the same model.
With adaptive sync, each merge taken in is followed by the evaluation that picks the next interval.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from swarmlearning.client.adaptive import AdaptiveSync
from swarmlearning.client.link import LinkError, SLLink
from swarmlearning.client.privacy import DP_OPTIONS, SECURE_OPTION, privacy_params, secure_params
from wire.frames import layout_from_wire, layout_to_wire
from wire.shared import SharedBuffer
from wire.tensors import FlatState

__all__ = [
    "CHECKIN_MODES",
    "DEFAULT_CONTRACT",
    "DEFAULT_VAL_BATCHES",
    "EXCHANGE_PARTS",
    "MERGE_METHODS",
    "SwarmCallbackBase",
    "SwarmError",
    "SwarmParams",
    "Validation",
    "loopback_enabled",
    "overlap_enabled",
]

DEFAULT_CONTRACT = "defaultbb.cqdb.sml.hpe"
MERGE_METHODS = ("mean", "coordmedian", "geomedian", "trimmedmean", "krum")
CHECKIN_MODES = ("inactive", "snapshot", "active")
DEFAULT_VAL_BATCHES = 2  # adsValData batches per evaluation: a fixed, small cost (see the module doc)
# What an exchange's time is made of (``timings["<op>_<part>"]``, seconds): flattening the model into the
# send buffer, writing it to the SL, waiting for the answer (the SL's work, the round itself), reading the
# answer, loading it into the model; the SL's own count of reading the request and handling it.
EXCHANGE_PARTS = ("collect", "send", "wait", "receive", "load", "sl_read", "sl_handle")
FINAL_MESSAGE = "All peers and Swarm training rounds finished. Final Swarm model was loaded."

# old parameter names of the reference system (v0.3/1.x) -> current ones
_ALIASES = {
    "sync_interval": "syncFrequency",
    "min_peers": "minPeers",
    "use_adaptive_sync": "useAdaptiveSync",
    "val_data": "adsValData",
    "val_batch_size": "adsValBatchSize",
    "node_weightage": "nodeWeightage",
    "merge_method": "mergeMethod",
    "training_contract": "trainingContract",
    "total_epochs": "totalEpochs",
}


class SwarmError(ValueError):
    """A SwarmCallback parameter or a swarm operation is wrong; the message says which and why."""


class Validation(NamedTuple):
    """One evaluation of ``adsValData``: loss and metric (None when not asked for), batches evaluated."""

    loss: float | None
    metric: float | None
    batches: int
    metric_higher_is_better: bool = True


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("true", "1", "yes", "on")


def loopback_enabled() -> bool:
    """``SWARM_LOOPBACK=true`` (any case): train alone, every hook returns at once."""
    return _env_flag("SWARM_LOOPBACK")


def overlap_enabled() -> bool:
    """``SWARM_OVERLAP_SYNC=true`` (any case): overlapped sync for a program that does not ask for it."""
    return _env_flag("SWARM_OVERLAP_SYNC")


def _require_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        bounds = f"{low}..{high}" if high is not None else f">= {low}"
        raise SwarmError(f"SwarmCallback: {name} must be an integer {bounds}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class SwarmParams:
    """The validated parameters of a SwarmCallback."""

    sync_frequency: int
    min_peers: int
    training_contract: str
    use_adaptive_sync: bool
    node_weightage: int
    merge_method: str
    checkin_mode: str
    total_epochs: int
    sample_count: int | None
    val_batches: int | None = DEFAULT_VAL_BATCHES
    overlap_sync: bool = False  # train on while the swarm merges (module doc); ours, not the reference's
    privacy: dict[str, Any] = field(default_factory=dict)  # dp* and secureAggregation (client/privacy.py)

    def wire(self) -> dict[str, Any]:
        """What the SL needs to know of them."""
        return {
            "sync_frequency": self.sync_frequency,
            "min_peers": self.min_peers,
            "contract": self.training_contract,
            "node_weightage": self.node_weightage,
            "merge_method": self.merge_method,
            "checkin_mode": self.checkin_mode,
            "total_epochs": self.total_epochs,
            "sample_count": self.sample_count,
            **self.privacy,
        }


def parse_params(
    sync_frequency: Any, min_peers: Any, kwargs: dict[str, Any], logger: logging.Logger
) -> SwarmParams:
    """Validate the constructor's arguments as the reference system does; raise SwarmError."""
    # In a RUN_TRIALS Mode: SWARM trial the SWOP names the trial's own contract; it is the default there.
    contract = kwargs.get("trainingContract", os.environ.get("SWARM_TRIAL_CONTRACT") or DEFAULT_CONTRACT)
    if not isinstance(contract, str) or not contract:
        raise SwarmError("SwarmCallback: trainingContract must be a non-empty string")
    merge = kwargs.get("mergeMethod", "mean")
    if not isinstance(merge, str) or merge.lower() not in MERGE_METHODS:
        raise SwarmError(
            f"SwarmCallback: mergeMethod must be one of {', '.join(MERGE_METHODS)}, got {merge!r}"
        )
    mode = kwargs.get("checkinModelOnTrainEnd", "snapshot")
    if not isinstance(mode, str) or mode.lower() not in CHECKIN_MODES:
        raise SwarmError(
            f"SwarmCallback: checkinModelOnTrainEnd must be one of {', '.join(CHECKIN_MODES)}, got {mode!r}"
        )
    total = kwargs.get("totalEpochs")
    if total is None:
        logger.warning("SwarmCallback: totalEpochs is not set; progress and ETA are not shown")
        total = 0
    else:
        total = _require_int("totalEpochs", total, 1)
    adaptive = bool(kwargs.get("useAdaptiveSync", False))
    if adaptive and kwargs.get("adsValData") is None:
        raise SwarmError("SwarmCallback: useAdaptiveSync needs adsValData")
    samples = kwargs.get("sampleCount")
    overlap = kwargs.get("overlapSync", overlap_enabled())
    if not isinstance(overlap, bool):
        raise SwarmError(f"SwarmCallback: overlapSync must be True or False, got {overlap!r}")
    val_batches = kwargs.get("adsValBatches", DEFAULT_VAL_BATCHES)
    return SwarmParams(
        sync_frequency=_require_int("syncFrequency", sync_frequency, 1),
        min_peers=_require_int("minPeers", min_peers, 1),
        training_contract=contract,
        use_adaptive_sync=adaptive,
        node_weightage=_require_int("nodeWeightage", kwargs.get("nodeWeightage", 1), 1, 100),
        merge_method=merge.lower(),
        checkin_mode=mode.lower(),
        total_epochs=total,
        sample_count=None if samples is None else _require_int("sampleCount", samples, 1),
        val_batches=None if val_batches is None else _require_int("adsValBatches", val_batches, 1),
        overlap_sync=overlap,
        privacy={**privacy_params(kwargs, SwarmError), **secure_params(kwargs, merge.lower(), SwarmError)},
    )


def _default_logger() -> logging.Logger:
    logger = logging.getLogger("SwarmCallback")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(asctime)s : %(name)s : %(levelname)s : %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


_KNOWN = {
    "trainingContract", "useAdaptiveSync", "adsValData", "adsValBatchSize", "adsValBatches", "overlapSync",
    "checkinModelOnTrainEnd",
    "nodeWeightage", "mergeMethod", "totalEpochs", "logger", "model", "lossFunction", "lossFunctionArgs",
    "metricFunction", "metricFunctionArgs", "ml_platform", "sampleCount", "hfMode",
    *DP_OPTIONS, SECURE_OPTION,
}  # fmt: skip


class SwarmCallbackBase(ABC):
    """The reference's SwarmCallback behaviour, independent of the ML platform."""

    def __init__(self, syncFrequency: Any = None, minPeers: Any = None, **kwargs: Any) -> None:  # noqa: N803 - the reference's names
        kwargs = {_ALIASES.get(k, k): v for k, v in kwargs.items()}
        sync_frequency = kwargs.pop("syncFrequency", syncFrequency)
        min_peers = kwargs.pop("minPeers", minPeers)
        unknown = sorted(set(kwargs) - _KNOWN)
        if unknown:
            raise SwarmError(f"SwarmCallback: unknown parameters {', '.join(unknown)}")
        self.logger: logging.Logger = kwargs.get("logger") or _default_logger()
        self.params = parse_params(sync_frequency, min_peers, kwargs, self.logger)
        self.kwargs = kwargs
        self.loopback = loopback_enabled()
        self.epochs_completed = 0
        self.steps_before_sync = self.params.sync_frequency
        self.syncs_done = 0
        self.training_over = False
        self.last_loss: float | None = None
        self.last_metric: float | None = None
        self.val_batches_evaluated = 0
        self.adaptive = AdaptiveSync(self.params.sync_frequency) if self.params.use_adaptive_sync else None
        self.final_digest: str | None = None
        self.timings: dict[str, float] = {"begin": 0.0, "sync": 0.0, "end": 0.0, "validation": 0.0}
        self._flat: FlatState | None = None
        self._received: FlatState | None = None
        self._sent: FlatState | None = None  # the weights of the overlapped sync in flight, as sent
        self._in_flight = False  # an overlapped sync's merge is still to be taken in (on every rank)
        self._interval = self.params.sync_frequency  # batches before the next overlapped sync
        self._link: SLLink | None = None
        self._validate_platform(kwargs)
        if self.loopback:
            self.logger.info("SWARM_LOOPBACK is set: training without the swarm")
            return
        self._open_session()

    # ------------------------------------------------------------ platform part
    @abstractmethod
    def _validate_platform(self, kwargs: dict[str, Any]) -> None:
        """Check the platform's own parameters (model, loss, metric, validation data)."""

    @abstractmethod
    def _collect_weights(self, reuse: FlatState | None) -> FlatState:
        """The model's current weights in a flat buffer (reusing ``reuse``'s buffer)."""

    @abstractmethod
    def _load_weights(self, flat: FlatState) -> None:
        """Copy weights from ``flat`` into the model, in place."""

    def _keep_sent(self, flat: FlatState | None) -> None:
        """Keep the weights an overlapped sync sends, for ``_apply_merge``: ``flat`` as ``_collect_weights``
        just filled it (the sync rank), or, with None, the model's own (another rank of a distributed job,
        whose weights are the sync rank's). Here a host copy; a platform may keep them nearer the model."""
        if flat is None:
            self._sent = self._collect_weights(self._sent)
            return
        if self._sent is None or self._sent.specs != flat.specs:
            self._sent = FlatState(flat.specs, np.empty_like(flat.buffer))
        np.copyto(self._sent.buffer, flat.buffer)  # a shared buffer sent is the SL's, to use again

    def _apply_merge(self, merged: FlatState) -> None:
        """Add what a merge changed (``merged`` minus the weights ``_keep_sent`` kept) to the model, in
        place (overlapped sync)."""
        raise SwarmError(f"SwarmCallback: overlapSync is not supported on {self.platform}")

    def _validation(self, max_batches: int | None) -> Validation:
        """Loss and metric on the first ``max_batches`` batches of adsValData (None: all of them).

        A platform without validation data keeps this default: nothing evaluated.
        """
        return Validation(None, None, 0)

    @property
    @abstractmethod
    def platform(self) -> str:
        """Name of the ML platform (``PYTORCH``)."""

    def _is_sync_rank(self) -> bool:
        """Whether this process talks to the SL (rank 0 of a distributed job)."""
        return True

    def _share(self, reply: dict[str, Any], flat: FlatState | None) -> tuple[dict[str, Any], FlatState]:
        """Give every rank the sync rank's reply and weights (single process: nothing to do)."""
        assert flat is not None  # noqa: S101 - the sync rank always receives weights
        return reply, flat

    def _agree(self, value: int) -> int:
        """The sync rank's ``value`` on every rank (single process: ``value``)."""
        return value

    # --------------------------------------------------------------- session
    def _open_session(self) -> None:
        if not self._is_sync_rank():
            return
        path = os.environ.get("SWARM_SL_SOCKET")
        if not path:
            raise SwarmError(
                "SwarmCallback: no SL to talk to (SWARM_SL_SOCKET is not set). Run this program under "
                "`swarm sl` or a SWOP task, or set SWARM_LOOPBACK=true to train alone."
            )
        self._link = SLLink(path, on_attach=self._shared_attached)
        self._flat = self._collect_weights(None)
        self._link.share(self._flat.total)
        header = {
            "params": self.params.wire(),
            "platform": self.platform,
            "pid": os.getpid(),
            "layout": layout_to_wire(self._flat.specs),
            "shm_bytes": self._flat.total,  # weights through shared buffers, not the socket
        }
        reply = self._call("hello", header)
        if self._link.refused is not None:
            self.logger.warning("SwarmCallback: weights go through the socket (%s)", self._link.refused)
        p = self.params
        self.logger.info(
            "Swarm session opened: node %s, contract %s, sync every %d batches, minPeers %d",
            reply.get("uid"), p.training_contract, p.sync_frequency, p.min_peers,
        )  # fmt: skip

    def _outgoing(self) -> FlatState | None:
        """Where to flatten the weights to send: the buffer the SL lent us (the model goes straight in),
        else our own buffer (None: a new one), never a shared buffer the SL has back."""
        flat, link = self._flat, self._link
        if flat is None or link is None:
            return flat
        if link.lent is not None and link.lent.nbytes == flat.total:
            return FlatState(flat.specs, link.lent.array)
        return None if link.is_shared(flat.buffer) else flat

    def _shared_attached(self, shared: SharedBuffer) -> None:  # noqa: B027 - a hook; most need nothing
        """A buffer shared with the SL is mapped: weights go out and come back in such buffers (a
        platform may prepare each for its device)."""

    def _call(self, op: str, header: dict[str, Any], flat: FlatState | None = None) -> dict[str, Any]:
        self._start(op, header, flat)
        return self._finish()

    def _start(self, op: str, header: dict[str, Any], flat: FlatState | None = None) -> None:
        assert self._link is not None  # noqa: S101 - only called with a session
        try:
            self._link.start(op, header, None if flat is None else flat.buffer)
        except LinkError as exc:
            raise SwarmError(f"SwarmCallback: {exc}") from None

    def _finish(self) -> dict[str, Any]:
        assert self._link is not None  # noqa: S101 - only called with a session
        received = self._received.buffer if self._received is not None else None
        spare = received if received is not None and not self._link.is_shared(received) else None
        try:
            reply, payload = self._link.finish(into=spare)
        except LinkError as exc:
            raise SwarmError(f"SwarmCallback: {exc}") from None
        if payload is not None:
            specs = layout_from_wire(reply.get("layout"), payload.nbytes, what="weights from the SL")
            self._received = FlatState(specs, payload)
        return reply

    def _exchange(self, op: str, header: dict[str, Any]) -> dict[str, Any]:
        """Send the weights with ``op``; load the weights that come back on every rank.

        Where the time goes is added up in ``timings`` as ``<op>_<part>`` (see ``EXCHANGE_PARTS``).
        """
        reply: dict[str, Any] = {}
        incoming: FlatState | None = None
        started = time.perf_counter()
        if self._is_sync_rank():
            self._flat = self._collect_weights(self._outgoing())
            self._add_time(op, "collect", time.perf_counter() - started)
            self._received = None
            reply = self._call(op, {**header, "layout": layout_to_wire(self._flat.specs)}, self._flat)
            self._add_call_times(op, reply)
            incoming = self._received
            if incoming is None:
                raise SwarmError(f"SwarmCallback: the SL sent no weights back for {op!r}")
        loading = time.perf_counter()
        reply, incoming = self._share(reply, incoming)
        self._load_weights(incoming)
        self._add_time(op, "load", time.perf_counter() - loading)
        return reply

    def _add_time(self, op: str, part: str, seconds: float) -> None:
        key = f"{op}_{part}"
        self.timings[key] = self.timings.get(key, 0.0) + seconds

    def _add_call_times(self, op: str, reply: dict[str, Any]) -> None:
        """The link's send/wait/receive of the last call, and the SL's own account of it."""
        assert self._link is not None  # noqa: S101 - only called with a session
        times = self._link.last
        self._add_time(op, "send", times.send)
        self._add_time(op, "wait", times.wait)
        self._add_time(op, "receive", times.receive)
        sl = reply.get("sl_s")
        if isinstance(sl, dict):
            for part in ("read", "handle"):
                value = sl.get(part)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    self._add_time(op, f"sl_{part}", float(value))

    # ----------------------------------------------------------------- hooks
    def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
        """Start from the swarm's model: the latest merged one, or one chosen among the starters."""
        if self.loopback:
            return
        started = time.perf_counter()
        reply = self._exchange("begin", {"samples": self.params.sample_count or 0})
        self.timings["begin"] += time.perf_counter() - started
        self.training_over = bool(reply.get("training_over", False))
        self.logger.info("Starting Swarm training from model %s", reply.get("digest", "?"))

    def on_batch_end(self, batch: Any = None, *args: Any, **kwargs: Any) -> None:
        """Count batches; every syncFrequency batches, merge with the swarm (blocks until merged)."""
        if self.loopback or self.training_over:
            return
        self.steps_before_sync -= 1
        if self.steps_before_sync > 0:
            return
        self._sync()

    def _evaluate(self) -> Validation:
        """Evaluate adsValData (at most ``adsValBatches`` batches); keep its loss and metric."""
        started = time.perf_counter()
        result = self._validation(self.params.val_batches)
        self.timings["validation"] += time.perf_counter() - started
        self.val_batches_evaluated += result.batches
        self.last_loss, self.last_metric = result.loss, result.metric
        return result

    def _next_interval(self, reply: dict[str, Any]) -> int:
        """Batches until the next sync: the adaptive policy's choice, or what the SL says."""
        if self.adaptive is None:
            return int(reply.get("next_sync_interval") or self.params.sync_frequency)
        interval = self.adaptive.interval
        if self._is_sync_rank():
            result = self._evaluate()  # of the merged model, as the reference's getLoss does
            if result.loss is not None:
                interval = self.adaptive.update(result.loss, lower_is_better=True)
            else:
                higher = result.metric_higher_is_better
                interval = self.adaptive.update(result.metric, lower_is_better=not higher)
        interval = self._agree(interval)
        self.adaptive.interval = interval
        return interval

    def _sync(self) -> None:
        self.logger.info("Starting Swarm merging round")
        header = {
            "samples": self.params.sample_count or 0,
            "epochs_done": self.epochs_completed,
            "loss": self.last_loss,
            "metric": self.last_metric,
        }
        if self.params.overlap_sync:
            self._sync_overlapped(header)
            return
        started = time.perf_counter()
        reply = self._exchange("sync", header)
        self.timings["sync"] += time.perf_counter() - started
        self._synced(reply)
        self.steps_before_sync = self._next_interval(reply)
        self._log_finished(reply, self.steps_before_sync)

    def _synced(self, reply: dict[str, Any]) -> None:
        self.syncs_done += 1
        self.training_over = bool(reply.get("training_over", False))

    def _sync_overlapped(self, header: dict[str, Any]) -> None:
        """Take in the last sync's merge, then send the weights and return: training goes on while the
        swarm merges them."""
        self._take_merge()
        self.steps_before_sync = self._interval
        if self.training_over:
            return
        started = time.perf_counter()
        if self._is_sync_rank():
            self._flat = self._collect_weights(self._outgoing())
            self._keep_sent(self._flat)
            self._start("sync", {**header, "layout": layout_to_wire(self._flat.specs)}, self._flat)
        else:  # the same weights as the sync rank's (DDP keeps the ranks in step)
            self._keep_sent(None)
        self._in_flight = True
        self._add_time("sync", "collect", time.perf_counter() - started)
        self.timings["sync"] += time.perf_counter() - started

    def _take_merge(self) -> None:
        """Wait for the merge of the overlapped sync in flight (if any) and add it to the model; every
        rank of a distributed job calls it at the same point (the merge is broadcast)."""
        if not self._in_flight:
            return
        self._in_flight = False
        started = time.perf_counter()
        reply: dict[str, Any] = {}
        incoming: FlatState | None = None
        if self._is_sync_rank():
            self._received = None
            reply = self._finish()
            self._add_call_times("sync", reply)
            incoming = self._received
            if incoming is None:
                raise SwarmError("SwarmCallback: the SL sent no weights back for 'sync'")
        reply, incoming = self._share(reply, incoming)
        loading = time.perf_counter()
        self._apply_merge(incoming)
        self._add_time("sync", "load", time.perf_counter() - loading)
        self.timings["sync"] += time.perf_counter() - started
        self._synced(reply)
        # the SL's interval, or adaptive sync's choice from the model as it is now (merge and what followed)
        self._interval = self._next_interval(reply)
        self._log_finished(reply, self._interval, ", taken in while training went on")

    def _log_finished(self, reply: dict[str, Any], interval: int, how: str = "") -> None:
        self.logger.info(
            "Finished Swarm merging round %s (model %s)%s%s%s",
            reply.get("round", "?"), reply.get("digest", "?"), how, self._loss_text(),
            f"; next sync in {interval} batches" if self.adaptive is not None else "",
        )  # fmt: skip

    def _loss_text(self) -> str:
        parts = []
        if self.last_loss is not None:
            parts.append(f"val loss {self.last_loss:.4f}")
        if self.last_metric is not None:
            parts.append(f"val metric {self.last_metric:.4f}")
        return (": " + ", ".join(parts)) if parts else ""

    def on_epoch_end(self, epoch: Any = None, *args: Any, **kwargs: Any) -> None:
        """Count the epoch and report progress (with a bounded validation, when adaptive sync is off)."""
        self.epochs_completed += 1
        if self.loopback:
            return
        self._take_merge()  # on every rank; the link carries one request at a time
        if not self._is_sync_rank():
            return
        if self.adaptive is None and not self.training_over:
            self._evaluate()
        self._call(
            "progress",
            {
                "epochs_done": self.epochs_completed,
                "total_epochs": self.params.total_epochs,
                "loss": self.last_loss,
                "metric": self.last_metric,
            },
        )

    def on_train_end(self, *args: Any, **kwargs: Any) -> None:
        """Hand in the end model, wait until every peer is done, and load the final swarm model."""
        if self.loopback:
            return
        if self.syncs_done == 0:
            self.logger.warning(
                "No user merge done during swarm training. syncFrequency=%d may be high.",
                self.params.sync_frequency,
            )
        self._take_merge()  # the last sync's answer is read before the next request (the SL reuses it)
        started = time.perf_counter()
        reply = self._exchange(
            "end", {"mode": self.params.checkin_mode, "epochs_done": self.epochs_completed}
        )
        self.timings["end"] += time.perf_counter() - started
        self.final_digest = reply.get("digest")
        self.training_over = True
        self.logger.info(FINAL_MESSAGE)  # exactly the reference's line: scripts wait for it
        self.logger.info("Final Swarm model digest: %s", self.final_digest)
        if self._link is not None:
            self._link.close()
            self._link = None
