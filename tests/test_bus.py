"""The bus against a real mosquitto: request/reply, presence, reconnects, state transfer, bad input."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple

import aiomqtt
import numpy as np
import pytest

from certs import Signer, Verifier, init_swarm, issue_identity
from daemons.broker import ManagedBroker
from daemons.bus import (
    Bus,
    BusConfig,
    BusConnectError,
    RemoteError,
    Request,
    RequestTimeout,
    RpcError,
)
from daemons.bus.config import BrokerAddress
from daemons.bus.endpoint import Subscription
from daemons.bus.mqtt_client import DirectClient
from daemons.bus.transfer import StateHolder, TransferError, fetch_state
from daemons.ledger_client import find_sn
from tests.conftest import MakeBus, bus_factory, eventually, open_and_close
from wire import encode_envelope, make_envelope
from wire.tensors import FlatState


async def echo(request: Request) -> object:
    if request.method == "fail":
        raise RpcError("nope", f"cannot {request.body.get('what')}")
    if request.method == "crash":
        raise ZeroDivisionError("boom")
    if request.method == "slow":
        await asyncio.sleep(float(request.body["s"]))
    return {"method": request.method, "body": request.body, "sender": request.sender}


async def test_request_reply(make_bus: MakeBus) -> None:
    async with make_bus("sn-1", "sn") as server, make_bus("swci-1", "swci") as client:
        server.serve(echo)
        reply = await client.request("sn-1", "ping", {"x": [1, 2]})
        assert reply == {"method": "ping", "body": {"x": [1, 2]}, "sender": "swci-1"}
        replies = await asyncio.gather(*(client.request("sn-1", "n", {"i": i}) for i in range(50)))
        assert [r["body"]["i"] for r in replies] == list(range(50))


async def test_at_qos_0_requests_replies_and_events_travel_unacknowledged(
    make_bus: MakeBus, mosquitto: ManagedBroker
) -> None:
    """``SWARM_PUBLISH_QOS=0`` and ``SWARM_SUBSCRIBE_QOS=0`` (a NATS cluster's bus): every message goes at
    QoS 0, which a QoS-1 subscriber sees on the messages it is handed, and request/reply works as before."""
    qos0 = {"publish_qos": 0, "subscribe_qos": 0}
    async with make_bus("sn-1", "sn", **qos0) as server, make_bus("swci-1", "swci", **qos0) as client:
        server.serve(echo)
        root = server.topics.root
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as watcher:
            await watcher.subscribe(f"{root}/#", qos=1)
            replies = await asyncio.gather(*(client.request("sn-1", "n", {"i": i}) for i in range(20)))
            assert [r["body"]["i"] for r in replies] == list(range(20))
            await server.send(server.topics.event("sn-1", "block"), "block", {"height": 1})
            seen: dict[str, int] = {}
            async with asyncio.timeout(10):
                async for message in watcher.messages:
                    seen[str(message.topic).split("/")[-2]] = message.qos
                    if "ev" in seen:
                        break
        assert seen == {"req": 0, "rep": 0, "ev": 0}


async def test_errors_are_typed_and_name_the_peer(make_bus: MakeBus) -> None:
    async with make_bus("sn-1", "sn") as server, make_bus("swci-1", "swci") as client:
        server.serve(echo)
        with pytest.raises(RemoteError, match="cannot fly") as err:
            await client.request("sn-1", "fail", {"what": "fly"})
        assert err.value.code == "nope"
        assert err.value.peer == "sn-1"
        with pytest.raises(RemoteError, match="ZeroDivisionError: boom"):
            await client.request("sn-1", "crash")
        with pytest.raises(RequestTimeout, match=r"no reply from 'sn-9' to 'status' within 0\.5 s"):
            await client.request("sn-9", "status", timeout=0.5)
        # the server survived all of it
        assert (await client.request("sn-1", "ping"))["method"] == "ping"


async def test_a_slow_handler_is_answered_once_despite_resends(make_bus: MakeBus) -> None:
    calls = 0

    async def counting(request: Request) -> object:
        nonlocal calls
        calls += 1
        await asyncio.sleep(1.6)  # the client resends after 0.5 s and 1.5 s
        return calls

    async with make_bus("sn-1", "sn") as server, make_bus("swci-1", "swci") as client:
        server.serve(counting)
        assert await client.request("sn-1", "slow", timeout=5) == 1
        assert calls == 1


async def test_a_quiet_request_is_answered_only_when_it_fails_or_comes_again(
    make_bus: MakeBus, mosquitto: ManagedBroker
) -> None:
    """A request with ``settled`` (its result known another way, as an SL's check-in from the round's
    event) is not answered when it succeeds; a failure is answered, and so is a resend of a request whose
    other way never came (the cached reply: the handler runs once)."""
    calls: list[str] = []
    shown: asyncio.Future[Any] | None = None

    async def handler(request: Request) -> object:
        calls.append(request.method)
        if request.method == "shown" and shown is not None:
            shown.set_result({"seen": True})  # what an event would tell the client
        return await echo(request)

    async with make_bus("sn-1", "sn") as server, make_bus("sl-1") as client:
        server.serve(handler)
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as watcher:
            await watcher.subscribe(server.topics.reply("sn-1", "sl-1"), qos=1)
            shown = asyncio.Future()
            assert await client.request("sn-1", "shown", {}, settled=shown) == {"seen": True}
            with pytest.raises(RemoteError, match="cannot fly"):
                await client.request("sn-1", "fail", {"what": "fly"}, settled=asyncio.Future())
            never: asyncio.Future[Any] = asyncio.Future()
            reply = await client.request("sn-1", "unseen", {"x": 1}, settled=never, timeout=5)
            assert reply["body"] == {"x": 1, "quiet": True}
            replies = 0
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    async for _ in watcher.messages:
                        replies += 1
        assert replies == 2  # the failure and the resent request; nothing for the one shown otherwise
        assert calls == ["shown", "fail", "unseen"]


async def test_garbage_and_forged_messages_do_not_hurt_the_server(make_bus: MakeBus) -> None:
    async with make_bus("sn-1", "sn") as server, make_bus("sl-1") as client:
        rpc = server.serve(echo)
        assert (await client.request("sn-1", "ping"))["sender"] == "sl-1"  # the server is subscribed
        req_topic = client.topics.request("sl-1", "sn-1")
        await client.publish(req_topic, b"\x00\xff garbage")
        await client.publish(req_topic, b"")
        forged = encode_envelope(
            make_envelope("req:ping", {}, sender="sl-2", role="sl", corr="c", reply_to="sl-2")
        )
        await client.publish(req_topic, forged)  # sender does not own the topic's namespace
        not_a_request = encode_envelope(make_envelope("hello", {}, sender="sl-1", role="sl"))
        await client.publish(req_topic, not_a_request)
        assert (await client.request("sn-1", "ping"))["sender"] == "sl-1"
        assert await eventually(lambda: rpc.rejected == 4), rpc.rejected


async def test_a_request_under_an_expired_certificate_is_answered_with_why(
    make_bus: MakeBus, tmp_path: Path
) -> None:
    init_swarm(tmp_path, sl=1)
    now = dt.datetime.now(dt.UTC)
    issue_identity(
        tmp_path / "ca", "sl-9", "sl", tmp_path, valid_from=now - dt.timedelta(days=1, minutes=1), days=1
    )
    verifier = Verifier.from_ca(tmp_path / "ca" / "capath")

    def signer(uid: str) -> Signer:
        return Signer.from_files(tmp_path / f"{uid}-cert.pem", tmp_path / f"{uid}-key.pem")

    async with (
        make_bus("sn-1", "sn", signer=signer("sn-1"), verifier=verifier) as server,
        make_bus("sl-9", signer=signer("sl-9"), verifier=verifier) as client,
    ):
        rpc = server.serve(echo)
        with pytest.raises(RemoteError, match=r"certificate of 'sl-9' expired on .*: refused") as err:
            await client.request("sn-1", "ping", timeout=5)  # not a silence until the timeout
        assert err.value.code == "rejected"
        assert rpc.rejected == 1


@pytest.mark.parametrize("qos", [1, 0])
async def test_presence_is_retained_and_the_will_says_offline(
    make_bus: MakeBus, mosquitto: ManagedBroker, network: str, qos: int
) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio
        from daemons.bus import Bus, BusConfig
        from daemons.bus.config import BrokerAddress
        async def main():
            cfg = BusConfig(BrokerAddress("127.0.0.1", {mosquitto.port}), "sl-7", "sl", network="{network}",
                            publish_qos={qos})
            async with Bus(cfg, presence={{"role": "sl", "pid": 1}}):
                print("up", flush=True)
                await asyncio.sleep(60)
        asyncio.run(main())
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=os.getcwd())
    try:
        assert proc.stdout is not None
        assert (await asyncio.to_thread(proc.stdout.readline)).strip() == b"up"
        async with make_bus("sn-1", "sn") as observer:
            async with observer.subscribe(observer.topics.presence("sl-7")) as sub:
                first = observer.open(await asyncio.wait_for(sub.get(), 5))
                assert first.body["state"] == "online"
                os.kill(proc.pid, signal.SIGKILL)
                last = observer.open(await asyncio.wait_for(sub.get(), 20))
                assert last.body["state"] == "offline"
                assert last.sender == "sl-7"
    finally:
        proc.kill()
        proc.wait()


async def test_a_request_sent_as_a_server_says_online_is_answered_the_first_time(make_bus: MakeBus) -> None:
    # An SN says online when it connects and serves a moment later (its ledger opens in between): a
    # client that asks at once must not lose its request to that moment (MQTT drops what nobody is
    # subscribed to) and wait for its resend half a second later.
    async with make_bus("swop-1", "swop") as client, make_bus("sniffer-1", "swci") as sniffer:
        requests = sniffer.subscribe(sniffer.topics.request("swop-1", "sn-1"))
        presence = client.subscribe(client.topics.presence("sn-1"))
        async with requests as sent, presence as said:
            async with make_bus("sn-1", "sn", presence={"role": "sn"}, answers=True) as server:
                assert client.open(await asyncio.wait_for(said.get(), 5)).body["state"] == "online"
                asking = asyncio.ensure_future(client.request("sn-1", "ping", timeout=10))
                await asyncio.sleep(0.2)  # the server's set-up, while the request is on its way
                server.serve(echo)
                assert (await asking)["method"] == "ping"
                await asyncio.sleep(0.6)  # a lost request would have been sent again by now
            await asyncio.wait_for(sent.get(), 5)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(sent.get(), 0.1)  # sent once: answered the first time


async def test_a_fetch_from_a_holder_that_goes_offline_ends_at_once(make_bus: MakeBus) -> None:
    async with make_bus("sl-2") as fetcher:
        async with make_bus("sl-1", presence={"role": "sl"}):  # holds nothing, never answers
            fetching = asyncio.ensure_future(fetch_state(fetcher, "sl-1", b"\1" * 32, idle_timeout=60))
            await asyncio.sleep(0.3)
        # its offline presence ends the fetch (not the request's 10 s timeout, nor the idle timeout)
        with pytest.raises(TransferError, match="'sl-1' went offline"):
            await asyncio.wait_for(fetching, 30)


async def test_reconnect_after_the_broker_is_restarted(fresh_mosquitto: ManagedBroker, network: str) -> None:
    make_bus = bus_factory(fresh_mosquitto.address, network)
    async with make_bus("sn-1", "sn") as server, make_bus("swci-1", "swci") as client:
        server.serve(echo)
        assert (await client.request("sn-1", "before"))["method"] == "before"
        fresh_mosquitto.kill()
        await asyncio.sleep(0.3)
        await asyncio.to_thread(fresh_mosquitto.restart)
        assert (await client.request("sn-1", "after", timeout=20))["method"] == "after"
        assert server.reconnects >= 1
        assert client.reconnects >= 1


async def test_connecting_to_nothing_fails_clearly(network: str) -> None:
    from daemons.broker import free_port

    cfg = BusConfig(BrokerAddress("127.0.0.1", free_port()), "sl-1", "sl", network=network, connect_timeout=1)
    with pytest.raises(BusConnectError, match=r"cannot connect to mqtt://127.0.0.1:\d+ as 'sl-1'"):
        async with Bus(cfg):
            pass


@contextlib.asynccontextmanager
async def _silent_broker() -> AsyncIterator[int]:
    """A TCP server on 127.0.0.1 that takes a connection and its CONNECT and answers nothing, until the
    client hangs up (a NATS node while its cluster elects); yields its port."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


async def test_a_list_of_brokers_that_all_fail_says_what_each_one_did(network: str) -> None:
    """One broker takes the connection and never answers it, the other refuses it: the error names
    both, each with its own reason, where it named only the last reason heard."""
    from daemons.broker import free_port

    async with _silent_broker() as silent_port:
        silent_url = f"mqtt://127.0.0.1:{silent_port}"
        refused_url = f"mqtt://127.0.0.1:{free_port()}"
        brokers = BrokerAddress.parse(f"{silent_url},{refused_url}")
        with pytest.raises(BusConnectError) as failed:
            async with Bus(BusConfig(brokers, "sl-1", "sl", network=network, connect_timeout=2)):
                pass  # 4 s in all: the silent one's 2, then the refusal, with 2 s to spare
    text = str(failed.value)
    assert "cannot connect as 'sl-1' to any broker of the list" in text, text
    assert f"{silent_url}: no answer within 2 s | {refused_url}: connection refused" in text, text


async def test_a_list_of_brokers_that_all_refuse_fails_as_one_broker_does(network: str) -> None:
    """Three closed ports: the opening looks for them for ``connect_timeout`` (5 s), as for one broker,
    not once per broker of the list (15 s), and names each one's refusal."""
    from daemons.broker import free_port

    urls = [f"mqtt://127.0.0.1:{free_port()}" for _ in range(3)]
    config = BusConfig(BrokerAddress.parse(",".join(urls)), "sl-1", "sl", network=network, connect_timeout=5)
    with pytest.raises(BusConnectError) as failed:
        await asyncio.wait_for(open_and_close(config), 11)
    text = str(failed.value)
    assert all(f"{url}: connection refused" in text for url in urls), text


async def test_a_bus_opened_before_its_broker_connects_once_the_broker_is_up(
    tmp_path: Path, network: str
) -> None:
    from daemons.broker import BrokerSettings
    from tests.ports import restartable_port

    port = restartable_port()  # nothing listens there for a while: no client connection may take it
    cfg = BusConfig(BrokerAddress("127.0.0.1", port), "swop-1", "swop", network=network, connect_timeout=30)
    broker = ManagedBroker(BrokerSettings(tmp_path / "broker", port=port), "mosquitto")
    bus = Bus(cfg)
    # a daemon started beside its SN looks for the broker often until it first finds it ...
    assert [bus._reconnect_delay(n) for n in range(1, 6)] == [cfg.first_connect_poll] * 5
    try:
        async with contextlib.AsyncExitStack() as stack:  # the bus closes before the broker stops
            opening = asyncio.ensure_future(stack.enter_async_context(bus))
            try:
                await asyncio.sleep(0.5)  # it has found nothing yet
                assert not opening.done()
                await asyncio.to_thread(broker.start)
                await asyncio.wait_for(opening, 30)
            finally:
                opening.cancel()
            assert bus.connected
            # ... and backs off, with jitter, from a broker that went away after that
            delays = [bus._reconnect_delay(n) for n in range(1, 12)]
            assert all(0 <= delay <= cfg.backoff_cap for delay in delays)
            assert len(set(delays)) > 1
    finally:
        broker.stop()


async def test_50mb_state_dict_round_trips_bit_exactly(make_bus: MakeBus) -> None:
    rng = np.random.default_rng(0)
    state = {f"layer{i}.weight": rng.standard_normal((1250, 1000)).astype(np.float32) for i in range(10)}
    state["bn.num_batches_tracked"] = np.array(3, dtype=np.int64)
    async with make_bus("sl-1") as holder_bus, make_bus("sl-2") as fetcher:
        holder = StateHolder(holder_bus)
        holder_bus.serve(holder.handle_fetch)
        manifest = await holder.add(FlatState.from_arrays(state))
        got = await fetch_state(fetcher, "sl-1", manifest.digest)
        assert got.total >= 50_000_000
        for name, arr in state.items():
            assert got.arrays()[name].dtype == arr.dtype
            np.testing.assert_array_equal(got.arrays()[name], arr)
        with pytest.raises(TransferError, match="does not hold model"):
            await fetch_state(fetcher, "sl-1", b"\1" * 32)


async def test_a_fetch_names_the_newest_block_its_sender_saw(make_bus: MakeBus) -> None:
    """The holder's check of who may fetch reads the ledger at least there (``RoundEngine.may_fetch``)."""
    async with make_bus("sl-1") as holder_bus, make_bus("sl-2") as fetcher:
        holder = StateHolder(holder_bus)
        asked: list[Any] = []

        async def noting(request: Request) -> Any:
            asked.append(request.body.get("height"))
            return await holder.handle_fetch(request)

        holder_bus.serve(noting)
        manifest = await holder.add(FlatState.from_arrays({"w": np.ones(8, dtype=np.float32)}))
        await fetch_state(fetcher, "sl-1", manifest.digest, height=23)
        await fetch_state(fetcher, "sl-1", manifest.digest)
        assert asked == [23, None]


class _BrokerCalls:
    """Counts the SUBSCRIBE and UNSUBSCRIBE packets buses send (still sending them)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.subscribes: list[str] = []
        self.unsubscribes: list[str] = []
        subscribe, unsubscribe = DirectClient.subscribe, DirectClient.unsubscribe

        async def counted_subscribe(client: DirectClient, topic: str, *args: Any, **kwargs: Any) -> Any:
            self.subscribes.append(topic)
            return await subscribe(client, topic, *args, **kwargs)

        async def counted_unsubscribe(client: DirectClient, topic: str, *args: Any, **kwargs: Any) -> Any:
            self.unsubscribes.append(topic)
            return await unsubscribe(client, topic, *args, **kwargs)

        monkeypatch.setattr(DirectClient, "subscribe", counted_subscribe)
        monkeypatch.setattr(DirectClient, "unsubscribe", counted_unsubscribe)


async def _next_payload(sub: Subscription, timeout: float = 5) -> bytes:
    return bytes((await asyncio.wait_for(sub.get(), timeout)).payload)


class _Pair(NamedTuple):
    listener: Bus
    sender: Bus
    events: str  # the listener's filter for the sender's events at the path
    published: str  # the topic the sender publishes them on


@contextlib.asynccontextmanager
async def _pair(make_bus: MakeBus, *path: str, publish_timeout: float = 30.0) -> AsyncIterator[_Pair]:
    """An SL listening to an SN's events at ``path`` (``publish_timeout``: of both buses)."""
    async with (
        make_bus("sl-1", publish_timeout=publish_timeout) as listener,
        make_bus("sn-1", "sn", publish_timeout=publish_timeout) as sender,
    ):
        yield _Pair(
            listener, sender, listener.topics.events("sn-1", *path), sender.topics.event("sn-1", *path)
        )


async def test_a_subscription_sharing_the_brokers_filter_still_gets_the_retained_presences(
    make_bus: MakeBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker sends retained messages only on SUBSCRIBE, and a bus sends one per filter: a second
    block on a filter the bus holds (an SN looked for while the node's presence watcher runs) gets the
    presences from the bus, as the broker would have sent them."""
    calls = _BrokerCalls(monkeypatch)
    async with make_bus("sn-1", "sn", presence={"role": "sn"}), make_bus("sl-1") as node:
        everyone = node.topics.presence()
        async with node.subscribe(everyone) as first:
            assert node.open(await asyncio.wait_for(first.get(), 5)).sender == "sn-1"
            async with node.subscribe(everyone) as second:
                again = await asyncio.wait_for(second.get(), 5)
                assert again.retain
                assert node.open(again).body["state"] == "online"
            assert await find_sn(node, timeout=3) == "sn-1"  # before: nothing came, "no SN is online"
        assert calls.subscribes.count(everyone) == 1
        for _ in range(3):  # a failover searches again and again: kept, never unsubscribed
            assert await find_sn(node, timeout=3) == "sn-1"
        assert calls.subscribes.count(everyone) == 1
        assert everyone not in calls.unsubscribes


async def test_a_kept_filter_is_subscribed_once_and_its_next_block_sees_what_follows(
    make_bus: MakeBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _BrokerCalls(monkeypatch)
    async with _pair(make_bus, "round", "c1") as (listener, sender, events, published):
        for block in range(3):
            async with listener.subscribe(events, keep=True) as sub:
                await sender.publish(published, b"in %d" % block)
                assert await _next_payload(sub) == b"in %d" % block
            await sender.publish(published, b"between %d" % block)  # reaches the bus, matches no subscription
        async with listener.subscribe(events, keep=True) as sub:
            await sender.publish(published, b"last")
            assert await _next_payload(sub) == b"last"  # not a message sent between blocks
    assert calls.subscribes.count(events) == 1
    assert events not in calls.unsubscribes


async def test_a_filter_not_kept_is_subscribed_once_while_in_use_and_left_after_its_last_block(
    make_bus: MakeBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _BrokerCalls(monkeypatch)
    async with _pair(make_bus, "node", "sl-1") as (listener, sender, events, published):
        async with listener.subscribe(events) as outer:
            async with listener.subscribe(events) as inner:
                await sender.publish(published, b"both")
                assert await _next_payload(outer) == b"both"
                assert await _next_payload(inner) == b"both"
            assert calls.unsubscribes == []  # the outer block still uses it
        assert calls.subscribes.count(events) == 1
        assert calls.unsubscribes == [events]
        async with listener.subscribe(events) as again:  # the broker left it: subscribed anew
            await sender.publish(published, b"again")
            assert await _next_payload(again) == b"again"
    assert calls.subscribes.count(events) == 2


async def test_a_kept_filter_is_subscribed_again_after_the_broker_restarts(
    fresh_mosquitto: ManagedBroker, network: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _BrokerCalls(monkeypatch)
    async with _pair(bus_factory(fresh_mosquitto.address, network), "round", "c1") as pair:
        listener, sender, events, published = pair
        async with listener.subscribe(events, keep=True) as sub:
            await sender.publish(published, b"before")
            assert await _next_payload(sub) == b"before"
        fresh_mosquitto.kill()
        await asyncio.sleep(0.3)
        await asyncio.to_thread(fresh_mosquitto.restart)
        assert await eventually(lambda: listener.reconnects >= 1 and sender.reconnects >= 1, timeout=20)
        assert calls.subscribes.count(events) == 2  # the new connection subscribed it, with no block open
        async with listener.subscribe(events, keep=True) as sub:
            await sender.publish(published, b"after", timeout=20)
            assert await _next_payload(sub) == b"after"
        assert calls.subscribes.count(events) == 2


async def test_a_publish_waiting_for_its_acknowledgement_is_sent_again_once_the_connection_drops(
    fresh_mosquitto: ManagedBroker, network: str
) -> None:
    """The broker takes a QoS-1 message and dies before it acknowledges it: the publish is sent again on
    the next connection, not when the client gives up waiting for the acknowledgement (here 300 s)."""
    make_bus = bus_factory(fresh_mosquitto.address, network)
    async with _pair(make_bus, "round", "c1", publish_timeout=300) as (_, sender, _, published):
        assert fresh_mosquitto.pid is not None
        os.kill(fresh_mosquitto.pid, signal.SIGSTOP)  # its socket takes the bytes; it answers nothing
        publishing = asyncio.ensure_future(sender.publish(published, b"through a restart", timeout=300))
        await asyncio.sleep(0.5)
        assert not publishing.done()
        fresh_mosquitto.kill()
        await asyncio.to_thread(fresh_mosquitto.restart)
        await asyncio.wait_for(publishing, 60)  # acknowledged by the new broker
        assert sender.reconnects >= 1


async def test_a_subscription_waiting_for_its_acknowledgement_is_made_on_the_next_connection(
    fresh_mosquitto: ManagedBroker, network: str
) -> None:
    """A SUBSCRIBE the broker never acknowledged is made again on the next connection, not when the client
    gives up waiting for the acknowledgement (here 300 s)."""
    make_bus = bus_factory(fresh_mosquitto.address, network)
    async with _pair(make_bus, "round", "c1", publish_timeout=300) as (listener, sender, events, published):
        assert fresh_mosquitto.pid is not None
        os.kill(fresh_mosquitto.pid, signal.SIGSTOP)
        subscribing = asyncio.ensure_future(_first_after_restart(listener, events))
        await asyncio.sleep(0.5)
        fresh_mosquitto.kill()
        await asyncio.to_thread(fresh_mosquitto.restart)
        assert await eventually(lambda: listener.reconnects >= 1, timeout=60)
        await sender.publish(published, b"after", timeout=60)
        assert await asyncio.wait_for(subscribing, 60) == b"after"


async def _first_after_restart(listener: Bus, events: str) -> bytes:
    async with listener.subscribe(events) as sub:  # entered once the SUBSCRIBE's connection is gone
        return await _next_payload(sub, timeout=60)


async def test_a_broker_that_never_answers_the_connection_is_left_for_the_next_one_of_the_list(
    fresh_mosquitto: ManagedBroker, mosquitto: ManagedBroker, network: str
) -> None:
    """A broker of the list that takes the connection and never sends CONNACK (a NATS node while its
    cluster elects) is left after ``connect_timeout``, not after the client's call timeout (here 300 s)."""
    async with _silent_broker() as silent_port:
        ports = (fresh_mosquitto.port, silent_port, mosquitto.port)
        brokers = BrokerAddress.parse(",".join(f"mqtt://127.0.0.1:{port}" for port in ports))
        config = BusConfig(brokers, "sl-1", "sl", network=network, connect_timeout=2, publish_timeout=300)
        async with Bus(config) as bus:
            fresh_mosquitto.kill()  # the bus tries the silent one next, then the session's mosquitto
            assert await eventually(lambda: bus.reconnects >= 1, timeout=60)
            assert bus.broker.port == mosquitto.port
            await bus.publish(bus.topics.presence(bus.uid), b"still here", timeout=10)


async def test_a_first_broker_that_never_answers_leaves_the_next_one_of_the_list_its_turn(
    mosquitto: ManagedBroker, network: str
) -> None:
    """Opening a session gives each broker of its list ``connect_timeout``: one that takes the
    connection and never sends CONNACK (a NATS node while its cluster re-forms after a partition heals)
    does not use up the whole wait, and the session connects to the next one (here 3 s after it began, of
    the 6 s it has)."""
    async with _silent_broker() as silent_port:
        brokers = BrokerAddress.parse(f"mqtt://127.0.0.1:{silent_port},mqtt://127.0.0.1:{mosquitto.port}")
        async with Bus(BusConfig(brokers, "sl-1", "sl", network=network, connect_timeout=3)) as bus:
            assert bus.broker.port == mosquitto.port
