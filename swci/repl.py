"""The interactive shell: a prompt-toolkit prompt running as a coroutine.

The prompt runs inside ``patch_stdout`` in the same event loop as everything
else, so background output (progress, bus events) prints above the prompt
instead of through it. It completes keywords and live names, highlights the
line, shows syntax errors at the offending token before the command runs, and
keeps a history file. Ctrl-C clears the line (or stops the running command);
Ctrl-D or EXIT leaves.
"""

from __future__ import annotations

from pathlib import Path

from prompt_toolkit import PromptSession
from prompt_toolkit.auto_suggest import AutoSuggestFromHistory
from prompt_toolkit.buffer import ValidationState
from prompt_toolkit.enums import DEFAULT_BUFFER
from prompt_toolkit.filters import has_focus
from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.input import Input
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.output import Output
from prompt_toolkit.patch_stdout import patch_stdout
from rich.console import Console

from swci.completion import SwciCompleter
from swci.highlight import STYLE, SwciLexer
from swci.output import Format
from swci.runner import run_line
from swci.session import Executor, SessionState
from swci.validation import SwciValidator

__all__ = ["build_prompt_session", "run_repl"]


async def run_repl(
    executor: Executor,
    session: SessionState,
    *,
    input: Input | None = None,
    output: Output | None = None,
    history_file: Path | str | None = None,
    console: Console | None = None,
    fmt: Format = "text",
) -> None:
    """Read, run and print commands until EXIT, Ctrl-D or a failure under EXIT ON FAILURE.

    Args:
        executor: runs the commands and supplies live names for completion.
        session: the session's state.
        input: prompt-toolkit input (tests pass ``create_pipe_input()``).
        output: prompt-toolkit output (tests pass ``DummyOutput()``).
        history_file: where to keep the command history; None keeps it in memory.
        console: where results go (default: stdout, through ``patch_stdout``).
        fmt: ``"text"`` or ``"json"``.
    """
    prompt = build_prompt_session(executor, session, input=input, output=output, history_file=history_file)
    console = console or Console()
    with patch_stdout(raw=True):
        while not session.exit_requested:
            line = await _read(prompt)
            if line is None:
                break
            await run_line(line, executor, session, console, fmt=fmt)


async def _read(prompt: PromptSession[str]) -> str | None:
    """The next line; "" after Ctrl-C, None at Ctrl-D."""
    try:
        return await prompt.prompt_async()
    except KeyboardInterrupt:
        return ""
    except EOFError:
        return None


def build_prompt_session(
    executor: Executor,
    session: SessionState,
    *,
    input: Input | None = None,
    output: Output | None = None,
    history_file: Path | str | None = None,
) -> PromptSession[str]:
    """The configured prompt: completion, validation, highlighting, history, key bindings."""

    def message() -> StyleAndTextTuples:
        return [("class:prompt", session.prompt)]

    def rprompt() -> StyleAndTextTuples:
        return [("class:rprompt", session.context or "")]

    return PromptSession(
        message,
        rprompt=rprompt,
        completer=SwciCompleter(executor, lambda: session.cwd),
        complete_while_typing=True,
        validator=SwciValidator(),
        validate_while_typing=True,
        lexer=SwciLexer(),
        style=STYLE,
        history=_history(history_file),
        auto_suggest=AutoSuggestFromHistory(),
        key_bindings=_enter_validates_strictly(),
        input=input,
        output=output,
    )


def _history(history_file: Path | str | None) -> History:
    if history_file is None:
        return InMemoryHistory()
    path = Path(history_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileHistory(str(path))


def _enter_validates_strictly() -> KeyBindings:
    """Enter re-validates strictly: while typing, an unfinished line was not an error."""
    bindings = KeyBindings()

    @bindings.add("enter", filter=has_focus(DEFAULT_BUFFER))
    def _accept(event: KeyPressEvent) -> None:
        buffer = event.current_buffer
        buffer.validation_state = ValidationState.UNKNOWN
        buffer.validate_and_handle()

    return bindings
