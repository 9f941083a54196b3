"""RUN_TRIALS on one SWOP: claim trials for free slots, run each as a process, report how it ended.

A slot is one GPU of this host (``CUDA_VISIBLE_DEVICES`` set to it) or, on a host without GPUs, one of
``cpu_slots`` CPU slots. While a slot is free and a trial is pending, the SWOP claims one on the ledger
(the ledger hands out each trial once) and runs ``Entrypoint Command`` in a run directory of the trial
(the task's mounts, with the SWOP's first node's private data), with every parameter of the trial as an
environment variable and ``SWARM_TRIAL_RESULT`` naming the file for its metrics. Its exit status and
that file become ``trial.result``; a failed run is queued again by the ledger while retries are left.
The SWOP's part ends when the study has finished (or the taskrunner was reset).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts import trial_fields
from contracts.fields import BadValue
from daemons.bus import BusError
from daemons.gpus import visible_gpus
from daemons.ledger_client import LedgerClient, Rejected
from daemons.processes import stop_process_group
from daemons.rundir import RunDir, build_run_dir, parse_mount
from daemons.swop.slpeers import merge_env, node_mounts, volume_source
from taskdefs import RunTrialsBody, SlNodeDef, expand_search

__all__ = [
    "Outcome",
    "Slot",
    "TrialRunner",
    "TrialSetup",
    "env_text",
    "plan_body",
    "read_result",
    "report_result",
    "trial_slots",
]

log = logging.getLogger("swarm.swop.trials")

RESULT_FILE = "trial_result.json"
_MAX_RESULT = 4 << 20
_PYTHONS = ("python", "python3")


@dataclass(frozen=True)
class Slot:
    """Where one trial runs at a time: a GPU (its ``CUDA_VISIBLE_DEVICES``) or a CPU slot."""

    name: str
    env: dict[str, str] = field(default_factory=dict)


def trial_slots(cpu_slots: int, gpus: list[str] | None = None) -> list[Slot]:
    """One slot per visible GPU; ``cpu_slots`` CPU slots on a host without GPUs."""
    devices = visible_gpus() if gpus is None else gpus
    if devices:
        return [Slot(f"gpu{device}", {"CUDA_VISIBLE_DEVICES": device}) for device in devices]
    return [Slot(f"cpu{i}") for i in range(max(1, cpu_slots))]


@dataclass(frozen=True)
class TrialSetup:
    """What every trial of one assignment on this SWOP shares."""

    task: str
    taskrunner: str
    body: RunTrialsBody
    node: SlNodeDef | None
    python: str
    run_root: Path
    volumes: Path

    def argv(self) -> list[str]:
        """``Entrypoint Command``; ``python``/``python3`` is the task's environment's interpreter."""
        parts = [*shlex.split(self.body.entrypoint), *shlex.split(self.body.command)]
        if parts and parts[0] in _PYTHONS:
            parts[0] = self.python
        return parts

    def env(self, params: dict[str, Any]) -> dict[str, str]:
        """Envvars, then the node's usrenvvars, then the trial's parameters."""
        env = merge_env(dict(self.body.envvars or []), self.node.usrenvvars if self.node else None)
        return {**env, **{name: env_text(value) for name, value in params.items()}}

    def mounts(self) -> list[str]:
        """``--ml-v`` style mounts: the node's private data and the shared content."""
        if self.node is None:
            return [
                f"{volume_source(m.src, m.m_type, self.volumes)}:{m.tgt}"
                for m in self.body.shared_content or []
            ]
        return node_mounts(self.node, self.body, self.volumes)


