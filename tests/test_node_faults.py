"""Faults of one node against real daemons: a node whose certificate expires leaves saying so. (A node
cut off and back re-joins: ``tests/test_multihost.py``'s partition and ``bench/faults_nodes.py``.)"""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

import pytest

from certs import init_swarm, issue_identity
from daemons.identity import Identity, open_bus
from daemons.ledger_client import LedgerClient
from tests.conftest import RunningSN, start_sn
from tests.swarm_helpers import RunningSL, start_sl

pytestmark = pytest.mark.slow
CONTRACT = "defaultbb.cqdb.sml.hpe"


async def _member_status(sn: RunningSN, uid: str, swci: Identity) -> str:
    """``uid``'s status in the default contract, read as ``swci``."""
    async with open_bus(swci, sn.address, swci.uid, "swci", network="swarm") as bus:
        ledger = await LedgerClient.connect(bus, timeout=10)
        members = await ledger.query("contract.perfdata", name=CONTRACT)
    return next((str(m["status"]) for m in members if m["uid"] == uid), "")


def test_a_node_whose_certificate_expires_leaves_saying_so_and_the_others_finish(tmp_path: Path) -> None:
    """Mutual TLS and signed messages: sl-2's certificate expires mid-training. It leaves just before
    (afterwards the SN could not believe even its offline will), its ML program exits non-zero saying
    why, the ledger counts it as gone and sl-1 finishes."""
    pki = tmp_path / "pki"
    init_swarm(pki, sl=2)
    valid_from = dt.datetime.now(dt.UTC) - dt.timedelta(days=1) + dt.timedelta(seconds=12)
    issue_identity(pki / "ca", "sl-2", "sl", pki, valid_from=valid_from, days=1)
    capath = ["--capath", str(pki / "ca" / "capath")]

    def files(cn: str) -> list[str]:
        return ["--cert", str(pki / f"{cn}-cert.pem"), "--key", str(pki / f"{cn}-key.pem"), *capath]

    sn = start_sn(tmp_path / "sn", extra=files("sn-1"))
    quick = {"SL_WAIT_FOR_FULL_QUORUM_SECONDS": "1"}

    def start(i: int) -> RunningSL:
        args = files(f"sl-{i}")
        return start_sl(
            sn, f"sl-{i}", tmp_path, quick, sl_args=args, SEED=i, MIN_PEERS=1, EPOCHS=5, SLEEP_PER_BATCH=0.25
        )

    nodes = [start(1), start(2)]
    try:
        assert nodes[0].wait(90) == 0, nodes[0].output()[-3000:]
        assert nodes[0].final_digest() is not None
        assert nodes[1].wait(30) != 0
        assert "SwarmError: SwarmCallback: the certificate of 'sl-2'" in nodes[1].output(), nodes[1].output()[
            -3000:
        ]
        swci = Identity.load(pki / "swci-1-cert.pem", pki / "swci-1-key.pem", pki / "ca" / "capath")
        assert asyncio.run(_member_status(sn, "sl-2", swci)) == "left"
    finally:
        for node in nodes:
            node.kill()
        sn.stop()
