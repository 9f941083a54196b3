"""Training history folded from the chain: progress reports and merged rounds, grouped in runs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from contracts.block import BlockError
from contracts.history import HistoryIndex, number
from contracts.ledger import Accepted, Ledger
from contracts.machine import due_actions
from wire.envelope import encode_envelope, make_envelope

C = "defaultbb.cqdb.sml.hpe"
PARAMS = {
    "sync_frequency": 8,
    "min_peers": 2,
    "node_weightage": 1.0,
    "merge_method": "mean",
    "total_epochs": 3,
    "admin": True,
    "quorum_wait": 0.0,
    "leader_timeout": 60.0,
}


class Chain:
    """An unsigned ledger on disk that tests drive with transactions of named senders."""

    def __init__(self, path: Path) -> None:
        self.now = 100.0
        self.ledger = Ledger.create(path, sealer=None, sealer_uid="sn", verifier=None, now=self.now)

    def tx(self, sender: str, role: str, kind: str, body: dict[str, Any]) -> None:
        self.now += 1.0
        env = encode_envelope(make_envelope("tx:" + kind, body, sender=sender, role=role))
        result = self.ledger.seal([env], sealer=None, sealer_uid="sn", now=self.now).results[0]
        assert isinstance(result, Accepted), result

    def due(self) -> None:
        for kind, body in due_actions(self.ledger.state, self.now + 1):
            self.tx("sn", "sn", kind, body)

    def round(self, uids: list[str], digest: str, *, init: bool = False) -> int:
        """Every node checks in, the SN closes the round, its leader merges; returns its number."""
        for uid in uids:
            self.tx(
                uid,
                "sl",
                "round.checkin",
                {"contract": C, "digest": _digest(uid), "samples": 5, "init": init},
            )
        self.due()
        closed = self.ledger.state.rounds[C].pending[-1]
        body = {"contract": C, "round": closed.number, "digest": digest, "contributors": list(uids)}
        self.tx(str(closed.leader), "sl", "round.merged", body)
        return closed.number

    def progress(self, uid: str, epoch: int, loss: float, metric: float) -> None:
        body = {"contract": C, "epochs_done": epoch, "total_epochs": 3, "loss": loss, "metric": metric}
        self.tx(uid, "sl", "contract.progress", body)

    def blocks(self) -> list[bytes]:
        return self.ledger.raw_blocks(0)


@pytest.fixture
def chain(tmp_path: Path) -> Chain:
    made = Chain(tmp_path / "ledger.db")
    for uid in ("sl1", "sl2"):
        made.tx(uid, "sl", "node.register", {"host": "h"})
        made.tx(uid, "sl", "contract.join", {"contract": C, "params": PARAMS})
    return made


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_progress_and_rounds_of_one_run(chain: Chain) -> None:
    first = chain.round(["sl1", "sl2"], _digest("init"), init=True)
    chain.progress("sl1", 1, 0.9, 0.5)
    second = chain.round(["sl1", "sl2"], _digest("r2"))
    chain.progress("sl2", 1, 0.7, float("nan"))
    index = HistoryIndex()
    index.add_all(chain.blocks())
    records = index.records(C)
    assert [(r.kind, r.node if r.kind == "progress" else r.round) for r in records] == [
        ("round", first),
        ("progress", "sl1"),
        ("round", second),
        ("progress", "sl2"),
    ]
    one, two = records[1], records[3]
    assert (one.epoch, one.total_epochs, one.loss, one.metric) == (1, 3, 0.9, 0.5)
    assert (one.round, one.digest) == (first, _digest("init"))  # the merged model it reported on
    assert (two.round, two.digest, two.metric) == (second, _digest("r2"), "nan")
    merged = records[2]
    assert merged.node in ("sl1", "sl2") and merged.contributors == ("sl1", "sl2")
    assert [r.time for r in records] == sorted(r.time for r in records)
    assert index.height == chain.ledger.height
    assert set(records[0].as_dict()) >= {"time", "node", "epoch", "loss", "metric", "round", "digest"}


def test_a_reset_starts_a_new_run_and_the_latest_run_with_records_is_shown(chain: Chain) -> None:
    chain.progress("sl1", 1, 0.9, 0.5)
    chain.tx("sl1", "sl", "contract.done", {"contract": C, "mode": "snapshot"})
    chain.tx("sl2", "sl", "contract.done", {"contract": C, "mode": "snapshot"})
    for uid in ("sl1", "sl2"):  # the nodes go away, so the contract may be reset
        chain.tx("sn", "sn", "node.offline", {"uid": uid, "reason": "ended"})
    chain.tx("swci-1", "swci", "contract.reset", {"name": C})
    index = HistoryIndex()
    index.add_all(chain.blocks())
    assert index.runs(C) == 2
    assert [r.node for r in index.records(C)] == ["sl1"]  # the new run is empty: show the last one
    assert index.records(C, run=1) == []
    for uid in ("sl1", "sl2"):
        chain.tx(uid, "sl", "node.register", {"host": "h"})
        chain.tx(uid, "sl", "contract.join", {"contract": C, "params": PARAMS})
    chain.progress("sl2", 1, 0.5, 0.8)
    index.add_all(chain.ledger.raw_blocks(index.height + 1))  # only the new blocks
    assert [r.node for r in index.records(C)] == ["sl2"]
    assert [r.node for r in index.records(C, run=0)] == ["sl1"]
    assert index.records(C, since=index.height) == []
    assert index.records("no-such-contract") == []


def test_blocks_must_follow_and_decode(chain: Chain) -> None:
    blocks = chain.blocks()
    index = HistoryIndex()
    index.add(blocks[0])
    index.add(blocks[0])  # seen already: ignored
    with pytest.raises(BlockError, match="does not follow"):
        index.add(blocks[2])
    with pytest.raises(BlockError):
        index.add(b"\x93garbage")
    assert index.height == 0


def test_numbers_are_json_data() -> None:
    assert number(0.5) == 0.5
    assert number(1) == 1.0
    assert number(float("inf")) == "inf"
    assert number(None) is None
    assert number(True) == "True"
    assert number("x") == "x"
