"""SWCI web mode: the reference's REST API in front of the shell's executor.

``POST /exec?cmd=<SWCI command>`` runs one command and answers ``{"CONTENT": [<line>, ...], "RESULT":
{...}}``: ``CONTENT`` holds the lines the shell would print (a failed command gives one entry that
starts with ``ERROR ``, as the reference's ``Swci`` class expects), ``RESULT`` the command's JSON form
(``swci --format json``). ``POST /uploadTaskDef`` (multipart, field ``file``) checks a task definition
and stores it in the session's directory, where ``CREATE TASK FROM <name>`` finds it.

Every command goes through the same executor as the shell, one at a time, in one session (its context,
``CD`` directory and ``EXIT ON FAILURE`` carry over between requests). With certificates the server
speaks mutual TLS and only accepts client certificates of role ``swci`` from the swarm's CA that the
ledger of the session's context has not revoked (see :mod:`swci.web_server`). Bad requests get a 4xx
answer with an ``ERROR`` line, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import tempfile
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from certs import cert_uid_role
from swci.commands import Exit, ListRevokedIdentities
from swci.errors import SwciSyntaxError
from swci.output import Result, Table, to_json
from swci.parser import parse_line
from swci.runner import execute
from swci.session import Executor, SessionState
from taskdefs import TaskDefError, parse_task_definition

__all__ = [
    "MAX_COMMAND_CHARS",
    "MAX_UPLOAD_BYTES",
    "WebShell",
    "build_app",
    "content_lines",
]

log = logging.getLogger("swci.web")

MAX_COMMAND_CHARS = 8192
MAX_UPLOAD_BYTES = 1 << 20
_MAX_EXEC_BODY = 64 << 10
_MAX_DRAIN = 16 << 20  # a refused body up to this size is read, so that its sender sees the answer
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_CLIENT_ROLE = "swci"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def content_lines(result: Result) -> list[str]:
    """The ``CONTENT`` of a result: its messages and table as plain lines; a failure: one ``ERROR`` entry."""
    if not result.ok:
        return [_error(*(result.messages or ["the command failed"]))]
    lines = list(result.messages)
    if result.table is not None:
        lines += _table_lines(result.table)
    return lines or ["OK"]  # the reference's client takes an empty answer for a failure


def _error(*lines: str) -> str:
    return "ERROR " + "\n".join(lines)


def _table_lines(table: Table) -> list[str]:
    """A table as aligned plain-text columns (title, header, rows)."""
    rows = [[("" if cell is None else str(cell)) for cell in row] for row in table.rows]
    header = list(table.columns)
    widths = [max(len(text) for text in column) for column in zip(header, *rows, strict=False)]
    lines = [table.title] if table.title else []
    for row in (header, *rows):
        lines.append("  ".join(text.ljust(width) for text, width in zip(row, widths, strict=False)).rstrip())
    return lines


@dataclass(frozen=True)
class Answer:
    """What one ``/exec`` request returns."""

    ok: bool
    content: list[str]
    result: dict[str, Any]


class WebShell:
    """The one shell session behind the web server; commands run one at a time, as in the shell."""

    def __init__(self, executor: Executor, session: SessionState) -> None:
        self.executor = executor
        self.session = session
        self._lock = asyncio.Lock()

    async def run(self, line: str) -> Answer:
        """Parse and run one command line."""
        try:
            cmd = parse_line(line)
        except SwciSyntaxError as exc:
            result = Result.failure(exc.headline, "  " + exc.excerpt, "  " + exc.caret)
            return _answer(result, line)
        if cmd is None:
            return _answer(Result.failure("no command given"), line)
        if isinstance(cmd, Exit):
            message = "EXIT ends a shell session; the web server keeps running (stop it with SIGTERM)"
            return _answer(Result.failure(message), line)
        async with self._lock:
            result = await execute(self.executor, cmd, self.session, interruptible=False)
            self.session.command_count += 1
            self.session.exit_requested = False  # EXIT ON FAILURE never stops the server
        return _answer(result, line)

    async def revoked(self, identity: str) -> bool:
        """Whether the ledger of the session's context has revoked ``identity`` (False without a context:
        nothing then reaches a ledger)."""
        if self.session.context is None:
            return False
        async with self._lock:
            result = await execute(self.executor, ListRevokedIdentities(), self.session, interruptible=False)
        return result.ok and any(view.get("identity") == identity for view in result.data or [])

    def store_task_definition(self, name: str, data: bytes) -> Path:
        """Check ``data`` as a task definition and write it to ``<cwd>/<name>`` (replacing it atomically).

        Raises:
            ValueError: the name or the definition is not valid (the text says why).
            OSError: it cannot be written.
        """
        if not _FILE_NAME.match(name):
            raise ValueError(
                f"file name {name!r}: use letters, digits, '.', '_' or '-' (no directories), "
                "e.g. my_task.yaml"
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        try:
            parse_task_definition(text, source=name)
        except TaskDefError as exc:
            raise ValueError("\n".join(str(issue) for issue in exc.issues)) from None
        target = self.session.cwd / name
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=self.session.cwd)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            Path(tmp).replace(target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target


def _answer(result: Result, line: str) -> Answer:
    command = line.strip()
    return Answer(result.ok, content_lines(result), json.loads(to_json(result, command)))


def _json(status: int, content: list[str], result: dict[str, Any] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"CONTENT": content}
    if result is not None:
        body["RESULT"] = result
    return JSONResponse(body, status_code=status)


async def _client_problem(request: Request, shell: WebShell, tls: bool) -> str | None:
    """Why the client may not use the server (None when it may): with TLS, only role ``swci``, not revoked."""
    if not tls:
        return None
    chain = request.scope.get("extensions", {}).get("tls", {}).get("client_cert_chain") or []
    if not chain:
        return "this server requires a client certificate of role swci from the swarm's CA"
    cert = x509.load_pem_x509_certificate(chain[0].encode())
    uid, role = cert_uid_role(cert)
    if role != _CLIENT_ROLE:
        return f"the client certificate {uid!r} is of role {role!r}; this server accepts role swci only"
    if uid is not None and await shell.revoked(uid):
        return f"the client certificate {uid!r} is revoked (LIST REVOKED IDENTITIES)"
    return None


def build_app(shell: WebShell, *, tls: bool = False) -> ASGIApp:
    """The ASGI application of the web mode (Starlette), with request size limits."""

    async def exec_command(request: Request) -> Response:
        problem = await _client_problem(request, shell, tls)
        if problem is not None:
            return _json(403, [_error(problem)])
        line = request.query_params.get("cmd")
        if line is None:
            return _json(400, [_error("no command: POST /exec?cmd=<SWCI command>")])
        if len(line) > MAX_COMMAND_CHARS:
            return _json(413, [_error(f"the command is {len(line)} characters, over {MAX_COMMAND_CHARS}")])
        answer = await shell.run(line)
        log.info("web %s %r: %s", request.client.host if request.client else "?", line, answer.ok)
        return _json(200, answer.content, answer.result)

    async def upload_task_definition(request: Request) -> Response:
        problem = await _client_problem(request, shell, tls)
        if problem is not None:
            return _json(403, [_error(problem)])
        async with request.form(max_files=1, max_fields=8, max_part_size=MAX_UPLOAD_BYTES) as form:
            upload = form.get("file")
            if not isinstance(upload, UploadFile) or not upload.filename:
                return _json(400, [_error("expected multipart/form-data with a file in the field 'file'")])
            data = await upload.read(MAX_UPLOAD_BYTES + 1)
        name = Path(upload.filename.replace("\\", "/")).name
        if len(data) > MAX_UPLOAD_BYTES:
            return _json(413, [_error(f"{name}: over the limit of {MAX_UPLOAD_BYTES:,} bytes")])
        try:
            target = await asyncio.to_thread(shell.store_task_definition, name, data)
        except ValueError as exc:
            return _json(422, [_error(f"task definition not stored: {exc}")])
        except OSError as exc:
            return _json(507, [_error(f"cannot store {name} in {shell.session.cwd}: {exc.strerror or exc}")])
        log.info("web: task definition %s stored at %s", name, target)
        return _json(200, [f"Task definition {name} uploaded to {target}"])

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)  # noqa: S101 - registered for HTTPException only
        return _json(exc.status_code, [_error(str(exc.detail))])

    async def too_large(request: Request, exc: Exception) -> Response:
        return _json(413, [_error(str(exc))])

    app = Starlette(
        routes=[
            Route("/exec", exec_command, methods=["POST"]),
            Route("/uploadTaskDef", upload_task_definition, methods=["POST"]),
        ],
        exception_handlers={HTTPException: http_error, RequestTooLarge: too_large},
    )
    return _BodyLimit(app)


class RequestTooLarge(Exception):
    """A request body over the limit of its route."""


class _BodyLimit:
    """Refuses bodies over the route's limit: by Content-Length at once, else while they are read."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    @staticmethod
    def _limit(path: str) -> int:
        return MAX_UPLOAD_BYTES + (64 << 10) if path == "/uploadTaskDef" else _MAX_EXEC_BODY

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self._limit(str(scope.get("path", "")))
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await _drain(receive)
            message = f"the request body ({declared.decode(errors='replace')} bytes) is over {limit:,} bytes"
            await _json(413, [_error(message)])(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message.get("type") == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    if message.get("more_body"):
                        await _drain(receive)
                    raise RequestTooLarge(f"the request body is over {limit:,} bytes")
            return message

        await self.app(scope, limited, send)


async def _drain(receive: Receive, budget: int = _MAX_DRAIN) -> None:
    """Read and drop what is left of a refused body (at most ``budget`` bytes), so that the client
    reads our answer instead of a connection reset."""
    while budget > 0:
        message = await receive()
        if message.get("type") != "http.request":
            return
        budget -= len(message.get("body", b""))
        if not message.get("more_body"):
            return
