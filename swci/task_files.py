"""``CREATE TASK FROM <file>``: validate a task definition file, then register it with its body."""

from __future__ import annotations

from pathlib import Path

from swci.connection import LedgerLink
from swci.output import Result
from taskdefs import TaskDefError, body_lines, load_task_definition

__all__ = ["VALID_MESSAGE", "create_task_from"]

VALID_MESSAGE = "Task definition is valid"


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
    await link.submit("task.create", body)
    data = {"name": definition.name, "type": definition.task_type, "file": str(path)}
    return Result.success(VALID_MESSAGE, f"Task Registered : {definition.name}", data=data)
