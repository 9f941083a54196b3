"""swci's connection to an SN: a bus session and a ledger client, held open by a task of its own.

:class:`LedgerLink` opens a :class:`~daemons.bus.Bus` (role ``swci``) to a broker, finds an SN there
and keeps both open until :meth:`LedgerLink.close`, in one supervising task, so that commands (each
of which runs in a task of its own and may be cancelled by Ctrl-C) never own the session.
:func:`probe_sn` is the one-shot version ``WAIT FOR IP`` retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from daemons.bus import Bus, BusConfig, BusError
from daemons.bus.config import BrokerAddress
from daemons.identity import Identity
from daemons.ledger_client import LedgerClient, Watch, find_sn

__all__ = ["Endpoint", "LedgerLink", "probe_sn", "swci_uid"]

log = logging.getLogger("swci.connection")

_CLOSE_TIMEOUT = 5.0


def swci_uid(identity: Identity | None) -> str:
    """The bus uid: the certificate's CN, or ``swci-<random>`` without an identity."""
    return identity.uid if identity is not None else f"swci-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class Endpoint:
    """How to reach one SN: its broker, our identity, the network and the time limits."""

    broker: BrokerAddress
    uid: str
    network: str = "swarm"
    identity: Identity | None = None
    connect_timeout: float = 10.0
    request_timeout: float = 30.0

    def bus(self) -> Bus:
        """A (not yet opened) bus session to the broker."""
        identity = self.identity
        config = BusConfig(
            self.broker,
            self.uid,
            "swci",
            network=self.network,
            tls=identity.tls() if identity is not None else None,
            connect_timeout=self.connect_timeout,
            request_timeout=self.request_timeout,
        )
        if identity is None:
            return Bus(config)
        return Bus(config, signer=identity.signer(), verifier=identity.verifier())


async def probe_sn(endpoint: Endpoint) -> str:
    """Connect to the broker, find an online SN and disconnect; returns the SN's uid.

    Raises:
        BusError: no broker or no SN answered within ``endpoint.connect_timeout``.
    """
    async with endpoint.bus() as bus:
        return await find_sn(bus, timeout=endpoint.connect_timeout)


class LedgerLink:
    """An open bus session to one SN, with the ledger's requests.

    Args:
        endpoint: where to connect and as whom.
        key: what the link was opened for (the executor reopens when its context changes).
    """

    def __init__(self, endpoint: Endpoint, key: object = None) -> None:
        self.endpoint = endpoint
        self.key = key
        self._client: LedgerClient | None = None
        self._error: BaseException | None = None
        self._ready = asyncio.Event()
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def open(self) -> bool:
        """Whether the session is up."""
        return self._client is not None and self._task is not None and not self._task.done()

    @property
    def client(self) -> LedgerClient:
        """The ledger client (only while :attr:`open`)."""
        if self._client is None:
            raise BusError(f"not connected to {self.endpoint.broker}")
        return self._client

    @property
    def reconnects(self) -> int:
        """How often the bus session has reconnected (a hint that events may have been missed)."""
        return self.client.bus.reconnects

    async def connect(self) -> LedgerLink:
        """Open the session and find the SN.

        Raises:
            BusError: the broker or the SN cannot be reached (the message says which and why).
        """
        self._task = asyncio.create_task(self._hold(), name=f"swci.link[{self.endpoint.broker}]")
        try:
            await self._ready.wait()
        except asyncio.CancelledError:
            await self.close()
            raise
        if self._error is not None:
            await self.close()
            raise self._error
        return self

    async def _hold(self) -> None:
        try:
            async with self.endpoint.bus() as bus:
                timeout = self.endpoint.connect_timeout
                self._client = LedgerClient(bus, await find_sn(bus, timeout=timeout), timeout=timeout)
                self._ready.set()
                await self._closing.wait()
        except BusError as exc:
            self._error = exc
        except Exception as exc:  # TLS and socket errors the bus did not wrap
            log.exception("connecting to %s failed", self.endpoint.broker)
            self._error = BusError(f"cannot connect to {self.endpoint.broker}: {exc}")
        finally:
            self._client = None
            self._ready.set()

    async def close(self) -> None:
        """Close the session (bounded; a session that hangs is cancelled)."""
        self._closing.set()
        task, self._task = self._task, None
        if task is None:
            return
        try:
            async with asyncio.timeout(_CLOSE_TIMEOUT):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -------------------------------------------------------------- requests
    async def submit(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        """Submit a transaction; raises ``Rejected`` with the ledger's reason."""
        log.info("submit %s %s", kind, body)
        return await self.client.submit(kind, body)

    async def query(self, query: str, /, **args: Any) -> Any:
        """A read of the ledger (``contracts.views.QUERIES``); ``RemoteError`` for a missing entity."""
        return await self.client.query(query, **args)

    async def status(self) -> dict[str, Any]:
        """The SN's own status: uid, version, height, sentinel ..."""
        return await self.client.status()

    @contextlib.asynccontextmanager
    async def watch(self, entity: str, key: str = "+") -> AsyncIterator[Watch]:
        """The events of one ledger entity for the duration of the block."""
        async with self.client.watch(entity, key) as watch:
            yield watch
