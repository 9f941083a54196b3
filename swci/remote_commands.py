"""The commands that talk to the SN: each maps to one ledger transaction or query.

=================================  ==========================================================
command                            ledger
=================================  ==========================================================
CREATE / RESET CONTRACT            ``contract.create`` / ``contract.reset``
LIST CONTRACTS, GET CONTRACT ...   queries ``contracts``, ``contract.info``, ``contract.status``
PERFDATA                           query ``contract.perfdata``
CREATE TASK FROM <file>            validated with ``taskdefs``, then ``task.create`` with body
CREATE TASK <type> ...             ``task.create`` without body
APPEND TASK BODY / FINALIZE TASK   ``task.append`` / ``task.finalize``
DELETE TASK                        ``task.delete``
GET TASK INFO / BODY, LIST TASKS   queries ``task.info``, ``task.body``, ``tasks``
CREATE / RESET TASKRUNNER          ``taskrunner.create`` / ``taskrunner.reset``
ASSIGN TASK                        ``taskrunner.assign`` (peers: int or "ALL", or a target)
GET TASKRUNNER INFO / STATUS       queries ``taskrunner.info``, ``taskrunner.status``
GET TASKRUNNER PEER STATUS         query ``taskrunner.peer_status``
LIST TASKRUNNERS / ... PEERS       queries ``taskrunners``, ``taskrunner.peers``
LIST NODES                         query ``nodes`` (online ones)
REVOKE IDENTITY                    ``identity.revoke``
LIST REVOKED IDENTITIES            query ``identities.revoked``
GET CONTEXT VERSION                the SN's ``status``
=================================  ==========================================================

Handlers raise the bus's errors (``Rejected`` with the ledger's reason, ``RemoteError`` for a
missing entity); :class:`swci.executor.SwciExecutor` turns them into failed results. WAIT FOR
TASKRUNNER and the training views are in :mod:`swci.training_commands`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from rich.console import Console

from daemons.bus import RemoteError
from daemons.ledger_client import Rejected
from swci.about import swci_version
from swci.commands import (
    AppendTaskBody,
    AssignTask,
    Command,
    CreateContract,
    CreateTask,
    CreateTaskFrom,
    CreateTaskrunner,
    DeleteTask,
    FinalizeTask,
    GetContextVersion,
    GetContractInfo,
    GetContractStatus,
    GetTaskBody,
    GetTaskInfo,
    GetTaskrunnerInfo,
    GetTaskrunnerPeerStatus,
    GetTaskrunnerStatus,
    ListContracts,
    ListNodes,
    ListRevokedIdentities,
    ListTaskrunnerPeers,
    ListTaskrunners,
    ListTasks,
    Perfdata,
    ResetContract,
    ResetTaskrunner,
    RevokeIdentity,
)
from swci.connection import LedgerLink
from swci.output import Result
from swci.session import SessionState
from swci.tables import (
    contract_status_table,
    contracts_table,
    fmt_time,
    kv_table,
    node_lines,
    peer_status_table,
    perfdata_table,
    taskrunner_peers_table,
    taskrunner_status_lines,
    taskrunner_status_table,
    taskrunners_table,
    tasks_table,
    view_table,
)
from swci.task_files import create_task_from
from swci.waiting import Settings

__all__ = ["HANDLERS", "Call", "Handler"]


@dataclass(frozen=True)
class Call:
    """What a remote command runs with.

    Attributes:
        link: the open connection to the SN.
        session: the shell session (cwd for relative paths).
        console: where progress displays go.
        progress: whether to show progress (False in JSON mode).
        setting: looks settings up (the context's env vars, then the process environment).
    """

    link: LedgerLink
    session: SessionState
    console: Console
    progress: bool
    setting: Settings


Handler = Callable[[Any, Call], Awaitable[Result]]
HANDLERS: dict[type[Command], Handler] = {}
"""The handler of each remote command type."""

C = TypeVar("C", bound=Command)


def _handles(kind: type[C]) -> Callable[[Callable[[C, Call], Awaitable[Result]]], Handler]:
    def register(handler: Callable[[C, Call], Awaitable[Result]]) -> Handler:
        HANDLERS[kind] = handler
        return handler

    return register


# --- contracts ---------------------------------------------------------------------------------------


@_handles(CreateContract)
async def _create_contract(cmd: CreateContract, call: Call) -> Result:
    return await _create_once(call, "contract", "contracts", cmd.name)


async def _create_once(call: Call, entity: str, listing: str, name: str) -> Result:
    """Create a contract or taskrunner; one that exists already is fine (an init script runs again)."""
    what = entity.capitalize()
    try:
        await call.link.submit(f"{entity}.create", {"name": name})
    except Rejected:
        views = await call.link.query(listing)
        if not any(view.get("name") == name for view in views):
            raise
        return Result.success(f"{what} {name} already exists", data={"name": name, "existing": True})
    return Result.success(f"{what} {name} created", data={"name": name})


@_handles(ResetContract)
async def _reset_contract(cmd: ResetContract, call: Call) -> Result:
    await call.link.submit("contract.reset", {"name": cmd.name})
    return Result.success(f"Contract {cmd.name} reset", data={"name": cmd.name})


@_handles(ListContracts)
async def _list_contracts(cmd: ListContracts, call: Call) -> Result:
    views = await call.link.query("contracts")
    return Result.success(table=contracts_table(views), data=views)


@_handles(GetContractInfo)
async def _contract_info(cmd: GetContractInfo, call: Call) -> Result:
    view = await call.link.query("contract.info", name=cmd.name)
    return Result.success(table=view_table(f"Contract {cmd.name}", view), data=view)


@_handles(GetContractStatus)
async def _contract_status(cmd: GetContractStatus, call: Call) -> Result:
    view = await call.link.query("contract.status", name=cmd.name)
    return Result.success(table=contract_status_table(view), data=view)


@_handles(Perfdata)
async def _perfdata(cmd: Perfdata, call: Call) -> Result:
    views = await call.link.query("contract.perfdata", name=cmd.name)
    return Result.success(table=perfdata_table(cmd.name, views), data=views)


# --- tasks -------------------------------------------------------------------------------------------


@_handles(CreateTaskFrom)
async def _create_task_from(cmd: CreateTaskFrom, call: Call) -> Result:
    return await create_task_from(call.link, call.session.resolve_path(cmd.path))


@_handles(CreateTask)
async def _create_task(cmd: CreateTask, call: Call) -> Result:
    body = {
        "name": cmd.name,
        "type": cmd.task_type,
        "author": cmd.author,
        "prereq": cmd.prereq,
        "outcome": cmd.outcome,
        "body": None,
    }
    await call.link.submit("task.create", body)
    return Result.success(f"Task Registered : {cmd.name}", data={"name": cmd.name})


@_handles(AppendTaskBody)
async def _append_task_body(cmd: AppendTaskBody, call: Call) -> Result:
    await call.link.submit("task.append", {"name": cmd.task, "idx": cmd.index, "line": cmd.line})
    data = {"name": cmd.task, "idx": cmd.index, "line": cmd.line}
    return Result.success(f"Task {cmd.task}: body line {cmd.index} set", data=data)


@_handles(FinalizeTask)
async def _finalize_task(cmd: FinalizeTask, call: Call) -> Result:
    try:
        await call.link.submit("task.finalize", {"name": cmd.name})
    except Rejected:
        if not await _finalized(call, cmd.name):
            raise
        return Result.success(f"Task {cmd.name} already finalized", data={"name": cmd.name, "existing": True})
    return Result.success(f"Task {cmd.name} finalized", data={"name": cmd.name})


async def _finalized(call: Call, name: str) -> bool:
    """Whether the task exists and is finalized (a re-run of an init script finalizes it again)."""
    try:
        info = await call.link.query("task.info", name=name)
    except RemoteError:
        return False
    return bool(info.get("finalized"))


@_handles(DeleteTask)
async def _delete_task(cmd: DeleteTask, call: Call) -> Result:
    await call.link.submit("task.delete", {"name": cmd.name})
    return Result.success(f"Task {cmd.name} deleted", data={"name": cmd.name})


@_handles(GetTaskInfo)
async def _task_info(cmd: GetTaskInfo, call: Call) -> Result:
    view = await call.link.query("task.info", name=cmd.name)
    return Result.success(table=view_table(f"Task {cmd.name}", view), data=view)


@_handles(GetTaskBody)
async def _task_body(cmd: GetTaskBody, call: Call) -> Result:
    view = await call.link.query("task.body", name=cmd.name)
    lines = [str(line) for line in view.get("lines") or []]
    return Result.success(*(lines or [f"task {cmd.name} has an empty body"]), data=view)


@_handles(ListTasks)
async def _list_tasks(cmd: ListTasks, call: Call) -> Result:
    views = await call.link.query("tasks")
    return Result.success(table=tasks_table(views), data=views)


# --- taskrunners -------------------------------------------------------------------------------------


@_handles(CreateTaskrunner)
async def _create_taskrunner(cmd: CreateTaskrunner, call: Call) -> Result:
    return await _create_once(call, "taskrunner", "taskrunners", cmd.name)


@_handles(ResetTaskrunner)
async def _reset_taskrunner(cmd: ResetTaskrunner, call: Call) -> Result:
    await call.link.submit("taskrunner.reset", {"taskrunner": cmd.name})
    return Result.success(f"Taskrunner {cmd.name} reset", data={"name": cmd.name})


def _assignment(cmd: AssignTask) -> tuple[int | str | None, str]:
    if cmd.target is not None:
        return None, f"TARGET {cmd.target}"
    if cmd.all_peers:
        return "ALL", "WITH ALL PEERS"
    return cmd.peers, f"WITH {cmd.peers} PEERS"


@_handles(AssignTask)
async def _assign_task(cmd: AssignTask, call: Call) -> Result:
    peers, how = _assignment(cmd)
    body = {"task": cmd.task, "taskrunner": cmd.runner, "peers": peers, "target": cmd.target}
    await call.link.submit("taskrunner.assign", body)
    view = await call.link.query("taskrunner.status", name=cmd.runner)
    allocation = ", ".join(f"{uid}: {units}" for uid, units in (view.get("allocation") or {}).items())
    message = f"Task {cmd.task} assigned to taskrunner {cmd.runner} {how}"
    return Result.success(message, f"Allocation : {allocation}", data=view)


@_handles(GetTaskrunnerInfo)
async def _taskrunner_info(cmd: GetTaskrunnerInfo, call: Call) -> Result:
    view = await call.link.query("taskrunner.info", name=cmd.name)
    return Result.success(table=view_table(f"Taskrunner {cmd.name}", view), data=view)


@_handles(GetTaskrunnerStatus)
async def _taskrunner_status(cmd: GetTaskrunnerStatus, call: Call) -> Result:
    view = await call.link.query("taskrunner.status", name=cmd.name)
    return Result.success(*taskrunner_status_lines(view), table=taskrunner_status_table(view), data=view)


@_handles(GetTaskrunnerPeerStatus)
async def _peer_status(cmd: GetTaskrunnerPeerStatus, call: Call) -> Result:
    view = await call.link.query("taskrunner.peer_status", name=cmd.runner, swop=cmd.peer)
    lines = [
        f"SWOP UID : {view.get('swop')}",
        f"ONLINE : {'yes' if view.get('online') else 'no'}",
        f"ALLOCATED : {view.get('allocated')}",
        f"SL PEERS : {view.get('sl_peers')}",
    ]
    return Result.success(*lines, table=peer_status_table(view), data=view)


@_handles(ListTaskrunners)
async def _list_taskrunners(cmd: ListTaskrunners, call: Call) -> Result:
    views = await call.link.query("taskrunners")
    return Result.success(table=taskrunners_table(views), data=views)


@_handles(ListTaskrunnerPeers)
async def _taskrunner_peers(cmd: ListTaskrunnerPeers, call: Call) -> Result:
    views = await call.link.query("taskrunner.peers", name=cmd.name)
    return Result.success(table=taskrunner_peers_table(cmd.name, views), data=views)


# --- nodes and the SN ------------------------------------------------------------------------------


@_handles(ListNodes)
async def _list_nodes(cmd: ListNodes, call: Call) -> Result:
    views = await call.link.query("nodes", online=True)
    return Result.success(*node_lines(views), data=views)


@_handles(RevokeIdentity)
async def _revoke_identity(cmd: RevokeIdentity, call: Call) -> Result:
    await call.link.submit("identity.revoke", {"identity": cmd.identity, "reason": cmd.reason})
    return Result.success(f"Identity {cmd.identity} revoked", data={"identity": cmd.identity})


@_handles(ListRevokedIdentities)
async def _list_revoked(cmd: ListRevokedIdentities, call: Call) -> Result:
    views = await call.link.query("identities.revoked")
    lines = [
        f"{v['identity']}: revoked by {v['by']} at {fmt_time(v['time'])} {v['reason']}".rstrip()
        for v in views
    ]
    return Result.success(*(lines or ["no identity is revoked"]), data=views)


@_handles(GetContextVersion)
async def _context_version(cmd: GetContextVersion, call: Call) -> Result:
    status = await call.link.status()
    pairs = [
        ("API SERVER VERSION", status.get("version")),
        ("SN UID", status.get("uid")),
        ("SENTINEL", "yes" if status.get("sentinel") else "no"),
        ("LEDGER HEIGHT", status.get("height")),
        ("BROKER", f"{call.link.endpoint.broker} ({status.get('broker')})"),
        ("SWCI VERSION", swci_version()),
    ]
    data = {**status, "swci_version": swci_version()}
    message = f"API server version : {status.get('version')}"
    return Result.success(message, table=kv_table("Context version", pairs), data=data)
