"""The SN daemon: opens (or creates) the ledger, runs the broker, serves the ledger over the bus.

The sentinel seals blocks; another SN (``--sentinel-uid``) replicates the chain from it, serves reads
from its own copy, and forwards writes. Sealing is one role of an SN, not a property of the code, so it
can move to another SN when the sentinel is gone (failover itself is future work).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts.block import MAX_HEIGHT, is_height
from contracts.blockstore import ChainError
from contracts.ledger import Accepted, Ledger
from contracts.machine import due_actions, next_deadline
from contracts.tx import Rejection, is_duplicate
from contracts.views import BadQuery, QueryError
from daemons.aio import raise_if_cancelling
from daemons.broker import BrokerError, BrokerSettings, BrokerTLS, ManagedBroker
from daemons.bus import Bus, BusConnectError, Request, RpcError
from daemons.bus.config import DEFAULT_PORT, BrokerAddress
from daemons.debug import install_task_dump
from daemons.identity import Identity, node_name, open_bus
from daemons.processes import install_stop_signals
from daemons.sn.chain import LocalChain
from daemons.sn.chainlog import ChainLog, ChainLogError
from daemons.sn.cluster import ClusterRole
from daemons.sn.liveness import Liveness
from daemons.sn.reads import Reads
from daemons.sn.replica import Replica
from daemons.sn.revocations import LedgerRevocations, enforce_in_broker
from daemons.sn.sealer import REQUESTS_AT_ONCE, NotSealed, Sealer, StoreFailed
from wire import Envelope, SignerLike, decode_envelope, encode_envelope, make_envelope
from wire.errors import CodecError

__all__ = ["SNNode", "SNOptions", "VERSION"]

log = logging.getLogger("swarm.sn")
VERSION = "0.1.0"
_MAX_BLOCKS_PER_REPLY = 200
MAX_RELAYED = 64  # peers' check-ins one submit relays, at most
RELAYABLE = "tx:round.checkin"  # the one kind of transaction an SL submits for a peer
# How long a read that names a block this SN's copy of the chain does not hold yet waits for it (a
# follower of a cluster or a replica is a block or so behind the sealer whose event the client saw).
READ_WAIT = 3.0


@dataclass
class SNOptions:
    """How to run one SN."""

    uid: str = "sn-1"
    network: str = "swarm"
    data_dir: Path = Path("swarm-sn")
    sentinel: bool = True
    sentinel_uid: str | None = None
    host: str = "127.0.0.1"
    api_port: int = DEFAULT_PORT
    broker: BrokerAddress | None = None
    broker_engine: str = "auto"
    identity: Identity | None = None
    liveness_grace: float = 15.0
    extra_presence: dict[str, Any] = field(default_factory=dict)
    cluster: list[str] = field(default_factory=list)
    lease: float = 3.0


def _who(env: Envelope) -> str:
    return repr(env.sender) if env.voucher is None else f"{env.sender!r} (of identity {env.voucher!r})"


def _foreign_tx(submitter: Envelope, tx: Envelope) -> str:
    return f"{_who(submitter)} may not submit a transaction of {_who(tx)}"


def _relayed(request: Request) -> list[bytes]:
    """The peers' check-ins a ``submit`` relays (``relayed``): only an SL relays, only signed
    ``round.checkin`` envelopes; another kind of transaction is left out, with a log line."""
    relayed = request.body.get("relayed")
    if relayed is None:
        return []
    if (
        not isinstance(relayed, list)
        or len(relayed) > MAX_RELAYED
        or not all(isinstance(r, bytes) for r in relayed)
    ):
        raise RpcError("bad-request", f"submit's 'relayed' must be a list of at most {MAX_RELAYED} envelopes")
    if relayed and request.role != "sl":
        raise RpcError("rejected", f"{_who(request.envelope)} may not relay check-ins: only an SL does")
    kept = []
    for raw in relayed:
        try:
            kind = decode_envelope(raw, what="relayed check-in").kind
        except CodecError as exc:
            log.info("left out a check-in %r relayed: %s", request.sender, exc)
            continue
        if kind != RELAYABLE:
            log.info("left out a transaction %r relayed: %s is not a check-in", request.sender, kind)
            continue
        kept.append(raw)
    return kept


class SNNode:
    """One SN: ledger + (own broker) + bus session + sealing, timers and liveness."""

    def __init__(self, options: SNOptions) -> None:
        self.options = options
        ident = options.identity
        self.chain = LocalChain(options.data_dir / "ledger.db", ident.verifier() if ident else None)
        self.broker: ManagedBroker | None = None
        self.sealer: Sealer | None = None
        self.replica: Replica | None = None
        self.cluster: ClusterRole | None = None
        self.started = time.time()
        self.revocations = LedgerRevocations(self.chain)
        self._reads = Reads()  # ledger reads, each answered once per state
        self._stop = asyncio.Event()
        self.ready = asyncio.Event()

    # ------------------------------------------------------------------ setup
    @property
    def ledger(self) -> Ledger | None:
        """The local chain, once opened."""
        return self.chain.ledger

    @property
    def ledger_path(self) -> Path:
        """Where the chain is stored."""
        return self.chain.path

    def _open_ledger(self) -> Ledger | None:
        """Open the chain (verifying it), or create genesis as the sentinel; None for a new replica."""
        ident = self.options.identity
        verifier = self.chain.verifier
        self.options.data_dir.mkdir(parents=True, exist_ok=True)
        if self.ledger_path.exists():
            ledger = Ledger.open(self.ledger_path, verifier=verifier)
            log.info("ledger %s verified: %d blocks", self.ledger_path, ledger.height + 1)
            return ledger
        if not self.options.sentinel:
            return None
        signer = ident.signer() if ident else None
        ledger = Ledger.create(
            self.ledger_path, sealer=signer, sealer_uid=self.options.uid, verifier=verifier, now=time.time()
        )
        log.info("created a new ledger with its genesis block at %s", self.ledger_path)
        return ledger

    def _start_broker(self) -> BrokerAddress:
        opts = self.options
        if opts.broker is not None:
            return opts.broker
        tls = None
        if opts.identity is not None:
            tls = BrokerTLS(opts.identity.ca_file(), opts.identity.cert, opts.identity.key)
        settings = BrokerSettings(opts.data_dir / "broker", opts.host, opts.api_port, tls=tls)
        self.broker = ManagedBroker(settings, opts.broker_engine)  # type: ignore[arg-type]
        self.broker.revoked = self.revocations.current()
        return self.broker.start()

    # ------------------------------------------------------------------- run
    async def run(self) -> None:
        """Run until SIGTERM/SIGINT or ``stop()``."""
        try:
            if self.options.cluster:  # the chain comes from (or goes into) the cluster once connected
                if self.ledger_path.exists():
                    self.chain.ledger = await asyncio.to_thread(
                        Ledger.open, self.ledger_path, verifier=self.chain.verifier
                    )
            else:
                self.chain.ledger = await asyncio.to_thread(self._open_ledger)
            address = await asyncio.to_thread(self._start_broker)
        except (ChainError, BrokerError) as exc:
            raise SystemExit(f"swarm sn: {exc}") from None
        except (sqlite3.Error, OSError) as exc:  # a read-only, full or unreadable data directory
            raise SystemExit(f"swarm sn: cannot open the ledger {self.ledger_path}: {exc}") from None
        try:
            await self._serve(address)
        except* (BusConnectError, BrokerError, ChainLogError, ChainError) as group:
            raise SystemExit(f"swarm sn: {group.exceptions[0]}") from None
        finally:
            if self.broker is not None:
                await asyncio.to_thread(self.broker.stop)
            if self.ledger is not None:
                self.ledger.close()

    async def _serve(self, address: BrokerAddress) -> None:
        opts = self.options
        ident = opts.identity
        presence = {
            "role": "sn",
            "sentinel": opts.sentinel,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "address": str(address),
            **opts.extra_presence,
        }
        signer = ident.signer() if ident else None
        bus = open_bus(ident, address, opts.uid, "sn", network=opts.network, presence=presence, answers=True)
        async with bus:
            bus.refused = self.revocations
            if opts.cluster:
                tls = ident.tls() if ident else None
                async with ChainLog(
                    opts.cluster, opts.network, opts.uid, tls=tls, lease=opts.lease
                ) as chainlog:
                    await self._serve_cluster(bus, chainlog, signer, address)
                return
            ledger = self.chain.ledger
            if ledger is None or not opts.sentinel:
                self.replica = Replica(bus, self.chain, opts.sentinel_uid)
                ledger = self.chain.ledger = await self.replica.start(ledger)
            self.sealer = Sealer(ledger, bus, signer, self.chain.lock) if opts.sentinel else None
            bus.serve(self.handle, concurrency=REQUESTS_AT_ONCE)
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self._supervise_broker(), name="sn.broker")]
                revoked = enforce_in_broker(bus, self.revocations, self.broker)
                tasks.append(group.create_task(revoked, name="sn.revocations"))
                if self.sealer is not None:
                    tasks.append(group.create_task(self.sealer.run(), name="sn.sealer"))
                    tasks.append(group.create_task(self._timers(), name="sn.timers"))
                    liveness = Liveness(bus, ledger, self.sealer.submit_own, grace=opts.liveness_grace)
                    tasks.append(group.create_task(liveness.run(), name="sn.liveness"))
                    await self.sealer.submit_own("node.register", self._registration(address))
                else:
                    assert self.replica is not None  # noqa: S101 - set above for replicas
                    tasks.append(group.create_task(self.replica.follow(), name="sn.replica"))
                port = address.port
                log.info("Starting SWARM-API-SERVER on port: %d", port)
                self.ready.set()
                await self._stop.wait()
                for task in tasks:
                    task.cancel()

    async def _serve_cluster(
        self, bus: Bus, chainlog: ChainLog, signer: SignerLike | None, address: BrokerAddress
    ) -> None:
        """A clustered ledger: follow it, campaign for sealing, forward writes while another SN seals."""
        cluster = self.cluster = ClusterRole(
            self.chain, bus, chainlog, signer, sentinel=self.options.sentinel
        )
        await cluster.open()
        await Liveness.subscribe_ahead(bus)
        bus.serve(self.handle, concurrency=REQUESTS_AT_ONCE)

        async def sealing_role(ledger: Ledger) -> None:
            await self._seal(bus, ledger, signer, address, chainlog)

        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(cluster.follow(), name="sn.follow"),
                group.create_task(cluster.lead(sealing_role), name="sn.lead"),
                group.create_task(self._register_in_cluster(address), name="sn.register"),
            ]
            log.info("Starting SWARM-API-SERVER on port: %d (clustered ledger)", address.port)
            self.ready.set()
            await self._stop.wait()
            for task in tasks:
                task.cancel()

    async def _seal(
        self, bus: Bus, ledger: Ledger, signer: SignerLike | None, address: BrokerAddress, chainlog: ChainLog
    ) -> None:
        """The sealing role (while this SN holds the lease): seal, run the timers, watch liveness."""
        assert self.cluster is not None  # noqa: S101
        self.sealer = Sealer(ledger, bus, signer, self.chain.lock, chainlog=chainlog)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self.sealer.run(), name="sn.sealer")
                group.create_task(self._timers(), name="sn.timers")
                liveness = Liveness(bus, ledger, self.sealer.submit_own, grace=self.options.liveness_grace)
                group.create_task(liveness.run(), name="sn.liveness")
        finally:
            self.sealer = None
            self.cluster.fenced.set()

    async def _register_in_cluster(self, address: BrokerAddress) -> None:
        """Register this SN in the clustered ledger (sealed by whoever seals), so it may seal later."""
        assert self.cluster is not None  # noqa: S101
        ident = self.options.identity
        env = make_envelope(
            "tx:node.register",
            self._registration(address),
            sender=self.options.uid,
            role="sn",
            signer=ident.signer() if ident else None,
        )
        raw = encode_envelope(env)
        while True:
            try:
                if self.sealer is not None:
                    outcome = await self.sealer.submit(raw)
                    if isinstance(outcome, StoreFailed | NotSealed):
                        raise RpcError("failover", outcome.reason)
                    if isinstance(outcome, Rejection):
                        raise RpcError("rejected", outcome.reason)
                else:
                    await self.cluster.forward(raw)
            except RpcError as exc:
                if is_duplicate(exc.message):
                    return
                log.info("registering this SN in the cluster: %s; retrying", exc.message)
                await asyncio.sleep(1.0)
                continue
            log.info("this SN is registered in the clustered ledger")
            return

    def _registration(self, address: BrokerAddress) -> dict[str, Any]:
        return {
            "role": "sn",
            "parent": None,
            "host": socket.gethostname(),
            "address": str(address),
            "pid": os.getpid(),
            "meta": {
                "sentinel": self.options.sentinel,
                "version": VERSION,
                "name": node_name(self.options.uid),
            },
        }

    async def _supervise_broker(self) -> None:
        if self.broker is not None:
            await self.broker.supervise()

    def stop(self) -> None:
        """Ask the SN to shut down."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the SN gracefully."""
        install_stop_signals(self.stop)
        install_task_dump()

    # ----------------------------------------------------------------- timers
    async def _timers(self) -> None:
        """Close rounds and replace leaders exactly when due (no polling tick)."""
        assert self.sealer is not None  # noqa: S101 - only the sealing SN runs timers
        assert self.ledger is not None  # noqa: S101
        attempted: dict[tuple[str, str], float] = {}
        while True:
            raise_if_cancelling()
            self.sealer.changed.clear()
            now = time.time()
            for kind, body in due_actions(self.ledger.state, now):
                key = (kind, repr(sorted(body.items())))
                if now - attempted.get(key, 0.0) < 0.5:
                    continue
                attempted[key] = now
                result = await self.sealer.submit_own(kind, body)
                if not isinstance(result, Accepted):
                    log.debug("%s %s not applied: %s", kind, body, result.reason)
            deadline = next_deadline(self.ledger.state)
            wait = None if deadline is None else min(max(deadline - time.time(), 0.0) + 0.01, 60.0)
            if wait is not None and wait < 0.5 and any(now - t < 0.5 for t in attempted.values()):
                wait = 0.5
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self.sealer.changed.wait()
            attempted = {k: t for k, t in attempted.items() if time.time() - t < 5}

    # -------------------------------------------------------------------- rpc
    async def handle(self, request: Request) -> Any:
        """Answer ``submit``, ``query``, ``status`` and ``blocks``."""
        if request.method == "submit":
            return await self._submit(request)
        if request.method == "query":
            await self._caught_up(request.body.get("height"))
            return self._query(request.body)
        if request.method == "status":
            return self.status()
        if request.method == "blocks":
            return self._blocks(request.body)
        raise RpcError("unknown-method", f"the SN has no method {request.method!r}")

    async def _submit(self, request: Request) -> dict[str, Any]:
        raw = request.body.get("tx")
        if not isinstance(raw, bytes):
            raise RpcError("bad-request", "submit needs 'tx': the signed transaction envelope")
        relayed = _relayed(request)
        if request.role != "sn":
            try:
                env = decode_envelope(raw, what="transaction")
            except CodecError as exc:
                raise RpcError("rejected", str(exc)) from None
            if env.sender != request.sender or env.identity != request.envelope.identity:
                raise RpcError("rejected", _foreign_tx(request.envelope, env))
        if not relayed:
            return await self._write(raw)
        failed: RpcError | None = None
        async with asyncio.TaskGroup() as group:
            for other in relayed:
                group.create_task(self._relay(other, request.sender))
            try:
                written = await self._write(raw)
            except RpcError as exc:
                failed = exc
        if failed is not None:
            raise failed
        return written

    async def _relay(self, raw: bytes, relayer: str) -> None:
        """A peer's signed check-in that ``relayer`` submitted with its own: sealed as if its signer had
        submitted it (the sealer verifies the signature); a refusal is only logged, since the signer
        submits it itself when its check-in does not show in the round's events."""
        try:
            await self._write(raw)
        except RpcError as exc:
            level = logging.DEBUG if is_duplicate(exc.message) else logging.INFO
            log.log(level, "a check-in %s relayed was not taken: %s", relayer, exc.message)

    async def _write(self, raw: bytes) -> dict[str, Any]:
        """Seal ``raw`` (or have the SN that seals do it); its receipt, or RpcError."""
        if self.sealer is None and self.cluster is not None:
            return await self.cluster.forward(raw)
        if self.sealer is None:
            assert self.replica is not None  # noqa: S101
            return await self.replica.forward(raw)
        result = await self.sealer.submit(raw)
        if isinstance(result, NotSealed):
            raise RpcError("failover", result.reason)
        if isinstance(result, StoreFailed):
            raise RpcError("unavailable", result.reason)
        if isinstance(result, Rejection):
            raise RpcError("rejected", result.reason)
        assert isinstance(result, Accepted)  # noqa: S101
        return {"height": result.height, "index": result.index, **dict(result.receipt)}

    async def _caught_up(self, height: object) -> None:
        """Before a read that names ``height`` (the newest block its client saw): wait, at most
        ``READ_WAIT`` s, until this SN's copy of the chain holds that block; then answer from what it
        holds. A sealer, or a lone SN, holds every block there is."""
        if height is None:
            return
        if not is_height(height):
            raise RpcError("bad-request", f"query's 'height' must be a block height from 0 to {MAX_HEIGHT}")
        assert self.ledger is not None  # noqa: S101
        following = None if self.sealer is not None else (self.cluster or self.replica)
        if following is None or self.ledger.height >= height:
            return
        if not await following.reach(height, timeout=READ_WAIT):
            log.info("answering a read at block %d: block %d has not reached this SN within %g s",
                     self.ledger.height, height, READ_WAIT)  # fmt: skip

    def _query(self, body: dict[str, Any]) -> Any:
        assert self.ledger is not None  # noqa: S101
        name, args = body.get("name"), body.get("args") or {}
        if not isinstance(name, str) or not isinstance(args, dict):
            raise RpcError("bad-request", "query needs 'name' (str) and 'args' (map)")
        try:
            return self._reads.answer(self.ledger.state, name, args)
        except BadQuery as exc:
            raise RpcError("bad-request", str(exc)) from None
        except QueryError as exc:
            raise RpcError("not-found", str(exc)) from None
        except (
            TypeError,
            ValueError,
            AttributeError,
            OverflowError,
        ) as exc:  # arguments a view did not check
            raise RpcError("bad-request", f"query {name!r}: invalid arguments ({exc})") from None

    def status(self) -> dict[str, Any]:
        """What ``GET CONTEXT VERSION`` and monitoring show."""
        assert self.ledger is not None  # noqa: S101
        return {
            "uid": self.options.uid,
            "version": VERSION,
            "sentinel": self.options.sentinel,
            "sealing": self.sealer is not None,
            "height": self.ledger.height,
            "head": self.ledger.head_hash.hex(),
            "signed": self.ledger.signed,
            "started": self.started,
            "broker": self.broker.engine if self.broker else "external",
        }

    def _blocks(self, body: dict[str, Any]) -> dict[str, Any]:
        assert self.ledger is not None  # noqa: S101
        start = body.get("start")
        if not is_height(start):
            raise RpcError("bad-request", f"blocks needs 'start': a height from 0 to {MAX_HEIGHT}")
        with self.chain.lock:
            raw = self.ledger.raw_blocks(start, start + _MAX_BLOCKS_PER_REPLY)
        return {"blocks": raw, "head": self.ledger.height}
