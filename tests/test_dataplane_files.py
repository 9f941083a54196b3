"""Models between SLs of one host copied out of the holder's buffer file instead of sent through the
socket, over real data plane connections: checked like sent bytes, and sent after all whenever the file
cannot be opened; never named to a peer that did not ask, nor taken from one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from daemons.bus.transfer import StateHolder, TransferError
from daemons.sl import dataplane
from daemons.sl.buffers import MODEL_BUFFERS
from daemons.sl.dataplane import DataPlaneClient, DataPlaneServer, Endpoint, Offers, Served, decode_request
from daemons.sl.peer_files import PEER_FILES
from wire import CodecError
from wire.frames import encode_frame_head, header_length
from wire.tensors import FlatState, Manifest, make_manifest

NBYTES = 300_032  # the flat size of 75,008 float32


@pytest.fixture
def shared_size(tmp_path: Path) -> Iterator[Path]:
    """The pool makes buffers of ``NBYTES`` as files, as while an ML program shares weights."""
    directory = tmp_path / "swarm-sl-test"
    directory.mkdir(mode=0o700)
    MODEL_BUFFERS.share(NBYTES, directory)
    yield directory
    MODEL_BUFFERS.unshare(NBYTES)
    PEER_FILES.forget()


@pytest.fixture
def payloads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the models sent as bytes through a socket."""
    sent: list[int] = []
    send = dataplane._send_payload

    async def counting(writer: asyncio.StreamWriter, flat: FlatState, idle: float | None) -> None:
        sent.append(flat.total)
        await send(writer, flat, idle)

    monkeypatch.setattr(dataplane, "_send_payload", counting)
    return sent


