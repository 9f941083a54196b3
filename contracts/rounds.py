"""Sync rounds: checkin, quorum, close, leader choice and replacement, merge, and liveness.

One round per contract is open at a time. ``round.close`` (sent by the SN when ``due_actions`` says so)
fixes its participants and leader and opens the next; the leader's ``round.merged`` finishes it, or
``round.leader_timeout`` hands it to the next leader, or abandons it when none is left.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, replace

from contracts.merge_policy import check_excluded, record_exclusions
from contracts.state import ACTIVE, COMPLETE, Checkin, Contract, Member, ModelRef, Round, Rounds, State, put
from contracts.tx import RejectError, Tx

__all__ = [
    "KEEP_FINISHED",
    "RoundRules",
    "checkin",
    "close",
    "close_due_at",
    "completes_round",
    "expected_members",
    "failed",
    "is_online",
    "leader_order",
    "leader_timeout",
    "member_offline",
    "merged",
    "record_may_wait",
    "refresh_open_round",
    "round_rules",
    "skip_straggler",
    "straggler_due",
]

KEEP_FINISHED = 4
_DEFAULT_LEADER_TIMEOUT = 600.0


@dataclass(frozen=True, slots=True)
class RoundRules:
    """The quorum settings of a round: the maxima over its expected members."""

    min_peers: int
    quorum_wait: float
    leader_timeout: float


def is_online(state: State, uid: str) -> bool:
    """Whether ``uid`` is a registered node that is online."""
    node = state.nodes.get(uid)
    return node is not None and node.online


def expected_members(state: State, contract: Contract) -> list[Member]:
    """Members ``active`` or ``finished`` whose node is online."""
    return [
        m for m in contract.members.values() if m.status in ("active", "finished") and is_online(state, m.uid)
    ]


def round_rules(members: Iterable[Member]) -> RoundRules:
    """The maximum ``min_peers``, ``quorum_wait`` and ``leader_timeout`` of ``members``."""
    params = [m.params for m in members]
    if not params:
        return RoundRules(1, 0.0, _DEFAULT_LEADER_TIMEOUT)
    return RoundRules(
        max(p.min_peers for p in params),
        max(p.quorum_wait for p in params),
        max(p.leader_timeout for p in params),
    )


def leader_order(contract: str, number: int, candidates: Iterable[str]) -> tuple[str, ...]:
    """``candidates`` sorted by ``sha256(f"{contract}:{number}:{uid}")``: the order of leadership."""

    def key(uid: str) -> bytes:
        return hashlib.sha256(f"{contract}:{number}:{uid}".encode()).digest()

    return tuple(sorted(candidates, key=key))


def _book(state: State, name: str) -> Rounds:
    return state.rounds.get(name) or Rounds()


def _with_book(state: State, name: str, book: Rounds) -> State:
    return replace(state, rounds=put(state.rounds, name, book))


def _contract(state: State, name: str) -> Contract:
    contract = state.contracts.get(name)
    if contract is None:
        raise RejectError(f"no contract {name!r}; CREATE CONTRACT {name} first")
    return contract


def refresh_open_round(state: State, name: str, time: float) -> State:
    """Recompute the open round's ``final`` flag and ``quorum_at`` after a change of its inputs."""
    book = _book(state, name)
    contract = state.contracts.get(name)
    rnd = book.open
    if rnd is None or contract is None:
        return state
    final = contract.status == ACTIVE and not any(m.status == "active" for m in contract.members.values())
    rules = round_rules(expected_members(state, contract))
    reached = 0 < len(rnd.checkins) >= rules.min_peers
    quorum_at = (time if rnd.quorum_at is None else rnd.quorum_at) if reached else None
    if final == rnd.final and quorum_at == rnd.quorum_at:
        return state
    return _with_book(state, name, replace(book, open=replace(rnd, final=final, quorum_at=quorum_at)))


def close_due_at(state: State, name: str) -> float | None:
    """The block time from which the open round of ``name`` may close, or None while it may not."""
    contract = state.contracts.get(name)
    rnd = _book(state, name).open
    if contract is None or rnd is None or not rnd.checkins:
        return None
    expected = expected_members(state, contract)
    rules = round_rules(expected)
    count = len(rnd.checkins)
    all_in = bool(expected) and all(m.uid in rnd.checkins for m in expected)
    if all_in and (rnd.final or count >= rules.min_peers):
        return rnd.opened_at
    if count >= rules.min_peers and rnd.quorum_at is not None:
        return rnd.quorum_at + rules.quorum_wait
    return None


