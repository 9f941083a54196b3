"""Rows pushed to a round's predicted leader over the data plane (``op: "offer"``): checked chunk by
chunk, kept by digest (the newest per sender), refused by a server that takes none, over mutual TLS."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from certs import client_context, init_swarm, server_context
from contracts.rounds import leader_order
from daemons.bus.transfer import StateHolder, TransferError
from daemons.sl.dataplane import DataPlaneClient, DataPlaneServer, Offers, decode_request, encode_offer
from daemons.sl.rounds import RoundEngine
from wire import CodecError
from wire.frames import header_length
from wire.tensors import FlatState, Manifest, make_manifest


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
