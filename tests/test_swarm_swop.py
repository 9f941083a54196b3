"""End to end through a SWOP: tasks assigned on the ledger, SL+ML pairs spawned, statuses reported."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from daemons.bus import Bus, BusConfig
from daemons.ledger_client import LedgerClient
from taskdefs import body_lines, load_task_definition
from tests.conftest import RunningSN
from tests.swarm_helpers import start_swop, write_swarm_setup

pytestmark = pytest.mark.slow
RUNNER = "defaulttaskbb.taskdb.sml.hpe"


@asynccontextmanager
async def ledger_of(sn: RunningSN) -> AsyncIterator[LedgerClient]:
    async with Bus(BusConfig(sn.address, "swci-test", "swci")) as bus:
        yield await LedgerClient.connect(bus, timeout=10)


async def register_task(ledger: LedgerClient, path: Path) -> str:
    d = load_task_definition(path)
    body = {"name": d.name, "type": d.task_type, "author": d.author, "prereq": d.prereq, "outcome": d.outcome}
    await ledger.submit("task.create", {**body, "body": body_lines(d)})
    await ledger.submit("task.finalize", {"name": d.name})
    return d.name


async def wait_enrolled(ledger: LedgerClient, count: int) -> None:
    async with ledger.watch("taskrunner", RUNNER) as watch:
        while len(await ledger.query("taskrunner.peers", name=RUNNER)) < count:
            await watch.next(timeout=60)


async def run_task(ledger: LedgerClient, task: str, peers: int, timeout: float = 150) -> dict[str, Any]:
    await ledger.submit("taskrunner.reset", {"taskrunner": RUNNER})
    async with ledger.watch("taskrunner", RUNNER) as watch:
        await ledger.submit("taskrunner.assign", {"task": task, "taskrunner": RUNNER, "peers": peers})
        while True:
            view = await ledger.query("taskrunner.status", name=RUNNER)
            if view["state"] in ("COMPLETE", "ERROR"):
                return dict(view)
            await watch.next(timeout=timeout)


def digests(work: Path) -> list[str]:
    found = []
    for run in sorted((work / "swop-work" / "runs" / "run_tiny").glob("*/ml.log")):
        lines = [ln for ln in run.read_text().splitlines() if "FINAL_DIGEST" in ln]
        found.append(lines[-1].split()[-1] if lines else "")
    return found


def test_a_swarm_task_completes_with_the_same_model_everywhere_and_reset_cleans_up(
    sn: RunningSN, tmp_path: Path
) -> None:
    profile = write_swarm_setup(tmp_path, 3, {"MIN_PEERS": 3})
    swop = start_swop(sn, profile, tmp_path, SWOP_KEEP_CONTAINERS="False")

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        async with ledger_of(sn) as ledger:
            await wait_enrolled(ledger, 1)
            task = await register_task(ledger, tmp_path / "run_tiny.yaml")
            status = await run_task(ledger, task, 3)
            peers = await ledger.query("taskrunner.peer_status", name=RUNNER, swop=0)
            found = digests(tmp_path)
            await ledger.submit("taskrunner.reset", {"taskrunner": RUNNER})
            return status, peers, found

    try:
        status, peers, found = asyncio.run(scenario())
        assert status["state"] == "COMPLETE", (status, (tmp_path / "swop.out").read_text()[-3000:])
        assert status["completed"] == 3
        assert [p["status"] for p in peers["peers"]] == ["COMPLETED"] * 3
        assert len(set(found)) == 1 and found[0]
        runs = tmp_path / "swop-work" / "runs" / "run_tiny"
        for _ in range(50):
            if not any(runs.glob("*")):
                break
            asyncio.run(asyncio.sleep(0.1))
        assert not any(runs.glob("*")), "RESET TASKRUNNER must remove the run directories"
        assert all((tmp_path / f"user{i}" / "scratch" / "final_model.pt").exists() for i in (1, 2, 3))
    finally:
        swop.send_signal(signal.SIGTERM)
        assert swop.wait(30) == 0


def test_a_failing_program_turns_the_taskrunner_error_with_the_reason(sn: RunningSN, tmp_path: Path) -> None:
    profile = write_swarm_setup(tmp_path, 2, {"MIN_PEERS": 2, "FAIL_AT_BATCH": 2})
    swop = start_swop(sn, profile, tmp_path)

    async def scenario() -> dict[str, Any]:
        async with ledger_of(sn) as ledger:
            await wait_enrolled(ledger, 1)
            task = await register_task(ledger, tmp_path / "run_tiny.yaml")
            return await run_task(ledger, task, 2, timeout=90)

    try:
        status = asyncio.run(scenario())
        assert status["state"] == "ERROR"
        assert "exit code 3" in status["error"] and "failing on purpose" in status["error"], status["error"]
    finally:
        swop.send_signal(signal.SIGTERM)
        swop.wait(30)


def test_a_run_uses_the_environment_its_prereq_built(sn: RunningSN, tmp_path: Path) -> None:
    profile = write_swarm_setup(tmp_path, 2, {"MIN_PEERS": 2}, prereq="tiny_env")
    (tmp_path / "tiny_env.yaml").write_text(
        "Name: tiny_env\nTaskType: MAKE_USER_ENV\nAuthor: tests\nPrereq: ROOTTASK\nOutcome: tiny-env\n"
        "Body:\n    Requirements:\n    - numpy\n"
    )
    swop = start_swop(sn, profile, tmp_path)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with ledger_of(sn) as ledger:
            await wait_enrolled(ledger, 1)
            built = await run_task(ledger, await register_task(ledger, tmp_path / "tiny_env.yaml"), 1)
            ran = await run_task(ledger, await register_task(ledger, tmp_path / "run_tiny.yaml"), 2)
            return built, ran

    try:
        built, ran = asyncio.run(scenario())
        assert built["state"] == "COMPLETE", built
        assert ran["state"] == "COMPLETE", ran
        env_python = tmp_path / "swop-work" / "envs" / "tiny-env" / "bin" / "python"
        assert env_python.exists()
        ml_log = next((tmp_path / "swop-work" / "runs" / "run_tiny").glob("*/sl.out")).read_text()
        assert f"starting ML program: {env_python}" in ml_log
    finally:
        swop.send_signal(signal.SIGTERM)
        swop.wait(30)


async def _assign_two_and_wait_for_training(ledger: LedgerClient, tmp_path: Path) -> None:
    """Register run_tiny, assign it to the SWOP with 2 peers and wait until a node reports progress."""
    await wait_enrolled(ledger, 1)
    task = await register_task(ledger, tmp_path / "run_tiny.yaml")
    await ledger.submit("taskrunner.assign", {"task": task, "taskrunner": RUNNER, "peers": 2})
    async with ledger.watch("round", "defaultbb.cqdb.sml.hpe") as watch:
        while not (await ledger.query("contract.perfdata", name="defaultbb.cqdb.sml.hpe")):
            await watch.next(timeout=90)


def test_sigterm_stops_the_swop_and_its_children(sn: RunningSN, tmp_path: Path) -> None:
    profile = write_swarm_setup(tmp_path, 2, {"MIN_PEERS": 2, "SLEEP_PER_BATCH": 1, "EPOCHS": 50})
    swop = start_swop(sn, profile, tmp_path)

    async def scenario() -> None:
        async with ledger_of(sn) as ledger:
            await _assign_two_and_wait_for_training(ledger, tmp_path)

    asyncio.run(scenario())
    children = descendants(swop.pid)
    assert len(children) >= 4, children  # 2 SLs and their 2 ML programs
    swop.send_signal(signal.SIGTERM)
    assert swop.wait(60) == 0
    alive = [pid for pid in children if Path(f"/proc/{pid}").exists()]
    assert not alive, f"children still running after the SWOP stopped: {alive}"


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc's parent links)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [child for child, ppid in parents.items() if ppid == parent]
        found += kids
        frontier += kids
    return found


def test_sigkill_of_the_swop_leaves_its_sls_to_finish_and_the_task_complete(
    sn: RunningSN, tmp_path: Path
) -> None:
    """A SIGKILLed SWOP's SLs live on (as the reference's containers do) and report their own end; the
    SWOP restarted meanwhile leaves them be, and starts no fork server for them."""
    profile = write_swarm_setup(tmp_path, 2, {"MIN_PEERS": 2, "EPOCHS": 2, "SLEEP_PER_BATCH": 0.2})
    swop = start_swop(sn, profile, tmp_path)

    async def scenario() -> dict[str, Any]:
        async with ledger_of(sn) as ledger:
            await _assign_two_and_wait_for_training(ledger, tmp_path)
            children.extend(descendants(swop.pid))
            swop.kill()  # SIGKILL of the SWOP alone: its SLs run in their own sessions
            async with ledger.watch("node", "swop-1") as watch:
                while (await ledger.query("node", uid="swop-1"))["online"]:
                    await watch.next(timeout=30)
            restarted.append(start_swop(sn, profile, tmp_path))
            async with ledger.watch("taskrunner", RUNNER) as watch:
                while True:
                    view = await ledger.query("taskrunner.status", name=RUNNER)
                    if view["state"] != "RUNNING":
                        return dict(view)
                    await watch.next(timeout=90)

    children: list[int] = []
    restarted: list[subprocess.Popen[bytes]] = []
    try:
        status = asyncio.run(scenario())
        assert status["state"] == "COMPLETE", status
        assert status["completed"] == 2
        assert len(set(digests(tmp_path))) == 1 and digests(tmp_path)[0]
        restarted_log = (tmp_path / "swop.out").read_text()  # the restarted SWOP's log
        assert "starting in" not in restarted_log
        assert "fork server (pid" not in restarted_log  # none started for SLs it leaves be
    finally:
        for process in (swop, *restarted):
            process.kill()
            process.wait(30)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
