"""Daemons that a benchmark starts, each in its own session, and stops for sure: SIGTERM, then SIGKILL.

``Processes`` is a context manager: whatever happens inside, every process it started and every
descendant of one (an SWOP's SLs and their ML programs run in sessions of their own) is stopped on exit.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["Processes", "alive", "children_cpu_seconds", "cpu_seconds", "descendants"]


def _parents() -> dict[int, int]:
    """``pid -> parent pid`` of every process, from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    return parents


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``."""
    parents = _parents()
    found: list[int] = []
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        kids = [child for child, ppid in parents.items() if ppid == parent]
        found += kids
        frontier += kids
    return found


def children_cpu_seconds() -> float:
    """User + system CPU time of every finished, waited-for descendant of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process so far (0.0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (from /proc)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


class Processes:
    """Processes started for one benchmark, with their output in ``logs/<name>.log``."""

    def __init__(self, logs: Path, *, grace: float = 20.0) -> None:
        self.logs = logs
        self.grace = grace
        self.started: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> Processes:
        self.logs.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_all()

    def start(
        self, name: str, argv: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in a new session; stdout and stderr go to ``logs/<name>.log``."""
        with self.log_path(name).open("wb") as out:
            proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,
            )
        self.started[name] = proc
        return proc

    def log_path(self, name: str) -> Path:
        """Where the output of ``name`` goes."""
        return self.logs / f"{name}.log"

    def output(self, name: str) -> str:
        """The output of ``name`` so far."""
        path = self.log_path(name)
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_for_line(self, name: str, pattern: str, timeout: float = 60.0) -> None:
        """Wait until ``pattern`` appears in the output of ``name``; RuntimeError if it dies or times out."""
        proc = self.started[name]
        deadline = time.monotonic() + timeout
        while pattern not in self.output(name):
            if proc.poll() is not None or time.monotonic() > deadline:
                code = proc.poll()
                why = f"exited with {code}" if code is not None else f"timed out ({timeout:g} s)"
                raise RuntimeError(f"{name} {why} before printing {pattern!r}:\n{self.output(name)[-2000:]}")
            time.sleep(0.02)

    def stop(self, name: str) -> None:
        """Stop one process and its descendants."""
        proc = self.started.pop(name, None)
        if proc is not None:
            self._stop([proc])

    def stop_all(self) -> None:
        """Stop every process still running, newest first, and everything they started."""
        procs = list(reversed(self.started.values()))
        self.started.clear()
        self._stop(procs)

    def _stop(self, procs: list[subprocess.Popen[bytes]]) -> None:
        family = {pid for proc in procs for pid in descendants(proc.pid)}
        for proc in procs:
            if proc.poll() is None:
                _signal(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(deadline - time.monotonic(), 0.01))
        family |= {pid for proc in procs for pid in descendants(proc.pid)}
        for proc in procs:
            if proc.poll() is None:
                _signal(proc.pid, signal.SIGKILL)
                proc.wait()
        for pid in family:
            if alive(pid):
                _signal(pid, signal.SIGTERM)
        time.sleep(0.2 if family else 0)
        for pid in family:
            if alive(pid):
                _signal(pid, signal.SIGKILL)
