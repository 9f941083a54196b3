"""The SN answers a ledger read once per state (``daemons/sn/reads.py``): the same answer until a block
changes the state, then the new state's (a real ledger)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.ledger import Ledger
from contracts.views import BadQuery, QueryError
from daemons.sn.reads import MAX_ANSWERS, Reads
from tests.test_round_hold import SLS, SN, C, _checkin, _ledger


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    """A ledger where three SLs joined the default contract (for 2 peers)."""
    opened = _ledger(tmp_path / "ledger.db", SLS)
    yield opened
    opened.close()


def test_a_read_is_answered_once_per_state_and_again_after_a_block(ledger: Ledger) -> None:
    reads = Reads()
    first = reads.answer(ledger.state, "contract.rounds", {"name": C})
    assert reads.answer(ledger.state, "contract.rounds", {"name": C}) is first
    assert first["open"] is None or not first["open"]["checkins"]

    ledger.seal([_checkin(SLS[0])], sealer=SN, sealer_uid="sn1", now=300.0)
    after = reads.answer(ledger.state, "contract.rounds", {"name": C})
    assert after is not first
    assert [c["uid"] for c in after["open"]["checkins"]] == ["sl0"]


def test_reads_with_other_arguments_are_answered_apart(ledger: Ledger) -> None:
    reads = Reads()
    sl0 = reads.answer(ledger.state, "node", {"uid": "sl0"})
    sl1 = reads.answer(ledger.state, "node", {"uid": "sl1"})
    assert sl0["uid"] == "sl0" and sl1["uid"] == "sl1"
    online = reads.answer(ledger.state, "nodes", {"role": "sl", "online": True})
    with pytest.raises(BadQuery):  # 1 is not True to the view, so not to the cache either
        reads.answer(ledger.state, "nodes", {"role": "sl", "online": 1})
    assert reads.answer(ledger.state, "nodes", {"role": "sl", "online": True}) is online


def test_a_refused_read_is_refused_each_time_and_kept_reads_are_bounded(ledger: Ledger) -> None:
    reads = Reads()
    for _ in range(2):
        with pytest.raises(QueryError):
            reads.answer(ledger.state, "contract.rounds", {"name": "no-such-contract"})
    unkept = [reads.answer(ledger.state, "node", {"uid": "sl0", "n": i}) for i in range(MAX_ANSWERS + 5)]
    assert reads.answer(ledger.state, "node", {"uid": "sl0", "n": MAX_ANSWERS + 1}) is not unkept[-4]


def test_a_read_with_an_argument_that_is_not_a_scalar_is_answered_each_time(ledger: Ledger) -> None:
    reads = Reads()
    first = reads.answer(ledger.state, "contracts", {"extra": [1, 2]})
    again = reads.answer(ledger.state, "contracts", {"extra": [1, 2]})
    assert again == first and again is not first
