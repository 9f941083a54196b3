"""The fault matrix's clock (``bench/faults.py``): when the programs loaded merges, and the longest wait
for one across a fault."""

from __future__ import annotations

import math
from datetime import datetime

from bench.faults import AFTER_MERGES, longest_wait, merges_by_round, usual_gap


def _line(stamp: str, number: int) -> str:
    return f"{stamp} : SwarmCallback : INFO : Finished Swarm merging round {number} (model 0123abcd)"


def _at(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_merges_by_round_takes_each_rounds_first_load_from_relayed_and_own_logs() -> None:
    relayed = "\n".join(
        [
            f"2026-11-27 05:00:00,900 sl-1 INFO ml | {_line('2026-11-27 05:00:00,500', 1)}",
            f"2026-11-27 05:00:01,900 sl-1 INFO ml | {_line('2026-11-27 05:00:01,400', 2)}",
        ]
    )
    own = "\n".join([_line("2026-11-27 05:00:00,600", 1), _line("2026-11-27 05:00:01,300", 2), "other"])
    found = merges_by_round([relayed, own])
    assert found == {1: _at("2026-11-27 05:00:00,500"), 2: _at("2026-11-27 05:00:01,300")}


def test_the_longest_wait_spans_the_fault_and_the_merges_after_it() -> None:
    merged = [0.0, 1.0, 2.0, 2.5, 8.5, 9.0, 30.0]  # fault at 2.2: round in flight merges, next waits
    assert AFTER_MERGES == 3
    assert longest_wait(merged, 2.2) == 6.0  # 2.0 → 2.5 → 8.5 → 9.0; not the 21 s after the third
    assert usual_gap(merged, 2.2) == 1.0  # 1, 1 before it; 21 from its third merge after on
    assert longest_wait(merged, 8.7, from_fault=True) == 21.0  # counted from 8.7: 0.3, then 21
    assert math.isnan(longest_wait([0.0, 1.0, 2.0], 2.2))  # none after it
    assert usual_gap([0.0, 0.4, 9.0, 9.5, 10.0], 0.2) == 0.5  # one merge before it: the gaps after
    assert math.isnan(usual_gap([5.0], 9.0))
