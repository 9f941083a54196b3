"""Shared fixtures: real brokers on free loopback ports, started and stopped by PID."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from daemons.broker import BrokerSettings, ManagedBroker
from daemons.broker.mosquitto import find_mosquitto
from daemons.bus import Bus, BusConfig
from daemons.bus.config import BrokerAddress

MakeBus = Callable[..., AbstractAsyncContextManager[Bus]]


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep swci contexts, histories and logs of tests out of the user's home."""
    home = tmp_path_factory.mktemp("xdg")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / "state"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))


def _require_mosquitto() -> None:
    if find_mosquitto() is None:
        if os.environ.get("CI"):
            pytest.fail("mosquitto is not installed; .ci/run installs it with apt-get")
        pytest.skip("mosquitto is not installed")


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedBroker]:
    """One plain mosquitto for the session; tests isolate themselves by network name."""
    _require_mosquitto()
    broker = ManagedBroker(BrokerSettings(tmp_path_factory.mktemp("mosquitto")), "mosquitto")
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def fresh_mosquitto(tmp_path: Path) -> Iterator[ManagedBroker]:
    """A mosquitto of this test's own (for restart and kill tests)."""
    _require_mosquitto()
    broker = ManagedBroker(BrokerSettings(tmp_path / "broker"), "mosquitto")
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def amqtt_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedBroker]:
    """The amqtt fallback broker in its own process."""
    pytest.importorskip("amqtt")
    broker = ManagedBroker(BrokerSettings(tmp_path_factory.mktemp("amqtt")), "amqtt")
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def network() -> str:
    """A network name of this test's own, so tests sharing a broker never see each other."""
    return f"t{uuid.uuid4().hex[:12]}"


def bus_factory(address: BrokerAddress, network: str) -> MakeBus:
    """``make_bus(uid, role, **kwargs)`` opening a Bus on ``address`` in ``network``."""

    @asynccontextmanager
    async def make_bus(uid: str, role: str = "sl", **kwargs: object) -> AsyncIterator[Bus]:
        presence = kwargs.pop("presence", None)
        signer = kwargs.pop("signer", None)
        verifier = kwargs.pop("verifier", None)
        config = BusConfig(address, uid, role, network=network, **kwargs)  # type: ignore[arg-type]
        async with Bus(config, presence=presence, signer=signer, verifier=verifier) as bus:  # type: ignore[arg-type]
            yield bus

    return make_bus


@pytest.fixture
def make_bus(mosquitto: ManagedBroker, network: str) -> MakeBus:
    """Open buses on the session's mosquitto, in this test's network."""
    return bus_factory(mosquitto.address, network)
