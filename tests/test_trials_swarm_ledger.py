"""SWARM-mode trials in the ledger (docs/ledger.md, "Trials"): one whole swarm run per trial, in a
training contract of its own, joined by every SWOP, completed by all their results, retried afresh."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contracts import views
from contracts.machine import receipt
from contracts.trials import mean_metrics
from swci.trial_plots import write_plots
from swci.trials import trials_summary, trials_table
from tests.test_ledger_machine import TR, Sim, _assign, _swops, _task

GRID = [{"LR": 0.05}, {"LR": 0.1}]
SWOPS = ("swop1", "swop2")


def _study(sim: Sim, retries: int = 1) -> None:
    _swops(sim, {"swop1": 1, "swop2": 1})
    _task(sim, "grid", "RUN_TRIALS")
    _assign(sim, "grid", peers="ALL")
    body = {"task": "grid", "taskrunner": TR, "kind": "GRID", "mode": "SWARM", "metric": "val_error"}
    sim.ok("trial.plan", "swop1", {**body, "retries": retries, "trials": GRID})


def _claim(sim: Sim, swop: str) -> dict[str, Any]:
    body = {"task": "grid", "slot": "swarm"}
    tx = sim.tx("trial.claim", swop, body)
    sim.ok("trial.claim", swop, body)
    return receipt(sim.state, tx)


def _node(swop: str) -> str:
    return f"sl{swop[-1]}"  # the role of a test uid is its letters


def _train(sim: Sim, claimed: dict[str, Any], *swops: str) -> None:
    """The SWOPs' nodes register and join the attempt's contract, as their SLs do."""
    for swop in swops:
        sim.register(_node(swop), parent=swop)
        sim.join(_node(swop), claimed["contract"])


def _result(sim: Sim, swop: str, claimed: dict[str, Any], status: str = "COMPLETED", **extra: Any) -> None:
    body = {"task": "grid", "trial": claimed["trial"], "attempt": claimed["attempt"], "status": status}
    if status == "COMPLETED":
        body["nodes"] = {_node(swop): {"val_error": 0.2 if swop == "swop1" else 0.4, "loss": 1.0}}
    sim.ok("trial.result", swop, {**body, **extra})


def _trial(sim: Sim, index: int = 0) -> dict[str, Any]:
    return dict(views.query(sim.state, "study", {"name": "grid", "detail": True})["trials"][index])


def test_the_first_claim_starts_the_trial_and_creates_its_contract_and_every_swop_joins_it() -> None:
    sim = Sim()
    _study(sim)
    first = _claim(sim, "swop1")
    assert (first["trial"], first["attempt"], first["params"]) == (0, 1, GRID[0])
    assert first["contract"] == "grid.trial0.a1"
    contract = sim.state.contracts["grid.trial0.a1"]
    assert contract.status == "UNINITIALIZED" and contract.created_by == "swop1"
    second = _claim(sim, "swop2")
    assert second == first  # the other SWOP joins the same attempt: one trial at a time
    assert "already takes part in trial 0 (attempt 1)" in sim.no("trial.claim", "swop1", {"task": "grid"})
    attempt = _trial(sim)["history"][0]
    assert attempt["swops"] == ["swop1", "swop2"] and [p["swop"] for p in attempt["parts"]] == list(SWOPS)


def test_the_trial_completes_when_every_swop_reported_with_the_mean_over_nodes() -> None:
    sim = Sim()
    _study(sim)
    claimed = _claim(sim, "swop1")
    _claim(sim, "swop2")
    _train(sim, claimed, *SWOPS)
    _result(sim, "swop1", claimed, probabilities=[[0.25, 0.75]])
    assert _trial(sim)["status"] == "RUNNING"  # swop2's node is still training
    assert "already takes part" in sim.no("trial.claim", "swop1", {"task": "grid"})
    _result(sim, "swop2", claimed)
    trial = _trial(sim)
    assert trial["status"] == "COMPLETED"
    assert trial["metrics"] == {"loss": 1.0, "val_error": 0.30000000000000004}
    assert trial["nodes"] == {"sl1": {"val_error": 0.2, "loss": 1.0}, "sl2": {"val_error": 0.4, "loss": 1.0}}
    assert trial["probabilities"] == [[0.25, 0.75]]
    assert trial["history"][0]["description"] == "val_error=0.3, the mean over 2 node(s)"
    nxt = _claim(sim, "swop2")
    assert (nxt["trial"], nxt["contract"]) == (1, "grid.trial1.a1")
    assert _claim(sim, "swop1") == nxt
    _train(sim, nxt, *SWOPS)
    for swop in SWOPS:
        _result(sim, swop, nxt)
    assert sim.state.taskrunners[TR].state == "COMPLETE"
    best = views.query(sim.state, "study.best", {"name": "grid"})
    assert best["best"]["index"] == 0 and best["best"]["contract"] == "grid.trial0.a1"


def test_list_and_plot_trials_read_a_swarm_mode_study_as_a_local_one(tmp_path: Path) -> None:
    sim = Sim()
    _study(sim)
    for _ in GRID:
        claimed = _claim(sim, "swop1")
        _claim(sim, "swop2")
        _train(sim, claimed, *SWOPS)
        _result(sim, "swop1", claimed, probabilities=[[0.25, 0.75]], probes=[[0.0, 1.0]])
        _result(sim, "swop2", claimed)
    view = views.query(sim.state, "study", {"name": "grid"})
    assert (
        trials_summary(view) == "Trials of grid (GRID, finished): 2 completed, 0 running, 0 pending, 0 failed"
    )
    table = trials_table(view)
    assert table.columns == ("Trial", "LR", "Status", "Attempts", "SWOP", "Slot", "val_error")
    assert table.rows[0] == ("0*", "0.05", "COMPLETED", 1, "swop1", "swarm", "0.3")
    detail = views.query(sim.state, "study", {"name": "grid", "detail": True})
    written = write_plots(detail, tmp_path)
    assert [p.name for p in written] == ["grid-val_error-by-parameter.png", "grid-prediction-certainty.png"]


def test_a_failed_node_fails_the_attempt_which_is_retried_in_a_fresh_contract() -> None:
    sim = Sim()
    _study(sim, retries=1)
    claimed = _claim(sim, "swop1")
    _claim(sim, "swop2")
    _train(sim, claimed, *SWOPS)
    _result(sim, "swop2", claimed, "FAILED", exit_code=3, description="node sl2: exit code 3")
    trial = _trial(sim)
    assert trial["status"] == "PENDING" and trial["failures"] == 1 and trial["last_exit_code"] == 3
    assert trial["last_error"] == "SWOP swop2: node sl2: exit code 3"
    late = {"task": "grid", "trial": 0, "attempt": 1, "status": "COMPLETED", "nodes": {"sl1": {}}}
    assert "no running part of 'swop1' in attempt 1" in sim.no("trial.result", "swop1", late)
    again = _claim(sim, "swop1")
    assert (again["trial"], again["attempt"], again["contract"]) == (0, 2, "grid.trial0.a2")
    _claim(sim, "swop2")
    _train(sim, again, *SWOPS)
    for swop in SWOPS:
        _result(sim, swop, again)
    trial = _trial(sim)
    assert trial["status"] == "COMPLETED" and trial["attempts"] == 2
    assert trial["contract"] == "grid.trial0.a2"


def test_a_node_outside_the_trials_contract_or_without_the_metric_fails_the_attempt() -> None:
    sim = Sim()
    _study(sim, retries=1)
    claimed = _claim(sim, "swop1")
    _claim(sim, "swop2")
    sim.register(_node("swop1"), parent="swop1")
    sim.join(_node("swop1"))  # the default contract: its program ignored trial_contract()
    _result(sim, "swop1", claimed)
    assert "never joined the trial's contract 'grid.trial0.a1'" in _trial(sim)["last_error"]
    again = _claim(sim, "swop1")
    _claim(sim, "swop2")
    _train(sim, again, *SWOPS)
    _result(sim, "swop1", again, nodes={"sl1": {"acc": 0.9}})
    assert "node sl1 did not report the metric 'val_error'" in _trial(sim)["last_error"]
    assert sim.state.studies["grid"].trials[0].status == "FAILED"


def test_a_swop_going_offline_fails_the_running_attempt_and_the_retry_runs_without_it() -> None:
    sim = Sim()
    _study(sim)
    claimed = _claim(sim, "swop1")
    _claim(sim, "swop2")
    sim.offline("swop2")
    trial = _trial(sim)
    assert trial["status"] == "PENDING" and trial["last_error"] == "SWOP swop2 went offline"
    again = _claim(sim, "swop1")
    assert again["attempt"] == 2 and again["contract"] != claimed["contract"]
    assert "is not one of the SWOPs" in sim.no("trial.claim", "swop2", {"task": "grid"}, role="swop")
    _train(sim, again, "swop1")
    _result(sim, "swop1", again)
    assert _trial(sim)["status"] == "COMPLETED"


def test_a_contract_name_taken_gets_a_suffix() -> None:
    sim = Sim()
    _study(sim)
    sim.ok("contract.create", "swci", {"name": "grid.trial0.a1"})
    assert _claim(sim, "swop1")["contract"] == "grid.trial0.a1-2"


def test_mean_metrics_keeps_the_metrics_every_node_reported() -> None:
    assert mean_metrics({"b": {"x": 1.0, "y": 2.0}, "a": {"x": 3.0}}) == {"x": 2.0}
