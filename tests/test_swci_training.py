"""The training views of swci against a real SN: WATCH CONTRACT, PERFDATA ... HISTORY, PLOT CONTRACT,
and the training panel of WAIT FOR TASKRUNNER on a terminal.

Two stand-in SLs train on the ledger with the SL's own transactions (join, check in, merge as the
round's leader, report progress, finish), so every view reads what a real training records.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from daemons.bus import Bus, BusConfig
from daemons.ledger_client import LedgerClient
from swci.training_view import Training, eta_seconds, progress_lines, training_table
from tests.conftest import RunningSN, eventually
from tests.test_swci_executor import Shell, node_standin, open_shell

pytestmark = pytest.mark.timeout(90)

C = "defaultbb.cqdb.sml.hpe"
TR = "defaulttaskbb.taskdb.sml.hpe"
PARAMS = {
    "sync_frequency": 4,
    "min_peers": 2,
    "node_weightage": 1.0,
    "merge_method": "mean",
    "total_epochs": 2,
    "admin": True,
    "quorum_wait": 0.0,
    "leader_timeout": 60.0,
}
RUN_TASK = """\
Name: run_task
TaskType: RUN_SWARM
Author: tester
Prereq: ROOTTASK
Outcome: run_task
Body:
    Command: model/train.py
    Entrypoint: python3
    WorkingDir: /tmp/test
    Envvars: ["MAX_EPOCHS": 2]
    PrivateContent: /tmp/test/
    SharedContent: ~
"""


class Swarm:
    """Stand-in SLs of one contract: they check in together and their round's leader merges."""

    def __init__(self, clients: dict[str, LedgerClient]) -> None:
        self.clients = clients
        self.rounds = 0

    async def join(self) -> None:
        for client in self.clients.values():
            await client.submit("contract.join", {"contract": C, "params": PARAMS})

    async def round(self, *, init: bool = False) -> None:
        for uid, client in self.clients.items():
            digest = f"{ord(uid[-1]):02x}" * 32
            await client.submit(
                "round.checkin", {"contract": C, "digest": digest, "samples": 8, "init": init}
            )
        any_client = next(iter(self.clients.values()))
        for _ in range(500):
            closed = (await any_client.query("contract.rounds", name=C))["closed"]
            if closed:
                break
            await asyncio.sleep(0.02)
        number, leader, took_part = closed[-1]["round"], closed[-1]["leader"], closed[-1]["participants"]
        body = {"contract": C, "round": number, "digest": "ab" * 32, "contributors": took_part}
        await self.clients[leader].submit("round.merged", body)
        self.rounds += 1

    async def progress(self, epoch: int) -> None:
        for i, client in enumerate(self.clients.values()):
            loss, metric = 1.0 / (epoch + 1) + i / 10, 0.5 + epoch / 10
            body = {"contract": C, "epochs_done": epoch, "total_epochs": 2, "loss": loss, "metric": metric}
            await client.submit("contract.progress", body)

    async def finish(self) -> None:
        for client in self.clients.values():
            await client.submit("contract.done", {"contract": C, "mode": "snapshot"})
        await self.round()


@asynccontextmanager
async def sl_standin(sn: RunningSN, uid: str, parent: str) -> AsyncIterator[LedgerClient]:
    """Play an SL started by SWOP ``parent``."""
    config = BusConfig(sn.address, uid, "sl", network=sn.network)
    async with Bus(config, presence={"role": "sl", "pid": os.getpid(), "parent": parent}) as bus:
        client = await LedgerClient.connect(bus, timeout=10)
        registration = {"role": "sl", "parent": parent, "host": "localhost", "address": "", "meta": {}}
        await client.submit("node.register", {**registration, "pid": os.getpid()})
        yield client


@asynccontextmanager
async def swarm_of(sn: RunningSN, *uids: str, parent: str = "swop-1") -> AsyncIterator[Swarm]:
    async with AsyncExitStack() as stack:
        clients = {uid: await stack.enter_async_context(sl_standin(sn, uid, parent)) for uid in uids}
        yield Swarm(clients)


async def _train(swarm: Swarm) -> None:
    await swarm.join()
    await swarm.round(init=True)
    for epoch in (1, 2):
        await swarm.round()
        await swarm.progress(epoch)
    await swarm.finish()


