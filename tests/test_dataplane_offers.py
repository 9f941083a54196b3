"""Rows pushed to a round's predicted leader over the data plane (``op: "offer"``): checked chunk by
chunk, kept by digest (the newest per sender), refused by a server that takes none, over mutual TLS."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from certs import client_context, init_swarm, server_context
from contracts.rounds import leader_order
from daemons.bus import BusError
from daemons.bus.transfer import StateHolder, TransferError
from daemons.ledger_client import Rejected
from daemons.sl.dataplane import (
    MAX_CHECKIN_BYTES,
    DataPlaneClient,
    DataPlaneServer,
    Offers,
    PushedCheckin,
    decode_request,
    encode_offer,
    encode_result_request,
)
from daemons.sl.rounds import RoundEngine, RoundResult, _closed_before, _Part, _Prediction
from wire import CodecError
from wire.frames import encode_frame_head, header_length
from wire.tensors import SIGNED_HASHES, XXH3, FlatState, Manifest, make_manifest


def _holder() -> StateHolder:
    return StateHolder(cast(Any, SimpleNamespace(uid="sl-leader")))


def _model(seed: int, nbytes: int = 300_000) -> tuple[FlatState, Manifest]:
    rng = np.random.default_rng(seed)
    flat = FlatState.from_arrays({"w": rng.standard_normal(nbytes // 4, dtype=np.float32)})
    return flat, make_manifest(flat, "held", chunk_size=64 << 10)


async def test_an_offer_is_checked_and_kept_by_digest_the_newest_per_sender() -> None:
    offers = Offers()
    first, first_manifest = _model(1)
    second, second_manifest = _model(2)
    async with DataPlaneServer(_holder(), "127.0.0.1", offers=offers) as server:
        client = DataPlaneClient("sl-2")
        try:
            await client.offer(server.endpoint("127.0.0.1"), first, first_manifest)
            got = await offers.take(first_manifest.digest, 0.1)
            assert got is not None and np.array_equal(got.buffer, first.buffer) and got.specs == first.specs
            await client.offer(server.endpoint("127.0.0.1"), second, second_manifest)  # same connection
            assert len(server._handlers) == 1
        finally:
            await client.close()
    assert await offers.take(first_manifest.digest, 0.1) is None  # replaced by the sender's newer one
    assert await offers.take(second_manifest.digest, 0.1) is not None
    assert await offers.take(bytes(32), 0.1) is None  # never offered: no wait


async def test_an_offer_whose_bytes_differ_from_its_manifest_is_dropped() -> None:
    offers = Offers()
    flat, manifest = _model(3)
    forged = FlatState(flat.specs, np.zeros_like(flat.buffer))
    async with DataPlaneServer(_holder(), "127.0.0.1", offers=offers) as server:
        client = DataPlaneClient("sl-2")
        try:
            with pytest.raises(TransferError, match="offering model"):
                await client.offer(server.endpoint("127.0.0.1"), forged, manifest)
            assert await offers.take(manifest.digest, 0.1) is None
            await client.offer(server.endpoint("127.0.0.1"), flat, manifest)  # a new connection serves
            assert await offers.take(manifest.digest, 0.1) is not None
        finally:
            await client.close()


async def test_a_server_without_offers_refuses_them_by_name() -> None:
    flat, manifest = _model(4)
    async with DataPlaneServer(_holder(), "127.0.0.1") as server:
        client = DataPlaneClient("sl-2")
        try:
            with pytest.raises(TransferError, match="takes no offers"):
                await client.offer(server.endpoint("127.0.0.1"), flat, manifest)
        finally:
            await client.close()


async def test_a_leader_waits_for_an_offer_that_is_arriving_and_senders_are_bounded() -> None:
    offers = Offers(capacity=2)
    flat, manifest = _model(5)
    offers.arriving("sl-2", manifest.digest)
    waiting = asyncio.create_task(offers.take(manifest.digest, 5.0))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    offers.arrived(manifest.digest, flat)
    assert await waiting is flat
    broken = _model(6)[1].digest
    offers.arriving("sl-3", broken)
    offers.arrived(broken, None)  # cut off mid-way: nothing kept
    assert await offers.take(broken, 0.1) is None
    for sender, seed in (("sl-3", 7), ("sl-4", 8)):
        other, other_manifest = _model(seed, 4096)
        offers.arriving(sender, other_manifest.digest)
        offers.arrived(other_manifest.digest, other)
    assert await offers.take(manifest.digest, 0.1) is None  # the oldest sender's offer made room


async def test_offers_travel_only_over_mutual_tls_when_there_are_certificates(tmp_path: Path) -> None:
    init_swarm(tmp_path, sl=2)
    ca = tmp_path / "ca" / "ca-cert.pem"
    tls = client_context(tmp_path / "sl-2-cert.pem", tmp_path / "sl-2-key.pem", ca, check_hostname=False)
    offers = Offers()
    flat, manifest = _model(9)
    server_tls = server_context(tmp_path / "sl-1-cert.pem", tmp_path / "sl-1-key.pem", ca)
    async with DataPlaneServer(_holder(), "127.0.0.1", tls=server_tls, offers=offers) as server:
        member, plain = DataPlaneClient("sl-2", tls=tls), DataPlaneClient("sl-3")
        try:
            await member.offer(server.endpoint("127.0.0.1"), flat, manifest)
            assert await offers.take(manifest.digest, 0.1) is not None
            with pytest.raises(TransferError, match="needs TLS"):
                await plain.offer(server.endpoint("127.0.0.1"), flat, manifest)
        finally:
            await member.close()
            await plain.close()


def test_an_offer_head_decodes_and_a_lying_one_is_refused() -> None:
    _, manifest = _model(10)
    frame = encode_offer(manifest, "sl-2")
    request = decode_request(frame[4 : 4 + header_length(frame[:4])])
    assert request.sender == "sl-2" and request.offer is not None
    assert request.offer.digest == manifest.digest and request.digest is None
    with pytest.raises(CodecError, match="over 1000"):
        decode_request(frame[4 : 4 + header_length(frame[:4])], max_offer=1000)


def test_where_weights_are_signed_an_offer_checksummed_with_xxh3_is_refused() -> None:
    flat, _ = _model(10)
    frame = encode_offer(make_manifest(flat, "held", chunk_size=64 << 10, hash=XXH3), "sl-2")
    head = frame[4 : 4 + header_length(frame[:4])]
    with pytest.raises(CodecError, match="data plane offer: its chunks are hashed with xxh3-128"):
        decode_request(head, hashes=SIGNED_HASHES)
    offer = decode_request(head).offer
    assert offer is not None and offer.hash == XXH3


async def test_an_early_merge_waits_for_every_predicted_row_of_its_round_and_gives_up_on_a_broken_one() -> (
    None
):
    offers = Offers()
    rows = {uid: _model(seed, 4096) for uid, seed in (("sl-2", 11), ("sl-3", 12))}
    old_flat, old_manifest = _model(13, 4096)
    offers.arriving("sl-2", old_manifest.digest, 6, 1.0)  # last round's row: not this one's
    offers.arrived(old_manifest.digest, old_flat)
    waiting = asyncio.create_task(offers.rows(7, ["sl-2", "sl-3"]))
    assert not offers.coming(7, ["sl-2", "sl-3"])
    for uid, (_, manifest) in rows.items():
        offers.arriving(uid, manifest.digest, 7, 2.5)
        await asyncio.sleep(0.01)
        assert not waiting.done()  # arriving is not arrived
    assert offers.coming(7, ["sl-2", "sl-3"])
    for flat, manifest in rows.values():
        offers.arrived(manifest.digest, flat)
    got = await asyncio.wait_for(waiting, 1.0)
    assert {uid: (o.digest, o.weight) for uid, o in got.items()} == {
        uid: (m.digest, 2.5) for uid, (_, m) in rows.items()
    }
    broken = _model(14, 4096)[1]
    offers.arriving("sl-3", broken.digest, 8, 1.0)
    offers.arrived(broken.digest, None)  # cut off: the early merge gives up rather than wait forever
    assert set(await asyncio.wait_for(offers.rows(8, ["sl-2", "sl-3"]), 1.0)) == set()
    assert not offers.coming(8, ["sl-3"])


def test_offer_and_early_request_heads_carry_round_weight_and_participants_checked() -> None:
    _, manifest = _model(15)
    frame = encode_offer(manifest, "sl-2", 9, 3.0)
    request = decode_request(frame[4 : 4 + header_length(frame[:4])])
    assert (request.offer_round, request.offer_weight) == (9, 3.0)
    frame = encode_result_request("c1", 9, "sl-2", ("sl-3", "sl-1"))
    request = decode_request(frame[4 : 4 + header_length(frame[:4])])
    assert (request.contract, request.round, request.among) == ("c1", 9, ("sl-1", "sl-3"))
    for head, message in (
        ({"round": 0}, "'round' must be a round number"),
        ({"round": True}, "'round' must be a round number"),
        ({"weight": -1.0}, "'weight' must be a number"),
        ({"weight": "1"}, "'weight' must be a number"),
    ):
        data = encode_frame_head(
            {"op": "offer", "manifest": manifest.body(), "sender": "sl-2", **head}, nbytes=manifest.total
        )
        with pytest.raises(CodecError, match=message):
            decode_request(data[4 : 4 + header_length(data[:4])])
    for among in ([], ["sl-1", 3], "sl-1", ["x" * 300]):
        data = encode_frame_head(
            {"op": "result", "contract": "c1", "round": 9, "sender": "sl-2", "among": among}
        )
        with pytest.raises(CodecError, match="'among' must be a list"):
            decode_request(data[4 : 4 + header_length(data[:4])])


def test_an_offer_carries_its_senders_signed_check_in_for_the_leader_to_relay_checked_for_shape() -> None:
    _, manifest = _model(17)
    pushed = PushedCheckin(b"signed check-in", bytes(range(32)))
    frame = encode_offer(manifest, "sl-2", 9, 3.0, checkin=pushed)
    assert decode_request(frame[4 : 4 + header_length(frame[:4])]).offer_checkin == pushed
    frame = encode_offer(manifest, "sl-2", 9, 3.0, checkin=PushedCheckin(b"no check-in before"))
    assert decode_request(frame[4 : 4 + header_length(frame[:4])]).offer_checkin == PushedCheckin(
        b"no check-in before", None
    )
    for head, message in (
        ({"checkin": "text"}, "'checkin' must be a signed envelope"),
        ({"checkin": b""}, "'checkin' must be a signed envelope"),
        ({"checkin": b"x" * (MAX_CHECKIN_BYTES + 1)}, "'checkin' must be a signed envelope"),
        ({"checkin": b"x", "after": b"short"}, "'after' must be a digest of 32 bytes"),
        ({"after": bytes(32)}, "'after' without a 'checkin'"),
    ):
        data = encode_frame_head(
            {"op": "offer", "manifest": manifest.body(), "sender": "sl-2", **head}, nbytes=manifest.total
        )
        with pytest.raises(CodecError, match=message):
            decode_request(data[4 : 4 + header_length(data[:4])])


async def test_the_check_ins_pushed_with_rows_are_given_for_rows_of_the_round_that_are_here() -> None:
    offers = Offers()
    rows = {uid: _model(seed, 4096) for uid, seed in (("sl-2", 18), ("sl-3", 19), ("sl-4", 20))}
    for uid, (_, manifest) in rows.items():
        offers.arriving(uid, manifest.digest, 5, 1.0, PushedCheckin(uid.encode()) if uid != "sl-4" else None)
    offers.arrived(rows["sl-2"][1].digest, rows["sl-2"][0])
    assert offers.checkins(5, ["sl-2", "sl-3", "sl-4"]) == {"sl-2": PushedCheckin(b"sl-2")}  # sl-3's arrives
    for uid in ("sl-3", "sl-4"):
        offers.arrived(rows[uid][1].digest, rows[uid][0])
    assert set(offers.checkins(5, ["sl-2", "sl-3", "sl-4"])) == {"sl-2", "sl-3"}  # sl-4 pushed none
    assert offers.checkins(6, ["sl-2", "sl-3"]) == {}  # rows of round 5, not 6
    flat, manifest = _model(21, 4096)
    offers.arriving("sl-2", manifest.digest, 6, 1.0, PushedCheckin(b"sl-2 of round 6"))
    offers.arrived(manifest.digest, flat)
    assert offers.checkins(5, ["sl-2"]) == {}  # its next push replaced it: the leader keeps what it merges
    assert offers.checkins(6, ["sl-2"]) == {"sl-2": PushedCheckin(b"sl-2 of round 6")}


async def test_a_merge_made_before_the_close_is_served_only_to_who_asks_for_exactly_its_participants() -> (
    None
):
    holder = _holder()
    flat, manifest = _model(16)
    holder.keep(flat, manifest)
    holder.announce("c1", 4, manifest.digest, ("sl-1", "sl-2"))
    assert await holder.result("c1", 4, 0.05, ("sl-1", "sl-2")) == manifest.digest
    assert await holder.result("c1", 4, 0.05, ("sl-1", "sl-2", "sl-3")) is None
    assert await holder.result("c1", 4, 0.05) is None  # not recorded after the close: nothing by round
    async with DataPlaneServer(holder, "127.0.0.1") as server:
        client = DataPlaneClient("sl-2")
        try:
            got, got_manifest = await client.fetch_result(
                server.endpoint("127.0.0.1"), "c1", 4, among=("sl-2", "sl-1")
            )
            assert got_manifest.digest == manifest.digest and np.array_equal(got.buffer, flat.buffer)
        finally:
            await client.close()


def _engine(last_close: tuple[int, tuple[str, ...], str] | None, uid: str = "sl-1") -> RoundEngine:
    bus = cast(Any, SimpleNamespace(uid=uid))
    engine = RoundEngine(bus, cast(Any, None), cast(Any, None), "c1")
    engine._last_close = last_close
    return engine


def test_the_next_leader_is_predicted_from_the_last_rounds_participants() -> None:
    members = ("sl-1", "sl-2", "sl-3", "sl-4")
    first = leader_order("c1", 7, members)[0]
    prediction = _engine((7, members, first))._prediction()
    assert prediction is not None
    assert (prediction.number, prediction.participants) == (8, members)
    assert prediction.leader == leader_order("c1", 8, members)[0]
    replaced = leader_order("c1", 7, members)[1]
    assert _engine((7, members, replaced))._prediction() is None  # admins lead, or it was replaced
    assert _engine(None)._prediction() is None


def test_a_round_that_closed_with_other_participants_than_predicted_corrects_the_next_prediction() -> None:
    # sl-4 back from a partition: we predicted rounds 8 and 9 from the three of round 7 and went on
    # early from both; the ledger closed round 8 with all four. Round 10 is predicted from the four (not
    # from the three again, which would repeat an early merge the ledger never records, round after round)
    three, four = ("sl-1", "sl-2", "sl-3"), ("sl-1", "sl-2", "sl-3", "sl-4")
    engine = _engine((9, three, leader_order("c1", 9, three)[0]))
    guessed = _Prediction(8, three, leader_order("c1", 8, three)[0])
    engine._closed_as(8, {"participants": list(four), "leader": leader_order("c1", 8, four)[0]}, guessed)
    prediction = engine._prediction()
    assert prediction is not None
    assert (prediction.number, prediction.participants) == (10, four)
    assert prediction.leader == leader_order("c1", 10, four)[0]


def test_a_round_that_closed_as_predicted_leaves_a_later_prediction_alone() -> None:
    three = ("sl-1", "sl-2", "sl-3")
    later = (9, three, leader_order("c1", 9, three)[0])
    engine = _engine(later)
    guessed = _Prediction(8, three, leader_order("c1", 8, three)[0])
    engine._closed_as(8, {"participants": list(three), "leader": guessed.leader}, guessed)
    assert engine._last_close == later
    engine._closed_as(10, {"participants": ["sl-1", "sl-2"], "leader": "sl-2"}, None)  # a later close: taken
    assert engine._last_close == (10, ("sl-1", "sl-2"), "sl-2")


def test_a_merged_model_taken_early_is_checked_against_the_ledgers_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = _engine(None)
    engine._unconfirmed = {5: "aa" * 32, 6: "bb" * 32}
    merged = {"round": 5, "status": "MERGED", "digest": "aa" * 32}
    other = {"round": 6, "status": "MERGED", "digest": "cc" * 32}
    with caplog.at_level("WARNING", logger="swarm.sl.rounds"):
        engine._confirm({"open": None, "closed": [], "finished": [merged]})
        assert engine._unconfirmed == {6: "bb" * 32} and not caplog.records  # the same digest: confirmed
        engine._confirm({"open": None, "closed": [], "finished": [other]})
    assert engine._unconfirmed == {}
    assert "round 6: we went on with the merged model bbbbbbbbbbbbbbbb its leader sent" in caplog.text
    assert "the ledger records model cccccccccccccccc" in caplog.text


def test_a_pinned_row_outlives_the_holders_capacity_until_unpinned() -> None:
    holder = StateHolder(cast(Any, SimpleNamespace(uid="sl-1")), capacity=2)
    models = [_model(20 + i, 4096) for i in range(4)]
    holder.keep(*models[0])
    holder.pin(models[0][1].digest)  # checked in to a round the ledger has not finished
    for flat, manifest in models[1:]:
        holder.keep(flat, manifest)
    assert holder.get(models[0][1].digest) is not None
    assert holder.get(models[1][1].digest) is None  # the oldest unpinned one made room
    holder.unpin(models[0][1].digest)
    holder.keep(*_model(30, 4096))
    assert holder.get(models[0][1].digest) is None


async def test_a_pull_of_an_earlier_round_neither_blocks_nor_stands_in_for_this_rounds() -> None:
    # a pull of round 5's merge left running must not keep the pull of round 6 (same leader, same
    # participants) from starting, nor be awaited as round 6's model
    engine = _engine(None)
    engine.dataplane = cast(Any, SimpleNamespace())
    asked: list[int] = []
    never = asyncio.Event()

    async def pull(_leader: str, number: int, _among: tuple[str, ...] | None) -> None:
        asked.append(number)
        await never.wait()

    engine._prefetch_from = pull  # type: ignore[method-assign,assignment]
    members = ("sl-1", "sl-2")
    await engine._start_prefetch("sl-2", 5, closed=members)
    await asyncio.sleep(0)
    stale = engine._prefetch
    await engine._start_prefetch("sl-2", 6, closed=members)
    await asyncio.sleep(0)
    assert asked == [5, 6]
    assert stale is not None and stale.task.cancelled()
    async with asyncio.timeout(1):  # not the fetch timeout: the pull is of another round
        assert await engine._prefetched("aa" * 32, 7, members, final=True) is None
    assert engine._prefetch is None


async def test_a_pull_of_a_merge_of_other_participants_is_stopped_not_waited_for() -> None:
    # asked before the close for the merge of four; the round closed with three (one left) and merged
    # before we saw its close: that pull never gives the recorded model, so it is not waited for
    engine = _engine(None)
    engine.dataplane = cast(Any, SimpleNamespace())
    never = asyncio.Event()

    async def pull(_leader: str, _number: int, _among: tuple[str, ...] | None) -> None:
        await never.wait()

    engine._prefetch_from = pull  # type: ignore[method-assign,assignment]
    await engine._start_prefetch("sl-1", 37, among=("sl-1", "sl-2", "sl-3", "sl-4"))
    pending = engine._prefetch
    async with asyncio.timeout(1):  # not the fetch timeout
        assert await engine._prefetched("aa" * 32, 37, ("sl-1", "sl-2", "sl-3"), final=False) is None
    assert pending is not None and pending.task.cancelled()
    assert engine._prefetch is None


async def test_a_round_we_went_on_from_early_is_followed_until_our_lead_of_it_recorded_its_merge() -> None:
    # we began leading round 7 at its close, then went on with our early merge of it: the next view of
    # the round must not end the follow (whose end cancels the lead) before the lead recorded the merge,
    # else no one records it and the others wait out the leader's deadline
    engine = _engine(None)
    engine._led_rounds = [7]  # as _lead_safely marks it when it begins
    recorded = asyncio.Event()

    async def lead() -> RoundResult | None:
        await asyncio.sleep(0.05)  # the ledger query, then round.merged submitted
        recorded.set()
        return None

    leading = asyncio.get_running_loop().create_task(lead())
    flat, manifest = _model(1, 4096)
    part = _Part(flat, manifest, {}, keep_own=False, public=False, previous=None, prediction=None)
    part.gone_early = RoundResult(flat, manifest.digest.hex(), 7)
    rnd = {"round": 7, "status": "CLOSED", "leader": "sl-1", "participants": ["sl-1", "sl-2"]}
    view = {"open": {"round": 8, "status": "OPEN"}, "closed": [rnd], "finished": []}
    result, _ = await engine._follow_step(part, view, rnd, 7, leading)
    assert result is part.gone_early
    assert recorded.is_set() and leading.done() and not leading.cancelled()


async def test_going_on_early_waits_for_the_close_of_the_round_before_the_last_not_of_the_last() -> None:
    # The ledger's close of round 7 is slow: the early path of round 8 goes on without it (the check-in
    # of round 8 waits for it, in the follow); that of round 9 waits until round 7 closed, so going on
    # early runs at most one round ahead of the ledger.
    members = ("sl-1", "sl-2", "sl-3")
    leader7 = leader_order("c1", 7, members)[0]
    uid = next(m for m in members if m != leader_order("c1", 8, members)[0])
    ledger = SimpleNamespace(sign=lambda kind, body: b"signed " + kind.encode())
    engine = RoundEngine(cast(Any, SimpleNamespace(uid=uid)), cast(Any, ledger), _holder(), "c1")
    engine.relay_checkins = True  # SWARM_SL_RELAY_CHECKINS
    engine._last_close = (7, members, leader7)
    offered: list[int] = []
    follows: list[tuple[int, Any, float]] = []
    forever = asyncio.Event()

    async def offer(part: _Part, prediction: Any, *_: Any, **__: Any) -> RoundResult:
        assert part.signed == b"signed round.checkin"  # the check-in the leader is to relay, signed before
        offered.append(prediction.number)
        return RoundResult(part.flat, part.digest, prediction.number)

    async def follow(part: _Part, previous: Any, going_early: Any, wait: float) -> RoundResult:
        assert going_early is not None  # the check-in may wait for the early path (CHECKIN_DEFER)
        follows.append((int(part.prediction.number), previous, wait))  # type: ignore[union-attr]
        await forever.wait()  # the ledger's record of the round, never reached here
        raise AssertionError("unreachable")

    engine._offer = offer  # type: ignore[method-assign]
    engine._follow = follow  # type: ignore[method-assign]
    flat7, manifest7 = _model(1, 4096)
    part7 = _Part(flat7, manifest7, {}, keep_own=False, public=False, previous=None, prediction=None)
    following7 = asyncio.get_running_loop().create_task(forever.wait())
    engine._following = (part7, cast(Any, following7))  # went on early from round 7; not closed yet

    got8 = await asyncio.wait_for(engine.sync(_model(2, 4096)[0], samples=10, weight=1.0), 1.0)
    assert got8.round == 8 and offered == [8]
    assert follows[0][0] == 8 and follows[0][1][0] is part7  # the check-in of round 8 waits for close 7
    assert follows[0][2] == 0.0  # and not for the early path: none went on early here before

    syncing9 = asyncio.create_task(engine.sync(_model(3, 4096)[0], samples=10, weight=1.0))
    for _ in range(20):
        await asyncio.sleep(0)
    assert offered == [8] and not syncing9.done()  # round 7 is not closed: no early path for round 9
    part7.closed.set_result(True)
    got9 = await asyncio.wait_for(syncing9, 1.0)
    assert got9.round == 9 and offered == [8, 9]
    assert 0.0 < follows[1][2] <= engine.checkin_defer  # round 8 went on early: round 9's check-in waits
    forever.set()
    for task in asyncio.all_tasks() - {asyncio.current_task()}:
        task.cancel()


async def test_the_early_path_is_refused_what_a_check_in_ended_with_before_its_round_closed() -> None:
    # the follow of round 7 failed before the ledger closed round 7 (refused, say): the sync after next
    # raises it, as the next check-in does; a failure after the close is not the early path's to raise
    flat, manifest = _model(4, 4096)
    failed = _Part(flat, manifest, {}, keep_own=False, public=False, previous=None, prediction=None)

    async def refused() -> RoundResult:
        failed.closed.set_result(False)  # as _follow's finally sets it
        raise Rejected("tx:round.checkin", "not a member")

    task = asyncio.get_running_loop().create_task(refused())
    with pytest.raises(Rejected, match="not a member"):
        await _closed_before((failed, task), failed_after=False)
    closed = _Part(flat, manifest, {}, keep_own=False, public=False, previous=None, prediction=None)
    closed.closed.set_result(True)

    async def late_failure() -> RoundResult:
        raise BusError("the SN went away after the close")

    late = asyncio.get_running_loop().create_task(late_failure())
    await asyncio.sleep(0)
    await _closed_before((closed, late), failed_after=False)  # closed: returns, whatever its follow did after
    with pytest.raises(BusError):
        late.result()


class _RefusingLedger:
    """A ledger stand-in that notes when a check-in is submitted, and refuses it (ending the follow)."""

    def __init__(self) -> None:
        self.submitted = asyncio.Event()

    @contextlib.asynccontextmanager
    async def watch(self, *_: Any, **__: Any) -> AsyncIterator[Any]:
        yield SimpleNamespace()

    async def submit(self, kind: str, _body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.submitted.set()
        raise Rejected(kind, "refused here")


async def test_a_check_in_waits_for_the_early_path_but_not_longer_than_its_bound() -> None:
    # the round's check-in goes to the ledger once the early path has its merge, so the ledger's work
    # runs beside training; an early path that stalls holds it back for CHECKIN_DEFER at most
    ledger = _RefusingLedger()
    engine = RoundEngine(cast(Any, SimpleNamespace(uid="sl-1")), cast(Any, ledger), _holder(), "c1")
    flat, manifest = _model(5, 4096)
    part = _Part(flat, manifest, {}, keep_own=False, public=False, previous=None, prediction=None)
    merged = asyncio.Event()
    early = asyncio.create_task(merged.wait())
    following = asyncio.create_task(engine._follow(part, None, early, 30.0))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not ledger.submitted.is_set()  # the early path is still under way
    merged.set()
    with pytest.raises(Rejected):
        await asyncio.wait_for(following, 1.0)
    assert ledger.submitted.is_set()

    ledger.submitted.clear()
    stalled = asyncio.create_task(asyncio.Event().wait())
    with pytest.raises(Rejected):  # submitted after the bound, though the early path never ended
        await asyncio.wait_for(engine._follow(part, None, stalled, 0.05), 5.0)
    assert ledger.submitted.is_set() and not stalled.done()
    stalled.cancel()


def test_a_check_in_waits_three_times_the_nodes_usual_early_path_within_the_bound() -> None:
    engine = _engine(None)
    engine.checkin_defer = 0.5
    assert engine._checkin_wait() == 0.0  # never went on early: the check-in goes at once
    engine._early_spans.extend([0.010, 0.030, 0.020])
    assert engine._checkin_wait() == pytest.approx(0.060)
    engine._early_spans.extend([0.4] * 8)  # the last 8 only
    assert engine._checkin_wait() == 0.5
    engine.checkin_defer = 0.0  # SWARM_SL_CHECKIN_DEFER=0
    assert engine._checkin_wait() == 0.0
