"""Read-only views of the state as plain JSON-able data, and ``query`` dispatching reads by name.

Every view returns dicts, lists, strings, numbers, booleans and None only; non-finite loss or metric
values are shown as strings ("nan", "inf").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from contracts.rounds import close_due_at, expected_members, round_rules
from contracts.state import Contract, Member, ModelRef, Node, Round, State, Task, TaskRunner
from contracts.taskrunners import counts
from contracts.trial_views import StudyNotFound, list_studies, study_best, study_brief, study_view

__all__ = [
    "BRIEF_CHECKINS",
    "QUERIES",
    "BadQuery",
    "QueryError",
    "contract_info",
    "contract_status",
    "entity_view",
    "find_round",
    "list_contracts",
    "list_nodes",
    "list_taskrunners",
    "list_tasks",
    "listed_rounds",
    "model",
    "node_info",
    "perfdata",
    "query",
    "revocation",
    "revocations",
    "rounds",
    "task_body",
    "task_info",
    "taskrunner_info",
    "taskrunner_peer_status",
    "taskrunner_peers",
    "taskrunner_status",
]

View = dict[str, Any]

BRIEF_CHECKINS = 16
"""The most check-ins an open or closed round's event form lists (more, and its leader reads them)."""
BRIEF_FINISHED = 4
"""The most rounds that finished in one block an event form lists (the newest of them)."""


class QueryError(LookupError):
    """A read that cannot be answered: an unknown query, a missing argument or entity."""


class BadQuery(QueryError):
    """A read whose arguments are malformed (the caller's mistake, not a missing entity)."""


