"""The networked executor, in-process, against a real ``swarm sn`` and its broker.

Every command family runs through ``run_line`` (parse, execute, render) as the shell runs it. Where a
SWOP is needed, :func:`swop_standin` plays one: a real bus participant that registers, enrolls and
reports peer status with the SWOP's own transactions.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from daemons.bus import Bus, BusConfig
from daemons.ledger_client import LedgerClient
from swci import commands
from swci.argtypes import ArgKind
from swci.commands import WaitForIp, WaitForService
from swci.contexts import CONTEXT_COMMANDS, ContextStore
from swci.executor import SwciExecutor
from swci.local_commands import LOCAL_COMMANDS
from swci.output import Format
from swci.progress import HashProgress
from swci.remote_commands import HANDLERS
from swci.runner import Outcome, run_line
from swci.session import SessionState
from swci.training_commands import TRAINING_HANDLERS
from swci.waiting import TIMEOUT_WARNING, wait_limit
from tests.conftest import RunningSN

pytestmark = pytest.mark.timeout(60)

DEFAULT_TR = "defaulttaskbb.taskdb.sml.hpe"
DEFAULT_CONTRACT = "defaultbb.cqdb.sml.hpe"

PULL_TASK = """\
# a task the SWOP can run anywhere
Name: pull_task
TaskType: PULL_IMAGE
Author: tester
Prereq: ROOTTASK
Outcome: pull-task-image
Body:
    Tag: latest
    RepoName: user-env
    OrgAndReg: example.org/swarm
    Auth: ~
"""

BAD_TASK = """\
Name: bad_task
TaskType: MAKE_USER_ENV
Author: tester
Prereq: ROOTTASK
Outcome: env
Body:
    Requirements: []
    Colour: blue
"""


@dataclass
class Shell:
    """An executor and a session, with the text they printed."""

    executor: SwciExecutor
    session: SessionState
    buffer: io.StringIO
    console: Console

    async def run(self, line: str, fmt: Format = "text") -> Outcome:
        """Run one line as the shell does."""
        self.buffer.seek(0)
        self.buffer.truncate()
        return await run_line(line, self.executor, self.session, self.console, fmt=fmt)

    async def ok(self, line: str) -> Any:
        """Run a line that must succeed; returns its result's data."""
        outcome = await self.run(line)
        assert outcome.ok, f"{line!r} failed:\n{self.output}"
        assert outcome.result is not None
        return outcome.result.data

    async def fails(self, line: str) -> list[str]:
        """Run a line that must fail; returns its messages."""
        outcome = await self.run(line)
        assert not outcome.ok, f"{line!r} succeeded:\n{self.output}"
        assert outcome.result is not None
        return outcome.result.messages

    @property
    def output(self) -> str:
        return self.buffer.getvalue()


@asynccontextmanager
async def open_shell(cwd: Path, **kwargs: Any) -> AsyncIterator[Shell]:
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, color_system=None)
    async with SwciExecutor(console=console, connect_timeout=3.0, **kwargs) as executor:
        yield Shell(executor, SessionState(cwd=cwd), buffer, console)


@pytest.fixture
async def shell(sn: RunningSN, tmp_path: Path) -> AsyncIterator[Shell]:
    """A shell whose current context is the test's SN."""
    async with open_shell(tmp_path) as opened:
        await opened.ok(f"CREATE CONTEXT test WITH IP 127.0.0.1 {sn.port}")
        await opened.ok("SWITCH CONTEXT test")
        yield opened


@dataclass
class SwopStandin:
    """A SWOP's part on the ledger: registered, enrolled, reporting its own status."""

    client: LedgerClient
    uid: str
    taskrunner: str

    async def report(self, status: str, description: str = "", exit_code: int | None = None) -> None:
        body = {
            "taskrunner": self.taskrunner,
            "peer": self.uid,
            "peer_type": "SWOP",
            "status": status,
            "description": description,
            "exit_code": exit_code,
        }
        await self.client.submit("taskrunner.status", body)


