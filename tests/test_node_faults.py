"""Faults of one node against real daemons: a node whose certificate expires leaves saying so. (A node
cut off and back re-joins: ``tests/test_multihost.py``'s partition and ``bench/faults_nodes.py``.)"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from pathlib import Path

import pytest

from certs import Signer, init_swarm, issue_identity
from daemons.bus.endpoint import Message
from daemons.bus.topics import Topics
from daemons.identity import Identity, open_bus
from daemons.ledger_client import LedgerClient
from daemons.sn.liveness import offline_will
from tests.conftest import RunningSN, start_sn
from tests.swarm_helpers import RunningSL, start_sl
from wire import SignatureError, decode_envelope, encode_envelope, make_envelope

CONTRACT = "defaultbb.cqdb.sml.hpe"


async def _member_status(sn: RunningSN, uid: str, swci: Identity) -> str:
    """``uid``'s status in the default contract, read as ``swci``."""
    async with open_bus(swci, sn.address, swci.uid, "swci", network="swarm") as bus:
        ledger = await LedgerClient.connect(bus, timeout=10)
        members = await ledger.query("contract.perfdata", name=CONTRACT)
    return next((str(m["status"]) for m in members if m["uid"] == uid), "")


@pytest.mark.slow
def test_a_node_whose_certificate_expires_leaves_saying_so_and_the_others_finish(tmp_path: Path) -> None:
    """Mutual TLS and signed messages: sl-2's certificate expires mid-training. It leaves just before
    (afterwards the SN could not believe even its offline will), its ML program exits non-zero saying
    why, the ledger counts it as gone and sl-1 finishes."""
    pki = tmp_path / "pki"
    init_swarm(pki, sl=2)
    capath = ["--capath", str(pki / "ca" / "capath")]

    def files(cn: str) -> list[str]:
        return ["--cert", str(pki / f"{cn}-cert.pem"), "--key", str(pki / f"{cn}-key.pem"), *capath]

    sn = start_sn(tmp_path / "sn", extra=files("sn-1"))
    # 20 s left: sl-2 has joined by then, even under load, and is mid-training (9 epochs of 8 x 0.25 s)
    valid_from = dt.datetime.now(dt.UTC) - dt.timedelta(days=1) + dt.timedelta(seconds=20)
    issue_identity(pki / "ca", "sl-2", "sl", pki, valid_from=valid_from, days=1)
    quick = {"SL_WAIT_FOR_FULL_QUORUM_SECONDS": "1"}

    def start(i: int) -> RunningSL:
        args = files(f"sl-{i}")
        return start_sl(
            sn, f"sl-{i}", tmp_path, quick, sl_args=args, SEED=i, MIN_PEERS=1, EPOCHS=9, SLEEP_PER_BATCH=0.25
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
        assert asyncio.run(_member_status(sn, "sl-2", swci)) == "left", nodes[1].output()[-3000:]
    finally:
        for node in nodes:
            node.kill()
        sn.stop()


def test_an_offline_will_signed_before_the_certificate_expired_is_believed(tmp_path: Path) -> None:
    """A will is signed at connect time and published when the connection ends, maybe after the expiry."""
    init_swarm(tmp_path, sl=1)
    now = dt.datetime.now(dt.UTC)
    issue_identity(
        tmp_path / "ca", "sl-9", "sl", tmp_path, valid_from=now - dt.timedelta(days=1, minutes=1), days=1
    )
    signer = Signer.from_files(tmp_path / "sl-9-cert.pem", tmp_path / "sl-9-key.pem")
    signed_at = (now - dt.timedelta(minutes=3)).timestamp()  # it expired a minute ago; the CA is 5 min old
    verifier = Identity.load(
        tmp_path / "sl-1-cert.pem", tmp_path / "sl-1-key.pem", tmp_path / "ca" / "capath"
    ).verifier()
    topic = Topics("swarm", "sl-9", "sl-9").presence("sl-9")

    def will(state: str, when: float = signed_at) -> Message:
        env = make_envelope("presence", {"state": state}, sender="sl-9", role="sl", signer=signer, when=when)
        return Message(topic, encode_envelope(env))

    with pytest.raises(SignatureError, match="expired on"):
        decode_envelope(will("offline").payload, verifier=verifier)
    believed = offline_will(will("offline"), verifier, frozenset())
    assert believed is not None and believed.sender == "sl-9"
    assert offline_will(will("online"), verifier, frozenset()) is None  # only the offline claim
    assert offline_will(will("offline"), verifier, frozenset({"sl-9"})) is None  # revoked
    assert offline_will(will("offline", time.time()), verifier, frozenset()) is None  # signed after it
    other = Message(Topics("swarm", "sl-1", "sl-1").presence("sl-1"), will("offline").payload)
    assert offline_will(other, verifier, frozenset()) is None  # not in its own namespace