@pytest.fixture
async def shell(sn: RunningSN, tmp_path: Path) -> AsyncIterator[Shell]:
    async with open_shell(tmp_path) as opened:
        await opened.ok(f"CREATE CONTEXT test WITH IP 127.0.0.1 {sn.port}")
        await opened.ok("SWITCH CONTEXT test")
        yield opened


async def test_history_table_files_and_plots(shell: Shell, sn: RunningSN, tmp_path: Path) -> None:
    async with swarm_of(sn, "sl1", "sl2") as swarm:
        await _train(swarm)
    history = await shell.ok(f"PERFDATA {C} HISTORY")
    records = history["records"]
    progress = [r for r in records if r["kind"] == "progress"]
    rounds = [r for r in records if r["kind"] == "round"]
    assert [(r["node"], r["epoch"]) for r in progress] == [("sl1", 1), ("sl2", 1), ("sl1", 2), ("sl2", 2)]
    assert [r["round"] for r in rounds] == [1, 2, 3, 4]
    assert progress[0]["round"] == 2 and progress[0]["digest"] == "ab" * 32  # the model it reported on
    assert all(r["node"] in ("sl1", "sl2") for r in rounds)  # each round's leader
    assert "History of defaultbb.cqdb.sml.hpe" in shell.output and "sl2" in shell.output

    await shell.ok(f"PERFDATA {C} HISTORY TO h.csv")
    rows = list(csv.DictReader(io.StringIO((tmp_path / "h.csv").read_text())))
    assert len(rows) == len(records) and rows[1]["node"] == progress[0]["node"]
    assert {"time", "node", "epoch", "loss", "metric", "round", "digest"} <= set(rows[0])
    await shell.ok(f"PERFDATA {C} HISTORY TO h.json")
    assert json.loads((tmp_path / "h.json").read_text())["records"] == records
    assert "cannot write" in (await shell.fails(f"PERFDATA {C} HISTORY TO no/such/dir/h.csv"))[0]

    files = await shell.ok(f"PLOT CONTRACT {C} TO plots")
    names = sorted(Path(f).name for f in files["files"])
    assert names == [f"{C}-sl1.png", f"{C}-sl2.png", f"{C}.png"]
    heads = [await asyncio.to_thread(Path(f).read_bytes) for f in files["files"]]
    assert all(head[:8] == b"\x89PNG\r\n\x1a\n" for head in heads)

    await shell.ok(f"RESET CONTRACT {C}")  # the reference's scripts reset at their end: still shown
    assert (await shell.ok(f"PERFDATA {C} HISTORY"))["records"] == records


async def test_history_and_plot_errors(shell: Shell) -> None:
    assert "no contract 'nope'" in (await shell.fails("PERFDATA nope HISTORY"))[0]
    assert "no contract 'nope'" in (await shell.fails("WATCH CONTRACT nope"))[0]
    assert "no progress reports to plot" in (await shell.fails(f"PLOT CONTRACT {C}"))[0]
    assert (await shell.ok(f"PERFDATA {C} HISTORY"))["records"] == []


async def test_watch_contract_prints_progress_until_complete(shell: Shell, sn: RunningSN) -> None:
    async with swarm_of(sn, "sl1", "sl2") as swarm:
        watching = asyncio.create_task(shell.run(f"WATCH CONTRACT {C} 60"))
        await swarm.join()
        await swarm.round(init=True)
        await swarm.round()
        await swarm.progress(1)
        assert await eventually(lambda: "sl2: active epoch 1/2 loss 0.6000" in shell.output, 20)
        await swarm.round()
        await swarm.progress(2)
        await swarm.finish()
        outcome = await watching
    assert outcome.ok, shell.output
    out = shell.output
    assert "sl1: active epoch 1/2 loss 0.5000 metric 0.6000" in out and "sl2: finished epoch 2/2" in out
    assert f"Contract {C}: COMPLETE" in out and f"Contract {C} is COMPLETE" in out
    assert outcome.result is not None and outcome.result.data["status"] == "COMPLETE"


async def test_watch_contract_times_out_on_an_idle_contract(shell: Shell) -> None:
    messages = await shell.fails(f"WATCH CONTRACT {C} 0.3")
    assert messages[0].startswith("WARNING - Maximum configured SWCI wait time is over")


