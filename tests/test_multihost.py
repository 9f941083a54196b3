"""A swarm over several hosts (network namespaces): an SN host, two SWOP hosts with their own
certificates and SL nodes, and a swci host; every daemon on its host's address."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from daemons.bus.config import BrokerAddress
from daemons.identity import Identity, open_bus
from daemons.ledger_client import LedgerClient
from tests.multihost_setup import (
    DAEMON,
    RUNNER,
    SN_PORT,
    Pki,
    final_digests,
    start_sn,
    start_swop,
    swci_script,
    until,
    wait_for_line,
    write_profile,
)
from tests.netns import hosts_or_skip

pytestmark = [pytest.mark.multihost, pytest.mark.slow]
CONTRACT = "defaultbb.cqdb.sml.hpe"


async def _merged_round(ledger: LedgerClient) -> int:
    latest = (await ledger.query("contract.model", name=CONTRACT)).get("latest")
    return int(latest["round"]) if latest else 0


async def _wait_round(address: str, reader: Identity, number: int) -> None:
    """Until round ``number`` of the default contract is merged (read through the SN host's broker)."""
    async with open_bus(reader, BrokerAddress(address, SN_PORT), reader.uid, "swci", network="swarm") as bus:
        ledger = await LedgerClient.connect(bus, timeout=30)
        await until(lambda: _is_past(ledger, number), 120)


async def _is_past(ledger: LedgerClient, number: int) -> bool:
    return await _merged_round(ledger) >= number


async def _runner_state(address: str, reader: Identity) -> dict[str, Any]:
    async with open_bus(reader, BrokerAddress(address, SN_PORT), reader.uid, "swci", network="swarm") as bus:
        ledger = await LedgerClient.connect(bus, timeout=30)
        return dict(await ledger.query("taskrunner.status", name=RUNNER))


def test_a_swarm_across_hosts_with_their_own_certificates_rides_out_a_30_s_partition(tmp_path: Path) -> None:
    """Hosts: an SN, two SWOPs with two SL nodes each, a swci; each with its own certificates. The far
    SWOP host's link goes down for 30 s mid-training: the task keeps running, the far SLs and ML
    programs survive, register again and rejoin from the swarm's model; every node ends with the same
    final model. A host with a certificate from another CA is refused."""
    with hosts_or_skip() as net:
        sn_host, near, far, swci_host = (net.add(n) for n in ("sn", "near", "far", "swci"))
        pki = Pki(tmp_path / "pki")
        start_sn(sn_host, tmp_path, pki.issue("sn-1", "sn", sn_host.address))
        broker = f"mqtts://{sn_host.address}:{SN_PORT}"
        # long enough that the near SLs still train when the far host comes back
        env = {"MIN_PEERS": 2, "EPOCHS": 4, "BATCHES": 16, "SYNC_FREQ": 8, "SLEEP_PER_BATCH": 0.8}
        swops = {}
        for host, swop, sls in ((near, "swop-1", ("sl-1", "sl-2")), (far, "swop-2", ("sl-3", "sl-4"))):
            idents = [(sl, pki.issue(sl, "sl", host.address)) for sl in sls]
            profile = write_profile(tmp_path, swop, idents, env)
            ident = pki.issue(swop, "swop", host.address)
            swops[swop] = start_swop(host, tmp_path, swop, profile, broker, ident)
        for swop, proc in swops.items():
            wait_for_line(tmp_path / f"{swop}.out", "listening on taskrunner", proc)
        script = swci_script(tmp_path, sn_host.address, SN_PORT, 4)
        swci_id = pki.issue("swci-1", "swci", swci_host.address)
        argv = [sys.executable, "-m", "swci.main", "--init-script", str(script), *swci_id.args()]
        swci = swci_host.popen(argv, log=tmp_path / "swci.out")

        files = pki.issue("swci-2", "swci", net.gateway)
        reader = Identity.load(files.cert, files.key, files.capath, role="swci")
        asyncio.run(_wait_round(sn_host.address, reader, 2))
        far.link(up=False)
        asyncio.run(asyncio.sleep(30))
        assert asyncio.run(_runner_state(sn_host.address, reader))["state"] == "RUNNING"
        far.link(up=True)

        assert swci.wait(240) == 0, (tmp_path / "swci.out").read_text()[-3000:]
        assert asyncio.run(_runner_state(sn_host.address, reader))["state"] == "COMPLETE"
        digests = final_digests(tmp_path)
        assert sorted(digests) == ["sl-1", "sl-2", "sl-3", "sl-4"], digests
        assert len(set(digests.values())) == 1 and all(digests.values()), digests
        far_logs = "".join(p.read_text() for p in tmp_path.glob("swop-2-work/runs/run_tiny/*/sl.out"))
        assert "registering it again" in far_logs and "rejoined the swarm from model" in far_logs
        assert all(proc.poll() is None for proc in swops.values()), "a SWOP died of the partition"

        # every daemon talked over the test subnet: the SN's broker listens on its host's address only
        listening = sn_host.run(["ss", "-ltn"]).stdout
        assert f"{sn_host.address}:{SN_PORT}" in listening and f"127.0.0.1:{SN_PORT}" not in listening

        # a host whose certificate comes from another CA is refused by the broker, with a clear reason
        stranger = Pki(tmp_path / "other-pki").issue("swop-9", "swop", far.address)
        profile = write_profile(tmp_path / "stranger", "swop-9", [("sl-9", None)], env)
        refused = far.run(
            [*DAEMON, "swop", "--uid", "swop-9", "--profile", str(profile), "--broker", broker,
             "--work-dir", str(tmp_path / "stranger" / "work"), *stranger.args()],
            timeout=60,
        )  # fmt: skip
        assert refused.returncode != 0
        assert "certificate" in refused.stderr.lower() and "ca" in refused.stderr.lower(), refused.stderr[
            -2000:
        ]
