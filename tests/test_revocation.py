"""``REVOKE IDENTITY`` beyond the ledger: the managed mosquitto and every node's bus refuse the identity.

mosquitto 2.0.11, as measured here: a reloaded ACL (SIGHUP) applies to live connections too, so a
revoked identity that stays connected can neither publish nor receive; a new connection of it is
accepted by TLS but can do nothing either. The SN keeps that ACL in step with the ledger (also across
broker and SN restarts); the SN's bus and every SL's bus drop the identity's messages, which is what
protects a swarm on a broker that does not refuse it (no TLS, or an external broker).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiomqtt
import pytest

from certs import init_swarm
from daemons.broker import BrokerSettings, BrokerTLS, ManagedBroker
from daemons.broker.mosquitto import render_acl
from daemons.bus import Bus, BusConfig, BusError, RemoteError, RequestTimeout
from daemons.bus.config import BrokerAddress
from daemons.identity import Identity, open_bus
from daemons.ledger_client import LedgerClient, find_sn
from daemons.revocations import follow_revocations
from tests.conftest import RunningSN, eventually, start_sn
from tests.ports import restartable_port
from tests.swarm_helpers import start_sl
from tests.test_ledger_machine import Sim

pytestmark = pytest.mark.timeout(90)

SN = "sn-1"
NET = "swarm"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    init_swarm(root, sl=3)
    return root


def identity(pki: Path, cn: str) -> Identity:
    return Identity.load(pki / f"{cn}-cert.pem", pki / f"{cn}-key.pem", pki / "ca" / "capath")


def test_the_ledger_refuses_every_transaction_of_a_revoked_identity() -> None:
    sim = Sim()
    sim.register("sl-3")
    sim.ok("identity.revoke", "swci-1", {"identity": "sl-3", "reason": "lost laptop"})
    reason = sim.no("node.register", "sl-3", {"host": "h"})
    assert reason == "identity 'sl-3' was revoked by swci-1: lost laptop; it is refused"
    assert "already revoked" in sim.no("identity.revoke", "swci-1", {"identity": "sl-3"})


def test_the_acl_denies_revoked_identities_everything() -> None:
    assert "user" not in render_acl()
    acl = render_acl({"sl-3", "sl-1"})
    assert acl.endswith("user sl-1\ntopic deny #\nuser sl-3\ntopic deny #\n")
    assert acl.startswith(render_acl())  # the patterns of everyone else are unchanged
    with pytest.raises(ValueError, match="revoked identity"):
        render_acl({"sl-1\npattern readwrite #"})


# --- mosquitto on its own ----------------------------------------------------------------------------


@pytest.fixture
def tls_broker(pki: Path, tmp_path: Path) -> Iterator[ManagedBroker]:
    sn = identity(pki, "sn-1")
    tls = BrokerTLS(sn.ca_file(), sn.cert, sn.key)
    settings = BrokerSettings(tmp_path / "broker", port=restartable_port(), tls=tls)  # restarted below
    broker = ManagedBroker(settings, "mosquitto")
    broker.start()
    yield broker
    broker.stop()


@asynccontextmanager
async def raw_client(
    broker: ManagedBroker, context: ssl.SSLContext, name: str
) -> AsyncIterator[aiomqtt.Client]:
    client = aiomqtt.Client(
        "127.0.0.1", broker.port, identifier=name, tls_context=context, protocol=aiomqtt.ProtocolVersion.V311
    )
    async with client:
        yield client


async def test_mosquitto_applies_a_reloaded_acl_to_live_and_new_connections(
    tls_broker: ManagedBroker, pki: Path
) -> None:
    victim_topic, honest_topic = _topic("sl-1"), _topic("sl-2")
    async with (
        raw_client(tls_broker, identity(pki, "sl-1").tls(), "victim") as victim,
        raw_client(tls_broker, identity(pki, "sl-2").tls(), "honest") as honest,
        raw_client(tls_broker, identity(pki, "swop-1").tls(), "watcher") as watcher,
    ):
        await watcher.subscribe(f"swarm/v1/{NET}/nodes/#", qos=1)
        await victim.subscribe(honest_topic, qos=1)
        await victim.publish(victim_topic, b"before", qos=1)
        await honest.publish(honest_topic, b"hello", qos=1)
        assert await eventually(lambda: len(victim.messages) == 1)
        seen = [bytes(m.payload) async for m in _take(watcher, 2)]
        assert seen == [b"before", b"hello"]

        assert tls_broker.refuse(frozenset({"sl-1"}))
        # mosquitto reloads its ACL on SIGHUP, soon: from then on what the live victim publishes is dropped
        # (mosquitto handles packets in order, and acknowledged the victim's publish before the marker)
        assert await eventually_refused(victim, honest, watcher)
        # and it receives nothing: a marker would reach it before the ack of its next publish
        received = len(victim.messages)
        assert await _arrivals(victim, honest, watcher) == [b"marker"]
        await victim.publish(victim_topic, b"again", qos=1)
        assert len(victim.messages) == received
        # a new connection of the identity is let in by TLS, and can do nothing either
        async with raw_client(tls_broker, identity(pki, "sl-1").tls(), "victim-2") as second:
            assert await _arrivals(second, honest, watcher) == [b"marker"]
    # a restarted broker still refuses it
    tls_broker.restart()
    assert "user sl-1\ntopic deny #" in (tls_broker.settings.workdir / "acl").read_text()


async def eventually_refused(victim: aiomqtt.Client, honest: aiomqtt.Client, watcher: aiomqtt.Client) -> bool:
    """Until mosquitto has reloaded its ACL, the victim's probes still arrive."""
    for _ in range(500):
        if await _arrivals(victim, honest, watcher) == [b"marker"]:
            return True
    return False


