"""The SL's end of the local socket: frames in, the session's answers out, one request at a time.

A ``hello`` with ``shm_bytes`` gets a shared weight buffer (``wire.shared``, beside the socket): requests
marked ``"shm": true`` then carry their weights in it, and their answers' weights come back in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from daemons.sl.buffers import MODEL_BUFFERS
from wire import CodecError
from wire.frames import HEADER_PREFIX, decode_header, encode_frame_head, header_length, payload_size
from wire.shared import SharedBuffer
from wire.tensors import FlatState

__all__ = ["LocalServer"]

log = logging.getLogger("swarm.sl.local")

_COPY_INLINE = 8 << 20  # bytes copied on the event loop; bigger copies go to a thread

Handler = Callable[[dict[str, Any], np.ndarray | None], Awaitable[tuple[dict[str, Any], FlatState | None]]]


class LocalServer:
    """A unix socket that the ML program's SwarmCallback connects to."""

    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = path
        self._handler = handler
        self._server: asyncio.Server | None = None
        self.connections = 0
        self._shared = 0  # shared buffers made so far (their names)
        self._tasks: set[asyncio.Task[Any]] = set()  # the connections' handlers
        self._writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> LocalServer:
        """Listen (the socket file exists when this returns)."""
        self._server = await asyncio.start_unix_server(self._client, path=str(self.path), limit=1 << 20)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Stop listening; close the connections and let their handlers end (cancelled after 5 s)."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self._server.wait_closed()
        for writer in self._writers:
            writer.close()  # a handler waiting for the next request ends at once
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=5)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        shared: SharedBuffer | None = None
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self._writers.add(writer)
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
                via_shared = header.get("shm") is True and shared is not None
                if via_shared and shared is not None:
                    payload = await _copy(shared.array)  # ours: the ML program overwrites the buffer
                elif header.get("op") == "hello" and shared is None:
                    shared = self._share(header.get("shm_bytes"))
                read = time.perf_counter()
                reply, flat = await self._handler(header, payload)
                timing = {"read": read - started, "handle": time.perf_counter() - read}
                reply = {**reply, "sl_s": timing}
                if header.get("op") == "hello" and shared is not None and reply.get("op") == "ok":
                    reply["shm_path"] = str(shared.path)
                if via_shared and shared is not None and flat is not None and flat.total == shared.nbytes:
                    await _copy(flat.buffer, into=shared.array)
                    reply["shm"], flat = True, None
                await self._send(writer, reply, flat)
        except (CodecError, asyncio.IncompleteReadError, ConnectionError) as exc:
            log.error("dropped the ML program's connection: %s", exc)
        finally:
            if shared is not None:
                shared.remove()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._writers.discard(writer)
            if task is not None:
                self._tasks.discard(task)

    def _share(self, nbytes: Any) -> SharedBuffer | None:
        """The weight buffer a ``hello`` asks for (``shm_bytes``) beside the socket; None when it asks
        for none or it cannot be made (the weights then go through the socket)."""
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes <= 0:
            return None
        self._shared += 1
        try:
            return SharedBuffer.create(self.path.parent, f"weights-{self._shared}", nbytes)
        except (OSError, CodecError) as exc:
            log.warning("weights go through the socket: no shared buffer of %d bytes: %s", nbytes, exc)
            return None

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, reply: dict[str, Any], flat: FlatState | None) -> None:
        size = flat.total if flat is not None else 0
        writer.write(encode_frame_head(reply, size))
        if flat is not None:
            writer.write(flat.buffer.data.cast("B"))
        await writer.drain()


async def _copy(source: np.ndarray, *, into: np.ndarray | None = None) -> np.ndarray:
    """``source`` copied (into ``into``, or a new array); big ones off the event loop."""
    out = MODEL_BUFFERS.take(source.nbytes) if into is None else into
    if source.nbytes <= _COPY_INLINE:
        np.copyto(out, source)
    else:
        await asyncio.to_thread(np.copyto, out, source)
    return out
