"""A leader whose SN reads from a copy of the chain a block behind the sealer's event: it reads its round
again until the copy shows the close (``RoundEngine._read_closed``), instead of taking the round still
open there for a replaced leader and leaving it to the 30 s leader timeout."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

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
