"""Trials of a ``RUN_TRIALS`` task: the plan, claims of pending trials by SWOP slots, results, retries.

A study belongs to one assignment of a ``RUN_TRIALS`` task: a SWOP of the assignment records the plan
(``trial.plan``, the expanded search; the same plan again is a no-op), then every SWOP claims pending
trials for its free slots (``trial.claim``: the lowest pending one, named in the receipt) and reports
how each run ended (``trial.result``). A failed run with retries left puts the trial back in the queue;
so does a SWOP going offline. When no trial is pending or running the study is finished, and the
taskrunner is ``COMPLETE`` (every trial completed) or ``ERROR`` (naming the failed trials).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from contracts.state import State, TaskRunner, put
from contracts.trial_state import Attempt, Study, Trial
from contracts.tx import RejectError, Tx

__all__ = [
    "best_trial",
    "claim",
    "claim_receipt",
    "params_text",
    "plan",
    "result",
    "swop_offline",
]


def _runner(state: State, name: str) -> TaskRunner:
    runner = state.taskrunners.get(name)
    if runner is None:
        raise RejectError(f"no taskrunner {name!r}; CREATE TASKRUNNER {name} first")
    return runner


def _study(state: State, task: str) -> Study:
    study = state.studies.get(task)
    if study is None:
        raise RejectError(f"task {task!r} has no trials planned; a SWOP plans them when the task is assigned")
    return study


def _is_current(runner: TaskRunner, study: Study) -> bool:
    current = runner.assignment
    return (
        runner.state == "RUNNING"
        and current is not None
        and current.task == study.task
        and current.assigned_at == study.assigned_at
    )


def _with_study(state: State, study: Study) -> State:
    return replace(state, studies=put(state.studies, study.task, study))


def plan(state: State, tx: Tx) -> State:
    """``trial.plan``: record the trials of the running assignment (the same plan again changes nothing)."""
    body = tx.body
    runner = _runner(state, body["taskrunner"])
    current = runner.assignment
    task = body["task"]
    if runner.state != "RUNNING" or current is None or current.task != task:
        raise RejectError(
            f"taskrunner {runner.name!r} is not running task {task!r}; ASSIGN TASK {task} first"
        )
    if current.task_type != "RUN_TRIALS":
        raise RejectError(f"task {task!r} is a {current.task_type} task; only RUN_TRIALS tasks have trials")
    if tx.sender not in current.allocation:
        raise RejectError(f"SWOP {tx.sender!r} has no part in task {task!r} on {runner.name!r}")
    study = Study(
        task=task,
        taskrunner=runner.name,
        assigned_at=current.assigned_at,
        kind=body["kind"],
        mode=body["mode"],
        metric=body["metric"],
        goal=body["goal"],
        retries=body["retries"],
        trials=tuple(Trial(i, params) for i, params in enumerate(body["trials"])),
        planned_at=tx.time,
        planned_by=tx.sender,
    )
    old = state.studies.get(task)
    if old is not None and old.taskrunner == runner.name and old.assigned_at == current.assigned_at:
        if _same_plan(old, study):
            return state
        raise RejectError(
            f"the trials of task {task!r} are already planned, differently, by {old.planned_by!r}"
        )
    return _with_study(state, study)


def _same_plan(a: Study, b: Study) -> bool:
    settings = (a.kind, a.mode, a.metric, a.goal, a.retries) == (b.kind, b.mode, b.metric, b.goal, b.retries)
    return settings and [t.params for t in a.trials] == [t.params for t in b.trials]


def _live_study(state: State, task: str, sender: str) -> Study:
    study = _study(state, task)
    runner = _runner(state, study.taskrunner)
    if not _is_current(runner, study):
        raise RejectError(f"the trials of task {task!r} are no longer running (taskrunner {runner.name!r})")
    assert runner.assignment is not None  # noqa: S101 - _is_current checked it
    if sender not in runner.assignment.allocation:
        raise RejectError(f"SWOP {sender!r} has no part in task {task!r}")
    return study


def claim(state: State, tx: Tx) -> State:
    """``trial.claim``: the lowest pending trial runs on the sender's ``slot``."""
    task, slot = tx.body["task"], tx.body["slot"]
    study = _live_study(state, task, tx.sender)
    busy = next((t for t in study.trials if t.status == "RUNNING" and _runs_on(t, tx.sender, slot)), None)
    if busy is not None:
        raise RejectError(f"slot {slot!r} of SWOP {tx.sender!r} already runs trial {busy.index} of {task!r}")
    pending = next((t for t in study.trials if t.status == "PENDING"), None)
    if pending is None:
        running = sum(t.status == "RUNNING" for t in study.trials)
        raise RejectError(f"no trial of {task!r} is waiting to run ({running} running)")
    attempt = Attempt(swop=tx.sender, slot=slot, started_at=tx.time)
    trial = replace(pending, status="RUNNING", attempts=(*pending.attempts, attempt))
    return _with_study(state, _replace_trial(study, trial))


