"""The SL's end of the local socket: frames in, the session's answers out, one request at a time.

A ``hello`` with ``shm_bytes`` makes the weights go through shared buffers (``wire.shared``, beside the
socket) instead of the socket: every answer lends the ML program a buffer for its next weights
(``"shm_next": <path>``), a request naming it (``"shm": <path>``) carries its weights there, and an answer's
weights come back in the buffer named by its ``"shm"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from daemons.sl.buffers import MODEL_BUFFERS
from daemons.sl.peer_files import PEER_FILES
from wire import CodecError
from wire.frames import HEADER_PREFIX, decode_header, encode_frame_head, header_length, payload_size
from wire.tensors import MAX_STATE_BYTES, FlatState
from wire.workers import off_loop_if_large

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
        shared: _SharedWeights | None = None
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
                if shared is not None:
                    shared.request_arrived()
                    if "shm" in header:
                        payload = shared.returned(header["shm"])
                elif header.get("op") == "hello":
                    shared = await self._share(header.get("shm_bytes"))
                read = time.perf_counter()
                reply, flat = await self._handler(header, payload)
                timing = {"read": read - started, "handle": time.perf_counter() - read}
                reply = {**reply, "sl_s": timing}
                if shared is not None:
                    reply, flat = await shared.reply(reply, flat)
                await self._send(writer, reply, flat)
        except (CodecError, asyncio.IncompleteReadError, ConnectionError) as exc:
            log.error("dropped the ML program's connection: %s", exc)
        finally:
            if shared is not None:
                shared.close()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._writers.discard(writer)
            if task is not None:
                self._tasks.discard(task)

    async def _share(self, nbytes: Any) -> _SharedWeights | None:
        """Weight buffers of the size a ``hello`` asks for (``shm_bytes``) beside the socket; None when it
        asks for none or none can be made (the weights then go through the socket)."""
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or not 0 < nbytes <= MAX_STATE_BYTES:
            return None
        shared = _SharedWeights(self.path.parent, nbytes)
        if await shared.lend() is None:
            shared.close()
            log.warning("weights go through the socket: no shared buffer of %d bytes could be made", nbytes)
            return None
        return shared

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, reply: dict[str, Any], flat: FlatState | None) -> None:
        size = flat.total if flat is not None else 0
        writer.write(encode_frame_head(reply, size))
        if flat is not None:
            writer.write(flat.buffer.data.cast("B"))
        await writer.drain()


class _SharedWeights:
    """The weight buffers one connection shares with its ML program (``MODEL_BUFFERS`` makes them).

    The SL lends the program one buffer at a time to flatten its next weights into; a request naming it
    hands it back, and its array is then the request's weights, which the SL holds as long as the round
    needs them. An answer names the buffer its weights are in (copied into one only when they are not in
    a shared buffer already: the merge's output, the merged model from the leader and the node's own row
    are); the SL holds it until the program's next request, which the program sends only once it has read
    the answer. The pool never hands out a buffer somebody holds, so the program never writes where the
    SL reads, and never reads what the SL writes.
    """

    def __init__(self, directory: Path, nbytes: int) -> None:
        self.nbytes = nbytes
        MODEL_BUFFERS.share(nbytes, directory)
        self._lent: tuple[np.ndarray, str] | None = None  # the buffer lent and its file's name
        self._answered: np.ndarray | None = None

    async def lend(self) -> str | None:
        """The buffer for the program's next weights (the one lent already, while unused); None when
        none is shared (the weights then come through the socket)."""
        if self._lent is None:
            self._lent = await self._take()
        return None if self._lent is None else self._lent[1]

    def request_arrived(self) -> None:
        """The program sent a request: it has read the last answer, whose buffer may go."""
        self._answered = None

    def returned(self, name: Any) -> np.ndarray:
        """The weights of a request whose ``shm`` names the lent buffer (CodecError for any other)."""
        if self._lent is None or name != self._lent[1]:
            raise CodecError(f"weights said to be in shared buffer {name!r}, which is not the one lent")
        buffer, self._lent = self._lent[0], None
        return buffer

    async def reply(
        self, reply: dict[str, Any], flat: FlatState | None
    ) -> tuple[dict[str, Any], FlatState | None]:
        """``reply`` with its weights in a shared buffer instead of after it, and the next buffer lent."""
        if flat is not None and flat.total == self.nbytes:
            name = await self.answer(flat)
            if name is not None:
                reply, flat = {**reply, "shm": name}, None
        lent = await self.lend() if reply.get("op") != "error" else None
        return ({**reply, "shm_next": lent} if lent is not None else reply), flat

    async def answer(self, flat: FlatState) -> str | None:
        """The name of a shared buffer holding ``flat``'s weights (copied into one when they are
        elsewhere); None when there is none."""
        path = MODEL_BUFFERS.file_of(flat.buffer)
        if path is not None:
            self._answered = flat.buffer
            return str(path)
        taken = await self._take()
        if taken is None:
            return None
        await _copy(flat.buffer, into=taken[0])
        self._answered = taken[0]
        return taken[1]

    async def _take(self) -> tuple[np.ndarray, str] | None:
        """A free buffer of the pool and the name of its file; None when it is not a file (the pool
        shares no more of this size). A big new one is taken off the event loop (its memory is reserved)."""
        buffer = await off_loop_if_large(
            self.nbytes, partial(MODEL_BUFFERS.take, self.nbytes), limit=_COPY_INLINE
        )
        path = MODEL_BUFFERS.file_of(buffer)
        return None if path is None else (buffer, str(path))

    def close(self) -> None:
        """The program went: remove the files (the mappings go with the last array using them)."""
        self._lent = self._answered = None
        MODEL_BUFFERS.unshare(self.nbytes)
        PEER_FILES.forget()  # the peers' files of this job, which their SLs remove as their programs end


async def _copy(source: np.ndarray, *, into: np.ndarray) -> None:
    """``source`` copied into ``into``; big ones off the event loop."""
    await off_loop_if_large(source.nbytes, partial(np.copyto, into, source), limit=_COPY_INLINE)
