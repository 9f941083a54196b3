"""``bench/chain.py``: the chain of a sync round by role, from stamps its tracer writes in the SLs."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import io
from pathlib import Path
from types import ModuleType

import pytest

from bench.chain import (
    TRACER,
    Traced,
    chain,
    cpu_by_role,
    cpu_report,
    read_pids,
    read_stamps,
    report,
    trace_rounds,
)
from bench.sched import Slice

MS = 1_000_000  # ns


def _tracer() -> ModuleType:
    """The tracer module itself (it installs nothing: SWARM_CHAIN_TRACE_DIR is not set here)."""
    spec = importlib.util.spec_from_file_location("chaintrace_sitecustomize", TRACER / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _round(start: int, leader_last: bool) -> dict[str, list[tuple[int, str]]]:
    """One round's stamps: sl1 leads, sl4 (or sl1 itself) asks last, at ``start`` ms."""
    last = "sl1" if leader_last else "sl4"
    first = [n for n in ("sl1", "sl2", "sl3", "sl4") if n != last]
    stamps: dict[str, list[tuple[int, str]]] = {n: [] for n in ("sl1", "sl2", "sl3", "sl4")}
    for offset, node in enumerate(first):
        stamps[node].append(((start - 5 + offset) * MS, "request+"))
    stamps[last].append((start * MS, "request+"))
    stamps["sl1"] += [((start + 2) * MS, "merge_early+"), ((start + 4) * MS, "merge_early-")]
    for node_stamps in stamps.values():
        node_stamps.append(((start + 10) * MS, "request-"))
    return stamps


def _rounds(kinds: list[bool | None]) -> dict[str, list[tuple[int, str]]]:
    """Rounds 100 ms apart; True: the leader asks last, False: a participant does, None: no early merge."""
    events: dict[str, list[tuple[int, str]]] = {}
    for number, leader_last in enumerate(kinds):
        one = _round(100 * number, bool(leader_last))
        if leader_last is None:
            one["sl1"] = [s for s in one["sl1"] if not s[1].startswith("merge_early")]
        for node, stamps in one.items():
            events.setdefault(node, []).extend(stamps)
    return events


def test_stamps_are_timed_from_the_last_request_by_role_and_kind_of_round() -> None:
    # rounds 0, 1 and the last two are left out; of rounds 2..5 one went on without an early merge
    stamps = chain(_rounds([False, False, False, True, None, False, False, False]))
    found = {(s.kind, s.role, s.label): (s.median_ms, s.rounds) for s in stamps}
    assert found[("participant last", "leader", "merge_early+#1")] == (2.0, 2)
    assert found[("participant last", "last", "request+#1")] == (0.0, 2)
    assert found[("participant last", "other", "request+#1")] == (-3.5, 2)  # sl2 at -4, sl3 at -3
    assert found[("participant last", "all", "last program answered")] == (10.0, 2)
    assert found[("leader last", "leader", "merge_early-#1")] == (4.0, 1)
    assert ("leader last", "last", "request+#1") not in found  # the leader is the last there
    text = report(stamps)
    assert "rounds with the leader last (1)" in text and "rounds with the participant last (2)" in text
    assert chain({}) == []


def test_stamps_are_read_per_node_from_the_tracers_files(tmp_path: Path) -> None:
    (tmp_path / "sl-2-4242.txt").write_text("30 request-\n10 request+\n")
    (tmp_path / "sl1-7.txt").write_text("5 hash+\n")
    assert read_stamps(tmp_path) == {"sl-2": [(10, "request+"), (30, "request-")], "sl1": [(5, "hash+")]}
    assert read_pids(tmp_path) == {4242: "sl-2", 7: "sl1"}


def test_cpu_is_added_up_by_role_in_the_two_parts_of_a_round() -> None:
    # round 2 of _rounds: sl4 asks last at 200 ms, sl1 leads and has its merge at 204 ms, all answered at 210
    events = _rounds([False, False, False, False, False])
    pids = {11: "sl1", 12: "sl2", 13: "sl3", 14: "sl4"}
    slices = [
        Slice(200 * MS, 204 * MS, 11, "swarm"),  # the leader, until its merge
        Slice(204 * MS, 206 * MS, 14, "swarm"),  # the last to ask, in the hand-over
        Slice(206 * MS, 207 * MS, 99, "swarm"),  # the SN (a swarm process that is no SL)
        Slice(207 * MS, 208 * MS, 50, "python3"),  # a program
        Slice(208 * MS, 209 * MS, 1, "mosquitto"),
        Slice(0, 1, 7, "perf"),
        Slice(10_000 * MS, 10_000 * MS + 1, 7, "perf"),  # the recording covers every round
    ]
    rows = {(part, role): ms for kind, part, role, ms in cpu_by_role(Traced(events, pids, slices), own_pid=7)}
    assert rows[("to the merge", "leader SL")] == 4.0
    assert rows[("the hand-over", "last SL")] == 2.0
    assert rows[("the hand-over", "SN")] == 1.0 and rows[("the hand-over", "programs")] == 1.0
    assert rows[("the hand-over", "mosquitto")] == 1.0
    assert "CPU ms a round, all cores (perf sched), rounds with the participant last:" in cpu_report(
        cpu_by_role(Traced(events, pids, slices), own_pid=7)
    )


def test_every_traced_coroutine_exists_so_a_rename_breaks_here_not_the_trace() -> None:
    tracer = _tracer()
    for module_name, class_name, attribute, _ in tracer.TRACED:
        module = importlib.import_module(module_name)
        owner = module if class_name is None else getattr(module, class_name)
        where = f"{module_name} {class_name}.{attribute}"
        assert inspect.iscoroutinefunction(getattr(owner, attribute)), where


def test_the_tracer_stamps_a_coroutines_start_and_end_and_picks_only_sl_processes() -> None:
    tracer = _tracer()
    out = io.StringIO()

    async def work(value: int) -> int:
        await asyncio.sleep(0)
        return value * 2

    assert asyncio.run(tracer._stamped(work, "merge", out)(21)) == 42
    lines = [line.split() for line in out.getvalue().splitlines()]
    assert [label for _, label in lines] == ["merge+", "merge-"] and int(lines[0][0]) <= int(lines[1][0])
    assert tracer._node_name(["/venv/bin/swarm", "sl", "--name", "sl3", "--ml-w", "x"]) == "sl3"
    others = (["/venv/bin/swarm", "sn", "--name", "sn-1"], ["python", "-c", "x"], ["swarm", "sl", "--name"])
    for argv in others:
        assert tracer._node_name(argv) is None


@pytest.mark.slow
def test_a_short_traced_run_stamps_every_sls_requests() -> None:
    traced = trace_rounds(0.2, 6, 0.0)
    events = traced.events
    assert sorted(events) == ["sl1", "sl2", "sl3", "sl4"] and sorted(traced.pids.values()) == sorted(events)
    assert traced.slices is None  # no perf sched unless asked for
    for stamps in events.values():
        labels = [label for _, label in stamps]
        assert labels.count("request+") >= 6 and labels.count("hash-") >= 6
    assert {s.role for s in chain(events)} <= {"leader", "last", "other", "all"}
