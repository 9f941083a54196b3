"""Tables and lines for the ledger's views (``contracts.views``): listings, key/value info, status.

Every function takes the raw view (plain JSON data from the SN's ``query``) and returns what a
:class:`~swci.output.Result` shows; the raw view itself travels as the result's ``data``.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from swci.output import Table

__all__ = [
    "contract_status_table",
    "contracts_table",
    "fmt_time",
    "kv_table",
    "node_lines",
    "peer_status_table",
    "perfdata_table",
    "taskrunner_peers_table",
    "taskrunner_status_lines",
    "taskrunner_status_table",
    "taskrunners_table",
    "tasks_table",
    "view_table",
]

View = Mapping[str, Any]

_TIME_KEYS = frozenset(
    {"created_at", "finalized_at", "completed_at", "assigned_at", "updated_at", "finished_at"}
    | {"registered_at", "last_seen", "enrolled_at", "started", "time"}
)


def fmt_time(stamp: object) -> str:
    """A unix time as local ``YYYY-MM-DD HH:MM:SS`` ("" for None)."""
    if not isinstance(stamp, int | float) or isinstance(stamp, bool):
        return ""
    return datetime.datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M:%S")


def _cell(key: str, value: object) -> object:
    if key in _TIME_KEYS:
        return fmt_time(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {v}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(str(item) for item in value)
    return value


def _label(key: str) -> str:
    return key.replace("_", " ").upper()


def kv_table(title: str | None, pairs: Iterable[tuple[str, object]]) -> Table:
    """A two-column table of fields and values."""
    return Table.of(title, ("Field", "Value"), [(label, value) for label, value in pairs])


def view_table(title: str | None, view: View, skip: Sequence[str] = ()) -> Table:
    """A key/value table of every field of a view (times formatted, labels upper-cased)."""
    return kv_table(title, ((_label(k), _cell(k, v)) for k, v in view.items() if k not in skip))


def _rows(views: Iterable[View], keys: Sequence[str]) -> list[list[object]]:
    return [[_cell(key, view.get(key)) for key in keys] for view in views]


def contracts_table(views: Sequence[View]) -> Table:
    """LIST CONTRACTS."""
    keys = ("name", "status", "members", "active", "finished", "round")
    columns = ("Name", "Status", "Members", "Active", "Finished", "Round")
    return Table.of("Training contracts", columns, _rows(views, keys))


def contract_status_table(view: View) -> Table:
    """GET CONTRACT STATUS (the latest model flattened to its round and digest)."""
    latest = view.get("latest_model") or {}
    flat = {k: v for k, v in view.items() if k != "latest_model"}
    flat["latest_round"] = latest.get("round")
    flat["latest_digest"] = latest.get("digest")
    flat["latest_leader"] = latest.get("leader")
    return view_table(f"Contract {view.get('name')}", flat)


def perfdata_table(name: str, views: Sequence[View]) -> Table:
    """PERFDATA: one row per SL."""
    keys: tuple[str, ...] = ("uid", "admin", "status", "loss", "metric", "total_epochs", "completed_epochs")
    columns: tuple[str, ...] = (
        "UID",
        "SL ADMIN",
        "Status",
        "Loss",
        "Metric",
        "Total epochs",
        "Completed epochs",
    )
    if any(v.get("epsilon") is not None for v in views):  # differential privacy: epsilon spent so far
        keys, columns = (*keys, "epsilon"), (*columns, "Epsilon")
    keys, columns = (*keys, "updated_at"), (*columns, "Updated")
    if any(view.get("excluded") for view in views):  # rows a leader left out of a merge, and why
        keys, columns = (*keys, "excluded", "excluded_reason"), (*columns, "Excluded", "Last exclusion")
    return Table.of(f"Performance data of {name}", columns, _rows(views, keys))


def tasks_table(views: Sequence[View]) -> Table:
    """LIST TASKS."""
    keys = ("name", "type", "author", "prereq", "outcome", "finalized", "body_lines")
    columns = ("Name", "Type", "Author", "Prereq", "Outcome", "Finalized", "Body lines")
    return Table.of("Tasks", columns, _rows(views, keys))


def taskrunners_table(views: Sequence[View]) -> Table:
    """LIST TASKRUNNERS."""
    keys = ("name", "state", "task", "enrolled", "created_at")
    columns = ("Name", "State", "Task", "Enrolled SWOPs", "Created")
    return Table.of("Taskrunners", columns, _rows(views, keys))


def taskrunner_status_lines(view: View) -> list[str]:
    """The ``KEY : value`` lines of GET TASKRUNNER STATUS that scripts parse (``TASK_STATE : ...``)."""
    lines = [f"TASK_STATE : {view.get('state')}"]
    if view.get("error"):
        lines.append(f"ERROR : {view.get('error')}")
    return lines


def taskrunner_status_table(view: View) -> Table:
    """GET TASKRUNNER STATUS as a key/value table."""
    pairs = [
        ("TASK NAME", view.get("task") or ""),
        ("PEER TYPE", view.get("peer_type") or ""),
        ("TASK_STATE", view.get("state")),
        ("REQUIRED PEERS", view.get("required")),
        ("ACTIVE PEERS", view.get("active")),
        ("COMPLETED PEERS", view.get("completed")),
        ("FAILED PEERS", view.get("failed")),
        ("PENDING PEERS", view.get("pending")),
        ("ALLOCATION", _cell("allocation", view.get("allocation") or {})),
        ("ASSIGNED AT", fmt_time(view.get("assigned_at"))),
        ("UPDATED AT", fmt_time(view.get("updated_at"))),
        ("FINISHED AT", fmt_time(view.get("finished_at"))),
        ("ERROR", view.get("error") or ""),
    ]
    return kv_table(f"Taskrunner {view.get('name')}", pairs)


def taskrunner_peers_table(name: str, views: Sequence[View]) -> Table:
    """LIST TASKRUNNER PEERS: the enrolled SWOPs."""
    keys = ("index", "uid", "capacity", "group", "online", "enrolled_at")
    columns = ("Index", "SWOP UID", "SL capacity", "Group", "Online", "Enrolled")
    return Table.of(f"Peers of taskrunner {name}", columns, _rows(views, keys))


def peer_status_table(view: View) -> Table:
    """GET TASKRUNNER PEER STATUS: the peers one SWOP spawned."""
    keys = ("uid", "type", "status", "description", "exit_code", "updated_at")
    columns = ("UID", "Type", "Status", "Description", "Exit code", "Updated")
    title = f"SWOP {view.get('swop')} (index {view.get('index')})"
    return Table.of(title, columns, _rows(view.get("peers") or [], keys))


LIST_NODES_HEADER = "NODE TYPE, HOST IP, PORT, CONTAINER NAME, UUID, PARENT UUID, I-AM-ALIVE"


def node_lines(views: Sequence[View]) -> list[str]:
    """LIST NODES as the reference prints it: a header, then one comma-separated line per live node.

    Columns: node type (SENTINEL, SN, SWOP, SL), host, port, container name (``run-* --name``), UUID,
    parent UUID and the last "i-am-alive" time. Offline nodes are not listed.
    """
    lines = [LIST_NODES_HEADER]
    for view in views:
        if not view.get("online"):
            continue
        kind = "SENTINEL" if view.get("sentinel") else str(view.get("type") or "")
        host, port = _host_port(view)
        fields = (kind, host, port, view.get("name") or view.get("uid"), view.get("uid"), view.get("parent"))
        lines.append(", ".join(str(f or "") for f in fields) + f", {fmt_time(view.get('last_seen'))}")
    return lines


def _host_port(view: View) -> tuple[str, str]:
    address = str(view.get("address") or "")
    if "://" in address:
        host, _, port = address.split("://", 1)[1].rpartition(":")
        return host, port
    return str(view.get("host") or ""), ""
