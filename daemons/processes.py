"""Stopping child processes and daemons the same way everywhere: gently first, then for sure."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Mapping
from typing import Protocol

__all__ = ["FORKSERVER_ENV", "ChildProcess", "install_stop_signals", "program_environ", "stop_process_group"]

FORKSERVER_ENV = "SWARM_ML_FORKSERVER"  # an SL's: the socket of its SWOP's fork server for ML programs


class ChildProcess(Protocol):
    """What stopping a started program needs of it (``asyncio.subprocess.Process`` is one)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


def program_environ(base: Mapping[str, str], *layers: Mapping[str, str]) -> dict[str, str]:
    """The environment of an ML program: ``base`` (a daemon's) with ``layers`` applied in order, less what
    the daemons set for themselves: their one OpenBLAS thread (``daemons.cli.limit_blas_threads``) and
    the fork server an SL uses."""
    env = dict(base)
    for layer in layers:
        env.update(layer)
    if env.pop("SWARM_BLAS_LIMITED", None):
        env.pop("OPENBLAS_NUM_THREADS", None)
    env.pop(FORKSERVER_ENV, None)
    return env


async def stop_process_group(proc: ChildProcess, grace: float) -> None:
    """SIGTERM the process group of ``proc`` (it started a session); SIGKILL it after ``grace`` s."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        async with asyncio.timeout(grace):
            await proc.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


def install_stop_signals(stop: Callable[[], None]) -> None:
    """SIGTERM and SIGINT call ``stop`` (call from inside the event loop)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
