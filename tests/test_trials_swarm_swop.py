"""RUN_TRIALS with ``Mode: SWARM`` end to end: each trial of a grid is a whole swarm run of two SWOP hosts'
SL nodes in a training contract of its own, and its metrics are the mean over the nodes."""

from __future__ import annotations

import asyncio
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RunningSN
from tests.test_swarm_swop import ledger_of, register_task, run_task, wait_enrolled
from tests.test_trials_swop import swop_host

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "swarm_trial_program.py"


def write_swarm_trials_task(work: Path, envvars: str = "") -> Path:
    """A SWARM-mode RUN_TRIALS task of the tiny torch trial program over a 2-point grid of LR."""
    model = work / "model"
    model.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROGRAM, model / PROGRAM.name)
    task = f"""Name: sgrid
TaskType: RUN_TRIALS
Author: tests
Prereq: ROOTTASK
Outcome: sgrid
Body:
    Command: model/{PROGRAM.name}
    Entrypoint: python3
    WorkingDir: /tmp/strial
    Envvars: [MIN_PEERS: 2, EPOCHS: 1, BATCHES: 4{envvars}]
    PrivateContent: /tmp/strial/data
    SharedContent:
    -   Src: {model}
        Tgt: /tmp/strial/model
        MType: BIND
    Mode: SWARM
    Search:
        Kind: GRID
        Parameters:
            LR: [0.05, 0.5]
    Metric: val_error
    Retries: 1
"""
    path = work / "sgrid.yaml"
    path.write_text(task)
    return path


def test_a_swarm_mode_grid_runs_each_trial_as_a_swarm_of_two_swop_hosts(
    sn: RunningSN, tmp_path: Path
) -> None:
    hosts = [tmp_path / "host1", tmp_path / "host2"]
    swops = [swop_host(sn, host, f"swop-{i}", slots=1) for i, host in enumerate(hosts, start=1)]
    nodes = {"thost1sl1", "thost2sl1"}  # the profiles' slhostnames (swop_host: write_swarm_setup)
    task_file = write_swarm_trials_task(tmp_path)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], list[list[dict[str, Any]]]]:
        async with ledger_of(sn) as ledger:
            await wait_enrolled(ledger, 2)
            task = await register_task(ledger, task_file)
            status = await run_task(ledger, task, "ALL", timeout=60)  # type: ignore[arg-type]
            study = await ledger.query("study", name="sgrid", detail=True)
            members = [await ledger.query("contract.perfdata", name=t["contract"]) for t in study["trials"]]
            return status, study, members

    try:
        status, study, members = asyncio.run(scenario())
    finally:
        for swop in swops:
            swop.send_signal(signal.SIGTERM)
        for swop in swops:
            swop.wait(30)
    logs = [(h / "swop.out").read_text()[-3000:] for h in hosts]
    assert status["state"] == "COMPLETE", (status, logs)
    assert study["mode"] == "SWARM"
    trials = study["trials"]
    assert [t["params"] for t in trials] == [{"LR": 0.05}, {"LR": 0.5}]
    assert [t["contract"] for t in trials] == ["sgrid.trial0.a1", "sgrid.trial1.a1"]
    for trial, rows in zip(trials, members, strict=True):
        assert trial["status"] == "COMPLETED", trial
        assert set(trial["nodes"]) == nodes
        errors = [m["val_error"] for m in trial["nodes"].values()]
        assert trial["metrics"]["val_error"] == pytest.approx(sum(errors) / len(errors))
        assert trial["history"][0]["swops"] == ["swop-1", "swop-2"]
        assert {r["uid"] for r in rows} == nodes  # the nodes trained together in the trial's contract
        assert len(trial["probabilities"]) == 2
