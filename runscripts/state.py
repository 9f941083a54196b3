"""Where the reference commands keep track of their nodes: one JSON record and one log per name.

``<state>/nodes/<name>.json`` holds the pid, role, start time and log of a node started by ``run-*``;
``<state>/logs/<name>.log`` is its output when it runs in the background (``-d``); ``<state>/data/<name>``
its data (the SN's ledger, the SWOP's run directories and environments). ``<state>`` is
``$SWARM_STATE_DIR``, else ``$XDG_STATE_HOME/open-swarm``, else ``~/.local/state/open-swarm``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["NodeRecord", "alive", "find_records", "process_start", "state_dir", "stop_node"]


def state_dir() -> Path:
    """The state directory (created on first use)."""
    explicit = os.environ.get("SWARM_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser().resolve()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base).expanduser().resolve() / "open-swarm"


def process_start(pid: int) -> str:
    """The start time of process ``pid`` as the kernel counts it ("" when unknown), to tell a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]


@dataclass(frozen=True)
class NodeRecord:
    """A node started by a ``run-*`` command."""

    name: str
    role: str
    pid: int
    started: str
    log: str
    detached: bool

    @property
    def path(self) -> Path:
        """Where this record is stored."""
        return state_dir() / "nodes" / f"{self.name}.json"

    def save(self) -> None:
        """Write the record."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> NodeRecord | None:
        """Read a record; None when the file is not one."""
        try:
            raw = json.loads(path.read_text())
            return cls(**{key: raw[key] for key in ("name", "role", "pid", "started", "log", "detached")})
        except (OSError, ValueError, KeyError, TypeError):
            return None


def alive(record: NodeRecord) -> bool:
    """Whether the record's process still runs (the same process, not a reused pid)."""
    return bool(record.started) and process_start(record.pid) == record.started


def find_records(roles: set[str] | None = None) -> list[NodeRecord]:
    """Every record (of ``roles``), by name."""
    folder = state_dir() / "nodes"
    records = [NodeRecord.load(p) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    return [r for r in records if r is not None and (roles is None or r.role in roles)]


def stop_node(record: NodeRecord, grace: float = 30.0) -> bool:
    """SIGTERM the node's process group, SIGKILL after ``grace`` seconds; True if it was running."""
    if not alive(record):
        return False
    _signal(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive(record) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(record):
        _signal(record.pid, signal.SIGKILL)
    return True


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
