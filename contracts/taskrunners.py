"""Taskrunners: create, enroll, assign (with allocation), peer status, reset; COMPLETE/ERROR derivation."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from contracts.allocation import Offer, allocate
from contracts.state import (
    Assignment,
    Enrollment,
    PeerStatus,
    State,
    TaskRunner,
    put,
)
from contracts.tx import RejectError, Tx

__all__ = [
    "Counts",
    "assign",
    "counts",
    "create",
    "enroll",
    "orphan_deadline",
    "orphaned",
    "reset",
    "status",
    "swop_offline",
    "swop_online",
]

_RUNNING = ("STARTING", "RUNNING")


def _runner(state: State, name: str) -> TaskRunner:
    runner = state.taskrunners.get(name)
    if runner is None:
        raise RejectError(f"no taskrunner {name!r}; CREATE TASKRUNNER {name} first")
    return runner


def _with_runner(state: State, runner: TaskRunner) -> State:
    return replace(state, taskrunners=put(state.taskrunners, runner.name, runner))


def _online(state: State, uid: str) -> bool:
    node = state.nodes.get(uid)
    return node is not None and node.online


def create(state: State, tx: Tx) -> State:
    """``taskrunner.create``: a new taskrunner, ``IDLE``."""
    name = tx.body["name"]
    if name in state.taskrunners:
        raise RejectError(f"taskrunner {name!r} already exists")
    return _with_runner(state, TaskRunner(name=name, state="IDLE", created_at=tx.time, created_by=tx.sender))


def enroll(state: State, tx: Tx) -> State:
    """``taskrunner.enroll``: the sending SWOP listens on the taskrunner with its capacity."""
    runner = _runner(state, tx.body["taskrunner"])
    if not _online(state, tx.sender):
        raise RejectError(
            f"SWOP {tx.sender!r} is not registered and online; it must send node.register first"
        )
    old = runner.enrolled.get(tx.sender)
    entry = Enrollment(
        uid=tx.sender,
        capacity=tx.body["capacity"],
        group=tx.body["group"],
        enrolled_at=tx.time if old is None else old.enrolled_at,
        grace=tx.body["grace"],
    )
    if entry == old:
        return state
    return _with_runner(state, replace(runner, enrolled=put(runner.enrolled, tx.sender, entry)))


def _offers(state: State, runner: TaskRunner) -> list[Offer]:
    return [
        Offer(uid, runner.enrolled[uid].capacity) for uid in sorted(runner.enrolled) if _online(state, uid)
    ]


def assign(state: State, tx: Tx) -> State:
    """``taskrunner.assign``: allocate a finalized task's units to SWOPs; the taskrunner is RUNNING."""
    body = tx.body
    runner = _runner(state, body["taskrunner"])
    task = state.tasks.get(body["task"])
    if task is None:
        raise RejectError(f"no task {body['task']!r}; CREATE TASK it first")
    if not task.finalized:
        raise RejectError(f"task {task.name!r} is not finalized; run FINALIZE TASK {task.name} first")
    if task.type == "ROOT":
        raise RejectError(f"{task.name!r} is the root of the task tree and cannot run")
    target = body["target"]
    if runner.state == "RUNNING" and target is not None:
        return _join(state, runner, task.name, target, tx)
    if runner.state != "IDLE":
        raise RejectError(_busy(runner, "ASSIGN TASK"))
    swarm = task.type == "RUN_SWARM"
    plan = allocate(runner.name, swarm, body["peers"], target, _offers(state, runner))
    assignment = Assignment(
        task=task.name,
        task_type=task.type,
        peers=body["peers"],
        target=target,
        required=plan.required,
        allocation=plan.units,
        assigned_at=tx.time,
        updated_at=tx.time,
    )
    runner = replace(runner, state="RUNNING", assignment=assignment, error="", finished_at=None)
    return _with_runner(state, runner)


def _join(state: State, runner: TaskRunner, task: str, target: str, tx: Tx) -> State:
    """``ASSIGN ... TARGET`` on a RUNNING taskrunner: the SWOP joins, or retries its failed peers."""
    current = runner.assignment
    if current is None:  # a RUNNING taskrunner always has an assignment
        raise RejectError(f"taskrunner {runner.name!r} has no assignment to join")
    if task != current.task:
        raise RejectError(
            f"taskrunner {runner.name!r} is RUNNING task {current.task!r}; "
            f"TARGET can only add a SWOP to that task, not start {task!r}"
        )
    plan = allocate(runner.name, current.task_type == "RUN_SWARM", None, target, _offers(state, runner))
    statuses = dict(current.statuses)
    kept = {p: s for p, s in statuses.get(target, {}).items() if s.status != "FAILED"}
    statuses[target] = kept
    assignment = replace(
        current,
        allocation=put(current.allocation, target, plan.units[target]),
        statuses=statuses,
        target=target,
        generation=current.generation + 1,
        updated_at=tx.time,
    )
    return _with_runner(state, replace(runner, assignment=assignment))


