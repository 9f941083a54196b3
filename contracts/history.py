"""Training history from the chain: every progress report and every merged round of a contract.

The state keeps only each member's latest report and the last few rounds; the blocks keep every
transaction. :class:`HistoryIndex` folds blocks (in height order, as the SN serves them) into
records, so a reader builds the history from what the ledger already stores and training never pays
for it. It keeps a cursor (``height``), so a long-lived reader (the dashboard) only folds new blocks.

Records of one contract are grouped in **runs**: ``contract.reset`` starts a new run. The latest
run that has records is the one shown by default (the reference's scripts reset the contract at
their end, which would otherwise leave nothing to show).

=====================  ================================================================
transaction            record
=====================  ================================================================
``contract.progress``  ``progress``: time, node, epoch, total epochs, loss, metric, and the
                       round and digest of the latest merged model at that time
``round.merged``       ``round``: time, round, leader (its sender), digest, contributors
=====================  ================================================================
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from contracts.block import BlockError, decode_block
from contracts.tx import TX_PREFIX
from wire.envelope import decode_envelope
from wire.errors import CodecError

__all__ = ["FIELDS", "HistoryIndex", "Record", "number"]

FIELDS = ("time", "kind", "node", "epoch", "total_epochs", "loss", "metric", "round", "digest", "height")
"""The columns of a record, in the order tables and CSV files show them."""


def number(value: object) -> float | str | None:
    """A loss or metric as JSON-able data: non-finite values and non-numbers become strings."""
    if value is None or isinstance(value, bool):
        return None if value is None else str(value)
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else str(float(value))
    return str(value)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class Record:
    """One row of a contract's history.

    ``kind`` is ``progress`` (a node's report) or ``round`` (a merged round; ``node`` is its leader
    and ``contributors`` the nodes whose models it merged).
    """

    time: float
    kind: str
    node: str
    height: int
    epoch: int | None = None
    total_epochs: int | None = None
    loss: float | str | None = None
    metric: float | str | None = None
    round: int | None = None
    digest: str | None = None
    contributors: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The record as plain data (``contributors`` as a list)."""
        row: dict[str, Any] = {name: getattr(self, name) for name in FIELDS}
        row["contributors"] = list(self.contributors)
        return row


@dataclass
class _Contract:
    runs: list[list[Record]] = field(default_factory=lambda: [[]])
    merged: tuple[int, str] | None = None  # round and digest of the latest merged model


class HistoryIndex:
    """Folds blocks into per-contract history; feed it blocks in height order with :meth:`add`."""

    def __init__(self) -> None:
        self.height = -1
        self._contracts: dict[str, _Contract] = {}

    def add(self, raw: bytes) -> None:
        """Fold the stored block ``raw``; blocks at or below :attr:`height` are ignored.

        Raises:
            BlockError: the block is corrupt, or does not follow the last one folded.
        """
        block = decode_block(raw)
        if block.height <= self.height:
            return
        if block.height != self.height + 1:
            raise BlockError(f"block {block.height} does not follow block {self.height}")
        for tx in block.txs:
            self._fold(tx, block.height, block.time)
        self.height = block.height

    def add_all(self, blocks: Iterable[bytes]) -> None:
        """Fold several blocks in order."""
        for raw in blocks:
            self.add(raw)

    def contracts(self) -> list[str]:
        """The contracts seen so far, sorted."""
        return sorted(self._contracts)

    def runs(self, contract: str) -> int:
        """How many runs (resets + 1) the contract has had; 0 when it is unknown."""
        entry = self._contracts.get(contract)
        return len(entry.runs) if entry is not None else 0

    def records(self, contract: str, run: int | None = None, since: int = -1) -> list[Record]:
        """The records of ``run`` (0-based; None: the latest run with records) above height ``since``."""
        entry = self._contracts.get(contract)
        if entry is None:
            return []
        if run is None:
            run = self.latest_run(contract)
        if not 0 <= run < len(entry.runs):
            return []
        return [r for r in entry.runs[run] if r.height > since]

    def latest_run(self, contract: str) -> int:
        """The latest run of ``contract`` that has records (the latest run when none has)."""
        entry = self._contracts.get(contract)
        if entry is None:
            return 0
        with_records = [i for i, run in enumerate(entry.runs) if run]
        return with_records[-1] if with_records else len(entry.runs) - 1

    # ------------------------------------------------------------------ folding
    def _fold(self, raw: bytes, height: int, when: float) -> None:
        try:
            env = decode_envelope(raw, what="transaction")
        except CodecError:
            return  # sealed envelopes decode; a reader skips what it cannot read rather than stop
        if not env.kind.startswith(TX_PREFIX) or not isinstance(env.body, Mapping):
            return
        kind, body = env.kind[len(TX_PREFIX) :], env.body
        name = body.get("name") if kind.startswith("contract.") else body.get("contract")
        if kind in ("contract.create", "contract.reset") and isinstance(name, str):
            self._reset(name, created=kind == "contract.create")
        elif kind == "contract.progress" and isinstance(body.get("contract"), str):
            self._progress(body, env.sender, height, when)
        elif kind == "round.merged" and isinstance(body.get("contract"), str):
            self._merged(body, env.sender, height, when)

    def _entry(self, contract: str) -> _Contract:
        return self._contracts.setdefault(contract, _Contract())

    def _reset(self, contract: str, *, created: bool) -> None:
        entry = self._entry(contract)
        if not created and entry.runs[-1]:
            entry.runs.append([])
        entry.merged = None

    def _progress(self, body: Mapping[str, Any], sender: str, height: int, when: float) -> None:
        entry = self._entry(body["contract"])
        merged_round, merged_digest = entry.merged or (None, None)
        entry.runs[-1].append(
            Record(
                time=when,
                kind="progress",
                node=sender,
                height=height,
                epoch=_int(body.get("epochs_done")),
                total_epochs=_int(body.get("total_epochs")),
                loss=number(body.get("loss")),
                metric=number(body.get("metric")),
                round=merged_round,
                digest=merged_digest,
            )
        )

    def _merged(self, body: Mapping[str, Any], sender: str, height: int, when: float) -> None:
        entry = self._entry(body["contract"])
        number_, digest = _int(body.get("round")), body.get("digest")
        if number_ is None or not isinstance(digest, str):
            return
        contributors = body.get("contributors") or ()
        entry.merged = (number_, digest)
        entry.runs[-1].append(
            Record(
                time=when,
                kind="round",
                node=sender,
                height=height,
                round=number_,
                digest=digest,
                contributors=tuple(str(c) for c in contributors if isinstance(c, str)),
            )
        )
