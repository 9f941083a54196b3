"""A model's bytes read from a data plane connection straight into its buffer, each chunk hashed (off the
event loop) as soon as it is complete.

Read through an ``asyncio.StreamReader``, every byte is copied three times after the kernel's copy (into
a ``bytes``, into the reader's ``bytearray``, out into a new ``bytes``) before it reaches the model's
buffer, and the reader's buffer keeps taking fresh pages that the kernel must zero. For the length of the
model, the connection's transport is handed a ``BufferedProtocol`` instead, which has the kernel (or TLS)
write straight into the model's buffer; then the stream gets its transport back.
"""

from __future__ import annotations

import asyncio

import numpy as np

from wire import CodecError
from wire.tensors import Manifest, chunk_digest

__all__ = ["receive_verified"]


async def receive_verified(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    buffer: np.ndarray,
    manifest: Manifest,
    idle: float,
) -> None:
    """Read ``manifest.total`` bytes into ``buffer`` with no pause longer than ``idle`` s and check every
    chunk against the manifest.

    Raises:
        asyncio.IncompleteReadError: the connection ended first.
        TimeoutError: nothing arrived for ``idle`` s.
        CodecError: a chunk does not match the manifest.
    """
    view = buffer.data.cast("B")
    checks = _ChunkChecks(view, manifest)
    filled = await _take_buffered(reader, view, manifest.total)
    checks.up_to(filled)
    if filled < manifest.total:
        _check_open(reader, manifest.total - filled)
        into = _Into(view, filled, writer.transport)
        try:
            while not into.complete:
                async with asyncio.timeout(idle):
                    await into.progress()
                checks.up_to(into.filled)
        finally:
            into.give_back()
    await checks.verify()


async def _take_buffered(reader: asyncio.StreamReader, view: memoryview, total: int) -> int:
    """Copy the model's first bytes that the stream holds already (read with the header) into ``view``."""
    # StreamReader has no public way to ask how much it holds without waiting for more.
    held = min(len(reader._buffer), total)  # type: ignore[attr-defined]
    if held:
        view[:held] = await reader.readexactly(held)  # at once: the bytes are there
    return held


def _check_open(reader: asyncio.StreamReader, missing: int) -> None:
    """Raise what ended the stream already (the transport reports nothing more once it has)."""
    error = reader.exception()
    if error is not None:
        raise error
    if reader.at_eof():
        raise asyncio.IncompleteReadError(b"", missing)


class _ChunkChecks:
    """The chunks' hashes, each computed on a worker thread once the chunk is complete."""

    def __init__(self, view: memoryview, manifest: Manifest) -> None:
        self._view = view
        self._manifest = manifest
        self._started = 0
        self._digests: list[asyncio.Future[bytes]] = []

    def up_to(self, filled: int) -> None:
        """Start hashing every chunk that lies within the first ``filled`` bytes."""
        size, manifest = self._manifest.chunk_size, self._manifest
        complete = manifest.n_chunks if filled == manifest.total else filled // size
        for index in range(self._started, complete):
            part = self._view[index * size : (index + 1) * size]
            self._digests.append(asyncio.ensure_future(asyncio.to_thread(chunk_digest, part, manifest.hash)))
        self._started = max(self._started, complete)

    async def verify(self) -> None:
        """CodecError naming the chunks whose hash differs from the manifest's."""
        digests = await asyncio.gather(*self._digests)
        corrupt = [i for i, d in enumerate(digests) if d != self._manifest.chunks[i]]
        if corrupt:
            raise CodecError(f"chunks {corrupt[:10]} do not match the manifest")


class _Into(asyncio.BufferedProtocol):
    """Takes a transport's incoming bytes into ``view[filled:]`` until it is full, then gives the
    transport back to its own protocol (to which it passes on flow control and the connection's end)."""

    def __init__(self, view: memoryview, filled: int, transport: asyncio.BaseTransport) -> None:
        self._view = view
        self.filled = filled
        self._transport = transport
        self._own = transport.get_protocol()
        self._error: BaseException | None = None
        self._moved = asyncio.Event()
        transport.set_protocol(self)

    @property
    def complete(self) -> bool:
        """Whether the view is full."""
        return self.filled == len(self._view)

    async def progress(self) -> None:
        """Wait for more bytes (or the end); raise what ended the connection."""
        await self._moved.wait()
        self._moved.clear()
        if self._error is not None and not self.complete:
            raise self._error

    def give_back(self) -> None:
        """Hand the transport back to its own protocol (once)."""
        if self._transport.get_protocol() is self:
            self._transport.set_protocol(self._own)

    def get_buffer(self, sizehint: int) -> memoryview:
        """The part of the view still to fill."""
        return self._view[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` more arrived; once full, the stream reads what follows."""
        self.filled += nbytes
        if self.complete:
            self.give_back()
        self._moved.set()

    def eof_received(self) -> bool | None:
        """The peer stopped sending before the end of the model."""
        self._stop(asyncio.IncompleteReadError(b"", len(self._view) - self.filled))
        return self._own.eof_received() if isinstance(self._own, asyncio.Protocol) else None

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection ended before the end of the model."""
        self._stop(exc or asyncio.IncompleteReadError(b"", len(self._view) - self.filled))
        self._own.connection_lost(exc)

    def pause_writing(self) -> None:
        """Passed on: the stream's writer waits in ``drain`` on its own protocol."""
        self._own.pause_writing()

    def resume_writing(self) -> None:
        """Passed on, as ``pause_writing``."""
        self._own.resume_writing()

    def _stop(self, error: BaseException) -> None:
        self._error = error
        self._moved.set()
