"""The SL daemon: owns the node identity, runs the ML program, and takes part in its sync rounds.

It registers with the SN, serves the models it holds to its peers, opens a local socket for the ML
program's SwarmCallback, and stays a little after the final round until its peers have pulled the final
model from it. Its exit status is the ML program's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from certs import client_context, load_certificate, server_context
from certs.pki import format_time
from contracts.block import MAX_HEIGHT, is_height
from daemons.attachment import Attachment
from daemons.bus import Bus, BusError, Request, RpcError
from daemons.bus.config import BrokerAddress
from daemons.bus.transfer import FETCH_METHOD, StateHolder
from daemons.debug import install_task_dump
from daemons.identity import Identity, open_bus
from daemons.ledger_client import LedgerClient, Patience, Rejected
from daemons.processes import install_stop_signals
from daemons.revocations import follow_revocations
from daemons.sl.dataplane import DataPlaneClient, Offers, Served, serving
from daemons.sl.local_server import LocalServer
from daemons.sl.merge import MergeOptions
from daemons.sl.mlprocess import MLProcess, MLSpec
from daemons.sl.rounds import RoundEngine
from daemons.sl.secure_round import SECAGG_METHOD, SecureRounds, ledger_lookup
from daemons.sl.session import MLSession, SessionSettings
from daemons.sl.workdir import sl_directory
from wire import CodecError
from wire.tensors import weights_hash

__all__ = ["SLNode", "SLOptions"]

log = logging.getLogger("swarm.sl")

EXPIRY_LEAD = 2.0  # seconds before its certificate expires that an SL leaves the swarm


def _fetch_height(body: dict[str, Any]) -> int | None:
    """The newest ledger block the asker of a fetch over the bus saw, checked (None when it names none)."""
    height = body.get("height")
    if height is None:
        return None
    if not is_height(height):
        raise RpcError("bad-request", f"fetch's 'height' must be a block height from 0 to {MAX_HEIGHT}")
    return height


@dataclass
class SLOptions:
    """How to run one SL."""

    uid: str
    broker: BrokerAddress
    ml: MLSpec
    network: str = "swarm"
    sn_uid: str | None = None
    identity: Identity | None = None
    parent: str | None = None
    taskrunner: str | None = None
    settings: SessionSettings = field(default_factory=SessionSettings.from_env)
    linger: float = 30.0
    sn_timeout: float = 60.0
    meta: dict[str, Any] = field(default_factory=dict)


class SLNode:
    """One SL and its ML program."""

    def __init__(self, options: SLOptions) -> None:
        self.options = options
        self.ml = MLProcess(options.ml)
        self.session: MLSession | None = None
        self.holder: StateHolder | None = None
        self.secure: SecureRounds | None = None
        self.dataplane: DataPlaneClient | None = None
        self.offers = Offers()  # models peers push to our data plane for the rounds we lead
        self.served = Served()  # who took which model from our data plane
        self._address = ""
        self._stop = asyncio.Event()
        self._attached_event = asyncio.Event()  # the session answers the ML program from now on
        self._ppid = os.getppid()

    def _bus(self) -> Bus:
        opts = self.options
        presence = {"role": "sl", "parent": opts.parent, "host": socket.gethostname(), "pid": os.getpid()}
        return open_bus(
            opts.identity, opts.broker, opts.uid, "sl", network=opts.network, presence=presence, answers=True
        )

    async def run(self) -> int:
        """Run the ML program to its end; returns its exit status.

        The program starts first, so that its own start (importing torch, loading data) overlaps ours
        (connecting, registering, serving models); its requests wait until this node is attached.
        """
        with sl_directory() as directory:  # the weight buffers too
            return await self._serve(directory / "sl.sock")

    async def _serve(self, sock: Path) -> int:
        """Serve the ML program on ``sock`` while it runs; its exit status."""
        async with LocalServer(sock, self._handle):
            env = {
                "SWARM_SL_SOCKET": str(sock),
                "SWARM_NODE_UID": self.options.uid,
                "PYTHONUNBUFFERED": "1",
            }
            await self.ml.start(env)
            # Two tasks awaited below, not a TaskGroup: our own failure (no broker, say) must reach
            # the command line as itself, not wrapped in an ExceptionGroup.
            loop = asyncio.get_running_loop()
            exited = loop.create_task(self.ml.wait(), name="sl.ml")
            stopper = loop.create_task(self._stop_ml_when_asked(), name="sl.stopper")
            try:
                return await self._connected(exited)
            finally:
                stopper.cancel()
                if not exited.done():  # we failed before the program ended: it cannot go on alone
                    await self.ml.stop()
                await asyncio.gather(exited, stopper, return_exceptions=True)

    async def _handle(self, header: dict[str, Any], payload: Any) -> Any:
        """The ML program's requests, answered by its session once this node is attached."""
        await self._attached_event.wait()
        assert self.session is not None  # noqa: S101 - set before the event
        return await self.session.handle(header, payload)

    async def _connected(self, exited: asyncio.Task[int]) -> int:
        """Connected to the swarm, serving models, until the ML program ends; its exit status."""
        async with self._bus() as bus:
            patience = Patience.from_env()
            ledger = await LedgerClient.connect(
                bus,
                timeout=max(self.options.sn_timeout, patience.deadline),
                prefer=self.options.sn_uid,
                patience=patience,
            )
            refused: set[str] = set()
            bus.refused = refused
            bus.spawn(follow_revocations(ledger, refused), "revocations")
            self.holder = StateHolder(bus, hash=weights_hash(signed=self.options.identity is not None))
            server_tls, client_tls = self._dataplane_tls()
            async with serving(
                self.holder,
                bus.broker.host,
                tls=server_tls,
                check=self._may_serve,
                offers=self.offers,
                served=self.served,
            ) as endpoint:
                self._address = "" if endpoint is None else str(endpoint)
                self.dataplane = DataPlaneClient(bus.uid, tls=client_tls)
                try:
                    return await self._attached(bus, ledger, exited)
                finally:
                    await self.dataplane.close()

    async def _attached(self, bus: Bus, ledger: LedgerClient, exited: asyncio.Task[int]) -> int:
        """Registered, serving models, running the ML program to its end."""
        attachment = Attachment(ledger, self._registration(bus))
        await attachment.attach(strict=True)
        assert self.holder is not None  # noqa: S101 - run() creates it first
        self.secure = SecureRounds(bus, self.holder, ledger_lookup(ledger))
        bus.serve(self._rpc)
        self.session = MLSession(ledger, self._engine_factory(bus, ledger), self.options.settings, attachment)
        async with asyncio.TaskGroup() as group:
            keeper = group.create_task(attachment.run(), name="sl.attachment")
            expiry = group.create_task(self._leave_before_expiry(bus, keeper), name="sl.expiry")
            try:
                code = await self._run_ml(exited, ledger)
                await self._report_if_orphaned(ledger, code)
                return code
            finally:
                keeper.cancel()
                expiry.cancel()

    async def _leave_before_expiry(self, bus: Bus, keeper: asyncio.Task[None]) -> None:
        """Leave the swarm ``EXPIRY_LEAD`` seconds before this node's certificate expires: from then on
        the SN and its peers refuse everything it signs, its offline will included. Its presence says
        offline while it is still believed (the SN takes it out of its contracts), the ledger is not
        told of it again, and the ML program's requests are refused saying why (it exits non-zero)."""
        ident = self.options.identity
        if ident is None:
            return
        expires = load_certificate(ident.cert).not_valid_after_utc
        await asyncio.sleep(max(expires.timestamp() - EXPIRY_LEAD - time.time(), 0.0))
        message = (
            f"the certificate of {ident.uid!r} ({ident.cert}) expires on {format_time(expires)}: the swarm "
            "refuses a node whose certificate expired, so this node leaves it; renew the certificate "
            "(swarm certs issue) to take part again"
        )
        log.error(message)
        keeper.cancel()  # no registering again
        if self.session is not None:
            self.session.refuse(message)
        await bus.leave()

    async def _report_if_orphaned(self, ledger: LedgerClient, code: int) -> None:
        """The SWOP that started this SL is gone (SIGKILL: the SL was re-parented and lives on, as the
        reference's containers do): report this SL's end to the taskrunner itself, as the SWOP would."""
        opts = self.options
        if not opts.parent or not opts.taskrunner or os.getppid() == self._ppid:
            return
        status = "COMPLETED" if code == 0 else "FAILED"
        what = "training finished" if code == 0 else f"exit code {code}"
        body = {
            "taskrunner": opts.taskrunner,
            "peer": opts.uid,
            "peer_type": "SL",
            "status": status,
            "description": f"{what} (reported by the SL: its SWOP {opts.parent} is gone)",
            "exit_code": code,
        }
        try:
            await ledger.submit("taskrunner.status", body)
            log.warning("SWOP %s is gone: reported %s to taskrunner %s", opts.parent, status, opts.taskrunner)
        except (Rejected, BusError) as exc:
            log.warning("SWOP %s is gone and the SL could not report its end: %s", opts.parent, exc)

    def _dataplane_tls(self) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
        """Mutual TLS with the node certificate for the data plane (server, client), when there is one."""
        ident = self.options.identity
        if ident is None:
            return None, None
        server = server_context(ident.cert, ident.key, ident.ca)
        client = client_context(ident.cert, ident.key, ident.ca, check_hostname=False)
        return server, client

    def _registration(self, bus: Bus) -> dict[str, Any]:
        opts = self.options
        return {
            "role": "sl",
            "parent": opts.parent,
            "host": socket.gethostname(),
            "address": self._address,
            "pid": os.getpid(),
            "meta": {"program": opts.ml.command, **opts.meta},
            "session": bus.session,
        }

    def _engine_factory(self, bus: Bus, ledger: LedgerClient) -> Any:
        def make(
            contract: str, method: str, options: MergeOptions, max_update_norm: float, *, secure: bool = False
        ) -> RoundEngine:
            assert self.holder is not None  # noqa: S101 - created before the session
            return RoundEngine(
                bus,
                ledger,
                self.holder,
                contract,
                merge_method=method,
                merge_options=options,
                max_update_norm=max_update_norm,
                secure=self.secure if secure else None,
                dataplane=self.dataplane,
                offers=self.offers,
                served=self.served if self._address else None,  # None: our data plane is off
            )

        return make

    async def _rpc(self, request: Request) -> Any:
        if request.method == FETCH_METHOD and self.holder is not None:
            engine = self.session.engine if self.session is not None else None
            digest = request.body.get("digest")
            if engine is not None and isinstance(digest, bytes):
                refused = await engine.may_fetch(digest, request.sender, height=_fetch_height(request.body))
                if refused is not None:
                    log.warning("refused a fetch: %s", refused)
                    raise RpcError("forbidden", refused)
            return await self.holder.handle_fetch(request)
        if request.method == SECAGG_METHOD and self.secure is not None:
            return await self.secure.handle(request)
        raise RpcError("unknown-method", f"the SL has no method {request.method!r}")

    async def _may_serve(
        self, digest: bytes, sender: str, identity: str | None, height: int | None
    ) -> str | None:
        """The data plane's check: the same rule as a fetch over the bus (``RoundEngine.may_fetch``)."""
        engine = self.session.engine if self.session is not None else None
        if engine is None:
            return None
        try:
            return await engine.may_fetch(digest, sender, identity=identity, height=height)
        except BusError as exc:  # the ledger could not say who may: refuse, the requester can retry
            return f"cannot check who may fetch model {digest.hex()[:16]} now: {exc}"

    async def _run_ml(self, exited: asyncio.Task[int], ledger: LedgerClient) -> int:
        """Answer the ML program until it exits; then serve the final model a while."""
        assert self.session is not None  # noqa: S101
        self._attached_event.set()
        code = await exited
        log.info("ML program exited with status %d", code)
        if code == 0 and self.session.ended:
            await self._linger(ledger)
        return code

    async def _stop_ml_when_asked(self) -> None:
        await self._stop.wait()
        log.info("stopping: sending SIGTERM to the ML program")
        await self.ml.stop()

    async def _linger(self, ledger: LedgerClient) -> None:
        """Serve the final model until each other participant of the final round has pulled it from us
        or has ended (its presence went offline: it held the model already)."""
        session, holder = self.session, self.holder
        if session is None or holder is None or session.final is None:
            return
        digest = bytes.fromhex(session.final.digest)
        others = await self._final_participants(ledger, session.contract)
        if not others:
            return
        bus = ledger.bus
        gone: set[str] = set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.linger
        async with bus.subscribe(bus.topics.presence(), maxsize=10_000) as presence:
            while not others <= holder.served.get(digest, set()) | gone and loop.time() < deadline:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(deadline - loop.time(), 0.01)):
                        message = await presence.get()
                    with contextlib.suppress(CodecError):
                        env = bus.open(message)
                        if env.sender in others and env.body.get("state") == "offline":
                            gone.add(env.sender)
        missing = others - holder.served.get(digest, set()) - gone
        if missing:
            log.info("peers %s still run and have not pulled the final model from here", sorted(missing))

    async def _final_participants(self, ledger: LedgerClient, contract: str) -> set[str]:
        try:
            view = await ledger.query("contract.rounds", name=contract)
        except Exception:  # the SN may be gone at the very end; nothing to wait for then
            return set()
        finals = [r for r in view.get("finished") or [] if r.get("final")]
        if not finals or finals[-1].get("leader") != self.options.uid:
            return set()
        return set(finals[-1].get("participants") or []) - {self.options.uid}

    def stop(self) -> None:
        """Stop the ML program gently (SIGTERM, then SIGKILL after a grace period); run() then ends."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop it gently."""
        install_stop_signals(self.stop)
        install_task_dump()
