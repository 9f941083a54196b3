"""The state of one shell session and the interface every executor implements."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from swci.argtypes import ArgKind
from swci.commands import Command
from swci.output import Result

__all__ = ["REFERENCE_USR_DIR", "Executor", "NameSource", "SessionState"]

REFERENCE_USR_DIR = "/platform/swarm/usr"
"""Where the reference system mounts the user directory; scripts ``cd`` there."""


@dataclass
class SessionState:
    """What the shell remembers between commands.

    Attributes:
        exit_on_failure: set by ``EXIT ON FAILURE``; a failing command then ends the session.
        cwd: the directory relative paths start from (changed by ``CD``).
        usr_dir: the user directory (``--usr-dir``); ``/platform/swarm/usr`` maps to it.
        context: the name of the active context, if any.
        exit_requested: set by ``EXIT`` or by a failure under ``EXIT ON FAILURE``.
        command_count: commands run so far (the ``<n>`` of the ``SWCI:<n> >`` prompt).
    """

    exit_on_failure: bool = False
    cwd: Path = field(default_factory=Path.cwd)
    usr_dir: Path | None = None
    context: str | None = None
    exit_requested: bool = False
    command_count: int = 0

    @property
    def prompt(self) -> str:
        """The prompt of the next command: ``SWCI:<n> >`` and a space."""
        return f"SWCI:{self.command_count} > "

    def resolve_path(self, path: str) -> Path:
        """An absolute path for a path argument.

        ``~`` is expanded, ``/platform/swarm/usr`` stands for :attr:`usr_dir` when
        one is set, and relative paths start from :attr:`cwd`.
        """
        expanded = os.path.expanduser(path)
        if self.usr_dir is not None:
            mapped = _map_usr_dir(expanded, self.usr_dir)
            if mapped is not None:
                return mapped
        return Path(os.path.normpath(self.cwd / expanded))


def _map_usr_dir(path: str, usr_dir: Path) -> Path | None:
    if path == REFERENCE_USR_DIR or path.startswith(REFERENCE_USR_DIR + "/"):
        rest = path[len(REFERENCE_USR_DIR) :].lstrip("/")
        return Path(os.path.normpath(usr_dir / rest))
    return None


class NameSource(Protocol):
    """Live names for completion: contexts, contracts, tasks, taskrunners, node uids."""

    def names(self, kind: ArgKind) -> Sequence[str]:
        """The known names of this kind (empty when unknown); must not block."""
        ...


class Executor(NameSource, Protocol):
    """Runs parsed commands. Implementations report every problem in the Result.

    ``execute`` should not raise for expected failures (an unknown task, an
    unreachable node): it returns ``Result(ok=False, messages=[...])``. Anything it
    does raise is shown as one red line and logged with its traceback.
    """

    async def execute(self, cmd: Command, session: SessionState) -> Result:
        """Run one command in this session."""
        ...
