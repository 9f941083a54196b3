"""The live view of a training: per node epochs, loss, metric, round, leader, state and time left.

:class:`TrainingFollower` keeps a :class:`Training` snapshot of one contract up to date from the
ledger: it subscribes to the contract's events (every progress report, join and merge changes the
contract) and re-reads the PERFDATA and the rounds on each (at most a few times a second), so it
costs the SN a read per change and the training nothing. :func:`training_table` draws a snapshot
(``WATCH CONTRACT``, and ``WAIT FOR TASKRUNNER``'s panel on a terminal); :func:`progress_lines`
says what changed, one line per node, for a console that is not a terminal.

Elapsed time runs from the assignment (or the first join); a node's ETA is its epochs left at the
rate it has trained so far, and the training's is the longest of them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table as RichTable
from rich.text import Text

from daemons.bus import BusError
from swci.connection import LedgerLink

__all__ = [
    "NodeRow",
    "Training",
    "TrainingFollower",
    "clock",
    "eta_seconds",
    "progress_lines",
    "training_table",
]

View = Mapping[str, Any]
REFRESH_GAP = 0.25
"""Seconds between two reads of the ledger however fast events come."""
QUIET_REREAD = 5.0
"""Seconds without an event after which the view is read again (events can be lost on a reconnect)."""


def clock(seconds: float | None) -> str:
    """``H:MM:SS``, or ``-`` when unknown."""
    if seconds is None:
        return "-"
    whole = max(0, int(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def eta_seconds(
    done: int, total: int, joined: float | None, updated: float | None, now: float
) -> float | None:
    """Seconds until ``total`` epochs at the rate of the ``done`` ones so far; None when unknown."""
    if total <= 0 or joined is None or updated is None:
        return None
    if done >= total:
        return 0.0
    if done <= 0 or updated <= joined:
        return None
    per_epoch = (updated - joined) / done
    return max(0.0, (total - done) * per_epoch - (now - updated))


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class NodeRow:
    """One node of the view."""

    uid: str
    status: str
    epochs_done: int
    total_epochs: int
    loss: object
    metric: object
    round: int | None
    leads: bool
    eta: float | None


@dataclass
class Training:
    """A snapshot of one contract's training."""

    contract: str
    status: str = "?"
    perf: list[dict[str, Any]] = field(default_factory=list)
    rounds: dict[str, Any] = field(default_factory=dict)
    started: float | None = None
    node_rounds: dict[str, int] = field(default_factory=dict)

    def last_merged(self) -> View:
        """The last merged (finished) round's brief, or {}."""
        finished = self.rounds.get("finished") or []
        return finished[-1] if finished else {}

    def leader(self) -> str | None:
        """Who leads now: the leader of a closed round still merging, else of the last merged one."""
        closed = self.rounds.get("closed") or []
        if closed:
            return str(closed[-1].get("leader") or "") or None
        leader = self.last_merged().get("leader")
        return str(leader) if leader else None

    def see_rounds(self, rounds: View) -> None:
        """Take a new rounds view and remember each node's latest round."""
        self.rounds = dict(rounds)
        for rnd in [*(rounds.get("finished") or []), *(rounds.get("closed") or [])]:
            number = rnd.get("round")
            if not isinstance(number, int):
                continue
            for uid in rnd.get("participants") or []:
                self.node_rounds[str(uid)] = max(self.node_rounds.get(str(uid), 0), number)

    def start_time(self) -> float | None:
        """When the training started: the assignment when known, else the first join."""
        if self.started is not None:
            return self.started
        joined = [j for j in (_float(p.get("joined_at")) for p in self.perf) if j is not None]
        return min(joined) if joined else None

    def nodes(self, now: float) -> list[NodeRow]:
        """One row per member, in uid order."""
        leader = self.leader()
        rows = []
        for p in self.perf:
            done, total = int(p.get("completed_epochs") or 0), int(p.get("total_epochs") or 0)
            eta = eta_seconds(done, total, _float(p.get("joined_at")), _float(p.get("updated_at")), now)
            if p.get("status") == "finished":
                eta = 0.0
            uid = str(p.get("uid"))
            rows.append(
                NodeRow(
                    uid,
                    str(p.get("status") or "-"),
                    done,
                    total,
                    p.get("loss"),
                    p.get("metric"),
                    self.node_rounds.get(uid),
                    uid == leader,
                    eta,
                )
            )
        return rows

    def eta(self, now: float) -> float | None:
        """The longest ETA of the nodes still training (None when any is unknown)."""
        etas = [row.eta for row in self.nodes(now) if row.status == "active"]
        if not etas:
            return 0.0 if self.status == "COMPLETE" else None
        return None if any(e is None for e in etas) else max(e for e in etas if e is not None)

    def copy(self) -> Training:
        """A snapshot that later updates do not change."""
        return Training(
            self.contract,
            self.status,
            list(self.perf),
            dict(self.rounds),
            self.started,
            dict(self.node_rounds),
        )

    @property
    def over(self) -> bool:
        """Whether the training is COMPLETE."""
        return self.status == "COMPLETE"


