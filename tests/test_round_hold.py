"""One durable write per round: the SN holds check-ins until their round can close and seals them with its
``round.close``, and the last round's ``round.merged``, in one block (a real ledger, a real mosquitto for
the sealer's events; a real ``swarm sn`` for a swarm larger than the requests an RPC server answers at
once)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from contracts.devkeys import DevAuthority, DevSigner
from contracts.ledger import Accepted, Ledger
from contracts.machine import DEFAULT_CONTRACT, due_actions
from contracts.rounds import completes_round, record_may_wait
from contracts.state import State
from daemons.ledger_client import LedgerClient
from daemons.sn.sealer import Sealer
from tests.conftest import MakeBus, RunningSN, start_sn
from tests.test_swci_training import sl_standin
from wire.envelope import encode_envelope, make_envelope

C = DEFAULT_CONTRACT
CA = DevAuthority("test-round-hold")
SN = CA.issue("sn1", "sn")
SLS = [CA.issue(f"sl{i}", "sl") for i in range(3)]


def _env(signer: DevSigner, kind: str, body: dict[str, Any]) -> bytes:
    return encode_envelope(
        make_envelope("tx:" + kind, body, sender=signer.uid, role=signer.role, signer=signer)
    )


def _checkin(signer: DevSigner) -> bytes:
    digest = hashlib.sha256(signer.uid.encode()).hexdigest()
    return _env(signer, "round.checkin", {"contract": C, "digest": digest, "samples": 10})


def _ledger(path: Path, members: list[DevSigner]) -> Ledger:
    ledger = Ledger.create(path, sealer=SN, sealer_uid="sn1", verifier=CA.verifier(), now=100.0)
    setup = [_env(sl, "node.register", {"host": "h"}) for sl in members]
    params = {"min_peers": 2, "quorum_wait": 60.0, "leader_timeout": 60.0}
    setup += [_env(sl, "contract.join", {"contract": C, "params": params}) for sl in members]
    result = ledger.seal(setup, sealer=SN, sealer_uid="sn1", now=200.0)
    assert all(isinstance(r, Accepted) for r in result.results), result.results
    return ledger


def _closes(state: State, time: float) -> list[bytes]:
    actions = due_actions(state, time)
    return [_env(SN, kind, body) for kind, body in actions if kind == "round.close"]


@asynccontextmanager
async def _sealing(ledger: Ledger, make_bus: MakeBus, *, hold: float) -> AsyncIterator[Sealer]:
    """A sealer of ``ledger`` that holds for ``hold`` s, running; the ledger is closed after it."""
    async with make_bus("sn1", "sn") as bus:
        sealer = Sealer(ledger, bus, SN, hold=hold)
        runner = asyncio.create_task(sealer.run())
        try:
            yield sealer
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
            ledger.close()


def test_a_round_completes_only_with_every_expected_member(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path / "ledger.db", SLS[:2])
    state = ledger.state
    assert not completes_round(state, C, ["sl0"])
    assert not completes_round(state, C, ["sl0", "stranger"])
    assert completes_round(state, C, ["sl0", "sl1"])
    assert not completes_round(state, "no-such-contract", ["sl0", "sl1"])


def test_the_close_a_batch_makes_due_goes_into_its_block(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path / "ledger.db", SLS[:2])
    height = ledger.height
    result = ledger.seal(
        [_checkin(SLS[0]), _checkin(SLS[1])], sealer=SN, sealer_uid="sn1", now=300.0, follow_up=_closes
    )
    assert [r.receipt.get("round") for r in result.results if isinstance(r, Accepted)] == [1, 1]
    assert ledger.height == height + 1
    book = ledger.state.rounds[C]
    assert [r.number for r in book.pending] == [1]
    assert book.pending[0].leader in ("sl0", "sl1")
    assert book.open is not None and book.open.number == 2
    reopened = Ledger.open(tmp_path / "ledger.db", verifier=CA.verifier())  # the block replays
    assert reopened.state.rounds[C].pending[0].leader == book.pending[0].leader
    reopened.close()
    ledger.close()


async def test_the_sealer_holds_checkins_until_their_round_can_close(
    tmp_path: Path, make_bus: MakeBus
) -> None:
    ledger = _ledger(tmp_path / "ledger.db", SLS)
    start = ledger.height
    async with _sealing(ledger, make_bus, hold=60.0) as sealer:
        first = asyncio.create_task(sealer.submit(_checkin(SLS[0])))
        second = asyncio.create_task(sealer.submit(_checkin(SLS[1])))
        await asyncio.sleep(0.3)
        assert not first.done() and not second.done()  # held: sl2 is expected too
        last = await sealer.submit(_checkin(SLS[2]))
        assert isinstance(last, Accepted) and isinstance(await first, Accepted)
        assert ledger.height == start + 1  # three check-ins and the close: one block
        assert ledger.state.rounds[C].pending[0].participants == ("sl0", "sl1", "sl2")

        held = asyncio.create_task(sealer.submit(_checkin(SLS[0])))
        await asyncio.sleep(0.3)
        assert not held.done()
        report = _env(SLS[1], "contract.progress", {"contract": C, "epochs_done": 1, "total_epochs": 2})
        progress = asyncio.create_task(sealer.submit(report))
        await asyncio.sleep(0.3)
        assert not progress.done()  # a progress report waits with the check-in
        leave = _env(SLS[2], "contract.done", {"contract": C})
        assert isinstance(await sealer.submit(leave), Accepted)  # not held: it seals what waits
        assert isinstance(await held, Accepted) and isinstance(await progress, Accepted)


async def test_a_hold_ends_after_its_time_and_seals_what_waits(tmp_path: Path, make_bus: MakeBus) -> None:
    ledger = _ledger(tmp_path / "ledger.db", SLS)
    async with _sealing(ledger, make_bus, hold=0.2) as sealer:
        outcome = await sealer.submit(_checkin(SLS[0]))
        assert isinstance(outcome, Accepted) and outcome.receipt["round"] == 1
        assert "sl0" in ledger.state.rounds[C].open.checkins  # type: ignore[union-attr]


def _merged(ledger: Ledger, number: int, *, taken: bool = True) -> bytes:
    """The leader's ``round.merged`` of pending round ``number``; ``taken``: every other participant
    holds the merge already."""
    rnd = next(r for r in ledger.state.rounds[C].pending if r.number == number)
    leader = next(sl for sl in SLS if sl.uid == rnd.leader)
    body = {"contract": C, "round": number, "digest": "ab" * 32, "contributors": list(rnd.participants),
            "excluded": [], "taken": taken}  # fmt: skip
    return _env(leader, "round.merged", body)


def _closed_round(ledger: Ledger, now: float, *, final: bool = False) -> int:
    """Every member checks in to the open round (made final first when ``final``), which closes."""
    if final:
        done = [_env(sl, "contract.done", {"contract": C}) for sl in SLS]
        assert all(
            isinstance(r, Accepted) for r in ledger.seal(done, sealer=SN, sealer_uid="sn1", now=now).results
        )
    result = ledger.seal(
        [_checkin(sl) for sl in SLS], sealer=SN, sealer_uid="sn1", now=now, follow_up=_closes
    )
    assert all(isinstance(r, Accepted) for r in result.results), result.results
    return int(ledger.state.rounds[C].pending[-1].number)


def test_only_the_merge_of_a_round_that_is_not_final_may_wait(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path / "ledger.db", SLS)
    first = _closed_round(ledger, 300.0)
    assert record_may_wait(ledger.state, C, first)
    assert not record_may_wait(ledger.state, C, first + 1)  # open, not waiting for a merge
    assert not record_may_wait(ledger.state, "no-such-contract", first)
    ledger.seal([_merged(ledger, first)], sealer=SN, sealer_uid="sn1", now=301.0)
    assert not record_may_wait(ledger.state, C, first)  # merged already
    final = _closed_round(ledger, 302.0, final=True)
    assert not record_may_wait(ledger.state, C, final)
    ledger.close()


def test_the_merge_of_an_init_round_does_not_wait(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path / "ledger.db", SLS)
    digest = "cd" * 32
    init = [
        _env(sl, "round.checkin", {"contract": C, "digest": digest, "samples": 10, "init": True})
        for sl in SLS
    ]
    result = ledger.seal(init, sealer=SN, sealer_uid="sn1", now=300.0, follow_up=_closes)
    assert all(isinstance(r, Accepted) for r in result.results), result.results
    (rnd,) = ledger.state.rounds[C].pending
    assert rnd.init and not record_may_wait(ledger.state, C, rnd.number)
    ledger.close()


async def test_a_merge_is_sealed_with_the_next_rounds_close(tmp_path: Path, make_bus: MakeBus) -> None:
    ledger = _ledger(tmp_path / "ledger.db", SLS)
    first = _closed_round(ledger, 300.0)
    start = ledger.height
    async with _sealing(ledger, make_bus, hold=60.0) as sealer:
        merged = asyncio.create_task(sealer.submit(_merged(ledger, first)))
        await asyncio.sleep(0.3)
        assert not merged.done()  # held for the next round's close
        outcomes = await asyncio.gather(*(sealer.submit(_checkin(sl)) for sl in SLS))
        assert all(isinstance(o, Accepted) for o in outcomes), outcomes
        assert isinstance(await merged, Accepted)
        assert ledger.height == start + 1  # the merge, three check-ins and the close: one block
        book = ledger.state.rounds[C]
        assert [r.number for r in book.done] == [first] and book.done[0].status == "MERGED"
        assert [r.number for r in book.pending] == [first + 1]


async def test_a_merge_a_participant_still_needs_is_sealed_at_once(tmp_path: Path, make_bus: MakeBus) -> None:
    """A participant that did not take the merge from the leader (no data plane, or it went on late)
    waits for the ledger's record before its next check-in: holding it would stall the next round."""
    ledger = _ledger(tmp_path / "ledger.db", SLS)
    first = _closed_round(ledger, 300.0)
    async with _sealing(ledger, make_bus, hold=60.0) as sealer:
        outcome = await asyncio.wait_for(sealer.submit(_merged(ledger, first, taken=False)), timeout=10)
        assert isinstance(outcome, Accepted)
        assert ledger.state.rounds[C].done[-1].status == "MERGED"


