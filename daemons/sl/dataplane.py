"""The SL-to-SL data plane: models pulled over a direct TCP connection, the broker carrying only control.

Every SL serves the models its ``StateHolder`` holds on a TCP port (mutual TLS with the node
certificates when the swarm has them) and records ``dp://host:port`` (``dps://`` with TLS) as its
address in ``node.register``. A peer asks for a model by digest and gets the manifest and the raw flat
buffer; it checks every chunk against the manifest and the manifest against the digest the ledger
recorded, as for a transfer through the broker (``daemons/bus/transfer.py``), which stays the fallback.

Frames (both ways): ``u32 length | msgpack header | raw payload`` as on the local socket
(``wire/frames.py``). Request header ``{op: "get", digest: bytes, sender: str}`` (a held model), or
``{op: "result", contract: str, round: int, sender: str}`` (the model the server merges for that round,
sent once it has it: participants pull it while the leader records its digest); no payload. Reply
``{op: "state", manifest: <manifest body>}`` + ``total`` bytes, or ``{op: "error", message}``.
A participant also pushes the model it checks in to the round's predicted leader while the check-in is
sealed: ``{op: "offer", sender: str, manifest: <manifest body>}`` + ``total`` bytes, answered
``{op: "taken"}`` or an error. The server checks every chunk and keeps the newest offer of each sender
(``Offers``) for the leader to take by digest: only the digest the ledger recorded for a check-in selects
a row, so an offer can stand in for nothing but the bytes it hashes to.
A connection carries one request at a time and is kept for the next.
The server counts which peers took each model (``Served``: a serve counts once its last byte is sent),
so that the leader of a final round can wait until another node holds the merged model before it
records it.
Between SLs of one host a model in a buffer file of the sender's pool is copied out of that file instead
(``daemons.sl.peer_files``): a request with ``files: true`` is answered ``{op: "state", manifest, file}``
with no payload, and the puller answers ``{op: "copied"}`` once it has the model, or ``{op: "send"}`` to
get the bytes after all; an offer may name its ``file`` the same way, and the server answers ``taken``
or ``{op: "send"}``. A serve counts once the copy is acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from contracts.block import MAX_HEIGHT, is_height
from daemons.bus.transfer import StateHolder, TransferError, digest_hex
from daemons.sl import peer_files
from daemons.sl.buffers import MODEL_BUFFERS
from daemons.sl.peer_files import PEER_FILES, FileRefused, checked_path
from daemons.sl.receive import receive_verified
from wire import CodecError
from wire.frames import HEADER_PREFIX, decode_header, encode_frame_head, header_length, payload_size
from wire.tensors import HASHES, MAX_STATE_BYTES, FlatState, Manifest, accepted_hashes, manifest_from_body
from wire.workers import off_loop_if_large

__all__ = [
    "DataPlaneClient",
    "DataPlaneServer",
    "DataRequest",
    "Endpoint",
    "Offered",
    "Offers",
    "PushedCheckin",
    "Served",
    "decode_reply",
    "decode_request",
    "encode_offer",
    "encode_request",
    "encode_result_request",
    "parse_address",
]

log = logging.getLogger("swarm.sl.dataplane")
_STREAM_LIMIT = 4 << 20  # read buffer of a connection
_SEND_SLICE = 4 << 20
_REQUEST_TIMEOUT = 30.0  # an idle connection waits this long for its next request
_REUSE_WITHIN = _REQUEST_TIMEOUT / 2  # a client reuses a kept connection idle for less than this
_DIGEST_BYTES = 32
_MAX_UID = 256
_MAX_ROUND = 2**53
_MAX_AMONG = 4096
MAX_CHECKIN_BYTES = 64 * 1024  # a signed check-in envelope pushed with a row, its certificate included
# What a request over a kept connection fails of: the connection, the peer, or what the peer sent.
_TRANSFER_ERRORS = (OSError, asyncio.IncompleteReadError, TimeoutError, CodecError, ssl.SSLError)
# Whether a peer may have a held model: (digest, the uid it claims, its certificate's CN or None) -> why not.
# (digest, requester, the identity its certificate proved, the newest ledger block it saw) -> refusal or None
FetchCheck = Callable[[bytes, str, str | None, int | None], Awaitable[str | None]]
_MODELS, _RESULTS = "models", "results"  # the lanes of a client's connections to one peer
RESULT_WAIT = 60.0  # how long a server waits for the merged model of a round it was asked for


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a peer's data plane listens, and whether it speaks TLS."""

    host: str
    port: int
    tls: bool

    def __str__(self) -> str:
        return f"{'dps' if self.tls else 'dp'}://{self.host}:{self.port}"


def parse_address(text: object) -> Endpoint | None:
    """The data plane of a node's registered ``address`` (``dp[s]://host:port``), else None."""
    if not isinstance(text, str):
        return None
    scheme, sep, rest = text.partition("://")
    host, colon, port = rest.rpartition(":")
    if not sep or scheme not in ("dp", "dps") or not colon or not host or not port.isdigit():
        return None
    number = int(port)
    return Endpoint(host.strip("[]"), number, scheme == "dps") if 0 < number < 65536 else None