@asynccontextmanager
async def node_standin(sn: RunningSN, uid: str, role: str, **presence: object) -> AsyncIterator[LedgerClient]:
    """Play a node on the bus: presence and ``node.register``, with the node's own ledger client.

    On leaving, waits until the SN has recorded the node offline, so that no test ends (and stops
    the SN) while the SN is still sealing that.
    """
    observer_config = BusConfig(sn.address, f"{uid}-observer", "swci", network=sn.network)
    async with Bus(observer_config) as observer_bus:
        observer = await LedgerClient.connect(observer_bus, timeout=10)
        async with observer.watch("node", uid) as watch:
            config = BusConfig(sn.address, uid, role, network=sn.network)
            async with Bus(config, presence={"role": role, "pid": os.getpid(), **presence}) as bus:
                client = await LedgerClient.connect(bus, timeout=10)
                registration = {"role": role, "parent": None, "host": "localhost", "address": ""}
                await client.submit("node.register", {**registration, "pid": os.getpid(), "meta": {}})
                yield client
            while (await observer.query("node", uid=uid))["online"]:
                await watch.next(10)


@asynccontextmanager
async def swop_standin(
    sn: RunningSN, uid: str = "swop-1", taskrunner: str = DEFAULT_TR, capacity: int = 1
) -> AsyncIterator[SwopStandin]:
    """Play a SWOP: a node of role ``swop`` enrolled on ``taskrunner``."""
    async with node_standin(sn, uid, "swop", taskrunner=taskrunner) as client:
        await client.submit(
            "taskrunner.enroll", {"taskrunner": taskrunner, "capacity": capacity, "group": "t"}
        )
        yield SwopStandin(client, uid, taskrunner)


