"""Run one command line: parse, execute, render, and apply EXIT ON FAILURE.

The REPL, the script runner and ``swci -e`` all go through :func:`run_line`, so
that they report errors the same way and agree on what counts as a failure (a
syntax error, a ``Result`` with ``ok=False``, an exception from the executor).
Ctrl-C while a command runs cancels that command only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from rich.console import Console
from rich.text import Text

from swci.commands import Command
from swci.errors import SwciSyntaxError
from swci.output import Format, Result, render
from swci.parser import parse_line
from swci.session import Executor, SessionState

__all__ = ["Outcome", "execute", "report_syntax_error", "run_line"]

log = logging.getLogger("swci")


@dataclass(frozen=True)
class Outcome:
    """How one line went.

    Attributes:
        ok: False for a syntax error or a failed command.
        command: the parsed command (None for blank lines and syntax errors).
        result: what the executor returned (None if nothing ran).
    """

    ok: bool
    command: Command | None = None
    result: Result | None = None


async def run_line(
    line: str,
    executor: Executor,
    session: SessionState,
    console: Console,
    *,
    fmt: Format = "text",
    line_no: int = 1,
    source: str | None = None,
) -> Outcome:
    """Parse and run one line, print its result, and update the session.

    Args:
        line: the command line.
        executor: runs the parsed command.
        session: the session's state; ``command_count`` and, on failure under
            EXIT ON FAILURE, ``exit_requested`` are updated.
        console: where results and errors go.
        fmt: ``"text"`` or ``"json"``.
        line_no: the line's number in its script, for error locations.
        source: the script's name, for error locations.
    """
    try:
        cmd = parse_line(line, line_no=line_no)
    except SwciSyntaxError as exc:
        report_syntax_error(exc.with_source(source), console, fmt, command=line.strip())
        return _finish(Outcome(ok=False), session, console, fmt)
    if cmd is None:
        return Outcome(ok=True)
    result = await execute(executor, cmd, session)
    render(result, console, fmt, command=line.strip())
    return _finish(Outcome(result.ok, cmd, result), session, console, fmt)


async def execute(
    executor: Executor, cmd: Command, session: SessionState, *, interruptible: bool = True
) -> Result:
    """Run a command; Ctrl-C (when ``interruptible``) and unexpected exceptions become failed results."""
    try:
        if not interruptible:
            return await executor.execute(cmd, session)
        return await _interruptible(lambda: executor.execute(cmd, session))
    except _Interrupted:
        return Result.failure("interrupted")
    except Exception as exc:
        log.exception("executing %r failed", cmd)
        return Result.failure(str(exc) or type(exc).__name__)


def report_syntax_error(
    error: SwciSyntaxError, console: Console, fmt: Format = "text", *, command: str | None = None
) -> None:
    """Print a syntax error: a red headline, the line and a caret (or one JSON object)."""
    if fmt == "json":
        data = {"line": error.line, "column": error.column, "source": error.source}
        render(Result.failure(error.headline, data=data), console, fmt, command=command)
        return
    console.print(Text(error.headline, style="bold red"), soft_wrap=True)
    console.print(Text("  " + error.excerpt), soft_wrap=True)
    console.print(Text("  " + error.caret, style="red"), soft_wrap=True)


def _finish(outcome: Outcome, session: SessionState, console: Console, fmt: Format) -> Outcome:
    session.command_count += 1
    if not outcome.ok and session.exit_on_failure:
        session.exit_requested = True
        if fmt == "text":
            console.print(Text("EXIT ON FAILURE is ON: ending the session", style="red"))
    return outcome


class _Interrupted(Exception):
    """The user pressed Ctrl-C while a command ran."""


async def _interruptible(start: Callable[[], Awaitable[Result]]) -> Result:
    task = asyncio.ensure_future(start())
    interrupted = False

    def interrupt() -> None:
        nonlocal interrupted
        interrupted = True
        task.cancel()

    with _sigint_calls(interrupt):
        try:
            return await task
        except asyncio.CancelledError:
            if interrupted:
                raise _Interrupted from None
            raise


@contextlib.contextmanager
def _sigint_calls(handler: Callable[[], None]) -> Iterator[None]:
    """Route SIGINT to ``handler`` for a while (where the platform allows), then restore."""
    loop = asyncio.get_running_loop()
    previous = signal.getsignal(signal.SIGINT)
    try:
        loop.add_signal_handler(signal.SIGINT, handler)
    except (NotImplementedError, RuntimeError, ValueError):
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