# ------------------------------------------------------------------------------------------- frames
class PushedCheckin(NamedTuple):
    """A check-in pushed with a row for the leader to relay to the ledger with its own: the signed
    envelope, and the digest of the pusher's check-in before it (``after``) when that one's round may
    not have closed yet; the leader relays it only once the ledger closed a round that lists that one,
    so that it cannot land in the round its predecessor waits for."""

    envelope: bytes
    after: bytes | None = None


@dataclass(frozen=True, slots=True)
class DataRequest:
    """A model asked for: a held one by ``digest``, or the merged model of ``contract`` round ``round``."""

    sender: str
    digest: bytes | None = None
    contract: str | None = None
    round: int | None = None
    among: tuple[str, ...] | None = None  # a merge of exactly these participants, asked for before the close
    offer: Manifest | None = None  # a pushed model: its manifest, ``offer.total`` payload bytes follow
    offer_round: int | None = None  # the round the pusher predicts its row is for
    offer_weight: float | None = None  # the weight it checks in with
    offer_file: str | None = None  # the pusher's buffer file holding the offer, instead of a payload
    offer_checkin: PushedCheckin | None = None  # the pusher's signed check-in, for the leader to relay
    files: bool = False  # the asker can copy the model from a file of ours (same host, same user)
    height: int | None = None  # the newest ledger block the asker of a held model saw (its check reads there)


def encode_request(digest: bytes, sender: str, *, files: bool = False, height: int | None = None) -> bytes:
    """A request for the held model ``digest``; ``files``: the answer may name a file to copy it from;
    ``height``: the newest ledger block the sender saw (the server checks who may fetch at least there)."""
    head: dict[str, Any] = {"op": "get", "digest": digest, "sender": sender, **_files(files)}
    if height is not None:
        head["height"] = height
    return encode_frame_head(head)


def encode_result_request(
    contract: str, number: int, sender: str, among: tuple[str, ...] | None = None, *, files: bool = False
) -> bytes:
    """A request for the model the server merges for round ``number`` of ``contract``; ``among``: only
    a merge of exactly these participants, made before the ledger closed the round."""
    head: dict[str, Any] = {"op": "result", "contract": contract, "round": number, "sender": sender}
    if among is not None:
        head["among"] = list(among)
    return encode_frame_head({**head, **_files(files)})


def _files(files: bool) -> dict[str, bool]:
    return {"files": True} if files else {}


def encode_offer(
    manifest: Manifest,
    sender: str,
    number: int | None = None,
    weight: float | None = None,
    *,
    file: str | None = None,
    checkin: PushedCheckin | None = None,
) -> bytes:
    """The head of an offer: ``manifest.total`` bytes of the model follow it, or none when ``file``
    names the sender's buffer file holding them. ``number`` and ``weight``: the round the sender
    predicts and the weight it checks in with (a leader merges early with them); ``checkin``: the
    sender's signed check-in of this model, which the leader submits to the ledger with its own."""
    head: dict[str, Any] = {"op": "offer", "manifest": manifest.body(), "sender": sender}
    if number is not None:
        head["round"] = number
    if weight is not None:
        head["weight"] = weight
    if file is not None:
        head["file"] = file
    if checkin is not None:
        head["checkin"] = checkin.envelope
        if checkin.after is not None:
            head["after"] = checkin.after
    return encode_frame_head(head, nbytes=0 if file is not None else manifest.total)


def decode_request(
    data: bytes, *, max_offer: int = MAX_STATE_BYTES, hashes: Sequence[str] = HASHES
) -> DataRequest:
    """A request header, checked; CodecError naming what is wrong. ``hashes``: the chunk hashes an
    offer's manifest may use (``manifest_from_body``)."""
    header = decode_header(data)
    op, sender = header["op"], header.get("sender")
    if not isinstance(sender, str) or not 0 < len(sender) <= _MAX_UID:
        raise CodecError(f"data plane request: 'sender' must be a uid of 1..{_MAX_UID} characters")
    if op == "offer":
        number, weight = header.get("round"), header.get("weight")
        if weight is not None and (
            not isinstance(weight, (int, float)) or isinstance(weight, bool) or not 0 <= weight < 2**53
        ):
            raise CodecError("data plane offer: 'weight' must be a number from 0")
        file = header.get("file")
        return DataRequest(
            sender,
            offer=_offered(header, max_offer, hashes),
            offer_round=None if number is None else _round_number(number),
            offer_weight=None if weight is None else float(weight),
            offer_file=None if file is None else checked_path(file),
            offer_checkin=_pushed_checkin(header),
        )
    if op not in ("get", "result") or payload_size(header) != 0:
        raise CodecError(
            f"data plane request: op {op!r} must be 'get' or 'result' (with no payload) or 'offer'"
        )
    files = header.get("files", False)
    if not isinstance(files, bool):
        raise CodecError("data plane request: 'files' must be true or false")
    if op == "get":
        digest = header.get("digest")
        if not isinstance(digest, bytes) or len(digest) != _DIGEST_BYTES:
            raise CodecError(f"data plane request: 'digest' must be {_DIGEST_BYTES} bytes")
        height = header.get("height")
        checked = None if height is None else _height(height)
        return DataRequest(sender, digest=digest, files=files, height=checked)
    contract, number = header.get("contract"), header.get("round")
    if not isinstance(contract, str) or not 0 < len(contract) <= _MAX_UID:
        raise CodecError(f"data plane request: 'contract' must be a name of 1..{_MAX_UID} characters")
    return DataRequest(
        sender, contract=contract, round=_round_number(number), among=_among(header.get("among")), files=files
    )


