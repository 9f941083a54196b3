"""Trials in the ledger (docs/ledger.md, "Trials"): plan, claims by slots, results, retries, liveness."""

from __future__ import annotations

from typing import Any

from contracts import views
from contracts.machine import changed_entities, receipt
from contracts.state import State
from tests.test_ledger_machine import TR, Sim, _assign, _swops, _task

GRID = [{"HIDDEN": h, "LR": lr} for h in (8, 16, 32) for lr in (0.05, 0.1)]


def _plan(sim: Sim, swop: str = "swop1", trials: list[dict[str, Any]] | None = None, **extra: Any) -> State:
    body = {"task": "grid", "taskrunner": TR, "kind": "GRID", "metric": "val_error", "trials": trials or GRID}
    return sim.ok("trial.plan", swop, {**body, **extra})


def _study(sim: Sim, swops: dict[str, int] | None = None, **plan: Any) -> None:
    _swops(sim, swops or {"swop1": 1, "swop2": 1})
    _task(sim, "grid", "RUN_TRIALS")
    _assign(sim, "grid", peers="ALL")
    _plan(sim, **plan)


def _claim(sim: Sim, swop: str, slot: str = "cpu0") -> dict[str, Any]:
    tx = sim.tx("trial.claim", swop, {"task": "grid", "slot": slot})
    sim.ok("trial.claim", swop, {"task": "grid", "slot": slot})
    return receipt(sim.state, tx)


def _result(sim: Sim, swop: str, claimed: dict[str, Any], status: str = "COMPLETED", **extra: Any) -> None:
    body = {"task": "grid", "trial": claimed["trial"], "attempt": claimed["attempt"], "status": status}
    if status == "COMPLETED":
        body["metrics"] = {"val_error": 0.5 - 0.01 * claimed["trial"]}
    sim.ok("trial.result", swop, {**body, **extra})


def test_a_plan_records_every_trial_pending_and_the_same_plan_again_is_a_no_op() -> None:
    sim = Sim()
    _study(sim)
    before = sim.state
    assert _plan(sim, "swop2") is before  # the other SWOP planned the same trials
    view = views.query(sim.state, "study", {"name": "grid"})
    assert [t["params"] for t in view["trials"]] == GRID
    assert view["counts"] == {"PENDING": 6, "RUNNING": 0, "COMPLETED": 0, "FAILED": 0}
    changed = GRID[:-1]
    reason = sim.no("trial.plan", "swop2", {"task": "grid", "taskrunner": TR, "kind": "GRID",
                                           "metric": "val_error", "trials": changed})  # fmt: skip
    assert "already planned, differently, by 'swop1'" in reason


def test_only_a_running_trials_task_of_an_assigned_swop_can_be_planned() -> None:
    sim = Sim()
    _swops(sim, {"swop1": 1, "swop2": 1})
    _task(sim, "grid", "RUN_TRIALS")
    body = {"task": "grid", "taskrunner": TR, "kind": "GRID", "metric": "val_error", "trials": GRID}
    assert "is not running task 'grid'; ASSIGN TASK grid first" in sim.no("trial.plan", "swop1", body)
    _assign(sim, "grid", peers=1)
    assert "SWOP 'swop2' has no part in task 'grid'" in sim.no("trial.plan", "swop2", body)
    assert "must come from a node of role swop" in sim.no("trial.plan", "swci", body)
    bad = {**body, "trials": [{"1abc": 1}]}
    assert "trial 0: parameter '1abc'" in sim.no("trial.plan", "swop1", bad)
    bad = {**body, "trials": [{"LR": float("nan")}]}
    assert "must be a number, true/false or a string" in sim.no("trial.plan", "swop1", bad)


def test_claims_hand_out_the_lowest_pending_trial_one_per_slot() -> None:
    sim = Sim()
    _study(sim)
    first = _claim(sim, "swop1", "cpu0")
    second = _claim(sim, "swop2", "cpu0")
    assert (first["trial"], second["trial"]) == (0, 1)
    assert first["params"] == GRID[0] and first["attempt"] == 1
    reason = sim.no("trial.claim", "swop1", {"task": "grid", "slot": "cpu0"})
    assert "slot 'cpu0' of SWOP 'swop1' already runs trial 0" in reason
    for slot in ("cpu1", "cpu2", "cpu3"):
        _claim(sim, "swop1", slot)
    assert _claim(sim, "swop1", "cpu4")["trial"] == 5
    assert "no trial of 'grid' is waiting to run (6 running)" in sim.no(
        "trial.claim", "swop2", {"task": "grid"}
    )


