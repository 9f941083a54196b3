"""The SWOP's fork servers for ML programs (``swarmlearning/forkserver.py``): one per ML environment.

A RUN_SWARM task's SLs on this host all run their program with one interpreter and, but for a few
variables of their own, one environment. The SWOP starts a server in that environment before it starts
the SLs; the server imports torch once, and each SL's program is a fork of it instead of a fresh
interpreter importing torch again (four nodes on two cores: their programs train about 3 s sooner).
A server stays while the SWOP runs, so the next task in the same environment finds it warm.
``SWARM_ML_FORKSERVER=0`` in the SWOP's environment turns them off.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Container, Mapping
from pathlib import Path
from types import TracebackType

from daemons.gpus import cuda_env, visible_gpus
from daemons.processes import FORKSERVER_ENV, program_environ
from daemons.swop.slpeers import merge_env
from taskdefs import RunSwarmBody, SlNodeDef, SwopProfile
from wire.forks import import_time

__all__ = ["READY_LINE", "READY_TIMEOUT_S", "ForkServers", "fork_servers_enabled"]

log = logging.getLogger("swarm.swop.forks")

READY_TIMEOUT_S = 30.0  # from the start to "listening": an interpreter's start, before any import
STOP_WAIT_S = 5.0
READY_LINE = "fork server: listening on "  # what a server prints once it listens


def fork_servers_enabled(env: Mapping[str, str]) -> bool:
    """Whether ``env`` (the SWOP's) leaves fork servers on."""
    return env.get(FORKSERVER_ENV, "").strip().lower() not in ("0", "false", "no", "off")


class _Server:
    def __init__(self, proc: asyncio.subprocess.Process, path: str) -> None:
        self.proc, self.path = proc, path
        self.output: asyncio.Task[None] | None = None  # copies its lines to our log


class ForkServers:
    """The fork servers of one SWOP, by interpreter and environment; an async context manager that
    stops them at its end."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._servers: dict[str, _Server] = {}
        self._dir: Path | None = None
        self._group = asyncio.TaskGroup()

    async def __aenter__(self) -> ForkServers:
        await self._group.__aenter__()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.gather(*(self._stop(server) for server in self._servers.values()))
        await self._group.__aexit__(kind, exc, tb)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    async def for_nodes(
        self,
        python: str,
        profile: SwopProfile,
        body: RunSwarmBody,
        nodes: list[SlNodeDef],
        *,
        starting: Container[int] | None = None,
    ) -> dict[int, str | None]:
        """The server each of ``nodes`` (running ``body``) may ask to start its program, by node index:
        nodes whose programs would import torch in the same environment share one (``sockets_for``).
        ``starting``: the indices of the nodes that start now (default: all); a node's GPU slot is its
        place in ``nodes`` whichever start."""
        if not self.enabled:
            return {}
        base = merge_env(dict(os.environ), profile.envvars)
        visible = await asyncio.to_thread(visible_gpus) if any(n.gpus is not None for n in nodes) else []
        programs: dict[int, dict[str, str]] = {}
        for slot, node in enumerate(nodes):  # the SL's environment and the program's, as the SL makes them
            if starting is not None and node.idx not in starting:
                continue
            with contextlib.suppress(ValueError):  # a gpus option the SL will refuse
                usr = merge_env(dict(body.envvars or []), node.usrenvvars)
                usr.update(cuda_env(node.gpus, slot, visible))
                programs[node.idx] = program_environ(merge_env(base, node.slenvvars), usr)
        common = program_environ(merge_env(base, body.envvars))
        return await self.sockets_for(python, common, programs)

    async def sockets_for(
        self, python: str, env: Mapping[str, str], programs: Mapping[int, Mapping[str, str]]
    ) -> dict[int, str | None]:
        """A server for each group of ``programs`` (environments by node index) that agree in every
        variable read at import time; ``env``, the programs' common environment, gives the server the
        rest of its own. By node index: the socket of its group's server, or None. A group of one gains
        nothing from its first program, but its server stays warm for the next task or trial."""
        groups: dict[tuple[tuple[str, str], ...], list[int]] = {}
        for idx, program_env in programs.items():
            key = tuple(sorted((k, v) for k, v in program_env.items() if import_time(k)))
            groups.setdefault(key, []).append(idx)
        found: dict[int, str | None] = dict.fromkeys(programs)
        for key, members in groups.items():
            server_env = {**{k: v for k, v in env.items() if not import_time(k)}, **dict(key)}
            found.update(dict.fromkeys(members, await self.socket_for(python, server_env)))
        return found

    async def socket_for(self, python: str, env: Mapping[str, str]) -> str | None:
        """The socket of the server running ``python`` in ``env``, started when there is none; None when
        they are off or it cannot start (the SLs then start their programs themselves)."""
        if not self.enabled:
            return None
        key = hashlib.sha256(repr((python, sorted(env.items()))).encode()).hexdigest()[:16]
        server = self._servers.get(key)
        if server is not None and server.proc.returncode is None:
            return server.path
        try:
            server = await self._start(python, env, key)
        except (OSError, RuntimeError) as exc:
            log.warning("no fork server for %s: %s; each ML program starts its own interpreter", python, exc)
            return None
        self._servers[key] = server
        return server.path

    async def _start(self, python: str, env: Mapping[str, str], key: str) -> _Server:
        if self._dir is None:  # short (a unix socket's path has at most 107 bytes) and ours alone (0700)
            self._dir = Path(tempfile.mkdtemp(prefix="swarm-forks-"))
        path = str(self._dir / f"{key}.sock")
        argv = [python, "-m", "swarmlearning.forkserver", "--socket", path, "--watch-stdin", "--remove-dir"]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=dict(env),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        assert proc.stdout is not None  # noqa: S101 - PIPE was asked for
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                async for raw in proc.stdout:
                    line = raw.decode(errors="replace").rstrip()
                    if line.startswith(READY_LINE):
                        break
                    log.info("fork server | %s", line)
                else:
                    raise RuntimeError(f"it exited ({await proc.wait()}) before it listened")
        except (TimeoutError, RuntimeError) as exc:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            why = str(exc) or f"it did not listen within {READY_TIMEOUT_S:g} s"
            raise RuntimeError(why) from None
        log.info("fork server (pid %d) for %s listening on %s", proc.pid, python, path)
        server = _Server(proc, path)
        server.output = self._group.create_task(self._copy_output(proc), name=f"swop.forkserver.{proc.pid}")
        return server

    @staticmethod
    async def _copy_output(proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None  # noqa: S101
        async for raw in proc.stdout:
            log.info("fork server | %s", raw.decode(errors="replace").rstrip())

    @staticmethod
    async def _stop(server: _Server) -> None:
        """Its stdin closed and SIGTERM: the server stops listening and ends once its programs have (the
        SLs were stopped first); one still serving a program after ``STOP_WAIT_S`` is left to end with it."""
        proc = server.proc
        if proc.stdin is not None:
            proc.stdin.close()
        if proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_WAIT_S):
                await proc.wait()
        if proc.returncode is None:
            log.info("fork server (pid %d) still serves a running program; it ends with it", proc.pid)
            if server.output is not None:
                server.output.cancel()
