"""The predicted leader relays its participants' check-ins (``RoundEngine._submit_checkin``): which it
relays, and what a participant does when the relay does not show; the round's events opened once
however many follows watch them. The SN's side, with certificates, is in ``tests/test_sn_security.py``;
a whole swarm relaying, in ``tests/test_bench_rounds.py``."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from daemons.bus.endpoint import Message, Subscription
from daemons.bus.transfer import StateHolder
from daemons.ledger_client import Event, OpenedEvents, Watch
from daemons.sl import rounds
from daemons.sl.dataplane import Offers, PushedCheckin
from daemons.sl.rounds import RoundEngine, _Part, _Prediction
from wire import Envelope, decode_envelope, encode_envelope, make_envelope
from wire.tensors import FlatState, make_manifest

MEMBERS = ("sl-1", "sl-2", "sl-3", "sl-4")


class _Ledger:
    """Records submits; answers each with a receipt of round 9."""

    def __init__(self) -> None:
        self.submits: list[dict[str, Any]] = []

    async def submit(self, kind: str, body: dict[str, Any], **options: Any) -> dict[str, Any]:
        self.submits.append({"kind": kind, "body": body, **options})
        return {"contract": "c1", "round": 9, "height": 40}


class _Watch:
    """Round events given by the test."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[Event] = asyncio.Queue()

    async def next(self, timeout: float | None = None) -> Event:
        return await self.events.get()


def _part(uid: str, leader: str, *, signed: bytes = b"signed", seed: int = 1) -> _Part:
    flat = FlatState.from_arrays({"w": np.random.default_rng(seed).standard_normal(64, dtype=np.float32)})
    manifest = make_manifest(flat, "held")
    body = {"contract": "c1", "digest": manifest.digest.hex(), "samples": 1, "weight": 1.0, "init": False}
    prediction = _Prediction(9, MEMBERS, leader)
    return _Part(flat, manifest, body, False, False, None, prediction, signed=signed)


def _engine(uid: str, ledger: _Ledger) -> RoundEngine:
    holder = StateHolder(cast(Any, SimpleNamespace(uid=uid)))
    engine = RoundEngine(cast(Any, SimpleNamespace(uid=uid)), cast(Any, ledger), holder, "c1")
    engine.offers = Offers()
    return engine


async def _done() -> str:
    return "merged"


async def _gone_early() -> asyncio.Task[str]:
    """An early path that ended with a merge."""
    task = asyncio.create_task(_done())
    await task
    return task


def _relayed(uid: str, leader: str, *, signed: bytes = b"signed", seed: int = 1) -> _Part:
    """Our check-in, pushed with our row to ``leader`` to relay."""
    part = _part(uid, leader, signed=signed, seed=seed)
    part.relayed_by = leader
    return part


def _open_round_event(checkins: list[dict[str, str]]) -> Event:
    """The event of a block that took ``checkins`` into the open round 9."""
    return Event("round", "c1", 41, {"open": {"round": 9, "status": "OPEN", "checkins": checkins}})


async def _participant(
    monkeypatch: pytest.MonkeyPatch, relay_wait: float
) -> tuple[_Ledger, RoundEngine, asyncio.Task[str]]:
    """sl-2, a participant gone on early, waiting ``relay_wait`` s for a relay; its recorded submits."""
    monkeypatch.setattr(rounds, "RELAY_WAIT", relay_wait)
    ledger = _Ledger()
    return ledger, _engine("sl-2", ledger), await _gone_early()


async def test_the_leader_relays_the_check_ins_whose_check_in_before_its_last_closed_round_lists() -> None:
    ledger = _Ledger()
    engine = _engine("sl-1", ledger)
    part = _part("sl-1", "sl-1")
    previous = _part("sl-1", "sl-1", seed=2)  # our check-in of round 8, closed with these check-ins
    previous.closed_round = {
        "round": 8,
        "status": "CLOSED",
        "checkins": [
            {"uid": uid, "digest": digest}
            for uid, digest in (("sl-1", "aa" * 32), ("sl-2", "22" * 32), ("sl-3", "33" * 32))
        ],
    }
    part.pushed.set_result(
        {
            "sl-2": PushedCheckin(b"sl-2's", bytes.fromhex("22" * 32)),  # its round-8 check-in is there
            "sl-3": PushedCheckin(b"sl-3's", bytes.fromhex("3f" * 32)),  # another one: its round may be open
            "sl-4": PushedCheckin(b"sl-4's", None),  # nothing of it followed still: any round is safe
        }
    )
    going_early = await _gone_early()
    await engine._submit_checkin(part, cast(Any, _Watch()), going_early, (previous, cast(Any, None)))
    [submit] = ledger.submits
    assert submit["signed"] == b"signed" and submit["relayed"] == [b"sl-2's", b"sl-4's"]
    assert "seen" in submit  # gone early: the round's event is the receipt, the SN answers only a failure