def completes_round(state: State, name: str, senders: Iterable[str]) -> bool:
    """Whether check-ins of ``senders`` would let the open round of ``name`` close at once: every
    expected member in, and ``min_peers`` of them (or it is the final round)."""
    contract = state.contracts.get(name)
    rnd = _book(state, name).open
    if contract is None or rnd is None:
        return False
    expected = expected_members(state, contract)
    members = {m.uid for m in expected}
    uids = set(rnd.checkins) | (set(senders) & members)
    all_in = bool(members) and members <= uids
    return all_in and (rnd.final or len(uids) >= round_rules(expected).min_peers)


def record_may_wait(state: State, name: str, number: int) -> bool:
    """Whether the ``round.merged`` of round ``number`` of ``name`` may wait for the next round's close
    (sealed in its block): the round waits for its merge and is neither the final one, whose digest
    every node waits for, nor the init round, whose model a node that joins later starts from."""
    return any(rnd.number == number and not rnd.final and not rnd.init for rnd in _book(state, name).pending)


def checkin(state: State, tx: Tx) -> State:
    """``round.checkin``: the sender joins the currently open round."""
    name = tx.body["contract"]
    contract = _contract(state, name)
    member = contract.members.get(tx.sender)
    if contract.status != ACTIVE and member is not None and member.status == "left" and member.left_reason:
        raise RejectError(
            f"{tx.sender!r} left contract {name!r} before it ended ({member.left_reason}); "
            f"it is {contract.status} now"
        )
    if contract.status != ACTIVE:
        raise RejectError(_not_active(contract))
    if member is None or member.status == "left":
        why = "is not a member" if member is None else "left it"
        raise RejectError(f"{tx.sender!r} {why} of contract {name!r}; it must join it first")
    book = _book(state, name)
    rnd = book.open
    if rnd is None:  # an ACTIVE contract always has an open round
        raise RejectError(f"contract {name!r} has no open round")
    if tx.sender in rnd.checkins:
        raise RejectError(f"{tx.sender!r} has already checked in to round {rnd.number} of {name!r}")
    entry = Checkin(
        tx.sender, tx.body["digest"], tx.body["samples"], tx.body["weight"], tx.body["init"], tx.time
    )
    rnd = replace(rnd, checkins=put(rnd.checkins, tx.sender, entry))
    state = _with_book(state, name, replace(book, open=rnd))
    return refresh_open_round(state, name, tx.time)


def _not_active(contract: Contract) -> str:
    if contract.status == COMPLETE:
        return f"contract {contract.name!r} is COMPLETE; RESET CONTRACT {contract.name} first"
    return f"contract {contract.name!r} is {contract.status}: no SL has joined it yet"


def _open_round(state: State, name: str, number: int) -> tuple[Contract, Rounds, Round]:
    contract = _contract(state, name)
    book = _book(state, name)
    rnd = book.open
    if rnd is None or rnd.number != number:
        now = "has no open round" if rnd is None else f"has round {rnd.number} open"
        raise RejectError(f"round {number} of {name!r} is not open (the contract {now})")
    return contract, book, rnd


def close(state: State, tx: Tx) -> State:
    """``round.close``: fix participants and leader, open the next round."""
    name, number = tx.body["contract"], tx.body["round"]
    contract, book, rnd = _open_round(state, name, number)
    due = close_due_at(state, name)
    if due is None or tx.time < due:
        raise RejectError(_why_not_closable(state, contract, rnd, due, tx.time))
    rules = round_rules(expected_members(state, contract))
    participants = tuple(sorted(rnd.checkins))
    admins = [u for u in participants if _admin(contract, u)]
    order = leader_order(name, number, admins or participants)
    closed = replace(
        rnd,
        status="CLOSED",
        init=all(c.init for c in rnd.checkins.values()),
        participants=participants,
        candidates=order,
        leader=order[0],
        leader_timeout=rules.leader_timeout,
        leader_deadline=tx.time + rules.leader_timeout,
        closed_at=tx.time,
    )
    nxt = Round(number=number + 1, status="OPEN", opened_at=tx.time, final=rnd.final)
    state = _with_book(state, name, replace(book, open=nxt, pending=(*book.pending, closed)))
    return refresh_open_round(state, name, tx.time)