def _runs_on(trial: Trial, swop: str, slot: str) -> bool:
    last = trial.attempts[-1] if trial.attempts else None
    return last is not None and last.status == "RUNNING" and last.swop == swop and last.slot == slot


def claim_receipt(state: State, tx: Tx) -> dict[str, Any]:
    """What a SWOP needs of its accepted claim: the trial, its parameters and the attempt number."""
    study = state.studies[tx.body["task"]]
    slot = tx.body.get("slot", "")
    trial = next(t for t in study.trials if t.status == "RUNNING" and _runs_on(t, tx.sender, slot))
    return {
        "task": study.task,
        "trial": trial.index,
        "params": dict(trial.params),
        "attempt": len(trial.attempts),
    }


def _replace_trial(study: Study, trial: Trial) -> Study:
    trials = list(study.trials)
    trials[trial.index] = trial
    return replace(study, trials=tuple(trials))


def result(state: State, tx: Tx) -> State:
    """``trial.result``: how the sender's run of a trial ended; a failure with retries left requeues it."""
    body = tx.body
    study = _study(state, body["task"])
    index = body["trial"]
    if not 0 <= index < len(study.trials):
        raise RejectError(f"task {study.task!r} has trials 0-{len(study.trials) - 1}, not {index}")
    trial = study.trials[index]
    last = trial.attempts[-1] if trial.attempts else None
    if (
        trial.status != "RUNNING"
        or last is None
        or last.swop != tx.sender
        or body["attempt"] != len(trial.attempts)
    ):
        raise RejectError(
            f"trial {index} of {study.task!r} is not running as attempt {body['attempt']} of {tx.sender!r}"
        )
    ok = body["status"] == "COMPLETED"
    if ok and study.metric not in body["metrics"]:
        raise RejectError(
            f"trial {index} of {study.task!r} completed without reporting the metric {study.metric!r}"
        )
    ended = replace(
        last,
        status=body["status"],
        ended_at=tx.time,
        exit_code=body["exit_code"],
        description=body["description"],
    )
    trial = replace(trial, attempts=(*trial.attempts[:-1], ended))
    if ok:
        trial = replace(
            trial, status="COMPLETED", metrics=body["metrics"], probabilities=body["probabilities"]
        )
        if body["probes"] and not study.probes:
            study = replace(study, probes=body["probes"])
    else:
        trial = _after_failure(study, trial)
    return _settle(state, _replace_trial(study, trial), tx.time)


def _after_failure(study: Study, trial: Trial) -> Trial:
    failures = sum(a.status == "FAILED" for a in trial.attempts)
    return replace(trial, status="PENDING" if failures <= study.retries else "FAILED")


def _settle(state: State, study: Study, time: float) -> State:
    """Record the study; when it has just finished, so has its taskrunner's assignment."""
    if not study.finished or study.finished_at is not None:
        return _with_study(state, study)
    study = replace(study, finished_at=time)
    state = _with_study(state, study)
    runner = state.taskrunners.get(study.taskrunner)
    if runner is None or not _is_current(runner, study):
        return state
    error = _failures(study)
    done = replace(runner, state="ERROR" if error else "COMPLETE", error=error, finished_at=time)
    return replace(state, taskrunners=put(state.taskrunners, runner.name, done))


def _failures(study: Study) -> str:
    failed = [t for t in study.trials if t.status == "FAILED"]
    if not failed:
        return ""
    first = failed[0]
    last = first.attempts[-1] if first.attempts else None
    code = "no exit code" if last is None or last.exit_code is None else f"exit code {last.exit_code}"
    why = (last.description if last is not None else "") or "no description"
    return (
        f"{len(failed)} of {len(study.trials)} trials of {study.task!r} FAILED after their retries; "
        f"trial {first.index} ({params_text(first.params)}) FAILED ({code}): {why}"
    )


def swop_offline(state: State, uid: str, time: float) -> State:
    """Liveness: the runs of a SWOP that went offline failed; their trials are retried elsewhere."""
    for task in sorted(state.studies):
        study = state.studies[task]
        lost = [t for t in study.trials if t.status == "RUNNING" and t.attempts[-1].swop == uid]
        if not lost:
            continue
        for trial in lost:
            ended = replace(
                trial.attempts[-1], status="FAILED", ended_at=time, description=f"SWOP {uid} went offline"
            )
            study = _replace_trial(
                study, _after_failure(study, replace(trial, attempts=(*trial.attempts[:-1], ended)))
            )
        state = _settle(state, study, time)
    return state


def best_trial(study: Study) -> Trial | None:
    """The completed trial with the best value of the study's metric (the lowest index on a tie)."""
    done = [t for t in study.trials if t.status == "COMPLETED" and study.metric in t.metrics]
    if not done:
        return None
    sign = 1.0 if study.goal == "MINIMIZE" else -1.0
    return min(done, key=lambda t: (sign * t.metrics[study.metric], t.index))


def params_text(params: Mapping[str, Any]) -> str:
    """``A=1, B=0.1`` for messages and tables."""
    return ", ".join(f"{k}={v}" for k, v in params.items())
