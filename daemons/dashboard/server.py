"""The dashboard's web app (Starlette) and its server (uvicorn), with TLS and access control.

Without certificates it serves plain HTTP (meant for 127.0.0.1) and lets everyone read. With
certificates it serves HTTPS and every request must show either a client certificate issued by the
swarm's CA (checked in the TLS handshake) or the dashboard's token: ``Authorization: Bearer <token>``,
or ``?token=<token>`` once (the answer sets a cookie, so a browser keeps access).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import ssl
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from uvicorn.protocols.http.h11_impl import H11Protocol

from daemons.bus import BusError, RemoteError
from daemons.dashboard.source import LedgerSource

__all__ = ["Access", "DashboardTLS", "make_app", "serve"]

log = logging.getLogger("swarm.dashboard")
STATIC = Path(__file__).resolve().parent / "static"
TOKEN_COOKIE = "swarm_dashboard_token"  # noqa: S105 - a cookie name
Scope = MutableMapping[str, Any]
ASGI = Callable[[Scope, Any, Any], Awaitable[None]]


@dataclass(frozen=True)
class Access:
    """Who may read: everyone (``open``), or holders of a client certificate or of ``token``."""

    open: bool
    token: str = ""

    def allows(self, request: Request) -> bool:
        """Whether the request shows a client certificate or the token."""
        if self.open:
            return True
        if request.scope.get("extensions", {}).get("tls", {}).get("client_cert_name"):
            return True
        offered = _bearer(request) or request.cookies.get(TOKEN_COOKIE) or request.query_params.get("token")
        return bool(self.token) and bool(offered) and secrets.compare_digest(str(offered), self.token)


def _bearer(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def make_app(source: LedgerSource, access: Access) -> Starlette:
    """The app: the page, its static files and the JSON API, behind ``access``."""

    async def index(request: Request) -> Response:
        if not access.open and request.query_params.get("token") and access.allows(request):
            response: Response = RedirectResponse("/", status_code=303)  # drop the token from the URL
            response.set_cookie(TOKEN_COOKIE, access.token, httponly=True, secure=True, samesite="strict")
            return response
        return FileResponse(STATIC / "index.html")

    async def overview(request: Request) -> Response:
        return await _answer(source.overview())

    async def contract(request: Request) -> Response:
        return await _answer(source.contract(request.path_params["name"]))

    async def history(request: Request) -> Response:
        since = request.query_params.get("since", "-1")
        if not since.lstrip("-").isdigit():
            return _error(400, f"since must be a block height, got {since!r}")
        return await _answer(source.history(request.path_params["name"], int(since)))

    app = Starlette(
        routes=[
            Route("/", index),
            Route("/api/overview", overview),
            Route("/api/contracts/{name}", contract),
            Route("/api/contracts/{name}/history", history),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
    )
    app.add_middleware(_Guard, access=access)
    return app


async def _answer(reading: Awaitable[dict[str, Any]]) -> Response:
    try:
        return JSONResponse(await reading)
    except RemoteError as exc:
        return _error(404 if exc.code == "not-found" else 400, exc.message)
    except BusError as exc:
        return _error(503, f"the SN cannot be reached: {exc}")


class _Guard:
    """Refuses requests that ``access`` does not allow (401, saying what to show)."""

    def __init__(self, app: ASGI, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not self.access.allows(Request(scope)):
            response = _error(
                401, "this dashboard needs a client certificate of the swarm's CA, or its token (?token=...)"
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class _PeerCertProtocol(H11Protocol):
    """uvicorn's h11 protocol that tells the app whose client certificate the TLS handshake verified
    (the ASGI ``tls`` extension's ``client_cert_name``), so a certificate can stand in for the token."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        cert = transport.get_extra_info("peercert") or {}
        subject = ",".join("=".join(pair) for rdn in cert.get("subject", ()) for pair in rdn)
        inner = self.app

        async def app(scope: Scope, receive: Any, send: Any) -> None:
            scope.setdefault("extensions", {})["tls"] = {"client_cert_name": subject or None}
            await inner(scope, receive, send)

        self.app = app


@dataclass(frozen=True)
class DashboardTLS:
    """The server's certificate and key, and the CA whose client certificates are accepted."""

    cert: Path
    key: Path
    ca_file: Path


def server_config(app: Starlette, host: str, port: int, tls: DashboardTLS | None) -> uvicorn.Config:
    """uvicorn's configuration: h11, and with ``tls`` HTTPS that asks for (not requires) a client cert."""
    if tls is None:
        return uvicorn.Config(app, host=host, port=port, http="h11", log_level="warning", lifespan="off")
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=_PeerCertProtocol,
        log_level="warning",
        lifespan="off",
        ssl_certfile=str(tls.cert),
        ssl_keyfile=str(tls.key),
        ssl_ca_certs=str(tls.ca_file),
        ssl_cert_reqs=ssl.CERT_OPTIONAL,
    )


async def serve(config: uvicorn.Config, started: Callable[[], None]) -> None:
    """Run uvicorn until cancelled; ``started`` is called once it listens.

    Raises:
        OSError: it cannot listen (the port is taken, the certificate cannot be loaded).
    """
    server = uvicorn.Server(config)
    try:
        config.load()
        server.lifespan = config.lifespan_class(config)
        await server.startup()
    except (SystemExit, ssl.SSLError) as exc:  # uvicorn exits when it cannot bind
        raise OSError(f"the dashboard cannot serve on {config.host}:{config.port}: {exc}") from None
    started()
    try:
        await server.main_loop()
    finally:
        server.should_exit = True
        await server.shutdown()
