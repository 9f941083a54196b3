"""``swci``: the command line of the shell.

Three ways in, as in the reference system:

* ``swci -e "LIST TASKS" -e "LIST CONTRACTS"`` runs the commands and exits (0 if all succeeded, else 1);
* a script (``--init-script FILE``, ``--init-script-name NAME`` inside ``--usr-dir``, or piped on stdin)
  runs top to bottom, echoing each command, then the shell stays interactive unless the script ended
  with ``EXIT`` (or a failure under ``EXIT ON FAILURE``, exit status 1) or stdin is not a terminal;
* otherwise the interactive shell, with history and completion.

``swci --web`` (or ``SWCI_MODE=WEB``, as the reference's ``run-swci -e SWCI_MODE=WEB``) serves the
reference's REST API instead of the interactive shell (:mod:`swci.web`), after the init script if any.

Tracebacks go to the log file (``--log-file``), never to the screen.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.text import Text

from certs import CertError
from daemons.identity import Identity, IdentityError, add_identity_arguments, identity_from_args
from swci.about import swci_version
from swci.contexts import ContextError, ContextStore
from swci.executor import SwciExecutor
from swci.output import Format
from swci.paths import history_file, log_file
from swci.repl import run_repl
from swci.runner import run_line
from swci.script import run_script
from swci.session import REFERENCE_USR_DIR, SessionState
from wire.files import read_bounded, read_bounded_stream

__all__ = ["build_parser", "main"]

log = logging.getLogger("swci")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
DEFAULT_WEB_PORT = 30306  # the reference's SWCI_WEB_PORT
_PIPE_WIDTH = 160
_LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


class _UsageError(Exception):
    """A bad option value: reported in one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    """The ``swci`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="swci",
        description="The shell of open Swarm Learning: SWCI commands, interactive, with -e or from a script.",
    )
    parser.add_argument(
        "-e", "--execute", action="append", metavar="COMMAND", help="run a command and exit (repeatable)"
    )
    parser.add_argument("--init-script", type=Path, metavar="FILE", help="run this script first")
    parser.add_argument(
        "--init-script-name",
        default=os.environ.get("SWCI_STARTUP_SCRIPT") or None,
        metavar="NAME",
        help="run the script NAME of --usr-dir first (as the reference's run-swci)",
    )
    parser.add_argument(
        "--usr-dir",
        type=Path,
        metavar="DIR",
        help=f"the user directory: relative paths and {REFERENCE_USR_DIR}",
    )
    parser.add_argument(
        "--format", choices=("text", "json"), default="text", help="output format (default text)"
    )
    parser.add_argument("--network", default="swarm", help="swarm network name (default swarm)")
    parser.add_argument("--context", metavar="NAME", help="start in this context")
    parser.add_argument(
        "--connect-timeout",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="time to reach a broker and find its SN (default 10)",
    )
    parser.add_argument(
        "--log-file", type=Path, default=None, metavar="FILE", help=f"log file (default {log_file()})"
    )
    web = parser.add_argument_group("web mode (the reference's SWCI_MODE=WEB)")
    web.add_argument(
        "--web",
        action="store_true",
        default=os.environ.get("SWCI_MODE", "").strip().upper() == "WEB",
        help="serve the REST API (POST /exec?cmd=..., POST /uploadTaskDef) instead of the shell",
    )
    web.add_argument(
        "--web-port",
        type=_port,
        default=os.environ.get("SWCI_WEB_PORT") or DEFAULT_WEB_PORT,
        metavar="PORT",
        help=f"port of the web mode (default $SWCI_WEB_PORT or {DEFAULT_WEB_PORT})",
    )
    web.add_argument(
        "--web-host",
        metavar="ADDRESS",
        help="address to listen on (default 127.0.0.1; with certificates, all interfaces)",
    )
    parser.add_argument("--version", action="version", version=f"swci (open Swarm Learning) {swci_version()}")
    add_identity_arguments(parser)
    return parser


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def _port(text: object) -> int:
    try:
        value = int(str(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``swci`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    handler = _setup_logging(args.log_file or log_file())
    console = _console(args.format)
    try:
        identity = identity_from_args(args, role="swci")
        return asyncio.run(_session(args, identity, console))
    except (IdentityError, _UsageError, ContextError, CertError) as exc:
        _error(console, f"swci: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        log.exception("swci failed")
        _error(console, f"swci: {str(exc) or type(exc).__name__} (details in {args.log_file or log_file()})")
        return EXIT_FAILED
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()


def _console(fmt: Format) -> Console:
    """stdout; wide when it is a pipe or a file, so that tables do not fold names."""
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(width=_PIPE_WIDTH if wide else None, highlight=fmt == "text", soft_wrap=fmt == "json")


def _error(console: Console, message: str) -> None:
    console.print(Text(message, style="bold red"), soft_wrap=True)


def _setup_logging(path: Path) -> logging.Handler:
    """Log (INFO and up) to ``path`` only; a log that cannot be opened is skipped silently."""
    handler: logging.Handler
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
    except OSError:
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter(_LOG_FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.getLogger("swarm.bus.mqtt").setLevel(logging.WARNING)
    return handler


async def _session(args: argparse.Namespace, identity: Identity | None, console: Console) -> int:
    usr_dir = _usr_dir(args.usr_dir)
    store = ContextStore()
    session = SessionState(cwd=usr_dir or Path.cwd(), usr_dir=usr_dir)
    session.context = store.require(args.context).name if args.context else store.current
    executor = SwciExecutor(
        store=store,
        identity=identity,
        network=args.network,
        console=console,
        progress=args.format == "text" and not args.web,
        connect_timeout=args.connect_timeout,
    )
    async with executor:
        if args.web:
            return await _run_web(args, executor, session, console, identity)
        return await _run(args, executor, session, console)


def _usr_dir(path: Path | None) -> Path | None:
    if path is None:
        return None
    resolved = path.expanduser().resolve()
    if not resolved.is_dir():
        raise _UsageError(f"--usr-dir {path}: not a directory")
    return resolved


async def _run(
    args: argparse.Namespace, executor: SwciExecutor, session: SessionState, console: Console
) -> int:
    fmt: Format = args.format
    interactive = sys.stdin.isatty()
    script = _script(args, session, interactive)
    ok = True
    if script is not None:
        text, source = script
        ok = await run_script(text, executor, session, console, source=source, fmt=fmt)
        if session.exit_requested or not interactive:
            return EXIT_OK if ok else EXIT_FAILED
    if args.execute:
        for line in args.execute:
            outcome = await run_line(line, executor, session, console, fmt=fmt)
            ok = ok and outcome.ok
            if session.exit_requested:
                break
        return EXIT_OK if ok else EXIT_FAILED
    await run_repl(executor, session, history_file=history_file(), console=console, fmt=fmt)
    return EXIT_OK


async def _run_web(
    args: argparse.Namespace,
    executor: SwciExecutor,
    session: SessionState,
    console: Console,
    identity: Identity | None,
) -> int:
    """Run the init script and ``-e`` commands first (EXIT ends only them), then serve the REST API."""
    from swci.web import WebShell, build_app  # noqa: PLC0415 - the shell starts faster without them
    from swci.web_server import WebOptions, serve_web  # noqa: PLC0415

    fmt: Format = args.format
    script = _script(args, session, interactive=True)
    if script is not None:
        text, source = script
        if not await run_script(text, executor, session, console, source=source, fmt=fmt):
            return EXIT_FAILED
    for line in args.execute or ():
        outcome = await run_line(line, executor, session, console, fmt=fmt)
        if not outcome.ok and session.exit_on_failure:
            return EXIT_FAILED
    session.exit_requested = False
    options = WebOptions(args.web_host, args.web_port, identity)
    app = build_app(WebShell(executor, session), tls=identity is not None)
    try:
        await serve_web(app, options, ready=lambda url: console.print(f"SWCI web server listening on {url}"))
    except OSError as exc:
        raise _UsageError(str(exc)) from None
    return EXIT_OK


def _script(args: argparse.Namespace, session: SessionState, interactive: bool) -> tuple[str, str] | None:
    """The script to run first and its name for messages, if any."""
    if args.init_script is not None:
        return _read(args.init_script, str(args.init_script))
    if args.init_script_name:
        base = session.usr_dir or Path.cwd()
        return _read(base / args.init_script_name, args.init_script_name)
    if not args.execute and not interactive:
        return _read_stdin()
    return None


def _read(path: Path, source: str) -> tuple[str, str]:
    try:
        return read_bounded(path).decode("utf-8"), source
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise _UsageError(f"cannot read the script {path}: {reason}") from None


def _read_stdin() -> tuple[str, str]:
    try:
        return read_bounded_stream(sys.stdin.buffer).decode("utf-8"), "<stdin>"
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise _UsageError(f"cannot read the script on standard input: {reason}") from None


if __name__ == "__main__":
    sys.exit(main())
