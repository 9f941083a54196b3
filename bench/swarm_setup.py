"""Our swarm for the end-to-end benchmarks: an SN (with its mosquitto), SWOPs, standalone SLs, and the
swci-like task submission (``LedgerClient`` transactions, as ``swci``'s CREATE/FINALIZE/ASSIGN TASK do).
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.processes import Processes
from daemons.broker import free_port
from daemons.bus import Bus, BusConfig
from daemons.bus.config import BrokerAddress
from daemons.ledger_client import LedgerClient
from daemons.processes import FORKSERVER_ENV
from daemons.sl.mlprocess import FORKED as FORKED_LINE
from daemons.swop.forkservers import READY_LINE as FORK_SERVER_READY_LINE
from daemons.swop.forkservers import READY_TIMEOUT_S as FORK_SERVER_READY_TIMEOUT_S
from taskdefs import body_lines, load_task_definition

__all__ = [
    "CONTRACT",
    "RUNNER",
    "SWARM",
    "SwarmNode",
    "forked_programs",
    "identity_args",
    "ledger_session",
    "register_task",
    "run_task",
    "start_fork_server",
    "start_sl",
    "start_sn",
    "start_swop",
    "wait_enrolled",
    "wait_sn",
    "write_profile",
    "write_run_task",
]

SWARM = str(Path(sys.executable).parent / "swarm")
RUNNER = "defaulttaskbb.taskdb.sml.hpe"
CONTRACT = "defaultbb.cqdb.sml.hpe"
READY_LINE = "Starting SWARM-API-SERVER"


@dataclass(frozen=True)
class SwarmNode:
    """One ``slnodedef`` of a SWOP profile: its SL uid, private data and ML environment."""

    uid: str
    private: Path
    env: Mapping[str, object]


def start_sn(
    procs: Processes,
    data_dir: Path,
    *,
    timeout: float = 60.0,
    port: int | None = None,
    pki: Path | None = None,
) -> int:
    """Start ``swarm sn --sentinel`` on ``port`` (default: a free one); returns the port once it serves
    (``timeout`` 0: at once, see ``wait_sn``). ``pki``: a folder of ``certs.init_swarm``, whose sn-1
    identity the SN takes (its mosquitto then requires mutual TLS)."""
    port = port or free_port()
    argv = [SWARM, "sn", "--sentinel", "--data-dir", str(data_dir), "--sn-api-port", str(port)]
    procs.start("sn", argv + identity_args(pki, "sn-1"))
    if timeout > 0:
        wait_sn(procs, timeout)
    return port


def wait_sn(procs: Processes, timeout: float = 60.0) -> None:
    """Wait until the SN that ``start_sn`` started serves."""
    procs.wait_for_line("sn", READY_LINE, timeout)


def write_profile(path: Path, nodes: Sequence[SwarmNode], *, envvars: Mapping[str, object]) -> Path:
    """A SWOP profile (the reference format) with one ``slnodedef`` per node."""
    lines = [
        "groupname: bench", f"taskrunner: {RUNNER}", "policyuri: ~",
        "resourcemgr: {mgrtype: DOCKER, accessinfo: {accesstype: FROMENV}}", "network: bench-net",
        "apls: {locator: {host: 127.0.0.1, port: ~}}", "apisrv: {locator: {host: ~, port: ~, service: ~}}",
        "envvars: [" + ", ".join(f"{k}: {v}" for k, v in envvars.items()) + "]", "nodes:",
    ]  # fmt: skip
    for idx, node in enumerate(nodes):
        usr = ", ".join(f"{k}: {v}" for k, v in node.env.items())
        lines += [
            "  - slnodedef:", f"      idx: {idx}", "      identity: []", f"      slhostname: {node.uid}",
            f"      usrhostname: user{idx}", f"      privatedata: {{src: '{node.private}', mType: BIND}}",
            "      slenvvars: null", f"      usrenvvars: [{usr}]",
        ]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def write_run_task(path: Path, name: str, *, program: Path, envvars: Mapping[str, object]) -> Path:
    """A RUN_SWARM task running ``program`` (its directory is mounted as the model directory)."""
    env = ", ".join(f'"{k}": {v}' for k, v in envvars.items())
    path.write_text(
        f"Name: {name}\nTaskType: RUN_SWARM\nAuthor: bench\nPrereq: ROOTTASK\nOutcome: {name}\nBody:\n"
        f"    Command: model/{program.name}\n    Entrypoint: python3\n    WorkingDir: /tmp/test\n"
        f"    Envvars: [{env}]\n    PrivateContent: /tmp/test/\n    SharedContent:\n"
        f"    -   Src: {program.parent}\n        Tgt: /tmp/test/model\n        MType: BIND\n"
    )
    return path


def start_swop(
    procs: Processes, port: int, profile: Path, work: Path, uid: str = "swop-1", name: str | None = None
) -> None:
    """Start ``swarm swop`` with ``profile`` (run directories kept for the logs) as process ``name``
    (default: its uid)."""
    argv = [
        SWARM, "swop", "--profile", str(profile), "--uid", uid, "--sn-api-port", str(port),
        "--work-dir", str(work),
    ]  # fmt: skip
    procs.start(name or uid, argv, env={"SWOP_KEEP_CONTAINERS": "True"})


def identity_args(pki: Path | None, uid: str) -> list[str]:
    """``--cert/--key/--capath`` of ``uid`` in a folder made by ``certs.init_swarm`` (none without one)."""
    if pki is None:
        return []
    return [
        "--cert", str(pki / f"{uid}-cert.pem"), "--key", str(pki / f"{uid}-key.pem"),
        "--capath", str(pki / "ca" / "capath"),
    ]  # fmt: skip


def start_sl(
    procs: Processes,
    port: int,
    uid: str,
    *,
    program: Path,
    work: Path,
    env: Mapping[str, object],
    pki: Path | None = None,
    fork_server: str | None = None,
) -> None:
    """Start a standalone ``swarm sl`` (the reference's ``run-sl``) running a copy of ``program``.

    The copy sits in the node's own directory under ``work``, where the SL also writes the program's
    ``<program>_sw.log``. ``pki``: a folder of ``certs.init_swarm`` holding ``uid``'s identity (mutual
    TLS, signed transactions and weights). ``fork_server``: the socket of a server of
    ``start_fork_server`` that the SL asks to start the program, as the SL of a SWOP does.
    """
    node_dir = work / uid
    node_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(program, node_dir / program.name)
    argv = [
        SWARM, "sl", "--name", uid, "--sn-api-port", str(port), "--ml-w", str(node_dir),
        "--ml-cmd", program.name, "--run-dir", str(node_dir / "run"), "--linger", "5",
        *identity_args(pki, uid),
    ]  # fmt: skip
    for key, value in env.items():
        argv += ["--ml-e", f"{key}={value}"]
    procs.start(uid, argv, env=None if fork_server is None else {FORKSERVER_ENV: fork_server})


def start_fork_server(
    procs: Processes, socket: Path, env: Mapping[str, object], timeout: float = FORK_SERVER_READY_TIMEOUT_S
) -> str:
    """Start the ML fork server (``swarmlearning/forkserver.py``) that a SWOP would start for programs run
    with ``env`` on top of ours (the variables read at import must be the programs'); returns its socket,
    the SLs' ``SWARM_ML_FORKSERVER``, once it listens (before it imports torch)."""
    argv = [sys.executable, "-m", "swarmlearning.forkserver", "--socket", str(socket)]
    procs.start("forkserver", argv, env={key: str(value) for key, value in env.items()})
    procs.wait_for_line("forkserver", FORK_SERVER_READY_LINE, timeout)
    return str(socket)


def forked_programs(sl_logs: Sequence[str]) -> int:
    """How many of the SLs whose output is ``sl_logs`` started their program from a fork server."""
    return sum(FORKED_LINE in text for text in sl_logs)


@asynccontextmanager
async def ledger_session(port: int, uid: str = "bench-swci") -> AsyncIterator[LedgerClient]:
    """A bus session on the SN's broker with a client of its ledger (what ``swci`` holds)."""
    async with Bus(BusConfig(BrokerAddress("127.0.0.1", port), uid, "swci")) as bus:
        yield await LedgerClient.connect(bus, timeout=30)


async def register_task(ledger: LedgerClient, path: Path) -> str:
    """CREATE TASK FROM ``path`` and FINALIZE TASK; returns its name."""
    d = load_task_definition(path)
    body = {"name": d.name, "type": d.task_type, "author": d.author, "prereq": d.prereq, "outcome": d.outcome}
    await ledger.submit("task.create", {**body, "body": body_lines(d)})
    await ledger.submit("task.finalize", {"name": d.name})
    return d.name


async def wait_enrolled(ledger: LedgerClient, count: int, timeout: float = 60.0) -> None:
    """Wait until ``count`` SWOPs listen on the taskrunner."""
    async with ledger.watch("taskrunner", RUNNER) as watch:
        while len(await ledger.query("taskrunner.peers", name=RUNNER)) < count:
            await watch.next(timeout=timeout)


async def run_task(ledger: LedgerClient, task: str, peers: int, timeout: float) -> dict[str, Any]:
    """RESET TASKRUNNER, ASSIGN TASK ... WITH ``peers`` PEERS, WAIT FOR TASKRUNNER; returns its status."""
    await ledger.submit("taskrunner.reset", {"taskrunner": RUNNER})
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with ledger.watch("taskrunner", RUNNER) as watch:
        await ledger.submit("taskrunner.assign", {"task": task, "taskrunner": RUNNER, "peers": peers})
        while True:
            view = await ledger.query("taskrunner.status", name=RUNNER)
            if view["state"] in ("COMPLETE", "ERROR"):
                return dict(view)
            await watch.next(timeout=max(deadline - loop.time(), 0.01))
