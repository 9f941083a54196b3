"""Request/reply over MQTT 3.1.1: the envelope carries ``reply_to`` and ``corr``.

Servers answer each ``(sender, corr)`` once: a QoS-1 duplicate gets the cached reply, and a duplicate
that arrives while the first is still running is ignored. A request whose body says ``quiet: true`` is
answered only when it fails or comes again: its sender learns of its success another way (an SL sees its
check-in in the ledger's round event), and a resend gets the cached reply.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from daemons.aio import raise_if_cancelling
from daemons.bus.endpoint import Endpoint, Message, Subscription
from daemons.bus.errors import BusError, RemoteError, RequestTimeout
from wire import CertificateTimeError, CodecError, Envelope, decode_envelope

__all__ = ["Handler", "Request", "RpcClient", "RpcError", "RpcServer", "subscribe_requests"]

log = logging.getLogger("swarm.bus.rpc")
_CACHE_SIZE = 2048
_FIRST_RESEND = 0.5
_MAX_RESEND = 2.0


class RpcError(Exception):
    """Raised by a handler for an error the caller should see (``code`` is a short slug)."""

    def __init__(self, code: str, message: str) -> None:
        self.code, self.message = code, message
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class Request:
    """A request as a handler sees it (already verified)."""

    method: str
    body: dict[str, Any]
    sender: str
    role: str
    envelope: Envelope


Handler = Callable[[Request], Awaitable[Any]]


class RpcClient:
    """Sends requests and matches replies to them by ``corr``."""

    def __init__(self, bus: Endpoint) -> None:
        self._bus = bus
        self._pending: dict[str, tuple[str, str | None, asyncio.Future[dict[str, Any]]]] = {}
        self._sub = bus.add_subscription(bus.topics.replies_to(bus.uid))

    async def run(self) -> None:
        """Deliver replies to the requests waiting for them."""
        async for message in self._sub:
            raise_if_cancelling()
            self._on_reply(message)

    def _on_reply(self, message: Message) -> None:
        try:
            env = self._bus.open(message)
        except CodecError as exc:
            log.warning("bus[%s] dropped a reply: %s", self._bus.uid, exc)
            return
        pending = self._pending.get(env.corr or "")
        if env.kind != "rep" or pending is None:
            return
        target, role, future = pending
        if env.sender != target or (role is not None and env.role != role):
            log.warning(
                "bus[%s] reply to %s came from %s %r, not %s %r",
                self._bus.uid,
                env.corr,
                env.role,
                env.sender,
                role or "node",
                target,
            )
            return
        if not future.done():
            future.set_result(env.body)

    async def request(
        self,
        target: str,
        method: str,
        body: dict[str, Any],
        *,
        timeout: float,
        role: str | None = None,
        settled: asyncio.Future[Any] | None = None,
    ) -> Any:
        """Send ``method`` to ``target`` and return its result (only a reply of ``role``, when given).

        The same request (same ``corr``) is resent with backoff until ``timeout``: a request published
        while the server was reconnecting is lost by MQTT, and the server answers duplicates once.
        ``settled``: a future that gives the result another way (an event showing that the request
        took effect). The server is then asked to answer only a failure or a resend (``quiet``), and
        the result is ``settled``'s when it comes first; one that fails is waited out by the replies.
        """
        bus = self._bus
        corr = uuid.uuid4().hex
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[corr] = (target, role, future)
        if settled is not None:
            body = {**body, "quiet": True}
        payload = bus.encode(f"req:{method}", body, reply_to=bus.uid, corr=corr)
        try:
            reply = await self._exchange(target, method, corr, payload, future, timeout, settled)
        finally:
            self._pending.pop(corr, None)
        if reply.get("ok") is True:
            return reply.get("result")
        error = reply.get("error")
        if not isinstance(error, dict):
            error = {
                "code": "bad-reply",
                "message": f"malformed reply from {target!r} to {method!r}",
            }
        raise RemoteError(target, method, str(error.get("code", "error")), str(error.get("message", "")))

    async def _exchange(
        self,
        target: str,
        method: str,
        corr: str,
        payload: bytes,
        future: asyncio.Future[dict[str, Any]],
        timeout: float,
        settled: asyncio.Future[Any] | None,
    ) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        topic = self._bus.topics.request(self._bus.uid, target)
        interval = _FIRST_RESEND
        while True:
            raise_if_cancelling()  # a cancellation swallowed in aiomqtt must not keep us waiting
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise RequestTimeout(target, method, corr, timeout)
            try:
                await self._bus.publish(topic, payload, timeout=remaining)
            except BusError:
                raise RequestTimeout(target, method, corr, timeout) from None
            wait = min(interval, max(deadline - loop.time(), 0.0))
            try:
                async with asyncio.timeout(wait):
                    if settled is not None:
                        await asyncio.wait((future, settled), return_when=asyncio.FIRST_COMPLETED)
                        if not future.done():
                            if _succeeded(settled):
                                return {"ok": True, "result": settled.result()}
                            settled = None  # it failed: the reply, which a resend asks for, is the answer
                    return await asyncio.shield(future)
            except TimeoutError:
                interval = min(interval * 2, _MAX_RESEND)


def _succeeded(future: asyncio.Future[Any]) -> bool:
    return not future.cancelled() and future.exception() is None


def subscribe_requests(bus: Endpoint) -> Subscription:
    """The subscription to the requests addressed to ``bus``'s uid that an ``RpcServer`` reads."""
    return bus.add_subscription(bus.topics.requests_to(bus.uid), maxsize=10_000)


