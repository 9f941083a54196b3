"""Bus benchmark: a 50 MB state dict through mosquitto vs raw loopback TCP; encode/decode vs memcpy.

Run: ``.venv/bin/python bench/bus.py``. Every ratio's baseline is measured in the same run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import (
    MB,
    ROOT,
    bench_parser,
    best_of,
    loopback_tcp_rate,
    machine,
    make_row,
    memcpy_rate,
    print_rows,
)
from daemons.broker import BrokerSettings, ManagedBroker
from daemons.bus import Bus, BusConfig, RemoteError
from daemons.bus.transfer import fetch_state
from wire.tensors import FlatState, Reassembler, iter_chunks, make_manifest

STATE_MB = 50
NETWORK = "bench"


def make_state(mb: int = STATE_MB) -> dict[str, np.ndarray]:
    """A ResNet-ish state dict of about ``mb`` megabytes of float32 with a few int buffers."""
    rng = np.random.default_rng(0)
    per = mb * MB // 4 // 10
    state = {f"layer{i}.weight": rng.standard_normal(per).astype(np.float32) for i in range(10)}
    state["bn.num_batches_tracked"] = np.array(7, dtype=np.int64)
    return state


HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    sys.path.insert(0, {root!r})
    from bench.bus import make_state
    from daemons.bus import Bus, BusConfig
    from daemons.bus.config import BrokerAddress
    from daemons.bus.transfer import StateHolder
    from wire.tensors import FlatState

    async def main():
        cfg = BusConfig(BrokerAddress("127.0.0.1", {port}), "holder", "sl", network={network!r})
        async with Bus(cfg) as bus:
            holder = StateHolder(bus)
            bus.serve(holder.handle_fetch)
            manifest = await holder.add(FlatState.from_arrays(make_state({mb})))
            print(manifest.digest.hex(), flush=True)
            await asyncio.Event().wait()

    asyncio.run(main())
    """
)


async def _fetch_rate(port: int, digest: bytes, nbytes: int, repeat: int) -> tuple[float, float]:
    from daemons.bus.config import BrokerAddress

    cfg = BusConfig(BrokerAddress("127.0.0.1", port), "fetcher", "sl", network=NETWORK)
    async with Bus(cfg) as bus:
        spare = None
        times = []
        for _ in range(repeat + 1):  # the first one warms buffers and the broker
            start = time.perf_counter()
            flat = await fetch_state(bus, "holder", digest, spare=spare)
            times.append(time.perf_counter() - start)
            spare = flat.buffer
        rtts = []
        for _ in range(50):
            start = time.perf_counter()
            with contextlib.suppress(RemoteError):
                await bus.request("holder", "fetch", {})  # answered with an error at once
            rtts.append(time.perf_counter() - start)
    return nbytes / min(times[1:]), float(np.median(rtts))


def _request_rtt_raw() -> float:
    """Median round trip of a 200-byte message over raw loopback TCP (the control baseline)."""
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn, _ = server.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload, rtts = b"x" * 200, []
    for _ in range(200):
        start = time.perf_counter()
        client.sendall(payload)
        conn.sendall(conn.recv(200))
        client.recv(200)
        rtts.append(time.perf_counter() - start)
    for sock in (client, conn, server):
        sock.close()
    return float(np.median(rtts))


def transfer_rows(repeat: int = 3) -> list[dict[str, Any]]:
    """Throughput of a pulled 50 MB transfer holder → mosquitto → fetcher (separate processes)."""
    nbytes = FlatState.from_arrays(make_state()).total
    tcp = loopback_tcp_rate(nbytes)
    with tempfile.TemporaryDirectory() as tmp:
        broker = ManagedBroker(BrokerSettings(Path(tmp)), "mosquitto")
        broker.start()
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                HOLDER.format(root=str(ROOT), port=broker.port, network=NETWORK, mb=STATE_MB),
            ],
            stdout=subprocess.PIPE,
        )
        try:
            assert holder.stdout is not None
            digest = bytes.fromhex(holder.stdout.readline().decode().strip())
            rate, rtt = asyncio.run(_fetch_rate(broker.port, digest, nbytes, repeat))
        finally:
            holder.terminate()
            try:
                holder.wait(10)
            except subprocess.TimeoutExpired:
                holder.kill()
                holder.wait()
            broker.stop()
    raw_rtt = _request_rtt_raw()
    return [
        make_row(
            f"{STATE_MB} MB state dict holder→mosquitto→fetcher", rate / MB, "MB/s",
            "raw loopback TCP (sendall→recv_into)", tcp / MB, target="ratio >= 0.15",
            note="pulled transfer between 2 processes: 2 MiB chunks, BLAKE3 verified, best of 3",
        ),
        make_row(
            "control request/reply round trip", rtt * 1000, "ms", "raw TCP ping-pong (200 B)", raw_rtt * 1000,
            note="req:fetch answered at once with an error, through mosquitto; median of 50",
        ),
    ]  # fmt: skip


def codec_rows() -> list[dict[str, Any]]:
    """Encode (flatten + hash + chunk) and decode (reassemble + verify) vs memcpy of the same bytes."""
    state = make_state()
    flat = FlatState.from_arrays(state)
    nbytes = flat.total
    memcpy = memcpy_rate(nbytes)

    def encode() -> list[bytes]:
        f = FlatState.from_arrays(state, reuse=flat)
        return list(iter_chunks(f, make_manifest(f, "t1")))

    chunks = encode()
    manifest = make_manifest(flat, "t1")
    spare = np.empty(nbytes, dtype=np.uint8)

    def decode() -> None:
        r = Reassembler("t1", spare=spare)
        r.set_manifest(manifest)
        for chunk in chunks:
            r.add_chunk(chunk)
        r.finish()

    enc = nbytes / best_of(encode)
    dec = nbytes / best_of(decode)
    base = "memcpy (np.copyto) of the same bytes"
    return [
        make_row(
            f"encode {STATE_MB} MB (flatten+BLAKE3+chunk)", enc / MB, "MB/s", base, memcpy / MB,
            note="best of 5, in process",
        ),
        make_row(
            f"decode {STATE_MB} MB (reassemble+verify)", dec / MB, "MB/s", base, memcpy / MB,
            note="best of 5, in process",
        ),
    ]  # fmt: skip


def run() -> list[dict[str, Any]]:
    """Every row of this benchmark."""
    return transfer_rows() + codec_rows()


def main() -> None:
    """Print the table (and the machine it ran on)."""
    bench_parser(__doc__).parse_args()
    print_rows("bus and codec", run())
    print(f"\nmachine: {json.dumps(machine())}")


if __name__ == "__main__":
    main()
