"""Task definitions: the reference's task YAML files (``Name``, ``TaskType``, ..., ``Body``).

``load_task_definition`` reads a file, ``parse_task_definition`` a string; both check the header
and then the ``Body`` against the schema of its ``TaskType`` and report every problem with its
line and column. The ledger stores a task's body as lines of YAML: :func:`body_lines` writes them
and :func:`validate_task_body` / :func:`parse_task_body` read them back (pure and deterministic,
as the ledger's replayable state machine needs).
"""

from __future__ import annotations

import os
from typing import Literal

import yaml
from pydantic import Field, model_validator

from taskdefs.bodies import BODY_MODELS, TASK_TYPES, TaskBody
from taskdefs.errors import Issue, TaskDefError
from taskdefs.fields import FreeStr, StrictModel
from taskdefs.located import Located, load_located, read_text
from taskdefs.validation import raise_issues, validate_located

__all__ = [
    "TaskDefinition",
    "TaskType",
    "body_lines",
    "load_task_definition",
    "parse_task_body",
    "parse_task_definition",
    "validate_task_body",
]

TaskType = Literal[
    "RUN_SWARM", "MAKE_USER_CONTAINER", "MAKE_USER_ENV", "MAKE_SWARM_USER_CONTENT", "PULL_IMAGE", "RUN_TRIALS"
]

_WHAT = "a task definition: a mapping with keys Name, TaskType, Author, Prereq, Outcome, Body"
_BODY_SOURCE = "<task body>"


class _Header(StrictModel):
    """The top level of a task file, with the body still unchecked."""

    name: FreeStr = Field(alias="Name")
    task_type: TaskType = Field(alias="TaskType")
    author: FreeStr = Field(alias="Author")
    prereq: FreeStr = Field(alias="Prereq")
    outcome: FreeStr = Field(alias="Outcome")
    body: object = Field(alias="Body")


class TaskDefinition(StrictModel):
    """A valid task definition.

    Attributes:
        name: ``Name``, the task's name in the ledger.
        task_type: ``TaskType``.
        author: ``Author``.
        prereq: ``Prereq``, the task this one builds on (``ROOTTASK`` for none).
        outcome: ``Outcome``, the artifact it produces (an image tag, an environment name).
        body: ``Body``, the model of its type (``RunSwarmBody`` for ``RUN_SWARM`` ...).
    """

    name: FreeStr = Field(alias="Name")
    task_type: TaskType = Field(alias="TaskType")
    author: FreeStr = Field(alias="Author")
    prereq: FreeStr = Field(alias="Prereq")
    outcome: FreeStr = Field(alias="Outcome")
    body: TaskBody = Field(alias="Body")

    @model_validator(mode="after")
    def _body_matches_type(self) -> TaskDefinition:
        expected = BODY_MODELS[self.task_type]
        if not isinstance(self.body, expected):
            msg = f"a {self.task_type} task needs a {expected.__name__}"
            raise ValueError(msg)
        return self


def load_task_definition(path: str | os.PathLike[str]) -> TaskDefinition:
    """Read and validate a task definition file.

    Args:
        path: the YAML file; its name as given appears in every issue.

    Returns:
        The task definition.

    Raises:
        TaskDefError: the file cannot be read, is not YAML, or does not match the schema.
    """
    return parse_task_definition(read_text(path), source=os.fspath(path))


def parse_task_definition(text: str, source: str = "<string>") -> TaskDefinition:
    """Validate the text of a task definition (see :func:`load_task_definition`)."""
    located = load_located(text, source)
    header, issues = validate_located(_Header, located, what=_WHAT)
    body = _check_body(located, issues)
    raise_issues(issues)
    if header is None or body is None:  # pragma: no cover - issues were raised above
        raise TaskDefError.single(source, "invalid task definition")
    fields = header.model_dump(by_alias=True)
    fields["Body"] = body
    return TaskDefinition.model_validate(fields)


def _check_body(located: Located, issues: list[Issue]) -> TaskBody | None:
    data = located.data
    if not isinstance(data, dict) or "Body" not in data:
        return None
    task_type = data.get("TaskType")
    if not isinstance(task_type, str) or task_type not in BODY_MODELS:
        return None
    body_located = Located(located.source, data["Body"], located.marks, ("Body",))
    body, body_issues = validate_located(
        BODY_MODELS[task_type], body_located, what=f"the Body of a {task_type} task (a mapping)"
    )
    issues.extend(body_issues)
    return body


def body_lines(defn: TaskDefinition) -> list[str]:
    """The ``Body`` as YAML lines, in schema order; ``validate_task_body`` reads them back."""
    return _dump_body(defn.body)


def _dump_body(body: TaskBody) -> list[str]:
    data = body.model_dump(mode="json", by_alias=True)
    text = yaml.safe_dump(
        data, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1_000_000
    )
    return text.splitlines()


def parse_task_body(task_type: str, lines: list[str]) -> TaskBody:
    """Parse body lines (as :func:`body_lines` writes them) as the ``Body`` of ``task_type``.

    Pure and deterministic: no file system, clock or environment is read. Issues are located by
    line number within ``lines`` (line 1 is ``lines[0]``) and named ``<task body>``.

    Raises:
        TaskDefError: unknown task type, or a body that does not match its schema.
    """
    model = BODY_MODELS.get(task_type)
    if model is None:
        message = f"must be one of {', '.join(TASK_TYPES)}, got {task_type!r}"
        raise TaskDefError.single(_BODY_SOURCE, message, path="TaskType")
    located = load_located("\n".join(lines), _BODY_SOURCE, root=("Body",))
    body, issues = validate_located(model, located, what=f"the Body of a {task_type} task (a mapping)")
    raise_issues(issues)
    if body is None:  # pragma: no cover - issues were raised above
        raise TaskDefError.single(_BODY_SOURCE, "invalid task body")
    return body


def validate_task_body(task_type: str, lines: list[str]) -> TaskBody:
    """Check body lines for ``FINALIZE TASK``; returns the typed body (see ``parse_task_body``)."""
    return parse_task_body(task_type, lines)