async def test_wait_for_taskrunner_shows_the_training_on_a_terminal(sn: RunningSN, tmp_path: Path) -> None:
    (tmp_path / "run.yaml").write_text(RUN_TASK)
    buffer = io.StringIO()
    console = Console(file=buffer, width=160, force_terminal=True, color_system=None)
    from swci.executor import SwciExecutor
    from swci.runner import run_line
    from swci.session import SessionState

    async with SwciExecutor(console=console, connect_timeout=3.0) as executor:
        session = SessionState(cwd=tmp_path)

        async def ok(line: str) -> Any:
            outcome = await run_line(line, executor, session, console)
            assert outcome.ok, buffer.getvalue()[-2000:]
            return outcome.result.data if outcome.result else None

        await ok(f"CREATE CONTEXT test WITH IP 127.0.0.1 {sn.port}")
        await ok("SWITCH CONTEXT test")
        async with node_standin(sn, "swop-1", "swop", taskrunner=TR) as swop:
            await swop.submit("taskrunner.enroll", {"taskrunner": TR, "capacity": 2, "group": "t"})
            await ok("CREATE TASK FROM run.yaml")
            await ok("FINALIZE TASK run_task")
            await ok(f"ASSIGN TASK run_task TO {TR} WITH 2 PEERS")
            async with swarm_of(sn, "sl1", "sl2") as swarm:
                waiting = asyncio.create_task(ok(f"WAIT FOR TASKRUNNER {TR}"))
                await _train(swarm)
                assert await eventually(lambda: "2/2" in buffer.getvalue(), 20), buffer.getvalue()[-3000:]
                for uid in ("sl1", "sl2"):
                    body = {"taskrunner": TR, "peer": uid, "peer_type": "SL", "status": "COMPLETED"}
                    await swop.submit("taskrunner.status", {**body, "description": "", "exit_code": 0})
                view = await waiting
    assert view["state"] == "COMPLETE"
    screen = buffer.getvalue()
    assert f"Contract {C}" in screen and "sl1" in screen and "2/2" in screen


# --- the view's pieces ------------------------------------------------------------------------------


def test_eta_from_the_rate_so_far() -> None:
    assert eta_seconds(2, 10, joined=100.0, updated=120.0, now=120.0) == 80.0
    assert eta_seconds(2, 10, joined=100.0, updated=120.0, now=130.0) == 70.0
    assert eta_seconds(10, 10, joined=100.0, updated=120.0, now=130.0) == 0.0
    assert eta_seconds(0, 10, joined=100.0, updated=100.0, now=130.0) is None
    assert eta_seconds(3, 0, joined=100.0, updated=120.0, now=130.0) is None


def _training() -> Training:
    training = Training(C, "ACTIVE", started=100.0)
    training.perf = [
        {"uid": "sl1", "status": "active", "completed_epochs": 1, "total_epochs": 4, "loss": 0.5,
         "metric": 0.9, "joined_at": 100.0, "updated_at": 110.0},
        {"uid": "sl2", "status": "finished", "completed_epochs": 4, "total_epochs": 4, "loss": "nan",
         "metric": None, "joined_at": 100.0, "updated_at": 140.0},
    ]  # fmt: skip
    training.see_rounds({"open": {"round": 8}, "closed": [], "finished": [
        {"round": 7, "leader": "sl2", "participants": ["sl1", "sl2"]}]})  # fmt: skip
    return training


def test_the_table_shows_each_node_its_round_the_leader_and_times() -> None:
    buffer = io.StringIO()
    Console(file=buffer, width=140, color_system=None).print(training_table(_training(), now=120.0))
    text = buffer.getvalue()
    assert "round 8" in text and "leader sl2" in text and "elapsed 0:00:20" in text and "ETA 0:00:20" in text
    sl1 = next(line for line in text.splitlines() if line.startswith("sl1"))
    assert "1/4" in sl1 and "0.5000" in sl1 and "0.9000" in sl1 and " 7 " in sl1
    sl2 = next(line for line in text.splitlines() if line.startswith("sl2"))
    assert "★" in sl2 and "nan" in sl2 and "finished" in sl2


def test_plain_lines_say_what_changed() -> None:
    before = _training()
    after = before.copy()
    after.perf = [dict(before.perf[0], completed_epochs=2), before.perf[1]]
    assert progress_lines(before, after) == ["  sl1: active epoch 2/4 loss 0.5000 metric 0.9000"]
    after.status = "COMPLETE"
    assert progress_lines(before, after)[0] == f"Contract {C}: COMPLETE"
