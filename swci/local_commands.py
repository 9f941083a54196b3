"""The commands that need no network: HELP, CD, LS, PWD, SLEEP, EXIT, EXIT ON FAILURE.

:class:`LocalExecutor` runs them; the networked executor delegates these
commands to it (``LocalExecutor.handles(cmd)``). On its own it is a complete
executor for an offline shell: every other command fails with a clear message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from rich.columns import Columns
from rich.text import Text

from swci.argtypes import ArgKind
from swci.commands import Cd, Command, Exit, ExitOnFailure, Help, Ls, Pwd, Sleep
from swci.grammar import REGISTRY
from swci.help import help_data, help_table, not_found_message, render_help
from swci.output import Result
from swci.session import SessionState

__all__ = ["LOCAL_COMMANDS", "LocalExecutor"]

LOCAL_COMMANDS: tuple[type[Command], ...] = (Help, Cd, Ls, Pwd, Sleep, Exit, ExitOnFailure)
"""The command types :class:`LocalExecutor` runs."""


class LocalExecutor:
    """Runs the local commands; fails the others with a message that says why."""

    @staticmethod
    def handles(cmd: Command) -> bool:
        """Whether ``cmd`` is one of :data:`LOCAL_COMMANDS`."""
        return isinstance(cmd, LOCAL_COMMANDS)

    def names(self, kind: ArgKind) -> Sequence[str]:
        """No live names without a network."""
        return ()

    async def execute(self, cmd: Command, session: SessionState) -> Result:
        """Run a local command."""
        if isinstance(cmd, Help):
            return _help(cmd)
        if isinstance(cmd, Cd):
            return _cd(cmd, session)
        if isinstance(cmd, Ls):
            return _ls(cmd, session)
        if isinstance(cmd, Pwd):
            return Result.success(str(session.cwd), data=str(session.cwd))
        if isinstance(cmd, Sleep):
            await asyncio.sleep(cmd.seconds)
            return Result.success()
        if isinstance(cmd, Exit):
            session.exit_requested = True
            return Result.success()
        if isinstance(cmd, ExitOnFailure):
            session.exit_on_failure = cmd.on
            return Result.success(data={"exit_on_failure": cmd.on})
        name = REGISTRY.spec_for(cmd).name
        return Result.failure(f"{name} needs a connection to a Swarm Network node")


def _help(cmd: Help) -> Result:
    data = help_data(cmd.topic)
    renderable = render_help(cmd.topic)
    if cmd.topic and not data["commands"]:
        return Result(False, [not_found_message(cmd.topic)], None, data, renderable)
    return Result(True, [], help_table(cmd.topic), data, renderable)


def _cd(cmd: Cd, session: SessionState) -> Result:
    target = session.resolve_path(cmd.path)
    if not target.exists():
        return Result.failure(f"no such directory: {target}")
    if not target.is_dir():
        return Result.failure(f"not a directory: {target}")
    session.cwd = target
    return Result.success(data=str(target))


def _ls(cmd: Ls, session: SessionState) -> Result:
    target = session.resolve_path(cmd.path) if cmd.path is not None else session.cwd
    try:
        entries = _entries(target)
    except OSError as exc:
        return Result.failure(f"cannot list {target}: {exc.strerror or exc}")
    shown = [Text(name, style="bold blue" if name.endswith("/") else "") for name in entries]
    return Result(True, entries, None, entries, Columns(shown, padding=(0, 2)))


def _entries(target: Path) -> list[str]:
    if not target.exists():
        raise FileNotFoundError(2, "no such file or directory", str(target))
    if not target.is_dir():
        return [target.name]
    children = sorted(target.iterdir(), key=lambda path: path.name.lower())
    return [child.name + ("/" if child.is_dir() else "") for child in children]
