"""The node registry: ``node.register``, ``node.offline`` (with its liveness effects), identities.

A node is bound to the identity (certificate CN) that first registered it: the CN itself, or the SL
identity that vouches for it (the reference's shared SL certificate). Every later transaction of that
node must be signed by the same identity. One live session per node: a registration while the node
is online in another session is refused, and ``node.offline`` names the session it is about, so the
end of a second session never marks the live one offline. ``identity.revoke`` refuses an identity
from then on and takes its nodes offline.
"""

from __future__ import annotations

from dataclasses import replace

from contracts import rounds, taskrunners, trials
from contracts.state import Node, Revocation, State, put
from contracts.tx import RejectError, Tx

__all__ = ["check_identity", "offline", "register", "revoke"]


def check_identity(state: State, tx: Tx) -> None:
    """Refuse a transaction of a revoked identity, or of a node bound to another identity."""
    revoked = state.revoked.get(tx.signer)
    if revoked is not None:
        why = f": {revoked.reason}" if revoked.reason else ""
        raise RejectError(f"identity {tx.signer!r} was revoked by {revoked.by}{why}; it is refused")
    node = state.nodes.get(tx.sender)
    if node is not None and node.identity and node.identity != tx.signer:
        raise RejectError(
            f"node {tx.sender!r} belongs to identity {node.identity!r}; {tx.signer!r} may not act for it"
        )


def register(state: State, tx: Tx) -> State:
    """``node.register``: add or update the sender's node; it is online as of ``tx.time``."""
    body = tx.body
    if body["role"] is not None and body["role"] != tx.role:
        raise RejectError(
            f"node.register: body role {body['role']!r} does not match the sender's role {tx.role!r}"
        )
    old = state.nodes.get(tx.sender)
    session = body["session"]
    if old is not None and old.online and old.session and session and old.session != session:
        raise RejectError(
            f"node {tx.sender!r} is already online (host {old.host or '?'}, pid {old.pid}, session "
            f"{old.session}); a second session of one node is refused: stop the other one first"
        )
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
        identity=tx.signer,
        session=session,
    )
    state = replace(state, nodes=put(state.nodes, tx.sender, node))
    return taskrunners.swop_online(state, tx.sender, tx.time) if tx.role == "swop" else state


def offline(state: State, tx: Tx) -> State:
    """``node.offline``: mark the node offline; its memberships leave and its assignments may fail."""
    uid, reason, session = tx.body["uid"], tx.body["reason"], tx.body["session"]
    node = state.nodes.get(uid)
    if node is None:
        raise RejectError(f"node {uid!r} is not registered; there is nothing to mark offline")
    if not node.online:
        raise RejectError(f"node {uid!r} is already offline")
    if session and node.session and session != node.session:
        raise RejectError(
            f"node {uid!r} is online in session {node.session}; the end of session {session} "
            "does not take it offline"
        )
    return _take_offline(state, node, reason, tx.time)


def _take_offline(state: State, node: Node, reason: str, time: float) -> State:
    uid = node.uid
    node = replace(node, online=False, offline_reason=reason)
    state = replace(state, nodes=put(state.nodes, uid, node))
    for name, contract in state.contracts.items():
        member = contract.members.get(uid)
        if member is not None and member.status != "left":
            state = rounds.member_offline(state, name, uid, time, reason or "went offline")
    state = trials.swop_offline(state, uid, time)
    return taskrunners.swop_offline(state, uid, time)


def revoke(state: State, tx: Tx) -> State:
    """``identity.revoke``: refuse the identity from now on; its online nodes go offline."""
    identity, reason = tx.body["identity"], tx.body["reason"]
    if identity in state.revoked:
        raise RejectError(f"identity {identity!r} is already revoked")
    if identity == tx.signer:
        raise RejectError(f"{identity!r} cannot revoke its own identity")
    entry = Revocation(identity, tx.signer, tx.time, reason)
    state = replace(state, revoked=put(state.revoked, identity, entry))
    why = f"identity {identity} revoked by {tx.signer}" + (f": {reason}" if reason else "")
    for node in list(state.nodes.values()):
        if node.online and (node.identity or node.uid) == identity:
            state = _take_offline(state, node, why, tx.time)
    return state
