"""A bus session: one MQTT 3.1.1 connection that reconnects, resubscribes and keeps presence.

``async with Bus(config) as bus:`` connects (or raises BusConnectError saying why), publishes the
retained ``online`` presence (with an ``offline`` will), and supervises its background tasks in one
TaskGroup. Subscriptions are bounded queues; request/reply lives in ``daemons.bus.rpc``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Container, Coroutine, Iterable
from typing import Any

import aiomqtt

from daemons.aio import raise_if_cancelling
from daemons.bus import paho_fixes
from daemons.bus.config import BrokerAddress, BusConfig
from daemons.bus.endpoint import Message, Subscription
from daemons.bus.errors import BusConnectError, BusError
from daemons.bus.mqtt_client import ClosedBeforeConnack, DirectClient
from daemons.bus.retained import RetainedPresence
from daemons.bus.rpc import Handler, RpcClient, RpcServer, subscribe_requests
from daemons.bus.topics import Topics, namespace_of, topic_matches
from wire import (
    CodecError,
    Envelope,
    SignerLike,
    VerifierLike,
    decode_envelope,
    encode_envelope,
    make_envelope,
)

__all__ = ["Bus", "Message", "Subscription"]

log = logging.getLogger("swarm.bus")
paho_fixes.apply()


class _PahoErrors(logging.Handler):
    """Catches the errors paho only logs (a refused TLS handshake shows up as a timeout otherwise)."""

    def __init__(self, on_error: Callable[[str], None]) -> None:
        super().__init__(logging.ERROR)
        self._on_error = on_error

    def emit(self, record: logging.LogRecord) -> None:
        self._on_error(record.getMessage())


NEEDS_CERTIFICATES = "this SN requires client certificates (--cert/--key/--capath)"
NO_TLS = (
    "does this SN run without certificates? Its broker does not speak TLS (then drop --cert/--key/--capath)"
)


def _describe(exc: BaseException | str, *, tls: bool | None = None) -> str:
    """Turn aiomqtt/paho/ssl failures into one line a user can act on (``tls``: whether we use TLS)."""
    text = str(exc)
    cause = None if isinstance(exc, str) else exc.__cause__ or exc.__context__
    if isinstance(exc, ssl.SSLCertVerificationError) or isinstance(cause, ssl.SSLCertVerificationError):
        return f"the broker's certificate is not trusted ({exc}); is it from this swarm's CA?"
    lowered = text.lower()
    if tls is False and ("reset by peer" in lowered or "errno 104" in lowered):
        return f"{NEEDS_CERTIFICATES}; its broker closed our plain connection ({text})"
    if tls and any(m in lowered for m in ("wrong version number", "record layer failure", "reset by peer")):
        return f"{NO_TLS} ({text})"
    if "certificate required" in lowered:
        return f"the broker requires a TLS client certificate and we sent none ({text})"
    if "unknown ca" in lowered:
        return f"the broker refused our TLS client certificate: not issued by its CA ({text})"
    if "alert" in lowered and ("certificate" in lowered or "handshake" in lowered):
        return f"the broker refused our TLS client certificate ({text})"
    if tls and "eof occurred in violation of protocol" in lowered:
        # TLS 1.3: the broker checks our certificate after we think the handshake done, and its alert
        # may be lost as it closes; an EOF there is then all we see of the refusal
        return f"the broker closed the TLS connection as it opened: our client certificate refused? ({text})"
    if "not authori" in lowered or "bad user name or password" in lowered:
        return f"the broker refused this identity ({text})"
    if "refused" in lowered or "errno 111" in lowered:
        return f"connection refused ({text}); is the broker running on that port?"
    return text or type(exc).__name__


def _is_fatal(exc: BaseException | str, described: str = "") -> bool:
    """Errors that another attempt cannot fix (bad certificates, refused identity, TLS mismatch)."""
    text = str(exc).lower()
    return (
        isinstance(exc, ssl.SSLError)
        or any(marker in text for marker in ("certificate", "not authori", "ssl", "tls"))
        or described.startswith((NEEDS_CERTIFICATES, NO_TLS))
    )


async def _first_of(events: Iterable[asyncio.Event], *, timeout: float) -> None:
    """Wait until one of ``events`` is set, or ``timeout`` seconds."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


