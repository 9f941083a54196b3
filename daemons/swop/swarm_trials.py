"""RUN_TRIALS with ``Mode: SWARM`` on one SWOP: each trial is a whole swarm run of every SWOP's SL nodes.

The swarm is the only slot, so trials run one after the other. The SWOP claims the running trial on the
ledger (the first claim starts the lowest pending one and the ledger creates its training contract;
later claims join it), then starts one SL per node of its profile, as RUN_SWARM does, with the trial's
parameters, ``SWARM_TRIAL_CONTRACT`` and a ``SWARM_TRIAL_RESULT`` file per node in the ML program's
environment. When its SLs have ended it sends ``trial.result`` with each node's metrics; a node that
fails ends this SWOP's part at once (its other SLs are stopped) and the ledger fails the attempt. An
attempt that ended elsewhere (another SWOP's node failed, a SWOP went offline) stops this SWOP's SLs
without a report; the ledger's retry is a new attempt in a fresh contract.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daemons.bus.config import BrokerAddress
from daemons.ledger_client import LedgerClient, Rejected
from daemons.swop.forkservers import ForkServers
from daemons.swop.slpeers import PeerSpec, SLPeer, peer_spec, sl_uid
from daemons.swop.trials import (
    RESULT_FILE,
    Outcome,
    TrialSetup,
    env_text,
    plan_body,
    read_result,
    report_result,
)
from taskdefs import SlNodeDef, SwopProfile

__all__ = ["SwarmTrialRunner", "SwarmTrialSetup"]

log = logging.getLogger("swarm.swop.trials")


@dataclass(frozen=True)
class SwarmTrialSetup:
    """What every SWARM-mode trial of one assignment on this SWOP shares."""

    trials: TrialSetup
    profile: SwopProfile
    nodes: list[SlNodeDef]
    swop_uid: str
    broker: BrokerAddress
    network: str
    sn_uid: str
    forks: ForkServers | None = None  # the SWOP's fork servers, which start the trials' programs


@dataclass(frozen=True)
class _Claim:
    index: int
    attempt: int
    params: dict[str, Any]
    contract: str


_Part = Outcome  # this SWOP's part of a trial: how its SL nodes ended


class SwarmTrialRunner:
    """This SWOP's part of one SWARM-mode RUN_TRIALS assignment."""

    def __init__(self, ledger: LedgerClient, setup: SwarmTrialSetup) -> None:
        self.ledger = ledger
        self.setup = setup
        self.ran = 0
        self._task = setup.trials.task
        self._peers: list[SLPeer] = []
        self._claim: _Claim | None = None
        self._attempt: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stopped = False
        self._abandoned = False

    async def plan(self) -> None:
        """Record the trials on the ledger (every SWOP of the assignment sends the same plan)."""
        await self.ledger.submit("trial.plan", plan_body(self.setup.trials))

    async def run(self) -> dict[str, Any]:
        """Take part in trial after trial until the study has finished; returns its last progress view."""
        async with self.ledger.watch("study", self._task) as watch, asyncio.TaskGroup() as group:
            follower = group.create_task(self._follow(watch), name=f"swop.trials.{self._task}.follow")
            try:
                view = await self._work(group)
            finally:
                follower.cancel()
        return view

    async def _follow(self, watch: Any) -> None:
        while True:
            await watch.next()
            self._wake.set()

    async def _work(self, group: asyncio.TaskGroup) -> dict[str, Any]:
        while True:
            self._wake.clear()
            if self._attempt is not None and self._attempt.done():
                self._attempt, self._claim = None, None
            if self._attempt is None and not self._stopped:
                await self._try_claim(group)
            view = dict(await self.ledger.query("study", name=self._task))
            if self._claim is not None and not _still_running(view, self._claim):
                await self._abandon()
            if self._stopped or (view.get("finished") and self._attempt is None):
                return view
            with contextlib.suppress(TimeoutError):  # an event may be lost while the bus reconnects
                async with asyncio.timeout(30):
                    await self._wake.wait()

    async def _try_claim(self, group: asyncio.TaskGroup) -> None:
        try:
            receipt = await self.ledger.submit("trial.claim", {"task": self._task, "slot": "swarm"})
        except Rejected as exc:
            log.debug("no trial to take part in: %s", exc.reason)
            return
        claim = _Claim(
            int(receipt["trial"]), int(receipt["attempt"]), dict(receipt["params"]), str(receipt["contract"])
        )
        self._claim, self._abandoned = claim, False
        name = f"swop.trial.{self._task}.{claim.index}.{claim.attempt}"
        self._attempt = group.create_task(self._take_part(claim), name=name)

    async def _abandon(self) -> None:
        """The attempt ended elsewhere: stop this SWOP's SLs of it, without a report."""
        if not self._abandoned and self._claim is not None:
            log.info(
                "trial %d (attempt %d) ended elsewhere: stopping its SLs here",
                self._claim.index,
                self._claim.attempt,
            )
        self._abandoned = True
        await self._stop_peers()

    async def _take_part(self, claim: _Claim) -> None:
        try:
            part = await self._run_nodes(claim)
            if not (self._stopped or self._abandoned):
                await self._report(claim, part)
        finally:
            self._peers = []
            self._wake.set()

    async def _run_nodes(self, claim: _Claim) -> _Part:
        setup = self.setup
        run_dir = setup.trials.run_root / f"trial-{claim.index:04d}" / f"attempt-{claim.attempt}"
        servers = {}
        if setup.forks is not None:  # started by the first trial, warm for the next ones
            servers = await setup.forks.for_nodes(
                setup.trials.python, setup.profile, setup.trials.body, setup.nodes
            )
        specs = [
            self._spec(node, slot, claim, run_dir, servers.get(node.idx))
            for slot, node in enumerate(setup.nodes)
        ]
        self._peers = [SLPeer(spec) for spec in specs]
        log.info(
            "trial %d (attempt %d) in contract %s: starting %d SL(s)",
            claim.index,
            claim.attempt,
            claim.contract,
            len(specs),
        )
        self.ran += 1
        async with asyncio.TaskGroup() as group:
            runs = [group.create_task(self._run_peer(p), name=f"swop.sl.{p.spec.uid}") for p in self._peers]
        codes = [run.result() for run in runs]
        failed = [(p, c) for p, c in zip(self._peers, codes, strict=True) if c != 0 and not p.stopped]
        if failed:
            peer, code = failed[0]
            if code is None:
                return _Part("FAILED", None, f"node {peer.spec.uid}: cannot start its SL")
            return _Part("FAILED", code, f"node {peer.spec.uid}: {peer.describe_failure(code)}")
        return await asyncio.to_thread(_collect, specs, self.setup.trials.body.metric)

    def _spec(
        self, node: SlNodeDef, slot: int, claim: _Claim, run_dir: Path, forkserver: str | None
    ) -> PeerSpec:
        setup, trials = self.setup, self.setup.trials
        node_dir = run_dir / sl_uid(node, setup.swop_uid)
        env = {name: env_text(value) for name, value in claim.params.items()}
        env.update(
            SWARM_TRIAL_TASK=trials.task,
            SWARM_TRIAL_INDEX=str(claim.index),
            SWARM_TRIAL_ATTEMPT=str(claim.attempt),
            SWARM_TRIAL_PARAMS=json.dumps(claim.params, sort_keys=True),
            SWARM_TRIAL_CONTRACT=claim.contract,
            SWARM_TRIAL_RESULT=str(node_dir / RESULT_FILE),
        )
        return peer_spec(
            node=node,
            slot=slot,
            profile=setup.profile,
            body=trials.body,
            swop_uid=setup.swop_uid,
            broker=setup.broker,
            network=setup.network,
            sn_uid=setup.sn_uid,
            run_dir=node_dir,
            python=trials.python,
            volumes=trials.volumes,
            ml_env=env,
            forkserver=forkserver,
        )

    async def _run_peer(self, peer: SLPeer) -> int | None:
        """Run one SL; a failure stops this SWOP's other SLs of the attempt (the part has failed)."""
        (peer.spec.run_dir / RESULT_FILE).unlink(missing_ok=True)
        try:
            code: int | None = await peer.run()
        except OSError as exc:
            log.warning("SL %s cannot start: %s", peer.spec.uid, exc)
            code = None
        log.info("SL %s (pid %s) exited with status %s", peer.spec.uid, peer.pid, code)
        if code != 0 and not peer.stopped:
            await self._stop_peers()
        return code

    async def _report(self, claim: _Claim, part: _Part) -> None:
        await report_result(self.ledger, self._task, claim.index, claim.attempt, part, where=" here")

    async def _stop_peers(self) -> None:
        await asyncio.gather(*(p.stop() for p in self._peers if p.running))

    async def stop(self) -> None:
        """Stop the SLs of the running trial (without reporting it) and end ``run``."""
        self._stopped = True
        self._wake.set()
        await self._stop_peers()


