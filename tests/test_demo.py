"""``make demo`` stops everything it started when it is stopped (SIGTERM, as ``timeout`` sends)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daemons.broker import free_port

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "mnist-pyt" / "run_demo.py"


def _parents() -> dict[int, int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(pid: int) -> set[int]:
    """Every living process started (directly or not) by ``pid``."""
    parents = _parents()
    found: set[int] = set()
    grew = True
    while grew:
        more = {child for child, parent in parents.items() if (parent == pid or parent in found)}
        grew = not more <= found
        found |= more
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_stops_everything_the_demo_started(tmp_path: Path) -> None:
    ws = tmp_path / "demo"
    proc = subprocess.Popen(
        [sys.executable, str(DEMO), "--workspace", str(ws), "--port", str(free_port())],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "SWCI_WAIT_INTERVAL": "0.5"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        seen: set[int] = set()
        ml_running = False
        while time.monotonic() < deadline and proc.poll() is None and not ml_running:
            seen |= descendants(proc.pid)
            commands = [Path(f"/proc/{p}/cmdline").read_bytes() for p in seen if _alive(p)]
            ml_running = sum(b"mnist_pyt.py" in c and b"daemons.cli" not in c for c in commands) >= 4
            time.sleep(0.2)
        assert ml_running, f"the demo never ran 4 ML programs:\n{proc.stdout.read() if proc.stdout else ''}"
        seen |= descendants(proc.pid)
        assert len(seen) >= 12  # SN, mosquitto, SWOP, 4 SLs, 4 ML programs, swci
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=120)
        assert proc.returncode == 130, output[-3000:]
        assert "stopping the demo" in output
        left = sorted(p for p in seen if _alive(p))
        commands = [Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")[:200] for p in left]
        assert left == [], commands
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in descendants(proc.pid):
            os.kill(pid, signal.SIGKILL)