def _task_file(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    return path


# --- contracts ---------------------------------------------------------------------------------------


async def test_contracts_create_list_info_status_reset(shell: Shell) -> None:
    assert (await shell.ok("CREATE CONTRACT mnist"))["name"] == "mnist"
    assert "Contract mnist created" in shell.output
    assert (await shell.ok(f"CREATE CONTRACT {DEFAULT_CONTRACT}"))["existing"] is True
    assert f"Contract {DEFAULT_CONTRACT} already exists" in shell.output
    listed = await shell.ok("LIST CONTRACTS")
    assert [view["name"] for view in listed] == [DEFAULT_CONTRACT, "mnist"]
    assert "UNINITIALIZED" in shell.output
    info = await shell.ok("GET CONTRACT INFO mnist")
    assert (info["name"], info["resets"]) == ("mnist", 0)
    assert "CREATED BY" in shell.output
    assert (await shell.ok("GET CONTRACT STATUS mnist"))["status"] == "UNINITIALIZED"
    assert await shell.ok("PERFDATA mnist") == []
    assert "SL ADMIN" in shell.output
    await shell.ok("RESET CONTRACT mnist")
    assert "Contract mnist reset" in shell.output
    assert await shell.fails("GET CONTRACT INFO nothing") == [
        "no contract 'nothing' (LIST CONTRACTS shows them)"
    ]


async def test_reset_contract_is_refused_while_an_sl_trains(shell: Shell, sn: RunningSN) -> None:
    async with node_standin(sn, "sl-1", "sl") as sl:
        await sl.submit("contract.join", {"contract": DEFAULT_CONTRACT, "params": {"min_peers": 1}})
        status = await shell.ok(f"GET CONTRACT STATUS {DEFAULT_CONTRACT}")
        assert (status["status"], status["active"]) == ("ACTIVE", 1)
        assert await shell.fails(f"RESET CONTRACT {DEFAULT_CONTRACT}") == [
            f"contract '{DEFAULT_CONTRACT}' has 1 active member(s) online (sl-1); "
            "wait for the training to finish before RESET CONTRACT"
        ]
        perf = await shell.ok(f"PERFDATA {DEFAULT_CONTRACT}")
        assert [(row["uid"], row["admin"], row["status"]) for row in perf] == [("sl-1", True, "active")]
        assert "sl-1" in shell.output


# --- tasks -------------------------------------------------------------------------------------------


async def test_task_lifecycle_from_a_yaml_file(shell: Shell, tmp_path: Path) -> None:
    _task_file(tmp_path / "taskdefs", "pull_task.yaml", PULL_TASK)
    await shell.ok(f"CD {tmp_path}")
    created = await shell.ok("CREATE TASK FROM taskdefs/pull_task.yaml")
    assert created["name"] == "pull_task"
    assert shell.output.splitlines()[:2] == ["Task definition is valid", "Task Registered : pull_task"]
    assert (await shell.ok("CREATE TASK FROM taskdefs/pull_task.yaml"))["existing"] is True
    assert "Task pull_task already registered (not finalized yet) with the same body" in shell.output
    info = await shell.ok("GET TASK INFO pull_task")
    assert (info["type"], info["finalized"], info["body_lines"]) == ("PULL_IMAGE", False, 4)
    await shell.ok("FINALIZE TASK pull_task")
    assert (await shell.ok("GET TASK INFO pull_task"))["finalized"] is True
    body = await shell.ok("GET TASK BODY pull_task")
    assert body["lines"][0] == "Tag: latest"
    assert "RepoName: user-env" in shell.output
    assert await shell.fails("APPEND TASK BODY pull_task 5 Extra: 1") == [
        "task 'pull_task' is finalized; its body can no longer change"
    ]
    assert await shell.fails("DELETE TASK pull_task") == [
        "task 'pull_task' is finalized and cannot be deleted"
    ]
    names = [view["name"] for view in await shell.ok("LIST TASKS")]
    assert names == ["ROOTTASK", "pull_task"]
    assert "PULL_IMAGE" in shell.output


async def test_a_task_file_with_errors_is_reported_at_file_line_and_column(
    shell: Shell, tmp_path: Path
) -> None:
    path = _task_file(tmp_path, "bad.yaml", BAD_TASK)
    messages = await shell.fails(f"CREATE TASK FROM {path}")
    assert messages[0].startswith(f"{path}:7:5: Body.Requirements:")
    assert messages[1].startswith(f"{path}:8:5: Body.Colour: unknown key 'Colour'")
    assert "Traceback" not in shell.output
    missing = await shell.fails("CREATE TASK FROM nowhere.yaml")
    assert missing == [f"{tmp_path / 'nowhere.yaml'}: cannot read the file: No such file or directory"]
    assert [view["name"] for view in await shell.ok("LIST TASKS")] == ["ROOTTASK"]


async def test_a_task_built_line_by_line(shell: Shell) -> None:
    await shell.ok("CREATE TASK MAKE_USER_ENV env_task tester ROOTTASK my-env")
    assert "Task Registered : env_task" in shell.output
    finalize = await shell.fails("FINALIZE TASK env_task")
    assert finalize == ["task 'env_task' has no body; APPEND TASK BODY lines first"]
    await shell.ok("APPEND TASK BODY env_task 1 Requirements:")
    await shell.ok("APPEND TASK BODY env_task 2 - numpy")
    assert (await shell.ok("GET TASK BODY env_task"))["lines"] == ["Requirements:", "- numpy"]
    await shell.ok("CREATE TASK RUN_SWARM throwaway tester ROOTTASK x")
    await shell.ok("DELETE TASK throwaway")
    assert await shell.fails("GET TASK INFO throwaway") == ["no task 'throwaway' (LIST TASKS shows them)"]
    await shell.ok("FINALIZE TASK env_task")
    assert await shell.ok("GET TASK BODY env_task") == {
        "name": "env_task",
        "lines": ["Requirements:", "- numpy"],
        "indexes": [1, 2],
    }


# --- taskrunners -------------------------------------------------------------------------------------


async def test_taskrunners_and_the_reasons_assign_is_rejected(shell: Shell) -> None:
    await shell.ok("CREATE TASKRUNNER tr1")
    assert (await shell.ok("CREATE TASKRUNNER tr1"))["existing"] is True
    await shell.ok("CREATE TASK RUN_SWARM draft tester ROOTTASK model")
    assert await shell.fails("ASSIGN TASK draft TO tr1 WITH 2 PEERS") == [
        "task 'draft' is not finalized; run FINALIZE TASK draft first"
    ]
    await shell.ok("CREATE TASK PULL_IMAGE img tester ROOTTASK image")
    for idx, line in enumerate(("Tag: v1", "RepoName: r", "OrgAndReg: o", "Auth: ~"), start=1):
        await shell.ok(f"APPEND TASK BODY img {idx} {line}")
    await shell.ok("FINALIZE TASK img")
    assert await shell.fails("ASSIGN TASK img TO tr1 WITH 2 PEERS") == [
        "no online SWOP is enrolled on taskrunner 'tr1'; start a SWOP for it first"
    ]
    status = await shell.ok("GET TASKRUNNER STATUS tr1")
    assert status["state"] == "IDLE"
    assert "TASK_STATE : IDLE" in shell.output.splitlines()
    info = await shell.ok("GET TASKRUNNER INFO tr1")
    assert (info["name"], info["enrolled"], info["task"]) == ("tr1", 0, None)
    assert [view["name"] for view in await shell.ok("LIST TASKRUNNERS")] == [DEFAULT_TR, "tr1"]
    assert await shell.ok("LIST TASKRUNNER PEERS tr1") == []
    assert await shell.fails("GET TASKRUNNER PEER STATUS tr1 0") == [
        "taskrunner 'tr1' has 0 enrolled SWOP(s); index 0 is out of range"
    ]
    await shell.ok("RESET TASKRUNNER tr1")


async def _pull_task(shell: Shell, tmp_path: Path) -> None:
    path = _task_file(tmp_path, "pull_task.yaml", PULL_TASK)
    await shell.ok(f"CREATE TASK FROM {path}")
    await shell.ok("FINALIZE TASK pull_task")


async def test_assign_and_wait_until_complete(shell: Shell, sn: RunningSN, tmp_path: Path) -> None:
    await _pull_task(shell, tmp_path)
    async with swop_standin(sn) as swop:
        assert await shell.fails(f"ASSIGN TASK pull_task TO {DEFAULT_TR} WITH 2 PEERS") == [
            f"WITH 2 PEERS needs 2 SWOPs but only 1 online SWOP(s) are enrolled on taskrunner '{DEFAULT_TR}'"
            " (swop-1)"
        ]
        assigned = await shell.ok(f"ASSIGN TASK pull_task TO {DEFAULT_TR} WITH 1 PEERS")
        assert assigned["allocation"] == {"swop-1": 1}
        assert "Allocation : swop-1: 1" in shell.output
        peers = await shell.ok(f"LIST TASKRUNNER PEERS {DEFAULT_TR}")
        assert [(p["uid"], p["online"]) for p in peers] == [("swop-1", True)]
        waiting = asyncio.create_task(shell.run(f"WAIT FOR TASKRUNNER {DEFAULT_TR}"))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await swop.report("RUNNING", "pulling")
        await swop.report("COMPLETED", "pulled", 0)
        outcome = await asyncio.wait_for(waiting, 20)
        assert outcome.ok, shell.output
        assert (
            f"Task pull_task on taskrunner {DEFAULT_TR} is COMPLETE (1 of 1 peers completed)" in shell.output
        )
        assert "RUNNING (active 1, completed 0" in shell.output
        peer = await shell.ok(f"GET TASKRUNNER PEER STATUS {DEFAULT_TR} swop-1")
        assert [(p["status"], p["description"]) for p in peer["peers"]] == [("COMPLETED", "pulled")]
        assert (await shell.ok(f"WAIT FOR TASKRUNNER {DEFAULT_TR}"))["state"] == "COMPLETE"
        await shell.ok(f"RESET TASKRUNNER {DEFAULT_TR}")
        assert (
            "TASK_STATE : IDLE" in (await shell.run(f"GET TASKRUNNER STATUS {DEFAULT_TR}"), shell.output)[1]
        )


async def test_wait_fails_with_the_ledgers_error_reason(shell: Shell, sn: RunningSN, tmp_path: Path) -> None:
    await _pull_task(shell, tmp_path)
    async with swop_standin(sn) as swop:
        await shell.ok(f"ASSIGN TASK pull_task TO {DEFAULT_TR} WITH ALL PEERS")
        waiting = asyncio.create_task(shell.run(f"WAIT FOR TASKRUNNER {DEFAULT_TR}"))
        await asyncio.sleep(0.3)
        await swop.report("FAILED", "registry unreachable", 3)
        outcome = await asyncio.wait_for(waiting, 20)
    assert not outcome.ok
    assert outcome.result is not None
    assert outcome.result.messages == [
        f"Task pull_task on taskrunner {DEFAULT_TR} failed: SWOP peer 'swop-1' FAILED (exit code 3): "
        "registry unreachable; 0 completed + 0 still running < 1 required"
    ]
    assert "TASK_STATE : ERROR" in (await shell.run(f"GET TASKRUNNER STATUS {DEFAULT_TR}"), shell.output)[1]


async def test_wait_gives_up_after_its_time_limit(shell: Shell, sn: RunningSN, tmp_path: Path) -> None:
    await _pull_task(shell, tmp_path)
    async with swop_standin(sn):
        await shell.ok(f"ASSIGN TASK pull_task TO {DEFAULT_TR} TARGET swop-1")
        assert await shell.fails(f"WAIT FOR TASKRUNNER {DEFAULT_TR} 0.5") == [
            TIMEOUT_WARNING,
            f"taskrunner {DEFAULT_TR} is still RUNNING after 0:00:00",
        ]
        # without a timeout: the context's SWCI_GENERIC_TASK_MAX_WAIT_TIME (minutes), before the process's
        await shell.ok("SET CONTEXT ENV test SWCI_GENERIC_TASK_MAX_WAIT_TIME 0.01")
        assert (await shell.fails(f"WAIT FOR TASKRUNNER {DEFAULT_TR}"))[0] == TIMEOUT_WARNING


async def test_ctrl_c_stops_only_the_wait(shell: Shell, sn: RunningSN, tmp_path: Path) -> None:
    await _pull_task(shell, tmp_path)
    async with swop_standin(sn):
        await shell.ok(f"ASSIGN TASK pull_task TO {DEFAULT_TR} WITH 1 PEERS")
        waiting = asyncio.create_task(shell.run(f"WAIT FOR TASKRUNNER {DEFAULT_TR}"))
        await asyncio.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)
        outcome = await asyncio.wait_for(waiting, 10)
        assert (outcome.ok, outcome.result and outcome.result.messages) == (False, ["interrupted"])
        assert (await shell.ok(f"GET TASKRUNNER STATUS {DEFAULT_TR}"))["state"] == "RUNNING"