def _pushed_checkin(header: dict[str, object]) -> PushedCheckin | None:
    """The signed check-in an offer carries (``checkin``, and ``after``: its sender's check-in before
    it), checked for shape only: the ledger verifies the signature when the leader relays it."""
    envelope, after = header.get("checkin"), header.get("after")
    if envelope is None:
        if after is not None:
            raise CodecError("data plane offer: 'after' without a 'checkin'")
        return None
    if not isinstance(envelope, bytes) or not 0 < len(envelope) <= MAX_CHECKIN_BYTES:
        raise CodecError(
            f"data plane offer: 'checkin' must be a signed envelope of 1..{MAX_CHECKIN_BYTES} bytes"
        )
    if after is not None and (not isinstance(after, bytes) or len(after) != _DIGEST_BYTES):
        raise CodecError(f"data plane offer: 'after' must be a digest of {_DIGEST_BYTES} bytes")
    return PushedCheckin(envelope, after)


def _height(height: object) -> int:
    if not is_height(height):
        raise CodecError(f"data plane request: 'height' must be a block height from 0 to {MAX_HEIGHT}")
    return height


def _round_number(number: object) -> int:
    if not isinstance(number, int) or isinstance(number, bool) or not 0 < number <= _MAX_ROUND:
        raise CodecError(f"data plane request: 'round' must be a round number from 1 to {_MAX_ROUND}")
    return number


def _among(value: object) -> tuple[str, ...] | None:
    """The participants a result request names, checked (None: any merge the server records)."""
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or not 0 < len(value) <= _MAX_AMONG
        or not all(isinstance(u, str) and 0 < len(u) <= _MAX_UID for u in value)
    ):
        raise CodecError(f"data plane request: 'among' must be a list of 1..{_MAX_AMONG} uids")
    return tuple(sorted(value))


def _sized_manifest(
    header: dict[str, object], body: dict[str, Any], max_total: int, what: str, hashes: Sequence[str]
) -> Manifest:
    """The manifest in ``body``, bounded by ``max_total`` and matching the header's payload size (none
    when the header names a ``file`` holding the model)."""
    manifest = manifest_from_body(body, what=f"data plane {what}", hashes=hashes)
    if manifest.total > max_total:
        raise CodecError(f"data plane {what}: {manifest.total} bytes is over {max_total}")
    payload = 0 if "file" in header else manifest.total
    if payload_size(header) != payload:
        raise CodecError(f"data plane {what}: payload {payload_size(header)} != {payload} bytes")
    return manifest


def _offered(header: dict[str, object], max_total: int, hashes: Sequence[str]) -> Manifest:
    body = header.get("manifest")
    if not isinstance(body, dict):
        raise CodecError("data plane offer: 'manifest' must be a map")
    return _sized_manifest(header, body, max_total, "offer", hashes)


def decode_reply(
    data: bytes, *, max_total: int = MAX_STATE_BYTES, hashes: Sequence[str] = HASHES
) -> tuple[Manifest, str | None]:
    """The manifest of a reply header and the file it names (its payload is ``manifest.total`` bytes,
    or none when it names a file to copy them from); CodecError for an error reply or anything
    malformed. ``hashes``: as ``decode_request``'s."""
    header = decode_header(data)
    op = header["op"]
    if op == "error":
        raise CodecError(f"the peer refused: {str(header.get('message'))[:500]}")
    body = header.get("manifest")
    if op != "state" or not isinstance(body, dict):
        raise CodecError(f"data plane reply: op {op!r}; expected 'state' with a 'manifest' map")
    file = header.get("file")
    manifest = _sized_manifest(header, body, max_total, "reply", hashes)
    return manifest, None if file is None else checked_path(file)


async def _read_header(reader: asyncio.StreamReader) -> bytes:
    prefix = await reader.readexactly(HEADER_PREFIX.size)
    return await reader.readexactly(header_length(prefix))


# ------------------------------------------------------------------------------------------- offers
@dataclass(frozen=True, slots=True)
class Offered:
    """A row a peer pushed for a round it predicted, with the weight it checks in with."""

    digest: bytes
    flat: FlatState
    weight: float | None


