"""Trials of a ``RUN_TRIALS`` task: the plan, claims of pending trials by SWOP slots, results, retries.

A study belongs to one assignment of a ``RUN_TRIALS`` task: a SWOP of the assignment records the plan
(``trial.plan``, the expanded search; the same plan again is a no-op), then every SWOP claims pending
trials for its free slots (``trial.claim``: the lowest pending one, named in the receipt) and reports
how each run ended (``trial.result``). A failed run with retries left puts the trial back in the queue;
so does a SWOP going offline. When no trial is pending or running the study is finished, and the
taskrunner is ``COMPLETE`` (every trial completed) or ``ERROR`` (naming the failed trials).

In ``SWARM`` mode a trial is one whole swarm run and the swarm is the only slot: one trial runs at a
time. The first ``trial.claim`` starts an attempt of the lowest pending trial and creates its training
contract (``<task>.trial<i>.a<attempt>``); every other SWOP expected in it (those of the assignment
online then) joins it with its own ``trial.claim``. Each SWOP reports its nodes' metrics with
``trial.result``; the attempt completes when every expected SWOP has, and the trial's metrics are the
mean over nodes. One failed part fails the attempt (retried with a fresh contract).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from contracts.rounds import is_online
from contracts.state import UNINITIALIZED, Contract, Rounds, State, TaskRunner, put
from contracts.trial_state import Attempt, Part, Study, Trial
from contracts.tx import RejectError, Tx

__all__ = [
    "best_trial",
    "claim",
    "claim_receipt",
    "mean_metrics",
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
    """``trial.claim``: the lowest pending trial runs on the sender's ``slot`` (``SWARM`` mode: the
    sender joins the running attempt, or starts the lowest pending trial when none runs)."""
    task, slot = tx.body["task"], tx.body["slot"]
    study = _live_study(state, task, tx.sender)
    if study.mode == "SWARM":
        return _claim_swarm(state, study, tx)
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
    """What a SWOP needs of its accepted claim: the trial, its parameters and the attempt number
    (``SWARM`` mode: also the attempt's training contract)."""
    study = state.studies[tx.body["task"]]
    if study.mode == "SWARM":
        trial = next(t for t in study.trials if t.status == "RUNNING")
        return {
            "task": study.task,
            "trial": trial.index,
            "params": dict(trial.params),
            "attempt": len(trial.attempts),
            "contract": trial.attempts[-1].contract,
        }
    slot = tx.body.get("slot", "")
    trial = next(t for t in study.trials if t.status == "RUNNING" and _runs_on(t, tx.sender, slot))
    return {
        "task": study.task,
        "trial": trial.index,
        "params": dict(trial.params),
        "attempt": len(trial.attempts),
    }


# ------------------------------------------------------------------ SWARM mode
def contract_name(state: State, task: str, index: int, attempt: int) -> str:
    """The training contract of a ``SWARM``-mode attempt: ``<task>.trial<i>.a<n>``, with ``-2``,
    ``-3``... when that name is taken (a task assigned again)."""
    base = f"{task[:100]}.trial{index}.a{attempt}"
    name, n = base, 1
    while name in state.contracts:
        n += 1
        name = f"{base}-{n}"
    return name


def _claim_swarm(state: State, study: Study, tx: Tx) -> State:
    running = next((t for t in study.trials if t.status == "RUNNING"), None)
    if running is not None:
        return _join_attempt(state, study, running, tx)
    pending = next((t for t in study.trials if t.status == "PENDING"), None)
    if pending is None:
        raise RejectError(f"no trial of {study.task!r} is waiting to run")
    runner = _runner(state, study.taskrunner)
    assert runner.assignment is not None  # noqa: S101 - _live_study checked it
    swops = tuple(uid for uid in sorted(runner.assignment.allocation) if is_online(state, uid))
    if tx.sender not in swops:
        swops = tuple(sorted((*swops, tx.sender)))
    name = contract_name(state, study.task, pending.index, len(pending.attempts) + 1)
    attempt = Attempt(
        swop=tx.sender,
        slot="swarm",
        started_at=tx.time,
        contract=name,
        swops=swops,
        parts=(Part(swop=tx.sender, joined_at=tx.time),),
    )
    trial = replace(pending, status="RUNNING", attempts=(*pending.attempts, attempt))
    contract = Contract(name=name, status=UNINITIALIZED, created_at=tx.time, created_by=tx.sender)
    state = replace(
        state, contracts=put(state.contracts, name, contract), rounds=put(state.rounds, name, Rounds())
    )
    return _with_study(state, _replace_trial(study, trial))


def _join_attempt(state: State, study: Study, trial: Trial, tx: Tx) -> State:
    last = trial.attempts[-1]
    where = f"trial {trial.index} (attempt {len(trial.attempts)}) of {study.task!r}"
    if any(p.swop == tx.sender for p in last.parts):
        raise RejectError(f"SWOP {tx.sender!r} already takes part in {where}; the swarm runs one at a time")
    if tx.sender not in last.swops:
        raise RejectError(
            f"SWOP {tx.sender!r} is not one of the SWOPs of {where} ({', '.join(last.swops)}); "
            "it takes part from the next attempt"
        )
    joined = replace(last, parts=(*last.parts, Part(swop=tx.sender, joined_at=tx.time)))
    trial = replace(trial, attempts=(*trial.attempts[:-1], joined))
    return _with_study(state, _replace_trial(study, trial))


def _result_swarm(state: State, study: Study, trial: Trial, tx: Tx) -> State:
    body = tx.body
    last = trial.attempts[-1]
    part = next((p for p in last.parts if p.swop == tx.sender and p.status == "RUNNING"), None)
    if trial.status != "RUNNING" or part is None or body["attempt"] != len(trial.attempts):
        raise RejectError(
            f"trial {trial.index} of {study.task!r} has no running part of {tx.sender!r} "
            f"in attempt {body['attempt']}"
        )
    ended = replace(
        part,
        status=body["status"],
        ended_at=tx.time,
        exit_code=body["exit_code"],
        description=body["description"],
        nodes=body["nodes"],
        probabilities=body["probabilities"],
    )
    if ended.status == "COMPLETED":
        ended = _checked_part(state, study, last.contract, ended)
    attempt = replace(last, parts=tuple(ended if p is part else p for p in last.parts))
    if ended.status == "FAILED":
        why = f"SWOP {tx.sender}: {ended.description}"
        attempt = replace(
            attempt, status="FAILED", ended_at=tx.time, exit_code=ended.exit_code, description=why
        )
        trial = _after_failure(study, replace(trial, attempts=(*trial.attempts[:-1], attempt)))
    else:
        trial = _maybe_complete(study, replace(trial, attempts=(*trial.attempts[:-1], attempt)), tx.time)
        if body["probes"] and not study.probes:
            study = replace(study, probes=body["probes"])
    return _settle(state, _replace_trial(study, trial), tx.time)


def _checked_part(state: State, study: Study, contract: str, part: Part) -> Part:
    """A completed part must name its nodes, each with the study's metric and a member of the
    attempt's contract; otherwise it failed (a node that trained elsewhere did not take part)."""
    members = state.contracts[contract].members if contract in state.contracts else {}
    problem = ""
    if not part.nodes:
        problem = "it completed without naming its nodes' metrics"
    elif missing := [uid for uid, m in part.nodes.items() if study.metric not in m]:
        problem = f"node {missing[0]} did not report the metric {study.metric!r}"
    elif outside := [uid for uid in part.nodes if uid not in members]:
        problem = (
            f"node {outside[0]} never joined the trial's contract {contract!r} (its program must pass "
            "trainingContract=swarmlearning.trial.trial_contract() to SwarmCallback)"
        )
    return replace(part, status="FAILED", description=problem) if problem else part


def _maybe_complete(study: Study, trial: Trial, time: float) -> Trial:
    """The attempt completes once every expected SWOP's part has: metrics are the mean over nodes."""
    last = trial.attempts[-1]
    done = {p.swop: p for p in last.parts if p.status == "COMPLETED"}
    if any(uid not in done for uid in last.swops):
        return trial
    nodes = {uid: m for swop in sorted(done) for uid, m in sorted(done[swop].nodes.items())}
    means = mean_metrics(nodes)
    description = f"{study.metric}={means[study.metric]:.6g}, the mean over {len(nodes)} node(s)"
    ended = replace(last, status="COMPLETED", ended_at=time, exit_code=0, description=description)
    probabilities = next((done[s].probabilities for s in sorted(done) if done[s].probabilities), ())
    return replace(
        trial,
        status="COMPLETED",
        attempts=(*trial.attempts[:-1], ended),
        metrics=means,
        node_metrics=nodes,
        probabilities=probabilities,
    )


def mean_metrics(nodes: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Each metric every node reported, averaged over the nodes (in the order of their names)."""
    names = [set(m) for m in nodes.values()]
    common = sorted(set.intersection(*names)) if names else []
    ordered = [nodes[uid] for uid in sorted(nodes)]
    return {name: sum(m[name] for m in ordered) / len(ordered) for name in common}


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
    if study.mode == "SWARM":
        return _result_swarm(state, study, trial, tx)
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
        lost = [t for t in study.trials if t.status == "RUNNING" and _needs(study, t.attempts[-1], uid)]
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


def _needs(study: Study, attempt: Attempt, uid: str) -> bool:
    """Whether a running attempt still depends on SWOP ``uid`` (``SWARM``: its part is not done)."""
    if study.mode != "SWARM":
        return attempt.swop == uid
    done = any(p.swop == uid and p.status == "COMPLETED" for p in attempt.parts)
    return uid in attempt.swops and not done


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