def _still_running(view: dict[str, Any], claim: _Claim) -> bool:
    trials = view.get("trials") or []
    if not 0 <= claim.index < len(trials):
        return False
    trial = trials[claim.index]
    return bool(trial.get("status") == "RUNNING" and trial.get("attempts") == claim.attempt)


def _collect(specs: list[PeerSpec], metric: str) -> _Part:
    """This SWOP's part once every SL exited 0: each node's metrics from its result file."""
    if not specs:
        return _Part("FAILED", None, "this SWOP's profile has no SL node to run the trial on")
    nodes: dict[str, dict[str, float]] = {}
    first: dict[str, Any] = {}
    for spec in specs:
        try:
            report = read_result(spec.run_dir / RESULT_FILE)
        except ValueError as exc:
            return _Part("FAILED", 0, f"node {spec.uid}: {exc}")
        if metric not in report["metrics"]:
            reported = ", ".join(report["metrics"]) or "none"
            return _Part("FAILED", 0, f"node {spec.uid} reported no {metric!r} (it reported: {reported})")
        nodes[spec.uid] = report["metrics"]
        first = first or report
    mean = sum(m[metric] for m in nodes.values()) / len(nodes)
    report = {"nodes": nodes, "probabilities": first["probabilities"], "probes": first["probes"]}
    return _Part("COMPLETED", 0, f"{metric}={mean:.6g} over {len(nodes)} node(s) here", report)
