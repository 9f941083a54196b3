"""How ``LedgerClient`` retries an SN that answers with a retryable error: an SN that says a failover is
under way is asked again within ``Patience.failover_cap``; any other retried failure backs off as before."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from daemons.bus import Request, RpcError
from daemons.ledger_client import LedgerClient, Patience
from tests.conftest import MakeBus


@dataclass(frozen=True, slots=True)
class _Recorded(Patience):
    """Patience that records what each retry was told and waits next to nothing."""

    told: list[bool] = field(default_factory=list)

    def backoff(self, attempt: int, *, failover: bool = False) -> float:
        self.told.append(failover)
        return 0.01


@pytest.mark.parametrize(("code", "failover"), [("failover", True), ("unavailable", False)])
async def test_each_retry_is_told_whether_the_sn_said_a_failover_is_under_way(
    make_bus: MakeBus, code: str, failover: bool
) -> None:
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
    assert patience.told == [failover] * 3
