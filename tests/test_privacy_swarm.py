"""Differential privacy end to end: two real SLs train with ``dpNoiseMultiplier``; the swarm still ends
with one model, and PERFDATA reports each site's epsilon as the accountant computes it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from daemons.bus import Bus, BusConfig
from daemons.ledger_client import LedgerClient
from daemons.sl.privacy.accountant import GaussianAccountant
from tests.conftest import RunningSN
from tests.swarm_helpers import start_sl

pytestmark = pytest.mark.slow


async def _perfdata(sn: RunningSN) -> list[dict[str, Any]]:
    async with Bus(BusConfig(sn.address, "swci-perf", "swci")) as bus:
        ledger = await LedgerClient.connect(bus, timeout=10)
        return list(await ledger.query("contract.perfdata", name="defaultbb.cqdb.sml.hpe"))


@pytest.mark.parametrize("overlap", ["", "true"], ids=["blocking", "overlapped"])
def test_two_sites_under_dp_finish_together_and_report_epsilon(
    sn: RunningSN, tmp_path: Path, overlap: str
) -> None:
    dp: dict[str, object] = {"DP_NOISE": 2.0, "DP_CLIP": 0.5, "MIN_PEERS": 2, "EPOCHS": 1, "BATCHES": 8}
    dp |= {"SYNC_FREQ": 4, "SWARM_OVERLAP_SYNC": overlap}
    quick = {"SL_WAIT_FOR_FULL_QUORUM_SECONDS": "1"}
    nodes = [
        start_sl(sn, f"sl-{i}", tmp_path, sl_env=quick, sl_args=["--linger", "2"], SEED=i, **dp)
        for i in (1, 2)
    ]
    assert [n.wait() for n in nodes] == [0, 0], [n.output()[-2000:] for n in nodes]
    assert nodes[0].final_digest() == nodes[1].final_digest() is not None
    assert all(("taken in while training went on" in n.output()) == bool(overlap) for n in nodes)
    rows = asyncio.run(_perfdata(sn))
    assert len(rows) == 2
    # 8 batches, a sync every 4 and the final check-in: each site released 2 or 3 noised updates
    possible = {}
    for releases in range(1, 6):
        acc = GaussianAccountant(noise_multiplier=2.0, delta=1e-5)
        acc.step(releases)
        possible[releases] = acc.epsilon
    for row in rows:
        assert row["epsilon"] > 0, row
        assert any(row["epsilon"] == pytest.approx(eps, rel=1e-12) for eps in possible.values()), row


@pytest.mark.parametrize("overlap", ["", "true"], ids=["blocking", "overlapped"])
def test_three_sites_under_secure_aggregation_end_with_one_model(
    sn: RunningSN, tmp_path: Path, overlap: str
) -> None:
    quick = {"SL_WAIT_FOR_FULL_QUORUM_SECONDS": "1"}
    settings = {
        "SECURE": 1,
        "MIN_PEERS": 3,
        "EPOCHS": 1,
        "BATCHES": 8,
        "SYNC_FREQ": 4,
        "SWARM_OVERLAP_SYNC": overlap,
    }
    nodes = [
        start_sl(sn, f"sl-{i}", tmp_path, sl_env=quick, sl_args=["--linger", "2"], SEED=i, **settings)
        for i in (1, 2, 3)
    ]
    assert [n.wait() for n in nodes] == [0, 0, 0], [n.output()[-2000:] for n in nodes]
    assert len({n.final_digest() for n in nodes} - {None}) == 1
    assert all(("taken in while training went on" in n.output()) == bool(overlap) for n in nodes)
    logs = "".join(n.output() for n in nodes)
    assert "unmasked the sum of 3 masked models" in logs, logs[-3000:]
