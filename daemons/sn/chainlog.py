"""The ledger's replicated log on NATS JetStream: an ordered stream of blocks, and a lease naming the
one SN that may append to it.

We do not write a consensus protocol: JetStream (Raft inside the NATS cluster) orders and replicates
the blocks. Block ``h`` is stream message ``h + 1``, and it is appended with
``Nats-Expected-Last-Sequence: h``, so an append that does not extend the stream's head is refused by
the server (fencing): two SNs that both believe they seal can never fork the chain. The lease is a key
in a JetStream key-value bucket whose entries expire after ``lease`` seconds; an SN becomes the sealer
by creating the key (which fails while it exists) and stays it by updating the key with its last
revision every third of the lease. Every SN follows the stream into its own SQLite chain.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import time
from collections.abc import AsyncIterator
from types import TracebackType

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy, KeyValueConfig, StorageType, StreamConfig
from nats.js.kv import KeyValue

__all__ = ["JETSTREAM_READY_WAIT", "ChainLog", "ChainLogError", "Fenced", "failure_text"]

log = logging.getLogger("swarm.sn.chainlog")
_LEASE_KEY = "sealer"
JETSTREAM_READY_WAIT = 30.0  # seconds an SN waits at its start for a cluster's JetStream to answer
_READY_RETRY = 1.0
_WRONG_LAST_SEQUENCE = 10071
_NO_PEERS_FOR_PLACEMENT = 10005  # JetStream's "no suitable peers for placement": a node has not joined yet


class _NotReadyError(TimeoutError):
    """The cluster answered, but is still forming: a stream without a leader, a node not joined yet."""


PING_INTERVAL = 2.0  # seconds between pings of the NATS node the SN uses (2 unanswered: another node)


def _still_forming(exc: nats.js.errors.APIError) -> bool:
    """Whether JetStream refused because its cluster is still forming (it says so by these errors)."""
    return isinstance(exc, nats.js.errors.ServiceUnavailableError) or exc.err_code == _NO_PEERS_FOR_PLACEMENT


def failure_text(exc: BaseException) -> str:
    """What a failure of the NATS cluster says, for a log line or a refusal: its message, or its type when
    it has none (nats-py's and asyncio's timeouts)."""
    return str(exc) or type(exc).__name__


class ChainLogError(RuntimeError):
    """The NATS cluster cannot be reached or refused us; the message says which servers and why."""


class Fenced(ChainLogError):
    """Another SN appended first: this block does not extend the replicated chain, and is not stored."""


def _safe(network: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", network)


class ChainLog:
    """The replicated chain of one swarm network on a NATS cluster."""

    def __init__(
        self,
        servers: list[str],
        network: str,
        uid: str,
        *,
        tls: ssl.SSLContext | None = None,
        lease: float = 3.0,
        replicas: int | None = None,
    ) -> None:
        self.servers = servers
        self.uid = uid
        self.lease = lease
        self.replicas = replicas or min(3, len(servers))
        self.stream = f"SWARM_{_safe(network)}_CHAIN"
        self.subject = f"swarm.{_safe(network)}.chain"
        self.bucket = f"swarm_{_safe(network)}_sealer"
        self._tls = tls
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._kv: KeyValue | None = None

    async def __aenter__(self) -> ChainLog:
        try:
            self._nc = await nats.connect(
                servers=self.servers,
                name=f"sn:{self.uid}",
                tls=self._tls,
                connect_timeout=5,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                allow_reconnect=True,
                # a node cut off from us answers nothing and closes nothing: 2 unanswered pings 2 s
                # apart move us to another (nats-py's default, 2 minutes apart, left such an SN unable to
                # seal or forward for minutes)
                ping_interval=PING_INTERVAL,
                max_outstanding_pings=2,
                dont_randomize=True,  # the list's order, as the bus takes --broker's: its host's node first
            )
            self._js = self._nc.jetstream(timeout=5)
            await self._set_up()
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            await self.close()
            raise ChainLogError(f"cannot use the NATS cluster at {', '.join(self.servers)}: {exc}") from None
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Disconnect (the lease, if held, expires by itself)."""
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.close()

    @property
    def js(self) -> JetStreamContext:
        """The JetStream context."""
        assert self._js is not None  # noqa: S101 - set on entry
        return self._js

    async def _set_up(self) -> None:
        """The chain's stream and the lease bucket, made when missing. A cluster that has just started
        answers JetStream requests only once its nodes have chosen a leader for its metadata, places
        a replicated stream only once enough nodes have joined, and takes its messages only once the
        stream has a leader: until then a request times out, is refused as unavailable or for want of
        peers, or finds the stream leaderless, and is sent again, for up to ``JETSTREAM_READY_WAIT``
        seconds."""
        deadline = time.monotonic() + JETSTREAM_READY_WAIT
        while True:
            try:
                await self._ensure_stream()
                self._kv = await self._ensure_lease_bucket()
                return
            except (TimeoutError, nats.js.errors.APIError) as exc:  # nats' timeouts and _NotReadyError too
                forming = not isinstance(exc, nats.js.errors.APIError) or _still_forming(exc)
                if not forming or time.monotonic() + _READY_RETRY > deadline:
                    raise
                log.warning("the NATS cluster's JetStream does not answer yet (%s); asking again", exc)
                await asyncio.sleep(_READY_RETRY)

    async def _ensure_stream(self) -> None:
        config = StreamConfig(
            name=self.stream,
            subjects=[self.subject],
            storage=StorageType.FILE,
            num_replicas=self.replicas,
            max_msg_size=64 * 1024 * 1024,
            allow_direct=True,
        )
        try:
            info = await self.js.stream_info(self.stream)
        except nats.js.errors.NotFoundError:
            info = await self.js.add_stream(config)
        if info.cluster is not None and not info.cluster.leader:
            raise _NotReadyError(f"the stream {self.stream} has no leader yet")

    async def _ensure_lease_bucket(self) -> KeyValue:
        try:
            return await self.js.key_value(self.bucket)
        except nats.js.errors.BucketNotFoundError:
            config = KeyValueConfig(bucket=self.bucket, history=1, ttl=self.lease, replicas=self.replicas)
            return await self.js.create_key_value(config)

    # ------------------------------------------------------------------ the log
    async def height(self) -> int:
        """Height of the last block in the stream (-1 when it is empty)."""
        info = await self.js.stream_info(self.stream)
        return int(info.state.last_seq) - 1

    async def append(self, height: int, raw: bytes) -> None:
        """Append block ``height``; Fenced when the stream's head is not block ``height - 1``."""
        headers = {"Nats-Expected-Last-Sequence": str(height)}
        try:
            await self.js.publish(self.subject, raw, headers=headers, timeout=5)
        except nats.js.errors.APIError as exc:
            if exc.err_code == _WRONG_LAST_SEQUENCE:
                raise Fenced(f"block {height} was not appended: another SN appended it first") from None
            raise ChainLogError(f"block {height} was not appended: {exc}") from None
        except (TimeoutError, nats.errors.Error) as exc:
            raise ChainLogError(f"block {height} was not appended: {failure_text(exc)}") from None

    async def block(self, height: int) -> bytes:
        """The stored bytes of block ``height``."""
        msg = await self.js.get_msg(self.stream, seq=height + 1)
        return bytes(msg.data or b"")

    async def follow(self, after: int) -> AsyncIterator[tuple[int, bytes]]:
        """``(height, raw)`` of every block after height ``after``, in order, then each new one."""
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after + 2)
        sub = await self.js.subscribe(
            self.subject, ordered_consumer=True, config=config, pending_msgs_limit=100_000
        )
        try:
            async for msg in sub.messages:
                yield int(msg.metadata.sequence.stream) - 1, bytes(msg.data)
        finally:
            await sub.unsubscribe()

    # ----------------------------------------------------------------- the lease
    async def sealer(self) -> str | None:
        """The uid of the SN holding the lease now (None when nobody does)."""
        assert self._kv is not None  # noqa: S101
        try:
            entry = await self._kv.get(_LEASE_KEY)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        return (entry.value or b"").decode() or None

    async def campaign(self) -> int | None:
        """Take the lease if nobody holds it: its revision, or None."""
        assert self._kv is not None  # noqa: S101
        try:
            return int(await self._kv.create(_LEASE_KEY, self.uid.encode()))
        except nats.js.errors.KeyWrongLastSequenceError:
            return None

    async def renew(self, revision: int) -> int:
        """Keep the lease; its new revision. KeyWrongLastSequenceError when it was lost."""
        assert self._kv is not None  # noqa: S101
        return int(await self._kv.update(_LEASE_KEY, self.uid.encode(), last=revision))

    async def release(self, revision: int) -> None:
        """Give the lease up now (a clean stop), so another SN need not wait for it to expire."""
        assert self._kv is not None  # noqa: S101
        try:
            await self._kv.delete(_LEASE_KEY, last=revision)
        except nats.errors.Error as exc:
            log.debug("releasing the lease: %s", exc)