async def _arrivals(victim: aiomqtt.Client, honest: aiomqtt.Client, watcher: aiomqtt.Client) -> list[bytes]:
    """What the watcher gets of a probe of the victim followed by a marker of the honest node."""
    await victim.publish(_topic("sl-1"), b"probe", qos=1)
    await honest.publish(_topic("sl-2"), b"marker", qos=1)
    arrived = []
    async for message in _take(watcher, 2):
        arrived.append(bytes(message.payload))
        if arrived[-1] == b"marker":
            break
    return arrived


def _topic(cn: str) -> str:
    return f"swarm/v1/{NET}/nodes/{cn}/{cn}/data"


async def _take(client: aiomqtt.Client, count: int) -> AsyncIterator[aiomqtt.Message]:
    async with asyncio.timeout(10):
        async for message in client.messages:
            yield message
            count -= 1
            if count == 0:
                return


# --- through the SN -----------------------------------------------------------------------------------


@pytest.fixture
def secure_sn(tmp_path: Path, pki: Path) -> Iterator[RunningSN]:
    node = start_sn(tmp_path / "sn", extra=_sn_identity(pki))
    yield node
    node.stop()


def _sn_identity(pki: Path) -> list[str]:
    files = ["--cert", str(pki / "sn-1-cert.pem"), "--key", str(pki / "sn-1-key.pem")]
    return [*files, "--capath", str(pki / "ca" / "capath")]


def _secure(sn: RunningSN, pki: Path, cn: str, uid: str | None = None) -> Bus:
    ident = identity(pki, cn)
    address = BrokerAddress("127.0.0.1", sn.port, tls=True)
    presence = {"role": ident.role, "host": "test"}
    return open_bus(ident, address, uid or cn, ident.role, network=NET, presence=presence)


async def _following(bus: Bus) -> set[str]:
    """The bus drops what the ledger revokes, as an SL's bus does."""
    refused: set[str] = set()
    bus.refused = refused
    bus.spawn(follow_revocations(LedgerClient(bus, SN), refused), "revocations")
    return refused