class Bus:
    """One process's session on the swarm bus."""

    def __init__(
        self,
        config: BusConfig,
        *,
        signer: SignerLike | None = None,
        verifier: VerifierLike | None = None,
        presence: dict[str, Any] | None = None,
        answers: bool = False,
    ) -> None:
        self.config = config
        self.topics = Topics(config.network, config.uid, config.identity or config.uid)
        self.signer = signer
        self.verifier = verifier
        self._presence = presence
        self.session = secrets.token_hex(8)
        self._subs: list[Subscription] = []
        self._at_broker: dict[str, aiomqtt.Client] = {}  # filter -> the connection that has its SUBACK
        self._kept: set[str] = set()  # filters subscribed with keep: never unsubscribed
        self._retained = RetainedPresence(self.topics.presence())  # for subscriptions sharing a filter
        self._client: aiomqtt.Client | None = None
        self._connected = asyncio.Event()
        self._failed = asyncio.Event()
        self._last_error: str = ""
        self._broker_errors: dict[str, str] = {}  # broker -> why its last attempt failed (each records one)
        self._tried: set[str] = set()  # brokers of the list tried so far
        self._attempt_ended = asyncio.Event()  # set as each connection attempt fails
        self._refused_for_good: set[str] = set()  # brokers whose refusal another attempt cannot change
        self._paho_said = False  # paho logged why the current attempt failed
        self._closing = False
        self._left = False  # said offline for good (leave()): never online again
        self._ever_connected = False
        self._tasks: asyncio.TaskGroup | None = None
        self._children: list[asyncio.Task[Any]] = []
        self.rpc = RpcClient(self)
        self.reconnects = 0
        self._reconnect_events: list[asyncio.Event] = []
        self._next_reconnect = asyncio.Event()
        self._broker_index = 0
        # a session that answers requests takes them from its first connection on, before its presence
        # says online: one sent the moment a client sees that presence is never lost (serve() reads them)
        self._requests = subscribe_requests(self) if answers else None
        self.refused: Container[str] = frozenset()
        """Identities (certificate CNs) whose messages this session drops: the revoked ones."""
        self._refusals_logged: set[str] = set()
        self._mqtt_log = logging.getLogger(f"swarm.bus.mqtt.{config.uid}.{id(self):x}")
        self._mqtt_log.propagate = False
        self._mqtt_log.addHandler(_PahoErrors(self._note_paho_error))

    # ----------------------------------------------------------------- identity
    @property
    def uid(self) -> str:
        """This session's identity."""
        return self.config.uid

    @property
    def role(self) -> str:
        """This session's role (sn, swop, sl, swci)."""
        return self.config.role

    @property
    def voucher(self) -> str | None:
        """The identity that vouches for this node when the uid is not the certificate's CN."""
        identity = self.config.identity
        return None if identity in (None, self.uid) else identity

    @property
    def connected(self) -> bool:
        """True while the connection is up."""
        return self._connected.is_set()

    # ---------------------------------------------------------------- lifecycle
    async def __aenter__(self) -> Bus:
        self._tasks = asyncio.TaskGroup()
        await self._tasks.__aenter__()
        self.spawn(self._connection_loop(), "connection")
        self.spawn(self.rpc.run(), "replies")
        if self._presence is not None:
            self.spawn(self._guard_presence(), "presence-guard")
        try:
            await self._wait_first_connection()
        except BaseException:
            await self._shutdown()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._shutdown()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run ``coro`` under this session's TaskGroup; cancelled when the session closes."""
        if self._tasks is None:
            coro.close()
            raise BusError("the bus session is not open")
        task = self._tasks.create_task(self._guard(coro, name), name=f"bus[{self.uid}].{name}")
        self._children.append(task)
        return task

    async def _guard(self, coro: Awaitable[Any], name: str) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("bus[%s] task %s failed", self.uid, name)

    async def _wait_first_connection(self) -> None:
        # connect_timeout, and on until each broker of a list has had its turn, connect_timeout each at
        # most: one that takes the connection and does not answer it (a NATS node while its cluster elects)
        # must not use up the others' turn, and a list of brokers that all refuse fails as one broker does.
        loop = asyncio.get_running_loop()
        timeout = self.config.connect_timeout
        addresses = set(self._broker_names)
        until, at_most = loop.time() + timeout, loop.time() + timeout * len(addresses)
        while not (self._connected.is_set() or self._failed.is_set()):
            now = loop.time()
            if now >= at_most or (now >= until and self._broker_errors.keys() >= addresses):
                break
            self._attempt_ended.clear()
            events = (self._connected, self._failed, self._attempt_ended)
            await _first_of(events, timeout=(until if now < until else at_most) - now)
        if not self._connected.is_set():
            raise BusConnectError(self._why_not_connected())

    def _why_not_connected(self) -> str:
        """Why the first connection failed; for a list of brokers, each one's own reason."""
        addresses = self._broker_names
        silent = f"no answer within {self.config.connect_timeout:g} s"  # its attempt had not ended
        if len(addresses) == 1:
            return f"cannot connect to {self.config.broker} as {self.uid!r}: {self._last_error or silent}"
        reasons = [
            f"{a}: {self._broker_errors.get(a, silent if a in self._tried else 'not tried')}"
            for a in addresses
        ]
        return f"cannot connect as {self.uid!r} to any broker of the list: {' | '.join(reasons)}"

    async def _shutdown(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._presence is not None and self._client is not None and self.connected:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self._publish_presence("offline")
        for task in self._children:
            task.cancel()
        if self._tasks is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._tasks.__aexit__(None, None, None)
            self._tasks = None

    # --------------------------------------------------------------- connection
    @property
    def _broker_names(self) -> tuple[str, ...]:
        """The brokers of the list, as their reasons and errors name them."""
        return tuple(str(address) for address in self.config.broker.addresses)

    @property
    def broker(self) -> BrokerAddress:
        """The broker of the list this session uses now (or tries next)."""
        addresses = self.config.broker.addresses
        return addresses[self._broker_index % len(addresses)]

    def _make_client(self) -> aiomqtt.Client:
        cfg = self.config
        will = None
        if self._presence is not None:
            will = aiomqtt.Will(
                self.topics.presence(self.uid),
                self._presence_payload("offline"),
                qos=cfg.publish_qos,
                retain=True,
            )
        return DirectClient(
            self.broker.host,
            self.broker.port,
            identifier=f"{self.uid}-{os.getpid()}-{random.getrandbits(24):06x}",
            protocol=aiomqtt.ProtocolVersion.V311,
            clean_session=True,
            keepalive=cfg.keepalive,
            will=will,
            tls_context=cfg.tls,
            timeout=cfg.connect_timeout,  # its CONNACK; publish_timeout once connected (_on_connect)
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
            logger=self._mqtt_log,
            deliver=self._dispatch,
        )

    async def _connection_loop(self) -> None:
        attempt = 0
        while not self._closing:
            client = self._make_client()
            self._tried.add(str(self.broker))
            self._paho_said = False
            try:
                async with client:
                    await self._on_connect(client)
                    attempt = 0
                    async for _ in client.messages:  # none: they go to _dispatch; ends when disconnected
                        pass
            except aiomqtt.MqttError as exc:
                self._note_failure(exc)
            finally:
                self._client = None
                self._connected.clear()
                self._at_broker.clear()  # the next connection subscribes anew (and holds no old client)
            if self._closing:
                return
            raise_if_cancelling()
            if len(self.config.broker.addresses) > 1:  # a cluster: the next node of the list
                self._broker_index += 1
                log.info("bus[%s] trying broker %s", self.uid, self.broker)
            attempt += 1
            await asyncio.sleep(self._reconnect_delay(attempt))

    def _reconnect_delay(self, attempt: int) -> float:
        """Seconds before connection attempt ``attempt + 1``: a broker not up yet at our start (a daemon
        started beside it) is looked for every ``first_connect_poll`` s; one that went away, with
        jittered exponential backoff, so that a swarm's nodes do not all come back at once."""
        if not self._ever_connected:
            return self.config.first_connect_poll
        return random.uniform(0, min(self.config.backoff_cap, self.config.backoff_base * 2**attempt))

    def _note_paho_error(self, text: str) -> None:
        timed_out = "timed out" in text.lower()
        if timed_out and self._last_error:
            return
        self._last_error = _describe(text, tls=self.config.tls is not None)
        if not timed_out:
            self._broker_errors[str(self.broker)] = self._last_error
            self._paho_said = True
        if not self._ever_connected and _is_fatal(text, self._last_error):
            self._refused_for_good_by(str(self.broker))

    def _refused_for_good_by(self, broker: str) -> None:
        """The first connection ends once every broker of the list refused it for a reason another attempt
        cannot change (a certificate, TLS or not): the nodes of a cluster may be set up apart, so one
        node's refusal leaves the others their turn."""
        self._refused_for_good.add(broker)
        if self._refused_for_good >= set(self._broker_names):
            self._failed.set()

    def _note_failure(self, exc: BaseException) -> None:
        self._attempt_ended.set()
        # When aiomqtt only says "timed out", paho has logged the real reason already (_note_paho_error),
        # if there was one: else the broker did not answer. A connection closed before its CONNACK
        # (ClosedBeforeConnack) keeps paho's reason too, when paho logged one.
        timed_out = "timed out" in str(exc).lower()
        if timed_out and not self._paho_said:
            self._broker_errors[str(self.broker)] = f"no answer within {self.config.connect_timeout:g} s"
        said_already = isinstance(exc, ClosedBeforeConnack) and self._paho_said
        if not (self._last_error and timed_out) and not said_already:
            self._last_error = _describe(exc, tls=self.config.tls is not None)
            if not timed_out:
                self._broker_errors[str(self.broker)] = self._last_error
            if not self._ever_connected and _is_fatal(exc, self._last_error):
                self._refused_for_good_by(str(self.broker))
        if self._ever_connected:
            log.warning("bus[%s] lost %s: %s; reconnecting", self.uid, self.broker, self._last_error)

    async def _on_connect(self, client: aiomqtt.Client) -> None:
        # A broker that takes our connection but does not answer it (a NATS node while its cluster
        # elects) is left after connect_timeout for the next of the list; other calls wait longer.
        client.timeout = self.config.publish_timeout
        self._client = client
        # Kept filters too, in use or not: a block on one later (a new sealer's presence watch, in the
        # failover that made it the sealer) sends no SUBSCRIBE then, which on a NATS cluster writes the
        # session store, whose leader that failover may have taken away.
        for topic_filter in dict.fromkeys([*(s.filter for s in self._subs), *sorted(self._kept)]):
            await client.subscribe(topic_filter, qos=self.config.subscribe_qos)
            self._at_broker[topic_filter] = client
        if self._presence is not None and not self._left:
            await self._publish_presence("online")
        if self._ever_connected:
            self.reconnects += 1
            log.info("bus[%s] reconnected to %s", self.uid, self.broker)
            for event in self._reconnect_events:
                event.set()
            self._next_reconnect.set()
            self._next_reconnect = asyncio.Event()
        self._ever_connected = True
        self._connected.set()

    def _dispatch(self, topic: str, payload: bytes, retain: bool) -> None:
        """Offer a message from the broker to every subscription whose filter matches its topic."""
        msg = Message(topic, payload, retain)
        owner = namespace_of(msg.topic)
        if owner is not None and owner[0] in self.refused:
            self._note_refused(owner[0], msg.topic)
            return
        self._retained.note(msg)
        for sub in self._subs:
            if topic_matches(sub.filter, msg.topic):
                sub.offer(msg)

    def _note_refused(self, identity: str, topic: str) -> None:
        """Log the first dropped message of each refused identity (a revoked node may keep trying)."""
        if identity in self._refusals_logged:
            log.debug("bus[%s] dropped a message of revoked identity %s on %s", self.uid, identity, topic)
            return
        self._refusals_logged.add(identity)
        log.warning("bus[%s] drops the messages of revoked identity %s (%s)", self.uid, identity, topic)

    # --------------------------------------------------------------- presence
    def _presence_payload(self, state: str) -> bytes:
        body = {"state": state, **(self._presence or {}), "session": self.session}
        return self.encode("presence", body)

    async def _guard_presence(self) -> None:
        """Keep this session's presence when another session of the same uid overwrites it.

        A second session (a copy started by mistake, or one that the ledger refused) publishes its
        own retained presence, and its ``offline`` when it ends; this live session then says
        ``online`` again, so that nobody takes the end of the other session for its own.
        """
        sub = self.add_subscription(self.topics.presence(self.uid))
        async for message in sub:
            raise_if_cancelling()
            try:
                env = self.open(message)
            except CodecError:
                continue
            other = env.body.get("session")
            if env.kind != "presence" or other == self.session or self._closing or self._left:
                continue
            state = env.body.get("state")
            log.warning(
                "bus[%s] another session (%s, host %s, pid %s) of this node says %s",
                self.uid,
                other,
                env.body.get("host"),
                env.body.get("pid"),
                state,
            )
            if state != "online":
                with contextlib.suppress(BusError, aiomqtt.MqttError):
                    await self._publish_presence("online")

    async def leave(self) -> None:
        """Say ``offline`` now (retained presence) and never ``online`` again, while the connection stays:
        the SN counts the node as gone (an SL whose certificate is about to expire leaves so)."""
        self._left = True
        if self._presence is not None:
            await self._publish_presence("offline")

    async def _publish_presence(self, state: str) -> None:
        client = self._client
        if client is not None:
            payload = self._presence_payload(state)
            await client.publish(
                self.topics.presence(self.uid), payload, qos=self.config.publish_qos, retain=True
            )

    async def wait_reconnect(self, timeout: float) -> bool:
        """True once this session reconnects (the broker is back), False after ``timeout`` seconds."""
        try:
            async with asyncio.timeout(timeout):
                await self._next_reconnect.wait()
        except TimeoutError:
            return False
        return True

    def notify_reconnects(self, event: asyncio.Event) -> None:
        """Set ``event`` after every reconnect (messages published meanwhile were not delivered)."""
        self._reconnect_events.append(event)

    # ---------------------------------------------------------------- publish
    async def _wait_connected(self, timeout: float) -> aiomqtt.Client:
        try:
            async with asyncio.timeout(timeout):
                await self._connected.wait()
        except TimeoutError:
            raise BusError(
                f"not connected to {self.config.broker} for {timeout:g} s: {self._last_error}"
            ) from None
        assert self._client is not None  # noqa: S101 - set together with _connected
        return self._client

    async def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int | None = None,
        retain: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Publish (at ``qos``, by default the session's ``publish_qos``), waiting through a reconnect if
        needed; raise BusError after ``timeout``."""
        qos = self.config.publish_qos if qos is None else qos
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout or self.config.publish_timeout)
        while True:
            client = await self._wait_connected(max(deadline - loop.time(), 0.01))
            try:  # within the deadline, even if the broker never acknowledges
                await client.publish(
                    topic, payload, qos=qos, retain=retain, timeout=max(deadline - loop.time(), 0.01)
                )
                raise_if_cancelling()  # aiomqtt's wait_for may have swallowed our cancellation
                return
            except aiomqtt.MqttError as exc:
                if loop.time() >= deadline:
                    raise BusError(f"publish to {topic} failed: {_describe(exc)}") from None
                await asyncio.sleep(0.05)

    def encode(
        self,
        kind: str,
        body: dict[str, Any],
        *,
        reply_to: str | None = None,
        corr: str | None = None,
    ) -> bytes:
        """Build and sign (when this session has a signer) an envelope's wire bytes."""
        env = make_envelope(
            kind,
            body,
            sender=self.uid,
            role=self.role,
            signer=self.signer,
            reply_to=reply_to,
            corr=corr,
            voucher=self.voucher,
        )
        return encode_envelope(env)

    async def send(self, topic: str, kind: str, body: dict[str, Any], *, retain: bool = False) -> None:
        """Publish an envelope of ``kind`` with ``body``."""
        await self.publish(topic, self.encode(kind, body), retain=retain)

    def open(self, message: Message) -> Envelope:
        """Decode and verify an envelope; its identity and sender must own the topic's namespace.

        Raises CodecError (SignatureError) naming what is wrong; an envelope of an identity in
        :attr:`refused` (sent or vouched for by it) is refused too.
        """
        env = decode_envelope(message.payload, verifier=self.verifier, what=f"message on {message.topic}")
        if env.identity in self.refused:
            raise CodecError(f"message on {message.topic} comes from revoked identity {env.identity!r}")
        owner = namespace_of(message.topic)
        if owner is not None and owner != (env.identity, env.sender):
            raise CodecError(
                f"message on {message.topic} comes from {env.sender!r} of identity {env.identity!r}, "
                f"not from {owner[1]!r} of identity {owner[0]!r}"
            )
        return env

    # -------------------------------------------------------------- subscribe
    @contextlib.asynccontextmanager
    async def subscribe(
        self, topic_filter: str, *, maxsize: int = 1000, keep: bool = False
    ) -> AsyncIterator[Subscription]:
        """Subscribe to ``topic_filter`` for the duration of the block (SUBACK received on entry while
        connected; during an outage the next reconnect subscribes it, as it does every subscription).

        ``keep``: the broker keeps the filter after the block, and every reconnect subscribes it again,
        so the next block on it costs no round trip to the broker (a filter taken again and again: a
        round's events); its messages in between match no subscription and are dropped here.
        """
        sub = Subscription(topic_filter, maxsize)
        self._subs.append(sub)
        if keep:
            self._kept.add(topic_filter)
        try:
            try:
                client: aiomqtt.Client | None = await self._wait_connected(self.config.connect_timeout)
            except BusError as exc:
                log.warning("bus[%s] %s; subscribing to %s when it is back", self.uid, exc, topic_filter)
                client = None
            if client is not None and self._at_broker.get(topic_filter) is not client:
                with contextlib.suppress(aiomqtt.MqttError):  # a reconnect resubscribes everything
                    await client.subscribe(topic_filter, qos=self.config.subscribe_qos)
                    self._at_broker[topic_filter] = client
                raise_if_cancelling()
            elif client is not None:  # the broker's subscription is shared: no retained messages come
                for message in self._retained.matching(topic_filter):
                    sub.offer(message)
            yield sub
        finally:
            self._subs.remove(sub)
            await self._unsubscribe_unused(topic_filter)

    async def _unsubscribe_unused(self, topic_filter: str) -> None:
        """UNSUBSCRIBE a filter no subscription uses any more, unless it is kept; a closing session
        unsubscribes from nothing (the connection may be gone: no UNSUBACK)."""
        client_now = self._client
        if (
            client_now is None
            or self._closing
            or topic_filter in self._kept
            or any(s.filter == topic_filter for s in self._subs)
        ):
            return
        self._at_broker.pop(topic_filter, None)
        with contextlib.suppress(aiomqtt.MqttError, asyncio.CancelledError):
            await client_now.unsubscribe(topic_filter)
        raise_if_cancelling()  # the suppress above must not swallow our own cancellation

    def add_subscription(self, topic_filter: str, *, maxsize: int = 1000) -> Subscription:
        """A subscription for the whole session (subscribed on the next (re)connect or now)."""
        sub = Subscription(topic_filter, maxsize)
        self._subs.append(sub)
        client = self._client
        if client is not None:
            self.spawn(
                client.subscribe(topic_filter, qos=self.config.subscribe_qos), f"subscribe {topic_filter}"
            )
        return sub

    # ------------------------------------------------------------------- rpc
    async def request(
        self,
        target: str,
        method: str,
        body: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        role: str | None = None,
        settled: asyncio.Future[Any] | None = None,
    ) -> Any:
        """Ask ``target`` to run ``method``; returns its result or raises RequestTimeout/RemoteError.

        ``role``: accept only a reply of this role (a vouched SL cannot answer for an SN). ``settled``:
        the result known another way, the server answering only failures (``RpcClient.request``).
        """
        return await self.rpc.request(
            target,
            method,
            body or {},
            timeout=timeout or self.config.request_timeout,
            role=role,
            settled=settled,
        )

    def serve(self, handler: Handler, *, concurrency: int = 32) -> RpcServer:
        """Answer requests addressed to this uid with ``handler`` until the session closes (with
        ``answers``, also those that came since the session connected)."""
        subscription, self._requests = self._requests, None
        server = RpcServer(self, handler, concurrency=concurrency, subscription=subscription)
        self.spawn(server.run(), "rpc-server")
        return server
