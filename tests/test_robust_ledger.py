"""The ledger's side of robust merging: the merge policy pinned per contract, excluded rows, failed rounds."""

from __future__ import annotations

from contracts import views
from contracts.machine import next_deadline
from tests.test_ledger_machine import C, Sim, _order


def _closed_round(sim: Sim, *uids: str) -> tuple[str, list[str]]:
    """Members ``uids`` check in to round 1, which closes; its leader and the others."""
    sim.members(*uids, min_peers=len(uids))
    for uid in uids:
        sim.checkin(uid)
    sim.run_due()
    leader = _order(1, list(uids))[0]
    return leader, [u for u in uids if u != leader]


def test_the_first_join_pins_the_merge_method_and_others_are_refused() -> None:
    sim = Sim()
    sim.register("sl1", "sl2", "sl3")
    sim.join("sl1", merge_method="coordmedian", max_update_norm=50.0)
    sim.join("sl2", merge_method="coordmedian", max_update_norm=50.0)
    body = {"contract": C, "params": {"merge_method": "mean", "max_update_norm": 50.0}}
    reason = sim.no("contract.join", "sl3", body)
    assert "merges with mergeMethod=coordmedian, max_update_norm=50 (set by sl1" in reason
    assert "'sl3' asks for mergeMethod=mean" in reason
    body = {"contract": C, "params": {"merge_method": "coordmedian"}}
    assert "asks for mergeMethod=coordmedian, no norm bound" in sim.no("contract.join", "sl3", body)
    status = views.contract_status(sim.state, C)
    assert (status["merge_method"], status["max_update_norm"]) == ("coordmedian", 50.0)


def test_trimmedmean_pins_its_trim_ratio_and_a_reset_unpins() -> None:
    sim = Sim()
    sim.register("sl1", "sl2")
    sim.join("sl1", merge_method="trimmedmean", trim_ratio=0.2)
    body = {"contract": C, "params": {"merge_method": "trimmedmean", "trim_ratio": 0.1}}
    assert "trim_ratio=0.2, no norm bound (set by sl1" in sim.no("contract.join", "sl2", body)
    assert "below 0.5" in sim.no("contract.join", "sl2", {"contract": C, "params": {"trim_ratio": 0.5}})
    unknown = {"contract": C, "params": {"merge_method": "x"}}
    assert "is not one of mean" in sim.no("contract.join", "sl2", unknown)
    sim.offline("sl1")
    sim.ok("contract.reset", "swci", {"name": C})
    sim.join("sl2", merge_method="mean")
    assert views.contract_status(sim.state, C)["merge_method"] == "mean"


def test_excluded_rows_are_recorded_on_the_round_the_member_and_the_contract() -> None:
    sim = Sim()
    leader, (a, b) = _closed_round(sim, "sl1", "sl2", "sl3")
    body = {"contract": C, "round": 1, "digest": "ab", "contributors": [leader, a]}
    stranger = {**body, "excluded": [{"uid": "sl9", "reason": "NaN"}]}
    assert "excluded node 'sl9' did not take part" in sim.no("round.merged", leader, stranger)
    both = {**body, "excluded": [{"uid": a, "reason": "NaN"}]}
    assert "both a contributor and excluded" in sim.no("round.merged", leader, both)
    assert "field 'excluded'" in sim.no("round.merged", leader, {**body, "excluded": [{"uid": b}]})
    why = "tensor '0.weight' has 128 non-finite values (NaN or inf)"
    sim.ok("round.merged", leader, {**body, "excluded": [{"uid": b, "reason": why}]})
    done = sim.state.rounds[C].done[-1]
    assert done.status == "MERGED" and done.excluded == ((b, why),)
    assert views.rounds(sim.state, C)["finished"][-1]["excluded"] == [{"uid": b, "reason": why}]
    assert views.rounds_brief(sim.state, C)["finished"][-1]["excluded"] == [{"uid": b, "reason": why}]
    status = views.contract_status(sim.state, C)
    assert status["excluded_rows"] == 1
    assert status["last_exclusion"] == f"round 1: {b}: {why}"
    rows = {row["uid"]: row for row in views.perfdata(sim.state, C)}
    assert (rows[b]["excluded"], rows[b]["excluded_reason"]) == (1, why)
    assert (rows[a]["excluded"], rows[a]["excluded_reason"]) == (0, None)


def test_a_leader_that_cannot_merge_abandons_the_round_at_once() -> None:
    sim = Sim()
    leader, (a, b) = _closed_round(sim, "sl1", "sl2", "sl3")
    excluded = [{"uid": a, "reason": "NaN"}, {"uid": b, "reason": "update norm 1e+30 > 10"}]
    body = {"contract": C, "round": 1, "reason": "1 of 3 rows usable, min_peers is 3", "excluded": excluded}
    assert "only the leader of round 1" in sim.no("round.failed", a, body)
    sim.ok("round.failed", leader, body)
    done = sim.state.rounds[C].done[-1]
    assert done.status == "ABANDONED"
    assert done.reason == f"leader {leader!r} could not merge: 1 of 3 rows usable, min_peers is 3"
    assert not sim.state.rounds[C].pending
    assert next_deadline(sim.state) is None  # no leader deadline left to wait out
    assert views.contract_status(sim.state, C)["excluded_rows"] == 2
    assert "already ABANDONED" in sim.no("round.failed", leader, body)
