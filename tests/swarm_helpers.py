"""Helpers for end-to-end tests: start standalone SLs running the tiny training program."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import RunningSN

PROGRAM = Path(__file__).parent / "programs" / "tiny_train.py"


@dataclass
class RunningSL:
    """A ``swarm sl`` subprocess."""

    uid: str
    process: subprocess.Popen[bytes]
    out: Path

    def output(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def final_digest(self) -> str | None:
        found = self.final_digests()
        return found[-1] if found else None

    def final_digests(self) -> list[str]:
        """One per process of the node (several under torchrun)."""
        return re.findall(r"FINAL_DIGEST ([0-9a-f]{64})", self.output())

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.uid} did not finish in {timeout} s:\n{self.output()[-4000:]}"
            ) from None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            self.process.wait(30)


def start_sl(
    sn: RunningSN,
    uid: str,
    work: Path,
    sl_env: dict[str, str] | None = None,
    entrypoint: str = "python3",
    sl_args: list[str] | None = None,
    **env: object,
) -> RunningSL:
    """Start ``swarm sl`` for ``uid`` running the tiny program in its own copy of the program dir."""
    node_dir = work / uid
    node_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROGRAM, node_dir / PROGRAM.name)
    out = node_dir / "sl.out"
    ml_env = {"SCRATCH_DIR": str(node_dir / "scratch"), **{k: str(v) for k, v in env.items()}}
    argv = [
        sys.executable, "-m", "daemons.cli", "sl", "--name", uid, "--sn-api-port", str(sn.port),
        "--ml-w", str(node_dir), "--ml-cmd", PROGRAM.name, "--run-dir", str(node_dir / "run"),
        "--ml-entrypoint", entrypoint,
        "--linger", "10", *(sl_args or []),
    ]  # fmt: skip
    for key, value in ml_env.items():
        argv += ["--ml-e", f"{key}={value}"]
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            argv,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(sl_env or {})},
        )
    return RunningSL(uid, proc, out)


def wait_for(predicate: object, timeout: float, what: str) -> None:
    """Poll ``predicate()`` (a test helper; the product never polls) until true or fail with ``what``."""
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def write_swarm_setup(
    work: Path, nodes: int, envvars: dict[str, object], *, prereq: str = "ROOTTASK"
) -> Path:
    """A SWOP profile with ``nodes`` slnodedefs and a RUN_SWARM task of the tiny program, in ``work``."""
    profile = [
        "groupname: test", "taskrunner: defaulttaskbb.taskdb.sml.hpe", "policyuri: ~",
        "resourcemgr: {mgrtype: DOCKER, accessinfo: {accesstype: FROMENV}}", "network: test-net",
        "apls: {locator: {host: 127.0.0.1, port: ~}}", "apisrv: {locator: {host: ~, port: ~, service: ~}}",
        "envvars: [SL_WAIT_FOR_FULL_QUORUM_SECONDS: 2]", "nodes:",
    ]  # fmt: skip
    for i in range(1, nodes + 1):
        (work / f"user{i}" / "scratch").mkdir(parents=True, exist_ok=True)
        profile += [
            "  - slnodedef:",
            f"      idx: {i - 1}", "      identity: []", f"      slhostname: t{work.name[-6:]}sl{i}",
            f"      usrhostname: user{i}", f"      privatedata: {{src: '{work / f'user{i}'}', mType: BIND}}",
            "      slenvvars: null", f"      usrenvvars: [SEED: {i}]",
        ]  # fmt: skip
    (work / "swop_profile.yaml").write_text("\n".join(profile) + "\n")
    write_tiny_task(work, envvars, prereq=prereq)
    return work / "swop_profile.yaml"


def write_tiny_task(work: Path, envvars: dict[str, object], *, prereq: str = "ROOTTASK") -> Path:
    """``work/run_tiny.yaml``: a RUN_SWARM task of the tiny program (copied to ``work/model``)."""
    model = work / "model"
    model.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROGRAM, model / PROGRAM.name)
    env = ", ".join(f'"{k}": {v}' for k, v in {"SCRATCH_DIR": "scratch", **envvars}.items())
    task = f"""Name: run_tiny
TaskType: RUN_SWARM
Author: tests
Prereq: {prereq}
Outcome: run_tiny
Body:
    Command: model/{PROGRAM.name}
    Entrypoint: python3
    WorkingDir: /tmp/test
    Envvars: [{env}]
    PrivateContent: /tmp/test/
    SharedContent:
    -   Src: {model}
        Tgt: /tmp/test/model
        MType: BIND
"""
    path = work / "run_tiny.yaml"
    path.write_text(task)
    return path


def start_swop(
    sn: RunningSN, profile: Path, work: Path, uid: str = "swop-1", **env: str
) -> subprocess.Popen[bytes]:
    """Start ``swarm swop`` with ``profile``; its output goes to ``work/swop.out``."""
    argv = [
        sys.executable, "-m", "daemons.cli", "swop", "--profile", str(profile), "--uid", uid,
        "--sn-api-port", str(sn.port), "--work-dir", str(work / "swop-work"),
    ]  # fmt: skip
    with (work / "swop.out").open("wb") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **env}
        )


def wait_for_line(node: RunningSL, text: str, timeout: float = 60.0) -> None:
    """Wait until ``text`` appears in the node's output (AssertionError with its tail after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while text not in node.output():
        assert time.monotonic() < deadline, node.output()[-2000:]
        time.sleep(0.2)


def start_together(nodes: list[RunningSL], gate: Path, timeout: float = 90.0) -> None:
    """Let nodes started with ``START_GATE=gate`` train once every one of them joined its contract (a
    quick site could otherwise finish with minPeers others before a slow one has started)."""
    for node in nodes:
        wait_for_line(node, "joined contract", timeout)
    gate.touch()
