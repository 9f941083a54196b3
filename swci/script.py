"""Run an SWCI script (an swci-init file) line by line, as the reference system does.

Each command line is echoed after the prompt it would have had, then run.
``EXIT`` ends the script; a failing command (a syntax error or a failed result)
ends it with failure while ``EXIT ON FAILURE`` is on, and is reported and
skipped while it is off. Errors name the script and line.
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from swci.output import Format
from swci.runner import run_line
from swci.session import Executor, SessionState
from swci.tokenizer import tokenize

__all__ = ["run_script"]


async def run_script(
    text: str,
    executor: Executor,
    session: SessionState,
    console: Console,
    *,
    source: str = "<script>",
    fmt: Format = "text",
) -> bool:
    """Run a script.

    Args:
        text: the script.
        executor: runs the commands.
        session: the session's state (``EXIT ON FAILURE``, cwd, ...) carries on afterwards.
        console: where echoes, results and errors go.
        source: the script's name, for error locations.
        fmt: ``"text"`` (echoes each command) or ``"json"`` (one object per command).

    Returns:
        False if a failure ended the script under ``EXIT ON FAILURE``, else True.
        ``session.exit_requested`` tells whether the session should end (EXIT or
        that failure).
    """
    for line_no, line in enumerate(text.removeprefix("\ufeff").splitlines(), start=1):
        if not tokenize(line, line=line_no):
            continue
        if fmt == "text":
            console.print(Text(session.prompt + line.strip(), style="bold"), soft_wrap=True)
        outcome = await run_line(line, executor, session, console, fmt=fmt, line_no=line_no, source=source)
        if session.exit_requested:
            return outcome.ok
    return True
