"""The REPL (driven through a pipe, no TTY) and the script runner with EXIT ON FAILURE."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from prompt_toolkit.data_structures import Size
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from prompt_toolkit.output.vt100 import Vt100_Output
from rich.console import Console

from swci.argtypes import ArgKind
from swci.commands import Command, ExitOnFailure, ListTasks, Pwd, Sleep
from swci.local_commands import LocalExecutor
from swci.output import Result
from swci.repl import run_repl
from swci.runner import run_line
from swci.script import run_script
from swci.session import SessionState


class Recorder:
    """The LocalExecutor, recording every command it is given."""

    def __init__(self) -> None:
        self.local = LocalExecutor()
        self.seen: list[Command] = []

    def names(self, kind: ArgKind) -> Sequence[str]:
        return ["demo"] if kind is ArgKind.CONTEXT else []

    async def execute(self, cmd: Command, session: SessionState) -> Result:
        self.seen.append(cmd)
        return await self.local.execute(cmd, session)


class Exploding(Recorder):
    """Raises for LIST TASKS, as a buggy executor might."""

    async def execute(self, cmd: Command, session: SessionState) -> Result:
        if isinstance(cmd, ListTasks):
            raise RuntimeError("the bus fell over")
        return await super().execute(cmd, session)


def _console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=100, color_system=None), buffer


Key = str | asyncio.Event


class Screen(io.StringIO):
    """A terminal screen that sets ``seen`` once ``needle`` has been drawn."""

    def __init__(self, needle: str) -> None:
        super().__init__()
        self.needle = needle
        self.seen = asyncio.Event()

    def write(self, text: str) -> int:
        written = super().write(text)
        if self.needle in self.getvalue():
            self.seen.set()
        return written


async def _repl(keys: Sequence[Key], executor: Recorder, session: SessionState, **kwargs: Any) -> str:
    """Run the REPL on typed keys; an event in ``keys`` waits until it is set."""
    console, buffer = _console()
    with create_pipe_input() as pipe:

        async def type_keys() -> None:
            for key in keys:
                if isinstance(key, str):
                    pipe.send_text(key)
                    await asyncio.sleep(0.02)
                    continue
                await key.wait()

        typing = asyncio.create_task(type_keys())
        output = kwargs.pop("output", DummyOutput())
        repl = run_repl(executor, session, input=pipe, output=output, console=console, **kwargs)
        await asyncio.wait_for(repl, timeout=10)
        typing.cancel()
    return buffer.getvalue()


async def test_repl_runs_help_and_pwd_then_exits(tmp_path: Path) -> None:
    executor, session = Recorder(), SessionState(cwd=tmp_path)
    out = await _repl(["help\r", "pwd\r", "help assign task\r", "exit\r"], executor, session)
    assert "SWCI commands" in out
    assert "ASSIGN TASK <task> TO <taskrunner> WITH <N> PEERS" in out
    assert str(tmp_path) in out
    assert session.exit_requested
    assert session.command_count == 4


async def test_repl_blocks_a_syntax_error_at_the_token_and_ctrl_c_clears_it() -> None:
    executor, session = Recorder(), SessionState()
    screen = Screen("expected TO after the task name, got 'into'")
    output = Vt100_Output(screen, lambda: Size(rows=24, columns=100), term="xterm")
    keys: list[Key] = ["assign task t into tr\r", screen.seen, "\x03", "pwd\r", "exit\r"]
    out = await _repl(keys, executor, session, output=output)
    assert executor.seen[0] == Pwd()
    assert len(executor.seen) == 2
    assert "Traceback" not in out


async def test_repl_ctrl_d_exits() -> None:
    executor, session = Recorder(), SessionState()
    await _repl(["pwd\r", "\x04"], executor, session)
    assert executor.seen == [Pwd()]
    assert not session.exit_requested


async def test_repl_exit_on_failure_ends_the_session() -> None:
    executor, session = Recorder(), SessionState()
    out = await _repl(["exit on failure\r", "list tasks\r", "pwd\r"], executor, session)
    assert executor.seen == [ExitOnFailure(on=True), ListTasks()]
    assert "LIST TASKS needs a connection to a Swarm Network node" in out
    assert session.exit_requested


async def test_repl_keeps_a_history_file(tmp_path: Path) -> None:
    history = tmp_path / "state" / "history"
    await _repl(["pwd\r", "exit\r"], Recorder(), SessionState(), history_file=history)
    assert "pwd" in history.read_text()


async def test_repl_json_mode_prints_one_object_per_command() -> None:
    out = await _repl(["pwd\r", "exit\r"], Recorder(), SessionState(), fmt="json")
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["command"] for line in lines] == ["pwd", "exit"]
    assert all(line["ok"] for line in lines)


SCRIPT = """\
# a small init script
EXIT ON FAILURE {state}
pwd
LIST TASKS
pwd
"""


async def test_script_with_exit_on_failure_on_stops_at_the_first_failure() -> None:
    executor, session = Recorder(), SessionState()
    console, buffer = _console()
    ok = await run_script(SCRIPT.format(state="ON"), executor, session, console, source="init")
    assert ok is False
    assert executor.seen == [ExitOnFailure(on=True), Pwd(), ListTasks()]
    assert session.exit_requested
    out = buffer.getvalue()
    assert "SWCI:0 > EXIT ON FAILURE ON" in out
    assert "SWCI:2 > LIST TASKS" in out


async def test_script_with_exit_on_failure_off_goes_on() -> None:
    executor, session = Recorder(), SessionState()
    console, buffer = _console()
    ok = await run_script(SCRIPT.format(state="OFF"), executor, session, console, source="init")
    assert ok is True
    assert executor.seen == [ExitOnFailure(on=False), Pwd(), ListTasks(), Pwd()]
    assert not session.exit_requested
    assert "LIST TASKS needs a connection" in buffer.getvalue()


@pytest.mark.parametrize(("state", "expected_ok", "ran"), [("ON", False, 1), ("OFF", True, 2)])
async def test_script_syntax_errors_name_the_file_and_line(state: str, expected_ok: bool, ran: int) -> None:
    executor, session = Recorder(), SessionState()
    console, buffer = _console()
    script = f"EXIT ON FAILURE {state}\n\nASIGN TASK t TO tr WITH 2 PEERS\nPWD\n"
    ok = await run_script(script, executor, session, console, source="swci-init")
    assert ok is expected_ok
    assert len(executor.seen) == ran
    out = buffer.getvalue()
    assert "swci-init: line 3, col 1: unknown command 'ASIGN'; did you mean ASSIGN TASK?" in out
    assert "  ^^^^^" in out


async def test_script_stops_at_exit() -> None:
    executor, session = Recorder(), SessionState()
    console, _ = _console()
    assert await run_script("PWD\nEXIT\nPWD\n", executor, session, console)
    assert executor.seen[0] == Pwd()
    assert len(executor.seen) == 2
    assert session.exit_requested


async def test_script_json_mode_has_no_echo() -> None:
    console, buffer = _console()
    await run_script("PWD\n# note\nLIST TASKS\n", Recorder(), SessionState(), console, fmt="json")
    objects = [json.loads(line) for line in buffer.getvalue().splitlines()]
    assert [(o["command"], o["ok"]) for o in objects] == [("PWD", True), ("LIST TASKS", False)]


async def test_executor_exceptions_become_one_red_line() -> None:
    session = SessionState(exit_on_failure=True)
    console, buffer = _console()
    outcome = await run_line("list tasks", Exploding(), session, console)
    assert not outcome.ok
    assert buffer.getvalue().splitlines() == [
        "the bus fell over",
        "EXIT ON FAILURE is ON: ending the session",
    ]
    assert session.exit_requested


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT delivery is POSIX-only")
async def test_ctrl_c_interrupts_only_the_running_command() -> None:
    loop = asyncio.get_running_loop()
    session = SessionState()
    console, buffer = _console()
    loop.call_later(0.1, os.kill, os.getpid(), signal.SIGINT)
    started = time.monotonic()
    outcome = await run_line("SLEEP 30", Recorder(), session, console)
    assert time.monotonic() - started < 5
    assert outcome.command == Sleep(30.0)
    assert not outcome.ok
    assert "interrupted" in buffer.getvalue()
