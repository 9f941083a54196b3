"""No SWOP, SL or ML program dies of an SN (and its broker) going away: they log, back off and retry,
and a SWOP enrolls again on an SN that comes back with a fresh ledger."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from daemons.bus import Bus, BusConfig
from daemons.ledger_client import LedgerClient, Patience
from tests.conftest import RunningSN, start_sn
from tests.multihost_setup import until
from tests.swarm_helpers import start_swop, write_swarm_setup
from tests.test_swarm_swop import RUNNER, digests, register_task, wait_enrolled

pytestmark = pytest.mark.slow
CONTRACT = "defaultbb.cqdb.sml.hpe"


async def _start_task(sn: RunningSN, work: Path) -> None:
    async with Bus(BusConfig(sn.address, "swci-test", "swci")) as bus:
        ledger = await LedgerClient.connect(bus, timeout=30)
        await wait_enrolled(ledger, 1)
        task = await register_task(ledger, work / "run_tiny.yaml")
        await ledger.submit("taskrunner.reset", {"taskrunner": RUNNER})
        await ledger.submit("taskrunner.assign", {"task": task, "taskrunner": RUNNER, "peers": 2})
        await until(lambda: _latest(ledger), 120)


async def _latest(ledger: LedgerClient) -> Any:
    return (await ledger.query("contract.model", name=CONTRACT)).get("latest")


async def _finished(sn: RunningSN) -> dict[str, Any]:
    async with Bus(BusConfig(sn.address, "swci-test", "swci")) as bus:
        ledger = await LedgerClient.connect(bus, timeout=60)
        async with ledger.watch("taskrunner", RUNNER) as watch:
            while True:
                view = await ledger.query("taskrunner.status", name=RUNNER)
                if view["state"] in ("COMPLETE", "ERROR"):
                    return dict(view)
                with contextlib.suppress(TimeoutError):
                    await watch.next(timeout=5)


async def _enrolled_again(sn: RunningSN) -> list[dict[str, Any]]:
    async with Bus(BusConfig(sn.address, "swci-test", "swci")) as bus:
        ledger = await LedgerClient.connect(bus, timeout=30)
        return list(await until(lambda: ledger.query("taskrunner.peers", name=RUNNER), 90))


def test_training_survives_the_sn_gone_35_s_and_a_swop_enrolls_on_a_fresh_ledger(tmp_path: Path) -> None:
    sn = start_sn(tmp_path / "sn")
    port = ["--sn-api-port", str(sn.port)]
    profile = write_swarm_setup(
        tmp_path, 2, {"MIN_PEERS": 2, "EPOCHS": 2, "BATCHES": 8, "SLEEP_PER_BATCH": 0.3}
    )
    swop = start_swop(sn, profile, tmp_path)
    try:
        asyncio.run(_start_task(sn, tmp_path))
        sn.stop(signal.SIGKILL)  # the SN and its broker: longer than the old 30 s request timeout
        time.sleep(35)
        sn = start_sn(tmp_path / "sn", extra=port)
        status = asyncio.run(_finished(sn))
        assert status["state"] == "COMPLETE", status
        found = digests(tmp_path)
        assert len(found) == 2 and len(set(found)) == 1 and found[0], found
        out = (tmp_path / "swop.out").read_text()
        assert swop.poll() is None, out[-3000:]
        assert "retrying" in out

        sn.stop()  # replaced by an SN with a fresh ledger: the SWOP finds itself missing and enrolls
        sn = start_sn(tmp_path / "sn-fresh", extra=port)
        peers = asyncio.run(_enrolled_again(sn))
        assert [p["uid"] for p in peers] == ["swop-1"]
        assert "registering it again" in (tmp_path / "swop.out").read_text()
    finally:
        swop.send_signal(signal.SIGTERM)
        assert swop.wait(30) == 0
        sn.stop()


def test_patience_comes_from_the_environment_and_bad_values_say_what_is_wrong() -> None:
    assert Patience.from_env({}).deadline == 300
    assert Patience.from_env({"SWARM_SN_DEADLINE": "600"}).deadline == 600
    assert Patience.from_env({"SWARM_SN_DEADLINE": "2"}).attempt == 2
    with pytest.raises(ValueError, match="SWARM_SN_DEADLINE='soon' is not a number"):
        Patience.from_env({"SWARM_SN_DEADLINE": "soon"})
    with pytest.raises(ValueError, match="must be more than 0"):
        Patience.from_env({"SWARM_SN_DEADLINE": "-1"})
    delays = [Patience().backoff(n) for n in range(1, 12)]
    assert all(0 < d <= Patience().backoff_cap for d in delays)
    # an SN that says a failover is under way is asked again within a second, however many times it said so
    assert all(0 < Patience().backoff(n, answered=True) <= 1.0 for n in range(1, 12))
