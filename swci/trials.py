"""Trial commands (ours): LIST TRIALS, GET BEST TRIAL and PLOT TRIALS of a ``RUN_TRIALS`` task.

===========================  =================================================================
command                      ledger
===========================  =================================================================
LIST TRIALS <task>           query ``study``: every trial, its parameters, status and metric
GET BEST TRIAL <task>        query ``study.best``: the best completed trial by the task's Metric
PLOT TRIALS <task> [TO dir]  query ``study`` with detail; PNG box plots (``swci.trial_plots``)
===========================  =================================================================
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from swci.commands import Command
from swci.output import Result, Table
from swci.remote_commands import HANDLERS, Call

__all__ = ["GetBestTrial", "ListTrials", "PlotTrials", "trials_summary", "trials_table"]

View = Mapping[str, Any]


@dataclass(frozen=True)
class ListTrials(Command):
    """``LIST TRIALS <task>`` (ours)."""

    task: str


@dataclass(frozen=True)
class GetBestTrial(Command):
    """``GET BEST TRIAL <task>`` (ours)."""

    task: str


@dataclass(frozen=True)
class PlotTrials(Command):
    """``PLOT TRIALS <task> [TO <dir>]`` (ours); None: the shell's current directory."""

    task: str
    directory: str | None = None


def _number(value: Any) -> Any:
    return f"{value:.4g}" if isinstance(value, float) else value


def trials_summary(view: View) -> str:
    """One line: how many trials are in each state."""
    counts = view.get("counts") or {}
    parts = [f"{counts.get(s, 0)} {s.lower()}" for s in ("COMPLETED", "RUNNING", "PENDING", "FAILED")]
    state = "finished" if view.get("finished") else "running"
    return f"Trials of {view.get('task')} ({view.get('kind')}, {state}): {', '.join(parts)}"


def trials_table(view: View) -> Table:
    """LIST TRIALS: one row per trial; ``*`` marks the best one."""
    trials: Sequence[View] = view.get("trials") or []
    names = list(dict.fromkeys(name for t in trials for name in t.get("params") or {}))
    metric = str(view.get("metric"))
    columns = ["Trial", *names, "Status", "Attempts", "SWOP", "Slot", metric]
    rows = []
    for t in trials:
        params = t.get("params") or {}
        mark = "*" if t.get("index") == view.get("best") else ""
        rows.append(
            [
                f"{t.get('index')}{mark}",
                *(_number(params.get(n)) for n in names),
                t.get("status"),
                t.get("attempts"),
                t.get("swop"),
                t.get("slot"),
                _number((t.get("metrics") or {}).get(metric)),
            ]
        )
    return Table.of(f"Trials of {view.get('task')}", columns, rows)


async def _list_trials(cmd: ListTrials, call: Call) -> Result:
    view = await call.link.query("study", name=cmd.task)
    return Result.success(trials_summary(view), table=trials_table(view), data=view)


async def _best_trial(cmd: GetBestTrial, call: Call) -> Result:
    view = await call.link.query("study.best", name=cmd.task)
    best = view.get("best")
    if best is None:
        return Result.failure(f"no trial of {cmd.task} has completed yet", data=view)
    params = ", ".join(f"{k}={_number(v)}" for k, v in (best.get("params") or {}).items())
    metric = view.get("metric")
    lines = [
        f"BEST TRIAL : {best.get('index')}",
        f"PARAMETERS : {params}",
        f"{str(metric).upper()} : {_number((best.get('metrics') or {}).get(metric))} ({view.get('goal')})",
        f"METRICS : {', '.join(f'{k}={_number(v)}' for k, v in (best.get('metrics') or {}).items())}",
    ]
    if not view.get("finished"):
        lines.append("(the study is still running: this is the best so far)")
    return Result.success(*lines, data=view)


async def _plot_trials(cmd: PlotTrials, call: Call) -> Result:
    from swci.trial_plots import write_plots  # noqa: PLC0415 - imports matplotlib

    view = await call.link.query("study", name=cmd.task, detail=True)
    directory = call.session.resolve_path(cmd.directory) if cmd.directory else call.session.cwd
    try:
        written = await asyncio.to_thread(write_plots, view, directory)
    except OSError as exc:
        return Result.failure(f"cannot write the plots into {directory}: {exc}")
    if not written:
        return Result.failure(f"no trial of {cmd.task} has completed yet; there is nothing to plot")
    return Result.success(*(f"Wrote {path}" for path in written), data=[str(p) for p in written])


HANDLERS[ListTrials] = _list_trials
HANDLERS[GetBestTrial] = _best_trial
HANDLERS[PlotTrials] = _plot_trials
