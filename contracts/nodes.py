"""The node registry: ``node.register`` and ``node.offline`` (with its liveness effects)."""

from __future__ import annotations

from dataclasses import replace

from contracts import rounds, taskrunners, trials
from contracts.state import Node, State, put
from contracts.tx import RejectError, Tx

__all__ = ["offline", "register"]


def register(state: State, tx: Tx) -> State:
    """``node.register``: add or update the sender's node; it is online as of ``tx.time``."""
    body = tx.body
    if body["role"] is not None and body["role"] != tx.role:
        raise RejectError(
            f"node.register: body role {body['role']!r} does not match the sender's role {tx.role!r}"
        )
    old = state.nodes.get(tx.sender)
    node = Node(
        uid=tx.sender,
        role=tx.role,
        parent=body["parent"],
        host=body["host"],
        address=body["address"],
        pid=body["pid"],
        meta=body["meta"],
        online=True,
        registered_at=tx.time if old is None else old.registered_at,
        last_seen=tx.time,
    )
    return replace(state, nodes=put(state.nodes, tx.sender, node))


def offline(state: State, tx: Tx) -> State:
    """``node.offline``: mark the node offline; its memberships leave and its assignments may fail."""
    uid, reason = tx.body["uid"], tx.body["reason"]
    node = state.nodes.get(uid)
    if node is None:
        raise RejectError(f"node {uid!r} is not registered; there is nothing to mark offline")
    if not node.online:
        raise RejectError(f"node {uid!r} is already offline")
    node = replace(node, online=False, offline_reason=reason)
    state = replace(state, nodes=put(state.nodes, uid, node))
    for name, contract in state.contracts.items():
        member = contract.members.get(uid)
        if member is not None and member.status != "left":
            state = rounds.member_offline(state, name, uid, tx.time, reason or "went offline")
    state = trials.swop_offline(state, uid, tx.time)
    return taskrunners.swop_offline(state, uid, tx.time)
