"""A swarm spread over network-namespace hosts: per-host certificates, SWOP profiles, daemons, swci.

Used by the ``multihost`` tests. Every daemon is told the address of its own host (``--host-ip``) and the
broker's address on the test subnet; nothing talks over 127.0.0.1 between hosts.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from certs.pki import create_ca, issue_identity
from tests.netns import Host
from tests.swarm_helpers import write_tiny_task

T = TypeVar("T")
RUNNER = "defaulttaskbb.taskdb.sml.hpe"
SN_PORT = 30304
DAEMON = [sys.executable, "-m", "daemons.cli"]


@dataclass(frozen=True)
class Ident:
    """Certificate, key and CA path of one identity."""

    cert: Path
    key: Path
    capath: Path

    def args(self) -> list[str]:
        return ["--cert", str(self.cert), "--key", str(self.key), "--capath", str(self.capath)]


@dataclass
class Pki:
    """A swarm CA in ``root`` that issues identities whose SANs name their host's address."""

    root: Path
    capath: Path = field(init=False)

    def __post_init__(self) -> None:
        ca = create_ca(self.root / "ca")
        self.capath = ca.capath

    def issue(self, uid: str, role: str, *addresses: str) -> Ident:
        files = issue_identity(self.root / "ca", uid, role, self.root / "ids", sans=(*addresses, "localhost"))
        return Ident(files.cert, files.key, self.capath)


async def until(read: Callable[[], Awaitable[T]], timeout: float, pause: float = 0.2) -> T:
    """The first truthy value of ``read()``, polled every ``pause`` seconds (tests only)."""
    async with asyncio.timeout(timeout):
        while True:
            value = await read()
            if value:
                return value
            await asyncio.sleep(pause)