# --- nodes, contexts, versions ---------------------------------------------------------------------


async def test_list_nodes(shell: Shell, sn: RunningSN) -> None:
    async with swop_standin(sn):
        nodes = await shell.ok("LIST NODES")
    assert [(n["uid"], n["type"], n["online"]) for n in nodes] == [
        ("sn-1", "SN", True),
        ("swop-1", "SWOP", True),
    ]
    lines = [line.split(", ") for line in shell.output.splitlines() if line.count(", ") == 6]
    assert lines[0] == ["NODE TYPE", "HOST IP", "PORT", "CONTAINER NAME", "UUID", "PARENT UUID", "I-AM-ALIVE"]
    assert lines[1][:6] == ["SENTINEL", "127.0.0.1", str(sn.port), "sn-1", "sn-1", ""]
    assert [row[0] for row in lines[1:]] == ["SENTINEL", "SWOP"]


async def test_contexts_are_persisted_and_switched(sn: RunningSN, tmp_path: Path) -> None:
    async with open_shell(tmp_path) as shell:
        assert await shell.fails("LIST TASKS") == [
            "no context is active; run CREATE CONTEXT <name> WITH IP <ip> and SWITCH CONTEXT <name> first"
        ]
        await shell.ok(f"CREATE CONTEXT good WITH IP 127.0.0.1 {sn.port}")
        await shell.ok("CREATE CONTEXT old 127.0.0.1 1")  # the pre-2.0 form, to a port with nothing
        await shell.ok("CREATE CONTEXT proxied WITH SERVICE api.sn-1.swarm")
        await shell.ok("SWITCH CONTEXT old")
        failed = await shell.fails("LIST TASKS")
        assert failed[0].startswith("cannot connect to mqtt://127.0.0.1:1")
        assert "check it with GET CONTEXT INFO" in failed[0]
        await shell.ok("SWITCH CONTEXT good")
        assert [view["name"] for view in await shell.ok("LIST TASKS")] == ["ROOTTASK"]
        listed = await shell.ok("LIST CONTEXTS")
        assert [(c["name"], c["active"]) for c in listed] == [
            ("good", True),
            ("old", False),
            ("proxied", False),
        ]
        info = await shell.ok("GET CONTEXT INFO proxied")
        assert (info["service"], info["broker"]) == ("api.sn-1.swarm", "mqtt://api.sn-1.swarm:443")
        assert (await shell.ok("GET CONTEXT INFO"))["broker"] == f"mqtt://127.0.0.1:{sn.port}"
        await shell.ok("SET CONTEXT ENV good SWCI_RUN_TASK_MAX_WAIT_TIME 5")
        assert await shell.ok("GET CONTEXT ENV good SWCI_RUN_TASK_MAX_WAIT_TIME") == {
            "SWCI_RUN_TASK_MAX_WAIT_TIME": "5"
        }
        assert await shell.ok("LIST CONTEXT ENV good") == {"SWCI_RUN_TASK_MAX_WAIT_TIME": "5"}
        assert (await shell.fails("GET CONTEXT ENV good NOPE"))[0].startswith(
            "context 'good' has no variable 'NOPE'"
        )
        assert (await shell.fails("SWITCH CONTEXT missing"))[0].startswith(
            "no context 'missing' (known: good, old"
        )
        await shell.ok(f"CREATE CONTEXT good WITH IP localhost {sn.port}")  # updated, env kept
        assert "Context good updated" in shell.output
    store = ContextStore()
    assert store.current == "good"
    assert store.require("good").env == {"SWCI_RUN_TASK_MAX_WAIT_TIME": "5"}
    saved = json.loads(store.path.read_text())
    assert saved["contexts"]["old"] == {"host": "127.0.0.1", "port": 1, "service": None, "env": {}}
    async with open_shell(tmp_path) as again:  # a new process starts in the saved current context
        assert [view["name"] for view in await again.ok("LIST TASKRUNNERS")] == [DEFAULT_TR]


