"""The bus against the amqtt fallback broker (its own process): the essentials still work."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from daemons.broker import BrokerSettings, ManagedBroker
from daemons.bus.transfer import StateHolder, fetch_state
from tests.conftest import MakeBus, bus_factory
from tests.test_bus import echo
from wire.tensors import FlatState

pytestmark = pytest.mark.amqtt


@pytest.fixture
def amqtt_bus(amqtt_broker: ManagedBroker, network: str) -> MakeBus:
    return bus_factory(amqtt_broker.address, network)


async def test_request_reply_on_amqtt(amqtt_bus: MakeBus) -> None:
    async with amqtt_bus("sn-1", "sn") as server, amqtt_bus("swci-1", "swci") as client:
        server.serve(echo)
        replies = await asyncio.gather(*(client.request("sn-1", "n", {"i": i}) for i in range(20)))
        assert [r["body"]["i"] for r in replies] == list(range(20))


async def test_retained_presence_on_amqtt(amqtt_bus: MakeBus) -> None:
    async with amqtt_bus("sl-3", presence={"role": "sl"}), amqtt_bus("sn-1", "sn") as observer:
        async with observer.subscribe(observer.topics.presence("sl-3")) as sub:
            env = observer.open(await asyncio.wait_for(sub.get(), 5))
            assert env.body["state"] == "online"


async def test_state_transfer_on_amqtt(amqtt_bus: MakeBus) -> None:
    rng = np.random.default_rng(1)
    state = {f"w{i}": rng.standard_normal((500, 1000)).astype(np.float32) for i in range(4)}
    async with amqtt_bus("sl-1") as holder_bus, amqtt_bus("sl-2") as fetcher:
        holder = StateHolder(holder_bus)
        holder_bus.serve(holder.handle_fetch)
        manifest = await holder.add(FlatState.from_arrays(state))
        got = await fetch_state(fetcher, "sl-1", manifest.digest)
        for name, arr in state.items():
            np.testing.assert_array_equal(got.arrays()[name], arr)


async def test_reconnect_after_amqtt_restart(tmp_path: Path, network: str) -> None:
    pytest.importorskip("amqtt")
    broker = ManagedBroker(BrokerSettings(tmp_path), "amqtt")
    broker.start()
    try:
        make_bus = bus_factory(broker.address, network)
        async with make_bus("sn-1", "sn") as server, make_bus("swci-1", "swci") as client:
            server.serve(echo)
            assert (await client.request("sn-1", "before"))["method"] == "before"
            await asyncio.to_thread(broker.restart)
            assert (await client.request("sn-1", "after", timeout=30))["method"] == "after"
    finally:
        broker.stop()
