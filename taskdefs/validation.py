"""Validate located YAML data with a pydantic model and turn its errors into located issues.

Validators in ``taskdefs`` raise :func:`located_error` when the problem sits deeper than the field
being validated (an item of ``Envvars``, the ``idx`` of one node); its ``subpath`` is appended to
the error's location. Discriminated-union tags named in :data:`UNION_TAGS` are dropped from
locations, so every path shown is a path in the user's file.
"""

from __future__ import annotations

import datetime
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, PydanticCustomError

from taskdefs.errors import Issue, TaskDefError
from taskdefs.located import KeyPath, Located, format_path

__all__ = [
    "CUSTOM_ERROR",
    "UNION_TAGS",
    "describe",
    "field_keys",
    "located_error",
    "raise_issues",
    "validate_located",
]

CUSTOM_ERROR = "taskdef"
UNION_TAGS = frozenset({"(credentials)", "(config file)"})

ModelT = TypeVar("ModelT", bound=BaseModel)


def located_error(message: str, subpath: KeyPath = ()) -> PydanticCustomError:
    """An error for a validator to raise, placed ``subpath`` below the field it validates."""
    return PydanticCustomError(CUSTOM_ERROR, "{message}", {"message": message, "subpath": subpath})


def describe(value: object) -> str:
    """Say what a YAML value is, for messages: ``integer 2``, ``null``, ``a list``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"number {value}"
    if isinstance(value, str):
        shown = value if len(value) <= 60 else value[:57] + "..."
        return repr(shown)
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, datetime.date):
        return f"date {value.isoformat()}"
    return f"a value of type {type(value).__name__}"


def _quote_hint(value: object) -> str:
    scalar = isinstance(value, (bool, int, float, datetime.date))
    return " (put it in quotes to make it a string)" if scalar else ""


def field_keys(info: FieldInfo, name: str) -> list[str]:
    """All keys that name a field in YAML (alias, validation aliases, else the attribute name)."""
    keys: list[str] = []
    alias = info.validation_alias
    choices = getattr(alias, "choices", None)
    if isinstance(alias, str):
        keys.append(alias)
    elif choices is not None:
        keys.extend(choice for choice in choices if isinstance(choice, str))
    if info.alias and info.alias not in keys:
        keys.insert(0, info.alias)
    return keys or [name]


def _models_in(annotation: object) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in typing.get_args(annotation):
        yield from _models_in(arg)


def _model_at(root: type[BaseModel], loc: KeyPath) -> type[BaseModel] | None:
    current = root
    for part in loc:
        if isinstance(part, int):
            continue
        found = next(
            (info for name, info in current.model_fields.items() if part in field_keys(info, name)),
            None,
        )
        if found is None:
            return None
        models = list(dict.fromkeys(_models_in(found.annotation)))
        if len(models) != 1:
            return None
        current = models[0]
    return current


def _field_at(root: type[BaseModel], loc: KeyPath) -> FieldInfo | None:
    model = _model_at(root, loc[:-1])
    if model is None or not loc or not isinstance(loc[-1], str):
        return None
    for name, info in model.model_fields.items():
        if loc[-1] in field_keys(info, name):
            return info
    return None


def _allows_none(info: FieldInfo | None) -> bool:
    if info is None:
        return False
    origin = typing.get_origin(info.annotation)
    is_union = origin is typing.Union or origin is types.UnionType
    return is_union and type(None) in typing.get_args(info.annotation)


def _valid_keys(root: type[BaseModel], parent: KeyPath) -> str:
    model = _model_at(root, parent)
    if model is None:
        return ""
    names = [field_keys(info, name)[0] for name, info in model.model_fields.items()]
    return f"; valid keys are: {', '.join(names)}"


def _literal_message(ctx: Mapping[str, Any], value: object) -> str:
    expected = str(ctx.get("expected", "")).replace("'", "")
    if "," in expected:
        expected = "one of " + expected
    return f"must be {expected}, got {describe(value)}"


def _length_message(kind: str, ctx: Mapping[str, Any], value: object) -> str:
    if kind == "string_too_short":
        minimum = ctx.get("min_length", 1)
        return "must not be empty" if minimum == 1 else f"must be at least {minimum} characters"
    if kind == "string_too_long":
        size = len(value) if isinstance(value, str) else "more"
        return f"must be at most {ctx.get('max_length')} characters, got {size}"
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length')} item(s), got {ctx.get('actual_length')}"
    return f"must have at most {ctx.get('max_length')} items, got {ctx.get('actual_length')}"


_TYPE_WORDS = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping of keys to values",
    "model_type": "a mapping of keys to values",
    "model_attributes_type": "a mapping of keys to values",
}


def _message(err: ErrorDetails) -> str:
    kind, value = err["type"], err.get("input")
    ctx: Mapping[str, Any] = err.get("ctx") or {}
    if kind in _TYPE_WORDS:
        hint = _quote_hint(value) if kind == "string_type" else ""
        return f"must be {_TYPE_WORDS[kind]}, got {describe(value)}{hint}"
    if kind in {"literal_error", "enum"}:
        return _literal_message(ctx, value)
    if kind in {"string_too_short", "string_too_long", "too_short", "too_long"}:
        return _length_message(kind, ctx, value)
    if kind in {"greater_than_equal", "greater_than"}:
        return f"must be at least {ctx.get('ge', ctx.get('gt'))}, got {describe(value)}"
    if kind in {"less_than_equal", "less_than"}:
        return f"must be at most {ctx.get('le', ctx.get('lt'))}, got {describe(value)}"
    if kind in {"value_error", "assertion_error"}:
        return str(ctx.get("error", err["msg"]))
    return err["msg"]


class _Translator:
    """Turns one pydantic error into one issue located in ``located``."""

    def __init__(self, located: Located, model: type[BaseModel], what: str) -> None:
        self.located = located
        self.model = model
        self.what = what

    def issue(self, err: ErrorDetails) -> Issue:
        loc: KeyPath = tuple(part for part in err["loc"] if part not in UNION_TAGS)
        ctx = err.get("ctx") or {}
        if err["type"] == CUSTOM_ERROR:
            loc += tuple(ctx.get("subpath", ()))
        if err["type"] == "missing":
            return self._missing(loc)
        shown, found = self.located.resolve(loc)
        message = self._text(err, loc)
        return self._at(found, shown, message)

    def _missing(self, loc: KeyPath) -> Issue:
        shown, found = self.located.resolve(loc[:-1])
        key = loc[-1] if loc else "?"
        message = f"missing required key '{key}'"
        if _allows_none(_field_at(self.model, loc)):
            message += f" (write '{key}: ~' when there is none)"
        return self._at(found, shown, message)

    def _text(self, err: ErrorDetails, loc: KeyPath) -> str:
        if err["type"] == "extra_forbidden":
            return f"unknown key '{loc[-1]}'{_valid_keys(self.model, loc[:-1])}"
        if not loc and err["type"] in {"model_type", "dict_type"}:
            if err.get("input") is None:
                return f"empty; expected {self.what}"
            return f"expected {self.what}, got {describe(err.get('input'))}"
        return _message(err)

    def _at(self, found: KeyPath, shown: KeyPath, message: str) -> Issue:
        line, column = self.located.mark(found)
        return Issue(self.located.source, line, column, format_path(shown), message)


def validate_located(
    model: type[ModelT],
    located: Located,
    *,
    what: str,
    context: Mapping[str, object] | None = None,
) -> tuple[ModelT | None, list[Issue]]:
    """Validate ``located.data`` with ``model``; collect every error as a located issue.

    Args:
        model: the pydantic model of the document (or of the part at ``located.root``).
        located: the data with its marks.
        what: what the whole document should be, for the message when it is not a mapping.
        context: pydantic validation context (e.g. the profile's directory).

    Returns:
        The model (``None`` when invalid) and the issues.
    """
    try:
        return model.model_validate(located.data, context=dict(context or {})), []
    except ValidationError as exc:
        translator = _Translator(located, model, what)
        return None, [translator.issue(err) for err in exc.errors(include_url=False)]


def raise_issues(issues: list[Issue]) -> None:
    """Raise ``TaskDefError`` when there is any issue."""
    if issues:
        raise TaskDefError(issues)
