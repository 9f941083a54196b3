"""The search space of a ``RUN_TRIALS`` task (ours): grid, random, or bootstrap seeds for bagging.

:func:`expand_search` turns a ``Search`` into the list of trials, each a map of parameter name to
value; every parameter reaches the trial program as an environment variable of its name. The
``RUN_TRIALS`` body itself is :class:`taskdefs.bodies.RunTrialsBody`.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from taskdefs.fields import StrictModel
from taskdefs.validation import located_error

__all__ = [
    "MAX_TRIALS",
    "ParamRange",
    "SearchSpace",
    "TrialParams",
    "expand_search",
]

MAX_TRIALS = 10_000
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"

ParamName = Annotated[str, StringConstraints(pattern=_ENV_NAME)]
Scalar = bool | int | float | Annotated[str, StringConstraints(min_length=1, max_length=160)]
TrialParams = dict[str, bool | int | float | str]


class ParamRange(StrictModel):
    """A range to draw from (``RANDOM`` and ``BAGGING``): uniform, or log-uniform with ``Log``."""

    low: float = Field(alias="Low")
    high: float = Field(alias="High")
    log: bool = Field(default=False, alias="Log")
    integer: bool = Field(default=False, alias="Integer")

    @model_validator(mode="after")
    def _ordered(self) -> ParamRange:
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.low >= self.high:
            msg = f"Low must be below High (both finite numbers), got Low {self.low:g}, High {self.high:g}"
            raise ValueError(msg)
        if self.log and self.low <= 0:
            msg = f"a Log range needs Low > 0, got {self.low:g}"
            raise ValueError(msg)
        return self

    def draw(self, rng: random.Random) -> int | float:
        """One value of the range."""
        if self.integer:
            low, high = math.ceil(self.low), math.floor(self.high)
            if self.log:
                return min(high, max(low, round(math.exp(rng.uniform(math.log(low), math.log(high))))))
            return rng.randint(low, high)
        value = (
            math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
            if self.log
            else rng.uniform(self.low, self.high)
        )
        return float(f"{value:.6g}")


ParamSpec = Annotated[list[Scalar], Field(min_length=1, max_length=1000)] | ParamRange


class SearchSpace(StrictModel):
    """``Search``: which trials to run.

    ``GRID``: every combination of the ``Parameters`` lists. ``RANDOM``: ``Samples`` draws, each
    parameter from its list or range. ``BAGGING``: ``Samples`` bootstrap seeds (``SeedParameter``,
    default ``BOOTSTRAP_SEED``, is ``Seed``, ``Seed + 1``, ...), each with its own draw of the other
    parameters, as in a random search per bag. ``Repeats`` runs each trial that many times with
    ``SeedParameter`` (default ``TRIAL_SEED``) 0, 1, ...
    """

    kind: Literal["GRID", "RANDOM", "BAGGING"] = Field(alias="Kind")
    parameters: dict[ParamName, ParamSpec] | None = Field(default=None, alias="Parameters")
    samples: Annotated[int, Field(ge=1, le=MAX_TRIALS)] | None = Field(default=None, alias="Samples")
    repeats: Annotated[int, Field(ge=1, le=1000)] = Field(default=1, alias="Repeats")
    seed: int = Field(default=0, alias="Seed")
    seed_parameter: ParamName | None = Field(default=None, alias="SeedParameter")

    @model_validator(mode="after")
    def _consistent(self) -> SearchSpace:
        params = self.parameters or {}
        if self.kind == "GRID":
            if not params:
                raise located_error("a GRID search needs Parameters, each a list of values", ("Parameters",))
            ranged = [name for name, spec in params.items() if isinstance(spec, ParamRange)]
            if ranged:
                msg = f"a GRID search takes lists of values, not ranges; {ranged[0]} is a range"
                raise located_error(msg, ("Parameters", ranged[0]))
            if self.samples is not None:
                raise located_error("Samples is for RANDOM and BAGGING searches, not GRID", ("Samples",))
        elif self.samples is None:
            raise located_error(f"a {self.kind} search needs Samples (how many trials)", ("Samples",))
        if self.kind == "BAGGING" and self.repeats > 1:
            msg = "a BAGGING search draws one bootstrap seed per trial; use Samples, not Repeats"
            raise located_error(msg, ("Repeats",))
        if self.seed_parameter is not None and self.seed_parameter in params:
            msg = f"SeedParameter {self.seed_parameter} is also one of the Parameters"
            raise located_error(msg, ("SeedParameter",))
        count = self.count()
        if count > MAX_TRIALS:
            raise ValueError(f"this search makes {count} trials; at most {MAX_TRIALS} are allowed")
        return self

    @property
    def seed_name(self) -> str:
        """The parameter that carries a bootstrap seed or a repeat number."""
        if self.seed_parameter is not None:
            return self.seed_parameter
        return "BOOTSTRAP_SEED" if self.kind == "BAGGING" else "TRIAL_SEED"

    def count(self) -> int:
        """How many trials the search makes."""
        if self.kind == "GRID":
            sizes = [len(spec) for spec in (self.parameters or {}).values() if isinstance(spec, list)]
            return math.prod(sizes) * self.repeats
        return (self.samples or 0) * self.repeats


def _value(spec: list[bool | int | float | str] | ParamRange, rng: random.Random) -> bool | int | float | str:
    return spec.draw(rng) if isinstance(spec, ParamRange) else rng.choice(spec)


def _with_repeats(trials: list[TrialParams], search: SearchSpace) -> list[TrialParams]:
    if search.repeats == 1:
        return trials
    return [{**params, search.seed_name: r} for params in trials for r in range(search.repeats)]


def expand_search(search: SearchSpace) -> list[TrialParams]:
    """The trials of ``search`` in order; deterministic (random draws are seeded by ``Seed``)."""
    params = search.parameters or {}
    if search.kind == "GRID":
        lists = {name: spec for name, spec in params.items() if isinstance(spec, list)}
        combos = itertools.product(*lists.values())
        return _with_repeats([dict(zip(lists, combo, strict=True)) for combo in combos], search)
    rng = random.Random(search.seed)
    trials: list[TrialParams] = []
    for i in range(search.samples or 0):
        draw: TrialParams = {name: _value(spec, rng) for name, spec in params.items()}
        if search.kind == "BAGGING":
            draw = {search.seed_name: search.seed + i, **draw}
        trials.append(draw)
    return _with_repeats(trials, search)
