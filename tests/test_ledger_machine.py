"""The ledger's rules as state transitions (docs/ledger.md), one behaviour per test."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from contracts import views
from contracts.machine import (
    DEFAULT_CONTRACT,
    DEFAULT_TASKRUNNER,
    apply,
    changed_entities,
    due_actions,
    genesis_transactions,
    next_deadline,
    receipt,
)
from contracts.rounds import KEEP_FINISHED
from contracts.state import EMPTY_STATE, Round, State, state_hash
from contracts.tasks import BodyValidator
from contracts.tx import Rejection, Tx

C = DEFAULT_CONTRACT
TR = DEFAULT_TASKRUNNER
ROLE_OF = {"sn": "sn", "swci": "swci"}


def _role(uid: str) -> str:
    return ROLE_OF.get(uid, "".join(ch for ch in uid if ch.isalpha()))


def _accept_any(task_type: str, lines: list[str]) -> object:
    return None


class Sim:
    """A state with a clock; ``ok`` applies and expects acceptance, ``no`` expects a rejection."""

    def __init__(self, validator: BodyValidator | None = _accept_any) -> None:
        self.time = 1000.0
        self.validator = validator
        self.state: State = EMPTY_STATE
        for kind, body in genesis_transactions("sn"):
            self.ok(kind, "sn", body)

    def tx(self, kind: str, sender: str, body: dict[str, Any], role: str | None = None) -> Tx:
        return Tx(kind, sender, role or _role(sender), body, self.time)

    def apply(
        self, kind: str, sender: str, body: dict[str, Any], role: str | None = None
    ) -> State | Rejection:
        return apply(self.state, self.tx(kind, sender, body, role), validate_body=self.validator)

    def ok(self, kind: str, sender: str, body: dict[str, Any], role: str | None = None) -> State:
        result = self.apply(kind, sender, body, role)
        assert not isinstance(result, Rejection), result.reason
        self.state = result
        return result

    def no(self, kind: str, sender: str, body: dict[str, Any], role: str | None = None) -> str:
        before = state_hash(self.state)
        result = self.apply(kind, sender, body, role)
        assert isinstance(result, Rejection), f"{kind} from {sender} was accepted"
        assert state_hash(self.state) == before
        return result.reason

    def tick(self, seconds: float = 1.0) -> None:
        self.time += seconds

    # --- shortcuts -------------------------------------------------------------------------

    def register(self, *uids: str, parent: str | None = None) -> None:
        for uid in uids:
            self.ok("node.register", uid, {"host": "h", "address": "10.0.0.1", "pid": 7, "parent": parent})

    def join(self, uid: str, contract: str = C, **params: Any) -> None:
        defaults = {"min_peers": 2, "quorum_wait": 10.0, "leader_timeout": 60.0}
        self.ok("contract.join", uid, {"contract": contract, "params": {**defaults, **params}})

    def members(self, *uids: str, **params: Any) -> None:
        self.register(*uids)
        for uid in uids:
            self.join(uid, **params)

    def checkin(self, uid: str, digest: str = "", *, init: bool = False) -> None:
        body = {"contract": C, "digest": digest or _digest(uid), "samples": 10, "init": init}
        self.ok("round.checkin", uid, body)

    def offline(self, uid: str) -> None:
        self.ok("node.offline", "sn", {"uid": uid, "reason": "connection lost"})

    def run_due(self) -> list[tuple[str, dict[str, Any]]]:
        actions = due_actions(self.state, self.time)
        for kind, body in actions:
            self.ok(kind, "sn", body)
        return actions

    def open(self) -> Round:
        rnd = self.state.rounds[C].open
        assert rnd is not None
        return rnd

    def pending(self, number: int) -> Round:
        return next(r for r in self.state.rounds[C].pending if r.number == number)

    def merge(self, number: int, digest: str = "ee") -> None:
        rnd = self.pending(number)
        assert rnd.leader is not None
        body = {"contract": C, "round": number, "digest": digest, "contributors": list(rnd.participants)}
        self.ok("round.merged", rnd.leader, body)


def _digest(uid: str) -> str:
    return hashlib.sha256(uid.encode()).hexdigest()


def _order(number: int, uids: list[str]) -> list[str]:
    return sorted(uids, key=lambda u: hashlib.sha256(f"{C}:{number}:{u}".encode()).digest())


# --- genesis and envelopes -------------------------------------------------------------------


def test_genesis_creates_default_contract_taskrunner_and_roottask() -> None:
    sim = Sim()
    assert sim.state.contracts[C].status == "UNINITIALIZED"
    assert sim.state.taskrunners[TR].state == "IDLE"
    root = sim.state.tasks["ROOTTASK"]
    assert root.type == "ROOT"
    assert root.finalized


def test_unknown_kind_and_bad_fields_are_rejections_naming_the_field() -> None:
    sim = Sim()
    assert "unknown transaction kind 'contract.explode'" in sim.no("contract.explode", "swci", {})
    reason = sim.no("contract.create", "swci", {"name": "bad name!"})
    assert "field 'name'" in reason
    reason = sim.no("contract.join", "sl1", {"contract": C, "params": {"min_peers": "two"}})
    assert "field 'params.min_peers' must be an integer" in reason
    assert "field 'contract' is missing" in sim.no("contract.join", "sl1", {})
    assert "field 'colour' is not a field" in sim.no("contract.create", "swci", {"name": "x", "colour": 1})


def test_wrong_role_is_rejected() -> None:
    sim = Sim()
    reason = sim.no("contract.create", "sl1", {"name": "c2"})
    assert "must come from" in reason
    assert "sl 'sl1'" in reason
    assert "must come from" in sim.no("round.close", "swci", {"contract": C, "round": 1})


def test_apply_never_raises_on_garbage_bodies() -> None:
    sim = Sim()
    bodies: list[dict[Any, Any]] = [{"name": None}, {"name": 3}, {"name": ["x"]}, {1: 2}, {"name": "x" * 500}]
    for body in bodies:
        sim.no("contract.create", "swci", body)


# --- nodes -----------------------------------------------------------------------------------


def test_node_register_and_update() -> None:
    sim = Sim()
    sim.register("sl1", parent="swop1")
    node = sim.state.nodes["sl1"]
    assert node.online
    assert node.role == "sl"
    assert node.parent == "swop1"
    assert node.last_seen == sim.time
    sim.tick(5)
    sim.register("sl1")
    assert sim.state.nodes["sl1"].last_seen == sim.time
    assert sim.state.nodes["sl1"].registered_at == sim.time - 5
    assert "does not match" in sim.no("node.register", "sl1", {"role": "swop"})


def test_node_offline_rules() -> None:
    sim = Sim()
    assert "not registered" in sim.no("node.offline", "sn", {"uid": "ghost"})
    sim.register("sl1")
    sim.offline("sl1")
    assert not sim.state.nodes["sl1"].online
    assert sim.state.nodes["sl1"].offline_reason == "connection lost"
    assert "already offline" in sim.no("node.offline", "sn", {"uid": "sl1"})
    sim.register("sl1")
    assert sim.state.nodes["sl1"].online


# --- contracts -------------------------------------------------------------------------------


def test_contract_create_and_duplicate() -> None:
    sim = Sim()
    sim.ok("contract.create", "swci", {"name": "c2"})
    assert sim.state.contracts["c2"].status == "UNINITIALIZED"
    assert "already exists" in sim.no("contract.create", "swci", {"name": "c2"})


def test_join_needs_contract_and_registered_online_node() -> None:
    sim = Sim()
    body = {"contract": "nope", "params": {}}
    sim.register("sl1")
    assert "CREATE CONTRACT nope first" in sim.no("contract.join", "sl1", body)
    assert "not registered" in sim.no("contract.join", "sl2", {"contract": C})
    sim.offline("sl1")
    assert "offline" in sim.no("contract.join", "sl1", {"contract": C})


def test_join_activates_contract_and_opens_round_1() -> None:
    sim = Sim()
    sim.members("sl1")
    contract = sim.state.contracts[C]
    assert contract.status == "ACTIVE"
    assert contract.members["sl1"].status == "active"
    assert contract.members["sl1"].params.min_peers == 2
    assert sim.open().number == 1


def test_progress_is_perfdata() -> None:
    sim = Sim()
    sim.members("sl1", admin=False)
    body = {"contract": C, "epochs_done": 2, "total_epochs": 5, "loss": 0.25, "metric": 0.9}
    sim.ok("contract.progress", "sl1", body)
    rows = views.perfdata(sim.state, C)
    assert rows == [
        {
            "uid": "sl1",
            "admin": False,
            "status": "active",
            "loss": 0.25,
            "metric": 0.9,
            "total_epochs": 5,
            "completed_epochs": 2,
            "joined_at": sim.time,
            "updated_at": sim.time,
            "excluded": 0,
            "excluded_reason": None,
        }
    ]
    assert "not a member" in sim.no("contract.progress", "sl9", body)


def test_progress_carries_epsilon_under_differential_privacy() -> None:
    sim = Sim()
    sim.members("sl1", admin=False)
    body = {"contract": C, "epochs_done": 1, "total_epochs": 5, "loss": 0.5, "metric": None}
    sim.ok("contract.progress", "sl1", {**body, "epsilon": 1.25})
    assert views.perfdata(sim.state, C)[0]["epsilon"] == 1.25
    sim.ok("contract.progress", "sl1", body)  # a report without epsilon keeps the last one
    assert views.perfdata(sim.state, C)[0]["epsilon"] == 1.25
    assert "epsilon" in sim.no("contract.progress", "sl1", {**body, "epsilon": -1.0})


def test_every_member_of_a_contract_sets_the_same_secure_aggregation() -> None:
    sim = Sim()
    sim.members("sl1", "sl2", secure_aggregation=True)
    sim.register("sl3")
    body = {"contract": C, "params": {"min_peers": 2, "quorum_wait": 10.0, "leader_timeout": 60.0}}
    reason = sim.no("contract.join", "sl3", body)
    assert "trains with secure aggregation; 'sl3' asked to train without" in reason
    assert sim.state.contracts[C].members["sl1"].params.secure_aggregation is True


def test_reset_refused_while_an_active_member_is_online() -> None:
    sim = Sim()
    sim.members("sl1", "sl2")
    reason = sim.no("contract.reset", "swci", {"name": C})
    assert "2 active member(s) online (sl1, sl2)" in reason
    sim.ok("contract.done", "sl1", {"contract": C, "mode": "snapshot"})
    sim.offline("sl2")
    sim.ok("contract.reset", "swci", {"name": C})
    contract = sim.state.contracts[C]
    assert contract.status == "UNINITIALIZED"
    assert not contract.members
    assert contract.latest_model is None
    assert sim.state.rounds[C].open is None


def test_reset_of_a_fresh_contract_is_accepted_and_changes_nothing() -> None:
    sim = Sim()
    before = sim.state
    sim.ok("contract.reset", "swci", {"name": C})
    assert sim.state is before


# --- rounds ----------------------------------------------------------------------------------


def test_round_quorum_then_close_after_quorum_wait() -> None:
    sim = Sim()
    sim.members("sl1", "sl2", "sl3", min_peers=2, quorum_wait=10.0)
    sim.checkin("sl1")
    assert sim.open().quorum_at is None
    assert due_actions(sim.state, sim.time + 1000) == []
    assert "1 of 2 required peers" in sim.no("round.close", "sn", {"contract": C, "round": 1})
    sim.tick()
    sim.checkin("sl2")
    quorum_at = sim.time
    assert sim.open().quorum_at == quorum_at
    assert next_deadline(sim.state) == quorum_at + 10.0
    assert due_actions(sim.state, sim.time) == []
    assert "waits 10.0s more" in sim.no("round.close", "sn", {"contract": C, "round": 1})
    sim.tick(10)
    assert sim.run_due() == [("round.close", {"contract": C, "round": 1})]
    closed = sim.pending(1)
    assert closed.status == "CLOSED"
    assert closed.participants == ("sl1", "sl2")
    assert closed.leader == _order(1, ["sl1", "sl2"])[0]
    assert closed.leader_deadline == sim.time + 60.0
    assert sim.open().number == 2
    assert not sim.open().checkins


def test_round_closes_at_once_when_every_expected_member_is_in() -> None:
    sim = Sim()
    sim.members("sl1", "sl2", min_peers=2, quorum_wait=30.0)
    sim.checkin("sl1")
    sim.checkin("sl2")
    assert next_deadline(sim.state) is not None
    assert next_deadline(sim.state) <= sim.time  # type: ignore[operator]
    assert sim.run_due() == [("round.close", {"contract": C, "round": 1})]


def test_all_expected_in_but_below_min_peers_does_not_close() -> None:
    sim = Sim()
    sim.members("sl1", min_peers=2)
    sim.checkin("sl1")
    assert due_actions(sim.state, sim.time + 1e6) == []


def test_round_uses_the_largest_min_peers_of_its_expected_members() -> None:
    sim = Sim()
    sim.members("sl1", "sl2", min_peers=2)
    sim.members("sl3", min_peers=3)
    sim.checkin("sl1")
    sim.checkin("sl2")
    assert sim.open().quorum_at is None
    sim.checkin("sl3")
    assert sim.run_due()


def test_checkin_twice_is_rejected_and_receipt_names_the_round() -> None:
    sim = Sim()
    sim.members("sl1", "sl2")
    sim.checkin("sl1")
    body = {"contract": C, "digest": "aa"}
    assert "already checked in to round 1" in sim.no("round.checkin", "sl1", body)
    tx = sim.tx("round.checkin", "sl2", body)
    after = apply(sim.state, tx)
    assert isinstance(after, State)
    assert receipt(after, tx) == {"contract": C, "round": 1}


def test_checkin_needs_membership() -> None:
    sim = Sim()
    sim.members("sl1")
    sim.register("sl2")
    assert "not a member" in sim.no("round.checkin", "sl2", {"contract": C, "digest": "aa"})


def test_leader_is_chosen_among_admins_only() -> None:
    sim = Sim()
    sim.members("sl1", "sl2", "sl3", min_peers=3)
    sim.members("sl4", min_peers=3, admin=False)
    for uid in ("sl1", "sl2", "sl3", "sl4"):
        sim.checkin(uid)
    sim.run_due()
    closed = sim.pending(1)
    assert closed.candidates == tuple(_order(1, ["sl1", "sl2", "sl3"]))
    assert "sl4" in closed.participants


def test_leader_from_all_participants_when_none_is_admin() -> None:
    sim = Sim()
    sim.members("sl1", "sl2", admin=False)
    sim.checkin("sl1")
    sim.checkin("sl2")
    sim.run_due()
    assert set(sim.pending(1).candidates) == {"sl1", "sl2"}


def test_merge_by_leader_only_then_latest_model() -> None:
    sim = Sim()
    sim.members("sl1", "sl2")
    sim.checkin("sl1")
    sim.checkin("sl2")
    sim.run_due()
    leader = sim.pending(1).leader
    other = "sl2" if leader == "sl1" else "sl1"
    body = {"contract": C, "round": 1, "digest": "ab12", "contributors": ["sl1", "sl2"]}
    assert "only the leader of round 1" in sim.no("round.merged", other, body)
    bad = {**body, "contributors": ["sl1", "sl7"]}
    assert "sl7 did not take part" in sim.no("round.merged", str(leader), bad)
    sim.ok("round.merged", str(leader), body)
    done = sim.state.rounds[C].done[-1]
    assert done.status == "MERGED"
    assert done.digest == "ab12"
    latest = sim.state.contracts[C].latest_model
    assert latest is not None
    assert (latest.round, latest.digest, latest.leader) == (1, "ab12", leader)
    assert "already MERGED" in sim.no("round.merged", str(leader), body)


def test_leader_timeout_replaces_the_leader_then_abandons() -> None:
    sim = Sim()
    sim.members("sl1", "sl2", leader_timeout=60.0)
    sim.checkin("sl1")
    sim.checkin("sl2")
    sim.run_due()
    first, second = _order(1, ["sl1", "sl2"])
    timeout = {"contract": C, "round": 1}
    assert "before its deadline" in sim.no("round.leader_timeout", "sn", timeout)
    assert next_deadline(sim.state) == sim.time + 60.0
    sim.tick(60)
    assert sim.run_due() == [("round.leader_timeout", timeout)]
    rnd = sim.pending(1)
    assert rnd.leader == second
    assert rnd.failed == (first,)
    assert rnd.leader_deadline == sim.time + 60.0
    body = {"contract": C, "round": 1, "digest": "ab", "contributors": [first]}
    assert "(it was replaced)" in sim.no("round.merged", first, body)
    sim.tick(60)
    sim.run_due()
    abandoned = sim.state.rounds[C].done[-1]
    assert abandoned.status == "ABANDONED"
    assert "no other eligible leader" in abandoned.reason
    assert not sim.state.rounds[C].pending


def test_offline_leader_is_replaced_at_once() -> None:
    sim = Sim()
    sim.members("sl1", "sl2", "sl3", min_peers=3)
    for uid in ("sl1", "sl2", "sl3"):
        sim.checkin(uid)
    sim.run_due()
    order = _order(1, ["sl1", "sl2", "sl3"])
    sim.tick(5)
    sim.offline(order[0])
    rnd = sim.pending(1)
    assert rnd.leader == order[1]
    assert rnd.leader_deadline == sim.time + 60.0
    assert sim.state.contracts[C].members[order[0]].status == "left"


def test_offline_participant_leaves_the_open_round() -> None:
    sim = Sim()
    sim.members("sl1", "sl2", "sl3", min_peers=2)
    sim.checkin("sl1")
    sim.checkin("sl2")
    assert sim.open().quorum_at is not None
    sim.offline("sl2")
    assert set(sim.open().checkins) == {"sl1"}
    assert sim.open().quorum_at is None
    assert sim.state.contracts[C].members["sl2"].status == "left"
    assert "left it" in sim.no("round.checkin", "sl2", {"contract": C, "digest": "aa"})


def test_rejoin_after_offline() -> None:
    sim = Sim()
    sim.members("sl1", "sl2")
    sim.offline("sl2")
    sim.register("sl2")
    sim.join("sl2")
    assert sim.state.contracts[C].members["sl2"].status == "active"


def test_init_round() -> None:
    sim = Sim()
    sim.members("sl1", "sl2")
    sim.checkin("sl1", init=True)
    sim.checkin("sl2", init=True)
    sim.run_due()
    rnd = sim.pending(1)
    assert rnd.init
    sim.merge(1, digest=_digest(str(rnd.leader)))
    assert sim.state.rounds[C].done[-1].init


def test_mixed_round_is_not_an_init_round() -> None:
    sim = Sim()
    sim.members("sl1", "sl2")
    sim.checkin("sl1", init=True)
    sim.checkin("sl2")
    sim.run_due()
    assert not sim.pending(1).init


def test_final_round_closes_with_all_expected_and_completes_the_contract() -> None:
    sim = Sim()
    sim.members("sl1", "sl2", "sl3", min_peers=3)
    sim.ok("contract.done", "sl1", {"contract": C, "mode": "snapshot"})
    sim.offline("sl3")
    assert not sim.open().final
    sim.ok("contract.done", "sl2", {"contract": C})
    assert sim.open().final
    sim.checkin("sl1")
    assert due_actions(sim.state, sim.time + 1e6) == []
    sim.checkin("sl2")  # 2 < min_peers 3, but every expected member is in
    sim.run_due()
    sim.merge(1, digest="f1a1")
    contract = sim.state.contracts[C]
    assert contract.status == "COMPLETE"
    assert contract.final_digest == "f1a1"
    assert sim.state.rounds[C].open is None
    assert "COMPLETE; RESET CONTRACT" in sim.no("round.checkin", "sl1", {"contract": C, "digest": "aa"})
    assert "RESET CONTRACT" in sim.no("contract.join", "sl1", {"contract": C})
    sim.offline("sl1")  # nodes end after the training: their PERFDATA still says finished
    assert sim.state.contracts[C].members["sl1"].status == "finished"
    sim.ok("contract.reset", "swci", {"name": C})
    assert sim.state.contracts[C].status == "UNINITIALIZED"


def test_last_active_member_going_offline_makes_the_round_final() -> None:
    sim = Sim()
    sim.members("sl1", "sl2")
    sim.ok("contract.done", "sl1", {"contract": C})
    sim.offline("sl2")
    assert sim.open().final


def test_a_silent_member_is_skipped_once_the_others_finished_and_its_timeout_passed() -> None:
    sim = Sim()
    sim.members("sl1", "sl2", "sl3", straggler_timeout=20.0)
    assert next_deadline(sim.state) is None
    sim.tick(5)
    sim.ok("contract.done", "sl1", {"contract": C})
    sim.ok("contract.done", "sl2", {"contract": C})
    assert not sim.open().final  # sl3 (a hung ML program) is still active
    assert next_deadline(sim.state) == sim.time + 20
    sim.tick(19)
    body = {"contract": C, "uid": "sl3"}
    assert "has until" in sim.no("round.skip_straggler", "sn", body)
    assert "is not the straggler" in sim.no("round.skip_straggler", "sn", {**body, "uid": "sl1"})
    sim.tick(1)
    assert sim.run_due() == [("round.skip_straggler", body)]
    member = sim.state.contracts[C].members["sl3"]
    assert member.status == "left" and "after the others finished" in member.left_reason
    assert sim.open().final
    assert "left it" in sim.no("round.checkin", "sl3", {"contract": C, "digest": "aa"})
    sim.checkin("sl1")
    sim.checkin("sl2")
    sim.run_due()
    sim.merge(1)
    assert sim.state.contracts[C].status == "COMPLETE"
    late = sim.no("round.checkin", "sl3", {"contract": C, "digest": "aa"})  # its ML program resumed
    assert "left contract" in late and "after the others finished" in late, late


def test_a_member_that_checked_in_is_not_a_straggler() -> None:
    sim = Sim()
    sim.members("sl1", "sl2", straggler_timeout=20.0)
    sim.ok("contract.done", "sl1", {"contract": C})
    sim.checkin("sl2")
    assert all(kind != "round.skip_straggler" for kind, _ in due_actions(sim.state, sim.time + 1e6))


def test_a_new_join_undoes_final() -> None:
    sim = Sim()
    sim.members("sl1")
    sim.ok("contract.done", "sl1", {"contract": C})
    assert sim.open().final
    sim.members("sl2")
    assert not sim.open().final


def test_only_the_last_finished_rounds_are_kept() -> None:
    sim = Sim()
    sim.members("sl1", "sl2")
    for number in range(1, KEEP_FINISHED + 4):
        sim.checkin("sl1")
        sim.checkin("sl2")
        sim.run_due()
        sim.merge(number, digest=f"{number:04x}")
        sim.tick()
    done = sim.state.rounds[C].done
    assert len(done) == KEEP_FINISHED
    assert [r.number for r in done] == list(range(4, KEEP_FINISHED + 4))
    latest = sim.state.contracts[C].latest_model
    assert latest is not None
    assert latest.round == KEEP_FINISHED + 3


def test_changed_entities_of_a_checkin_is_only_the_round() -> None:
    sim = Sim()
    sim.members("sl1", "sl2", "sl3", min_peers=3)
    before = sim.state
    sim.checkin("sl1")
    assert changed_entities(before, sim.state) == [("round", C)]
    before = sim.state
    sim.ok("task.create", "swci", {"name": "t", "type": "RUN_SWARM", "author": "me"})
    sim.register("swop1")
    assert changed_entities(before, sim.state) == [("node", "swop1"), ("task", "t")]
    before = sim.state
    sim.ok("task.delete", "swci", {"name": "t"})
    assert changed_entities(before, sim.state) == [("task", "t")]


# --- tasks -----------------------------------------------------------------------------------

SWARM_BODY = [
    "Command: model/mnist.py",
    "Entrypoint: python3",
    "WorkingDir: /tmp/test",
    "Envvars: null",
    "PrivateContent: /tmp/test/",
    "SharedContent: null",
]


def _task(sim: Sim, name: str = "mnist", task_type: str = "RUN_SWARM", *, final: bool = True) -> None:
    body = {"name": name, "type": task_type, "author": "me", "prereq": "ROOTTASK", "outcome": name}
    sim.ok("task.create", "swci", {**body, "body": SWARM_BODY})
    if final:
        sim.ok("task.finalize", "swci", {"name": name})


def test_task_lifecycle() -> None:
    sim = Sim()
    sim.ok("task.create", "swci", {"name": "t1", "type": "run_swarm", "author": "me"})
    assert sim.state.tasks["t1"].type == "RUN_SWARM"
    sim.ok("task.append", "swci", {"name": "t1", "idx": 2, "line": "b"})
    sim.ok("task.append", "swci", {"name": "t1", "idx": 1, "line": "a"})
    sim.ok("task.append", "swci", {"name": "t1", "idx": 2, "line": "B"})
    assert views.task_body(sim.state, "t1")["lines"] == ["a", "B"]
    assert "already exists" in sim.no(
        "task.create", "swci", {"name": "t1", "type": "PULL_IMAGE", "author": "x"}
    )
    sim.ok("task.finalize", "swci", {"name": "t1"})
    assert "can no longer change" in sim.no("task.append", "swci", {"name": "t1", "idx": 3, "line": "c"})
    assert "already finalized" in sim.no("task.finalize", "swci", {"name": "t1"})
    assert "cannot be deleted" in sim.no("task.delete", "swci", {"name": "t1"})
    sim.ok("task.create", "swci", {"name": "t2", "type": "PULL_IMAGE", "author": "me"})
    sim.ok("task.delete", "swci", {"name": "t2"})
    assert "t2" not in sim.state.tasks
    assert "no task 't2'" in sim.no("task.delete", "swci", {"name": "t2"})


def test_root_type_is_reserved() -> None:
    sim = Sim()
    assert "only 'ROOTTASK'" in sim.no("task.create", "swci", {"name": "r", "type": "ROOT", "author": "x"})
    assert "already exists" in sim.no(
        "task.create", "swci", {"name": "ROOTTASK", "type": "ROOT", "author": "x"}
    )


def test_finalize_without_body_is_rejected() -> None:
    sim = Sim()
    sim.ok("task.create", "swci", {"name": "t", "type": "RUN_SWARM", "author": "me"})
    assert "has no body" in sim.no("task.finalize", "swci", {"name": "t"})


def test_finalize_validates_the_body_with_taskdefs() -> None:
    taskdefs = pytest.importorskip("taskdefs")
    assert hasattr(taskdefs, "validate_task_body")
    sim = Sim(validator=taskdefs.validate_task_body)
    _task(sim, "good")
    assert sim.state.tasks["good"].finalized
    sim.ok(
        "task.create", "swci", {"name": "bad", "type": "RUN_SWARM", "author": "me", "body": ["Command: 3"]}
    )
    reason = sim.no("task.finalize", "swci", {"name": "bad"})
    assert reason.startswith("task 'bad' is not valid: ")
    assert not sim.state.tasks["bad"].finalized


def test_a_crashing_validator_rejects_instead_of_raising() -> None:
    def boom(task_type: str, lines: list[str]) -> object:
        raise RuntimeError("validator bug")

    sim = Sim(validator=boom)
    _task(sim, final=False)
    assert "could not be validated (RuntimeError: validator bug)" in sim.no(
        "task.finalize", "swci", {"name": "mnist"}
    )


# --- taskrunners -----------------------------------------------------------------------------


def _swops(sim: Sim, capacities: dict[str, int]) -> None:
    for uid, capacity in capacities.items():
        sim.register(uid)
        sim.ok("taskrunner.enroll", uid, {"taskrunner": TR, "capacity": capacity, "group": "demo"})


def _assign(sim: Sim, task: str = "mnist", peers: Any = None, target: str | None = None) -> State:
    return sim.ok(
        "taskrunner.assign", "swci", {"task": task, "taskrunner": TR, "peers": peers, "target": target}
    )


def _status(sim: Sim, swop: str, peer: str, status: str, **extra: Any) -> None:
    peer_type = "SWOP" if peer == swop else "SL"
    body = {"taskrunner": TR, "peer": peer, "peer_type": peer_type, "status": status, **extra}
    sim.ok("taskrunner.status", swop, body)


def test_enroll_needs_a_registered_swop() -> None:
    sim = Sim()
    assert "node.register first" in sim.no("taskrunner.enroll", "swop1", {"taskrunner": TR, "capacity": 2})
    _swops(sim, {"swop1": 2})
    assert views.taskrunner_peers(sim.state, TR)[0]["capacity"] == 2


def test_assign_needs_a_finalized_task() -> None:
    sim = Sim()
    _swops(sim, {"swop1": 2})
    _task(sim, final=False)
    body = {"task": "mnist", "taskrunner": TR, "peers": 1}
    assert sim.no("taskrunner.assign", "swci", body) == (
        "task 'mnist' is not finalized; run FINALIZE TASK mnist first"
    )


def test_allocation_with_n_peers_round_robin() -> None:
    sim = Sim()
    _swops(sim, {"swop2": 2, "swop1": 2, "swop3": 1})
    _task(sim)
    _assign(sim, peers=4)
    runner = sim.state.taskrunners[TR]
    assert runner.state == "RUNNING"
    assert runner.assignment is not None
    assert dict(runner.assignment.allocation) == {"swop1": 2, "swop2": 1, "swop3": 1}
    assert runner.assignment.required == 4


def test_allocation_short_of_capacity_names_the_numbers() -> None:
    sim = Sim()
    _swops(sim, {"swop1": 2, "swop2": 1})
    _task(sim)
    reason = sim.no("taskrunner.assign", "swci", {"task": "mnist", "taskrunner": TR, "peers": 4})
    assert "WITH 4 PEERS needs 4 SL slots but the 2 online SWOP(s)" in reason
    assert "offer 3 (swop1: 2, swop2: 1)" in reason


def test_allocation_skips_offline_swops() -> None:
    sim = Sim()
    _swops(sim, {"swop1": 2, "swop2": 2})
    sim.offline("swop1")
    _task(sim)
    _assign(sim, peers=2)
    assignment = sim.state.taskrunners[TR].assignment
    assert assignment is not None
    assert dict(assignment.allocation) == {"swop2": 2}


def test_allocation_all_peers() -> None:
    sim = Sim()
    _swops(sim, {"swop1": 2, "swop2": 3})
    _task(sim)
    _assign(sim, peers="all")
    assignment = sim.state.taskrunners[TR].assignment
    assert assignment is not None
    assert dict(assignment.allocation) == {"swop1": 2, "swop2": 3}
    assert assignment.required == 5


def test_allocation_of_other_task_types_is_per_swop() -> None:
    sim = Sim()
    _swops(sim, {"swop1": 4, "swop2": 4, "swop3": 0})
    _task(sim, "env", "MAKE_USER_ENV")
    reason = sim.no("taskrunner.assign", "swci", {"task": "env", "taskrunner": TR, "peers": 4})
    assert "needs 4 SWOPs but only 3 online SWOP(s)" in reason
    _assign(sim, "env", peers=2)
    assignment = sim.state.taskrunners[TR].assignment
    assert assignment is not None
    assert dict(assignment.allocation) == {"swop1": 1, "swop2": 1}


def test_allocation_with_target() -> None:
    sim = Sim()
    _swops(sim, {"swop1": 2, "swop2": 3})
    _task(sim)
    assert "not an online SWOP enrolled" in sim.no(
        "taskrunner.assign", "swci", {"task": "mnist", "taskrunner": TR, "target": "swop9"}
    )
    _assign(sim, target="swop2")
    assignment = sim.state.taskrunners[TR].assignment
    assert assignment is not None
    assert dict(assignment.allocation) == {"swop2": 3}
    assert assignment.required == 3


def test_task_completes_when_required_units_complete() -> None:
    sim = Sim()
    _swops(sim, {"swop1": 2, "swop2": 1})
    _task(sim)
    _assign(sim, peers=3)
    _status(sim, "swop1", "sl1", "STARTING")
    _status(sim, "swop1", "sl1", "RUNNING")
    _status(sim, "swop1", "sl2", "RUNNING")
    _status(sim, "swop2", "sl3", "RUNNING")
    status = views.taskrunner_status(sim.state, TR)
    assert (status["state"], status["active"], status["completed"]) == ("RUNNING", 3, 0)
    reason = sim.no("taskrunner.reset", "swci", {"taskrunner": TR})
    assert reason == (
        f"taskrunner '{TR}' is RUNNING task 'mnist' (3/3 peers active); "
        "wait for it to finish before RESET TASKRUNNER"
    )
    for swop, peer in (("swop1", "sl1"), ("swop1", "sl2"), ("swop2", "sl3")):
        _status(sim, swop, peer, "COMPLETED", exit_code=0)
    assert sim.state.taskrunners[TR].state == "COMPLETE"
    peer_status = views.taskrunner_peer_status(sim.state, TR, 0)
    assert peer_status["swop"] == "swop1"
    assert [p["uid"] for p in peer_status["peers"]] == ["sl1", "sl2"]
    assert views.taskrunner_peer_status(sim.state, TR, "swop2")["sl_peers"] == 1
    sim.ok("taskrunner.reset", "swci", {"taskrunner": TR})
    assert sim.state.taskrunners[TR].state == "IDLE"


def test_task_errors_when_too_few_peers_can_still_complete() -> None:
    sim = Sim()
    _swops(sim, {"swop1": 2, "swop2": 2})
    _task(sim)
    _assign(sim, peers=3)  # swop1: 2, swop2: 1 -> no spare
    _status(sim, "swop1", "sl1", "RUNNING")
    _status(sim, "swop1", "sl2", "FAILED", exit_code=3, description="ModuleNotFoundError: torch")
    runner = sim.state.taskrunners[TR]
    assert runner.state == "ERROR"
    assert "SL peer 'sl2' FAILED (exit code 3): ModuleNotFoundError: torch" in runner.error
    assert "0 completed + 2 still running < 3 required" in runner.error
    assert views.taskrunner_status(sim.state, TR)["error"] == runner.error


def test_error_is_final_until_reset() -> None:
    sim = Sim()
    _swops(sim, {"swop1": 2, "swop2": 2})
    _task(sim)
    _assign(sim, peers="ALL")
    _status(sim, "swop2", "sl4", "FAILED", exit_code=1)
    assert sim.state.taskrunners[TR].state == "ERROR"
    _status(sim, "swop1", "sl1", "COMPLETED", exit_code=0)  # recorded, the state stays
    assert sim.state.taskrunners[TR].state == "ERROR"
    body = {"task": "mnist", "taskrunner": TR, "peers": 1}
    assert "is ERROR (task 'mnist'); RESET TASKRUNNER" in sim.no("taskrunner.assign", "swci", body)
    sim.ok("taskrunner.reset", "swci", {"taskrunner": TR})
    _assign(sim, peers=1)


def test_join_and_retry_a_running_taskrunner_with_target() -> None:
    sim = Sim()
    _swops(sim, {"swop1": 2})
    _task(sim)
    _task(sim, "other")
    _assign(sim, peers=2)
    _status(sim, "swop1", "sl1", "RUNNING")
    _swops(sim, {"swop2": 1})
    body = {"task": "other", "taskrunner": TR, "target": "swop2"}
    assert "TARGET can only add a SWOP to that task" in sim.no("taskrunner.assign", "swci", body)
    again = {"task": "mnist", "taskrunner": TR, "peers": 1}
    assert "wait for it to finish before ASSIGN TASK" in sim.no("taskrunner.assign", "swci", again)
    _assign(sim, target="swop2")  # join: one spare unit
    assignment = sim.state.taskrunners[TR].assignment
    assert assignment is not None
    assert dict(assignment.allocation) == {"swop1": 2, "swop2": 1}
    assert assignment.required == 2
    _status(sim, "swop1", "sl1", "FAILED", exit_code=1)
    assert sim.state.taskrunners[TR].state == "RUNNING"  # 0 completed + 2 may still complete
    _assign(sim, target="swop1")  # retry on swop1: its FAILED peer is cleared
    assignment = sim.state.taskrunners[TR].assignment
    assert assignment is not None
    assert "sl1" not in assignment.statuses["swop1"]
    assert assignment.generation == 3
    _status(sim, "swop1", "sl1", "COMPLETED", exit_code=0)
    _status(sim, "swop2", "sl9", "COMPLETED", exit_code=0)
    assert sim.state.taskrunners[TR].state == "COMPLETE"


def test_non_swarm_task_units_are_swop_statuses() -> None:
    sim = Sim()
    _swops(sim, {"swop1": 1, "swop2": 1})
    _task(sim, "env", "MAKE_USER_ENV")
    _assign(sim, "env", peers=2)
    _status(sim, "swop1", "swop1", "COMPLETED", exit_code=0)
    assert sim.state.taskrunners[TR].state == "RUNNING"
    assert views.taskrunner_status(sim.state, TR)["peer_type"] == "SWOP"
    _status(sim, "swop2", "swop2", "COMPLETED", exit_code=0)
    assert sim.state.taskrunners[TR].state == "COMPLETE"


def test_status_from_a_swop_outside_the_assignment_is_rejected() -> None:
    sim = Sim()
    _swops(sim, {"swop1": 1, "swop2": 1})
    _task(sim)
    body = {"taskrunner": TR, "peer": "sl1", "peer_type": "SL", "status": "RUNNING"}
    assert "has no task assigned" in sim.no("taskrunner.status", "swop1", body)
    _assign(sim, target="swop1")
    assert "has no part in task 'mnist'" in sim.no("taskrunner.status", "swop2", body)
    own = {**body, "peer_type": "SWOP"}
    assert "must name the SWOP itself" in sim.no("taskrunner.status", "swop1", own)


def test_every_swop_offline_past_its_grace_is_an_error() -> None:
    sim = Sim()
    _swops(sim, {"swop1": 1, "swop2": 1})
    sim.ok("taskrunner.enroll", "swop2", {"taskrunner": TR, "capacity": 1, "group": "demo", "grace": 30})
    _task(sim)
    _assign(sim, peers=2)
    sim.offline("swop1")
    assert sim.state.taskrunners[TR].state == "RUNNING"
    assert due_actions(sim.state, sim.time + 10_000) == []
    sim.offline("swop2")
    assert sim.state.taskrunners[TR].state == "RUNNING"  # a partition is not a failure yet
    deadline = next_deadline(sim.state)
    assert deadline == sim.time + 120  # the longest grace of the assignment's SWOPs
    assert due_actions(sim.state, deadline) == [("taskrunner.orphaned", {"taskrunner": TR})]
    sim.tick(119)
    assert "have until" in sim.no("taskrunner.orphaned", "sn", {"taskrunner": TR})
    sim.tick(1)
    sim.ok("taskrunner.orphaned", "sn", {"taskrunner": TR})
    runner = sim.state.taskrunners[TR]
    assert runner.state == "ERROR"
    assert (
        runner.error
        == "every SWOP of the assignment went offline (swop1, swop2) and stayed offline for 120 s"
    )


def test_sls_of_a_dead_swop_report_their_own_end_and_complete_the_task() -> None:
    sim = Sim()
    _swops(sim, {"swop1": 2})
    sim.register("sl1", "sl2", parent="swop1")
    sim.register("sl9")
    _task(sim)
    _assign(sim, peers=2)
    _status(sim, "swop1", "sl1", "RUNNING")
    _status(sim, "swop1", "sl2", "RUNNING")
    sim.offline("swop1")  # SIGKILL: its SLs live on, so the task is not orphaned
    assert sim.state.taskrunners[TR].assignment.orphaned_at is None
    body = {"taskrunner": TR, "peer": "sl2", "peer_type": "SL", "status": "COMPLETED", "exit_code": 0}
    assert "only its own status" in sim.no("taskrunner.status", "sl1", body)
    assert "has no parent" in sim.no("taskrunner.status", "sl9", {**body, "peer": "sl9"})
    sim.ok("taskrunner.status", "sl1", {**body, "peer": "sl1"})
    sim.offline("sl1")
    assert sim.state.taskrunners[TR].state == "RUNNING"
    assert sim.state.taskrunners[TR].assignment.orphaned_at is None  # sl2 still trains
    sim.ok("taskrunner.status", "sl2", body)
    assert sim.state.taskrunners[TR].state == "COMPLETE"


def test_a_dead_swop_whose_sls_are_gone_too_is_orphaned() -> None:
    sim = Sim()
    _swops(sim, {"swop1": 1})
    sim.register("sl1", parent="swop1")
    _task(sim)
    _assign(sim, peers=1)
    _status(sim, "swop1", "sl1", "RUNNING")
    sim.offline("swop1")
    assert sim.state.taskrunners[TR].assignment.orphaned_at is None
    sim.tick(5)
    sim.offline("sl1")  # it died without a word
    assert sim.state.taskrunners[TR].assignment.orphaned_at == sim.time


def test_a_swop_back_within_its_grace_keeps_the_task_running() -> None:
    sim = Sim()
    _swops(sim, {"swop1": 1})
    _task(sim)
    _assign(sim, peers=1)
    sim.offline("swop1")
    assert sim.state.taskrunners[TR].assignment.orphaned_at == sim.time
    sim.tick(60)
    sim.register("swop1")
    assert sim.state.taskrunners[TR].assignment.orphaned_at is None
    assert next_deadline(sim.state) is None
    sim.tick(100)
    assert "has a SWOP online" in sim.no("taskrunner.orphaned", "sn", {"taskrunner": TR})
    assert sim.state.taskrunners[TR].state == "RUNNING"
