"""The event form of a contract's rounds (``views.rounds_brief``) carries what a closed round's leader
merges, so that the leader needs no read; a round of many check-ins leaves them out, and its leader reads.
The same list, of the open round too, is the receipt of a check-in the SN was asked not to answer or a
peer relayed (``_round_listing``)."""

from __future__ import annotations

from contracts import views
from daemons.sl.rounds import _leading_view, _round_listing
from tests.test_ledger_machine import C, Sim, _digest


def _closed(uids: list[str]) -> Sim:
    """Members ``uids`` check in to round 1, which closes (round 2 opens)."""
    sim = Sim()
    sim.members(*uids, min_peers=len(uids))
    for uid in uids:
        sim.checkin(uid)
    sim.run_due()
    return sim


def test_a_closed_rounds_event_lists_its_checkins_and_the_open_rounds_min_peers() -> None:
    sim = _closed(["sl1", "sl2", "sl3"])
    brief, full = views.rounds_brief(sim.state, C), views.rounds(sim.state, C)
    (closed,) = brief["closed"]
    assert closed["status"] == "CLOSED"
    assert closed["checkins"] == full["closed"][0]["checkins"]
    assert [c["uid"] for c in closed["checkins"]] == ["sl1", "sl2", "sl3"]
    assert brief["open"]["min_peers"] == full["open"]["min_peers"] == 3
    assert brief["open"]["checkins"] == []  # none yet
    assert _leading_view(brief, 1) == (brief, closed)
    assert _leading_view(full, 1) == (full, full["closed"][0])


def test_a_round_of_more_checkins_than_the_brief_lists_is_read_by_its_leader() -> None:
    uids = [f"sl{i}" for i in range(1, views.BRIEF_CHECKINS + 2)]
    sim = _closed(uids)
    brief = views.rounds_brief(sim.state, C)
    (closed,) = brief["closed"]
    assert closed["checked_in"] == len(uids) and "checkins" not in closed
    assert _leading_view(brief, 1) is None
    assert _leading_view(views.rounds(sim.state, C), 1) is not None


def test_only_a_closed_round_is_led_from_a_view() -> None:
    sim = _closed(["sl1", "sl2"])
    brief = views.rounds_brief(sim.state, C)
    assert _leading_view(brief, 2) is None  # open
    assert _leading_view(brief, 7) is None  # not in the view
    no_rule = {**brief, "open": {k: v for k, v in brief["open"].items() if k != "min_peers"}}
    assert _leading_view(no_rule, 1) is None  # an SN of before: read


def test_a_check_in_is_found_in_the_event_of_the_block_that_took_it_and_of_its_rounds_close() -> None:
    sim = Sim()
    sim.members("sl1", "sl2", min_peers=2)
    sim.checkin("sl1")
    brief = views.rounds_brief(sim.state, C)
    assert _round_listing(brief, "sl1", _digest("sl1"), 1) == 1  # open, not closed: listed already
    assert _round_listing(brief, "sl2", _digest("sl2"), 1) is None  # not checked in yet
    sim.checkin("sl2")
    sim.run_due()
    brief = views.rounds_brief(sim.state, C)
    assert _round_listing(brief, "sl1", _digest("sl1"), 1) == 1
    assert _round_listing(brief, "sl2", _digest("sl2"), 1) == 1
    assert _round_listing(brief, "sl1", _digest("sl2"), 1) is None  # another model
    assert _round_listing(brief, "sl3", _digest("sl1"), 1) is None  # another node
    assert _round_listing(brief, "sl1", _digest("sl1"), 2) is None  # an earlier round's check-in


def test_every_round_that_finished_in_the_newest_block_is_in_its_event() -> None:
    # with its participants' check-ins relayed, a round can close before the last one's merge is
    # submitted: the SN then seals both merges with the next close, and each follower must see its own
    sim = _closed(["sl1", "sl2"])
    sim.merge(1, "e1")
    assert [r["round"] for r in views.rounds_brief(sim.state, C)["finished"]] == [1]
    sim.tick()
    for uid in ("sl1", "sl2"):  # round 2 closes ...
        sim.checkin(uid, _digest(uid + "-2"))
    sim.run_due()
    for uid in ("sl1", "sl2"):  # ... and round 3, before round 2's merge comes
        sim.checkin(uid, _digest(uid + "-3"))
    sim.run_due()
    sim.tick()
    sim.merge(2, "e2")  # one block, one time: round 3's merge sealed with round 2's
    sim.merge(3, "e3")
    finished = views.rounds_brief(sim.state, C)["finished"]
    assert [(r["round"], r["digest"]) for r in finished] == [(2, "e2"), (3, "e3")]  # not round 1's
