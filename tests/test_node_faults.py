"""Faults of one node against real daemons: a node cut off long enough to be marked offline re-joins."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from daemons.bus import Bus, BusConfig
from daemons.ledger_client import LedgerClient
from tests.conftest import RunningSN
from tests.swarm_helpers import RunningSL, start_sl, wait_for

pytestmark = pytest.mark.slow
CONTRACT = "defaultbb.cqdb.sml.hpe"


async def _member_status(sn: RunningSN, uid: str) -> str:
    async with Bus(BusConfig(sn.address, "swci-test", "swci")) as bus:
        ledger = await LedgerClient.connect(bus, timeout=10)
        members = await ledger.query("contract.perfdata", name=CONTRACT)
    return next((str(m["status"]) for m in members if m["uid"] == uid), "")


def test_a_node_cut_off_until_the_ledger_drops_it_joins_again_and_finishes(
    sn: RunningSN, tmp_path: Path
) -> None:
    """SIGSTOP of an SL (its ML program waits on it): its keepalive lapses, the broker sends its will, the
    SN marks it offline and it leaves the contract; after SIGCONT it registers and joins again. With
    minPeers 3 of 3 the others wait for it, so it surely takes part again."""

    def start(i: int, keepalive: str) -> RunningSL:
        env = {"SL_WAIT_FOR_FULL_QUORUM_SECONDS": "1", "SWARM_KEEPALIVE": keepalive}
        return start_sl(
            sn, f"sl-{i}", tmp_path, sl_env=env, SEED=i, MIN_PEERS=3, EPOCHS=2, SLEEP_PER_BATCH=0.1
        )

    nodes = [start(1, "10"), start(2, "10")]
    victim = start(3, "2")  # its broker drops it after 3 s of silence (1.5 keepalives)
    try:
        wait_for(lambda: "Finished Swarm merging round" in victim.output(), 60, "a first merged round")
        os.kill(victim.process.pid, signal.SIGSTOP)  # the SL alone: its ML program then waits on it
        try:
            wait_for(lambda: asyncio.run(_member_status(sn, "sl-3")) == "left", 30, "sl-3 to leave")
        finally:
            os.kill(victim.process.pid, signal.SIGCONT)
        codes = [node.wait(90) for node in (*nodes, victim)]
        assert codes == [0, 0, 0], [n.output()[-2000:] for n in (*nodes, victim)]
        assert "the ledger lost this node" in victim.output()
        assert len({n.final_digest() for n in (*nodes, victim)}) == 1 and victim.final_digest()
    finally:
        for node in (*nodes, victim):
            node.kill()
