"""Task commands: register, fill, freeze and inspect task definitions."""

from __future__ import annotations

from swci.argtypes import ArgKind, IntType
from swci.commands import (
    AppendTaskBody,
    CreateTask,
    CreateTaskFrom,
    DeleteTask,
    FinalizeTask,
    GetTaskBody,
    GetTaskInfo,
    ListTasks,
)
from swci.grammar import args
from swci.pattern import Arg, Rest
from swci.registry import Family, Values, command

__all__: list[str] = []

_FAMILY = Family.TASKS


@command(
    ("CREATE", "TASK"),
    family=_FAMILY,
    grammar=(
        Arg("task_type", ArgKind.TASK_TYPE, "type", "the task type"),
        args.task(),
        Arg("author", ArgKind.TEXT, "author", "the author"),
        Arg("prereq", ArgKind.TASK, "prereq", "the prerequisite task (ROOTTASK for none)"),
        Arg("outcome", ArgKind.TEXT, "outcome", "the outcome"),
    ),
    summary="Register an empty task; fill it with APPEND TASK BODY",
    help=(
        "Registers a task with an empty body. The type is one of RUN_SWARM, "
        "MAKE_USER_CONTAINER, PULL_IMAGE or MAKE_SWARM_USER_CONTENT; the prerequisite is "
        "another task's name or ROOTTASK. Add the body with APPEND TASK BODY, then "
        "FINALIZE TASK. CREATE TASK FROM does all of this from a YAML file."
    ),
    examples=("CREATE TASK RUN_SWARM train_task alice build_task train_task",),
)
def _create_task(values: Values) -> CreateTask:
    return CreateTask(
        values.text("task_type"),
        values.text("name"),
        values.text("author"),
        values.text("prereq"),
        values.text("outcome"),
    )


@command(
    ("CREATE", "TASK", "FROM"),
    family=_FAMILY,
    grammar=(args.path(ArgKind.FILE, "file", "the task definition file"),),
    summary="Register a task from a YAML task definition",
    help=(
        "Validates a YAML task definition and registers the task with its body. A relative "
        "path is relative to the current directory (see CD). The task still needs "
        "FINALIZE TASK before it can be assigned."
    ),
    examples=("CREATE TASK FROM taskdefs/swarm_mnist_task.yaml",),
)
def _create_task_from(values: Values) -> CreateTaskFrom:
    return CreateTaskFrom(values.text("path"))


@command(
    ("APPEND", "TASK", "BODY"),
    family=_FAMILY,
    grammar=(
        args.task(),
        Arg("index", ArgKind.NUMBER, "index", "the line number", IntType(1)),
        Rest("line", "line", "the body line"),
    ),
    summary="Add or replace one line of a task's body",
    help=(
        "Sets line <index> (1 or more) of a task's body, before FINALIZE TASK. The line is "
        "the rest of the command line, taken as typed ('#' included); enclose it in quotes "
        "to keep leading spaces."
    ),
    examples=("APPEND TASK BODY build_task 1 FROM python:3.11-slim",),
)
def _append_task_body(values: Values) -> AppendTaskBody:
    return AppendTaskBody(values.text("name"), values.integer("index"), values.text("line"))


@command(
    ("DELETE", "TASK"),
    family=_FAMILY,
    grammar=(args.task(),),
    summary="Delete a task that is not finalized",
    help="Deletes a task; finalized tasks cannot be deleted.",
    examples=("DELETE TASK train_task",),
)
def _delete_task(values: Values) -> DeleteTask:
    return DeleteTask(values.text("name"))


@command(
    ("FINALIZE", "TASK"),
    family=_FAMILY,
    grammar=(args.task(),),
    summary="Freeze a task's body so that it can be assigned",
    help="Freezes a task's body; after this the task can be assigned but no longer changed.",
    examples=("FINALIZE TASK train_task",),
)
def _finalize_task(values: Values) -> FinalizeTask:
    return FinalizeTask(values.text("name"))


@command(
    ("GET", "TASK", "BODY"),
    family=_FAMILY,
    grammar=(args.task(),),
    summary="Show a task's body",
    help="Shows the consolidated body of a task.",
    examples=("GET TASK BODY train_task",),
)
def _get_task_body(values: Values) -> GetTaskBody:
    return GetTaskBody(values.text("name"))


@command(
    ("GET", "TASK", "INFO"),
    family=_FAMILY,
    grammar=(args.task(),),
    summary="Show a task's information",
    help="Shows a task's type, author, prerequisite, outcome and state.",
    examples=("GET TASK INFO train_task",),
)
def _get_task_info(values: Values) -> GetTaskInfo:
    return GetTaskInfo(values.text("name"))


@command(
    ("LIST", "TASKS"),
    family=_FAMILY,
    summary="List the registered tasks",
    help="Lists every registered task, ROOTTASK included.",
    examples=("LIST TASKS",),
)
def _list_tasks(values: Values) -> ListTasks:
    return ListTasks()
