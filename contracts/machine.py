"""The state machine: ``apply(state, tx)`` plus what the SN asks of it (genesis, due actions, changes).

``apply`` is pure and deterministic: the same transactions give the same state, bit for bit. A
transaction that breaks a rule gives a ``Rejection`` whose reason is written for the user, and the state
is left as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from contracts import nodes, rounds, taskrunners, tasks, training, trials
from contracts.state import State
from contracts.tasks import ROOT_TASK, BodyValidator, taskdefs_validator
from contracts.tx import RejectError, Rejection, Tx, check_tx

__all__ = [
    "DEFAULT_CONTRACT",
    "DEFAULT_TASKRUNNER",
    "ROOT_TASK",
    "apply",
    "changed_entities",
    "due_actions",
    "genesis_transactions",
    "next_deadline",
    "receipt",
]

DEFAULT_CONTRACT = "defaultbb.cqdb.sml.hpe"
DEFAULT_TASKRUNNER = "defaulttaskbb.taskdb.sml.hpe"

Handler = Callable[[State, Tx], State]

_HANDLERS: Mapping[str, Handler] = {
    "node.register": nodes.register,
    "node.offline": nodes.offline,
    "identity.revoke": nodes.revoke,
    "contract.create": training.create,
    "contract.reset": training.reset,
    "contract.join": training.join,
    "contract.progress": training.progress,
    "contract.done": training.done,
    "round.checkin": rounds.checkin,
    "round.close": rounds.close,
    "round.merged": rounds.merged,
    "round.failed": rounds.failed,
    "round.leader_timeout": rounds.leader_timeout,
    "round.skip_straggler": rounds.skip_straggler,
    "task.create": tasks.create,
    "task.append": tasks.append,
    "task.delete": tasks.delete,
    "taskrunner.create": taskrunners.create,
    "taskrunner.enroll": taskrunners.enroll,
    "taskrunner.assign": taskrunners.assign,
    "taskrunner.status": taskrunners.status,
    "taskrunner.reset": taskrunners.reset,
    "taskrunner.orphaned": taskrunners.orphaned,
    "trial.plan": trials.plan,
    "trial.claim": trials.claim,
    "trial.result": trials.result,
}


def apply(
    state: State, tx: Tx, *, validate_body: BodyValidator | None = taskdefs_validator
) -> State | Rejection:
    """Apply one transaction; return the new state or a ``Rejection`` (the state is untouched).

    ``validate_body`` checks task bodies at ``task.finalize`` (``taskdefs`` by default). Replaying a
    stored chain passes None: those bodies were validated when sealed, and a newer schema must not
    change the history.
    """
    try:
        tx = check_tx(tx)
        nodes.check_identity(state, tx)
        if tx.kind == "task.finalize":
            return tasks.finalize(state, tx, validate_body)
        return _HANDLERS[tx.kind](state, tx)
    except RejectError as exc:
        return Rejection(exc.reason)


def genesis_transactions(sealer_uid: str) -> list[tuple[str, dict[str, Any]]]:
    """The transactions of block 0, as ``(kind, body)``, sent by the sealer with role ``sn``."""
    return [
        ("contract.create", {"name": DEFAULT_CONTRACT}),
        ("taskrunner.create", {"name": DEFAULT_TASKRUNNER}),
        (
            "task.create",
            {"name": ROOT_TASK, "type": "ROOT", "author": sealer_uid, "prereq": "", "outcome": ""},
        ),
    ]


def _due(state: State) -> list[tuple[float, str, dict[str, Any]]]:
    """Every pending SN action with the block time from which it is valid."""
    out: list[tuple[float, str, dict[str, Any]]] = []
    for name in sorted(state.rounds):
        book = state.rounds[name]
        at = rounds.close_due_at(state, name)
        if at is not None and book.open is not None:
            out.append((at, "round.close", {"contract": name, "round": book.open.number}))
        straggler = rounds.straggler_due(state, name)
        if straggler is not None:
            out.append((straggler[0], "round.skip_straggler", {"contract": name, "uid": straggler[1]}))
        for rnd in book.pending:
            if rnd.leader_deadline is not None:
                body = {"contract": name, "round": rnd.number}
                out.append((rnd.leader_deadline, "round.leader_timeout", body))
    for name in sorted(state.taskrunners):
        at = taskrunners.orphan_deadline(state.taskrunners[name])
        if at is not None:
            out.append((at, "taskrunner.orphaned", {"taskrunner": name}))
    return out


def due_actions(state: State, now: float) -> list[tuple[str, dict[str, Any]]]:
    """The SN's transactions (``kind``, body) that are valid at block time ``now``."""
    return [(kind, body) for at, kind, body in _due(state) if at <= now]


def next_deadline(state: State) -> float | None:
    """The earliest block time at which an SN action is due (maybe already past), or None."""
    return min((at for at, _, _ in _due(state)), default=None)


def changed_entities(old: State, new: State) -> list[tuple[str, str]]:
    """``(entity kind, key)`` of every entity added, removed or replaced between ``old`` and ``new``.

    Kinds: ``node``, ``contract``, ``round`` (key: the contract), ``task``, ``taskrunner``, ``identity``
    (a revocation), ``study`` (key: the ``RUN_TRIALS`` task).
    """
    out: list[tuple[str, str]] = []
    for kind, before, after in (
        ("node", old.nodes, new.nodes),
        ("identity", old.revoked, new.revoked),
        ("contract", old.contracts, new.contracts),
        ("round", old.rounds, new.rounds),
        ("task", old.tasks, new.tasks),
        ("taskrunner", old.taskrunners, new.taskrunners),
        ("study", old.studies, new.studies),
    ):
        if before is after:
            continue
        keys = set(before) | set(after)
        out.extend((kind, key) for key in sorted(keys) if before.get(key) is not after.get(key))
    return out


def receipt(state: State, tx: Tx) -> dict[str, Any]:
    """What the sender needs to know about its accepted ``tx`` in ``state`` (the state right after it).

    ``round.checkin``: the round it joined; ``round.close``: the closed round's leader; ``trial.claim``:
    the trial to run.
    """
    if tx.kind == "trial.claim":
        return trials.claim_receipt(state, tx)
    if tx.kind == "round.checkin":
        book = state.rounds[tx.body["contract"]]
        number = book.open.number if book.open is not None else None
        return {"contract": tx.body["contract"], "round": number}
    if tx.kind == "round.close":
        book = state.rounds[tx.body["contract"]]
        closed = next((r for r in book.pending if r.number == tx.body["round"]), None)
        return {
            "contract": tx.body["contract"],
            "round": tx.body["round"],
            "leader": closed and closed.leader,
        }
    return {}
