"""A swarm over several hosts (network namespaces): an SN host, two SWOP hosts with their own
certificates and SL nodes, and a swci host; every daemon on its host's address."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any

import pytest

from daemons.bus import Bus, BusConfig
from daemons.bus.config import BrokerAddress
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
    wait_for_line,
    write_profile,
)
from tests.netns import hosts_or_skip

pytestmark = [pytest.mark.multihost, pytest.mark.slow]
CONTRACT = "defaultbb.cqdb.sml.hpe"


def test_a_swarm_trains_across_hosts_with_their_own_certificates(tmp_path: Path) -> None:
    with hosts_or_skip() as net:
        sn_host, swop1_host, swop2_host, swci_host = (net.add(n) for n in ("sn", "swop1", "swop2", "swci"))
        pki = Pki(tmp_path / "pki")
        start_sn(sn_host, tmp_path, pki.issue("sn-1", "sn", sn_host.address))
        broker = f"mqtts://{sn_host.address}:{SN_PORT}"
        env = {"MIN_PEERS": 4, "EPOCHS": 2, "BATCHES": 8}
        for host, swop, sls in (
            (swop1_host, "swop-1", ("sl-1", "sl-2")),
            (swop2_host, "swop-2", ("sl-3", "sl-4")),
        ):
            idents = [(sl, pki.issue(sl, "sl", host.address)) for sl in sls]
            profile = write_profile(tmp_path, swop, idents, env)
            proc = start_swop(host, tmp_path, swop, profile, broker, pki.issue(swop, "swop", host.address))
            wait_for_line(tmp_path / f"{swop}.out", "listening on taskrunner", proc)

        script = swci_script(tmp_path, sn_host.address, SN_PORT, 4)
        swci = pki.issue("swci-1", "swci", swci_host.address)
        done = swci_host.run(
            [sys.executable, "-m", "swci.main", "--init-script", str(script), *swci.args()], 240
        )
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        assert "COMPLETE" in done.stdout, done.stdout[-3000:]
        digests = final_digests(tmp_path)
        assert sorted(digests) == ["sl-1", "sl-2", "sl-3", "sl-4"], digests
        assert len(set(digests.values())) == 1 and all(digests.values()), digests

        # every daemon talked over the test subnet: the SN's broker listens on its host's address only
        listening = sn_host.run(["ss", "-ltn"]).stdout
        assert f"{sn_host.address}:{SN_PORT}" in listening and f"127.0.0.1:{SN_PORT}" not in listening

        # a host whose certificate comes from another CA is refused by the broker, with a clear reason
        stranger = Pki(tmp_path / "other-pki").issue("swop-9", "swop", swop2_host.address)
        profile = write_profile(tmp_path / "stranger", "swop-9", [("sl-9", None)], env)
        refused = swop2_host.run(
            [*DAEMON, "swop", "--uid", "swop-9", "--profile", str(profile), "--broker", broker,
             "--work-dir", str(tmp_path / "stranger" / "work"), *stranger.args()],
            timeout=60,
        )  # fmt: skip
        assert refused.returncode != 0
        assert "certificate" in refused.stderr.lower() and "ca" in refused.stderr.lower(), refused.stderr[
            -2000:
        ]


async def _wait_round(address: str, number: int, timeout: float = 120) -> None:
    """Until round ``number`` of the default contract is merged (read through the SN host's broker)."""
    async with Bus(BusConfig(BrokerAddress(address, SN_PORT), "test-watch", "swci")) as bus:
        ledger = await LedgerClient.connect(bus, timeout=30)
        async with asyncio.timeout(timeout), ledger.watch("round", CONTRACT) as watch:
            while (await ledger.query("contract.model", name=CONTRACT)).get("latest") is None or (
                (await ledger.query("contract.model", name=CONTRACT))["latest"]["round"] < number
            ):
                with contextlib.suppress(TimeoutError):
                    await watch.next(timeout=2)


async def _runner_state(address: str) -> dict[str, Any]:
    async with Bus(BusConfig(BrokerAddress(address, SN_PORT), "test-read", "swci")) as bus:
        ledger = await LedgerClient.connect(bus, timeout=30)
        return dict(await ledger.query("taskrunner.status", name=RUNNER))


def test_a_swop_host_cut_off_for_30_s_rejoins_and_the_task_completes(tmp_path: Path) -> None:
    with hosts_or_skip() as net:
        sn_host, near, far, swci_host = (net.add(n) for n in ("sn", "near", "far", "swci"))
        start_sn(sn_host, tmp_path, None)
        broker = f"mqtt://{sn_host.address}:{SN_PORT}"
        # long enough that the near SLs still train when the far host comes back
        env = {"MIN_PEERS": 2, "EPOCHS": 4, "BATCHES": 16, "SYNC_FREQ": 8, "SLEEP_PER_BATCH": 0.8}
        swops = {}
        for host, swop, sls in ((near, "swop-1", ("sl-1", "sl-2")), (far, "swop-2", ("sl-3", "sl-4"))):
            profile = write_profile(tmp_path, swop, [(sl, None) for sl in sls], env)
            swops[swop] = start_swop(host, tmp_path, swop, profile, broker, None)
            wait_for_line(tmp_path / f"{swop}.out", "listening on taskrunner", swops[swop])
        script = swci_script(tmp_path, sn_host.address, SN_PORT, 4)
        swci = swci_host.popen(
            [sys.executable, "-m", "swci.main", "--init-script", str(script)], log=tmp_path / "swci.out"
        )

        asyncio.run(_wait_round(sn_host.address, 2))
        far.link(up=False)
        asyncio.run(asyncio.sleep(30))
        assert asyncio.run(_runner_state(sn_host.address))["state"] == "RUNNING"
        far.link(up=True)

        assert swci.wait(240) == 0, (tmp_path / "swci.out").read_text()[-3000:]
        assert asyncio.run(_runner_state(sn_host.address))["state"] == "COMPLETE"
        digests = final_digests(tmp_path)
        assert sorted(digests) == ["sl-1", "sl-2", "sl-3", "sl-4"], digests
        assert len(set(digests.values())) == 1 and all(digests.values()), digests
        far_logs = "".join(p.read_text() for p in tmp_path.glob("swop-2-work/runs/run_tiny/*/sl.out"))
        assert "registering it again" in far_logs and "rejoined the swarm from model" in far_logs
        assert all(proc.poll() is None for proc in swops.values()), "a SWOP died of the partition"
