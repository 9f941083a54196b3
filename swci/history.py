"""``PERFDATA <contract> HISTORY``: a contract's every progress report and merged round.

The history comes from the chain (:meth:`daemons.ledger_client.LedgerClient.history`): one row per
``contract.progress`` (a node's epoch, loss and metric, with the round and digest of the merged model
it had then) and per merged round (its leader and digest). Shown as a table, or written to a file:
``.json`` as JSON, anything else as CSV.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from swci.output import Table
from swci.tables import fmt_time

__all__ = ["COLUMNS", "history_table", "write_history"]

View = Mapping[str, Any]
COLUMNS = ("time", "kind", "node", "epoch", "total_epochs", "loss", "metric", "round", "digest", "height")


def _short(value: object) -> object:
    return value[:16] if isinstance(value, str) and len(value) > 16 else value


def _number(value: object) -> object:
    return f"{value:.4f}" if isinstance(value, float) else value


def history_table(contract: str, history: View) -> Table:
    """The history as a table (digests shortened; the data and files keep them whole)."""
    rows = [
        (
            fmt_time(r.get("time")),
            r.get("kind"),
            r.get("node"),
            r.get("epoch") if r.get("kind") == "progress" else "",
            _number(r.get("loss")),
            _number(r.get("metric")),
            r.get("round"),
            _short(r.get("digest")),
        )
        for r in history.get("records") or []
    ]
    title = f"History of {contract} (run {history.get('run')}, {len(rows)} records)"
    columns = ("Time", "Kind", "Node", "Epoch", "Loss", "Metric", "Round", "Digest")
    return Table.of(title, columns, rows)


def _csv(records: Sequence[View]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*COLUMNS, "contributors"])
    for r in records:
        writer.writerow(
            [*("" if r.get(c) is None else r.get(c) for c in COLUMNS), " ".join(r.get("contributors") or [])]
        )
    return out.getvalue()


def write_history(path: Path, history: View) -> str:
    """Write the history to ``path`` (JSON for ``.json``, else CSV); returns the format written.

    Raises:
        OSError: the file cannot be written.
    """
    records = list(history.get("records") or [])
    if path.suffix.lower() == ".json":
        path.write_text(json.dumps(dict(history), indent=1) + "\n")
        return "JSON"
    path.write_text(_csv(records))
    return "CSV"
