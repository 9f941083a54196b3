"""An SN of a clustered ledger that forwards writes to the sealer (``daemons/sn/cluster.py``): when its
feed of the stream lags (its ordered consumer is made again after its NATS node died) it reads the blocks
it waits for from the stream itself (``ClusterRole.reach``), checked as the feed's are; when JetStream
cannot say who seals, the client is told to try again (``failover``). A real ``nats-server`` with
JetStream and a real mosquitto; the lagging feed is an SN whose ``follow`` is not running, and JetStream's
timeouts, which a running server cannot be made to give on demand, stand in as the error nats-py raises."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import nats.errors
import pytest
from conftest import MakeBus

from daemons.bus import RpcError
from daemons.ledger_client import Patience
from daemons.sn.chain import LocalChain
from daemons.sn.chainlog import ChainLog
from daemons.sn.cluster import FORWARD_WAIT, SEALER_LOOKUP_WAIT, ClusterRole
from wire import encode_envelope, make_envelope


@asynccontextmanager
async def _sn(
    make_bus: MakeBus, nats_url: str, network: str, uid: str, path: Path
) -> AsyncIterator[ClusterRole]:
    """An SN's cluster role on the stream, opened (its local chain agrees with the stream), not following."""
    async with make_bus(uid, "sn") as bus, ChainLog([nats_url], network, uid, replicas=1) as chainlog:
        role = ClusterRole(LocalChain(path, None), bus, chainlog, None, sentinel=uid == "sn-1")
        await role.open()
        yield role


async def _seal_and_append(sealer: ClusterRole, name: str, *, sealer_uid: str = "sn-1") -> int:
    """One block with a ``contract.create`` sealed into ``sealer``'s chain and appended to the stream."""
    tx = encode_envelope(make_envelope("tx:contract.create", {"name": name}, sender="sn-1", role="sn"))
    ledger = sealer.ledger
    await asyncio.to_thread(ledger.seal, [tx], sealer=None, sealer_uid=sealer_uid, now=time.time())
    await sealer.log.append(ledger.height, ledger.raw_blocks(ledger.height, ledger.height + 1)[0])
    return ledger.height


async def test_a_lagging_sn_reads_the_blocks_it_waits_for_from_the_stream(
    make_bus: MakeBus, nats_url: str, network: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with _sn(make_bus, nats_url, network, "sn-1", tmp_path / "a.db") as sealer:
        async with _sn(make_bus, nats_url, network, "sn-2", tmp_path / "b.db") as lagging:
            assert lagging.ledger.height == sealer.ledger.height == 0
            for name in ("c1", "c2", "c3"):
                height = await _seal_and_append(sealer, name)
            with caplog.at_level(logging.INFO, logger="swarm.sn.cluster"):
                assert await lagging.reach(height, timeout=10)  # its feed never ran
            assert "read blocks 1-3 from the stream: its feed lags" in caplog.text
            assert lagging.ledger.height == height == 3
            assert lagging.ledger.raw_blocks(0) == sealer.ledger.raw_blocks(0)
            assert set(lagging.ledger.state.contracts) >= {"c1", "c2", "c3"}
            follow = asyncio.create_task(lagging.follow())  # the feed goes on after the blocks read
            try:
                height = await _seal_and_append(sealer, "c4")
                assert await lagging.wait_for(height, timeout=10)
            finally:
                follow.cancel()
                await asyncio.gather(follow, return_exceptions=True)
            assert lagging.ledger.raw_blocks(0) == sealer.ledger.raw_blocks(0)


async def test_a_block_of_a_sealer_outside_the_swarm_is_not_taken_from_the_stream(
    make_bus: MakeBus, nats_url: str, network: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with _sn(make_bus, nats_url, network, "sn-1", tmp_path / "a.db") as sealer:
        async with _sn(make_bus, nats_url, network, "sn-2", tmp_path / "b.db") as lagging:
            height = await _seal_and_append(sealer, "c1", sealer_uid="sn-9")  # no SN of this swarm
            with caplog.at_level(logging.WARNING, logger="swarm.sn.cluster"):
                assert not await lagging.reach(height, timeout=1)
            assert lagging.ledger.height == 0
            refused = (
                "block 1 is refused: its sealer 'sn-9' is not an SN of this swarm"
                " (read from the stream; this SN waits for its feed)"
            )
            assert refused in caplog.text


async def test_a_write_is_refused_as_failover_while_jetstream_cannot_say_who_seals(
    make_bus: MakeBus, nats_url: str, network: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no_answer(self: ChainLog) -> str | None:
        raise nats.errors.TimeoutError

    async with _sn(make_bus, nats_url, network, "sn-1", tmp_path / "a.db"):
        async with _sn(make_bus, nats_url, network, "sn-2", tmp_path / "b.db") as forwarding:
            monkeypatch.setattr(ChainLog, "sealer", no_answer)
            tx = encode_envelope(
                make_envelope("tx:contract.create", {"name": "c1"}, sender="sn-2", role="sn")
            )
            with pytest.raises(RpcError) as refused:
                await forwarding.forward(tx)
    assert refused.value.code == "failover"
    assert str(refused.value) == "cannot tell which SN seals now (nats: timeout); try again"


async def test_a_write_is_refused_as_failover_when_the_sealer_lookup_or_the_sealer_does_not_answer(
    make_bus: MakeBus, nats_url: str, network: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both waits are bounded (SEALER_LOOKUP_WAIT, FORWARD_WAIT), together below a client's wait for one
    answer: the client hears "failover" and asks this SN again rather than moving to another (which may
    be the sealer cut off from the cluster, its presence still online)."""
    assert Patience().attempt > SEALER_LOOKUP_WAIT + FORWARD_WAIT

    async def hangs(self: ChainLog) -> str | None:
        await asyncio.sleep(3600)
        return None

    async def cut_off(self: ChainLog) -> str | None:
        return "sn-1"  # holds the lease, answers nothing (its bus serves no requests here)

    tx = encode_envelope(make_envelope("tx:contract.create", {"name": "c1"}, sender="sn-2", role="sn"))
    async with _sn(make_bus, nats_url, network, "sn-1", tmp_path / "a.db"):
        async with _sn(make_bus, nats_url, network, "sn-2", tmp_path / "b.db") as forwarding:
            refusals = []
            for lookup in (hangs, cut_off):
                monkeypatch.setattr(ChainLog, "sealer", lookup)
                with pytest.raises(RpcError) as refused:
                    await forwarding.forward(tx)
                refusals.append((refused.value.code, str(refused.value)))
    assert refusals[0] == ("failover", "cannot tell which SN seals now (TimeoutError); try again")
    assert refusals[1][0] == "failover"
    assert refusals[1][1].startswith("the sealing SN 'sn-1' did not answer: no reply from 'sn-1'"), refusals
