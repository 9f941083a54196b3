"""A leader whose SN reads from a copy of the chain a block behind the sealer's event: it reads its round
again until the copy shows the close (``RoundEngine._read_closed``), instead of taking the round still
open there for a replaced leader and leaving it to the 30 s leader timeout."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from daemons.bus import RpcError
from daemons.sl.node import _fetch_height
from daemons.sl.rounds import RoundEngine


def _view(status: str, leader: str = "sl-1") -> dict[str, Any]:
    rnd = {"round": 1, "status": status, "leader": leader if status != "OPEN" else None, "checkins": []}
    if status == "OPEN":
        return {"contract": "c1", "open": rnd, "closed": [], "finished": []}
    return {"contract": "c1", "open": None, "closed": [rnd], "finished": []}


def _engine(answers: list[dict[str, Any]]) -> tuple[RoundEngine, list[tuple[str, dict[str, Any]]]]:
    asked: list[tuple[str, dict[str, Any]]] = []

    async def query(query_name: str, /, **args: Any) -> dict[str, Any]:
        asked.append((query_name, args))
        return answers.pop(0) if len(answers) > 1 else answers[0]

    ledger = SimpleNamespace(query=query)
    engine = RoundEngine(cast(Any, SimpleNamespace(uid="sl-1")), cast(Any, ledger), cast(Any, None), "c1")
    return engine, asked


async def test_a_round_still_open_at_the_sn_is_read_again_until_it_shows_the_close() -> None:
    engine, asked = _engine([_view("OPEN"), _view("OPEN"), _view("CLOSED")])
    view, rnd = await engine._read_closed(1)
    assert rnd is not None and rnd["status"] == "CLOSED" and rnd["leader"] == "sl-1"
    assert view["closed"] == [rnd]
    assert asked == [("contract.rounds", {"name": "c1"})] * 3


async def test_a_closed_round_is_taken_at_once_whoever_leads_it_and_an_open_one_only_for_a_while() -> None:
    engine, asked = _engine([_view("CLOSED", leader="sl-2")])
    _, rnd = await engine._read_closed(1)
    assert rnd is not None and rnd["leader"] == "sl-2" and len(asked) == 1  # replaced: no waiting
    engine, asked = _engine([_view("OPEN")])
    _, rnd = await engine._read_closed(1, wait=0.2)
    assert rnd is not None and rnd["status"] == "OPEN" and len(asked) >= 2  # gives up, as before


async def test_a_fetch_of_our_row_is_checked_at_least_at_the_block_its_requester_saw() -> None:
    """A leader asks for a participant's row once it saw the close that named it (a block of the sealer);
    the participant's own SN may not hold that block yet, so the participant's check of who leads reads
    at least there (``at_least``: the SN waits for it) instead of refusing the leader of a round it still
    sees open."""
    engine, asked = _engine([_view("CLOSED", leader="sl-2")])
    engine.checked_in[b"d" * 32] = 1
    assert await engine.may_fetch(b"d" * 32, "sl-2", height=17) is None
    assert asked == [("contract.rounds", {"name": "c1", "at_least": 17})]
    engine, asked = _engine([_view("CLOSED", leader="sl-2")])
    engine.checked_in[b"d" * 32] = 1
    assert await engine.may_fetch(b"d" * 32, "sl-2") is None  # an asker that names no block
    assert asked == [("contract.rounds", {"name": "c1", "at_least": 0})]


def test_the_block_a_fetch_over_the_bus_names_is_checked() -> None:
    assert _fetch_height({"digest": b"d" * 32, "height": 9}) == 9
    assert _fetch_height({"digest": b"d" * 32}) is None
    for bad in (-1, True, "9", 2**60, 1.5):
        with pytest.raises(RpcError, match="fetch's 'height' must be a block height") as caught:
            _fetch_height({"height": bad})
        assert caught.value.code == "bad-request"