def _number(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return "-" if value is None else str(value)


_STATUS_STYLE = {"active": "yellow", "finished": "green", "left": "red"}


def training_table(training: Training, now: float | None = None) -> RenderableType:
    """The view: a headline (contract, status, round and leader, elapsed, ETA) and a row per node."""
    now = time.time() if now is None else now
    merged = training.last_merged()
    started = training.start_time()
    open_round = (training.rounds.get("open") or {}).get("round")
    headline = Text.assemble(
        ("Contract ", ""),
        (training.contract, "bold"),
        ("  ", ""),
        (training.status, "bold green" if training.over else "bold yellow"),
        (f"  round {open_round or merged.get('round') or '-'}", ""),
        (f"  leader {training.leader() or '-'}", ""),
        (f"  elapsed {clock(None if started is None else now - started)}", "dim"),
        (f"  ETA {clock(training.eta(now))}", "dim"),
    )
    table = RichTable(box=None, header_style="bold", pad_edge=False, padding=(0, 1))
    for column in ("node", "state", "epochs", "", "loss", "metric", "round", "lead", "ETA"):
        table.add_column(column, no_wrap=True)
    for row in training.nodes(now):
        bar = ProgressBar(total=max(row.total_epochs, 1), completed=row.epochs_done, width=16)
        table.add_row(
            row.uid,
            Text(row.status, style=_STATUS_STYLE.get(row.status, "")),
            f"{row.epochs_done}/{row.total_epochs or '?'}",
            bar,
            _number(row.loss),
            _number(row.metric),
            _number(row.round),
            "★" if row.leads else "",
            clock(row.eta),
        )
    if not training.perf:
        return Group(headline, Text("  no node has joined yet", style="dim"))
    return Group(headline, table)


def progress_lines(before: Training | None, after: Training) -> list[str]:
    """Plain lines for what changed: a node's epochs, its state, or the contract's status."""
    lines = []
    if before is None or before.status != after.status:
        lines.append(f"Contract {after.contract}: {after.status}")
    old = {str(p.get("uid")): p for p in (before.perf if before else [])}
    for p in after.perf:
        uid, prev = str(p.get("uid")), old.get(str(p.get("uid")))
        keys = ("completed_epochs", "status")
        if prev is None or any(prev.get(k) != p.get(k) for k in keys):
            lines.append(
                f"  {uid}: {p.get('status')} epoch {p.get('completed_epochs')}/{p.get('total_epochs')} "
                f"loss {_number(p.get('loss'))} metric {_number(p.get('metric'))}"
            )
    return lines


class TrainingFollower:
    """Keeps :attr:`training` current for one contract (or the first that ``pick`` accepts).

    Args:
        link: the connection to the SN.
        contract: the contract to follow; None to wait for one that ``pick`` accepts.
        pick: for ``contract=None``: whether a contract's PERFDATA rows belong to the training.
        started: when the training started (the assignment), if known.
    """

    def __init__(
        self,
        link: LedgerLink,
        contract: str | None,
        *,
        pick: Callable[[Sequence[View]], Awaitable[bool]] | None = None,
        started: float | None = None,
    ) -> None:
        self.link = link
        self.contract = contract
        self.pick = pick
        self.training: Training | None = None
        self.started = started
        self.changed = asyncio.Event()

    async def run(self) -> None:
        """Follow until cancelled."""
        async with self.link.watch("contract", self.contract or "+") as watch:
            loop = asyncio.get_running_loop()
            last_read = float("-inf")
            pending: set[str] = set() if self.contract is None else {self.contract}
            if self.contract is None:
                pending.update(await self._active_contracts())
            while True:
                wait = max(0.0, last_read + REFRESH_GAP - loop.time())
                if wait:
                    await asyncio.sleep(wait)
                for name in sorted(pending):
                    await self._read(name)
                last_read = loop.time()
                pending = await self._next_keys(watch)

    async def _next_keys(self, watch: Any) -> set[str]:
        keys: set[str] = set()
        try:
            event = await watch.next(QUIET_REREAD)
            keys.add(event.key)
        except TimeoutError:
            pass
        if self.contract is not None:
            return {self.contract}
        return keys or set(await self._active_contracts())

    async def _active_contracts(self) -> list[str]:
        try:
            views = await self.link.query("contracts")
        except BusError:
            return []
        return [str(v.get("name")) for v in views if v.get("status") == "ACTIVE"]

    async def _read(self, name: str) -> None:
        try:
            status = await self.link.query("contract.status", name=name)
            perf = await self.link.query("contract.perfdata", name=name)
            rounds = await self.link.query("contract.rounds", name=name)
        except BusError:
            return  # gone, or the SN is away for a moment: the next event or re-read tries again
        if self.contract is None:
            if self.pick is None or not await self.pick(perf):
                return
            self.contract = name
        training = self.training if self.training is not None else Training(name, started=self.started)
        training.status = str(status.get("status") or "?")
        training.perf = list(perf)
        training.see_rounds(rounds)
        self.training = training
        self.changed.set()


def members(perf: Sequence[View]) -> set[str]:
    """The uids of a contract's PERFDATA rows."""
    return {str(p.get("uid")) for p in perf}
