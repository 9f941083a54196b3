"""The ML program's end of the local socket to its SL (blocking: training code is synchronous; a request
may be sent first and its answer read later, while training goes on)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wire.errors import CodecError
from wire.frames import HEADER_PREFIX, decode_header, encode_frame_head, header_length, payload_size
from wire.shared import SharedBuffer

__all__ = ["CallTimes", "LinkError", "SLLink"]


class LinkError(RuntimeError):
    """The SL could not be reached, went away, or answered with an error."""


@dataclass(slots=True)
class CallTimes:
    """Where one call's time went, in seconds, as the ML program sees it.

    ``send``: writing the request (the SL reads it meanwhile); ``wait``: until the answer's first byte
    (the SL's work: the sync round itself); ``receive``: reading the answer (header and weights).
    """

    send: float = 0.0
    wait: float = 0.0
    receive: float = 0.0


class SLLink:
    """Request/response over a unix socket: ``(header, payload) -> (header, payload)``.

    Weights may go through buffers shared with the SL instead (``daemons.sl.local_server``): ``share``
    says their size; then every answer lends a buffer for the next weights (``lent``: flatten them there
    and send its array as the payload) and may carry its own weights in another. ``on_attach`` sees every
    buffer once, when it is first mapped.
    """

    def __init__(
        self,
        path: str,
        *,
        connect_timeout: float = 60.0,
        on_attach: Callable[[SharedBuffer], None] | None = None,
    ) -> None:
        self.path = path
        self._sock = self._connect(path, connect_timeout)
        self.last = CallTimes()  # the times of the latest call
        self.shared: dict[str, SharedBuffer] = {}  # the weight buffers shared with the SL, by path
        self.lent: SharedBuffer | None = None  # where the next weights go, when the SL lent a buffer
        self.refused: str | None = None  # why the last buffer the SL lent could not be mapped
        self._shared_bytes = 0  # their size; 0: weights go through the socket
        self._on_attach = on_attach
        self._in_flight: tuple[str, float] | None = None  # op, send time

    def share(self, nbytes: int) -> None:
        """Take the weights of ``nbytes`` through shared buffers when the SL offers them (ask it in
        ``hello`` with ``shm_bytes``)."""
        self._shared_bytes = nbytes

    def is_shared(self, array: np.ndarray) -> bool:
        """Whether ``array`` is one of the buffers shared with the SL (ours to write only while lent)."""
        return any(array is shared.array for shared in self.shared.values())

    def _attach(self, path: Any) -> SharedBuffer:
        """The shared buffer at ``path``, checked and mapped once (every answer names one or two of the
        same few); OSError/CodecError when it cannot be. Its name stays: the SL's peers on this host copy
        models from it, and the SL removes it when we go."""
        shared = self.shared.get(path) if isinstance(path, str) else None
        if shared is not None:
            return shared
        if not isinstance(path, str) or not self._shared_bytes:
            raise CodecError(f"the SL named a shared buffer {path!r} that was not asked for")
        if Path(path).parent != Path(self.path).parent:  # the SL makes them beside its socket, nowhere else
            raise CodecError(f"the SL named a shared buffer {path!r} outside its socket's directory")
        shared = SharedBuffer.attach(path, self._shared_bytes)
        self.shared[path] = shared
        if self._on_attach is not None:
            self._on_attach(shared)
        return shared

    @staticmethod
    def _connect(path: str, timeout: float) -> socket.socket:
        deadline = time.monotonic() + timeout
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(path)
                return sock
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                sock.close()
                if time.monotonic() > deadline:
                    raise LinkError(f"cannot reach the SL at {path}: {exc}") from None
                time.sleep(0.1)

    def close(self) -> None:
        """Close the socket."""
        self._sock.close()

    def call(
        self,
        op: str,
        header: dict[str, Any] | None = None,
        payload: np.ndarray | None = None,
        *,
        into: np.ndarray | None = None,
    ) -> tuple[dict[str, Any], np.ndarray | None]:
        """Send one request and wait (as long as it takes: a sync blocks until the round ends).

        ``into``: a uint8 buffer to receive the answer's payload in, when its size matches. A payload
        that is the lent buffer's array is not sent: the SL reads it there; an answer marked ``shm``
        names the shared buffer its weights are in (its array is then the answer's payload, to be read
        before the next request: the SL may use that buffer again after it).
        """
        self.start(op, header, payload)
        return self.finish(into=into)

    def start(self, op: str, header: dict[str, Any] | None = None, payload: np.ndarray | None = None) -> None:
        """Send a request without waiting for its answer (``finish`` reads it); one at a time."""
        if self._in_flight is not None:
            raise LinkError(f"{op!r} sent while the answer to {self._in_flight[0]!r} is still awaited")
        lent = self.lent if self.lent is not None and payload is self.lent.array else None
        body = payload.data.cast("B") if payload is not None and lent is None else memoryview(b"")
        started = time.perf_counter()
        try:
            head = {"op": op, **(header or {}), **({"shm": str(lent.path)} if lent is not None else {})}
            self._sock.sendall(encode_frame_head(head, len(body)))
            if len(body):
                self._sock.sendall(body)
        except OSError as exc:
            raise LinkError(f"lost the SL at {self.path} during {op!r}: {exc}") from None
        if lent is not None:
            self.lent = None  # the SL's until it lends it again
        self._in_flight = (op, time.perf_counter() - started)

    @property
    def awaiting(self) -> str | None:
        """The op of the request whose answer is still to be read, if any."""
        return None if self._in_flight is None else self._in_flight[0]

    def finish(self, *, into: np.ndarray | None = None) -> tuple[dict[str, Any], np.ndarray | None]:
        """Wait for and read the answer to the request ``start`` sent (``into`` as in ``call``)."""
        if self._in_flight is None:
            raise LinkError("no request awaits an answer")
        op, send = self._in_flight
        self._in_flight = None
        waiting = time.perf_counter()
        try:
            prefix = self._recv_exactly(HEADER_PREFIX.size)
            answered = time.perf_counter()
            reply = decode_header(self._recv_exactly(header_length(prefix)))
            data = self._recv_payload(payload_size(reply), into)
            if "shm" in reply:
                data = self._attach(reply["shm"]).array
            self._take_lent(reply.get("shm_next"))
            self.last = CallTimes(send, answered - waiting, time.perf_counter() - answered)
        except (OSError, CodecError) as exc:
            raise LinkError(f"lost the SL at {self.path} during {op!r}: {exc}") from None
        if reply.get("op") == "error":
            raise LinkError(str(reply.get("message", "the SL reported an error")))
        return reply, data

    def _take_lent(self, path: Any) -> None:
        """The buffer an answer lends for the next weights; one that cannot be mapped is noted in
        ``refused`` (the weights then go through the socket)."""
        if path is None:
            return
        try:
            self.lent = self._attach(path)
        except (OSError, CodecError) as exc:
            self.lent, self.refused = None, str(exc)

    def _recv_exactly(self, n: int) -> bytes:
        buf = bytearray(n)
        self._recv_into(memoryview(buf))
        return bytes(buf)

    def _recv_payload(self, n: int, into: np.ndarray | None) -> np.ndarray | None:
        if n == 0:
            return None
        target = into if into is not None and into.nbytes == n and into.dtype == np.uint8 else None
        out = target if target is not None else np.empty(n, dtype=np.uint8)
        self._recv_into(out.data.cast("B"))
        return out

    def _recv_into(self, view: memoryview) -> None:
        got = 0
        while got < len(view):
            n = self._sock.recv_into(view[got:])
            if n == 0:
                raise ConnectionError("the SL closed the connection")
            got += n