def env_text(value: Any) -> str:
    """A parameter's value as an environment variable (``true``/``false`` for booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def plan_body(setup: TrialSetup) -> dict[str, Any]:
    """The ``trial.plan`` of an assignment: the expanded search and how trials are ranked."""
    body = setup.body
    return {
        "task": setup.task,
        "taskrunner": setup.taskrunner,
        "kind": body.search.kind,
        "mode": body.mode,
        "metric": body.metric,
        "goal": body.goal,
        "retries": body.retries,
        "trials": expand_search(body.search),
    }


@dataclass(frozen=True)
class _Claim:
    index: int
    attempt: int
    params: dict[str, Any]


@dataclass(frozen=True)
class Outcome:
    """How one run of a trial ended here: its status, exit code, description and reported metrics."""

    status: str
    exit_code: int | None
    description: str
    report: dict[str, Any] = field(default_factory=dict)


class TrialRunner:
    """This SWOP's part of one RUN_TRIALS assignment."""

    def __init__(self, ledger: LedgerClient, setup: TrialSetup, slots: list[Slot]) -> None:
        self.ledger = ledger
        self.setup = setup
        self.free = list(slots)
        self.ran = 0
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self._wake = asyncio.Event()
        self._stopped = False

    async def plan(self) -> None:
        """Record the trials on the ledger (every SWOP of the assignment sends the same plan)."""
        await self.ledger.submit("trial.plan", plan_body(self.setup))

    async def run(self) -> dict[str, Any]:
        """Run trials until the study has finished; returns its last progress view."""
        async with self.ledger.watch("study", self.setup.task) as watch, asyncio.TaskGroup() as group:
            follower = group.create_task(self._follow(watch), name=f"swop.trials.{self.setup.task}.follow")
            try:
                view = await self._work(group)
            finally:
                follower.cancel()
        return view

    async def _work(self, group: asyncio.TaskGroup) -> dict[str, Any]:
        while True:
            self._wake.clear()
            await self._claim_for_free_slots(group)
            view = dict(await self.ledger.query("study", name=self.setup.task))
            if self._stopped or (view.get("finished") and not self._procs):
                return view
            with contextlib.suppress(TimeoutError):  # an event may be lost while the bus reconnects
                async with asyncio.timeout(30):
                    await self._wake.wait()

    async def _follow(self, watch: Any) -> None:
        while True:
            await watch.next()
            self._wake.set()

    async def _claim_for_free_slots(self, group: asyncio.TaskGroup) -> None:
        while self.free and not self._stopped:
            slot = self.free[0]
            try:
                receipt = await self.ledger.submit(
                    "trial.claim", {"task": self.setup.task, "slot": slot.name}
                )
            except Rejected as exc:
                log.debug("no trial for slot %s: %s", slot.name, exc.reason)
                return
            self.free.pop(0)
            claim = _Claim(int(receipt["trial"]), int(receipt["attempt"]), dict(receipt["params"]))
            name = f"swop.trial.{self.setup.task}.{claim.index}.{claim.attempt}"
            group.create_task(self._run_on(slot, claim), name=name)

    async def _run_on(self, slot: Slot, claim: _Claim) -> None:
        try:
            outcome = await self._run_trial(slot, claim)
            if not self._stopped:
                await self._report(claim, outcome)
        finally:
            self._procs.pop(slot.name, None)
            self.free.append(slot)
            self._wake.set()

    async def _run_trial(self, slot: Slot, claim: _Claim) -> Outcome:
        setup = self.setup
        run_dir = setup.run_root / f"trial-{claim.index:04d}" / f"attempt-{claim.attempt}"
        try:
            run = await asyncio.to_thread(_build, run_dir, setup)
        except (OSError, ValueError) as exc:
            return Outcome("FAILED", None, f"cannot prepare the run directory {run_dir}: {exc}")
        result_path = run_dir / RESULT_FILE
        result_path.unlink(missing_ok=True)
        env = {
            **os.environ,
            **run.translate_env(setup.env(claim.params), [setup.body.working_dir, *_targets(setup)]),
            **slot.env,
            "SWARM_LOOPBACK": "true",
            "SWARM_TRIAL_TASK": setup.task,
            "SWARM_TRIAL_INDEX": str(claim.index),
            "SWARM_TRIAL_ATTEMPT": str(claim.attempt),
            "SWARM_TRIAL_PARAMS": json.dumps(claim.params, sort_keys=True),
            "SWARM_TRIAL_RESULT": str(result_path),
            "PYTHONUNBUFFERED": "1",
        }
        if env.pop("SWARM_BLAS_LIMITED", None):  # set for the daemons only (daemons/cli.py)
            env.pop("OPENBLAS_NUM_THREADS", None)
        log_path = run_dir / "trial.log"
        argv = setup.argv()
        log.info("trial %d (attempt %d) on %s: %s", claim.index, claim.attempt, slot.name, shlex.join(argv))
        try:
            code = await self._spawn(slot, argv, run.cwd, env, log_path)
        except OSError as exc:
            return Outcome("FAILED", None, f"cannot start {shlex.join(argv)}: {exc}")
        self.ran += 1
        return await asyncio.to_thread(_outcome, code, result_path, log_path, setup.body.metric, slot.name)

    async def _spawn(
        self, slot: Slot, argv: list[str], cwd: Path, env: dict[str, str], log_path: Path
    ) -> int:
        with log_path.open("ab") as out:
            proc = await asyncio.create_subprocess_exec(
                *argv, cwd=cwd, env=env, stdout=out, stderr=asyncio.subprocess.STDOUT, start_new_session=True
            )
        self._procs[slot.name] = proc
        return await proc.wait()

    async def _report(self, claim: _Claim, outcome: Outcome) -> None:
        await report_result(self.ledger, self.setup.task, claim.index, claim.attempt, outcome)

    async def stop(self) -> None:
        """Stop every running trial (without reporting them) and end ``run``."""
        self._stopped = True
        self._wake.set()
        await asyncio.gather(*(stop_process_group(p, 10.0) for p in list(self._procs.values())))


