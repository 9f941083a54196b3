"""For a program run as a trial of a ``RUN_TRIALS`` task: read its parameters, report its results.

``trial_params()`` gives the trial's parameters (each is also an environment variable of its name);
``report_trial({"val_error": 0.03}, probabilities=...)`` writes the results the SWOP records in the
ledger. Outside a trial, ``report_trial`` only prints them, so the same program runs on its own.
In a ``Mode: SWARM`` trial, ``trial_contract()`` names the training contract the nodes of that trial
train under: pass it to ``SwarmCallback(..., trainingContract=trial_contract())``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_CONTRACT", "report_trial", "trial_contract", "trial_params"]

DEFAULT_CONTRACT = "defaultbb.cqdb.sml.hpe"


def trial_params() -> dict[str, Any]:
    """The parameters of this trial (empty outside a trial)."""
    raw = os.environ.get("SWARM_TRIAL_PARAMS")
    return dict(json.loads(raw)) if raw else {}


def trial_contract(default: str = DEFAULT_CONTRACT) -> str:
    """The training contract of this ``Mode: SWARM`` trial (``default`` outside one)."""
    return os.environ.get("SWARM_TRIAL_CONTRACT") or default


def _rows(values: Sequence[Sequence[float]] | None) -> list[list[float]]:
    return [[float(x) for x in row] for row in values or []]


def report_trial(
    metrics: Mapping[str, float],
    *,
    probabilities: Sequence[Sequence[float]] | None = None,
    probes: Sequence[Sequence[float]] | None = None,
) -> None:
    """Report this trial's results.

    Args:
        metrics: finite numbers by name; the task's ``Metric`` must be among them.
        probabilities: the predicted class probabilities of a few probe samples (one row each), for
            the certainty plot of a bagged ensemble (``PLOT TRIALS``).
        probes: those probe samples themselves (flattened, e.g. an 8x8 image as 64 numbers).

    Raises:
        ValueError: a metric that is not a finite number.
    """
    clean = {str(name): float(value) for name, value in metrics.items()}
    bad = [name for name, value in clean.items() if not math.isfinite(value)]
    if bad:
        raise ValueError(f"report_trial: metric {bad[0]!r} is {clean[bad[0]]}, not a finite number")
    report = {"metrics": clean, "probabilities": _rows(probabilities), "probes": _rows(probes)}
    target = os.environ.get("SWARM_TRIAL_RESULT")
    if not target:
        print("trial result:", json.dumps(clean, sort_keys=True), flush=True)
        return
    path = Path(target)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(report))
    partial.replace(path)
