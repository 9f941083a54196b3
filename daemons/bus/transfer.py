"""Pulled state transfers: a holder publishes a state dict's chunks + signed manifest when asked.

The receiver subscribes to ``nodes/<holder>/blob/<transfer>/+`` first, then sends ``req:fetch``
``{digest, transfer, chunks?}``; the holder answers at once with the sizes and publishes in the
background. Missing chunks are asked for again by index; the result is checked against the digest.
A holder whose presence says ``offline`` (its will: it died) fails the fetch at once, not after the
idle timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import numpy as np

from daemons.bus.errors import BusError
from daemons.bus.rpc import Request, RpcError
from daemons.bus.session import Bus, Message, Subscription
from wire import CodecError
from wire.tensors import (
    BLAKE3,
    MAX_STATE_BYTES,
    FlatState,
    Manifest,
    Reassembler,
    accepted_hashes,
    encode_chunk,
    make_manifest,
    manifest_from_body,
)
from wire.workers import off_loop_if_large

__all__ = ["FETCH_METHOD", "StateHolder", "TransferError", "digest_hex", "fetch_state", "publish_state"]

log = logging.getLogger("swarm.transfer")
T = TypeVar("T")
FETCH_METHOD = "fetch"
_WINDOW = 8  # chunks in flight per transfer


class TransferError(BusError):
    """A state could not be fetched; says from whom, which digest and why."""


@dataclass(frozen=True, slots=True)
class _Held:
    flat: FlatState
    manifest: Manifest


def digest_hex(digest: bytes) -> str:
    """Short printable form of a model digest."""
    return digest.hex()[:16]


_ResultKey = tuple[str, int, tuple[str, ...] | None]  # contract, round, participants merged early


class StateHolder:
    """States this node can serve to others, by digest (a small LRU)."""

    def __init__(self, bus: Bus, *, capacity: int = 4, hash: str = BLAKE3) -> None:
        self._bus = bus
        self.hash = hash  # the chunk hash of the models it describes (``wire.tensors.weights_hash``)
        self._held: OrderedDict[bytes, _Held] = OrderedDict()
        self._capacity = capacity
        self._pinned: set[bytes] = set()
        self.served: dict[bytes, set[str]] = {}
        self._results: OrderedDict[_ResultKey, asyncio.Future[bytes]] = OrderedDict()

    def _result(self, contract: str, number: int, among: tuple[str, ...] | None) -> asyncio.Future[bytes]:
        key = (contract, number, among)
        future = self._results.get(key)
        if future is None:
            future = self._results[key] = asyncio.get_running_loop().create_future()
            while len(self._results) > 2 * self._capacity:
                self._results.popitem(last=False)
        return future

    def announce(
        self, contract: str, number: int, digest: bytes, among: tuple[str, ...] | None = None
    ) -> None:
        """This node merged round ``number`` of ``contract`` into the held model ``digest`` (before the
        ledger records it: whoever takes it checks it against the ledger's digest). ``among``: the
        participants of a merge made before the ledger closed the round (sorted), served only to those
        who ask for exactly them."""
        future = self._result(contract, number, among)
        if not future.done():
            future.set_result(digest)

    async def result(
        self, contract: str, number: int, timeout: float, among: tuple[str, ...] | None = None
    ) -> bytes | None:
        """The digest of the merged model of round ``number`` (of exactly ``among``) once this node
        announces it, or None when that does not happen within ``timeout`` seconds."""
        future = self._result(contract, number, among)
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(future)
        except TimeoutError:
            return None

    async def add(self, flat: FlatState, *, meta: dict[str, Any] | None = None) -> Manifest:
        """Hash ``flat`` (off the event loop unless it is small) and keep it servable; its manifest."""
        manifest = await off_loop_if_large(
            flat.total, partial(make_manifest, flat, "held", meta=meta, hash=self.hash)
        )
        self.keep(flat, manifest)
        return manifest

    def keep(self, flat: FlatState, manifest: Manifest) -> None:
        """Keep an already-described state servable."""
        self._held[manifest.digest] = _Held(flat, manifest)
        self._held.move_to_end(manifest.digest)
        unpinned = [d for d in self._held if d not in self._pinned]
        for digest in unpinned[: max(len(unpinned) - self._capacity, 0)]:
            del self._held[digest]

    def pin(self, digest: bytes) -> None:
        """Keep ``digest`` servable beyond the LRU's capacity until ``unpin`` (a row checked in to a
        round the ledger has not finished yet, whose leader may still pull it)."""
        self._pinned.add(digest)

    def unpin(self, digest: bytes) -> None:
        """Let ``digest`` age out of the LRU again."""
        self._pinned.discard(digest)

    def get(self, digest: bytes) -> FlatState | None:
        """The held state with ``digest``, if any."""
        held = self._held.get(digest)
        return held.flat if held is not None else None

    def held(self, digest: bytes) -> tuple[FlatState, Manifest] | None:
        """The held state with ``digest`` and its manifest, if any."""
        held = self._held.get(digest)
        return (held.flat, held.manifest) if held is not None else None

    async def handle_fetch(self, request: Request) -> dict[str, Any]:
        """RPC handler for ``fetch``: start publishing and answer with the sizes."""
        body = request.body
        digest, transfer, indices = body.get("digest"), body.get("transfer"), body.get("chunks")
        if not isinstance(digest, bytes) or not isinstance(transfer, str):
            raise RpcError("bad-request", "fetch needs 'digest' (bytes) and 'transfer' (str)")
        held = self._held.get(digest)
        if held is None:
            raise RpcError("not-held", f"{self._bus.uid!r} does not hold model {digest_hex(digest)}")
        n = held.manifest.n_chunks
        if indices is not None and (
            not isinstance(indices, list) or not all(isinstance(i, int) and 0 <= i < n for i in indices)
        ):
            raise RpcError("bad-request", f"'chunks' must be a list of indices below {n}")
        manifest = dataclasses.replace(held.manifest, transfer=transfer)
        self._bus.spawn(publish_state(self._bus, held.flat, manifest, indices), f"publish {transfer}")
        self.served.setdefault(digest, set()).add(request.sender)
        return {"total": manifest.total, "chunks": n}


async def publish_state(
    bus: Bus, flat: FlatState, manifest: Manifest, indices: list[int] | None = None
) -> None:
    """Publish chunks (``indices``, default all) with a bounded window, then the signed manifest."""
    window = asyncio.Semaphore(_WINDOW)
    topic = bus.topics.blob_chunks(bus.uid, manifest.transfer)

    async def send(index: int) -> None:
        try:
            await bus.publish(topic, encode_chunk(flat, manifest, index))
        finally:
            window.release()

    async with asyncio.TaskGroup() as group:
        for index in range(manifest.n_chunks) if indices is None else indices:
            await window.acquire()
            group.create_task(send(index))
    await bus.send(bus.topics.blob_manifest(bus.uid, manifest.transfer), "manifest", manifest.body())


async def fetch_state(
    bus: Bus,
    holder: str,
    digest: bytes,
    *,
    idle_timeout: float = 10.0,
    attempts: int = 3,
    max_total: int = MAX_STATE_BYTES,
    spare: np.ndarray | None = None,
    keep: StateHolder | None = None,
    height: int | None = None,
) -> FlatState:
    """Fetch the state with ``digest`` from ``holder``; raise TransferError saying why it failed.

    ``spare``: a buffer to reassemble into when the size matches; ``keep``: keep the result
    servable there (with its verified manifest); ``height``: the newest ledger block we saw (the holder
    checks who may fetch at least there).
    """
    transfer = f"t{uuid.uuid4().hex[:20]}"
    reassembler = Reassembler(transfer, max_total=max_total, spare=spare)
    what = f"fetch of model {digest_hex(digest)} from {holder!r}"
    async with bus.subscribe(bus.topics.blob(holder, transfer), maxsize=100_000) as sub:

        async def receive() -> None:
            wanted: list[int] | None = None
            for _ in range(attempts):
                await _ask(bus, holder, digest, transfer, wanted, height)
                if await _receive(bus, sub, reassembler, idle_timeout):
                    return
                wanted = reassembler.missing() or None
            missing = reassembler.missing()
            raise TransferError(
                f"{what} failed: {f'chunks {missing[:10]} missing' if missing else 'no manifest'}"
            )

        await _while_online(bus, holder, receive(), what)
    try:
        flat = await asyncio.to_thread(reassembler.finish)
    except CodecError as exc:
        raise TransferError(f"model {digest_hex(digest)} from {holder!r}: {exc}") from None
    assert reassembler.manifest is not None  # noqa: S101 - finish() checked it
    if reassembler.manifest.digest != digest:
        raise TransferError(
            f"{holder!r} sent model {digest_hex(reassembler.manifest.digest)}, not {digest_hex(digest)}"
        )
    if keep is not None:
        keep.keep(flat, reassembler.manifest)
    return flat


async def _ask(
    bus: Bus, holder: str, digest: bytes, transfer: str, indices: list[int] | None, height: int | None
) -> None:
    body: dict[str, Any] = {"digest": digest, "transfer": transfer}
    if indices is not None:
        body["chunks"] = indices
    if height is not None:
        body["height"] = height
    try:
        await bus.request(holder, FETCH_METHOD, body)
    except BusError as exc:
        raise TransferError(f"fetch of model {digest_hex(digest)} from {holder!r}: {exc}") from None


async def _receive(bus: Bus, sub: Subscription, reassembler: Reassembler, idle_timeout: float) -> bool:
    """Take messages until the transfer is complete (True) or nothing came for ``idle_timeout``."""
    while not reassembler.complete:
        try:
            async with asyncio.timeout(idle_timeout):
                message = await sub.get()
        except TimeoutError:
            return False
        _take(bus, message, reassembler)
    return True


def _take(bus: Bus, message: Message, reassembler: Reassembler) -> None:
    try:
        if message.topic.endswith("/c"):
            reassembler.add_chunk(message.payload)
        else:
            env = bus.open(message)
            manifest = manifest_from_body(
                env.body, what=f"manifest from {env.sender}", hashes=accepted_hashes(bus.signer is not None)
            )
            reassembler.set_manifest(manifest)
    except CodecError as exc:
        log.warning("transfer %s: dropped a bad message: %s", reassembler.transfer, exc)


async def _while_online(bus: Bus, uid: str, work: Awaitable[T], what: str) -> T:
    """``work``, cut short with a TransferError when ``uid``'s presence says ``offline`` (the broker
    publishes a dead node's will at once; without this the work waits out its timeouts)."""
    async with bus.subscribe(bus.topics.presence(uid), maxsize=100) as presence:
        task = asyncio.ensure_future(work)
        gone = asyncio.ensure_future(_offline(bus, presence))
        try:
            done, _ = await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pending in (gone, task):
                if not pending.done():
                    pending.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await pending
        if task not in done:
            raise TransferError(f"{what} failed: {uid!r} went offline")
        return task.result()


async def _offline(bus: Bus, presence: Subscription) -> None:
    """Returns once the presence on ``presence`` says ``offline`` (under every identity it was seen
    with: an old certificate's retained ``offline`` says nothing about the live session)."""
    states: dict[str, object] = {}
    async for message in presence:
        try:
            env = bus.open(message)
        except CodecError:
            continue
        if env.kind == "presence":
            states[env.identity] = env.body.get("state")
            if all(state == "offline" for state in states.values()):
                return
