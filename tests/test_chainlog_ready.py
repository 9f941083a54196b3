"""An SN that starts beside a NATS cluster that has just started waits for its JetStream to answer
(a real ``nats-server`` with JetStream; the cluster's not-yet-ready answers, which a running server
cannot be made to give on demand, stand in as the timeouts ``nats-py`` raises for them)."""

from __future__ import annotations

import logging

import nats.errors
import pytest

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
