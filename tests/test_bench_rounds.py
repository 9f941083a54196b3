"""``bench.rounds.swarm_rounds`` with certificates: the round its third row measures is the secured one
(mutual TLS to mosquitto and on the data plane, a signed chain, check-ins relayed by the predicted
leader), and it completes."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.rounds import round_blocks, swarm_rounds
from contracts.blockstore import ChainError


def test_a_certified_swarm_of_stand_ins_syncs_over_tls_on_a_signed_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWARM_SL_RELAY_CHECKINS", "true")  # off by default (daemons/sl/rounds.py)
    ws = tmp_path / "w"
    run = swarm_rounds(ws, 4, 10_000, 8, certified=True)
    assert [len(node["done"]) for node in run.nodes] == [8, 8, 8, 8]
    # with SWARM_SL_RELAY_CHECKINS the predicted leaders relayed their participants' check-ins, each
    # verified as its signer's
    logs = "".join((ws / "logs" / f"sl-{n}.log").read_text() for n in range(1, 5))
    assert "(relayed by sl-" in logs
    assert sorted(p.stem for p in ws.glob("sl-*.json")) == ["sl-1", "sl-2", "sl-3", "sl-4"]
    assert "listening on mqtts://" in (ws / "logs" / "sn.log").read_text()
    assert "data plane serves models at dps://" in (ws / "logs" / "sl-1.log").read_text()
    assert round_blocks(ws / "sn" / "ledger.db", ws / "pki") == run.blocks > 0
    with pytest.raises(ChainError, match="the chain is signed"):
        round_blocks(ws / "sn" / "ledger.db")
