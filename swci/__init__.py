"""swci: the shell of open Swarm Learning, compatible with the reference system's SWCI.

Text goes through :func:`parse_line` / :func:`parse_script` into typed commands
(:mod:`swci.commands`), which an :class:`Executor` runs in a
:class:`SessionState`, returning a :class:`Result` that :func:`render` prints.
:func:`run_repl`, :func:`run_script` and :func:`run_line` are the three ways in.
Tracebacks go to the ``swci`` logger (silent unless the application configures
logging); the user sees one red line.

It may import ``wire``, ``certs``, ``taskdefs`` and, of ``daemons``, only the bus, identities and the
SN client (``daemons.ledger_client``): the shell is a client of the swarm, not an actor in it.
"""

from __future__ import annotations

import logging

from swci.argtypes import ArgKind
from swci.errors import ScriptError, SwciSyntaxError
from swci.grammar import REGISTRY
from swci.local_commands import LocalExecutor
from swci.output import Result, Table, render
from swci.parser import parse_line, parse_script
from swci.repl import run_repl
from swci.runner import Outcome, run_line
from swci.script import run_script
from swci.session import Executor, NameSource, SessionState

__all__ = [
    "REGISTRY",
    "ArgKind",
    "Executor",
    "LocalExecutor",
    "NameSource",
    "Outcome",
    "Result",
    "ScriptError",
    "SessionState",
    "SwciSyntaxError",
    "Table",
    "parse_line",
    "parse_script",
    "render",
    "run_line",
    "run_repl",
    "run_script",
]

logging.getLogger("swci").addHandler(logging.NullHandler())
