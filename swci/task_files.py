"""``CREATE TASK FROM <file>``: validate a task definition file, then register it with its body.

An init script may run again against the same ledger: a task that is registered already with the same
definition is accepted with a plain line (``Task <name> already registered and finalized with the same
body``). One registered with a different definition is refused, and the message says how to go on: a
task that is not finalized can be deleted and registered again; a finalized one can neither change nor
be deleted, so the new definition needs a new ``Name``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from daemons.bus import RemoteError
from daemons.ledger_client import Rejected
from swci.connection import LedgerLink
from swci.output import Result
from taskdefs import TaskDefError, body_lines, load_task_definition

__all__ = ["VALID_MESSAGE", "create_task_from", "definition_difference"]

VALID_MESSAGE = "Task definition is valid"
_HEADER = (("type", "TaskType"), ("author", "Author"), ("prereq", "Prereq"), ("outcome", "Outcome"))


async def create_task_from(link: LedgerLink, path: Path) -> Result:
    """Validate ``path`` with ``taskdefs`` and submit ``task.create`` with the body's lines.

    Prints ``Task definition is valid`` and ``Task Registered : <name>`` as the reference does; a file
    that is not valid fails with one ``file:line:col: path: message`` line per problem.
    """
    try:
        definition = load_task_definition(path)
    except TaskDefError as exc:
        return Result.failure(*(str(issue) for issue in exc.issues), data={"file": str(path)})
    body = {
        "name": definition.name,
        "type": definition.task_type,
        "author": definition.author,
        "prereq": definition.prereq,
        "outcome": definition.outcome,
        "body": body_lines(definition),
    }
    data = {"name": definition.name, "type": definition.task_type, "file": str(path)}
    registered = await _registered(link, definition.name)
    if registered is None:
        try:
            await link.submit("task.create", body)
        except Rejected:
            registered = await _registered(link, definition.name)  # created meanwhile by someone else
            if registered is None:
                raise
        else:
            return Result.success(VALID_MESSAGE, f"Task Registered : {definition.name}", data=data)
    return _compare(body, registered, path, data)


async def _registered(link: LedgerLink, name: str) -> dict[str, Any] | None:
    """The task's info and body lines, or None when no task has this name."""
    try:
        info = await link.query("task.info", name=name)
        body = await link.query("task.body", name=name)
    except RemoteError as exc:
        if exc.code == "not-found":
            return None
        raise
    return {**info, "body": list(body.get("lines") or [])}


def definition_difference(wanted: Mapping[str, Any], registered: Mapping[str, Any]) -> str | None:
    """What differs between a definition and a registered task (None when nothing does)."""
    for key, label in _HEADER:
        if wanted[key] != registered.get(key):
            return f"{label} is {registered.get(key)!r} in the ledger, {wanted[key]!r} in the file"
    return _body_difference(wanted["body"], registered.get("body") or [])


def _body_difference(wanted: Sequence[str], registered: Sequence[str]) -> str | None:
    for number, (ours, theirs) in enumerate(zip(wanted, registered, strict=False), start=1):
        if ours != theirs:
            return f"body line {number} is {theirs!r} in the ledger, {ours!r} in the file"
    if len(wanted) != len(registered):
        return f"the body has {len(registered)} lines in the ledger, {len(wanted)} in the file"
    return None


def _compare(wanted: Mapping[str, Any], registered: Mapping[str, Any], path: Path, data: Any) -> Result:
    name = wanted["name"]
    finalized = bool(registered.get("finalized"))
    difference = definition_difference(wanted, registered)
    if difference is None:
        state = "registered and finalized" if finalized else "registered (not finalized yet)"
        return Result.success(
            VALID_MESSAGE, f"Task {name} already {state} with the same body", data={**data, "existing": True}
        )
    if finalized:
        return Result.failure(
            f"task {name!r} is already registered and finalized with a different definition ({difference})",
            "a finalized task can neither change nor be deleted: give the new definition another Name "
            f"in {path} and use that name in FINALIZE TASK and ASSIGN TASK",
            data=data,
        )
    return Result.failure(
        f"task {name!r} is already registered (not finalized) with a different definition ({difference})",
        f"DELETE TASK {name}, then CREATE TASK FROM {path} again",
        data=data,
    )
