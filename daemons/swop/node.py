"""The SWOP daemon: enrolls on its profile's taskrunner and runs what is assigned to it.

It watches the taskrunner in the ledger. A new assignment that allocates work to this SWOP starts it:
RUN_SWARM spawns one SL per allocated ``slnodedef``; RUN_TRIALS runs trials on this host's slots
(``daemons/swop/trials.py``) or, with ``Mode: SWARM``, takes part in one whole swarm run per trial with
every SL node of its profile (``daemons/swop/swarm_trials.py``); other task types run here and report
as the SWOP.
Every peer's status goes to the ledger (RUNNING, COMPLETED, FAILED with exit code and last log lines).
Each SL's start, exit and completion is logged at INFO. ``RESET TASKRUNNER`` stops what still runs
(an SL stopped so is logged as stopped, not failed), keeps the SLs' logs in ``<work-dir>/logs/<task>/``
and removes the run directories (unless ``SWOP_KEEP_CONTAINERS``); SIGTERM stops the children gently
and ends the SWOP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daemons.aio import raise_if_cancelling
from daemons.attachment import Attachment
from daemons.bus import Bus, BusError
from daemons.bus.config import BrokerAddress
from daemons.debug import install_task_dump
from daemons.identity import Identity, node_name, open_bus
from daemons.ledger_client import LedgerClient, Patience, Rejected
from daemons.processes import install_stop_signals
from daemons.rundir import remove_run_dir
from daemons.settings import flag_from_env
from daemons.swop.builds import env_python, run_build
from daemons.swop.forkservers import ForkServers, fork_servers_enabled
from daemons.swop.slpeers import SLPeer, peer_spec, sl_uid
from daemons.swop.swarm_trials import SwarmTrialRunner, SwarmTrialSetup
from daemons.swop.trials import TrialRunner, TrialSetup, trial_slots
from taskdefs import RunSwarmBody, RunTrialsBody, SlNodeDef, SwopProfile, TaskDefError, parse_task_body

__all__ = ["SwopNode", "SwopOptions"]

log = logging.getLogger("swarm.swop")


@dataclass
class SwopOptions:
    """How to run one SWOP."""

    uid: str
    profile: SwopProfile
    broker: BrokerAddress
    work_dir: Path
    network: str = "swarm"
    identity: Identity | None = None
    sn_uid: str | None = None
    offline_grace: float = 120.0
    keep: bool = field(default_factory=lambda: flag_from_env("SWOP_KEEP_CONTAINERS"))
    cpu_slots: int = 1


@dataclass(frozen=True)
class _Assignment:
    task: str
    assigned_at: float
    generation: int
    count: int


class SwopNode:
    """One SWOP."""

    def __init__(self, options: SwopOptions) -> None:
        self.options = options
        self.peers: dict[str, SLPeer] = {}
        self.statuses: dict[str, str] = {}
        self.trials: dict[str, TrialRunner | SwarmTrialRunner] = {}
        self._current: tuple[str, float, int] | None = None
        self._stop = asyncio.Event()
        self.ledger: LedgerClient | None = None
        self.forks = ForkServers(enabled=fork_servers_enabled(os.environ))

    @property
    def taskrunner(self) -> str:
        """The taskrunner this SWOP listens on."""
        return self.options.profile.taskrunner

    def stop(self) -> None:
        """Ask the SWOP to stop its children and exit."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop it gently."""
        install_stop_signals(self.stop)
        install_task_dump()

    # -------------------------------------------------------------------- run
    def _bus(self) -> Bus:
        opts = self.options
        presence = {
            "role": "swop",
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "taskrunner": self.taskrunner,
        }
        return open_bus(opts.identity, opts.broker, opts.uid, "swop", network=opts.network, presence=presence)

    async def run(self) -> None:
        """Enroll and run assignments until stopped."""
        async with self._bus() as bus, self.forks:
            patience = Patience.from_env()
            self.ledger = await LedgerClient.connect(
                bus, timeout=patience.deadline, prefer=self.options.sn_uid, patience=patience
            )
            attachment = Attachment(self.ledger, self._registration(bus))
            profile = self.options.profile
            enroll = {
                "taskrunner": self.taskrunner,
                "capacity": len(profile.nodes),
                "group": profile.groupname,
                "grace": self.options.offline_grace,
            }
            attachment.remember("taskrunner.enroll", enroll)
            await attachment.attach(strict=True)
            log.info(
                "SWOP %s listening on taskrunner %s with %d SL slots",
                bus.uid,
                self.taskrunner,
                len(profile.nodes),
            )
            async with asyncio.TaskGroup() as group:
                watcher = group.create_task(self._watch_always(group), name="swop.watch")
                keeper = group.create_task(attachment.run(), name="swop.attachment")
                await self._stop.wait()
                watcher.cancel()
                keeper.cancel()
                await self._stop_all()

    def _registration(self, bus: Bus) -> dict[str, Any]:
        return {
            "role": "swop",
            "parent": None,
            "host": socket.gethostname(),
            "address": "",
            "pid": os.getpid(),
            "meta": {
                "taskrunner": self.taskrunner,
                "group": self.options.profile.groupname,
                "name": node_name(bus.uid),
            },
            "session": bus.session,
        }

    async def _watch_always(self, group: asyncio.TaskGroup) -> None:
        """Watch the taskrunner; an SN or broker outage longer than the client's patience is logged
        and the watch starts again (a SWOP never ends because the SN was away)."""
        while True:
            try:
                await self._watch(group)
            except BusError as exc:
                log.error("lost the taskrunner %s: %s; watching it again", self.taskrunner, exc)
                await asyncio.sleep(1.0)

    async def _watch(self, group: asyncio.TaskGroup) -> None:
        assert self.ledger is not None  # noqa: S101
        async with self.ledger.watch("taskrunner", self.taskrunner) as watch:
            view = await self.ledger.query("taskrunner.status", name=self.taskrunner)
            while True:
                raise_if_cancelling()
                await self._on_status(view, group)
                try:
                    view = (await watch.next(timeout=30)).view
                except TimeoutError:  # an event can be lost while the bus reconnects: read again
                    view = await self.ledger.query("taskrunner.status", name=self.taskrunner)

    async def _on_status(self, view: dict[str, Any] | None, group: asyncio.TaskGroup) -> None:
        if not view:
            return
        state = view.get("state")
        if state == "IDLE" and self._current is not None:
            log.info("taskrunner %s was reset: cleaning up", self.taskrunner)
            self._current = None
            await self._stop_all()
            self._clean_run_dirs()
            return
        if state != "RUNNING":
            return
        uid = self.ledger.bus.uid if self.ledger else ""
        count = int((view.get("allocation") or {}).get(uid, 0))
        key = (str(view.get("task")), float(view.get("assigned_at") or 0), int(view.get("generation") or 0))
        if count <= 0 or key == self._current:
            return
        self._current = key
        assignment = _Assignment(key[0], key[1], key[2], count)
        group.create_task(self._run_assignment(assignment), name=f"swop.task.{key[0]}")

    # ------------------------------------------------------------- the tasks
    async def _run_assignment(self, assignment: _Assignment) -> None:
        assert self.ledger is not None  # noqa: S101
        try:
            info = await self.ledger.query("task.info", name=assignment.task)
            lines = (await self.ledger.query("task.body", name=assignment.task))["lines"]
            body = parse_task_body(info["type"], list(lines))
        except (BusError, TaskDefError, KeyError) as exc:
            await self._report(
                self.ledger.bus.uid, "SWOP", "FAILED", f"cannot read task {assignment.task}: {exc}", 1
            )
            return
        if isinstance(body, RunTrialsBody):  # before RunSwarmBody: it extends it
            await self._run_trials(assignment, info, body)
        elif isinstance(body, RunSwarmBody):
            await self._run_swarm(assignment, info, body)
        else:
            await self._run_build(assignment, info, body)

    async def _run_build(self, assignment: _Assignment, info: dict[str, Any], body: Any) -> None:
        assert self.ledger is not None  # noqa: S101
        me = self.ledger.bus.uid
        await self._report(me, "SWOP", "RUNNING", f"{info['type']} {assignment.task}", None)
        work = self.options.work_dir
        log_path = work / "logs" / f"{assignment.task}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        outcome = str(info.get("outcome") or assignment.task)
        result = await run_build(
            body, outcome=outcome, envs=work / "envs", content=work / "content", log_path=log_path
        )
        status = "COMPLETED" if result.ok else "FAILED"
        log.info("%s %s: %s", assignment.task, status, result.description)
        await self._report(me, "SWOP", status, result.description, 0 if result.ok else 1)

    async def _run_trials(self, assignment: _Assignment, info: dict[str, Any], body: RunTrialsBody) -> None:
        assert self.ledger is not None  # noqa: S101
        me, opts = self.ledger.bus.uid, self.options
        nodes = sorted(opts.profile.node_defs, key=lambda n: n.idx)
        setup = TrialSetup(
            task=assignment.task,
            taskrunner=self.taskrunner,
            body=body,
            node=nodes[0] if nodes else None,
            python=await self._python_for(info),
            run_root=opts.work_dir / "runs" / assignment.task,
            volumes=opts.work_dir / "volumes",
        )
        runner: TrialRunner | SwarmTrialRunner
        if body.mode == "SWARM":
            runner = SwarmTrialRunner(self.ledger, self._swarm_trial_setup(setup, nodes))
            where = f"{len(nodes)} SL node(s) per trial, one trial at a time"
        else:
            slots = trial_slots(opts.cpu_slots)
            runner = TrialRunner(self.ledger, setup, slots)
            where = f"{len(slots)} slot(s)"
        self.trials[assignment.task] = runner
        try:
            await runner.plan()
            await self._report(me, "SWOP", "RUNNING", f"trials of {assignment.task} on {where}", None)
            view = await runner.run()
        except (BusError, Rejected) as exc:
            await self._report(me, "SWOP", "FAILED", f"trials of {assignment.task}: {exc}", 1)
            return
        finally:
            self.trials.pop(assignment.task, None)
        counts = view.get("counts") or {}
        done = f"{runner.ran} trial run(s) here; study: {counts.get('COMPLETED', 0)} completed, "
        await self._report(me, "SWOP", "COMPLETED", done + f"{counts.get('FAILED', 0)} failed", 0)

    def _swarm_trial_setup(self, setup: TrialSetup, nodes: list[SlNodeDef]) -> SwarmTrialSetup:
        assert self.ledger is not None  # noqa: S101
        bus = self.ledger.bus
        return SwarmTrialSetup(
            trials=setup,
            profile=self.options.profile,
            nodes=nodes,
            swop_uid=bus.uid,
            broker=bus.config.broker,
            network=self.options.network,
            sn_uid=self.ledger.sn,
            forks=self.forks,
        )

    async def _python_for(self, info: dict[str, Any]) -> str:
        """The interpreter of the RUN_SWARM task's prerequisite environment, else this one."""
        assert self.ledger is not None  # noqa: S101
        prereq = str(info.get("prereq") or "")
        if prereq and prereq != "ROOTTASK":
            with contextlib.suppress(BusError):
                outcome = (await self.ledger.query("task.info", name=prereq)).get("outcome") or prereq
                python = env_python(self.options.work_dir / "envs", str(outcome))
                if python is not None:
                    return str(python)
                log.warning("no environment built for %s (run its task first); using this Python", prereq)
        return sys.executable

    async def _run_swarm(self, assignment: _Assignment, info: dict[str, Any], body: RunSwarmBody) -> None:
        assert self.ledger is not None  # noqa: S101
        opts = self.options
        python = await self._python_for(info)
        nodes = sorted(opts.profile.node_defs, key=lambda n: n.idx)[: assignment.count]
        bus = self.ledger.bus
        earlier = await self._run_before()
        # Only the SLs this SWOP starts need a fork server: a restarted SWOP whose SLs live on starts none.
        starting = {node.idx for node in nodes if self._starts(sl_uid(node, bus.uid), earlier)}
        forkservers = await self.forks.for_nodes(python, opts.profile, body, nodes, starting=starting)
        async with asyncio.TaskGroup() as group:
            for slot, node in enumerate(nodes):
                if node.idx not in starting:
                    continue
                spec = peer_spec(
                    node=node,
                    slot=slot,
                    profile=opts.profile,
                    body=body,
                    swop_uid=bus.uid,
                    broker=bus.config.broker,
                    network=opts.network,
                    sn_uid=self.ledger.sn,
                    run_dir=opts.work_dir / "runs" / assignment.task / (node.slhostname or f"sl{node.idx}"),
                    python=python,
                    volumes=opts.work_dir / "volumes",
                    forkserver=forkservers.get(node.idx),
                )
                group.create_task(self._run_peer(SLPeer(spec)), name=f"swop.sl.{spec.uid}")

    def _starts(self, uid: str, earlier: dict[str, str]) -> bool:
        """Whether SL ``uid`` is to be started: not while it runs, once it completed, or when it ran
        before this SWOP was restarted (``earlier``, from ``_run_before``)."""
        if uid in self.peers and self.peers[uid].running:
            return False
        if self.statuses.get(uid) == "COMPLETED":
            return False
        if uid in earlier:
            log.info("SL %s %s (this SWOP was restarted): not starting it again", uid, earlier[uid])
            return False
        return True

    async def _run_before(self) -> dict[str, str]:
        """This SWOP's SLs of the assignment that the ledger has ``COMPLETED``, or running with their node
        online: a restarted SWOP leaves them be (SLs outlive their SWOP and report their own end)."""
        assert self.ledger is not None  # noqa: S101
        try:
            view = await self.ledger.query(
                "taskrunner.peer_status", name=self.taskrunner, swop=self.ledger.bus.uid
            )
            found: dict[str, str] = {}
            for peer in view.get("peers") or []:
                if peer["type"] != "SL":
                    continue
                if peer["status"] == "COMPLETED":
                    found[peer["uid"]] = "completed already"
                elif peer["status"] in ("STARTING", "RUNNING"):
                    node = await self.ledger.query("node", uid=peer["uid"])
                    if node.get("online"):
                        found[peer["uid"]] = "still runs"
        except BusError as exc:
            log.warning("cannot read which SLs of this SWOP ran before: %s", exc)
            return {}
        return found

    async def _run_peer(self, peer: SLPeer) -> None:
        uid = peer.spec.uid
        self.peers[uid] = peer
        await self._report(uid, "SL", "RUNNING", f"started in {peer.spec.run_dir}", None)
        log.info("SL %s starting in %s", uid, peer.spec.run_dir)
        try:
            code = await peer.run()
        except OSError as exc:
            log.warning("SL %s cannot start: %s", uid, exc)
            await self._report(uid, "SL", "FAILED", f"cannot start the SL: {exc}", 1)
            return
        log.info("SL %s (pid %s) exited with status %d", uid, peer.pid, code)
        if peer.stopped:
            log.info("SL %s stopped: this SWOP stopped it (RESET TASKRUNNER or shutdown)", uid)
        elif code == 0:
            log.info("SL %s completed: training finished", uid)
            await self._report(uid, "SL", "COMPLETED", "training finished", 0)
        else:
            description = peer.describe_failure(code)
            log.warning("SL %s failed: %s", uid, description)
            await self._report(uid, "SL", "FAILED", description, code)

    async def _report(
        self, peer: str, peer_type: str, status: str, description: str, code: int | None
    ) -> None:
        assert self.ledger is not None  # noqa: S101
        self.statuses[peer] = status
        body = {
            "taskrunner": self.taskrunner,
            "peer": peer,
            "peer_type": peer_type,
            "status": status,
            "description": description[-1500:],
            "exit_code": code,
        }
        try:
            await self.ledger.submit("taskrunner.status", body)
        except (Rejected, BusError) as exc:
            log.warning("could not report %s of %s: %s", status, peer, exc)

    # --------------------------------------------------------------- cleanup
    async def _stop_all(self) -> None:
        await asyncio.gather(*(runner.stop() for runner in list(self.trials.values())))
        running = [p for p in self.peers.values() if p.running]
        if running:
            log.info("stopping %d SL(s)", len(running))
            await asyncio.gather(*(p.stop() for p in running))
        self.statuses.clear()

    def _clean_run_dirs(self) -> None:
        if self.options.keep:
            log.info(
                "SWOP_KEEP_CONTAINERS is set: keeping run directories under %s",
                self.options.work_dir / "runs",
            )
            return
        for peer in self.peers.values():
            self._keep_logs(peer)
            written = remove_run_dir(peer.spec.run_dir)
            if written:
                names = ", ".join(str(p) for p in written[:10]) + (" ..." if len(written) > 10 else "")
                log.warning(
                    "RESET removed %d file(s) that %s's program wrote outside its mounts (as a container "
                    "removed with them would): %s; set SWOP_KEEP_CONTAINERS=True to keep them",
                    len(written),
                    peer.spec.uid,
                    names,
                )
        self.peers.clear()

    def _keep_logs(self, peer: SLPeer) -> None:
        """Copy the SL's and its ML program's logs out of the run directory before it goes."""
        run_dir = peer.spec.run_dir
        kept = self.options.work_dir / "logs" / run_dir.parent.name / peer.spec.uid
        try:
            logs = [
                p
                for p in run_dir.iterdir()
                if p.is_file() and not p.is_symlink() and p.suffix in (".log", ".out")
            ]
            kept.mkdir(parents=True, exist_ok=True)
            for path in logs:
                shutil.copy2(path, kept / path.name)
        except OSError as exc:
            log.warning("could not keep the logs of SL %s from %s: %s", peer.spec.uid, run_dir, exc)
            return
        log.info("logs of SL %s kept in %s", peer.spec.uid, kept)
