"""Stopping child processes and daemons the same way everywhere: gently first, then for sure."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable

__all__ = ["install_stop_signals", "stop_process_group"]


async def stop_process_group(proc: asyncio.subprocess.Process, grace: float) -> None:
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