def _admin(contract: Contract, uid: str) -> bool:
    member = contract.members.get(uid)
    return member is not None and member.params.admin


def _why_not_closable(state: State, contract: Contract, rnd: Round, due: float | None, now: float) -> str:
    head = f"round {rnd.number} of {contract.name!r} cannot close yet"
    expected = expected_members(state, contract)
    rules = round_rules(expected)
    count = len(rnd.checkins)
    if due is not None:
        return f"{head}: it has a quorum but waits {due - now:.1f}s more for more peers (quorum_wait)"
    if count < rules.min_peers:
        return f"{head}: {count} of {rules.min_peers} required peers (min_peers) have checked in"
    missing = sorted(m.uid for m in expected if m.uid not in rnd.checkins)
    return f"{head}: waiting for {', '.join(missing) or 'a checkin'}"


def _pending(state: State, name: str, number: int) -> tuple[Contract, Rounds, Round]:
    contract = _contract(state, name)
    book = _book(state, name)
    for rnd in book.pending:
        if rnd.number == number:
            return contract, book, rnd
    for rnd in book.done:
        if rnd.number == number:
            raise RejectError(f"round {number} of {name!r} is already {rnd.status}")
    if book.open is not None and book.open.number == number:
        raise RejectError(f"round {number} of {name!r} is still open; it has no leader yet")
    raise RejectError(f"contract {name!r} has no round {number} waiting for a merge")


def _finish(book: Rounds, rnd: Round) -> Rounds:
    pending = tuple(r for r in book.pending if r.number != rnd.number)
    done = (*book.done, rnd)[-KEEP_FINISHED:]
    return replace(book, pending=pending, done=done)


def merged(state: State, tx: Tx) -> State:
    """``round.merged``: the leader publishes the merged model; a final round completes the contract."""
    name, number = tx.body["contract"], tx.body["round"]
    contract, book, rnd = _pending(state, name, number)
    if tx.sender != rnd.leader:
        was = " (it was replaced)" if tx.sender in rnd.failed else ""
        raise RejectError(
            f"only the leader of round {number} of {name!r} ({rnd.leader!r}) can merge it; "
            f"{tx.sender!r} is not{was}"
        )
    strangers = [u for u in tx.body["contributors"] if u not in rnd.participants]
    if strangers:
        raise RejectError(
            f"contributors {', '.join(strangers)} did not take part in round {number} of {name!r} "
            f"(participants: {', '.join(rnd.participants)})"
        )
    excluded = tx.body["excluded"]
    check_excluded(rnd, name, tx.body["contributors"], excluded)
    digest = tx.body["digest"]
    done = replace(
        rnd,
        status="MERGED",
        digest=digest,
        contributors=tx.body["contributors"],
        ended_at=tx.time,
        excluded=excluded,
    )
    book = _finish(book, done)
    contract = record_exclusions(contract, number, excluded)
    latest = contract.latest_model
    if latest is None or number > latest.round:
        contract = replace(contract, latest_model=ModelRef(number, digest, tx.sender, tx.time))
    if rnd.final and contract.status == ACTIVE:
        contract = replace(contract, status=COMPLETE, final_digest=digest, completed_at=tx.time)
        book = replace(book, open=None)
    state = replace(state, contracts=put(state.contracts, name, contract))
    return _with_book(state, name, book)


def failed(state: State, tx: Tx) -> State:
    """``round.failed``: the leader cannot merge (too few usable rows); the round is abandoned at once,
    without waiting for its deadline, and the participants go on with their own models."""
    name, number = tx.body["contract"], tx.body["round"]
    contract, book, rnd = _pending(state, name, number)
    if tx.sender != rnd.leader:
        raise RejectError(f"only the leader of round {number} of {name!r} ({rnd.leader!r}) can fail it")
    excluded = tx.body["excluded"]
    check_excluded(rnd, name, (), excluded)
    reason = f"leader {tx.sender!r} could not merge: {tx.body['reason']}"
    done = replace(rnd, status="ABANDONED", ended_at=tx.time, reason=reason, excluded=excluded)
    contract = record_exclusions(contract, number, excluded)
    state = replace(state, contracts=put(state.contracts, name, contract))
    return _with_book(state, name, _finish(book, done))