def test_results_complete_the_study_and_the_taskrunner_with_the_best_trial() -> None:
    sim = Sim()
    _study(sim)
    for _ in range(3):
        for swop in ("swop1", "swop2"):
            _result(sim, swop, _claim(sim, swop))
    assert sim.state.taskrunners[TR].state == "COMPLETE"
    assert "are no longer running" in sim.no("trial.claim", "swop1", {"task": "grid"})
    best = views.query(sim.state, "study.best", {"name": "grid"})
    assert best["best"]["index"] == 5 and best["best"]["params"] == GRID[5]
    brief = views.entity_view(sim.state, "study", "grid")
    assert brief is not None and brief["finished"] and brief["best"] == 5


def test_a_failed_run_is_retried_then_the_trial_fails_and_the_taskrunner_is_error() -> None:
    sim = Sim()
    _study(sim, {"swop1": 1}, trials=GRID[:2], retries=1)
    killed = _claim(sim, "swop1")
    _result(sim, "swop1", killed, "FAILED", exit_code=-9, description="killed by signal 9")
    trial = views.query(sim.state, "study", {"name": "grid", "detail": True})["trials"][0]
    assert trial["status"] == "PENDING" and trial["failures"] == 1 and trial["last_exit_code"] == -9
    again = _claim(sim, "swop1")
    assert again["trial"] == 0 and again["attempt"] == 2
    _result(sim, "swop1", again, "FAILED", exit_code=3, description="boom")
    assert sim.state.studies["grid"].trials[0].status == "FAILED"
    _result(sim, "swop1", _claim(sim, "swop1"))
    runner = sim.state.taskrunners[TR]
    assert runner.state == "ERROR"
    assert "1 of 2 trials of 'grid' FAILED after their retries" in runner.error
    assert "trial 0 (HIDDEN=8, LR=0.05) FAILED (exit code 3): boom" in runner.error


def test_a_result_must_come_from_the_running_attempt_and_carry_the_metric() -> None:
    sim = Sim()
    _study(sim)
    claimed = _claim(sim, "swop1")
    body = {"task": "grid", "trial": 0, "attempt": 1, "status": "COMPLETED", "metrics": {"val_error": 0.1}}
    assert "is not running as attempt 1 of 'swop2'" in sim.no("trial.result", "swop2", body)
    assert "is not running as attempt 2" in sim.no("trial.result", "swop1", {**body, "attempt": 2})
    no_metric = {**body, "metrics": {"acc": 0.9}}
    assert "without reporting the metric 'val_error'" in sim.no("trial.result", "swop1", no_metric)
    bad = {**body, "probabilities": [[0.5, 1.5]]}
    assert "probabilities between 0 and 1" in sim.no("trial.result", "swop1", bad)
    assert "has trials 0-5, not 9" in sim.no("trial.result", "swop1", {**body, "trial": 9})
    _result(sim, "swop1", claimed, probabilities=[[0.25, 0.75]], probes=[[0.0, 1.0, 2.0]])
    view = views.query(sim.state, "study", {"name": "grid", "detail": True})
    assert view["trials"][0]["probabilities"] == [[0.25, 0.75]]
    assert view["probes"] == [[0.0, 1.0, 2.0]]


def test_a_swop_going_offline_requeues_its_running_trials() -> None:
    sim = Sim()
    _study(sim)
    lost = _claim(sim, "swop1")
    sim.offline("swop1")
    trial = sim.state.studies["grid"].trials[lost["trial"]]
    assert trial.status == "PENDING"
    assert trial.attempts[-1].description == "SWOP swop1 went offline"
    assert _claim(sim, "swop2")["trial"] == lost["trial"]


def test_a_reset_taskrunner_stops_claims_and_a_new_assignment_plans_afresh() -> None:
    sim = Sim()
    _study(sim, {"swop1": 1}, trials=GRID[:1])
    _result(sim, "swop1", _claim(sim, "swop1"))
    assert sim.state.taskrunners[TR].state == "COMPLETE"
    sim.ok("taskrunner.reset", "swci", {"taskrunner": TR})
    assert "are no longer running" in sim.no("trial.claim", "swop1", {"task": "grid", "slot": "cpu0"})
    sim.tick()
    before = sim.state
    _assign(sim, "grid", peers="ALL")
    _plan(sim, trials=GRID[:2])
    assert [t.status for t in sim.state.studies["grid"].trials] == ["PENDING", "PENDING"]
    assert ("study", "grid") in changed_entities(before, sim.state)