class RpcServer:
    """Answers requests addressed to the bus's uid with one handler."""

    def __init__(
        self, bus: Endpoint, handler: Handler, *, concurrency: int, subscription: Subscription | None = None
    ) -> None:
        self._bus = bus
        self._handler = handler
        self._sem = asyncio.Semaphore(concurrency)
        self._cache: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._in_flight: set[tuple[str, str]] = set()
        # made before its bus connected (Bus answers=True), or now
        self._sub = subscription if subscription is not None else subscribe_requests(bus)
        self.rejected = 0

    async def run(self) -> None:
        """Serve until cancelled; every request runs in its own task, at most ``concurrency``."""
        async with asyncio.TaskGroup() as group:
            async for message in self._sub:
                raise_if_cancelling()
                await self._sem.acquire()
                group.create_task(self._serve_one(message))

    async def _serve_one(self, message: Message) -> None:
        try:
            await self._handle(message)
        except Exception:
            log.exception("bus[%s] failed to answer a request on %s", self._bus.uid, message.topic)
        finally:
            self._sem.release()

    def _accept(self, message: Message) -> Envelope | None:
        """The request in ``message``, or None (logged) when it is not one; CertificateTimeError when its
        certificate is outside its validity period (``_refuse_out_of_date`` answers it)."""
        try:
            env = self._bus.open(message)
        except CertificateTimeError:
            raise
        except CodecError as exc:
            self.rejected += 1
            log.warning("bus[%s] rejected a request: %s", self._bus.uid, exc)
            return None
        if not env.kind.startswith("req:") or env.corr is None or env.reply_to != env.sender:
            self.rejected += 1
            log.warning("bus[%s] rejected %r from %r: not a request", self._bus.uid, env.kind, env.sender)
            return None
        return env

    async def _handle(self, message: Message) -> None:
        try:
            env = self._accept(message)
        except CertificateTimeError as exc:
            self.rejected += 1
            await self._refuse_out_of_date(message, exc)
            return
        if env is None:
            return
        assert env.corr is not None  # noqa: S101 - checked by _accept
        key = (env.sender, env.corr)
        reply_topic = self._bus.topics.reply(self._bus.uid, env.sender)
        cached = self._cache.get(key)
        if cached is not None:
            await self._bus.publish(reply_topic, cached)
            return
        if key in self._in_flight:
            return
        self._in_flight.add(key)
        try:
            reply = await self._call(env)
            payload = self._bus.encode("rep", reply, corr=env.corr)
            self._remember(key, payload)
        finally:
            self._in_flight.discard(key)
        if reply.get("ok") is True and env.body.get("quiet") is True:
            return  # its sender learns of the success another way; a resend gets the cached reply
        await self._bus.publish(reply_topic, payload)

    async def _refuse_out_of_date(self, message: Message, exc: CertificateTimeError) -> None:
        """Answer a request signed under an expired (or not yet valid) certificate with why it is refused,
        rather than with silence that leaves its sender retrying: the answer says nothing but that."""
        try:
            env = decode_envelope(message.payload, what=f"message on {message.topic}")
        except CodecError:
            return
        if not env.kind.startswith("req:") or env.corr is None or env.reply_to != env.sender:
            return
        log.warning("bus[%s] refused %r from %r: %s", self._bus.uid, env.kind, env.sender, exc)
        error = {"code": "rejected", "message": f"{exc}: refused; renew the certificate"}
        payload = self._bus.encode("rep", {"ok": False, "error": error}, corr=env.corr)
        await self._bus.publish(self._bus.topics.reply(self._bus.uid, env.sender), payload)

    async def _call(self, env: Envelope) -> dict[str, Any]:
        request = Request(env.kind[4:], env.body, env.sender, env.role, env)
        try:
            return {"ok": True, "result": await self._handler(request)}
        except RpcError as exc:
            return {"ok": False, "error": {"code": exc.code, "message": exc.message}}
        except Exception as exc:
            log.exception("bus[%s] handler of %r failed", self._bus.uid, request.method)
            return {
                "ok": False,
                "error": {"code": "internal", "message": f"{type(exc).__name__}: {exc}"},
            }

    def _remember(self, key: tuple[str, str], payload: bytes) -> None:
        self._cache[key] = payload
        while len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