def _targets(setup: TrialSetup) -> list[str]:
    return [parse_mount(m).tgt.as_posix() for m in setup.mounts()]


def _build(run_dir: Path, setup: TrialSetup) -> RunDir:
    return build_run_dir(run_dir, setup.body.working_dir, [parse_mount(m) for m in setup.mounts()])


def _tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(line for line in text.splitlines()[-lines:] if line.strip())


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
    return f"exit code {code}"


def _outcome(code: int, result_path: Path, log_path: Path, metric: str, slot: str) -> Outcome:
    """How a trial's run ended, from its exit status and the result file it wrote."""
    if code != 0:
        return Outcome("FAILED", code, f"{_exit_text(code)}; last lines:\n{_tail(log_path)}")
    try:
        report = read_result(result_path)
    except ValueError as exc:
        return Outcome("FAILED", code, str(exc))
    if metric not in report["metrics"]:
        reported = ", ".join(report["metrics"]) or "none"
        return Outcome("FAILED", code, f"the trial reported no {metric!r} (it reported: {reported})")
    return Outcome("COMPLETED", 0, f"{metric}={report['metrics'][metric]:.6g} on {slot}", report)


def read_result(path: Path) -> dict[str, Any]:
    """The metrics (and probe probabilities) a trial wrote with ``report_trial``; ValueError if bad."""
    try:
        size = path.stat().st_size
        if size > _MAX_RESULT:
            raise ValueError(f"the trial's result file {path} is {size} bytes; at most {_MAX_RESULT}")
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise ValueError(
            f"the trial exited 0 but wrote no result to {path} "
            "(call swarmlearning.trial.report_trial(metrics) at its end)"
        ) from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"the trial's result file {path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"the trial's result file {path} must hold a JSON object")
    checks = {
        "metrics": trial_fields.metrics,
        "probabilities": trial_fields.probabilities,
        "probes": trial_fields.probes,
    }
    out: dict[str, Any] = {}
    for key, check in checks.items():
        try:
            out[key] = check(data.get(key, {} if key == "metrics" else []))
        except BadValue as exc:
            raise ValueError(f"the trial's result file {path}: {key!r} {exc}") from None
    out["probabilities"] = [list(row) for row in out["probabilities"]]
    out["probes"] = [list(row) for row in out["probes"]]
    return out


async def report_result(
    ledger: LedgerClient, task: str, index: int, attempt: int, outcome: Outcome, *, where: str = ""
) -> None:
    """Record how this SWOP's run of a trial ended (``trial.result``); a failure to record is logged."""
    body = {
        "task": task,
        "trial": index,
        "attempt": attempt,
        "status": outcome.status,
        "exit_code": outcome.exit_code,
        "description": outcome.description[-2000:],
        **outcome.report,
    }
    log.info("trial %d (attempt %d)%s %s: %s", index, attempt, where, outcome.status, outcome.description)
    try:
        await ledger.submit("trial.result", body)
    except (Rejected, BusError) as exc:
        log.warning("could not record the result of trial %d: %s", index, exc)
