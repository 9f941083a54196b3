"""Mutual TLS, identity ACLs and signed envelopes against a real mosquitto."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgpack
import pytest

from certs import Signer, Verifier, client_context, init_swarm
from daemons.broker import BrokerSettings, BrokerTLS, ManagedBroker
from daemons.broker.mosquitto import find_mosquitto
from daemons.bus import Bus, BusConfig, BusConnectError, Request
from daemons.bus.config import BrokerAddress
from daemons.bus.session import NEEDS_CERTIFICATES, _describe, _is_fatal
from tests.conftest import eventually, open_and_close
from wire import encode_envelope, make_envelope


@dataclass
class Swarm:
    dir: Path
    ca: Path
    broker: ManagedBroker

    def config(self, uid: str, role: str, *, cert_dir: Path | None = None, network: str = "tls") -> BusConfig:
        d = cert_dir or self.dir
        ctx = client_context(d / f"{uid}-cert.pem", d / f"{uid}-key.pem", self.ca)
        return BusConfig(self.broker.address, uid, role, network=network, tls=ctx, connect_timeout=5)

    def bus(self, uid: str, role: str, **kwargs: object) -> Bus:
        signer = Signer.from_files(self.dir / f"{uid}-cert.pem", self.dir / f"{uid}-key.pem")
        return Bus(self.config(uid, role), signer=signer, verifier=Verifier.from_ca(self.ca), **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    if find_mosquitto() is None:
        pytest.skip("mosquitto is not installed")
    root = tmp_path_factory.mktemp("pki")
    init_swarm(root, sl=2)
    ca = root / "ca" / "ca-cert.pem"
    settings = BrokerSettings(
        root / "broker", tls=BrokerTLS(ca, root / "sn-1-cert.pem", root / "sn-1-key.pem")
    )
    broker = ManagedBroker(settings, "mosquitto")
    broker.start()
    yield Swarm(root, ca, broker)
    broker.stop()


async def reply_ok(request: Request) -> object:
    return {"hello": request.sender}


async def test_good_certificate_connects_and_signed_requests_work(swarm: Swarm) -> None:
    async with swarm.bus("sn-1", "sn") as server, swarm.bus("sl-1", "sl") as client:
        server.serve(reply_ok)
        assert await client.request("sn-1", "hi") == {"hello": "sl-1"}


async def test_no_client_certificate_is_refused_clearly(swarm: Swarm) -> None:
    ctx = client_context(None, None, swarm.ca)
    cfg = BusConfig(swarm.broker.address, "sl-1", "sl", network="tls", tls=ctx, connect_timeout=5)
    with pytest.raises(BusConnectError, match="requires a TLS client certificate"):
        async with Bus(cfg):
            pass


async def test_certificate_from_another_ca_is_refused_clearly(swarm: Swarm, tmp_path: Path) -> None:
    init_swarm(tmp_path, sl=1)
    other = client_context(tmp_path / "sl-1-cert.pem", tmp_path / "sl-1-key.pem", swarm.ca)
    cfg = BusConfig(swarm.broker.address, "sl-1", "sl", network="tls", tls=other, connect_timeout=5)
    with pytest.raises(BusConnectError, match="certificate"):
        async with Bus(cfg):
            pass


async def test_a_broker_of_the_list_that_refuses_our_certificates_leaves_the_next_one_its_turn(
    swarm: Swarm, mosquitto: ManagedBroker, network: str
) -> None:
    """A node of a cluster set up apart from the others (here one that wants client certificates from a
    client without any) refuses the first connection for good; the session goes on to the next broker of
    its list, where it ended at once with that refusal."""
    plain = f"mqtt://127.0.0.1:{swarm.broker.port},mqtt://127.0.0.1:{mosquitto.port}"
    async with Bus(BusConfig(BrokerAddress.parse(plain), "sl-1", "sl", network=network)) as bus:
        assert bus.broker.port == mosquitto.port
        await bus.publish(bus.topics.presence(bus.uid), b"here", timeout=10)


async def test_a_list_of_brokers_that_all_refuse_our_certificates_fails_without_waiting_its_time(
    swarm: Swarm, tmp_path: Path, network: str
) -> None:
    """Every broker of the list refuses for good: opening ends once each has (well inside the 2 x 60 s
    the list has), naming each one's reason."""
    second = ManagedBroker(BrokerSettings(tmp_path / "broker", tls=swarm.broker.settings.tls), "mosquitto")
    second.start()
    try:
        urls = [f"mqtt://127.0.0.1:{broker.port}" for broker in (swarm.broker, second)]
        brokers = BrokerAddress.parse(",".join(urls))
        config = BusConfig(brokers, "sl-1", "sl", network=network, connect_timeout=60)
        with pytest.raises(BusConnectError) as failed:
            await asyncio.wait_for(open_and_close(config), 50)
    finally:
        second.stop()
    text = str(failed.value)
    assert "cannot connect as 'sl-1' to any broker of the list" in text, text
    assert all(f"{url}: {NEEDS_CERTIFICATES}" in text for url in urls), text