async def test_a_participant_takes_the_relayed_check_in_from_the_rounds_event_or_submits_it_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ledger, engine, going_early = await _participant(monkeypatch, 0.05)
    shown = _relayed("sl-2", "sl-1")
    watch = _Watch()
    checkins = [{"uid": "sl-2", "digest": shown.digest}]
    view = {"open": None, "closed": [{"round": 9, "status": "CLOSED", "checkins": checkins}]}
    watch.events.put_nowait(Event("round", "c1", 41, view))
    receipt, seen = await engine._submit_checkin(shown, cast(Any, watch), going_early, None)
    assert (receipt["round"], receipt["height"], seen) == (9, 41, view) and ledger.submits == []
    assert shown.relayed_by == "sl-1"  # the log line says who relayed it

    withheld = _relayed("sl-2", "sl-1", signed=b"withheld", seed=3)
    receipt, _ = await engine._submit_checkin(withheld, cast(Any, _Watch()), going_early, None)
    [submit] = ledger.submits  # after RELAY_WAIT, the very envelope the leader took, by ourselves
    assert submit["signed"] == b"withheld" and submit["relayed"] == [] and withheld.relayed_by is None


async def test_after_a_relay_that_did_not_show_a_participant_pushes_no_check_in_for_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a node whose check-ins the leader cannot relay (one a round behind the others) pays RELAY_WAIT
    # after 2, 4, ... rounds, not every round; a relay that shows again ends the pauses
    ledger, engine, going_early = await _participant(monkeypatch, 0.01)
    engine.relay_checkins = True
    engine.ledger = cast(Any, SimpleNamespace(sign=lambda kind, body: b"signed", submit=ledger.submit))
    prediction = _Prediction(9, MEMBERS, "sl-1")

    async def miss() -> None:
        await engine._submit_checkin(_relayed("sl-2", "sl-1"), cast(Any, _Watch()), going_early, None)

    def signs() -> list[bool]:
        return [engine._signed_checkin({}, prediction) is not None for _ in range(7)]

    await miss()
    assert signs() == [False, False, True, True, True, True, True]
    await miss()
    await miss()
    assert signs() == [False] * 7  # paused 8 rounds after the third miss in a row
    assert signs()[:2] == [False, True]
    shown = _relayed("sl-2", "sl-1")
    watch = _Watch()
    watch.events.put_nowait(_open_round_event([{"uid": "sl-2", "digest": shown.digest}]))  # seen at once
    receipt, _ = await engine._submit_checkin(shown, cast(Any, watch), going_early, None)
    assert receipt["round"] == 9 and engine._relay_misses == 0
    await miss()
    assert signs()[:3] == [False, False, True]  # counted afresh


async def test_a_participant_submits_at_once_when_the_leaders_check_in_shows_without_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the leader submitted without ours (our row came after it stopped waiting for the rows): the open
    # round's event lists the leader's check-in and not ours, so we do not wait out RELAY_WAIT
    ledger, engine, going_early = await _participant(monkeypatch, 30.0)
    part = _relayed("sl-2", "sl-1", signed=b"ours")
    watch = _Watch()
    watch.events.put_nowait(_open_round_event([{"uid": "sl-1", "digest": "11" * 32}]))
    async with asyncio.timeout(5):
        await engine._submit_checkin(part, cast(Any, watch), going_early, None)
    [submit] = ledger.submits
    assert submit["signed"] == b"ours" and part.relayed_by is None and engine._relay_paused == 2


class _CountingBus:
    """Opens envelopes as the bus would, counting them."""

    def __init__(self) -> None:
        self.opened = 0

    def open(self, message: Message) -> Envelope:
        self.opened += 1
        return decode_envelope(message.payload)


async def test_an_event_two_watches_get_is_opened_once() -> None:
    # the follow of one round and of the next watch the same events for a moment: one decode and
    # signature check each, not one per watch
    bus = _CountingBus()
    opened = OpenedEvents(cast(Any, bus), size=2)
    body = {"entity": "round", "key": "c1", "height": 7, "view": {"open": None}}
    event = Message(
        "swarm/ev/sn-1/round/c1", encode_envelope(make_envelope("event", body, sender="sn-1", role="sn"))
    )
    watches = []
    for _ in range(2):
        sub = Subscription("swarm/ev/+/round/c1", maxsize=10)
        sub.offer(event)
        watches.append(Watch(cast(Any, bus), sub, "round", opened=opened))
    got = [await watch.next(timeout=1) for watch in watches]
    assert got[0] == got[1] and got[0].height == 7 and bus.opened == 1
    bad = Message("swarm/ev/sn-1/round/c1", b"\x92not an envelope")
    assert opened.open(bad) is None and opened.open(bad) is None
    for n in range(3):  # the oldest go: the cache holds ``size`` messages
        opened.open(
            Message(
                "swarm/ev/sn-1/round/c1",
                encode_envelope(make_envelope("event", {"n": n}, sender="sn-1", role="sn")),
            )
        )
    opened.open(event)
    assert bus.opened == 1 + 1 + 3 + 1
