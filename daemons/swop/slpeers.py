"""The SL peers a SWOP spawns for a RUN_SWARM task: one ``swarm sl`` process per ``slnodedef``.

The task's WorkingDir, the node's ``privatedata`` (at PrivateContent) and SharedContent become
``--ml-v`` mounts of a per-node run directory; Envvars then ``usrenvvars`` are the ML program's
environment; the profile's ``envvars`` then ``slenvvars`` the SL's; ``usrcontaineropts: gpus`` its GPUs.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from daemons.bus.config import BrokerAddress
from daemons.processes import FORKSERVER_ENV, stop_process_group
from taskdefs import RunSwarmBody, SlNodeDef, SwopProfile

__all__ = ["PeerSpec", "SLPeer", "merge_env", "node_mounts", "sl_uid", "volume_source"]


def sl_uid(node: SlNodeDef, swop_uid: str) -> str:
    """The uid of the SL of ``node``: its certificate's CN (checked by the SL), else slhostname."""
    if node.slhostname:
        return node.slhostname
    return f"{swop_uid}-sl{node.idx}"


def merge_env(base: dict[str, str], pairs: Sequence[tuple[str, str | None]] | None) -> dict[str, str]:
    """``base`` with ``pairs`` applied in order (a None value unsets the variable)."""
    env = dict(base)
    for key, value in pairs or []:
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


@dataclass(frozen=True)
class PeerSpec:
    """Everything needed to start one SL for one task."""

    uid: str
    node: SlNodeDef
    slot: int
    run_dir: Path
    argv: list[str]
    env: dict[str, str] = field(repr=False)


def peer_spec(
    *,
    node: SlNodeDef,
    slot: int,
    profile: SwopProfile,
    body: RunSwarmBody,
    swop_uid: str,
    broker: BrokerAddress,
    network: str,
    sn_uid: str,
    run_dir: Path,
    python: str,
    volumes: Path,
    ml_env: Mapping[str, str] | None = None,
    forkserver: str | None = None,
) -> PeerSpec:
    """The ``swarm sl`` command line and environment for ``node`` running ``body``; ``ml_env`` (a
    trial's parameters, say) goes into the ML program's environment last; ``forkserver``: the socket of
    the fork server the SL asks to start its program (``daemons/swop/forkservers.py``)."""
    uid = sl_uid(node, swop_uid)
    argv = [
        sys.executable, "-m", "daemons.cli", "sl",
        "--name", uid, "--broker", str(broker), "--network", network, "--sn-uid", sn_uid,
        "--parent", swop_uid, "--taskrunner", profile.taskrunner, "--run-dir", str(run_dir),
        "--gpu-slot", str(slot),
        "--ml-entrypoint", body.entrypoint, "--ml-cmd", body.command, "--ml-w", body.working_dir,
        "--ml-python", python,
    ]  # fmt: skip
    for mount in node_mounts(node, body, volumes):
        argv += ["--ml-v", mount]
    env_ml = {**merge_env(dict(body.envvars or []), node.usrenvvars), **(ml_env or {})}
    for key, value in env_ml.items():
        argv += ["--ml-e", f"{key}={value}"]
    if node.gpus is not None:
        argv += ["--ml-gpus", str(node.gpus)]
    if node.nproc is not None:
        argv += ["--ml-nproc", str(node.nproc)]
    for flag, a_type in (("--cert", "CERT"), ("--key", "KEY"), ("--capath", "CAPATH")):
        src = node.identity_src(a_type) or (node.identity_src("CACERT") if a_type == "CAPATH" else None)
        if src:
            argv += [flag, src]
    env = merge_env(merge_env(dict(os.environ), profile.envvars), [(FORKSERVER_ENV, forkserver)])
    env = merge_env(env, node.slenvvars)
    return PeerSpec(uid, node, slot, run_dir, argv, env)


def node_mounts(node: SlNodeDef, body: RunSwarmBody, volumes: Path) -> list[str]:
    """``--ml-v`` mounts of ``node`` for ``body``: its private data and the shared content."""
    mounts = []
    if body.private_content and node.privatedata is not None:
        mounts.append(
            f"{volume_source(node.privatedata.src, node.privatedata.m_type, volumes)}:{body.private_content}"
        )
    for shared in body.shared_content or []:
        mounts.append(f"{volume_source(shared.src, shared.m_type, volumes)}:{shared.tgt}")
    return mounts


def volume_source(src: str, m_type: str, volumes: Path) -> str:
    """A BIND source is a host path; a VOLUME is a directory of the SWOP named after it."""
    if m_type == "VOLUME":
        path = volumes / src
        path.mkdir(parents=True, exist_ok=True)
        return str(path)
    return src


class SLPeer:
    """One running ``swarm sl`` process; its output goes to ``<run_dir>/sl.out``."""

    def __init__(self, spec: PeerSpec) -> None:
        self.spec = spec
        self.tail: deque[str] = deque(maxlen=12)
        self.stopped = False
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self._proc is not None and self._proc.returncode is None

    async def run(self) -> int:
        """Start the SL and wait for it; returns its exit status."""
        self.spec.run_dir.mkdir(parents=True, exist_ok=True)
        self._proc = await asyncio.create_subprocess_exec(
            *self.spec.argv,
            env=self.spec.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            limit=1 << 22,
        )
        assert self._proc.stdout is not None  # noqa: S101 - PIPE was asked for
        with (self.spec.run_dir / "sl.out").open("a", buffering=1) as out:
            async for raw in self._proc.stdout:
                line = raw.decode(errors="replace").rstrip()
                out.write(line + "\n")
                self.tail.append(line)
        return await self._proc.wait()

    def describe_failure(self, code: int) -> str:
        """Exit status and the last lines of the SL's output (the ML program's are among them)."""
        lines = [_short(line) for line in self.tail if line.strip()][-6:]
        return f"exit code {code}; last lines:\n" + "\n".join(lines)

    @property
    def pid(self) -> int | None:
        """The SL's process id, once started."""
        return self._proc.pid if self._proc is not None else None

    async def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the SL (which stops its ML program), SIGKILL after ``grace`` seconds."""
        self.stopped = True
        if self._proc is not None:
            await stop_process_group(self._proc, grace)


def _short(line: str) -> str:
    """Drop our log prefix (time, logger, level) from a line for a compact description."""
    marker = " ml | "
    if marker in line:
        return line.split(marker, 1)[1]
    parts = line.split(" ", 4)
    return parts[4] if len(parts) == 5 and parts[3] in ("INFO", "WARNING", "ERROR", "DEBUG") else line