class _Named(NamedTuple):
    """What an offer named besides its model."""

    round: int | None
    weight: float | None
    checkin: PushedCheckin | None


class Offers:
    """Models peers pushed to this node ahead of a round (``op: "offer"``), by digest: the newest of
    each sender, for at most ``capacity`` senders. The leader takes a participant's row from here when
    its digest is the one the ledger recorded for that check-in."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._newest: OrderedDict[str, bytes] = OrderedDict()  # sender -> digest of its newest offer
        self._models: dict[bytes, FlatState] = {}
        self._arriving: dict[bytes, asyncio.Future[FlatState | None]] = {}
        self._for: dict[str, _Named] = {}  # sender -> what its newest offer named
        self._changed = asyncio.Event()  # set (and replaced) whenever a push ends

    def arriving(
        self,
        sender: str,
        digest: bytes,
        number: int | None = None,
        weight: float | None = None,
        checkin: PushedCheckin | None = None,
    ) -> None:
        """``sender`` started to push the model ``digest`` (it replaces that sender's previous offer),
        for round ``number`` with ``weight`` and its signed ``checkin`` when it named them."""
        self._drop(sender)
        self._newest[sender] = digest
        self._for[sender] = _Named(number, weight, checkin)
        while len(self._newest) > self.capacity:
            self._drop(next(iter(self._newest)))
        pending = self._arriving.get(digest)
        if pending is None or pending.done():
            self._arriving[digest] = asyncio.get_running_loop().create_future()

    def arrived(self, digest: bytes, flat: FlatState | None) -> None:
        """The push of ``digest`` ended: the checked model, or None when it broke off or was corrupt."""
        pending = self._arriving.pop(digest, None)
        if flat is not None and digest in self._newest.values():
            self._models[digest] = flat
        if pending is not None and not pending.done():
            pending.set_result(flat if digest in self._models else None)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def rows(self, number: int, senders: Sequence[str]) -> dict[str, Offered]:
        """Wait until every one of ``senders`` has pushed its row for round ``number`` (their newest
        offers, arrived whole); fewer when a push for that round broke off. Cancel to give up."""
        while True:
            rows = {uid: got for uid in senders if (got := self._offered(uid, number)) is not None}
            if len(rows) == len(senders) or any(self._broke_off(uid, number) for uid in senders):
                return rows
            await self._changed.wait()

    def coming(self, number: int, senders: Sequence[str]) -> bool:
        """Whether every one of ``senders`` pushed, or is pushing, a row for round ``number``."""
        return all(
            self._named(uid) == number
            and (self._offered(uid, number) is not None or self._newest[uid] in self._arriving)
            for uid in senders
        )

    def checkins(self, number: int, senders: Sequence[str]) -> dict[str, PushedCheckin]:
        """The signed check-ins that those of ``senders`` whose row of round ``number`` is here pushed
        with it (``encode_offer``), by sender."""
        return {
            uid: named.checkin
            for uid in senders
            if (named := self._for.get(uid)) is not None
            and named.checkin is not None
            and self._offered(uid, number) is not None
        }

    def _named(self, sender: str) -> int | None:
        """The round ``sender``'s newest offer is for (None: it named none, or pushed nothing)."""
        named = self._for.get(sender)
        return None if named is None else named.round

    def _broke_off(self, sender: str, number: int) -> bool:
        digest = self._newest.get(sender)
        return self._named(sender) == number and digest not in self._models and digest not in self._arriving

    def _offered(self, sender: str, number: int) -> Offered | None:
        digest = self._newest.get(sender)
        flat = self._models.get(digest) if digest is not None and self._named(sender) == number else None
        return None if digest is None or flat is None else Offered(digest, flat, self._for[sender].weight)

    async def take(self, digest: bytes, timeout: float) -> FlatState | None:
        """The offered model ``digest``: at once when it is here, after up to ``timeout`` seconds when it
        is arriving, else None."""
        flat = self._models.get(digest)
        pending = self._arriving.get(digest)
        if flat is not None or pending is None:
            return flat
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(pending)
        except TimeoutError:
            return None

    def _drop(self, sender: str) -> None:
        old = self._newest.pop(sender, None)
        self._for.pop(sender, None)
        if old is not None and old not in self._newest.values():
            self._models.pop(old, None)


# ------------------------------------------------------------------------------------------- served
class Served:
    """Which peers took each model from this data plane (a serve counts once its last byte is sent),
    for the newest ``capacity`` models; ``wait`` until one of some peers took one."""

    def __init__(self, capacity: int = 16) -> None:
        self.capacity = capacity
        self._takers: OrderedDict[bytes, set[str]] = OrderedDict()
        self._waiters: list[tuple[bytes, frozenset[str], asyncio.Future[None]]] = []

    def add(self, digest: bytes, peer: str) -> None:
        """``peer`` took the model ``digest``."""
        self._takers.setdefault(digest, set()).add(peer)
        self._takers.move_to_end(digest)
        while len(self._takers) > self.capacity:
            self._takers.popitem(last=False)
        for wanted, peers, future in self._waiters:
            if wanted == digest and peer in peers and not future.done():
                future.set_result(None)

    def takers(self, digest: bytes) -> set[str]:
        """The peers that took the model ``digest``."""
        return set(self._takers.get(digest, ()))

    async def wait(self, digest: bytes, peers: set[str], timeout: float) -> bool:
        """Whether one of ``peers`` took the model ``digest`` (already, or within ``timeout`` seconds)."""
        if self.takers(digest) & peers:
            return True
        entry = (digest, frozenset(peers), asyncio.get_running_loop().create_future())
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(timeout):
                await entry[2]
            return True
        except TimeoutError:
            return False
        finally:
            self._waiters.remove(entry)


# ------------------------------------------------------------------------------------------- server
class DataPlaneServer:
    """Serves the models of a ``StateHolder`` to peers (an async context manager)."""

    def __init__(
        self,
        holder: StateHolder,
        host: str,
        *,
        port: int = 0,
        tls: ssl.SSLContext | None = None,
        check: FetchCheck | None = None,
        offers: Offers | None = None,
        served: Served | None = None,
    ) -> None:
        self.holder = holder
        self.check = check
        self.offers = offers
        self.served = served
        self.host = host
        self.port = port
        self.tls = tls
        self.hashes = accepted_hashes(signed=tls is not None)  # TLS here is the swarm's certificates
        self._server: asyncio.Server | None = None
        self._handlers: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    async def __aenter__(self) -> DataPlaneServer:
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, ssl=self.tls, limit=_STREAM_LIMIT
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            for task, writer in list(self._handlers.items()):
                writer.transport.abort()
                task.cancel()  # one may be waiting for a merge, not reading
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()

    def endpoint(self, advertised: str) -> Endpoint:
        """This server as peers reach it at ``advertised`` (an address of this host)."""
        return Endpoint(advertised, self.port, self.tls is not None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # noqa: S101 - a handler runs in a task
        self._handlers[task] = writer
        peer = writer.get_extra_info("peername")
        try:
            while True:
                async with asyncio.timeout(_REQUEST_TIMEOUT):
                    data = await _read_header(reader)
                await self._answer(data, reader, writer)
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError, ssl.SSLError):
            pass  # the peer closed, went quiet or broke the connection: nothing to answer
        except asyncio.CancelledError:
            # The server closes. Ending normally keeps asyncio's stream callback (3.11) from logging the
            # cancelled handler as an error; nothing waits on this task but __aexit__.
            pass
        except CodecError as exc:
            log.warning("data plane: dropped a bad request from %s: %s", peer, exc)
        except OSError as exc:
            log.warning("data plane: connection from %s failed: %s", peer, exc)
        finally:
            self._handlers.pop(task, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, data: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = decode_request(data, hashes=self.hashes)
            if request.offer is not None and self.offers is None:
                raise CodecError("this node takes no offers")
        except CodecError as exc:
            await _refuse(writer, str(exc))
            raise
        if request.offer is not None:
            await self._take_offer(request, request.offer, reader, writer)
            return
        digest = request.digest
        if digest is None and request.contract is not None and request.round is not None:
            digest = await self.holder.result(request.contract, request.round, RESULT_WAIT, request.among)
        if digest is None:
            await _refuse(writer, f"no merged model of round {request.round} here after {RESULT_WAIT:g} s")
            return
        held = self.holder.held(digest)
        if held is None:
            await _refuse(writer, f"this node does not hold model {digest_hex(digest)}")
            return
        if request.digest is not None and self.check is not None:
            refusal = await self.check(digest, request.sender, _peer_identity(writer), request.height)
            if refusal is not None:
                log.warning("data plane: refused a fetch: %s", refusal)
                await _refuse(writer, refusal)
                return
        await _send_model(*held, request.files, reader, writer)
        self.holder.served.setdefault(digest, set()).add(request.sender)
        if self.served is not None:
            self.served.add(digest, request.sender)

    async def _take_offer(
        self,
        request: DataRequest,
        manifest: Manifest,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """Receive a pushed model, checking every chunk, and keep it in ``offers``."""
        assert self.offers is not None  # noqa: S101 - checked by _answer
        self.offers.arriving(
            request.sender, manifest.digest, request.offer_round, request.offer_weight, request.offer_checkin
        )
        flat = None
        try:
            buffer = MODEL_BUFFERS.take(manifest.total)
            file = request.offer_file
            copied = file is not None and _from_this_host(writer) and await _copy_file(file, manifest, buffer)
            if not copied:
                if file is not None:  # the bytes, please
                    writer.write(encode_frame_head({"op": "send"}))
                    await writer.drain()
                await receive_verified(reader, writer, buffer, manifest, _REQUEST_TIMEOUT)
            flat = FlatState(manifest.tensors, buffer)
        finally:
            self.offers.arrived(manifest.digest, flat)
        writer.write(encode_frame_head({"op": "taken"}))
        await writer.drain()


async def _send_model(
    flat: FlatState,
    manifest: Manifest,
    files: bool,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    """Answer a request for a model: its manifest and bytes, or its manifest and the file it is in when
    the peer asked for ``files``; that peer then copies it and says so, or asks for the bytes."""
    head = {"op": "state", "manifest": manifest.body()}
    file = _file_for(files, flat, writer)
    if file is None:
        writer.write(encode_frame_head(head, nbytes=manifest.total))
        await _send_payload(writer, flat, None)
        return
    writer.write(encode_frame_head({**head, "file": file}))
    await writer.drain()
    async with asyncio.timeout(_REQUEST_TIMEOUT):
        answer = decode_header(await _read_header(reader))["op"]
    if answer not in ("copied", "send"):
        raise CodecError(f"data plane: op {answer!r} after a file was named; expected 'copied' or 'send'")
    if answer == "send":
        await _send_payload(writer, flat, None)


def _from_this_host(writer: asyncio.StreamWriter) -> bool:
    """Whether the connection comes from an address of this host (a peer whose files we may copy)."""
    peer = writer.get_extra_info("peername")
    host = peer[0] if isinstance(peer, tuple) and peer else None
    return isinstance(host, str) and peer_files.local_host(host)


def _file_for(asked: bool, flat: FlatState, writer: asyncio.StreamWriter) -> str | None:
    """The file of ours a peer that ``asked`` may copy ``flat`` from: it must be of this host, and the
    model in one of our pool's files; else None (the bytes go through the socket)."""
    if not asked or not peer_files.enabled() or not _from_this_host(writer):
        return None
    path = MODEL_BUFFERS.file_of(flat.buffer)
    return None if path is None else str(path)


_said: set[str] = set()  # what _copy_file logged already: one line per process, not one per transfer


async def _copy_file(path: str, manifest: Manifest, into: np.ndarray) -> bool:
    """Whether the model was copied from a peer's file ``path`` into ``into`` and checked against
    ``manifest`` (CodecError when it does not match); False when the file is not one we open. The first
    of each is said once."""
    try:
        await off_loop_if_large(manifest.total, partial(PEER_FILES.copy_verified, path, manifest, into))
    except FileRefused as exc:
        if "refused" not in _said:
            _said.add("refused")
            log.warning("data plane: %s; models from peers of this host come through the socket", exc)
        return False
    if "copied" not in _said:
        _said.add("copied")
        log.info("data plane: models from SLs on this host are copied out of their files, not sent")
    return True


async def _send_payload(writer: asyncio.StreamWriter, flat: FlatState, idle: float | None) -> None:
    """Write the model's bytes, with no pause longer than ``idle`` s (None: no limit)."""
    view = flat.buffer.data.cast("B")
    for start in range(0, flat.total, _SEND_SLICE):
        writer.write(view[start : start + _SEND_SLICE])
        async with asyncio.timeout(idle):
            await writer.drain()


def _peer_identity(writer: asyncio.StreamWriter) -> str | None:
    """The CN of the peer's certificate under mutual TLS; None on a plain connection."""
    cert = writer.get_extra_info("peercert")
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


async def _refuse(writer: asyncio.StreamWriter, message: str) -> None:
    writer.write(encode_frame_head({"op": "error", "message": message}))
    await writer.drain()


# ------------------------------------------------------------------------------------------- client
@dataclass(slots=True)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    lock: asyncio.Lock
    used_at: float  # the loop's time of its last use

    def reusable(self, now: float) -> bool:
        """Whether a next request may go over this connection: open at both ends, and idle for less
        than the server waits (a request sent as it times out would find the connection closed)."""
        if self.writer.is_closing():
            return False
        if self.lock.locked():
            return True  # in use now: the next request waits for its lock
        return not self.reader.at_eof() and now - self.used_at < _REUSE_WITHIN


class DataPlaneClient:
    """Pulls models from peers' data planes, keeping one connection per peer for the next round."""

    def __init__(self, uid: str, *, tls: ssl.SSLContext | None = None, connect_timeout: float = 5.0) -> None:
        self.uid = uid
        self.tls = tls
        self.hashes = accepted_hashes(signed=tls is not None)  # TLS here is the swarm's certificates
        self.connect_timeout = connect_timeout
        self._connections: dict[tuple[Endpoint, str], _Connection] = {}

    async def close(self) -> None:
        """Close every kept connection."""
        connections, self._connections = list(self._connections.values()), {}
        for conn in connections:
            conn.writer.close()
            with contextlib.suppress(Exception):
                await conn.writer.wait_closed()

    async def fetch(
        self,
        endpoint: Endpoint,
        digest: bytes,
        *,
        idle_timeout: float = 10.0,
        max_total: int = MAX_STATE_BYTES,
        spare: np.ndarray | None = None,
        height: int | None = None,
    ) -> tuple[FlatState, Manifest]:
        """The verified model ``digest`` from ``endpoint``; TransferError saying why it failed.
        ``height``: the newest ledger block we saw (the server checks who may fetch at least there)."""
        files = self._files_from(endpoint)
        request = encode_request(digest, self.uid, files=files, height=height)
        waits = (idle_timeout, idle_timeout)
        return await self._fetch(endpoint, request, digest, waits, max_total, spare, files=files)

    async def offer(
        self,
        endpoint: Endpoint,
        flat: FlatState,
        manifest: Manifest,
        *,
        number: int | None = None,
        weight: float | None = None,
        checkin: PushedCheckin | None = None,
        idle_timeout: float = 10.0,
    ) -> None:
        """Push the model ``manifest`` describes to ``endpoint`` (a predicted leader), as our row of round
        ``number`` with ``weight`` and our signed ``checkin`` of it; TransferError when it was not taken."""
        self._check_tls(endpoint)
        conn = await self._connection(endpoint)
        file = MODEL_BUFFERS.file_of(flat.buffer) if self._files_from(endpoint) else None
        path = None if file is None else str(file)
        head = encode_offer(manifest, self.uid, number, weight, file=path, checkin=checkin)
        async with self._holding(
            endpoint, conn, f"offering model {digest_hex(manifest.digest)} to {endpoint}"
        ):
            await _send_offer(conn, head, flat, idle_timeout, in_file=file is not None)

    @staticmethod
    def _files_from(endpoint: Endpoint) -> bool:
        """Whether models to and from ``endpoint`` may be copied through files (a peer of this host)."""
        return peer_files.enabled() and peer_files.local_host(endpoint.host)

    def _check_tls(self, endpoint: Endpoint) -> None:
        if endpoint.tls and self.tls is None:
            raise TransferError(f"{endpoint} needs TLS and this node has no certificate")
        if self.tls is not None and not endpoint.tls:
            raise TransferError(f"{endpoint} does not speak TLS; models travel only over TLS here")

    async def fetch_result(
        self,
        endpoint: Endpoint,
        contract: str,
        number: int,
        *,
        among: tuple[str, ...] | None = None,
        idle_timeout: float = 10.0,
    ) -> tuple[FlatState, Manifest]:
        """The model ``endpoint`` merges for round ``number`` of ``contract``, once it has it, verified
        against its manifest (the caller checks the manifest's digest against the ledger). ``among``:
        the merge of exactly these participants it made before the ledger closed the round."""
        files = self._files_from(endpoint)
        request = encode_result_request(contract, number, self.uid, among, files=files)
        waits = (RESULT_WAIT, idle_timeout)
        return await self._fetch(endpoint, request, None, waits, MAX_STATE_BYTES, None, files=files)

    async def _fetch(
        self,
        endpoint: Endpoint,
        request: bytes,
        digest: bytes | None,
        waits: tuple[float, float],
        max_total: int,
        spare: np.ndarray | None,
        *,
        files: bool,
    ) -> tuple[FlatState, Manifest]:
        what = f"model {digest_hex(digest)}" if digest is not None else "the merged model"
        self._check_tls(endpoint)
        conn = await self._connection(endpoint, _MODELS if digest is not None else _RESULTS)
        async with self._holding(endpoint, conn, f"{what} from {endpoint}"):
            return await self._exchange(conn, request, digest, waits, max_total, spare, files=files)

    async def _connection(self, endpoint: Endpoint, lane: str = _MODELS) -> _Connection:
        """Our kept connection to ``endpoint`` for ``lane``: requests for a merge not made yet wait on
        their own (``_RESULTS``), so that they never hold up the pulls and pushes of ``_MODELS``."""
        key = (endpoint, lane)
        conn = self._connections.get(key)
        now = asyncio.get_running_loop().time()
        if conn is not None and conn.reusable(now):
            return conn
        if conn is not None:
            self._drop(endpoint, conn)
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(
                    endpoint.host,
                    endpoint.port,
                    ssl=self.tls if endpoint.tls else None,
                    server_hostname=endpoint.host if endpoint.tls else None,
                    limit=_STREAM_LIMIT,
                )
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise TransferError(f"cannot connect to the data plane {endpoint}: {exc or 'timeout'}") from None
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = self._connections[key] = _Connection(reader, writer, asyncio.Lock(), now)
        return conn

    @contextlib.asynccontextmanager
    async def _holding(self, endpoint: Endpoint, conn: _Connection, what: str) -> AsyncIterator[None]:
        """Hold ``conn`` for one request and note its use when the request went through. A request that
        failed or was cancelled part way leaves the stream out of step: the connection is dropped, and a
        failure is a TransferError saying ``what`` failed and why."""
        async with conn.lock:
            try:
                yield
            except _TRANSFER_ERRORS as exc:
                self._drop(endpoint, conn)
                why = exc if str(exc) else type(exc).__name__
                raise TransferError(f"{what}: {why}") from None
            except BaseException:
                self._drop(endpoint, conn)
                raise
            conn.used_at = asyncio.get_running_loop().time()

    def _drop(self, endpoint: Endpoint, conn: _Connection) -> None:
        for key in [k for k, c in self._connections.items() if k[0] == endpoint and c is conn]:
            del self._connections[key]
        conn.writer.close()

    async def _exchange(
        self,
        conn: _Connection,
        request: bytes,
        digest: bytes | None,
        waits: tuple[float, float],
        max_total: int,
        spare: np.ndarray | None,
        *,
        files: bool,
    ) -> tuple[FlatState, Manifest]:
        """Send ``request``; read the reply's header within ``waits[0]`` s, then the model, with no
        pause longer than ``waits[1]`` s, or copy it from the file the reply names when the request
        said we can (``files``)."""
        first, idle = waits
        conn.writer.write(request)
        await conn.writer.drain()
        async with asyncio.timeout(first):
            data = await _read_header(conn.reader)
        manifest, file = decode_reply(data, max_total=max_total, hashes=self.hashes)
        if digest is not None and manifest.digest != digest:
            raise CodecError(f"the peer sent model {digest_hex(manifest.digest)}")
        if file is not None and not files:
            raise CodecError("the peer named a file it was not asked for")
        reuse = spare is not None and spare.dtype == np.uint8 and spare.nbytes == manifest.total
        buffer = spare if reuse and spare is not None else MODEL_BUFFERS.take(manifest.total)
        if file is not None:
            copied = await _copy_file(file, manifest, buffer)
            conn.writer.write(encode_frame_head({"op": "copied" if copied else "send"}))
            await conn.writer.drain()
            if copied:
                return FlatState(manifest.tensors, buffer), manifest
        await receive_verified(conn.reader, conn.writer, buffer, manifest, idle)
        return FlatState(manifest.tensors, buffer), manifest


async def _send_offer(conn: _Connection, head: bytes, flat: FlatState, idle: float, *, in_file: bool) -> None:
    """Send an offer (head and model, or the head naming the file the model is in, and the model when
    the peer asks for it) and read its answer, with no pause longer than ``idle`` s."""
    conn.writer.write(head)
    if not in_file:
        await _send_payload(conn.writer, flat, idle)
    header = await _answer_to_offer(conn, idle)
    if in_file and header["op"] == "send":
        await _send_payload(conn.writer, flat, idle)
        header = await _answer_to_offer(conn, idle)
    if header["op"] == "error":
        raise CodecError(f"the peer refused: {str(header.get('message'))[:500]}")
    if header["op"] != "taken":
        raise CodecError(f"data plane answer to an offer: op {header['op']!r}; expected 'taken'")


async def _answer_to_offer(conn: _Connection, idle: float) -> dict[str, Any]:
    await conn.writer.drain()
    async with asyncio.timeout(idle):
        return decode_header(await _read_header(conn.reader))


# ------------------------------------------------------------------------------------------ settings
def enabled() -> bool:
    """``SWARM_DATAPLANE=off`` keeps every model on the broker (the data plane is on by default)."""
    return os.environ.get("SWARM_DATAPLANE", "on").strip().lower() not in ("off", "0", "false", "no")


def advertised_host(broker_host: str) -> str:
    """The address of this host that peers reach: ``SWARM_DATAPLANE_HOST``, else the local address of
    the route to the broker (no packet is sent), else the loopback."""
    given = os.environ.get("SWARM_DATAPLANE_HOST", "").strip()
    if given:
        return given
    family = socket.AF_INET6 if ":" in broker_host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((broker_host, 9))
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"


@contextlib.asynccontextmanager
async def serving(
    holder: StateHolder,
    broker_host: str,
    *,
    tls: ssl.SSLContext | None = None,
    check: FetchCheck | None = None,
    offers: Offers | None = None,
    served: Served | None = None,
) -> AsyncIterator[Endpoint | None]:
    """Run a data plane server for ``holder`` on this host; None when ``SWARM_DATAPLANE=off`` or when it
    cannot listen (then, with a line saying why, every model goes through the broker)."""
    if not enabled():
        yield None
        return
    host = advertised_host(broker_host)
    bind = os.environ.get("SWARM_DATAPLANE_BIND", "").strip() or host
    port_text = os.environ.get("SWARM_DATAPLANE_PORT", "").strip() or "0"
    async with contextlib.AsyncExitStack() as stack:
        endpoint: Endpoint | None = None
        if not (port_text.isdigit() and int(port_text) < 65536):
            log.error("SWARM_DATAPLANE_PORT=%r is not a port number; models go through the broker", port_text)
        else:
            try:
                server = await stack.enter_async_context(
                    DataPlaneServer(
                        holder, bind, port=int(port_text), tls=tls, check=check, offers=offers, served=served
                    )
                )
            except OSError as exc:
                log.error("the data plane cannot listen on %s:%s (%s); models go through the broker",
                          bind, port_text, exc)  # fmt: skip
            else:
                endpoint = server.endpoint(host)
                log.info("data plane serves models at %s", endpoint)
        yield endpoint
