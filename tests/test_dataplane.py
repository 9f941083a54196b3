"""The SL-to-SL data plane over real sockets: models pulled and verified, garbage and liars refused,
mutual TLS with the node certificates."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from certs import client_context, init_swarm, server_context
from daemons.bus.transfer import StateHolder, TransferError
from daemons.sl import dataplane
from daemons.sl.dataplane import (
    DataPlaneClient,
    DataPlaneServer,
    Endpoint,
    Served,
    decode_request,
    encode_request,
    parse_address,
    serving,
)
from wire import CodecError
from wire.frames import encode_frame_head, header_length
from wire.tensors import XXH3, FlatState, Manifest, make_manifest


def _holder() -> StateHolder:
    return StateHolder(cast(Any, SimpleNamespace(uid="sl-1")))


def _model(nbytes: int = 300_000, seed: int = 0) -> FlatState:
    rng = np.random.default_rng(seed)
    return FlatState.from_arrays({"w": rng.standard_normal(nbytes // 4, dtype=np.float32)})


def _held(holder: StateHolder, flat: FlatState) -> Manifest:
    manifest = make_manifest(flat, "held", chunk_size=64 << 10)
    holder.keep(flat, manifest)
    return manifest


def test_addresses_parse_or_are_ignored() -> None:
    assert parse_address("dp://10.0.0.2:4100") == Endpoint("10.0.0.2", 4100, False)
    assert parse_address("dps://[::1]:4100") == Endpoint("::1", 4100, True)
    for text in ("", "10.0.0.2", "mqtt://h:1883", "dp://h:0", "dp://h:99999", "dp://:1", "dp://h:x", None, 3):
        assert parse_address(text) is None


async def test_a_model_is_pulled_verified_into_the_spare_buffer_on_a_kept_connection() -> None:
    holder = _holder()
    flat = _model()
    manifest = _held(holder, flat)
    async with DataPlaneServer(holder, "127.0.0.1") as server:
        client = DataPlaneClient("sl-2")
        try:
            spare = np.empty(flat.total, dtype=np.uint8)
            for _ in range(2):
                got, got_manifest = await client.fetch(
                    server.endpoint("127.0.0.1"), manifest.digest, spare=spare
                )
                assert got.buffer is spare
                assert np.array_equal(got.buffer, flat.buffer)
                assert got.specs == flat.specs and got_manifest.digest == manifest.digest
            assert len(server._handlers) == 1  # one connection served both
        finally:
            await client.close()
    assert holder.served[manifest.digest] == {"sl-2"}


async def test_an_unknown_model_is_refused_by_name_and_the_connection_still_serves() -> None:
    holder = _holder()
    manifest = _held(holder, _model())
    async with DataPlaneServer(holder, "127.0.0.1") as server:
        client = DataPlaneClient("sl-2")
        endpoint = server.endpoint("127.0.0.1")
        try:
            with pytest.raises(TransferError, match="does not hold model"):
                await client.fetch(endpoint, bytes(32))
            got, _ = await client.fetch(endpoint, manifest.digest)
            assert got.total == manifest.total
        finally:
            await client.close()


async def test_garbage_gets_an_error_frame_and_the_server_keeps_serving() -> None:
    holder = _holder()
    manifest = _held(holder, _model())
    async with DataPlaneServer(holder, "127.0.0.1") as server:
        for junk in (b"\x00\x00\x00\x05hello", b"\xff\xff\xff\xff", encode_frame_head({"op": "get"})):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(junk)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 5)  # an error frame or nothing, then closed
            assert b"state" not in answer
            writer.close()
        client = DataPlaneClient("sl-2")
        try:
            got, _ = await client.fetch(server.endpoint("127.0.0.1"), manifest.digest)
            assert got.total == manifest.total
        finally:
            await client.close()


async def test_a_peer_sending_other_bytes_than_its_manifest_is_caught() -> None:
    flat = _model()
    manifest = make_manifest(flat, "held", chunk_size=64 << 10)

    async def liar(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1000)
        writer.write(encode_frame_head({"op": "state", "manifest": manifest.body()}, manifest.total))
        writer.write(bytes(manifest.total))  # zeros, not the model
        await writer.drain()
        await reader.read()

    server = await asyncio.start_server(liar, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = DataPlaneClient("sl-2")
    try:
        with pytest.raises(TransferError, match="do not match the manifest"):
            await client.fetch(Endpoint("127.0.0.1", port, False), manifest.digest)
        with pytest.raises(TransferError, match="sent model"):
            await client.fetch(Endpoint("127.0.0.1", port, False), bytes(32))
    finally:
        await client.close()
        server.close()


async def test_with_certificates_only_the_swarms_nodes_get_models(tmp_path: Path) -> None:
    init_swarm(tmp_path / "ours", sl=2)
    init_swarm(tmp_path / "theirs", sl=1)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ca = ours / "ca" / "ca-cert.pem"

    def client(root: Path, uid: str) -> DataPlaneClient:
        tls = client_context(root / f"{uid}-cert.pem", root / f"{uid}-key.pem", root / "ca" / "ca-cert.pem",
                             check_hostname=False)  # fmt: skip
        return DataPlaneClient(uid, tls=tls)

    holder = _holder()
    manifest = _held(holder, _model())
    tls = server_context(ours / "sl-1-cert.pem", ours / "sl-1-key.pem", ca)
    proved: list[str | None] = []

    async def note_identity(_digest: bytes, _sender: str, identity: str | None, _height: int | None) -> None:
        proved.append(identity)

    async with DataPlaneServer(holder, "127.0.0.1", tls=tls, check=note_identity) as server:
        endpoint = server.endpoint("127.0.0.1")
        assert str(endpoint).startswith("dps://")
        member = client(ours, "sl-2")
        stranger = client(theirs, "sl-1")
        plain = DataPlaneClient("sl-2")
        try:
            got, _ = await member.fetch(endpoint, manifest.digest)
            assert got.total == manifest.total
            with pytest.raises(TransferError):
                await stranger.fetch(endpoint, manifest.digest)
            with pytest.raises(TransferError, match="needs TLS"):
                await plain.fetch(endpoint, manifest.digest)
            with pytest.raises(TransferError, match="does not speak TLS"):
                await member.fetch(Endpoint("127.0.0.1", server.port, False), manifest.digest)
        finally:
            for c in (member, stranger, plain):
                await c.close()
    assert proved == ["sl-2"]  # the check sees the CN the member proved, not only the uid it claims


async def test_a_node_with_certificates_refuses_a_model_checksummed_with_xxh3(tmp_path: Path) -> None:
    """XXH3 is for swarms without certificates: one node that has them takes only the hash its signed
    digests rest on, and names the one it refused; a node without them pulls the same model."""
    init_swarm(tmp_path, sl=2)
    ca = tmp_path / "ca" / "ca-cert.pem"
    holder = _holder()
    flat = _model()
    manifest = make_manifest(flat, "held", chunk_size=64 << 10, hash=XXH3)
    holder.keep(flat, manifest)
    tls = server_context(tmp_path / "sl-1-cert.pem", tmp_path / "sl-1-key.pem", ca)
    client_tls = client_context(
        tmp_path / "sl-2-cert.pem", tmp_path / "sl-2-key.pem", ca, check_hostname=False
    )
    async with (
        DataPlaneServer(holder, "127.0.0.1", tls=tls) as signed,
        DataPlaneServer(holder, "127.0.0.1") as plain,
    ):
        member, other = DataPlaneClient("sl-2", tls=client_tls), DataPlaneClient("sl-3")
        try:
            with pytest.raises(TransferError, match="hashed with xxh3-128, which is not cryptographic"):
                await member.fetch(signed.endpoint("127.0.0.1"), manifest.digest)
            got, got_manifest = await other.fetch(plain.endpoint("127.0.0.1"), manifest.digest)
            assert np.array_equal(got.buffer, flat.buffer) and got_manifest.hash == XXH3
        finally:
            await member.close()
            await other.close()


async def test_a_merged_model_is_sent_as_soon_as_the_leader_announces_it() -> None:
    holder = _holder()
    async with DataPlaneServer(holder, "127.0.0.1") as server:
        client = DataPlaneClient("sl-2")
        try:
            early = asyncio.create_task(client.fetch_result(server.endpoint("127.0.0.1"), "c1", 3))
            await asyncio.sleep(0.2)
            assert not early.done()  # nothing merged yet: the request waits
            manifest = _held(holder, _model(seed=3))
            holder.announce("c1", 3, manifest.digest)
            got, got_manifest = await early
            assert got_manifest.digest == manifest.digest and got.total == manifest.total
        finally:
            await client.close()


async def test_a_leader_can_wait_until_a_participant_took_its_merged_model() -> None:
    # The final round's leader records its merge only once another participant holds it (issue 11).
    holder, served = _holder(), Served()
    flat = _model()
    async with DataPlaneServer(holder, "127.0.0.1", served=served) as server:
        client = DataPlaneClient("sl-2")
        try:
            early = asyncio.create_task(client.fetch_result(server.endpoint("127.0.0.1"), "c1", 4))
            manifest = _held(holder, flat)
            assert not await served.wait(manifest.digest, {"sl-2", "sl-3"}, 0.05)  # not announced yet
            waiting = asyncio.create_task(served.wait(manifest.digest, {"sl-2", "sl-3"}, 30))
            holder.announce("c1", 4, manifest.digest)
            assert await waiting
            got, _ = await early
            assert np.array_equal(got.buffer, flat.buffer)
            assert served.takers(manifest.digest) == {"sl-2"}
            assert not await served.wait(manifest.digest, {"sl-3"}, 0.05)  # only who took it counts
            assert await served.wait(manifest.digest, {"sl-2"}, 0)  # already taken: at once
        finally:
            await client.close()


async def test_an_sl_serves_on_the_address_it_reaches_the_broker_from_or_falls_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    holder = _holder()
    async with serving(holder, "127.0.0.1") as endpoint:
        assert endpoint is not None and endpoint.host == "127.0.0.1" and not endpoint.tls
        monkeypatch.setenv("SWARM_DATAPLANE_PORT", str(endpoint.port))
        async with serving(holder, "127.0.0.1") as taken:
            assert taken is None  # the port is in use: the broker carries the models
    for name, value in (("SWARM_DATAPLANE_PORT", "http"), ("SWARM_DATAPLANE", "off")):
        monkeypatch.setenv(name, value)
        async with serving(holder, "127.0.0.1") as none:
            assert none is None


async def test_a_server_closes_while_a_peer_waits_for_a_merge() -> None:
    holder = _holder()
    client = DataPlaneClient("sl-2")
    try:
        async with DataPlaneServer(holder, "127.0.0.1") as server:
            early = asyncio.create_task(client.fetch_result(server.endpoint("127.0.0.1"), "c1", 9))
            await asyncio.sleep(0.2)
        with pytest.raises(TransferError):
            await asyncio.wait_for(early, 10)
    finally:
        await client.close()


async def test_the_servers_check_refuses_a_peer_by_name_and_sees_what_it_claims() -> None:
    holder = _holder()
    manifest = _held(holder, _model())
    asked: list[tuple[bytes, str, str | None, int | None]] = []

    async def only_the_leader(
        digest: bytes, sender: str, identity: str | None, height: int | None
    ) -> str | None:
        asked.append((digest, sender, identity, height))
        return None if sender == "sl-leader" else f"{sender!r} does not lead the round"

    async with DataPlaneServer(holder, "127.0.0.1", check=only_the_leader) as server:
        endpoint = server.endpoint("127.0.0.1")
        spy, leader = DataPlaneClient("sl-spy"), DataPlaneClient("sl-leader")
        try:
            with pytest.raises(TransferError, match="'sl-spy' does not lead the round"):
                await spy.fetch(endpoint, manifest.digest)
            got, _ = await leader.fetch(endpoint, manifest.digest, height=41)
            assert got.total == manifest.total
        finally:
            await spy.close()
            await leader.close()
    # The leader names the newest ledger block it saw (the close that made it leader): the check reads there.
    assert asked == [(manifest.digest, "sl-spy", None, None), (manifest.digest, "sl-leader", None, 41)]
    assert holder.served[manifest.digest] == {"sl-leader"}


async def test_a_connection_the_server_closed_while_idle_is_replaced_not_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # rounds further apart than the server's idle timeout: the kept connection is closed at the other
    # end; the next pull must open a new one, not fail (and send the pull through the broker)
    monkeypatch.setattr(dataplane, "_REQUEST_TIMEOUT", 0.2)
    holder = _holder()
    flat = _model()
    manifest = _held(holder, flat)
    offers = dataplane.Offers()
    async with DataPlaneServer(holder, "127.0.0.1", offers=offers) as server:
        client = DataPlaneClient("sl-2")
        endpoint = server.endpoint("127.0.0.1")
        try:
            for _ in range(2):
                got, _manifest = await client.fetch(endpoint, manifest.digest)
                assert np.array_equal(got.buffer, flat.buffer)
                await client.offer(endpoint, flat, manifest, number=3, weight=1.0)
                await asyncio.sleep(0.6)  # the server closed both connections meanwhile
                assert not server._handlers
        finally:
            await client.close()


async def test_a_connection_idle_near_the_servers_timeout_is_not_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a request sent just as the server times the connection out would find it closed: the client
    # opens a new one once a kept connection has been idle for half the server's timeout
    monkeypatch.setattr(dataplane, "_REUSE_WITHIN", 0.2)
    holder = _holder()
    flat = _model(4096)
    manifest = _held(holder, flat)
    async with DataPlaneServer(holder, "127.0.0.1") as server:
        client = DataPlaneClient("sl-2")
        endpoint = server.endpoint("127.0.0.1")
        try:
            await client.fetch(endpoint, manifest.digest)
            first = next(iter(client._connections.values()))
            await client.fetch(endpoint, manifest.digest)
            assert next(iter(client._connections.values())) is first  # reused at once
            await asyncio.sleep(0.3)
            await client.fetch(endpoint, manifest.digest)
            assert next(iter(client._connections.values())) is not first
            assert first.writer.is_closing()
        finally:
            await client.close()


def test_a_request_names_the_newest_block_its_sender_saw_and_a_bad_one_is_refused() -> None:
    digest = bytes(32)
    frame = encode_request(digest, "sl-1", height=12)
    assert decode_request(frame[4 : 4 + header_length(frame[:4])]).height == 12
    frame = encode_request(digest, "sl-1")
    assert decode_request(frame[4 : 4 + header_length(frame[:4])]).height is None
    for bad in (-1, True, "12", 2**60):
        data = encode_frame_head({"op": "get", "digest": digest, "sender": "sl-1", "height": bad})
        with pytest.raises(CodecError, match="'height' must be a block height"):
            decode_request(data[4 : 4 + header_length(data[:4])])
