"""Properties of the state machine over generated logs of valid and invalid transactions.

- replaying a log gives the same state and state hash, bit for bit;
- a rejected transaction leaves the state unchanged (same hash);
- replaying only the accepted ones without body validation (what ``Ledger.open`` does) agrees;
- a ledger sealed from the log and reopened gives the same state hash.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.ledger import Accepted, Ledger
from contracts.machine import DEFAULT_CONTRACT, DEFAULT_TASKRUNNER, apply, due_actions, genesis_transactions
from contracts.state import EMPTY_STATE, State, state_hash
from contracts.tx import KINDS, Rejection, Tx
from wire.envelope import encode_envelope, make_envelope

C = DEFAULT_CONTRACT
TR = DEFAULT_TASKRUNNER
NODES = {"sl1": "sl", "sl2": "sl", "sl3": "sl", "swop1": "swop", "swop2": "swop", "swci": "swci", "sn": "sn"}
ROLES = ["sl", "swop", "swci", "sn"]


def _lines_ok(task_type: str, lines: list[str]) -> object:
    """A deterministic stand-in for taskdefs: a body whose first line is 'bad' is invalid."""
    if lines and lines[0] == "bad":
        raise ValueError("line 1: bad body")
    return None


contracts = st.sampled_from([C, "c2", "nope"])
uids = st.sampled_from(sorted(NODES))
tasks = st.sampled_from(["t1", "t2", "ROOTTASK"])
runners = st.sampled_from([TR, "tr2"])
junk = st.one_of(
    st.none(), st.integers(-3, 3), st.text(max_size=3), st.booleans(), st.lists(st.integers(), max_size=2)
)
small = st.integers(-1, 4)
numbers = st.one_of(st.floats(-1, 20, allow_nan=False), st.integers(0, 5))

FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "name": st.one_of(contracts, tasks, runners),
    "contract": contracts,
    "uid": uids,
    "reason": st.just("gone"),
    "role": st.sampled_from([None, "sl", "swop"]),
    "parent": st.sampled_from([None, "swop1"]),
    "host": st.just("h"),
    "params": st.fixed_dictionaries(
        {},
        optional={
            "min_peers": st.integers(0, 3),
            "quorum_wait": st.sampled_from([0.0, 5.0, 30.0]),
            "leader_timeout": st.sampled_from([0.5, 10.0]),
            "admin": st.booleans(),
        },
    ),
    "epochs_done": small,
    "total_epochs": small,
    "loss": st.one_of(st.none(), numbers, st.just(float("nan"))),
    "metric": st.one_of(st.none(), numbers),
    "mode": st.sampled_from(["snapshot", "active", "bogus"]),
    "digest": st.sampled_from(["aa", "bb", "zz", b"\x01\x02"]),
    "samples": small,
    "weight": numbers,
    "init": st.booleans(),
    "round": st.integers(0, 4),
    "contributors": st.lists(uids, max_size=3),
    "type": st.sampled_from(["RUN_SWARM", "MAKE_USER_ENV", "ROOT", "pull_image", "NOPE"]),
    "author": st.just("me"),
    "body": st.one_of(st.none(), st.lists(st.sampled_from(["ok", "bad", "x: 1"]), max_size=3)),
    "idx": small,
    "line": st.sampled_from(["ok", "bad"]),
    "taskrunner": runners,
    "capacity": small,
    "group": st.just("g"),
    "task": tasks,
    "peers": st.sampled_from([None, 1, 2, 3, "ALL", 0]),
    "target": st.sampled_from([None, "swop1", "swop2", "sl1"]),
    "peer": uids,
    "peer_type": st.sampled_from(["SL", "SWOP"]),
    "status": st.sampled_from(["STARTING", "RUNNING", "COMPLETED", "FAILED"]),
    "description": st.just("d"),
    "exit_code": st.sampled_from([None, 0, 1]),
}


@st.composite
def bodies(draw: st.DrawFn, kind: str) -> dict[str, Any]:
    spec = KINDS.get(kind)
    names = list(spec.fields) if spec is not None else ["name"]
    body = {name: draw(FIELDS.get(name, junk)) for name in names if draw(st.integers(0, 9)) > 0}
    if draw(st.integers(0, 19)) == 0:
        body[draw(st.sampled_from(["junk", *names]))] = draw(junk)
    return body


@st.composite
def random_txs(draw: st.DrawFn, time: float) -> Tx:
    """Any kind (or an unknown one), any sender and role, fields often missing or junk."""
    kind = draw(st.sampled_from([*KINDS, "bogus.kind"]))
    sender = draw(uids)
    role = NODES[sender] if draw(st.integers(0, 9)) else draw(st.sampled_from(ROLES))
    return Tx(kind, sender, role, draw(bodies(kind)), time)


VALID: dict[str, st.SearchStrategy[Any]] = {
    **FIELDS,
    "params": st.fixed_dictionaries(
        {
            "min_peers": st.integers(1, 3),
            "quorum_wait": st.sampled_from([0.0, 5.0]),
            "leader_timeout": st.sampled_from([0.5, 10.0]),
            "admin": st.booleans(),
        }
    ),
    "contract": st.sampled_from([C, C, "c2"]),
    "digest": st.sampled_from(["aa", "bb"]),
    "round": st.integers(1, 4),
    "type": st.sampled_from(["RUN_SWARM", "MAKE_USER_ENV"]),
    "body": st.sampled_from([["ok"], ["ok"], ["bad"]]),
    "idx": st.integers(1, 3),
    "capacity": st.integers(0, 3),
    "peers": st.sampled_from([1, 2, 3, "ALL"]),
    "target": st.sampled_from([None, None, None, "swop1", "swop2"]),
    "peer": st.sampled_from(["sl1", "sl2", "sl3"]),
    "status": st.sampled_from(["RUNNING", "COMPLETED", "COMPLETED", "FAILED"]),
    "exit_code": st.sampled_from([0, 1]),
    "mode": st.just("snapshot"),
    "epochs_done": st.integers(0, 3),
    "total_epochs": st.integers(0, 3),
    "samples": st.integers(0, 3),
    "weight": st.just(1.0),
    "address": st.just("10.0.0.1:1883"),
    "pid": st.sampled_from([None, 42]),
    "meta": st.just({}),
    "loss": st.sampled_from([None, 0.5]),
    "metric": st.sampled_from([None, 0.9]),
    "contributors": st.just(["sl1"]),
}
NAME_OF = {
    "contract": st.sampled_from([C, "c2"]),
    "task": st.sampled_from(["t1", "t2"]),
    "taskrunner": runners,
}
GUIDED = [
    *(k for k in KINDS if k not in ("round.close", "round.merged", "round.leader_timeout")),
    *["round.checkin"] * 6,
    *["taskrunner.status"] * 4,
    *["taskrunner.assign", "node.register", "contract.join"] * 2,
]


def _prelude(draw: st.DrawFn, time: float) -> list[Tx]:
    """Register the nodes, join some SLs, enroll the SWOPs, create two finalized tasks."""
    out = [Tx("node.register", uid, role, {}, time) for uid, role in sorted(NODES.items())]
    for uid in ("sl1", "sl2", "sl3"):
        if draw(st.integers(0, 3)):
            out.append(Tx("contract.join", uid, "sl", {"contract": C, "params": draw(VALID["params"])}, time))
    for uid in ("swop1", "swop2"):
        body = {"taskrunner": TR, "capacity": draw(st.integers(0, 3))}
        out.append(Tx("taskrunner.enroll", uid, "swop", body, time))
    for name, task_type in (("t1", "RUN_SWARM"), ("t2", "MAKE_USER_ENV")):
        body = {"name": name, "type": task_type, "author": "me", "body": ["ok"]}
        out += [
            Tx("task.create", "swci", "swci", body, time),
            Tx("task.finalize", "swci", "swci", {"name": name}, time),
        ]
    return out


@st.composite
def guided_txs(draw: st.DrawFn, time: float) -> Tx:
    """A mostly valid transaction from a sender of the right role."""
    kind = draw(st.sampled_from(GUIDED))
    roles = KINDS[kind].roles
    sender = draw(st.sampled_from([u for u, r in sorted(NODES.items()) if roles is None or r in roles]))
    body = {}
    for name in KINDS[kind].fields:
        strategy = NAME_OF[kind.split(".")[0]] if name == "name" else VALID.get(name, junk)
        body[name] = draw(strategy)
    if kind == "taskrunner.status" and draw(st.booleans()):
        body.update(peer=sender, peer_type="SWOP")
    if kind == "node.offline":
        body["uid"] = draw(st.sampled_from(["sl1", "sl2", "sl3", "swop1", "swop2"]))
    if kind == "node.register":
        body["role"] = None
    return Tx(kind, sender, NODES[sender], body, time)


def _leader_merges(state: State, time: float) -> list[Tx]:
    out = []
    for name, book in sorted(state.rounds.items()):
        for rnd in book.pending:
            if rnd.leader is not None:
                body = {
                    "contract": name,
                    "round": rnd.number,
                    "digest": "cc",
                    "contributors": list(rnd.participants),
                }
                out.append(Tx("round.merged", rnd.leader, "sl", body, time))
    return out


def _genesis(time: float) -> list[Tx]:
    return [Tx(kind, "sn", "sn", body, time) for kind, body in genesis_transactions("sn")]


@st.composite
def logs(draw: st.DrawFn) -> list[Tx]:
    """A log built step by step: random txs, the SN's due actions, leaders' merges, clock ticks."""
    time = 1000.0
    state = EMPTY_STATE
    log: list[Tx] = []
    for tx in _genesis(time) + _prelude(draw, time):
        state = _step(state, tx, log)
    for _ in range(draw(st.integers(5, 120))):
        action = draw(st.sampled_from(["tx", "good", "good", "good", "good", "due", "merge", "tick"]))
        if action == "tick":
            time += draw(st.sampled_from([0.5, 5.0, 30.0, 700.0]))
            continue
        if action == "tx":
            batch = [draw(random_txs(time))]
        elif action == "good":
            batch = [draw(guided_txs(time))]
        elif action == "due":
            batch = [Tx(kind, "sn", "sn", body, time) for kind, body in due_actions(state, time)]
        else:
            batch = _leader_merges(state, time)
        for tx in batch:
            state = _step(state, tx, log)
    return log


def _step(state: State, tx: Tx, log: list[Tx]) -> State:
    log.append(tx)
    result = apply(state, tx, validate_body=_lines_ok)
    return state if isinstance(result, Rejection) else result


def _run(log: list[Tx]) -> tuple[State, list[Tx]]:
    state = EMPTY_STATE
    accepted = []
    for tx in log:
        before = state_hash(state)
        result = apply(state, tx, validate_body=_lines_ok)
        if isinstance(result, Rejection):
            assert result.reason
            assert state_hash(state) == before, f"rejected {tx.kind} changed the state: {result.reason}"
        else:
            state = result
            accepted.append(tx)
    return state, accepted


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs())
def test_replay_is_deterministic_and_rejections_change_nothing(log: list[Tx]) -> None:
    first, accepted = _run(log)
    second, again = _run(log)
    assert state_hash(first) == state_hash(second)
    assert first == second
    assert len(accepted) == len(again)
    trusted = EMPTY_STATE
    for tx in accepted:
        result = apply(trusted, tx, validate_body=None)
        assert not isinstance(result, Rejection), result.reason
        trusted = result
    assert state_hash(trusted) == state_hash(first)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(log=logs(), batch=st.integers(1, 7))
def test_a_sealed_log_reopens_to_the_same_state(tmp_path_factory: Any, log: list[Tx], batch: int) -> None:
    path: Path = tmp_path_factory.mktemp("prop") / "ledger.db"
    expected, accepted = _run(log)
    genesis_time = log[0].time
    ledger = Ledger.create(
        path, sealer=None, sealer_uid="sn", verifier=None, now=genesis_time, validate_body=_lines_ok
    )
    txs = accepted[len(_genesis(genesis_time)) :]
    for _, same_time in itertools.groupby(txs, key=lambda tx: tx.time):  # a block has one time
        group = list(same_time)
        for start in range(0, len(group), batch):
            part = group[start : start + batch]
            envelopes = [
                encode_envelope(make_envelope("tx:" + tx.kind, dict(tx.body), sender=tx.sender, role=tx.role))
                for tx in part
            ]
            result = ledger.seal(envelopes, sealer=None, sealer_uid="sn", now=part[0].time)
            assert all(isinstance(r, Accepted) for r in result.results), result.results
    digest = state_hash(ledger.state)
    ledger.close()
    assert digest == state_hash(expected)
    with Ledger.open(path, verifier=None) as reopened:
        assert state_hash(reopened.state) == digest