def test_an_eof_as_the_tls_connection_opens_points_at_the_client_certificate() -> None:
    # what the client sees when the broker's "unknown ca" alert is lost as it closes (TLS 1.3)
    eof = "failed to receive on socket: EOF occurred in violation of protocol (_ssl.c:2427)"
    described = _describe(eof, tls=True)
    assert "client certificate" in described and eof in described
    assert _is_fatal(eof, described)  # another attempt would be refused the same way
    assert _describe(eof, tls=None) == eof  # without TLS of ours it says nothing more


async def test_broker_from_another_ca_is_not_trusted(swarm: Swarm, tmp_path: Path) -> None:
    init_swarm(tmp_path, sl=1)
    ctx = client_context(
        swarm.dir / "sl-1-cert.pem", swarm.dir / "sl-1-key.pem", tmp_path / "ca" / "ca-cert.pem"
    )
    cfg = BusConfig(swarm.broker.address, "sl-1", "sl", network="tls", tls=ctx, connect_timeout=5)
    with pytest.raises(BusConnectError, match="not trusted"):
        async with Bus(cfg):
            pass


async def test_an_identity_cannot_publish_on_another_identitys_topics(swarm: Swarm) -> None:
    async with swarm.bus("sn-1", "sn") as watcher, swarm.bus("sl-1", "sl") as intruder:
        victim_topic = watcher.topics.own("sl-2", "sl-2") + "/status"
        own_topic = watcher.topics.own("sl-1", "sl-1") + "/status"
        async with watcher.subscribe(victim_topic) as victim, watcher.subscribe(own_topic) as own:
            fake = intruder.encode("presence", {"state": "offline"})
            await intruder.publish(victim_topic, fake)  # the broker's ACL drops it
            await intruder.publish(own_topic, fake)  # allowed: its own namespace
            assert watcher.open(await asyncio.wait_for(own.get(), 5)).sender == "sl-1"
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(victim.get(), 1)


async def test_tampered_or_unsigned_envelopes_are_rejected(swarm: Swarm) -> None:
    async with swarm.bus("sn-1", "sn") as server, swarm.bus("sl-1", "sl") as client:
        rpc = server.serve(reply_ok)
        assert await client.request("sn-1", "hi") == {"hello": "sl-1"}  # the server is subscribed
        topic = client.topics.request("sl-1", "sn-1")
        good = msgpack.unpackb(client.encode("req:hi", {"n": 1}, reply_to="sl-1", corr="c1"))
        good["b"] = msgpack.packb({"n": 2})  # change the body after signing
        await client.publish(topic, msgpack.packb(good))
        unsigned = encode_envelope(
            make_envelope("req:hi", {}, sender="sl-1", role="sl", corr="c2", reply_to="sl-1")
        )
        await client.publish(topic, unsigned)
        assert await client.request("sn-1", "hi") == {"hello": "sl-1"}
        assert await eventually(lambda: rpc.rejected == 2), rpc.rejected
