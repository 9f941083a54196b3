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
        found = re.findall(r"FINAL_DIGEST ([0-9a-f]{64})", self.output())
        return found[-1] if found else None

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
    sn: RunningSN, uid: str, work: Path, sl_env: dict[str, str] | None = None, **env: object
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
        "--linger", "10",
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
