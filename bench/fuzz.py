"""Fuzzing at scale: every trust-boundary target of ``tests/test_fuzz_boundaries.py``, 100,000+ cases in all.

``make test`` runs those targets briefly through hypothesis's engine. Here each target's strategies are
fed random bytes through hypothesis's ``fuzz_one_input`` (the entry point meant for external fuzzers:
the same strategies, without the engine's bookkeeping), until the target has run its share of the cases.
A crash (an exception other than the boundary's own error) or a hang (a case over
``SWARM_FUZZ_HANG_SECONDS``) stops that target and fills the failure row with the exception.

The baseline of each row is the number of cases asked for; the total is compared with the minimum the
issue sets per ``make bench`` run.

Run: ``.venv/bin/python bench/fuzz.py [total-cases]``.
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_parser, make_row, positive_int, print_rows
from tests import test_fuzz_boundaries as fuzz

__all__ = ["run"]

MIN_TOTAL = 100_000
INPUT_BYTES = 4096  # enough choice bytes for the largest input any target draws
MAX_TRIES_PER_CASE = 4  # random bytes that run out before an input is drawn count as a try, not a case


def targets() -> dict[str, Callable[..., Any]]:
    """The fuzz targets by test name: every hypothesis test of the module, not the watchdog's own tests."""
    return {
        name: test
        for name, test in vars(fuzz).items()
        if name.startswith("test_") and hasattr(test, "hypothesis")
    }


@dataclass
class Outcome:
    """What one target did: its name (as the test module counts it), cases run, seconds, any failure."""

    name: str
    cases: int = 0
    seconds: float = 0.0
    failure: str | None = None


def run_target(test: Callable[..., Any], cases: int, rng: random.Random) -> Outcome:
    """Feed ``test`` random inputs until it ran ``cases`` of them, or crashed, or hung."""
    fuzz_one = test.hypothesis.fuzz_one_input  # type: ignore[attr-defined]
    before = Counter(fuzz.CASES)
    outcome = Outcome(test.__name__)
    started = time.perf_counter()
    for _ in range(cases * MAX_TRIES_PER_CASE):
        if outcome.cases >= cases:
            break
        try:
            fuzz_one(rng.randbytes(INPUT_BYTES))
        except Exception as exc:  # a crash or a hang: the point of the exercise
            outcome.failure = f"{type(exc).__name__}: {exc}"
        grown = fuzz.CASES - before
        if grown:
            (outcome.name, outcome.cases), *_ = grown.items()
        if outcome.failure:
            break
    outcome.seconds = time.perf_counter() - started
    return outcome


def run(total: int = MIN_TOTAL, seed: int = 0) -> list[dict[str, Any]]:
    """Rows: cases per target, all cases, targets that crashed or hung."""
    found = targets()
    per_target = math.ceil(total / len(found))
    rng = random.Random(seed)
    rows, failures, all_cases, wall = [], [], 0, 0.0
    for test in found.values():
        done = run_target(test, per_target, rng)
        all_cases, wall = all_cases + done.cases, wall + done.seconds
        rate = f"{done.cases / max(done.seconds, 1e-9):,.0f} cases/s"
        note = rate + (f"; FAILED: {done.failure}" if done.failure else "")
        rows.append(
            make_row(f"fuzz: {done.name}", done.cases, "cases", "cases asked for", per_target, note=note)
        )
        if done.failure:
            failures.append(f"{done.name}: {done.failure}"[:300])
    rows.append(
        make_row(
            f"fuzz: cases over {len(found)} trust-boundary targets",
            all_cases,
            "cases",
            "the issue's minimum per make bench run",
            MIN_TOTAL,
            target=f"value >= {MIN_TOTAL}",
            note=f"{wall:.0f} s, {all_cases / max(wall, 1e-9):,.0f} cases/s (seed {seed})",
        )
    )
    rows.append(
        make_row(
            "fuzz: targets with a crash or a hang",
            len(failures),
            "targets",
            "targets run",
            len(found),
            target="value <= 0",
            note="; ".join(failures) or "none",
        )
    )
    return rows


def main() -> None:
    """Print the rows."""
    parser = bench_parser(__doc__)
    parser.add_argument(
        "cases", nargs="?", type=positive_int, default=MIN_TOTAL,
        help="how many cases in all (default %(default)s)",
    )  # fmt: skip
    print_rows("fuzzing", run(parser.parse_args().cases))


if __name__ == "__main__":
    main()
