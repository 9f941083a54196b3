"""The SL's end of the local socket: frames in, the session's answers out, one request at a time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from wire import CodecError
from wire.frames import HEADER_PREFIX, decode_header, encode_frame_head, header_length, payload_size
from wire.tensors import FlatState

__all__ = ["LocalServer"]

log = logging.getLogger("swarm.sl.local")

Handler = Callable[[dict[str, Any], np.ndarray | None], Awaitable[tuple[dict[str, Any], FlatState | None]]]


class LocalServer:
    """A unix socket that the ML program's SwarmCallback connects to."""

    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = path
        self._handler = handler
        self._server: asyncio.Server | None = None
        self.connections = 0

    async def __aenter__(self) -> LocalServer:
        """Listen (the socket file exists when this returns)."""
        self._server = await asyncio.start_unix_server(self._client, path=str(self.path), limit=1 << 20)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self._server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    prefix = await reader.readexactly(HEADER_PREFIX.size)
                except asyncio.IncompleteReadError:
                    return  # the ML program closed the connection
                started = time.perf_counter()
                header = decode_header(await reader.readexactly(header_length(prefix)))
                size = payload_size(header)
                payload = np.frombuffer(await reader.readexactly(size), np.uint8) if size else None
                read = time.perf_counter()
                reply, flat = await self._handler(header, payload)
                timing = {"read": read - started, "handle": time.perf_counter() - read}
                await self._send(writer, {**reply, "sl_s": timing}, flat)
        except (CodecError, asyncio.IncompleteReadError, ConnectionError) as exc:
            log.error("dropped the ML program's connection: %s", exc)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, reply: dict[str, Any], flat: FlatState | None) -> None:
        size = flat.total if flat is not None else 0
        writer.write(encode_frame_head(reply, size))
        if flat is not None:
            writer.write(flat.buffer.data.cast("B"))
        await writer.drain()