def status(state: State, tx: Tx) -> State:
    """``taskrunner.status``: a SWOP reports one peer; derive COMPLETE or ERROR."""
    body = tx.body
    runner = _runner(state, body["taskrunner"])
    current = runner.assignment
    if current is None:
        raise RejectError(f"taskrunner {runner.name!r} has no task assigned")
    swop = _own_sl_parent(state, tx, current) if tx.role == "sl" else tx.sender
    if swop not in current.allocation:
        raise RejectError(f"SWOP {swop!r} has no part in task {current.task!r} on {runner.name!r}")
    if body["peer_type"] == "SWOP" and body["peer"] != tx.sender:
        raise RejectError(f"a SWOP status must name the SWOP itself ({tx.sender!r}), not {body['peer']!r}")
    entry = PeerStatus(
        body["peer"], body["peer_type"], body["status"], body["description"], body["exit_code"], tx.time
    )
    mine = put(current.statuses.get(swop, {}), entry.peer, entry)
    current = replace(current, statuses=put(current.statuses, swop, mine), updated_at=tx.time)
    runner = replace(runner, assignment=current)
    if runner.state == "RUNNING":
        runner = _derive(state, runner, tx.time, entry)
    return _with_runner(state, runner)


def _own_sl_parent(state: State, tx: Tx, current: Assignment) -> str:
    """The SWOP an SL reports itself for (its registered parent): an SL whose SWOP died (SIGKILL) lives
    on, as the reference's containers do, and reports its own end; it may report nothing else."""
    body = tx.body
    if body["peer_type"] != "SL" or body["peer"] != tx.sender:
        raise RejectError(f"an SL may report only its own status ({tx.sender!r}), not {body['peer']!r}")
    if current.task_type != "RUN_SWARM":
        raise RejectError(f"an SL reports itself only in a RUN_SWARM task, not {current.task_type}")
    node = state.nodes.get(tx.sender)
    parent = node.parent if node is not None else None
    if not parent:
        raise RejectError(f"SL {tx.sender!r} was not started by a SWOP (it has no parent)")
    return parent


@dataclass(frozen=True, slots=True)
class Counts:
    """Units of an assignment by state: ``alive`` is running plus not yet reported."""

    required: int
    completed: int
    running: int
    pending: int
    failed: int

    @property
    def alive(self) -> int:
        """Units that may still complete."""
        return self.running + self.pending


def counts(assignment: Assignment) -> Counts:
    """Count the assignment's units: SL peers for RUN_SWARM, SWOPs for the other task types."""
    completed = running = pending = failed = 0
    swarm = assignment.task_type == "RUN_SWARM"
    for swop, units in assignment.allocation.items():
        reports = assignment.statuses.get(swop, {})
        own = reports.get(swop)
        if swarm:
            sls = [s.status for s in reports.values() if s.peer_type == "SL"]
            swop_failed = own is not None and own.peer_type == "SWOP" and own.status == "FAILED"
            pending += 0 if swop_failed else max(0, units - len(sls))
        else:
            sls = [own.status] if own is not None and own.peer_type == "SWOP" else []
            pending += 0 if sls else 1
        completed += sls.count("COMPLETED")
        failed += sls.count("FAILED")
        running += sum(s in _RUNNING for s in sls)
    return Counts(assignment.required, completed, running, pending, failed)


def _derive(state: State, runner: TaskRunner, time: float, trigger: PeerStatus | None) -> TaskRunner:
    current = runner.assignment
    if current is None:
        return runner
    n = counts(current)
    if n.completed >= n.required:
        return replace(runner, state="COMPLETE", finished_at=time)
    if n.completed + n.alive < n.required:
        tally = f"{n.completed} completed + {n.alive} still running < {n.required} required"
        error = f"{_failure(current, trigger)}; {tally}"
        return replace(runner, state="ERROR", error=error, finished_at=time)
    orphaned = not any(_online(state, uid) for uid in _parts(current))
    if orphaned and current.orphaned_at is None:
        return replace(runner, assignment=replace(current, orphaned_at=time))
    if not orphaned and current.orphaned_at is not None:
        return replace(runner, assignment=replace(current, orphaned_at=None))
    return runner