def _num(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    return str(value)


def _contract(state: State, name: str) -> Contract:
    contract = state.contracts.get(name)
    if contract is None:
        raise QueryError(f"no contract {name!r} (LIST CONTRACTS shows them)")
    return contract


def _task(state: State, name: str) -> Task:
    task = state.tasks.get(name)
    if task is None:
        raise QueryError(f"no task {name!r} (LIST TASKS shows them)")
    return task


def _runner(state: State, name: str) -> TaskRunner:
    runner = state.taskrunners.get(name)
    if runner is None:
        raise QueryError(f"no taskrunner {name!r} (LIST TASKRUNNERS shows them)")
    return runner


def _online(state: State, uid: str) -> bool:
    node = state.nodes.get(uid)
    return node is not None and node.online


# --- contracts ---------------------------------------------------------------------------------


def _model_ref(ref: ModelRef | None) -> View | None:
    if ref is None:
        return None
    return {"round": ref.round, "digest": ref.digest, "leader": ref.leader, "time": ref.time}


def list_contracts(state: State) -> list[View]:
    """LIST CONTRACTS: every contract with its status."""
    return [contract_status(state, name) for name in sorted(state.contracts)]


def contract_info(state: State, name: str) -> View:
    """GET CONTRACT INFO: static facts."""
    contract = _contract(state, name)
    return {
        "name": contract.name,
        "created_at": contract.created_at,
        "created_by": contract.created_by,
        "resets": contract.resets,
    }


def contract_status(state: State, name: str) -> View:
    """GET CONTRACT STATUS: status, members by state, the open round and the latest model."""
    contract = _contract(state, name)
    book = state.rounds.get(name)
    statuses = [m.status for m in contract.members.values()]
    open_round = book.open if book is not None else None
    return {
        "name": contract.name,
        "status": contract.status,
        "members": len(statuses),
        "active": statuses.count("active"),
        "finished": statuses.count("finished"),
        "left": statuses.count("left"),
        "round": open_round.number if open_round is not None else None,
        "latest_model": _model_ref(contract.latest_model),
        "final_digest": contract.final_digest,
        "completed_at": contract.completed_at,
        **_merge_view(contract),
    }


def _merge_view(contract: Contract) -> View:
    """The contract's pinned merge policy and its count of excluded rows (with the last reason)."""
    policy = contract.merge
    return {
        "merge_method": policy.method if policy is not None else None,
        "trim_ratio": policy.trim_ratio if policy is not None and policy.method == "trimmedmean" else None,
        "max_update_norm": (policy.max_update_norm or None) if policy is not None else None,
        "excluded_rows": contract.exclusions,
        "last_exclusion": contract.last_exclusion or None,
    }


def _excluded(rnd: Round) -> list[View]:
    return [{"uid": uid, "reason": reason} for uid, reason in rnd.excluded]


def _perf_row(member: Member) -> View:
    row: View = {
        "uid": member.uid,
        "admin": member.params.admin,
        "status": member.status,
        "loss": _num(member.loss),
        "metric": _num(member.metric),
        "total_epochs": member.total_epochs,
        "completed_epochs": member.epochs_done,
        "joined_at": member.joined_at,
        "updated_at": member.updated_at,
        "excluded": member.excluded,
        "excluded_reason": member.excluded_reason or None,
    }
    if member.epsilon is not None:  # the site trains under differential privacy
        row["epsilon"] = member.epsilon
    return row


def perfdata(state: State, name: str) -> list[View]:
    """PERFDATA: one row per member (uid, admin, loss, metric, total and completed epochs)."""
    contract = _contract(state, name)
    return [_perf_row(contract.members[uid]) for uid in sorted(contract.members)]


def _round_view(rnd: Round) -> View:
    return {
        "round": rnd.number,
        "status": rnd.status,
        "final": rnd.final,
        "init": rnd.init,
        "opened_at": rnd.opened_at,
        "quorum_at": rnd.quorum_at,
        "checkins": _checkin_rows(rnd),
        "participants": list(rnd.participants),
        "leader": rnd.leader,
        "failed_leaders": list(rnd.failed),
        "leader_deadline": rnd.leader_deadline,
        "closed_at": rnd.closed_at,
        "ended_at": rnd.ended_at,
        "digest": rnd.digest,
        "contributors": list(rnd.contributors),
        "excluded": _excluded(rnd),
        "reason": rnd.reason,
    }


def _checkin_rows(rnd: Round) -> list[View]:
    return [
        {"uid": c.uid, "digest": c.digest, "samples": c.samples, "weight": c.weight, "init": c.init}
        for c in (rnd.checkins[uid] for uid in sorted(rnd.checkins))
    ]


def rounds(state: State, name: str) -> View:
    """The rounds of a contract: the open one (with its quorum), closed ones, the last finished."""
    contract = _contract(state, name)
    book = state.rounds.get(name)
    expected = expected_members(state, contract)
    rules = round_rules(expected)
    open_view = None
    if book is not None and book.open is not None:
        open_view = _round_view(book.open)
        open_view["expected"] = sorted(m.uid for m in expected)
        open_view["min_peers"] = rules.min_peers
        open_view["quorum_wait"] = rules.quorum_wait
        open_view["close_at"] = close_due_at(state, name)
    return {
        "contract": name,
        "open": open_view,
        "closed": [_round_view(r) for r in book.pending] if book is not None else [],
        "finished": [_round_view(r) for r in book.done] if book is not None else [],
    }


def listed_rounds(view: View) -> list[View]:
    """The rounds a ``rounds`` view or its event form (``rounds_brief``) holds: open, closed, finished."""
    return [r for r in (view.get("open"), *(view.get("closed") or []), *(view.get("finished") or [])) if r]


def find_round(view: View, number: int) -> View | None:
    """Round ``number`` in a ``rounds`` view or its event form, or None."""
    return next((r for r in listed_rounds(view) if r.get("round") == number), None)


def _round_brief(rnd: Round) -> View:
    brief: View = {
        "round": rnd.number,
        "status": rnd.status,
        "final": rnd.final,
        "init": rnd.init,
        "checked_in": len(rnd.checkins),
        "participants": list(rnd.participants),
        "leader": rnd.leader,
        "failed_leaders": list(rnd.failed),
        "digest": rnd.digest,
        "contributors": list(rnd.contributors),
        "excluded": _excluded(rnd),
        "reason": rnd.reason,
    }
    if rnd.status in ("OPEN", "CLOSED") and len(rnd.checkins) <= BRIEF_CHECKINS:
        # closed: what its leader merges, so it need not read them; open: a node whose check-in a peer
        # relayed sees it taken in the event of the block that took it, not only at the close
        brief["checkins"] = _checkin_rows(rnd)
    return brief


def rounds_brief(state: State, name: str) -> View:
    """The event form of a contract's rounds: statuses and roles, the check-ins of the open round and of
    a closed one while they are at most ``BRIEF_CHECKINS`` (what its leader merges; the receipt of a
    relayed check-in), the open round's ``min_peers``, and only
    the rounds that finished in the newest block that finished any (``_last_finished``), so that an
    event stays small however many nodes check in (a node that needs more reads ``rounds``)."""
    contract = _contract(state, name)
    book = state.rounds.get(name)
    if book is None:
        return {"contract": name, "open": None, "closed": [], "finished": []}
    open_brief = None
    if book.open is not None:
        open_brief = _round_brief(book.open)
        open_brief["min_peers"] = round_rules(expected_members(state, contract)).min_peers
    return {
        "contract": name,
        "open": open_brief,
        "closed": [_round_brief(r) for r in book.pending],
        "finished": [_round_brief(r) for r in _last_finished(book.done)],
    }


def _last_finished(done: tuple[Round, ...]) -> list[Round]:
    """The rounds that finished in the newest block that finished any: one, or a few when the SN sealed
    the merges it held for a round's close together (``daemons/sn/sealer.py``), so that a node that
    follows a round sees its end in an event, whichever."""
    if not done:
        return []
    return [r for r in done[-BRIEF_FINISHED:] if r.ended_at == done[-1].ended_at]


def model(state: State, name: str) -> View:
    """The latest merged model of a contract and, once COMPLETE, its final digest."""
    contract = _contract(state, name)
    return {
        "contract": name,
        "status": contract.status,
        "latest": _model_ref(contract.latest_model),
        "final_digest": contract.final_digest,
    }


# --- tasks -------------------------------------------------------------------------------------


def task_info(state: State, name: str) -> View:
    """GET TASK INFO."""
    task = _task(state, name)
    return {
        "name": task.name,
        "type": task.type,
        "author": task.author,
        "prereq": task.prereq,
        "outcome": task.outcome,
        "finalized": task.finalized,
        "body_lines": len(task.body),
        "created_at": task.created_at,
        "created_by": task.created_by,
        "finalized_at": task.finalized_at,
    }


def task_body(state: State, name: str) -> View:
    """GET TASK BODY: the consolidated body (lines in idx order)."""
    task = _task(state, name)
    return {"name": task.name, "lines": task.lines, "indexes": [idx for idx, _ in task.body]}


def list_tasks(state: State) -> list[View]:
    """LIST TASKS (ROOTTASK included)."""
    return [task_info(state, name) for name in sorted(state.tasks)]


# --- taskrunners -------------------------------------------------------------------------------


def taskrunner_info(state: State, name: str) -> View:
    """GET TASKRUNNER INFO."""
    runner = _runner(state, name)
    return {
        "name": runner.name,
        "state": runner.state,
        "created_at": runner.created_at,
        "created_by": runner.created_by,
        "enrolled": len(runner.enrolled),
        "task": runner.assignment.task if runner.assignment is not None else None,
    }


def list_taskrunners(state: State) -> list[View]:
    """LIST TASKRUNNERS."""
    return [taskrunner_info(state, name) for name in sorted(state.taskrunners)]


def taskrunner_status(state: State, name: str) -> View:
    """GET TASKRUNNER STATUS: TASK NAME, PEER TYPE, TASK_STATE, peer counts, times, error."""
    runner = _runner(state, name)
    current = runner.assignment
    view: View = {
        "name": runner.name,
        "task": None,
        "peer_type": None,
        "state": runner.state,
        "required": 0,
        "active": 0,
        "completed": 0,
        "failed": 0,
        "pending": 0,
        "assigned_at": None,
        "updated_at": None,
        "finished_at": runner.finished_at,
        "error": runner.error,
        "allocation": {},
        "generation": 0,
    }
    if current is None:
        return view
    n = counts(current)
    view.update(
        task=current.task,
        peer_type="SL" if current.task_type == "RUN_SWARM" else "SWOP",
        required=n.required,
        active=n.running,
        completed=n.completed,
        failed=n.failed,
        pending=n.pending,
        assigned_at=current.assigned_at,
        updated_at=current.updated_at,
        allocation=dict(sorted(current.allocation.items())),
        generation=current.generation,
    )
    return view


def taskrunner_peers(state: State, name: str) -> list[View]:
    """LIST TASKRUNNER PEERS: the enrolled SWOPs, indexed 0.. in uid order."""
    runner = _runner(state, name)
    return [
        {
            "index": i,
            "uid": uid,
            "capacity": runner.enrolled[uid].capacity,
            "group": runner.enrolled[uid].group,
            "online": _online(state, uid),
            "enrolled_at": runner.enrolled[uid].enrolled_at,
        }
        for i, uid in enumerate(sorted(runner.enrolled))
    ]


def _swop_uid(runner: TaskRunner, swop: int | str) -> str:
    order = sorted(runner.enrolled)
    if isinstance(swop, int) and not isinstance(swop, bool):
        if not 0 <= swop < len(order):
            raise QueryError(
                f"taskrunner {runner.name!r} has {len(order)} enrolled SWOP(s); index {swop} is out of range"
            )
        return order[swop]
    if isinstance(swop, str) and swop.isdigit() and swop not in runner.enrolled:
        return _swop_uid(runner, int(swop))
    if swop not in runner.enrolled:
        raise QueryError(f"SWOP {swop!r} is not enrolled on taskrunner {runner.name!r}")
    return str(swop)


def taskrunner_peer_status(state: State, name: str, swop: int | str) -> View:
    """GET TASKRUNNER PEER STATUS: one SWOP (by index or uid) and the peers it spawned."""
    runner = _runner(state, name)
    uid = _swop_uid(runner, swop)
    current = runner.assignment
    reports = current.statuses.get(uid, {}) if current is not None else {}
    peers = [
        {
            "uid": s.peer,
            "type": s.peer_type,
            "status": s.status,
            "description": s.description,
            "exit_code": s.exit_code,
            "updated_at": s.time,
        }
        for s in (reports[p] for p in sorted(reports))
    ]
    return {
        "taskrunner": runner.name,
        "index": sorted(runner.enrolled).index(uid),
        "swop": uid,
        "online": _online(state, uid),
        "allocated": current.allocation.get(uid, 0) if current is not None else 0,
        "sl_peers": sum(p["type"] == "SL" for p in peers),
        "peers": peers,
    }


# --- nodes -------------------------------------------------------------------------------------


def _node_view(node: Node) -> View:
    return {
        "uid": node.uid,
        "type": node.role.upper(),
        "host": node.host,
        "address": node.address,
        "pid": node.pid,
        "parent": node.parent,
        "online": node.online,
        "registered_at": node.registered_at,
        "last_seen": node.last_seen,
        "offline_reason": node.offline_reason,
        "identity": node.identity or node.uid,
        "session": node.session,
        "name": str(node.meta.get("name") or node.uid),
        "sentinel": node.meta.get("sentinel") is True,
    }


def revocation(state: State, identity: str) -> View:
    """One revoked identity: who revoked it, when and why."""
    entry = state.revoked.get(identity)
    if entry is None:
        raise QueryError(f"identity {identity!r} is not revoked")
    return {"identity": entry.identity, "by": entry.by, "time": entry.time, "reason": entry.reason}


def revocations(state: State) -> list[View]:
    """Every revoked identity."""
    return [revocation(state, name) for name in sorted(state.revoked)]


def list_nodes(state: State, role: str | None = None, online: bool | None = None) -> list[View]:
    """LIST NODES: type, host, address, uid, parent, online, last seen; optionally filtered."""
    return [
        _node_view(node)
        for node in (state.nodes[uid] for uid in sorted(state.nodes))
        if (role is None or node.role == role.lower()) and (online is None or node.online == online)
    ]


def node_info(state: State, uid: str) -> View:
    """One node."""
    node = state.nodes.get(uid)
    if node is None:
        raise QueryError(f"no node {uid!r} (LIST NODES shows them)")
    return _node_view(node)


# --- events and dispatch -----------------------------------------------------------------------


def entity_view(state: State, kind: str, key: str) -> View | None:
    """The view published in an ``event`` for a changed entity; None when it was removed."""
    views: Mapping[str, tuple[Mapping[str, Any], Callable[[State, str], View]]] = {
        "node": (state.nodes, node_info),
        "contract": (state.contracts, contract_status),
        "round": (state.rounds, rounds_brief),
        "task": (state.tasks, task_info),
        "taskrunner": (state.taskrunners, taskrunner_status),
        "identity": (state.revoked, revocation),
        "study": (state.studies, study_brief),
    }
    if kind not in views:
        raise QueryError(f"unknown entity kind {kind!r} (known: {', '.join(views)})")
    entities, view = views[kind]
    return view(state, key) if key in entities else None


def _arg(
    args: Mapping[str, Any],
    key: str,
    query_name: str,
    types: tuple[type, ...] = (str,),
    *,
    optional: bool = False,
) -> Any:
    if key not in args or args[key] is None:
        if optional:
            return None
        raise BadQuery(f"query {query_name!r} needs the argument {key!r}")
    value = args[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        names = " or ".join(t.__name__ for t in types)
        raise BadQuery(f"query {query_name!r}: argument {key!r} must be {names}, got {type(value).__name__}")
    return value


def _named(fn: Callable[[State, str], Any]) -> Callable[[State, Mapping[str, Any], str], Any]:
    return lambda state, args, q: fn(state, _arg(args, "name", q))


QUERIES: Mapping[str, Callable[[State, Mapping[str, Any], str], Any]] = {
    "contracts": lambda state, args, q: list_contracts(state),
    "contract.info": _named(contract_info),
    "contract.status": _named(contract_status),
    "contract.perfdata": _named(perfdata),
    "contract.rounds": _named(rounds),
    "contract.model": _named(model),
    "tasks": lambda state, args, q: list_tasks(state),
    "task.info": _named(task_info),
    "task.body": _named(task_body),
    "taskrunners": lambda state, args, q: list_taskrunners(state),
    "taskrunner.info": _named(taskrunner_info),
    "taskrunner.status": _named(taskrunner_status),
    "taskrunner.peers": _named(taskrunner_peers),
    "taskrunner.peer_status": lambda state, args, q: taskrunner_peer_status(
        state, _arg(args, "name", q), _arg(args, "swop", q, (int, str))
    ),
    "nodes": lambda state, args, q: list_nodes(
        state, _arg(args, "role", q, optional=True), _arg(args, "online", q, (bool,), optional=True)
    ),
    "node": lambda state, args, q: node_info(state, _arg(args, "uid", q)),
    "identities.revoked": lambda state, args, q: revocations(state),
    "studies": lambda state, args, q: list_studies(state),
    "study": lambda state, args, q: study_view(
        state, _arg(args, "name", q), bool(_arg(args, "detail", q, (bool,), optional=True))
    ),
    "study.best": _named(study_best),
}


def query(state: State, name: str, args: Mapping[str, Any]) -> Any:
    """Answer the read ``name`` with ``args``.

    Raises:
        QueryError: for an unknown query, a missing argument or a missing entity.
    """
    handler = QUERIES.get(name)
    if handler is None:
        raise QueryError(f"unknown query {name!r} (known: {', '.join(QUERIES)})")
    if not isinstance(args, Mapping):
        raise QueryError(f"query {name!r}: arguments must be a map")
    try:
        return handler(state, args, name)
    except StudyNotFound as exc:
        raise QueryError(str(exc)) from None
