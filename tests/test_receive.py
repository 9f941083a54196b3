"""Models read from a real socket straight into their buffer (``daemons/sl/receive.py``): whole over
plain TCP and TLS however the bytes are cut, the stream usable afterwards, and a cut, stalled or lying
sender caught."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import pytest

from certs import client_context, init_swarm, server_context
from daemons.sl.receive import receive_verified
from wire import CodecError
from wire.tensors import FlatState, Manifest, make_manifest

CHUNK = 1 << 20
Sender = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _model(nbytes: int, seed: int = 0) -> tuple[FlatState, Manifest]:
    rng = np.random.default_rng(seed)
    flat = FlatState.from_arrays({"w": rng.standard_normal(nbytes // 4, dtype=np.float32)})
    return flat, make_manifest(flat, "t", chunk_size=CHUNK)


@asynccontextmanager
async def _connected(
    send: Sender, tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A client connection to a server that runs ``send`` on its end."""
    server = await asyncio.start_server(send, "127.0.0.1", 0, ssl=tls[0] if tls else None)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=tls[1] if tls else None, limit=1 << 20
    )
    try:
        yield reader, writer
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


def _sender(payload: bytes, pieces: list[int], then: bytes = b"", pause: float = 0.01) -> Sender:
    """Send ``payload`` cut after each offset in ``pieces`` (pausing between), then ``then``, then wait
    for the receiver's answer and echo it back."""

    async def send(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        start = 0
        for stop in [*pieces, len(payload)]:
            writer.write(payload[start:stop])
            await writer.drain()
            await asyncio.sleep(pause)
            start = stop
        writer.write(then)
        await writer.drain()
        answer = await reader.readexactly(5)
        writer.write(answer)
        await writer.drain()

    return send


@pytest.mark.parametrize(
    "pieces", [[], [7], [3 * CHUNK + 11, 5 * CHUNK], list(range(100_000, 9_000_000, 700_001))]
)
async def test_a_model_arrives_whole_however_it_is_cut_and_the_stream_reads_on(pieces: list[int]) -> None:
    flat, manifest = _model(10 << 20)
    payload = flat.buffer.tobytes()
    async with _connected(_sender(b"head" + payload, [4, *(4 + p for p in pieces)], then=b"next")) as (r, w):
        assert await r.readexactly(4) == b"head"
        got = np.empty(manifest.total, dtype=np.uint8)
        await receive_verified(r, w, got, manifest, idle=5)
        assert got.tobytes() == payload
        assert await r.readexactly(4) == b"next"  # what follows the model goes to the stream again
        w.write(b"hello")
        await w.drain()
        assert await r.readexactly(5) == b"hello"  # and its writer still works


async def test_a_model_arrives_whole_over_tls(tmp_path: Path) -> None:
    init_swarm(tmp_path, sl=2)
    ca = tmp_path / "ca" / "ca-cert.pem"
    server = server_context(tmp_path / "sl-1-cert.pem", tmp_path / "sl-1-key.pem", ca)
    client = client_context(tmp_path / "sl-2-cert.pem", tmp_path / "sl-2-key.pem", ca, check_hostname=False)
    flat, manifest = _model(6 << 20, seed=1)
    payload = flat.buffer.tobytes()
    async with _connected(_sender(payload, [1000, 2 * CHUNK], then=b"next"), (server, client)) as (r, w):
        got = np.empty(manifest.total, dtype=np.uint8)
        await receive_verified(r, w, got, manifest, idle=5)
        assert got.tobytes() == payload
        assert await r.readexactly(4) == b"next"


async def test_a_sender_that_stops_halfway_is_an_incomplete_read() -> None:
    flat, manifest = _model(4 << 20)

    async def half(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(flat.buffer.tobytes()[: 2 * CHUNK + 5])
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()

    async with _connected(half) as (r, w):
        with pytest.raises(asyncio.IncompleteReadError):
            await receive_verified(r, w, np.empty(manifest.total, dtype=np.uint8), manifest, idle=5)


async def test_a_sender_that_closed_before_the_model_is_read_is_an_incomplete_read_at_once() -> None:
    flat, manifest = _model(4 << 20)

    async def part(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(flat.buffer.tobytes()[: CHUNK + CHUNK // 2])
        await writer.drain()
        writer.close()

    async with _connected(part) as (r, w):
        await asyncio.sleep(0.2)  # the bytes and the end are in the stream before the model is read
        with pytest.raises(asyncio.IncompleteReadError):
            await receive_verified(r, w, np.empty(manifest.total, dtype=np.uint8), manifest, idle=10)


async def test_a_sender_that_goes_quiet_times_out() -> None:
    flat, manifest = _model(4 << 20)
    stop = asyncio.Event()

    async def stall(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(flat.buffer.tobytes()[:CHUNK])
        await writer.drain()
        await stop.wait()

    async with _connected(stall) as (r, w):
        with pytest.raises(TimeoutError):
            await receive_verified(r, w, np.empty(manifest.total, dtype=np.uint8), manifest, idle=0.3)
        stop.set()


async def test_bytes_other_than_the_manifests_are_named_by_chunk() -> None:
    flat, manifest = _model(4 << 20)
    payload = bytearray(flat.buffer.tobytes())
    payload[2 * CHUNK + 9] ^= 0xFF
    async with _connected(_sender(bytes(payload), [CHUNK // 2])) as (r, w):
        with pytest.raises(CodecError, match=r"chunks \[2\] do not match"):
            await receive_verified(r, w, np.empty(manifest.total, dtype=np.uint8), manifest, idle=5)