async def test_the_merge_of_the_final_round_is_sealed_at_once(tmp_path: Path, make_bus: MakeBus) -> None:
    ledger = _ledger(tmp_path / "ledger.db", SLS)
    final = _closed_round(ledger, 300.0, final=True)
    async with _sealing(ledger, make_bus, hold=60.0) as sealer:
        outcome = await asyncio.wait_for(sealer.submit(_merged(ledger, final)), timeout=10)
        assert isinstance(outcome, Accepted)
        assert ledger.state.contracts[C].final_digest == "ab" * 32


SWARM_OF_40 = [f"sl{i:02d}" for i in range(40)]  # more than the 32 requests an RPC server answers at once


async def _joined(stack: AsyncExitStack, sn: RunningSN, uid: str) -> LedgerClient:
    """A stand-in SL, registered as a SWOP's, joined to the default contract for 40 peers."""
    client = await stack.enter_async_context(sl_standin(sn, uid, "swop-1"))
    params = {"min_peers": len(SWARM_OF_40), "quorum_wait": 60.0, "leader_timeout": 60.0}
    await client.submit("contract.join", {"contract": C, "params": params})
    return client


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_swarm_larger_than_the_sns_request_bound_checks_in_in_one_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held check-ins wait for their round without keeping the others out: 40 SLs checking in at once
    are sealed in one block with their round's close. With a 30 s hold and the SN answering 32 requests
    at once (the code before), the first 32 filled every place and the clients' resends kept them full:
    this test ran into its timeout."""
    monkeypatch.setenv("SWARM_SN_CHECKIN_HOLD", "30")
    sn = start_sn(tmp_path / "sn")
    try:
        async with AsyncExitStack() as stack:
            clients = await asyncio.gather(*(_joined(stack, sn, uid) for uid in SWARM_OF_40))
            digests = [hashlib.sha256(uid.encode()).hexdigest() for uid in SWARM_OF_40]
            receipts = await asyncio.gather(
                *(
                    client.submit("round.checkin", {"contract": C, "digest": digest, "samples": 10})
                    for client, digest in zip(clients, digests, strict=True)
                )
            )
            assert [r.get("round") for r in receipts] == [1] * len(SWARM_OF_40), receipts
            heights = {r.get("height") for r in receipts}
            assert len(heights) == 1, f"the check-ins went into blocks {heights}"
            closed = (await clients[0].query("contract.rounds", name=C))["closed"]
            assert [r["round"] for r in closed] == [1]
            assert sorted(closed[0]["participants"]) == SWARM_OF_40
    finally:
        sn.stop()
