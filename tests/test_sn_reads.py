"""The SN answers a ledger read once per state (``daemons/sn/reads.py``): the same answer until a block
changes the state, then the new state's (a real ledger)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from contracts.devkeys import DevAuthority, DevSigner
from contracts.ledger import Accepted, Ledger
from contracts.machine import DEFAULT_CONTRACT
from contracts.views import BadQuery, QueryError
from daemons.sn.reads import MAX_ANSWERS, Reads
from wire.envelope import encode_envelope, make_envelope

C = DEFAULT_CONTRACT
CA = DevAuthority("test-sn-reads")
SN = CA.issue("sn1", "sn")
SLS = [CA.issue(f"sl{i}", "sl") for i in range(2)]


def _seal(ledger: Ledger, txs: list[tuple[DevSigner, str, dict[str, object]]], now: float) -> None:
    envelopes = [
        encode_envelope(make_envelope("tx:" + kind, body, sender=s.uid, role=s.role, signer=s))
        for s, kind, body in txs
    ]
    result = ledger.seal(envelopes, sealer=SN, sealer_uid="sn1", now=now)
    assert all(isinstance(r, Accepted) for r in result.results), result.results


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    ledger = Ledger.create(
        tmp_path / "ledger.db", sealer=SN, sealer_uid="sn1", verifier=CA.verifier(), now=100.0
    )
    params = {"min_peers": 2, "quorum_wait": 60.0, "leader_timeout": 60.0}
    _seal(ledger, [(sl, "node.register", {"host": "h"}) for sl in SLS], 200.0)
    _seal(ledger, [(sl, "contract.join", {"contract": C, "params": params}) for sl in SLS], 201.0)
    return ledger


def test_a_read_is_answered_once_per_state_and_again_after_a_block(ledger: Ledger) -> None:
    reads = Reads()
    first = reads.answer(ledger.state, "contract.rounds", {"name": C})
    assert reads.answer(ledger.state, "contract.rounds", {"name": C}) is first
    assert first["open"] is None or not first["open"]["checkins"]

    digest = hashlib.sha256(b"sl0").hexdigest()
    _seal(ledger, [(SLS[0], "round.checkin", {"contract": C, "digest": digest, "samples": 10})], 300.0)
    after = reads.answer(ledger.state, "contract.rounds", {"name": C})
    assert after is not first
    assert [c["uid"] for c in after["open"]["checkins"]] == ["sl0"]
    ledger.close()


def test_reads_with_other_arguments_are_answered_apart(ledger: Ledger) -> None:
    reads = Reads()
    sl0 = reads.answer(ledger.state, "node", {"uid": "sl0"})
    sl1 = reads.answer(ledger.state, "node", {"uid": "sl1"})
    assert sl0["uid"] == "sl0" and sl1["uid"] == "sl1"
    online = reads.answer(ledger.state, "nodes", {"role": "sl", "online": True})
    with pytest.raises(BadQuery):  # 1 is not True to the view, so not to the cache either
        reads.answer(ledger.state, "nodes", {"role": "sl", "online": 1})
    assert reads.answer(ledger.state, "nodes", {"role": "sl", "online": True}) is online
    ledger.close()


def test_a_refused_read_is_refused_each_time_and_kept_reads_are_bounded(ledger: Ledger) -> None:
    reads = Reads()
    for _ in range(2):
        with pytest.raises(QueryError):
            reads.answer(ledger.state, "contract.rounds", {"name": "no-such-contract"})
    unkept = [reads.answer(ledger.state, "node", {"uid": "sl0", "n": i}) for i in range(MAX_ANSWERS + 5)]
    assert reads.answer(ledger.state, "node", {"uid": "sl0", "n": MAX_ANSWERS + 1}) is not unkept[-4]
    ledger.close()


def test_a_read_with_an_argument_that_is_not_a_scalar_is_answered_each_time(ledger: Ledger) -> None:
    reads = Reads()
    first = reads.answer(ledger.state, "contracts", {"extra": [1, 2]})
    again = reads.answer(ledger.state, "contracts", {"extra": [1, 2]})
    assert again == first and again is not first
    ledger.close()
