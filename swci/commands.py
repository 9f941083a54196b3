"""Typed SWCI commands: what the parser produces and executors consume.

One frozen dataclass per command of the reference system's SWCI language (plus
our extensions, which are marked). Executors never see raw text: names keep the
case they were typed in, numbers are validated ints or floats, optional parts
are None.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AppendTaskBody",
    "AssignTask",
    "Cd",
    "Command",
    "CreateContext",
    "CreateContextService",
    "CreateContract",
    "CreateTask",
    "CreateTaskFrom",
    "CreateTaskrunner",
    "DeleteTask",
    "Exit",
    "ExitOnFailure",
    "FinalizeTask",
    "GetContextEnv",
    "GetContextInfo",
    "GetContextVersion",
    "GetContractInfo",
    "GetContractStatus",
    "GetTaskBody",
    "GetTaskInfo",
    "GetTaskrunnerInfo",
    "GetTaskrunnerPeerStatus",
    "GetTaskrunnerStatus",
    "Help",
    "ListContextEnv",
    "ListContexts",
    "ListContracts",
    "ListNodes",
    "ListRevokedIdentities",
    "ListTaskrunnerPeers",
    "ListTaskrunners",
    "ListTasks",
    "Ls",
    "Perfdata",
    "PerfdataHistory",
    "PlotContract",
    "Pwd",
    "ResetContract",
    "ResetTaskrunner",
    "RevokeIdentity",
    "SetContextEnv",
    "Sleep",
    "SwitchContext",
    "WaitForIp",
    "WaitForService",
    "WaitForTaskrunner",
    "WatchContract",
]


@dataclass(frozen=True)
class Command:
    """Base of every parsed SWCI command."""


# --- contexts ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateContext(Command):
    """``CREATE CONTEXT <name> WITH IP <host> [port]`` (or the pre-2.0 ``<name> <host> [port]``)."""

    name: str
    host: str
    port: int | None = None


@dataclass(frozen=True)
class CreateContextService(Command):
    """``CREATE CONTEXT <name> WITH SERVICE <fqdn[:port]>``."""

    name: str
    service: str


@dataclass(frozen=True)
class SwitchContext(Command):
    """``SWITCH CONTEXT <name>``."""

    name: str


@dataclass(frozen=True)
class GetContextInfo(Command):
    """``GET CONTEXT INFO [name]`` (None: the current context)."""

    name: str | None = None


@dataclass(frozen=True)
class GetContextEnv(Command):
    """``GET CONTEXT ENV <context> <env>``."""

    context: str
    env: str


@dataclass(frozen=True)
class SetContextEnv(Command):
    """``SET CONTEXT ENV <context> <env> <value>``."""

    context: str
    env: str
    value: str


@dataclass(frozen=True)
class ListContextEnv(Command):
    """``LIST CONTEXT ENV <context>``."""

    context: str


@dataclass(frozen=True)
class GetContextVersion(Command):
    """``GET CONTEXT VERSION``."""


@dataclass(frozen=True)
class ListContexts(Command):
    """``LIST CONTEXTS``."""


# --- contracts --------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateContract(Command):
    """``CREATE CONTRACT <name>``."""

    name: str


@dataclass(frozen=True)
class GetContractInfo(Command):
    """``GET CONTRACT INFO <name>``."""

    name: str


@dataclass(frozen=True)
class GetContractStatus(Command):
    """``GET CONTRACT STATUS <name>``."""

    name: str


@dataclass(frozen=True)
class ListContracts(Command):
    """``LIST CONTRACTS``."""


@dataclass(frozen=True)
class Perfdata(Command):
    """``PERFDATA <contract>``."""

    name: str


@dataclass(frozen=True)
class ResetContract(Command):
    """``RESET CONTRACT <name>``."""

    name: str


# --- tasks ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateTask(Command):
    """``CREATE TASK <type> <name> <author> <prereq> <outcome>``."""

    task_type: str
    name: str
    author: str
    prereq: str
    outcome: str


@dataclass(frozen=True)
class CreateTaskFrom(Command):
    """``CREATE TASK FROM <file>`` (a relative path is relative to the session's cwd)."""

    path: str


@dataclass(frozen=True)
class AppendTaskBody(Command):
    """``APPEND TASK BODY <task> <index> <line>``; ``line`` is the raw rest of the line."""

    task: str
    index: int
    line: str


@dataclass(frozen=True)
class DeleteTask(Command):
    """``DELETE TASK <name>``."""

    name: str


@dataclass(frozen=True)
class FinalizeTask(Command):
    """``FINALIZE TASK <name>``."""

    name: str


@dataclass(frozen=True)
class GetTaskBody(Command):
    """``GET TASK BODY <name>``."""

    name: str


@dataclass(frozen=True)
class GetTaskInfo(Command):
    """``GET TASK INFO <name>``."""

    name: str


@dataclass(frozen=True)
class ListTasks(Command):
    """``LIST TASKS``."""


# --- taskrunners ------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateTaskrunner(Command):
    """``CREATE TASKRUNNER <name>``."""

    name: str


@dataclass(frozen=True)
class AssignTask(Command):
    """``ASSIGN TASK <task> TO <runner>`` then one of three forms.

    Exactly one of: ``peers`` (``WITH <N> PEERS``), ``all_peers``
    (``WITH ALL PEERS``), ``target`` (``TARGET <swop-uid>``).
    """

    task: str
    runner: str
    peers: int | None = None
    all_peers: bool = False
    target: str | None = None


@dataclass(frozen=True)
class GetTaskrunnerInfo(Command):
    """``GET TASKRUNNER INFO <name>``."""

    name: str


@dataclass(frozen=True)
class GetTaskrunnerStatus(Command):
    """``GET TASKRUNNER STATUS <name>``."""

    name: str


@dataclass(frozen=True)
class GetTaskrunnerPeerStatus(Command):
    """``GET TASKRUNNER PEER STATUS <runner> <index|uid>``: int index or SWOP uid."""

    runner: str
    peer: int | str


@dataclass(frozen=True)
class ListTaskrunners(Command):
    """``LIST TASKRUNNERS``."""


@dataclass(frozen=True)
class ListTaskrunnerPeers(Command):
    """``LIST TASKRUNNER PEERS <name>``."""

    name: str


@dataclass(frozen=True)
class ResetTaskrunner(Command):
    """``RESET TASKRUNNER <name>``."""

    name: str


@dataclass(frozen=True)
class WaitForTaskrunner(Command):
    """``WAIT FOR TASKRUNNER <name> [timeout]``; the timeout (seconds) is our extension."""

    name: str
    timeout: float | None = None


# --- miscellaneous ----------------------------------------------------------------------


@dataclass(frozen=True)
class Help(Command):
    """``HELP [command words]``; the words are upper-cased, None lists every command."""

    topic: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Cd(Command):
    """``CD <dir>``."""

    path: str


@dataclass(frozen=True)
class Ls(Command):
    """``LS [path]`` (None: the current directory)."""

    path: str | None = None


@dataclass(frozen=True)
class Pwd(Command):
    """``PWD``."""


@dataclass(frozen=True)
class Exit(Command):
    """``EXIT``: leave the shell unconditionally."""


@dataclass(frozen=True)
class ExitOnFailure(Command):
    """``EXIT ON FAILURE [ON|OFF]``; the bare form turns it on."""

    on: bool = True


@dataclass(frozen=True)
class ListNodes(Command):
    """``LIST NODES``."""


@dataclass(frozen=True)
class RevokeIdentity(Command):
    """``REVOKE IDENTITY <identity> [reason]`` (ours)."""

    identity: str
    reason: str = ""


@dataclass(frozen=True)
class ListRevokedIdentities(Command):
    """``LIST REVOKED IDENTITIES`` (ours)."""


@dataclass(frozen=True)
class Sleep(Command):
    """``SLEEP <seconds>``."""

    seconds: float


@dataclass(frozen=True)
class WaitForIp(Command):
    """``WAIT FOR IP <host> [port] [retries]`` (None: the defaults)."""

    host: str
    port: int | None = None
    retries: int | None = None


@dataclass(frozen=True)
class WaitForService(Command):
    """``WAIT FOR SERVICE <fqdn[:port]> [retries]``."""

    service: str
    retries: int | None = None


# --- training views (extensions of open Swarm Learning) ----------------------------------


@dataclass(frozen=True)
class PerfdataHistory(Command):
    """``PERFDATA <contract> HISTORY [TO <file>]``: every progress report and merged round."""

    name: str
    path: str | None = None


@dataclass(frozen=True)
class WatchContract(Command):
    """``WATCH CONTRACT <contract> [timeout]``: the live view until the training is over."""

    name: str
    timeout: float | None = None


@dataclass(frozen=True)
class PlotContract(Command):
    """``PLOT CONTRACT <contract> [TO <dir>]``: PNG training curves."""

    name: str
    path: str | None = None
