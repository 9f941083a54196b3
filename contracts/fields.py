"""Checks for the fields of transaction bodies: each returns the normalised value or raises FieldError."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "NAME_PATTERN",
    "BadValue",
    "REQUIRED",
    "Check",
    "Field",
    "FieldError",
    "boolean",
    "check_fields",
    "digest",
    "integer",
    "layout",
    "lines",
    "name",
    "number",
    "one_of",
    "optional",
    "plain_map",
    "text",
    "uid_list",
]

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_MAX_LINES = 10_000
_MAX_LINE = 8192
_MAX_UIDS = 10_000

Check = Callable[[Any], Any]


class FieldError(ValueError):
    """A field that is missing, of the wrong type or out of range; ``path`` names it."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"field {path!r} {problem}")
        self.path = path
        self.problem = problem


class _Required:
    """Marker for a field without a default."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a body: its check and its default (``REQUIRED`` when it has none)."""

    check: Check
    default: Any = REQUIRED


def _got(value: Any) -> str:
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"got {type(value).__name__} {shown}"


class BadValue(ValueError):
    """What is wrong with a value, without the field's name (``check_fields`` adds the name)."""


def check_fields(body: Mapping[str, Any], fields: Mapping[str, Field], prefix: str = "") -> dict[str, Any]:
    """Check every field of ``body``; return the normalised body with defaults filled in."""
    unknown = sorted(str(key) for key in body if key not in fields)
    if unknown:
        raise FieldError(prefix + unknown[0], f"is not a field of this body (fields: {', '.join(fields)})")
    out: dict[str, Any] = {}
    for key, spec in fields.items():
        path = prefix + key
        if key not in body:
            if spec.default is REQUIRED:
                raise FieldError(path, "is missing")
            out[key] = spec.default
            continue
        try:
            out[key] = spec.check(body[key])
        except BadValue as exc:
            raise FieldError(path, str(exc)) from None
        except FieldError as exc:
            raise FieldError(path + "." + exc.path, exc.problem) from None
    return out


def name(value: Any) -> str:
    """A name of a contract, task, taskrunner or node (the uid pattern)."""
    if not isinstance(value, str) or not NAME_PATTERN.match(value):
        raise BadValue(
            "must be a name of letters, digits, '.', '_' or '-' (at most 128, starting with a "
            f"letter or digit), {_got(value)}"
        )
    return value


def text(max_len: int = 160) -> Check:
    """A string of at most ``max_len`` characters."""

    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise BadValue(f"must be a string, {_got(value)}")
        if len(value) > max_len:
            raise BadValue(f"must be at most {max_len} characters, got {len(value)}")
        return value

    return check


def integer(low: int, high: int = 2**53) -> Check:
    """An integer in ``[low, high]`` (booleans are not integers here)."""

    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadValue(f"must be an integer, {_got(value)}")
        if not low <= value <= high:
            raise BadValue(f"must be between {low} and {high}, got {value}")
        return value

    return check


def number(low: float = 0.0, *, finite: bool = True) -> Check:
    """A number ≥ ``low``, returned as float; NaN and infinities only when ``finite`` is false."""

    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BadValue(f"must be a number, {_got(value)}")
        out = float(value)
        if not math.isfinite(out):
            if finite:
                raise BadValue(f"must be a finite number, got {out}")
            return out
        if out < low:
            raise BadValue(f"must be at least {low}, got {out}")
        return out

    return check


def boolean(value: Any) -> bool:
    """True or false."""
    if not isinstance(value, bool):
        raise BadValue(f"must be true or false, {_got(value)}")
    return value


def one_of(*choices: str, fold: bool = False) -> Check:
    """One of ``choices``; with ``fold`` the comparison ignores case and returns the canonical form."""
    canon = {c.upper() if fold else c: c for c in choices}

    def check(value: Any) -> str:
        key = value.upper() if fold and isinstance(value, str) else value
        if not isinstance(value, str) or key not in canon:
            raise BadValue(f"must be one of {', '.join(choices)}, {_got(value)}")
        return canon[key]

    return check


def optional(check: Check) -> Check:
    """Nil or what ``check`` accepts."""

    def wrapped(value: Any) -> Any:
        return None if value is None else check(value)

    return wrapped


def digest(value: Any) -> str:
    """A model digest: a hex string (1-128 characters), or raw bytes that are stored as hex."""
    if isinstance(value, bytes) and 0 < len(value) <= 64:
        return value.hex()
    if isinstance(value, str) and 0 < len(value) <= 128:
        try:
            bytes.fromhex(value)
        except ValueError:
            raise BadValue(f"must be a hex digest, {_got(value)}") from None
        return value.lower()
    raise BadValue(f"must be a hex digest string (or up to 64 raw bytes), {_got(value)}")


def uid_list(value: Any) -> tuple[str, ...]:
    """A non-empty list of distinct node uids."""
    if not isinstance(value, list) or not value:
        raise BadValue(f"must be a non-empty list of node uids, {_got(value)}")
    if len(value) > _MAX_UIDS:
        raise BadValue(f"must hold at most {_MAX_UIDS} uids, got {len(value)}")
    out = tuple(name(item) for item in value)
    if len(set(out)) != len(out):
        raise BadValue("must not name a node twice")
    return out


def lines(value: Any) -> tuple[str, ...]:
    """A list of body lines (strings)."""
    if not isinstance(value, list):
        raise BadValue(f"must be a list of lines, {_got(value)}")
    if len(value) > _MAX_LINES:
        raise BadValue(f"must hold at most {_MAX_LINES} lines, got {len(value)}")
    line_check = text(_MAX_LINE)
    for i, item in enumerate(value):
        try:
            line_check(item)
        except BadValue as exc:
            raise BadValue(f"line {i + 1} {exc}") from None
    return tuple(value)


Layout = tuple[tuple[str, str, tuple[int, ...]], ...]
_MAX_TENSORS = 100_000


def layout(value: Any) -> Layout:
    """A model's layout: a list of ``[tensor name, dtype, shape]``."""
    if not isinstance(value, list) or len(value) > _MAX_TENSORS:
        raise BadValue(
            f"must be a list of at most {_MAX_TENSORS} [name, dtype, shape] entries, {_got(value)}"
        )
    out = []
    for i, item in enumerate(value):
        if not (
            isinstance(item, list)
            and len(item) == 3
            and isinstance(item[0], str)
            and isinstance(item[1], str)
        ):
            raise BadValue(f"entry {i} must be [name, dtype, shape], {_got(item)}")
        shape = item[2]
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise BadValue(
                f"entry {i} ({item[0]!r}) must have a shape of non-negative integers, {_got(shape)}"
            )
        out.append((item[0][:_MAX_LINE], item[1][:16], tuple(shape)))
    return tuple(out)


def plain_map(value: Any) -> dict[str, Any]:
    """A map with string keys (already bounded by the envelope codec)."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise BadValue(f"must be a map with string keys, {_got(value)}")
    return value