async def test_get_context_version_asks_the_sn(shell: Shell) -> None:
    data = await shell.ok("GET CONTEXT VERSION")
    assert (data["uid"], data["sentinel"]) == ("sn-1", True)
    assert f"API server version : {data['version']}" in shell.output
    assert "SWCI VERSION" in shell.output


async def test_names_for_completion_come_from_listings(shell: Shell) -> None:
    assert shell.executor.names(ArgKind.CONTEXT) == ["test"]
    assert shell.executor.names(ArgKind.CONTRACT) == ()  # nothing is cached, nor connected yet
    await shell.ok("GET CONTEXT VERSION")
    assert shell.executor.names(ArgKind.CONTRACT) == ()  # never listed: a refresh starts in the background
    for _ in range(100):
        if shell.executor.names(ArgKind.NODE):
            break
        await asyncio.sleep(0.05)
    assert shell.executor.names(ArgKind.CONTRACT) == (DEFAULT_CONTRACT,)
    assert shell.executor.names(ArgKind.NODE) == ("sn-1",)
    assert shell.executor.names(ArgKind.TASKRUNNER) == (DEFAULT_TR,)
    assert shell.executor.names(ArgKind.TASK) == ("ROOTTASK",)
    await shell.ok("CREATE TASK RUN_SWARM t1 tester ROOTTASK x")
    assert shell.executor.names(ArgKind.TASK) == ("ROOTTASK", "t1")
    await shell.ok("DELETE TASK t1")
    assert shell.executor.names(ArgKind.TASK) == ("ROOTTASK",)
    await shell.ok("CREATE CONTRACT c2")
    await shell.ok("CREATE TASKRUNNER tr2")
    assert shell.executor.names(ArgKind.CONTRACT) == ("c2", DEFAULT_CONTRACT)
    assert shell.executor.names(ArgKind.TASKRUNNER) == (DEFAULT_TR, "tr2")


