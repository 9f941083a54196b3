"""A round's steps timed on one node: one line per round, read back by ``bench/rounds.py``; and that
benchmark's round figures."""

from __future__ import annotations

import pytest

from bench.rounds import SwarmRun, round_latency, round_mean
from daemons.sl.roundtimes import RoundTimer, parse_steps


def test_a_round_is_reported_once_and_its_line_parses(caplog: pytest.LogCaptureFixture) -> None:
    timer = RoundTimer()
    timer.mark("hash")
    timer.mark("checkin")
    timer.mark("hash")  # a repeated step adds up
    with caplog.at_level("INFO", logger="swarm.sl.rounds.steps"):
        timer.report(7)
        timer.mark("early")
        timer.report(7)  # the early merge ended the round a moment after the ledger's round did
    assert len(caplog.records) == 1
    parsed = parse_steps(caplog.records[0].getMessage())
    assert parsed is not None
    number, steps = parsed
    assert number == 7 and list(steps) == ["hash", "checkin"]
    assert all(ms >= 0 for ms in steps.values())
    assert parse_steps("round x steps: hash=1ms") is None


def test_the_mean_round_counts_the_slow_round_the_median_leaves_out() -> None:
    # A round ends when the last node has its merged model: at 0.5, 1.5, 2.0 and 10.0 s.
    nodes = [{"done": [0.0, 1.0, 2.0, 10.0]}, {"done": [0.5, 1.5, 1.0, 9.0]}]
    assert round_latency(nodes) == pytest.approx(1.0)  # of 1.0, 0.5 and 8.0 s
    assert round_mean(nodes) == pytest.approx(9.5 / 3)


def _run(cpu_by_kind: dict[str, float] | None) -> SwarmRun:
    return SwarmRun([], 0.5, 0.1, 4.0, cpu_by_kind, {}, 8)


def test_the_cpu_of_a_round_is_told_in_all_and_by_kind_of_process() -> None:
    run = _run({"SN": 0.0046, "SLs": 0.0211, "mosquitto": 0.0011, "ML programs": 0.0031})
    assert run.cpu_per_round == pytest.approx(0.0299)
    note = run.per_round_note()
    assert note.startswith("CPU per round 30 ms, all processes together (SLs 21.1, ML programs 3.1, SN 4.6, ")
    assert "mosquitto 1.1; on " in note


def test_a_run_too_short_to_sample_says_so() -> None:
    run = _run(None)
    assert run.cpu_per_round is None
    assert run.per_round_note() == "CPU per round not sampled (the run was too short)"
