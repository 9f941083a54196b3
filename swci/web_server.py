"""Serving the web mode with uvicorn: plain HTTP on 127.0.0.1, or mutual TLS with the swci's identity.

With an identity (``--cert/--key/--capath``) the server presents the swci certificate, requires a client
certificate from the swarm's CA, and hands the client's certificate to the application as the ASGI TLS
extension (``scope["extensions"]["tls"]["client_cert_chain"]``), which uvicorn does not do by itself.
SIGTERM and SIGINT stop the server gracefully; the caller then closes its executor.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from certs import server_context
from daemons.identity import Identity
from swci.web import ASGIApp, Receive, Scope, Send

__all__ = ["WebOptions", "serve_web"]


@dataclass(frozen=True)
class WebOptions:
    """Where and how to serve.

    Attributes:
        host: the address to listen on; None: 127.0.0.1 without TLS, all interfaces with TLS.
        port: the TCP port (0: a free one).
        identity: the swci's certificate and key, and the swarm CA for client certificates.
    """

    host: str | None
    port: int
    identity: Identity | None

    @property
    def bind_host(self) -> str:
        """The address actually bound."""
        if self.host is not None:
            return self.host
        return "0.0.0.0" if self.identity is not None else "127.0.0.1"


class _TLSClientH11(H11Protocol):
    """uvicorn's h11 protocol that also passes the client's certificate to the application."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        chain = [ssl.DER_cert_to_PEM_cert(der)] if der else []
        inner: ASGIApp = self.app

        async def with_client_cert(scope: Scope, receive: Receive, send: Send) -> None:
            extensions = scope.setdefault("extensions", {})
            extensions["tls"] = {"client_cert_chain": chain}
            await inner(scope, receive, send)

        self.app = with_client_cert


class _Server(uvicorn.Server):
    """A uvicorn server whose signals the caller handles (uvicorn would re-raise them on exit)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


@contextlib.contextmanager
def _stop_on_signals(server: uvicorn.Server) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []

    def stop() -> None:
        server.should_exit = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop)
            installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


async def serve_web(app: ASGIApp, options: WebOptions, *, ready: Callable[[str], None]) -> None:
    """Serve ``app`` until SIGTERM or SIGINT; ``ready`` gets the server's URL once it listens.

    Raises:
        OSError: the address cannot be bound.
        certs.CertError: the identity's files cannot be used for TLS.
    """
    identity = options.identity
    tls_context = None
    if identity is not None:
        tls_context = server_context(identity.cert, identity.key, identity.ca, require_client_cert=True)
    host = options.bind_host
    sock = _bind(host, options.port)
    port = sock.getsockname()[1]
    settings: dict[str, Any] = {}
    if tls_context is not None:
        settings["ssl_context_factory"] = lambda _config, _default: tls_context
    config = uvicorn.Config(
        app,
        http=_TLSClientH11 if tls_context is not None else "h11",
        lifespan="off",
        log_config=None,
        access_log=False,
        server_header=False,
        timeout_keep_alive=30,
        h11_max_incomplete_event_size=32 << 10,
        **settings,
    )
    server = _Server(config)
    scheme = "https" if tls_context is not None else "http"
    shown = f"[{host}]" if ":" in host else host
    with sock, _stop_on_signals(server):
        ready(f"{scheme}://{shown}:{port}")
        await server.serve(sockets=[sock])
