"""The user's ML program as a child of the SL: started with its environment, logged, stopped gently.

Where the SWOP runs a fork server for its ML environment (``SWARM_ML_FORKSERVER`` in the SL's
environment), a one-process program is a fork of that server (``daemons/sl/forked.py``), which imported
torch once for the whole host; the server refuses what a fork cannot give, and the SL then starts the
program itself.

A node asking for several local processes (``nproc``, one per GPU say) runs its program under torchrun
(``python -m torch.distributed.run --standalone``): torchrun starts one rank per process and gives each
``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``; rank 0 talks to the SL and broadcasts to the others.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path, PurePath

from daemons.processes import FORKSERVER_ENV, program_environ, stop_process_group
from daemons.sl.forked import ForkedProgram, ForkRefusedError, start_forked

__all__ = ["FORKED", "MLProcess", "MLSpec", "torchrun_argv"]

log = logging.getLogger("swarm.sl.ml")

OUTPUT_LINE_LIMIT = 1 << 22  # progress bars write long lines
FORKED = "forked from the host's fork server"  # in the line that says a program started so


@dataclass(frozen=True)
class MLSpec:
    """What to run: ``entrypoint command...`` in ``cwd`` with ``env`` added to ours."""

    entrypoint: str
    command: str
    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    nproc: int = 1
    python: str = sys.executable

    def argv(self) -> list[str]:
        """The command line: the reference's Entrypoint + Command, under torchrun when ``nproc`` > 1."""
        command = [*shlex.split(self.entrypoint), *shlex.split(self.command)]
        return torchrun_argv(command, self.nproc, self.python) if self.nproc > 1 else command


def _is_python(program: str) -> bool:
    name = PurePath(program).name
    return name == "python" or (name.startswith("python") and name[6:].replace(".", "").isdigit())


def torchrun_argv(command: list[str], nproc: int, python: str) -> list[str]:
    """``command`` run as ``nproc`` local ranks by torchrun.

    A Python command (``python3 model.py``, ``python -m pkg``) becomes ``python -m torch.distributed.run
    ... model.py`` with that interpreter; any other program runs under torchrun's ``--no-python`` with
    ``python`` (the ML environment's interpreter) running torchrun.
    """
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    if command and _is_python(command[0]):
        rest = [arg for arg in command[1:2] if arg != "-u"] + command[2:]  # output is unbuffered anyway
        if rest and not rest[0].startswith("-"):
            return [command[0], *launch, *rest]
        if len(rest) > 1 and rest[0] == "-m":
            return [command[0], *launch, "-m", *rest[1:]]
    return [python, *launch, "--no-python", *command]


class MLProcess:
    """One run of the ML program; its output goes to its log file and, line by line, to our log."""

    def __init__(self, spec: MLSpec) -> None:
        self.spec = spec
        self.tail: deque[str] = deque(maxlen=40)
        self._proc: asyncio.subprocess.Process | ForkedProgram | None = None

    @property
    def pid(self) -> int | None:
        """PID of the running program."""
        return self._proc.pid if self._proc is not None else None

    async def start(self, extra_env: dict[str, str]) -> None:
        """Start the program (a new process group, so a stop reaches its children too)."""
        env = program_environ(os.environ, self.spec.env, extra_env)
        argv = self.spec.argv()
        server = os.environ.get(FORKSERVER_ENV, "")  # a socket's path; "0" (a SWOP's off switch) is none
        if os.path.isabs(server) and self.spec.nproc == 1 and await self._fork(server, argv, env):
            return
        log.info("starting ML program: %s (in %s)", shlex.join(argv), self.spec.cwd)
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=self.spec.cwd,
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                limit=OUTPUT_LINE_LIMIT,
            )
        except OSError as exc:
            raise RuntimeError(f"cannot start the ML program {shlex.join(argv)}: {exc}") from None

    async def _fork(self, server: str, argv: list[str], env: dict[str, str]) -> bool:
        """Whether the fork server at ``server`` started the program; when not, the log says why."""
        try:
            self._proc = await start_forked(server, argv, self.spec.cwd, env, limit=OUTPUT_LINE_LIMIT)
        except ForkRefusedError as exc:
            log.info("the fork server does not start this program (%s)", exc)
            return False
        except OSError as exc:
            log.warning("no fork server at %s (%s)", server, exc)
            return False
        log.info(
            "starting ML program: %s (in %s), %s as pid %d",
            shlex.join(argv),
            self.spec.cwd,
            FORKED,
            self._proc.pid,
        )
        return True

    async def wait(self) -> int:
        """Copy the program's output until it exits; returns its exit status."""
        proc = self._proc
        assert proc is not None  # noqa: S101 - started first
        assert proc.stdout is not None  # noqa: S101 - PIPE was asked for
        log_file = self.spec.log_path.open("a", buffering=1) if self.spec.log_path else None
        try:
            async for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip()
                self.tail.append(line)
                log.info("ml | %s", line)
                if log_file is not None:
                    log_file.write(line + "\n")
            return await proc.wait()
        finally:
            if log_file is not None:
                log_file.close()

    async def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the program's process group; SIGKILL it after ``grace`` seconds."""
        if self._proc is not None:
            await stop_process_group(self._proc, grace)
