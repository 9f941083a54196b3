"""Training contracts: create, reset, join, progress (PERFDATA) and done."""

from __future__ import annotations

from dataclasses import replace

from contracts.fields import Layout
from contracts.merge_policy import pin
from contracts.rounds import is_online, refresh_open_round
from contracts.state import (
    ACTIVE,
    COMPLETE,
    UNINITIALIZED,
    Contract,
    Member,
    Params,
    Round,
    Rounds,
    State,
    put,
)
from contracts.tx import RejectError, Tx

__all__ = ["create", "done", "join", "progress", "reset"]


def _contract(state: State, name: str) -> Contract:
    contract = state.contracts.get(name)
    if contract is None:
        raise RejectError(f"no contract {name!r}; CREATE CONTRACT {name} first")
    return contract


def _member(contract: Contract, uid: str) -> Member:
    member = contract.members.get(uid)
    if member is None:
        raise RejectError(f"{uid!r} is not a member of contract {contract.name!r}; it must join it first")
    return member


def _with_contract(state: State, contract: Contract) -> State:
    return replace(state, contracts=put(state.contracts, contract.name, contract))


def create(state: State, tx: Tx) -> State:
    """``contract.create``: a new contract, ``UNINITIALIZED``."""
    name = tx.body["name"]
    if name in state.contracts:
        raise RejectError(f"contract {name!r} already exists")
    contract = Contract(name=name, status=UNINITIALIZED, created_at=tx.time, created_by=tx.sender)
    state = _with_contract(state, contract)
    return replace(state, rounds=put(state.rounds, name, Rounds()))


def reset(state: State, tx: Tx) -> State:
    """``contract.reset``: back to ``UNINITIALIZED``; refused while a member is active and online."""
    contract = _contract(state, tx.body["name"])
    busy = sorted(
        uid for uid, m in contract.members.items() if m.status == "active" and is_online(state, uid)
    )
    if busy:
        raise RejectError(
            f"contract {contract.name!r} has {len(busy)} active member(s) online "
            f"({', '.join(busy)}); wait for the training to finish before RESET CONTRACT"
        )
    if contract.status == UNINITIALIZED and not contract.members:
        return state
    fresh = Contract(
        name=contract.name,
        status=UNINITIALIZED,
        created_at=contract.created_at,
        created_by=contract.created_by,
        resets=contract.resets + 1,
    )
    state = _with_contract(state, fresh)
    return replace(state, rounds=put(state.rounds, contract.name, Rounds()))


def join(state: State, tx: Tx) -> State:
    """``contract.join``: the sender becomes an ``active`` member (a rejoin too)."""
    contract = _contract(state, tx.body["contract"])
    if contract.status == COMPLETE:
        raise RejectError(f"contract {contract.name!r} is COMPLETE; RESET CONTRACT {contract.name} first")
    node = state.nodes.get(tx.sender)
    if node is None:
        raise RejectError(f"node {tx.sender!r} is not registered; it must send node.register first")
    if not node.online:
        raise RejectError(f"node {tx.sender!r} is offline; it must register again (node.register) first")
    params = Params(**tx.body["params"])
    _same_secure_aggregation(contract, tx.sender, params)
    layout = tx.body.get("layout")
    if layout is not None and contract.layout is not None and layout != contract.layout:
        raise RejectError(
            f"the model of {tx.sender!r} differs from the one training under contract {contract.name!r}: "
            f"{layout_difference(contract.layout, layout)}"
        )
    contract = pin(contract, params, tx.sender)
    old = contract.members.get(tx.sender)
    member = Member(
        uid=tx.sender,
        status="active",
        params=params,
        joined_at=tx.time if old is None else old.joined_at,
        updated_at=tx.time,
        epochs_done=0 if old is None else old.epochs_done,
        total_epochs=params.total_epochs if old is None else old.total_epochs,
        loss=None if old is None else old.loss,
        metric=None if old is None else old.metric,
        epsilon=None if old is None else old.epsilon,
        excluded=0 if old is None else old.excluded,
        excluded_reason="" if old is None else old.excluded_reason,
    )
    contract = replace(
        contract,
        status=ACTIVE,
        members=put(contract.members, tx.sender, member),
        layout=contract.layout if contract.layout is not None else layout,
    )
    state = _with_contract(state, contract)
    book = state.rounds.get(contract.name) or Rounds()
    if book.open is None:
        first = Round(number=_next_number(book), status="OPEN", opened_at=tx.time)
        state = replace(state, rounds=put(state.rounds, contract.name, replace(book, open=first)))
    return refresh_open_round(state, contract.name, tx.time)


def _same_secure_aggregation(contract: Contract, uid: str, params: Params) -> None:
    """Every member of a contract merges the same way: all with secure aggregation or none."""
    others = {
        m.params.secure_aggregation for u, m in contract.members.items() if u != uid and m.status != "left"
    }
    if others and params.secure_aggregation not in others:
        theirs, mine = ("without", "with") if params.secure_aggregation else ("with", "without")
        raise RejectError(
            f"contract {contract.name!r} trains {theirs} secure aggregation; {uid!r} asked to train {mine}: "
            "every site must set the same secureAggregation"
        )


def layout_difference(expected: Layout, got: Layout) -> str:
    """Which tensor of ``got`` differs from ``expected`` (name, dtype or shape), in words."""
    want = {name: (dtype, shape) for name, dtype, shape in expected}
    have = {name: (dtype, shape) for name, dtype, shape in got}
    for name in [n for n, _, _ in expected] + [n for n, _, _ in got]:
        if name not in have:
            return f"it has no tensor {name!r}"
        if name not in want:
            return f"it has a tensor {name!r} that the training's model lacks"
        if have[name] != want[name]:
            (dt, shape), (wdt, wshape) = have[name], want[name]
            return f"tensor {name!r} is {dt}{list(shape)}, the training's is {wdt}{list(wshape)}"
    return "the tensors are in another order"


def _next_number(book: Rounds) -> int:
    numbers = [r.number for r in (*book.pending, *book.done)]
    return max(numbers, default=0) + 1


def progress(state: State, tx: Tx) -> State:
    """``contract.progress``: the member's PERFDATA (epochs, loss, metric, and epsilon under DP)."""
    contract = _contract(state, tx.body["contract"])
    old = _member(contract, tx.sender)
    epsilon = tx.body.get("epsilon")
    member = replace(
        old,
        epochs_done=tx.body["epochs_done"],
        total_epochs=tx.body["total_epochs"],
        loss=tx.body["loss"],
        metric=tx.body["metric"],
        epsilon=old.epsilon if epsilon is None else epsilon,
        updated_at=tx.time,
    )
    return _with_contract(state, replace(contract, members=put(contract.members, tx.sender, member)))


def done(state: State, tx: Tx) -> State:
    """``contract.done``: the member finished training; the last one makes the open round final."""
    contract = _contract(state, tx.body["contract"])
    if contract.status != ACTIVE:
        raise RejectError(f"contract {contract.name!r} is {contract.status}; nothing to finish")
    member = _member(contract, tx.sender)
    if member.status == "left":
        raise RejectError(
            f"{tx.sender!r} left contract {contract.name!r} (it went offline); it must join it again"
        )
    member = replace(member, status="finished", done_mode=tx.body["mode"], updated_at=tx.time)
    state = _with_contract(state, replace(contract, members=put(contract.members, tx.sender, member)))
    return refresh_open_round(state, contract.name, tx.time)
