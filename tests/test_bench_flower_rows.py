"""The Flower comparison's rows: ours against Flower and against the same programs alone."""

from __future__ import annotations

import math

from bench.flower_compare import Outcome, _failed, rows_for


def _outcome(wall: float, accuracy: float = 0.986) -> Outcome:
    return Outcome(wall_s=wall, round_s=wall / 10, first_round_s=wall / 3, accuracy=accuracy,
                   extra={"complete_s": wall + 1})  # fmt: skip


def test_the_programs_alone_are_a_share_of_flowers_time_and_a_row_of_their_own() -> None:
    rows = {
        r["benchmark"].split(" (")[0]: r
        for r in rows_for(_outcome(22.6), _outcome(90.4), _outcome(21.1), 5, 1)
    }
    wall = rows["vs Flower: wall time to a tested final model"]
    assert math.isclose(wall["ratio"], 22.6 / 90.4)
    assert "the same programs alone took 21.1 s, 0.233 of Flower's" in wall["note"]
    alone = rows["vs the same programs alone: wall time to a tested final model"]
    assert alone["value"] == 22.6 and alone["baseline_value"] == 21.1
    assert "SWARM_LOOPBACK=true" in alone["baseline"]
    assert alone["target"] == ""


def test_a_side_that_failed_is_named_in_every_row() -> None:
    alone = _failed(RuntimeError("alone0 exited"))
    rows = rows_for(_outcome(22.6), _outcome(90.4), alone, 5, 1)
    assert all("alone FAILED: RuntimeError: alone0 exited" in r["note"] for r in rows)
    assert math.isnan(rows[1]["baseline_value"])
