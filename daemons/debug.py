"""SIGUSR1 makes a daemon log the stack of every asyncio task: what is it waiting for?"""

from __future__ import annotations

import asyncio
import io
import logging
import signal

__all__ = ["dump_tasks", "install_task_dump"]

log = logging.getLogger("swarm.debug")


def dump_tasks() -> str:
    """Every task of the running loop with where it is suspended."""
    out = io.StringIO()
    for task in asyncio.all_tasks():
        out.write(f"--- {task.get_name()} {'(done)' if task.done() else ''}\n")
        task.print_stack(limit=12, file=out)
    return out.getvalue()


def install_task_dump() -> None:
    """Log the tasks' stacks on SIGUSR1 (call from inside the event loop)."""
    asyncio.get_running_loop().add_signal_handler(
        signal.SIGUSR1, lambda: log.warning("tasks:\n%s", dump_tasks())
    )
