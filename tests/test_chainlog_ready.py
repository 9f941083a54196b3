"""An SN that starts beside a NATS cluster that has just started waits for its JetStream to answer
(a real ``nats-server`` with JetStream; the cluster's not-yet-ready answers, which a running server
cannot be made to give on demand, stand in as the timeouts ``nats-py`` raises for them)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import nats.errors
import nats.js.errors
import pytest
from nats.js import JetStreamContext
from nats.js.api import ClusterInfo, StreamInfo

from daemons.sn import chainlog
from daemons.sn.chainlog import ChainLog, ChainLogError


def _not_ready_for(monkeypatch: pytest.MonkeyPatch, times: int) -> list[int]:
    """JetStream requests time out ``times`` times, then reach the server; the calls, counted."""
    calls: list[int] = []
    real = ChainLog._ensure_stream

    async def ensure_stream(self: ChainLog) -> None:
        calls.append(1)
        if len(calls) <= times:
            raise nats.errors.TimeoutError
        await real(self)

    monkeypatch.setattr(ChainLog, "_ensure_stream", ensure_stream)
    monkeypatch.setattr(chainlog, "_READY_RETRY", 0.05)
    return calls


async def test_an_sn_waits_for_a_cluster_whose_jetstream_is_not_ready_yet(
    nats_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls = _not_ready_for(monkeypatch, 2)
    with caplog.at_level(logging.WARNING, logger="swarm.sn.chainlog"):
        async with ChainLog([nats_url], "net", "sn-1", replicas=1) as log:
            assert await log.height() == -1  # the stream was made
    assert len(calls) == 3
    assert caplog.text.count("JetStream does not answer yet (nats: timeout); asking again") == 2


async def test_an_sn_gives_up_on_a_jetstream_that_never_answers_saying_where(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _not_ready_for(monkeypatch, 1_000_000)
    monkeypatch.setattr(chainlog, "JETSTREAM_READY_WAIT", 0.3)
    with pytest.raises(
        ChainLogError, match=r"cannot use the NATS cluster at nats://127\.0\.0\.1:\d+: nats: timeout"
    ):
        async with ChainLog([nats_url], "net", "sn-1", replicas=1):
            pass


async def test_an_sn_waits_while_the_cluster_has_too_few_nodes_or_a_leaderless_stream(
    nats_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A cluster still forming refuses a replicated stream for want of peers, then has it without a
    leader for a moment (seen in the suite on 2 loaded cores: the genesis block found no stream to take
    it); both are waited out like a timeout."""
    monkeypatch.setattr(chainlog, "_READY_RETRY", 0.05)
    no_peers = nats.js.errors.BadRequestError(
        code=400, err_code=10005, description="no suitable peers for placement, peer offline"
    )
    real_info, real_add = JetStreamContext.stream_info, JetStreamContext.add_stream
    calls: list[str] = []

    async def stream_info(self: JetStreamContext, name: str, *args: Any, **kwargs: Any) -> StreamInfo:
        calls.append(name)
        if len(calls) == 1:
            raise no_peers
        return await real_info(self, name, *args, **kwargs)

    async def add_stream(self: JetStreamContext, *args: Any, **kwargs: Any) -> StreamInfo:
        info = await real_add(self, *args, **kwargs)
        return dataclasses.replace(info, cluster=ClusterInfo(leader=None, name="c"))  # no leader chosen yet

    monkeypatch.setattr(JetStreamContext, "stream_info", stream_info)
    monkeypatch.setattr(JetStreamContext, "add_stream", add_stream)
    with caplog.at_level(logging.WARNING, logger="swarm.sn.chainlog"):
        async with ChainLog([nats_url], "net", "sn-1", replicas=1) as log:
            assert await log.height() == -1
    assert "err_code=10005 description='no suitable peers for placement, peer offline'" in caplog.text
    assert "does not answer yet (the stream SWARM_net_CHAIN has no leader yet)" in caplog.text
    assert calls[:3] == ["SWARM_net_CHAIN"] * 3  # refused, not there yet (made leaderless), there with one


async def test_an_sn_does_not_wait_out_a_refusal_that_is_not_about_forming(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def stream_info(self: JetStreamContext, name: str, *args: Any, **kwargs: Any) -> StreamInfo:
        raise nats.js.errors.BadRequestError(code=400, err_code=10052, description="invalid stream name")

    monkeypatch.setattr(JetStreamContext, "stream_info", stream_info)
    monkeypatch.setattr(chainlog, "JETSTREAM_READY_WAIT", 60.0)
    with pytest.raises(ChainLogError, match="invalid stream name"):
        async with ChainLog([nats_url], "net", "sn-1", replicas=1):
            pass