def leader_timeout(state: State, tx: Tx) -> State:
    """``round.leader_timeout``: the leader missed its deadline; hand the round to the next one."""
    name, number = tx.body["contract"], tx.body["round"]
    contract, book, rnd = _pending(state, name, number)
    deadline = rnd.leader_deadline if rnd.leader_deadline is not None else tx.time
    if tx.time < deadline:
        raise RejectError(
            f"leader {rnd.leader!r} of round {number} of {name!r} still has "
            f"{deadline - tx.time:.1f}s before its deadline"
        )
    book = _replace_leader(state, contract, book, rnd, tx.time, "missed its deadline")
    return _with_book(state, name, book)


def _eligible(state: State, contract: Contract, uid: str) -> bool:
    member = contract.members.get(uid)
    return member is not None and member.status != "left" and is_online(state, uid)


def _replace_leader(
    state: State, contract: Contract, book: Rounds, rnd: Round, time: float, why: str
) -> Rounds:
    failed = rnd.failed if rnd.leader is None else (*rnd.failed, rnd.leader)
    for uid in rnd.candidates:
        if uid not in failed and _eligible(state, contract, uid):
            new = replace(rnd, leader=uid, failed=failed, leader_deadline=time + rnd.leader_timeout)
            return replace(book, pending=tuple(new if r is rnd else r for r in book.pending))
    reason = f"leader {rnd.leader!r} {why} and no other eligible leader is left"
    return _finish(book, replace(rnd, status="ABANDONED", failed=failed, ended_at=time, reason=reason))


def member_offline(state: State, name: str, uid: str, time: float, reason: str) -> State:
    """Liveness: ``uid`` went offline; drop its checkin, replace it as leader, mark it ``left``
    (a member of a COMPLETE contract keeps its status: it left after the training ended)."""
    contract = state.contracts[name]
    old_status = contract.members[uid].status
    status = old_status if contract.status == "COMPLETE" else "left"
    member = replace(contract.members[uid], status=status, left_reason=reason, updated_at=time)
    contract = replace(contract, members=put(contract.members, uid, member))
    state = replace(state, contracts=put(state.contracts, name, contract))
    book = old = _book(state, name)
    if book.open is not None and uid in book.open.checkins:
        checkins = {k: v for k, v in book.open.checkins.items() if k != uid}
        book = replace(book, open=replace(book.open, checkins=checkins))
    for rnd in old.pending:
        if rnd.leader == uid:
            book = _replace_leader(state, contract, book, rnd, time, "went offline")
    if book is not old:
        state = _with_book(state, name, book)
    return refresh_open_round(state, name, time)


def straggler_due(state: State, name: str) -> tuple[float, str] | None:
    """When the first straggler of ``name`` is skipped, and who: an ``active`` member (online) that has
    sent nothing (no progress, no check-in) for ``straggler_timeout`` seconds since the last of the
    others finished training, say an ML program that hangs while its SL lives. None: nobody waits."""
    contract = state.contracts.get(name)
    rnd = _book(state, name).open if name in state.rounds else None
    if contract is None or contract.status != ACTIVE or rnd is None:
        return None
    expected = expected_members(state, contract)
    finished = [m for m in expected if m.status == "finished"]
    silent = [m for m in expected if m.status == "active" and m.uid not in rnd.checkins]
    if not finished or not silent or any(m.status == "active" and m.uid in rnd.checkins for m in expected):
        return None
    timeout = max(m.params.straggler_timeout for m in expected)
    last_done = max(m.updated_at for m in finished)
    return min((max(m.updated_at, last_done) + timeout, m.uid) for m in silent)


def skip_straggler(state: State, tx: Tx) -> State:
    """``round.skip_straggler`` (SN): the straggler leaves the contract, so the others' final round goes
    on without it; its node stays online (its SL is alive) and a late request of it is refused."""
    name, uid = tx.body["contract"], tx.body["uid"]
    due = straggler_due(state, name)
    if due is None or due[1] != uid:
        raise RejectError(f"{uid!r} is not the straggler of contract {name!r} (or nobody waits for it)")
    if tx.time < due[0]:
        raise RejectError(f"{uid!r} has until {due[0]:.3f} to show progress in contract {name!r}")
    contract = state.contracts[name]
    waited = tx.time - max(m.updated_at for m in contract.members.values() if m.status == "finished")
    reason = f"sent nothing for {waited:.0f} s after the others finished training (straggler_timeout)"
    return member_offline(state, name, uid, tx.time, reason)
