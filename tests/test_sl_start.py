"""An SL starts its ML program before it connects to the swarm; when it cannot connect, it stops the
program and says why (a real ``swarm sl`` subprocess pointed at a port where no broker listens)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench.processes import alive
from daemons.broker import free_port

PROGRAM = """\
import os, pathlib, time
pathlib.Path("ml.pid").write_text(str(os.getpid()))
time.sleep(120)
"""


def test_an_sl_without_a_broker_stops_the_program_it_started_and_says_why(tmp_path: Path) -> None:
    (tmp_path / "wait.py").write_text(PROGRAM)
    argv = [
        sys.executable, "-m", "daemons.cli", "sl", "--name", "lonely", "--sn-api-port", str(free_port()),
        "--ml-w", str(tmp_path), "--ml-cmd", "wait.py", "--run-dir", str(tmp_path / "run"),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=dict(os.environ))
    assert done.returncode != 0
    assert "swarm sl lonely: cannot connect to mqtt://127.0.0.1:" in done.stderr  # itself, not a group
    pid = int((tmp_path / "ml.pid").read_text())  # the program was started before the connection failed
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid)