def _parts(assignment: Assignment) -> set[str]:
    """The SWOPs of ``assignment`` and the SLs they reported running (which outlive a dead SWOP)."""
    sls = {
        s.peer
        for reports in assignment.statuses.values()
        for s in reports.values()
        if s.peer_type == "SL" and s.status in _RUNNING
    }
    return set(assignment.allocation) | sls


def orphan_deadline(runner: TaskRunner) -> float | None:
    """When a RUNNING assignment whose every SWOP is offline turns ERROR (None: it is not orphaned).

    The grace is the longest of its SWOPs' (``taskrunner.enroll`` ``grace``): a partition or a SWOP
    restart shorter than that does not fail the task.
    """
    current = runner.assignment
    if runner.state != "RUNNING" or current is None or current.orphaned_at is None:
        return None
    graces = [runner.enrolled[uid].grace for uid in current.allocation if uid in runner.enrolled]
    return current.orphaned_at + max(graces, default=0.0)


def orphaned(state: State, tx: Tx) -> State:
    """``taskrunner.orphaned`` (SN): every SWOP of the assignment stayed offline past its grace: ERROR."""
    runner = _runner(state, tx.body["taskrunner"])
    deadline = orphan_deadline(runner)
    if deadline is None or runner.assignment is None:
        raise RejectError(f"taskrunner {runner.name!r} has a SWOP online (or nothing running)")
    if tx.time < deadline:
        raise RejectError(f"taskrunner {runner.name!r}: its SWOPs have until {deadline:.3f} to come back")
    swops = ", ".join(sorted(runner.assignment.allocation))
    waited = deadline - (runner.assignment.orphaned_at or deadline)
    error = f"every SWOP of the assignment went offline ({swops}) and stayed offline for {waited:g} s"
    return _with_runner(state, replace(runner, state="ERROR", error=error, finished_at=tx.time))


def _failure(assignment: Assignment, trigger: PeerStatus | None) -> str:
    failed = trigger if trigger is not None and trigger.status == "FAILED" else _first_failed(assignment)
    if failed is None:
        return "too few peers are left to finish"
    code = "no exit code" if failed.exit_code is None else f"exit code {failed.exit_code}"
    what = failed.description or "no description"
    return f"{failed.peer_type} peer {failed.peer!r} FAILED ({code}): {what}"


def _first_failed(assignment: Assignment) -> PeerStatus | None:
    failed = [s for reports in assignment.statuses.values() for s in reports.values() if s.status == "FAILED"]
    return min(failed, key=lambda s: (s.time, s.peer), default=None)


def swop_online(state: State, uid: str, time: float) -> State:
    """A SWOP registered (again): an assignment waiting for its SWOPs to come back is no longer orphaned."""
    return swop_offline(state, uid, time)


def swop_offline(state: State, uid: str, time: float) -> State:
    """Liveness: a SWOP (or one of its SLs) went offline; a RUNNING assignment whose every SWOP and SL is
    gone waits for them for its grace (``orphan_deadline``), then ``taskrunner.orphaned`` makes it ERROR."""
    for runner in _running_with(state.taskrunners.values(), uid):
        derived = _derive(state, runner, time, None)
        if derived is not runner:
            state = _with_runner(state, derived)
    return state


def _running_with(runners: Iterable[TaskRunner], uid: str) -> list[TaskRunner]:
    return [
        r
        for r in runners
        if r.state == "RUNNING" and r.assignment is not None and uid in _parts(r.assignment)
    ]


def _busy(runner: TaskRunner, command: str) -> str:
    current = runner.assignment
    task = current.task if current is not None else "?"
    if runner.state == "RUNNING" and current is not None:
        n = counts(current)
        return (
            f"taskrunner {runner.name!r} is RUNNING task {task!r} ({n.running}/{n.required} peers "
            f"active); wait for it to finish before {command}"
        )
    name = runner.name
    return f"taskrunner {name!r} is {runner.state} (task {task!r}); RESET TASKRUNNER {name} first"


def reset(state: State, tx: Tx) -> State:
    """``taskrunner.reset``: back to IDLE; refused while RUNNING."""
    runner = _runner(state, tx.body["taskrunner"])
    if runner.state == "RUNNING":
        raise RejectError(_busy(runner, "RESET TASKRUNNER"))
    if runner.state == "IDLE" and runner.assignment is None:
        return state
    return _with_runner(state, replace(runner, state="IDLE", assignment=None, error="", finished_at=None))
