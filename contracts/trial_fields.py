"""Bodies of the trial transactions (``trial.plan``, ``trial.claim``, ``trial.result``) and their checks."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from contracts import fields as f

__all__ = [
    "CLAIM",
    "MAX_PARAMS",
    "MAX_PLAN",
    "PLAN",
    "RESULT",
    "Scalar",
    "metrics",
    "node_metrics",
    "params",
]

MAX_PLAN = 10_000
MAX_PARAMS = 64
MAX_METRICS = 32
MAX_NODES = 64
MAX_PROBE_ROWS = 16
MAX_PROBE_COLS = 1024
_PARAM = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")

Scalar = bool | int | float | str


def _got(value: Any) -> str:
    shown = repr(value)
    return f"got {type(value).__name__} {shown[:37] + '...' if len(shown) > 40 else shown}"


def _key(key: Any, what: str) -> str:
    if not isinstance(key, str) or not _PARAM.match(key):
        raise f.BadValue(
            f"{what} names must be letters, digits and '_' (not starting with a digit), {_got(key)}"
        )
    return key


def _scalar(value: Any) -> Scalar:
    if isinstance(value, bool | int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, str) and 0 < len(value) <= 160:
        return value
    raise f.BadValue(f"must be a number, true/false or a string of 1-160 characters, {_got(value)}")


def params(value: Any) -> dict[str, Scalar]:
    """One trial's parameters: a map of at most 64 names to numbers, booleans or short strings."""
    if not isinstance(value, dict) or len(value) > MAX_PARAMS:
        raise f.BadValue(f"must be a map of at most {MAX_PARAMS} parameters, {_got(value)}")
    out: dict[str, Scalar] = {}
    for key, item in value.items():
        try:
            out[_key(key, "parameter")] = _scalar(item)
        except f.BadValue as exc:
            raise f.BadValue(f"parameter {key!r} {exc}") from None
    return out


def _plan(value: Any) -> tuple[dict[str, Scalar], ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_PLAN:
        raise f.BadValue(f"must be a list of 1-{MAX_PLAN} trials (parameter maps), {_got(value)}")
    out = []
    for i, item in enumerate(value):
        try:
            out.append(params(item))
        except f.BadValue as exc:
            raise f.BadValue(f"trial {i}: {exc}") from None
    return tuple(out)


def metrics(value: Any) -> dict[str, float]:
    """Reported metrics: a map of at most 32 names to finite numbers."""
    if not isinstance(value, dict) or len(value) > MAX_METRICS:
        raise f.BadValue(f"must be a map of at most {MAX_METRICS} metrics, {_got(value)}")
    out: dict[str, float] = {}
    for key, item in value.items():
        name = _key(key, "metric")
        if isinstance(item, bool) or not isinstance(item, int | float) or not math.isfinite(item):
            raise f.BadValue(f"metric {name!r} must be a finite number, {_got(item)}")
        out[name] = float(item)
    return out


def node_metrics(value: Any) -> dict[str, dict[str, float]]:
    """What each SL node of a ``SWARM``-mode trial reported: node uid -> metrics (at most 64 nodes)."""
    if not isinstance(value, dict) or len(value) > MAX_NODES:
        raise f.BadValue(f"must be a map of at most {MAX_NODES} node names to metrics, {_got(value)}")
    out: dict[str, dict[str, float]] = {}
    for uid, item in value.items():
        try:
            out[f.name(uid)] = metrics(item)
        except f.BadValue as exc:
            raise f.BadValue(f"node {uid!r}: {exc}") from None
    return out


def _matrix(value: Any, what: str) -> tuple[tuple[float, ...], ...]:
    if not isinstance(value, list) or len(value) > MAX_PROBE_ROWS:
        raise f.BadValue(f"must be a list of at most {MAX_PROBE_ROWS} rows ({what}), {_got(value)}")
    rows = []
    for i, row in enumerate(value):
        if not isinstance(row, list) or not 0 < len(row) <= MAX_PROBE_COLS:
            raise f.BadValue(f"row {i} must be a list of 1-{MAX_PROBE_COLS} numbers, {_got(row)}")
        if not all(not isinstance(x, bool) and isinstance(x, int | float) and math.isfinite(x) for x in row):
            raise f.BadValue(f"row {i} must hold finite numbers only")
        rows.append(tuple(float(x) for x in row))
    return tuple(rows)


def probabilities(value: Any) -> tuple[tuple[float, ...], ...]:
    """Predicted class probabilities of the probe samples: one row per sample, values in [0, 1]."""
    rows = _matrix(value, "one per probe sample")
    if any(not 0.0 <= x <= 1.0 for row in rows for x in row):
        raise f.BadValue("must hold probabilities between 0 and 1")
    return rows


def probes(value: Any) -> tuple[tuple[float, ...], ...]:
    """The probe samples themselves (flattened images, say), for plots."""
    return _matrix(value, "one per probe sample")


_TASK = {"task": f.Field(f.name)}

PLAN: Mapping[str, f.Field] = {
    **_TASK,
    "taskrunner": f.Field(f.name),
    "kind": f.Field(f.one_of("GRID", "RANDOM", "BAGGING")),
    "mode": f.Field(f.one_of("LOCAL", "SWARM"), "LOCAL"),
    "metric": f.Field(lambda v: _key(v, "metric")),
    "goal": f.Field(f.one_of("MINIMIZE", "MAXIMIZE"), "MINIMIZE"),
    "retries": f.Field(f.integer(0, 10), 1),
    "trials": f.Field(_plan),
}
CLAIM: Mapping[str, f.Field] = {**_TASK, "slot": f.Field(f.text(64), "")}
RESULT: Mapping[str, f.Field] = {
    **_TASK,
    "trial": f.Field(f.integer(0, MAX_PLAN - 1)),
    "attempt": f.Field(f.integer(1, 100)),
    "status": f.Field(f.one_of("COMPLETED", "FAILED")),
    "metrics": f.Field(metrics, {}),
    "nodes": f.Field(node_metrics, {}),
    "probabilities": f.Field(probabilities, ()),
    "probes": f.Field(probes, ()),
    "exit_code": f.Field(f.optional(f.integer(-(2**31), 2**31)), None),
    "description": f.Field(f.text(2000), ""),
}