def wait_for_line(log: Path, pattern: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> str:
    """Wait until ``log`` has a line matching ``pattern`` (a test helper; the product never polls)."""
    deadline = time.monotonic() + timeout
    regex = re.compile(pattern)
    while True:
        text = log.read_text(errors="replace") if log.exists() else ""
        found = regex.search(text)
        if found:
            return found.group(0)
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no line matching {pattern!r} in {log}:\n{text[-4000:]}")
        time.sleep(0.1)


def start_sn(
    host: Host, work: Path, ident: Ident | None, *, uid: str = "sn-1", extra: list[str] | None = None
) -> subprocess.Popen[bytes]:
    """``swarm sn`` on ``host`` (listening on its address); returns once it serves."""
    data = work / uid
    log = data / "sn.out"
    argv = [*DAEMON, "sn", "--uid", uid, "--data-dir", str(data), "--host-ip", host.address,
            "--sn-api-port", str(SN_PORT), *(ident.args() if ident else []), *(extra or [])]  # fmt: skip
    proc = host.popen(argv, log=log)
    wait_for_line(log, "Starting SWARM-API-SERVER", proc)
    return proc


def write_profile(
    work: Path, swop: str, sls: list[tuple[str, Ident | None]], envvars: dict[str, object]
) -> Path:
    """A SWOP profile for ``swop`` with one slnodedef per SL (its identity, private data dir), and the
    tiny program's task ``work/run_tiny.yaml``."""
    lines = [
        "groupname: test", f"taskrunner: {RUNNER}", "policyuri: ~",
        "resourcemgr: {mgrtype: DOCKER, accessinfo: {accesstype: FROMENV}}", "network: test-net",
        "apls: {locator: {host: apls, port: ~}}", "apisrv: {locator: {host: ~, port: ~, service: ~}}",
        "envvars: [SL_WAIT_FOR_FULL_QUORUM_SECONDS: 2]", "nodes:",
    ]  # fmt: skip
    for idx, (uid, ident) in enumerate(sls):
        data = work / swop / uid
        (data / "scratch").mkdir(parents=True, exist_ok=True)
        identity = "[]"
        if ident is not None:
            attrs = (("KEY", ident.key), ("CERT", ident.cert), ("CAPATH", ident.capath))
            identity = (
                "["
                + ", ".join(
                    f"{{attribute: {{aType: {a}, mType: BIND, src: '{src}', tgt: /id/{a}, subPath: null}}}}"
                    for a, src in attrs
                )
                + "]"
            )
        lines += [
            "  - slnodedef:", f"      idx: {idx}", f"      identity: {identity}", f"      slhostname: {uid}",
            f"      usrhostname: u{uid}", f"      privatedata: {{src: '{data}', mType: BIND}}",
            "      slenvvars: null", f"      usrenvvars: [SEED: {idx + 1}]",
        ]  # fmt: skip
    path = work / f"{swop}-profile.yaml"
    path.write_text("\n".join(lines) + "\n")
    write_tiny_task(work, envvars)
    return path


def start_swop(
    host: Host, work: Path, uid: str, profile: Path, broker: str, ident: Ident | None, *extra: str
) -> subprocess.Popen[bytes]:
    """``swarm swop`` on ``host``; its output goes to ``work/<uid>.out``."""
    argv = [*DAEMON, "swop", "--uid", uid, "--profile", str(profile), "--broker", broker,
            "--work-dir", str(work / f"{uid}-work"), *(ident.args() if ident else []), *extra]  # fmt: skip
    return host.popen(argv, log=work / f"{uid}.out")


def swci_script(work: Path, broker_host: str, port: int, peers: int, *, name: str = "swci-init") -> Path:
    """An init script that runs the tiny task on ``peers`` SL nodes and waits for it."""
    script = work / name
    script.write_text(
        f"""EXIT ON FAILURE
WAIT FOR IP {broker_host} {port}
CREATE CONTEXT mh WITH IP {broker_host} {port}
SWITCH CONTEXT mh
CREATE TASK FROM {work / "run_tiny.yaml"}
FINALIZE TASK run_tiny
RESET TASKRUNNER {RUNNER}
ASSIGN TASK run_tiny TO {RUNNER} WITH {peers} PEERS
WAIT FOR TASKRUNNER {RUNNER}
GET TASKRUNNER STATUS {RUNNER}
EXIT
"""
    )
    return script


def final_digests(work: Path) -> dict[str, str]:
    """``FINAL_DIGEST`` of every ML program under ``work`` (by its SL's run directory)."""
    found = {}
    for log in sorted(work.glob("*-work/runs/run_tiny/*/ml.log")):
        digests = re.findall(r"FINAL_DIGEST ([0-9a-f]{64})", log.read_text(errors="replace"))
        found[log.parent.name] = digests[-1] if digests else ""
    return found


MQTT_PORT = 30304
NATS_CLIENT_PORT = 4222
NATS_ROUTE_PORT = 6222


def start_nats_cluster(
    hosts: list[Host], work: Path, ident: dict[str, Ident] | None = None
) -> dict[str, subprocess.Popen[bytes]]:
    """A NATS cluster node (MQTT on ``MQTT_PORT``) on each of ``hosts``, all started at once, each
    routed to the others; returns once every node serves and knows the JetStream meta leader."""
    procs = {}
    for host in hosts:
        name = f"nats-{host.name}"
        routes = ",".join(f"{p.address}:{NATS_ROUTE_PORT}" for p in hosts if p is not host)
        argv = [*DAEMON, "broker", "--engine", "nats", "--name", name, "--host", host.address,
                "--port", str(MQTT_PORT), "--nats-port", str(NATS_CLIENT_PORT),
                "--cluster-port", str(NATS_ROUTE_PORT), "--routes", routes,
                "--workdir", str(work / name)]  # fmt: skip
        if ident is not None:
            argv += ident[host.name].args()
        procs[host.name] = host.popen(argv, log=work / name / "broker.out")
    for host in hosts:
        name = f"nats-{host.name}"
        wait_for_line(work / name / "broker.out", "listening on", procs[host.name])
        wait_for_line(work / name / "nats-server.log", "metadata leader", procs[host.name])
    return procs


def cluster_urls(hosts: list[Host], *, tls: bool = False) -> tuple[str, str]:
    """``(mqtt list, nats list)`` of the cluster on ``hosts``."""
    mqtt = ",".join(f"{'mqtts' if tls else 'mqtt'}://{h.address}:{MQTT_PORT}" for h in hosts)
    nats = ",".join(f"{'tls' if tls else 'nats'}://{h.address}:{NATS_CLIENT_PORT}" for h in hosts)
    return mqtt, nats
