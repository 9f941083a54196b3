"""How ``LedgerClient`` retries an SN that answers with a retryable error: an SN that says a failover is
under way or cannot store blocks now is asked again within ``Patience.answered_cap``; one that says a
failover is under way stays the one asked for ``Patience.failover_stay`` seconds; any other retried
failure moves on to another online SN when there is one."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from daemons.bus import Request, RpcError
from daemons.ledger_client import LedgerClient, Patience
from tests.conftest import MakeBus


@dataclass(frozen=True, slots=True)
class _Recorded(Patience):
    """Patience that records what each retry was told and waits next to nothing."""

    told: list[bool] = field(default_factory=list)

    def backoff(self, attempt: int, *, answered: bool = False) -> float:
        self.told.append(answered)
        return 0.01


@pytest.mark.parametrize("code", ["failover", "unavailable"])
async def test_each_retry_after_an_sn_answered_it_cannot_serve_now_is_soon(
    make_bus: MakeBus, code: str
) -> None:
    """That SN is alive: a failover ends, or its disk has room again, within seconds; a silence (an SN
    or broker down) still backs off up to ``backoff_cap``."""
    refusals = 3

    async def sn(request: Request) -> object:
        nonlocal refusals
        if refusals:
            refusals -= 1
            raise RpcError(code, "no SN seals right now (a failover is under way); try again")
        return {"uid": "sn-1", "height": 7}

    async with make_bus("sn-1", "sn", presence={"role": "sn"}) as server, make_bus("sl-1") as client:
        server.serve(sn)
        patience = _Recorded()
        ledger = LedgerClient(client, "sn-1", patience=patience)
        assert (await ledger.status())["height"] == 7
    assert patience.told == [True] * 3


class _Refusing:
    """An SN stand-in: refuses its first ``refusals`` requests with ``code``, then answers; counts them."""

    def __init__(self, uid: str, code: str, refusals: int) -> None:
        self.uid, self.code, self.refusals, self.asked = uid, code, refusals, 0

    async def __call__(self, request: Request) -> object:
        self.asked += 1
        if self.refusals:
            self.refusals -= 1
            raise RpcError(self.code, f"{self.uid} cannot answer now; try again")
        return {"uid": self.uid, "height": 7}


@pytest.mark.parametrize(
    ("code", "stay", "answered_by"),
    [("failover", 15.0, "sn-1"), ("failover", 0.0, "sn-2"), ("unavailable", 15.0, "sn-2")],
)
async def test_an_sn_that_says_a_failover_is_under_way_is_asked_again_until_it_said_so_for_failover_stay(
    make_bus: MakeBus, code: str, stay: float, answered_by: str
) -> None:
    """That SN is alive and forwards to the next sealer once there is one; another SN would say the same,
    and each switch searched for SNs (0.5 s) and logged a line. Any other refusal still moves on."""
    first, second = _Refusing("sn-1", code, 3), _Refusing("sn-2", code, 0)
    async with (
        make_bus("sn-1", "sn", presence={"role": "sn"}) as sn_1,
        make_bus("sn-2", "sn", presence={"role": "sn"}) as sn_2,
        make_bus("sl-1") as client,
    ):
        sn_1.serve(first)
        sn_2.serve(second)
        ledger = LedgerClient(client, "sn-1", patience=_Recorded(failover_stay=stay))
        assert (await ledger.status())["uid"] == answered_by
        assert ledger.sn == answered_by
    assert (first.asked, second.asked) == ((4, 0) if answered_by == "sn-1" else (1, 1))


async def test_the_same_failure_repeated_warns_once_and_the_answer_after_it_is_logged(
    make_bus: MakeBus, caplog: pytest.LogCaptureFixture
) -> None:
    """An SN that refuses the same way several times (a failover of some seconds) gives one warning,
    quieter lines for the repeats, and one line saying when the call got through."""
    refusing = _Refusing("sn-1", "failover", 3)
    async with make_bus("sn-1", "sn", presence={"role": "sn"}) as server, make_bus("sl-1") as client:
        server.serve(refusing)
        with caplog.at_level(logging.INFO, logger="swarm.ledger_client"):
            assert (await LedgerClient(client, "sn-1", patience=_Recorded()).status())["uid"] == "sn-1"
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "swarm.ledger_client"]
    assert [level for level, _ in lines] == [logging.WARNING, logging.INFO, logging.INFO, logging.INFO]
    assert all("sn-1 cannot answer now" in text for _, text in lines[:3]), lines
    assert "status answered by SN 'sn-1' after 3 retries" in lines[3][1], lines