async def test_revoke_identity_cuts_the_identity_off_the_broker_and_the_swarm(
    secure_sn: RunningSN, pki: Path
) -> None:
    async with (
        _secure(secure_sn, pki, "sl-3", "sl-revoked") as victim,
        _secure(secure_sn, pki, "sl-1") as honest,
        _secure(secure_sn, pki, "swci-1") as swci,
    ):
        await LedgerClient(victim, SN).submit("node.register", {"host": "h", "session": victim.session})
        refused = await _following(honest)
        await LedgerClient(swci, SN).submit("identity.revoke", {"identity": "sl-3", "reason": "lost laptop"})
        reloaded = "broker refuses the revoked identities sl-3"  # logged once the SIGHUP is sent
        assert await eventually(lambda: reloaded in secure_sn.log(), 10), secure_sn.log()
        assert await eventually(lambda: "sl-3" in refused)
        assert "user sl-3\ntopic deny #" in (secure_sn.data_dir / "broker" / "acl").read_text()
        # the live connection stays open but reaches nobody, not even the SN
        with pytest.raises(RequestTimeout):
            await LedgerClient(victim, SN, timeout=2).status()
        assert (await LedgerClient(honest, SN).status())["uid"] == SN
    # a new connection is accepted by TLS, and hears nothing: it cannot even find the SN
    async with _secure(secure_sn, pki, "sl-3", "sl-back") as back:
        with pytest.raises(BusError, match="no SN is online"):
            await find_sn(back, timeout=2)
    # the SN's next start refuses it from the first moment, from the ledger
    secure_sn.stop()
    (secure_sn.data_dir / "broker" / "acl").unlink()
    restarted = start_sn(secure_sn.data_dir, extra=[*_sn_identity(pki), "--sn-api-port", str(secure_sn.port)])
    try:
        assert "user sl-3\ntopic deny #" in (secure_sn.data_dir / "broker" / "acl").read_text()
    finally:
        restarted.stop()


@asynccontextmanager
async def _plain(sn: RunningSN, uid: str, role: str) -> AsyncIterator[Bus]:
    config = BusConfig(sn.address, uid, role, network=NET)
    async with Bus(config, presence={"role": role, "host": "test"}) as bus:
        yield bus


async def test_on_a_broker_that_lets_it_in_the_sn_and_the_sls_drop_its_messages(sn: RunningSN) -> None:
    async with (
        _plain(sn, "sl-3", "sl") as victim,
        _plain(sn, "sl-1", "sl") as honest,
        _plain(sn, "swci-1", "swci") as swci,
    ):
        await LedgerClient(victim, SN).submit("node.register", {"host": "h", "session": victim.session})
        refused = await _following(honest)
        await LedgerClient(swci, SN).submit("identity.revoke", {"identity": "sl-3"})
        assert await eventually(lambda: "sl-3" in refused)
        async with honest.subscribe(honest.topics.node("+") + "/note") as notes:
            await victim.send(victim.topics.node("sl-3") + "/note", "note", {"n": 1})
            await swci.send(swci.topics.node("swci-1") + "/note", "note", {"n": 2})
            async with asyncio.timeout(10):
                first = honest.open(await notes.get())
            assert (first.sender, first.body) == ("swci-1", {"n": 2})
        with pytest.raises(RequestTimeout):
            await LedgerClient(victim, SN, timeout=2).status()
        assert "drops the messages of revoked identity sl-3" in sn.log()
        assert await LedgerClient(swci, SN).status()


async def test_a_running_sl_follows_the_revocations_of_the_ledger(sn: RunningSN, tmp_path: Path) -> None:
    sl = start_sl(sn, "sl-1", tmp_path, MIN_PEERS=2)  # waits for a second peer that never comes
    try:
        async with _plain(sn, "swci-1", "swci") as swci:
            ledger = LedgerClient(swci, SN)
            assert await _registered(ledger, "sl-1"), sl.output()
            await ledger.submit("identity.revoke", {"identity": "sl-3"})
            assert await eventually(lambda: "identities revoked: sl-3" in sl.output(), 20), sl.output()
    finally:
        sl.kill()


async def _registered(ledger: LedgerClient, uid: str) -> bool:
    for _ in range(600):
        with contextlib.suppress(RemoteError):
            if (await ledger.query("node", uid=uid))["online"]:
                return True
        await asyncio.sleep(0.1)
    return False