async def test_json_results_carry_the_raw_views(shell: Shell) -> None:
    await shell.run("LIST TASKRUNNERS", fmt="json")
    payload = json.loads(shell.output)
    assert payload["ok"] is True
    assert payload["data"][0]["name"] == DEFAULT_TR
    assert payload["table"]["columns"][:2] == ["Name", "State"]
    await shell.run("GET CONTRACT INFO nothing", fmt="json")
    failed = json.loads(shell.output)
    assert failed["ok"] is False
    assert failed["messages"] == ["no contract 'nothing' (LIST CONTRACTS shows them)"]


# --- pieces without an SN -----------------------------------------------------------------------------


def test_progress_on_a_non_terminal_prints_hashes_and_state_changes() -> None:
    buffer = io.StringIO()
    progress = HashProgress(Console(file=buffer, width=200, color_system=None), "tr", every=0.0)
    running = {"task": "t", "state": "RUNNING", "active": 1, "completed": 0, "failed": 0, "required": 2}
    with progress:
        progress.update(running)
        progress.tick()
        progress.tick()
        progress.update(running)  # no change: no line
        progress.update({**running, "state": "COMPLETE", "active": 0, "completed": 2})
    assert buffer.getvalue().splitlines() == [
        "Taskrunner tr: task t RUNNING (active 1, completed 0, failed 0 of 2 required)",
        "##",
        "Taskrunner tr: task t COMPLETE (active 0, completed 2, failed 0 of 2 required)",
    ]


