"""Taskrunner commands: run tasks on the SWOPs that listen on a taskrunner."""

from __future__ import annotations

from swci.argtypes import ArgKind, IntType, PeerRefType
from swci.commands import (
    AssignTask,
    CreateTaskrunner,
    GetTaskrunnerInfo,
    GetTaskrunnerPeerStatus,
    GetTaskrunnerStatus,
    ListTaskrunnerPeers,
    ListTaskrunners,
    ResetTaskrunner,
    WaitForTaskrunner,
)
from swci.grammar import args
from swci.pattern import Arg, Choice, Kw, Opt, Seq
from swci.registry import Family, Values, command

__all__: list[str] = []

_FAMILY = Family.TASKRUNNERS
_DEFAULT = "defaulttaskbb.taskdb.sml.hpe"


@command(
    ("CREATE", "TASKRUNNER"),
    family=_FAMILY,
    grammar=(args.taskrunner(),),
    summary="Register a taskrunner",
    help=f"Registers a taskrunner that SWOPs can listen on (the default one is {_DEFAULT}).",
    examples=("CREATE TASKRUNNER site-a-runner",),
)
def _create_taskrunner(values: Values) -> CreateTaskrunner:
    return CreateTaskrunner(values.text("name"))


@command(
    ("ASSIGN", "TASK"),
    family=_FAMILY,
    grammar=(
        args.task("task"),
        Kw("TO"),
        args.taskrunner("runner"),
        Choice(
            Seq(
                Kw("WITH"),
                Arg("peers", ArgKind.NUMBER, "N", "the number of peers", IntType(1)),
                Kw("PEERS"),
            ),
            Seq(Kw("WITH"), Kw("ALL", name="all"), Kw("PEERS")),
            Seq(Kw("TARGET"), Arg("target", ArgKind.NODE, "swop-uid", "the SWOP UID")),
        ),
    ),
    summary="Start a finalized task on a taskrunner's peers",
    help=(
        "Starts a finalized task on the SWOPs listening on a taskrunner. WITH <N> PEERS: for "
        "RUN_SWARM, N learning nodes (the quorum for success), otherwise N SWOPs. "
        "WITH ALL PEERS: every SWOP listening now. TARGET <swop-uid>: one SWOP, which may "
        "join a running taskrunner or retry a failed peer. Fails if the taskrunner is busy; "
        "follow it with WAIT FOR TASKRUNNER."
    ),
    examples=(
        f"ASSIGN TASK swarm_mnist_task TO {_DEFAULT} WITH 2 PEERS",
        f"ASSIGN TASK swarm_mnist_task TO {_DEFAULT} WITH ALL PEERS",
        f"ASSIGN TASK swarm_mnist_task TO {_DEFAULT} TARGET 5f3c9a",
    ),
)
def _assign_task(values: Values) -> AssignTask:
    return AssignTask(
        values.text("task"),
        values.text("runner"),
        peers=values.opt_integer("peers"),
        all_peers=values.has("all"),
        target=values.opt_text("target"),
    )


@command(
    ("GET", "TASKRUNNER", "INFO"),
    family=_FAMILY,
    grammar=(args.taskrunner(),),
    summary="Show the static information of a taskrunner",
    help="Shows the static information of a taskrunner.",
    examples=(f"GET TASKRUNNER INFO {_DEFAULT}",),
)
def _get_taskrunner_info(values: Values) -> GetTaskrunnerInfo:
    return GetTaskrunnerInfo(values.text("name"))


@command(
    ("GET", "TASKRUNNER", "STATUS"),
    family=_FAMILY,
    grammar=(args.taskrunner(),),
    summary="Show what a taskrunner is running and how its peers are doing",
    help=(
        "Shows the task a taskrunner runs, its state (TASK_STATE : RUNNING, COMPLETE, "
        "ERROR, IDLE...), the active, completed and failed peers, and timestamps."
    ),
    examples=(f"GET TASKRUNNER STATUS {_DEFAULT}",),
)
def _get_taskrunner_status(values: Values) -> GetTaskrunnerStatus:
    return GetTaskrunnerStatus(values.text("name"))


@command(
    ("GET", "TASKRUNNER", "PEER", "STATUS"),
    family=_FAMILY,
    grammar=(
        args.taskrunner("runner"),
        Arg("peer", ArgKind.NODE, "index|uid", "the SWOP index or UID", PeerRefType()),
    ),
    summary="Show one SWOP's learning nodes on a taskrunner",
    help=(
        "Shows one SWOP of a taskrunner, by index (0, 1, ...) or UID: its UID, how many "
        "learning nodes it spawned, and each one's UID, status and description."
    ),
    examples=(f"GET TASKRUNNER PEER STATUS {_DEFAULT} 0",),
)
def _get_taskrunner_peer_status(values: Values) -> GetTaskrunnerPeerStatus:
    peer = values.get("peer")
    if not isinstance(peer, int | str):
        raise TypeError("grammar value 'peer' must be int or str")
    return GetTaskrunnerPeerStatus(values.text("runner"), peer)


@command(
    ("LIST", "TASKRUNNERS"),
    family=_FAMILY,
    summary="List the registered taskrunners",
    help="Lists every registered taskrunner.",
    examples=("LIST TASKRUNNERS",),
)
def _list_taskrunners(values: Values) -> ListTaskrunners:
    return ListTaskrunners()


@command(
    ("LIST", "TASKRUNNER", "PEERS"),
    family=_FAMILY,
    grammar=(args.taskrunner(),),
    summary="List the SWOPs enrolled on a taskrunner",
    help="Lists the SWOPs enrolled on a taskrunner.",
    examples=(f"LIST TASKRUNNER PEERS {_DEFAULT}",),
)
def _list_taskrunner_peers(values: Values) -> ListTaskrunnerPeers:
    return ListTaskrunnerPeers(values.text("name"))


@command(
    ("RESET", "TASKRUNNER"),
    family=_FAMILY,
    grammar=(args.taskrunner(),),
    summary="Reset a finished taskrunner and clean up its nodes",
    help=(
        "Resets a taskrunner whose task has finished, so that it can run another, and stops "
        "the learning and ML processes it started (SLEEP a little first to let the ML "
        "programs save their models)."
    ),
    examples=(f"RESET TASKRUNNER {_DEFAULT}",),
)
def _reset_taskrunner(values: Values) -> ResetTaskrunner:
    return ResetTaskrunner(values.text("name"))


@command(
    ("WAIT", "FOR", "TASKRUNNER"),
    family=_FAMILY,
    grammar=(
        args.taskrunner(),
        Opt(args.seconds("timeout", "timeout", "the timeout in seconds")),
    ),
    summary="Wait until a taskrunner's task has finished",
    help=(
        "Waits until the task of a taskrunner completes or fails, showing progress. Without "
        "a timeout it waits up to SWCI_RUN_TASK_MAX_WAIT_TIME (or "
        "SWCI_GENERIC_TASK_MAX_WAIT_TIME) minutes. The timeout argument is an extension of "
        "open Swarm Learning. Ctrl-C stops waiting (the task goes on)."
    ),
    examples=(f"WAIT FOR TASKRUNNER {_DEFAULT}", f"WAIT FOR TASKRUNNER {_DEFAULT} 600"),
)
def _wait_for_taskrunner(values: Values) -> WaitForTaskrunner:
    return WaitForTaskrunner(values.text("name"), values.opt_number("timeout"))
