"""``bench/sched.py``: which process had the cores when, from ``perf sched timehist``."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import sched
from bench.sched import SchedError, Slice, Timeline, parse_timehist

TIMEHIST = """\
           time    cpu  task name                       wait time  sch delay   run time
                        [tid/pid]                          (msec)     (msec)     (msec)
--------------- ------  ------------------------------  ---------  ---------  ---------
   13555.903645 [0000]  perf[16884]                         0.000      0.000      0.010
   13555.904000 [0001]  <idle>                              0.000      0.000      1.000
   13555.905000 [0001]  swarm[16975/16974]                  0.609      0.391      2.000
   13555.906500 [0000]  kworker/u8:3-ex[2395]               0.000      0.000      0.500
"""


def test_timehist_lines_become_run_slices_of_processes_idle_left_out() -> None:
    assert parse_timehist(TIMEHIST) == [
        Slice(13555903635000, 13555903645000, 16884, "perf"),
        Slice(13555903000000, 13555905000000, 16974, "swarm"),  # a thread counts for its process
        Slice(13555906000000, 13555906500000, 2395, "kworker/u8:3-ex"),
    ]


def test_cpu_in_a_window_counts_only_the_overlap() -> None:
    slices = [
        Slice(0, 10_000_000, 1, "a"),
        Slice(5_000_000, 6_000_000, 2, "b"),
        Slice(20_000_000, 30_000_000, 1, "a"),
    ]
    timeline = Timeline(slices)
    assert timeline.cpu_in(4_000_000, 25_000_000) == {1: 11.0, 2: 1.0}
    assert timeline.cpu_in(11_000_000, 19_000_000) == {}
    assert timeline.cpu_in(10_000_000, 20_000_000) == {}  # slices that only touch it


def test_a_window_finds_the_slices_that_began_long_before_it_in_any_order() -> None:
    slices = [
        Slice(30_000_000, 31_000_000, 3, "c"),
        Slice(0, 100_000_000, 1, "a"),  # the longest: the window's slices started at most this long ago
        Slice(40_000_000, 41_000_000, 2, "b"),
    ]
    assert Timeline(slices).cpu_in(35_000_000, 45_000_000) == {1: 10.0, 2: 1.0}
    assert Timeline([]).cpu_in(0, 1) == {}


def test_without_perf_recording_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sched.shutil, "which", lambda name: None)
    with pytest.raises(SchedError, match="linux-perf"), sched.recording(tmp_path):
        pass
