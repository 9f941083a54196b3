"""Field types shared by task definitions and SWOP profiles.

``StrictModel`` is the base of every schema: unknown keys are rejected, YAML types are taken as
written (``"5"`` is not an integer, ``2.7`` is not a string) and parsed models are immutable.
"""

from __future__ import annotations

import datetime
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, StringConstraints

from taskdefs.validation import describe, located_error

__all__ = [
    "ENV_NAME",
    "PLACEHOLDER",
    "AbsPath",
    "EnvList",
    "FreeStr",
    "MountType",
    "OptionalEnvList",
    "PathStr",
    "StrictModel",
    "find_placeholder",
    "reject_placeholder",
]

PLACEHOLDER = re.compile(r"<[A-Za-z][A-Za-z0-9 _.\-]*>")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

MountType = Literal["BIND", "VOLUME"]


class StrictModel(BaseModel):
    """Base of the schemas: no unknown keys, no type coercion, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def find_placeholder(value: str) -> str | None:
    """The first ``<PLACEHOLDER>`` left in ``value`` (as in the reference examples), if any."""
    match = PLACEHOLDER.search(value)
    return match.group(0) if match else None


def reject_placeholder(value: str) -> str:
    """Fail when ``value`` still holds a placeholder such as ``<PROJECT-MODEL>``."""
    placeholder = find_placeholder(value)
    if placeholder is not None:
        msg = (
            f"placeholder {placeholder} was not replaced; put the real value here "
            f"(the reference examples replace it with sed before use)"
        )
        raise ValueError(msg)
    return value


def _absolute(value: str) -> str:
    if not value.startswith("/"):
        msg = f"must be an absolute path (starting with '/'), got {value!r}"
        raise ValueError(msg)
    return value


FreeStr = Annotated[str, StringConstraints(min_length=1, max_length=160)]
PathStr = Annotated[str, StringConstraints(min_length=2, max_length=160), AfterValidator(reject_placeholder)]
AbsPath = Annotated[PathStr, AfterValidator(_absolute)]


def _env_value(value: object, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return str(value)
    if isinstance(value, datetime.date):
        return value.isoformat()
    msg = f"value must be a string, number, boolean or null, got {describe(value)}"
    raise located_error(msg, (name,))


def _env_pair(entry: object) -> tuple[str, str | None]:
    if not isinstance(entry, dict) or len(entry) != 1:
        got = f"{len(entry)} keys" if isinstance(entry, dict) else describe(entry)
        msg = f"must be a single NAME: value pair (one per '- ' item), got {got}"
        raise located_error(msg)
    ((name, value),) = entry.items()
    if not ENV_NAME.match(name):
        msg = (
            f"{name!r} is not a valid environment variable name "
            "(letters, digits and '_', not starting with a digit)"
        )
        raise located_error(msg, (name,))
    return name, _env_value(value, name)


def _task_env_pair(entry: object) -> tuple[str, str]:
    name, value = _env_pair(entry)
    return name, "" if value is None else value


def _env_items(value: object) -> object:
    if isinstance(value, dict):
        return [{name: item} for name, item in value.items()]
    if not isinstance(value, list):
        msg = (
            f"must be null or a list of NAME: value pairs, e.g. "
            f'["MODEL_DIR": model, "MAX_EPOCHS": 2], got {describe(value)}'
        )
        raise located_error(msg)
    return value


EnvList = Annotated[
    list[Annotated[tuple[str, str], BeforeValidator(_task_env_pair)]],
    BeforeValidator(_env_items),
]
"""Task ``Envvars``: ordered ``(name, value)`` pairs; scalars become strings, null becomes ``""``."""

OptionalEnvList = Annotated[
    list[Annotated[tuple[str, str | None], BeforeValidator(_env_pair)]],
    BeforeValidator(_env_items),
]
"""Profile ``envvars``: ordered ``(name, value)`` pairs; a null value means "unset"."""
