"""The networked executor: runs every SWCI command, talking to the SN of the current context.

:class:`SwciExecutor` implements :class:`swci.session.Executor`. Local commands (HELP, CD, LS, ...)
go to :class:`~swci.local_commands.LocalExecutor`, context commands to :mod:`swci.contexts`, the
rest to the handlers of :mod:`swci.remote_commands` over a :class:`~swci.connection.LedgerLink`,
which is opened when first needed and reopened when the current context changes. The bus's errors
become failed results: a ledger rejection shows its reason, an unreachable broker or SN says which
and what to try; nothing shows a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Sequence
from types import TracebackType

from rich.console import Console

from daemons.bus import BusError, RemoteError, RequestTimeout
from daemons.bus.config import DEFAULT_PORT, BrokerAddress
from daemons.identity import Identity
from daemons.ledger_client import Rejected
from swci.argtypes import ArgKind
from swci.commands import Command, WaitForIp, WaitForService
from swci.connection import Endpoint, LedgerLink, swci_uid
from swci.contexts import (
    CONTEXT_COMMANDS,
    Context,
    ContextError,
    ContextStore,
    run_context_command,
    service_address,
)
from swci.grammar import REGISTRY
from swci.live_names import LISTINGS, NameCache
from swci.local_commands import LocalExecutor
from swci.output import Result
from swci.progress import AttemptDisplay
from swci.remote_commands import HANDLERS, Call, Handler
from swci.session import SessionState
from swci.training_commands import TRAINING_HANDLERS
from swci.waiting import DEFAULT_RETRIES, Settings, wait_for_sn, wait_interval

__all__ = ["SwciExecutor"]

log = logging.getLogger("swci.executor")


class SwciExecutor:
    """Runs SWCI commands against the SN of the session's current context.

    Args:
        store: the contexts file (default ``$XDG_CONFIG_HOME/swci/contexts.json``).
        identity: certificate and key (``--cert/--key/--capath``): TLS to the broker, signed messages
            and the uid (the certificate's CN). None: plain MQTT, uid ``swci-<random>``.
        network: the swarm network name.
        console: where progress displays go (results are printed by the caller).
        progress: whether to show progress displays (False in JSON mode).
        connect_timeout: seconds to connect to a broker and find an SN there.
        request_timeout: seconds to wait for the SN's answer to a request.
    """

    def __init__(
        self,
        *,
        store: ContextStore | None = None,
        identity: Identity | None = None,
        network: str = "swarm",
        console: Console | None = None,
        progress: bool = True,
        connect_timeout: float = 10.0,
        request_timeout: float = 30.0,
    ) -> None:
        self.store = store or ContextStore()
        self.identity = identity
        self.network = network
        self.console = console or Console()
        self.progress = progress
        self.uid = swci_uid(identity)
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self._local = LocalExecutor()
        self._link: LedgerLink | None = None
        self._names = NameCache()
        self._refresh: asyncio.Task[None] | None = None
        self._refreshed_at = float("-inf")

    @property
    def tls(self) -> bool:
        """Whether connections use TLS (the process has an identity)."""
        return self.identity is not None

    async def __aenter__(self) -> SwciExecutor:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the background name refresh and close the connection."""
        if self._refresh is not None:
            self._refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._refresh
            self._refresh = None
        await self._drop_link()

    # ---------------------------------------------------------------- names
    def names(self, kind: ArgKind) -> Sequence[str]:
        """Live names for completion; never blocks (stale names are refreshed in the background)."""
        if kind is ArgKind.CONTEXT:
            try:
                return self.store.names()
            except ContextError:
                return ()
        if kind in LISTINGS:
            self._maybe_refresh(kind)
            return self._names.get(kind)
        return ()

    def _maybe_refresh(self, kind: ArgKind) -> None:
        link = self._link
        if link is None or not link.open or not self._names.stale(kind):
            return
        if self._refresh is not None and not self._refresh.done():
            return
        if time.monotonic() - self._refreshed_at < self._names.max_age:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._refreshed_at = time.monotonic()
        self._refresh = loop.create_task(self._refresh_names(link), name="swci.names.refresh")

    async def _refresh_names(self, link: LedgerLink) -> None:
        try:
            await self._names.refresh(link)
        except BusError as exc:
            log.info("refreshing the names for completion failed: %s", exc)

    # -------------------------------------------------------------- execute
    async def execute(self, cmd: Command, session: SessionState) -> Result:
        """Run one command; every expected problem is a failed result."""
        if LocalExecutor.handles(cmd):
            return await self._local.execute(cmd, session)
        if isinstance(cmd, CONTEXT_COMMANDS):
            return run_context_command(cmd, self.store, session, tls=self.tls)
        if isinstance(cmd, WaitForIp | WaitForService):
            return await self._wait_for_sn(cmd)
        handler = HANDLERS.get(type(cmd)) or TRAINING_HANDLERS.get(type(cmd))
        if handler is None:
            return Result.failure(f"{REGISTRY.spec_for(cmd).name} is not supported by this swci")
        try:
            context = self._context(session)
        except ContextError as exc:
            return Result.failure(str(exc))
        return await self._remote(handler, cmd, session, context)

    async def _remote(
        self, handler: Handler, cmd: Command, session: SessionState, context: Context
    ) -> Result:
        try:
            link = await self._connect(context)
            result = await handler(cmd, Call(link, session, self.console, self.progress, _settings(context)))
        except BusError as exc:
            return await self._bus_failure(exc, context)
        self._names.learn(cmd, result)
        return result

    def _context(self, session: SessionState) -> Context:
        name = session.context or self.store.current
        if name is None:
            raise ContextError(
                "no context is active; run CREATE CONTEXT <name> WITH IP <ip> and SWITCH CONTEXT <name> first"
            )
        context = self.store.require(name)
        session.context = context.name
        return context

    async def _connect(self, context: Context) -> LedgerLink:
        broker = context.broker(tls=self.tls)
        key = (context.name, str(broker))
        link = self._link
        if link is not None and link.key == key and link.open:
            return link
        await self._drop_link()
        self._names.clear()
        self._link = await LedgerLink(self._endpoint(broker), key).connect()
        log.info("connected to SN %s at %s (context %s)", self._link.client.sn, broker, context.name)
        return self._link

    def _endpoint(self, broker: BrokerAddress) -> Endpoint:
        return Endpoint(
            broker,
            self.uid,
            self.network,
            self.identity,
            connect_timeout=self.connect_timeout,
            request_timeout=self.request_timeout,
        )

    async def _drop_link(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            await link.close()

    async def _bus_failure(self, exc: BusError, context: Context) -> Result:
        if isinstance(exc, Rejected):
            return Result.failure(*(exc.reason.splitlines() or [exc.reason]))
        if isinstance(exc, RemoteError):
            return Result.failure(exc.message)
        log.info("bus error in context %s: %s", context.name, exc)
        if isinstance(exc, RequestTimeout) or self._link is None or not self._link.open:
            await self._drop_link()  # the next command connects afresh (and finds the SN again)
        hint = (
            f" [context {context.name}: {context.broker(tls=self.tls)}; "
            "check it with GET CONTEXT INFO, or WAIT FOR IP until the SN is up]"
        )
        return Result.failure(f"{exc}{hint}")

    # ------------------------------------------------------------ waiting
    async def _wait_for_sn(self, cmd: WaitForIp | WaitForService) -> Result:
        if isinstance(cmd, WaitForIp):
            broker = BrokerAddress(cmd.host, cmd.port or DEFAULT_PORT, self.tls)
        else:
            broker = service_address(cmd.service, tls=self.tls)
        retries = DEFAULT_RETRIES if cmd.retries is None else cmd.retries
        return await wait_for_sn(
            self._endpoint(broker),
            retries=retries,
            interval=wait_interval(),
            display=AttemptDisplay(self.console, enabled=self.progress),
        )


def _settings(context: Context) -> Settings:
    """Settings from the context's env vars first, then the process environment."""

    def setting(name: str) -> str | None:
        value = context.env.get(name)
        return value if value is not None else os.environ.get(name)

    return setting
