"""The training views' commands: WATCH CONTRACT, PERFDATA ... HISTORY, PLOT CONTRACT, and the training
panel of ``WAIT FOR TASKRUNNER`` on a terminal.

=================================  ==========================================================
command                            ledger
=================================  ==========================================================
WATCH CONTRACT                     events of ``contract`` + queries ``contract.status``,
                                   ``contract.perfdata``, ``contract.rounds``
PERFDATA <contract> HISTORY        the chain (``blocks``), folded by ``contracts.history``
PLOT CONTRACT                      the same history, drawn by :mod:`swci.plots`
=================================  ==========================================================

:data:`TRAINING_HANDLERS` maps each command type to its handler (the executor looks here after
:data:`swci.remote_commands.HANDLERS`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from typing import Any

from rich.console import Console
from rich.live import Live

from swci.commands import Command, PerfdataHistory, PlotContract, WaitForTaskrunner, WatchContract
from swci.connection import LedgerLink
from swci.history import history_table, write_history
from swci.output import Result
from swci.progress import LiveProgress, taskrunner_progress
from swci.remote_commands import Call, Handler
from swci.tables import perfdata_table
from swci.training_view import Training, TrainingFollower, members, progress_lines, training_table
from swci.waiting import TIMEOUT_WARNING, wait_for_taskrunner, wait_limit

__all__ = ["TRAINING_HANDLERS", "watch_contract"]

View = dict[str, Any]


# --- WATCH CONTRACT ----------------------------------------------------------------------------------


def _ended(first: Training | None, now: Training) -> bool:
    """COMPLETE, or reset after it had members (the reference's scripts reset at their end)."""
    return now.over or (first is not None and bool(first.perf) and not now.perf)


async def _follow_until_over(follower: TrainingFollower, console: Console, mode: str, limit: float) -> bool:
    """Show the training until it is over (True) or ``limit`` seconds passed (False)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    first: Training | None = None
    shown: Training | None = None
    live = Live(console=console, refresh_per_second=4, transient=False) if mode == "live" else None
    if live is not None:
        live.start()
    try:
        while True:
            training = follower.training
            if training is not None:
                first = first or training.copy()
                if mode == "lines":
                    for line in progress_lines(shown, training):
                        console.print(line, markup=False, highlight=False)
                    shown = training.copy()
                if live is not None:
                    live.update(training_table(training), refresh=True)
                if _ended(first, training):
                    return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            follower.changed.clear()
            try:
                async with asyncio.timeout(min(remaining, 0.5 if live is not None else remaining)):
                    await follower.changed.wait()
            except TimeoutError:
                pass
    finally:
        if live is not None:
            live.stop()


async def watch_contract(link: LedgerLink, name: str, *, console: Console, mode: str, limit: float) -> Result:
    """Follow contract ``name`` until its training is over; ``mode`` is ``live``, ``lines`` or ``quiet``."""
    await link.query("contract.status", name=name)  # a missing contract fails here, clearly
    follower = TrainingFollower(link, name)
    async with asyncio.TaskGroup() as group:
        task = group.create_task(follower.run(), name=f"swci.watch[{name}]")
        try:
            over = await _follow_until_over(follower, console, mode, limit)
        finally:
            task.cancel()
    training = follower.training or Training(name)
    data = {"contract": name, "status": training.status, "perfdata": training.perf, "rounds": training.rounds}
    table = perfdata_table(name, training.perf)
    if not over:
        return Result.failure(TIMEOUT_WARNING, f"contract {name} is still {training.status}", data=data)
    if training.over:
        merged = training.last_merged()
        message = f"Contract {name} is COMPLETE (last merged round {merged.get('round', '-')})"
        return Result.success(message, table=table, data=data)
    return Result.success(f"Contract {name} was reset while watching", table=table, data=data)


async def _watch(cmd: WatchContract, call: Call) -> Result:
    mode = "quiet" if not call.progress else ("live" if call.console.is_terminal else "lines")
    limit = wait_limit(cmd.timeout, {"peer_type": "SL"}, call.setting)
    return await watch_contract(call.link, cmd.name, console=call.console, mode=mode, limit=limit)


# --- WAIT FOR TASKRUNNER's training panel -----------------------------------------------------------


def _pick_for_taskrunner(link: LedgerLink, runner: str, follower: TrainingFollower) -> Any:
    """Whether a contract trains on the SLs that the taskrunner's SWOPs started."""

    async def pick(perf: Sequence[View]) -> bool:
        status = await link.query("taskrunner.status", name=runner)
        swops = set(status.get("allocation") or {})
        parents = {str(n.get("uid")): n.get("parent") for n in await link.query("nodes", role="sl")}
        if not any(parents.get(uid) in swops for uid in members(perf)):
            return False
        follower.started = status.get("assigned_at")
        return True

    return pick


async def _wait_with_training(call: Call, cmd: WaitForTaskrunner, progress: LiveProgress) -> Result:
    follower = TrainingFollower(call.link, None)
    follower.pick = _pick_for_taskrunner(call.link, cmd.name, follower)
    progress.extra = lambda: training_table(follower.training) if follower.training else None
    async with asyncio.TaskGroup() as group:
        task = group.create_task(follower.run(), name=f"swci.wait[{cmd.name}].training")
        try:
            return await _wait(call, cmd, progress)
        finally:
            task.cancel()


def _wait(call: Call, cmd: WaitForTaskrunner, progress: Any) -> Awaitable[Result]:
    return wait_for_taskrunner(
        call.link,
        cmd.name,
        limit=lambda view: wait_limit(cmd.timeout, view, call.setting),
        progress=progress,
    )


async def _wait_for_taskrunner(cmd: WaitForTaskrunner, call: Call) -> Result:
    progress = taskrunner_progress(call.console, cmd.name, enabled=call.progress)
    if isinstance(progress, LiveProgress):
        return await _wait_with_training(call, cmd, progress)
    return await _wait(call, cmd, progress)


# --- history and plots -------------------------------------------------------------------------------


async def _history(cmd: PerfdataHistory, call: Call) -> Result:
    await call.link.query("contract.status", name=cmd.name)
    history = await call.link.client.history(cmd.name)
    if cmd.path is None:
        return Result.success(table=history_table(cmd.name, history), data=history)
    path = call.session.resolve_path(cmd.path)
    try:
        kind = await asyncio.to_thread(write_history, path, history)
    except OSError as exc:
        return Result.failure(f"cannot write {path}: {exc.strerror or exc}")
    count = len(history["records"])
    message = f"Wrote {count} records of contract {cmd.name} (run {history['run']}) to {path} as {kind}"
    return Result.success(message, data={**history, "path": str(path)})


async def _plot(cmd: PlotContract, call: Call) -> Result:
    await call.link.query("contract.status", name=cmd.name)
    history = await call.link.client.history(cmd.name)
    out_dir = call.session.resolve_path(cmd.path or ".")
    from swci.plots import write_curves  # noqa: PLC0415 - matplotlib loads only when plotting

    started = time.monotonic()
    try:
        files = await asyncio.to_thread(write_curves, history["records"], out_dir, cmd.name)
    except ValueError as exc:
        return Result.failure(str(exc))
    except OSError as exc:
        return Result.failure(f"cannot write the plots to {out_dir}: {exc.strerror or exc}")
    seconds = time.monotonic() - started
    message = f"Wrote {len(files)} PNG file(s) of contract {cmd.name} to {out_dir} in {seconds:.1f} s"
    return Result.success(message, *(str(f) for f in files), data={"files": [str(f) for f in files]})


TRAINING_HANDLERS: dict[type[Command], Handler] = {
    WatchContract: _watch,
    WaitForTaskrunner: _wait_for_taskrunner,
    PerfdataHistory: _history,
    PlotContract: _plot,
}