def _in_pool(seed: int) -> tuple[FlatState, Manifest]:
    """A model in one of the pool's buffers (a file while its size is shared), and its manifest."""
    rng = np.random.default_rng(seed)
    model = FlatState.from_arrays({"w": rng.standard_normal(NBYTES // 4, dtype=np.float32)})
    buffer = MODEL_BUFFERS.take(NBYTES)
    buffer[:] = model.buffer
    flat = FlatState(model.specs, buffer)
    return flat, make_manifest(flat, "held", chunk_size=64 << 10)


def _holder() -> StateHolder:
    return StateHolder(cast(Any, SimpleNamespace(uid="sl-1")))


async def test_a_model_is_copied_from_the_holders_file_and_counted_as_served(
    shared_size: Path, payloads: list[int]
) -> None:
    holder, served = _holder(), Served()
    flat, manifest = _in_pool(1)
    holder.keep(flat, manifest)
    assert MODEL_BUFFERS.file_of(flat.buffer) is not None
    async with DataPlaneServer(holder, "127.0.0.1", served=served) as server:
        client = DataPlaneClient("sl-2")
        try:
            for _ in range(2):
                got, _ = await client.fetch(server.endpoint("127.0.0.1"), manifest.digest)
                assert np.array_equal(got.buffer, flat.buffer) and got.buffer is not flat.buffer
            assert await served.wait(manifest.digest, {"sl-2"}, 1.0)
        finally:
            await client.close()
    assert payloads == []  # nothing went through the socket
    assert PEER_FILES.mapped_bytes == NBYTES  # mapped once, for both


async def test_a_file_the_puller_cannot_open_is_sent_instead(shared_size: Path, payloads: list[int]) -> None:
    holder = _holder()
    flat, manifest = _in_pool(2)
    holder.keep(flat, manifest)
    path = MODEL_BUFFERS.file_of(flat.buffer)
    assert path is not None
    path.unlink()  # as when another user's SL holds it: the name cannot be opened here
    async with DataPlaneServer(holder, "127.0.0.1") as server:
        client = DataPlaneClient("sl-2")
        try:
            got, _ = await client.fetch(server.endpoint("127.0.0.1"), manifest.digest)
            assert np.array_equal(got.buffer, flat.buffer)
        finally:
            await client.close()
    assert payloads == [NBYTES]


async def test_a_file_whose_bytes_differ_from_the_manifest_fails_the_pull_not_the_server(
    shared_size: Path,
) -> None:
    holder = _holder()
    flat, manifest = _in_pool(3)
    holder.keep(flat, manifest)
    async with DataPlaneServer(holder, "127.0.0.1") as server:
        client = DataPlaneClient("sl-2")
        try:
            flat.buffer[100] ^= 0xFF  # the holder wrote into it after hashing it
            with pytest.raises(TransferError, match=r"chunks \[0\] of .* do not match the manifest"):
                await client.fetch(server.endpoint("127.0.0.1"), manifest.digest)
            flat.buffer[100] ^= 0xFF
            got, _ = await client.fetch(server.endpoint("127.0.0.1"), manifest.digest)
            assert np.array_equal(got.buffer, flat.buffer)
        finally:
            await client.close()


async def test_an_offer_is_taken_from_the_pushers_file_or_sent_when_it_cannot_be_opened(
    shared_size: Path, payloads: list[int]
) -> None:
    offers = Offers()
    first, first_manifest = _in_pool(4)
    second, second_manifest = _in_pool(5)
    async with DataPlaneServer(_holder(), "127.0.0.1", offers=offers) as server:
        client = DataPlaneClient("sl-2")
        try:
            await client.offer(server.endpoint("127.0.0.1"), first, first_manifest)
            got = await offers.take(first_manifest.digest, 0.1)
            assert got is not None and np.array_equal(got.buffer, first.buffer)
            assert got.buffer is not first.buffer and payloads == []
            path = MODEL_BUFFERS.file_of(second.buffer)
            assert path is not None
            path.unlink()
            await client.offer(server.endpoint("127.0.0.1"), second, second_manifest)  # the leader asks
            got = await offers.take(second_manifest.digest, 0.1)
            assert got is not None and np.array_equal(got.buffer, second.buffer)
            assert payloads == [NBYTES] and len(server._handlers) == 1  # on the same connection
        finally:
            await client.close()


async def test_with_files_off_models_go_through_the_socket(
    shared_size: Path, payloads: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWARM_DATAPLANE_FILES", "off")
    holder, offers = _holder(), Offers()
    flat, manifest = _in_pool(6)
    holder.keep(flat, manifest)
    async with DataPlaneServer(holder, "127.0.0.1", offers=offers) as server:
        client = DataPlaneClient("sl-2")
        try:
            await client.fetch(server.endpoint("127.0.0.1"), manifest.digest)
            await client.offer(server.endpoint("127.0.0.1"), flat, manifest)
            assert await offers.take(manifest.digest, 0.1) is not None
        finally:
            await client.close()
    assert payloads == [NBYTES, NBYTES]


async def test_a_file_named_without_being_asked_for_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWARM_DATAPLANE_FILES", "off")
    rng = np.random.default_rng(7)
    manifest = make_manifest(FlatState.from_arrays({"w": rng.standard_normal(1000, dtype=np.float32)}), "x")

    async def namer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1000)
        head = {"op": "state", "manifest": manifest.body(), "file": "/dev/shm/swarm-sl-x/weights-1"}
        writer.write(encode_frame_head(head))
        await writer.drain()
        await reader.read()

    server = await asyncio.start_server(namer, "127.0.0.1", 0)
    client = DataPlaneClient("sl-2")
    try:
        endpoint = Endpoint("127.0.0.1", server.sockets[0].getsockname()[1], False)
        with pytest.raises(TransferError, match="named a file it was not asked for"):
            await client.fetch(endpoint, manifest.digest)
    finally:
        await client.close()
        server.close()


def test_an_offer_may_name_only_an_sl_buffer_and_then_carries_no_bytes() -> None:
    rng = np.random.default_rng(8)
    manifest = make_manifest(FlatState.from_arrays({"w": rng.standard_normal(1000, dtype=np.float32)}), "x")
    base = {"op": "offer", "manifest": manifest.body(), "sender": "sl-2"}
    good = encode_frame_head({**base, "file": "/dev/shm/swarm-sl-a/weights-2"})
    request = decode_request(good[4 : 4 + header_length(good[:4])])
    assert request.offer_file == "/dev/shm/swarm-sl-a/weights-2" and request.offer is not None
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({**base, "file": "/home/me/.ssh/id_rsa"}, 0, "not an SL's weight buffer"),
        ({**base, "file": "/dev/shm/swarm-sl-a/weights-2"}, manifest.total, "payload"),
        ({"op": "get", "digest": bytes(32), "sender": "sl-2", "files": "yes"}, 0, "'files'"),
    ]
    for head, nbytes, why in cases:
        frame = encode_frame_head(head, nbytes)
        with pytest.raises(CodecError, match=why):
            decode_request(frame[4 : 4 + header_length(frame[:4])])
