"""Task definitions: create, append a body line, finalize (validated by ``taskdefs``), delete."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from contracts.state import State, Task, drop, put
from contracts.tx import RejectError, Tx

__all__ = ["ROOT_TASK", "BodyValidator", "append", "create", "delete", "finalize", "taskdefs_validator"]

ROOT_TASK = "ROOTTASK"

BodyValidator = Callable[[str, list[str]], object]


def taskdefs_validator(task_type: str, lines: list[str]) -> object:
    """Validate a task body with ``taskdefs.validate_task_body`` (imported when first needed).

    Raises:
        RejectError: when ``taskdefs`` is not available.
        ValueError: ``taskdefs.TaskDefError`` when the body is not valid.
    """
    try:
        from taskdefs import validate_task_body  # noqa: PLC0415 - taskdefs is optional until it lands
    except ImportError as exc:
        msg = f"task bodies cannot be validated here: taskdefs is unavailable ({exc})"
        raise RejectError(msg) from None
    return validate_task_body(task_type, lines)


def _task(state: State, name: str) -> Task:
    task = state.tasks.get(name)
    if task is None:
        raise RejectError(f"no task {name!r}; CREATE TASK it first (LIST TASKS shows the tasks)")
    return task


def _with_task(state: State, task: Task) -> State:
    return replace(state, tasks=put(state.tasks, task.name, task))


def create(state: State, tx: Tx) -> State:
    """``task.create``: register a task (not finalized; ``ROOTTASK`` of type ROOT is born final)."""
    body = tx.body
    name, task_type = body["name"], body["type"]
    if name in state.tasks:
        raise RejectError(f"task {name!r} already exists; DELETE TASK {name} first (if not finalized)")
    if (task_type == "ROOT") != (name == ROOT_TASK):
        raise RejectError(f"only {ROOT_TASK!r} has type ROOT; task {name!r} cannot be of type {task_type}")
    if task_type == "ROOT" and tx.role != "sn":
        raise RejectError(f"{ROOT_TASK!r} is created by the SN at genesis")
    lines = body["body"] or ()
    task = Task(
        name=name,
        type=task_type,
        author=body["author"],
        prereq=body["prereq"],
        outcome=body["outcome"],
        body=tuple((i + 1, line) for i, line in enumerate(lines)),
        finalized=task_type == "ROOT",
        created_at=tx.time,
        created_by=tx.sender,
        finalized_at=tx.time if task_type == "ROOT" else None,
    )
    return _with_task(state, task)


def append(state: State, tx: Tx) -> State:
    """``task.append``: set body line ``idx`` (≥ 1) of a task that is not finalized."""
    task = _task(state, tx.body["name"])
    if task.finalized:
        raise RejectError(f"task {task.name!r} is finalized; its body can no longer change")
    lines = dict(task.body)
    lines[tx.body["idx"]] = tx.body["line"]
    return _with_task(state, replace(task, body=tuple(sorted(lines.items()))))


def finalize(state: State, tx: Tx, validator: BodyValidator | None) -> State:
    """``task.finalize``: validate the body against its type's schema and freeze it."""
    task = _task(state, tx.body["name"])
    if task.finalized:
        raise RejectError(f"task {task.name!r} is already finalized")
    if validator is not None:
        _validate(task, validator)
    return _with_task(state, replace(task, finalized=True, finalized_at=tx.time))


def _validate(task: Task, validator: BodyValidator) -> None:
    if not task.body:
        raise RejectError(f"task {task.name!r} has no body; APPEND TASK BODY lines first")
    try:
        validator(task.type, task.lines)
    except RejectError:
        raise
    except ValueError as exc:  # taskdefs.TaskDefError: its text is written for the user
        raise RejectError(f"task {task.name!r} is not valid: {exc}") from None
    except Exception as exc:  # a bug in a validator must not take the ledger down
        msg = f"task {task.name!r} could not be validated ({type(exc).__name__}: {exc})"
        raise RejectError(msg) from None


def delete(state: State, tx: Tx) -> State:
    """``task.delete``: remove a task that is not finalized."""
    task = _task(state, tx.body["name"])
    if task.finalized:
        raise RejectError(f"task {task.name!r} is finalized and cannot be deleted")
    return replace(state, tasks=drop(state.tasks, task.name))
