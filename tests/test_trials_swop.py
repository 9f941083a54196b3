"""RUN_TRIALS end to end: a grid spread over two SWOP hosts' CPU slots, a killed trial retried, swci."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RunningSN
from tests.swarm_helpers import start_swop, write_swarm_setup
from tests.test_swarm_swop import ledger_of, register_task, run_task, wait_enrolled

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "trial_program.py"


def write_trials_task(work: Path, search: str, *, hold: float = 0.0) -> Path:
    """A RUN_TRIALS task of the numpy trial program with ``search`` (YAML lines under Search:)."""
    model = work / "model"
    model.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROGRAM, model / PROGRAM.name)
    task = f"""Name: grid
TaskType: RUN_TRIALS
Author: tests
Prereq: ROOTTASK
Outcome: grid
Body:
    Command: model/{PROGRAM.name}
    Entrypoint: python3
    WorkingDir: /tmp/trial
    Envvars: [STEPS: 40, HOLD: {hold}]
    PrivateContent: /tmp/trial/data
    SharedContent:
    -   Src: {model}
        Tgt: /tmp/trial/model
        MType: BIND
    Search:
{search}
    Metric: val_error
    Retries: 1
"""
    path = work / "grid.yaml"
    path.write_text(task)
    return path


def swop_host(sn: RunningSN, work: Path, uid: str, slots: int) -> subprocess.Popen[bytes]:
    """A SWOP with a one-node profile (its private data) and ``slots`` CPU slots, in ``work``."""
    work.mkdir(parents=True)
    profile = write_swarm_setup(work, 1, {})
    return start_swop(sn, profile, work, uid=uid, SWOP_CPU_SLOTS=str(slots), CUDA_VISIBLE_DEVICES="")


def kill_first_trial(hosts: list[Path], timeout: float = 60) -> int:
    """SIGKILL the first trial process that wrote its pid; returns the trial's index."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for host in hosts:
            runs = host / "swop-work" / "runs" / "grid"
            for pid_file in sorted(runs.glob("trial-*/attempt-1/**/pid")):
                text = pid_file.read_text().strip()
                if text:
                    os.kill(int(text), signal.SIGKILL)
                    return int(pid_file.relative_to(runs).parts[0].removeprefix("trial-"))
        time.sleep(0.05)
    raise AssertionError("no trial process started")


def swci(sn: RunningSN, *commands: str) -> subprocess.CompletedProcess[str]:
    args = ["-e", f"CREATE CONTEXT t WITH IP 127.0.0.1 {sn.port}", "-e", "SWITCH CONTEXT t"]
    for command in commands:
        args += ["-e", command]
    return subprocess.run(
        [sys.executable, "-m", "swci.main", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_a_grid_over_two_swop_hosts_completes_with_a_killed_trial_retried(
    sn: RunningSN, tmp_path: Path
) -> None:
    hosts = [tmp_path / "host1", tmp_path / "host2"]
    swops = [swop_host(sn, host, f"swop-{i}", slots=2) for i, host in enumerate(hosts, start=1)]
    grid = "\n".join(
        [
            "        Kind: GRID",
            "        Parameters:",
            "            LR: [0.01, 0.1, 1.0]",
            "            STEPS: [5, 40]",
        ]
    )
    task_file = write_trials_task(tmp_path, grid, hold=2.0)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], int]:
        async with ledger_of(sn) as ledger:
            await wait_enrolled(ledger, 2)
            task = await register_task(ledger, task_file)
            running = asyncio.create_task(run_task(ledger, task, "ALL"))  # type: ignore[arg-type]
            killed = await asyncio.to_thread(kill_first_trial, hosts)
            status = await running
            study = await ledger.query("study", name="grid", detail=True)
            return status, study, killed

    try:
        status, study, killed = asyncio.run(scenario())
    finally:
        for swop in swops:
            swop.send_signal(signal.SIGTERM)
        for swop in swops:
            swop.wait(30)
    logs = [(h / "swop.out").read_text()[-3000:] for h in hosts]
    assert status["state"] == "COMPLETE", (status, logs)
    trials = study["trials"]
    assert [t["params"] for t in trials] == [
        {"LR": lr, "STEPS": s} for lr in (0.01, 0.1, 1.0) for s in (5, 40)
    ]
    assert all(t["status"] == "COMPLETED" and "val_error" in t["metrics"] for t in trials), trials
    retried = trials[killed]
    assert retried["attempts"] == 2 and retried["failures"] == 1
    assert retried["history"][0]["exit_code"] == -9
    assert "killed by signal 9 (SIGKILL)" in retried["history"][0]["description"]
    assert {a["swop"] for t in trials for a in t["history"]} == {"swop-1", "swop-2"}
    assert all(len(t["probabilities"]) == 2 for t in trials)
    best = min(trials, key=lambda t: (t["metrics"]["val_error"], t["index"]))
    assert study["best"] == best["index"]

    plots = tmp_path / "plots"
    shown = swci(sn, "LIST TRIALS grid", "GET BEST TRIAL grid", f"PLOT TRIALS grid TO {plots}")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "Trials of grid (GRID, finished): 6 completed, 0 running, 0 pending, 0 failed" in shown.stdout
    assert f"BEST TRIAL : {best['index']}" in shown.stdout
    assert f"PARAMETERS : LR={best['params']['LR']:.4g}, STEPS={best['params']['STEPS']}" in shown.stdout
    pngs = sorted(p.name for p in plots.glob("*.png"))
    assert pngs == ["grid-prediction-certainty.png", "grid-val_error-by-parameter.png"]
    assert all((plots / name).read_bytes().startswith(b"\x89PNG") for name in pngs)