def test_wait_limits_come_from_the_argument_the_settings_or_the_default() -> None:
    settings = {"SWCI_RUN_TASK_MAX_WAIT_TIME": "2", "SWCI_GENERIC_TASK_MAX_WAIT_TIME": "bad"}
    assert wait_limit(7.5, {"peer_type": "SL"}, settings.get) == 7.5
    assert wait_limit(None, {"peer_type": "SL"}, settings.get) == 120.0
    assert wait_limit(None, {"peer_type": "SWOP"}, settings.get) == 120 * 60.0  # not a number: the default
    assert wait_limit(None, {"peer_type": None}, lambda name: None) == 120 * 60.0


async def test_a_broken_contexts_file_is_reported_not_raised(tmp_path: Path) -> None:
    store = ContextStore()
    store.path.parent.mkdir(parents=True, exist_ok=True)
    store.path.write_text('{"contexts": {"a": ')
    async with open_shell(tmp_path) as shell:
        messages = await shell.fails("LIST CONTEXTS")
        assert messages[0].startswith(f"{store.path}:1:")
        assert "not valid JSON" in messages[0]
        assert (await shell.fails("LIST TASKS"))[0].startswith(f"{store.path}:1:")
        assert shell.executor.names(ArgKind.CONTEXT) == ()


def test_every_command_has_an_executor() -> None:
    kinds = [getattr(commands, name) for name in commands.__all__ if name != "Command"]
    handled = (*LOCAL_COMMANDS, *CONTEXT_COMMANDS, WaitForIp, WaitForService, *HANDLERS, *TRAINING_HANDLERS)
    assert [kind.__name__ for kind in kinds if kind not in handled] == []
