"""Fault rows about one node: a SWOP SIGKILLed, a hung ML program, a node cut off for 25 s, a
certificate that expires mid-training (rows of the matrix in ``bench/faults.py``, same columns).

Run them alone: ``.venv/bin/python bench/faults_nodes.py [row ...]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import faults
from bench.common import chosen_names, print_rows
from bench.faults import (
    FAULT_AFTER_ROUND,
    PEERS,
    PROGRAM,
    TRAINING,
    Outcome,
    Swarm,
    _digests,
    _failure,
    _finish,
    _merge_times,
    _merged_after,
    _recovery,
    _sigkill,
    _start_swarm,
    _wait_exit,
    _wait_round,
    merges_by_round,
)
from bench.processes import Processes, descendants
from bench.swarm_setup import (
    CONTRACT,
    RUNNER,
    SWARM,
    SwarmNode,
    ledger_session,
    register_task,
    start_sn,
    start_swop,
    wait_enrolled,
    write_profile,
    write_run_task,
)
from certs import init_swarm, issue_identity
from daemons.broker import free_port
from daemons.bus.config import BrokerAddress
from daemons.identity import Identity, open_bus
from daemons.ledger_client import LedgerClient
from daemons.sl.node import EXPIRY_LEAD

__all__ = ["NODE_ROWS"]

END_TIMEOUT = 150.0


# ------------------------------------------------------------------------------------ SWOP SIGKILL


def swop_kill(work: Path) -> Outcome:
    """SIGKILL of the SWOP whose 4 SLs train: they live on and report their own end; the taskrunner's
    final state must follow the contract."""
    with Processes(work / "logs") as procs:
        port = start_sn(procs, work / "sn")
        nodes = [
            SwarmNode(f"sl-{i}", _private(work, i), {"SEED": i, "SCRATCH_DIR": "scratch"})
            for i in range(1, PEERS + 1)
        ]
        profile = write_profile(work / "profile.yaml", nodes, envvars={"SL_WAIT_FOR_FULL_QUORUM_SECONDS": 5})
        task_file = write_run_task(work / "task.yaml", "faults_swop", program=PROGRAM, envvars=TRAINING)
        start_swop(procs, port, profile, work / "swop")
        orphans: set[int] = set()
        try:
            fault_at, view = asyncio.run(_swop_scenario(procs, port, task_file, orphans))
            out = Outcome("SIGKILL of the SWOP of 4 training SLs")
            error = f": {view['error']}" if view.get("error") else ""
            out.outcome = f"taskrunner {view['state']}{error}"
            out.outcome += f" ({view.get('completed')}/{view.get('required')} SLs completed)"
            found = _swop_digests(work / "swop")
            out.one_digest = len(found) == PEERS and len(set(found)) == 1 and "" not in found
            alive = _still_running(orphans, 30.0)
            sn_up = procs.started["sn"].poll() is None
            left = f"{len(alive)} processes left" if alive else "all ended"
            out.alive = f"SN {'up' if sn_up else 'DOWN'}, SLs {left}"
            out.merged = sorted(merges_by_round(_swop_ml_logs(work / "swop")).values())
            _recovery(out, fault_at)
            out.note = "the SLs outlive their SWOP (as the reference's containers do) and report their end"
            return out
        finally:
            for pid in orphans:
                _sigkill(pid)


async def _swop_scenario(
    procs: Processes, port: int, task_file: Path, orphans: set[int]
) -> tuple[float, dict[str, Any]]:
    async with ledger_session(port, "bench-faults-swop") as ledger:
        await wait_enrolled(ledger, 1)
        task = await register_task(ledger, task_file)
        await ledger.submit("taskrunner.assign", {"task": task, "taskrunner": RUNNER, "peers": PEERS})
    await _wait_round(port, _merged_after(FAULT_AFTER_ROUND), 120)
    swop = procs.started.pop("swop-1")
    orphans.update(descendants(swop.pid))
    fault_at = time.time()
    swop.kill()
    swop.wait()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + END_TIMEOUT
    async with ledger_session(port, "bench-swop") as ledger, ledger.watch("taskrunner", RUNNER) as watch:
        while True:
            view = dict(await ledger.query("taskrunner.status", name=RUNNER))
            if view["state"] != "RUNNING":
                return fault_at, view
            await watch.next(timeout=max(deadline - loop.time(), 0.01))


def _still_running(pids: set[int], timeout: float) -> list[int]:
    """Those of ``pids`` still running after up to ``timeout`` seconds (a zombie has ended)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [pid for pid in pids if _running(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _private(work: Path, i: int) -> Path:
    path = work / f"user{i}"
    (path / "scratch").mkdir(parents=True, exist_ok=True)
    return path


def _swop_ml_logs(swop_work: Path) -> list[str]:
    """The ML programs' logs of the SLs a SWOP ran."""
    return [log.read_text(errors="replace") for log in sorted((swop_work / "runs").glob("*/*/ml.log"))]


def _swop_digests(swop_work: Path) -> list[str]:
    found = []
    for log in _swop_ml_logs(swop_work):
        hits = re.findall(r"FINAL_DIGEST ([0-9a-f]{64})", log)
        found.append(hits[-1] if hits else "")
    return found


# ---------------------------------------------------------------------------------- hung ML program

STRAGGLER_TIMEOUT_S = 8.0


def hung_ml(work: Path) -> Outcome:
    """SIGSTOP of one node's ML program (its SL lives): rounds go on without it after quorum_wait, and
    once the others finished the ledger skips it after ``SL_STRAGGLER_TIMEOUT_SECONDS``."""
    with Processes(work / "logs") as procs:
        sl_env = {"SL_STRAGGLER_TIMEOUT_SECONDS": str(STRAGGLER_TIMEOUT_S)}
        swarm = _start_swarm(procs, work, sl_env=sl_env)
        merged = asyncio.run(_wait_round(swarm.port, _merged_after(FAULT_AFTER_ROUND), 120))
        victim = next(n for n in reversed(swarm.names) if n != merged["leader"])
        program = _ml_pid(procs, victim)
        fault_at = time.time()
        os.kill(program, signal.SIGSTOP)
        survivors = [n for n in swarm.names if n != victim]
        out = _finish(
            swarm, Outcome(f"SIGSTOP of one ML program ({victim}; its SL lives)"), survivors, fault_at
        )
        os.kill(program, signal.SIGCONT)
        code = _wait_exit(swarm, [victim], 30)[victim]
        said = _swarm_error(procs.output(victim))
        out.note = (
            f"SL_STRAGGLER_TIMEOUT_SECONDS={STRAGGLER_TIMEOUT_S:g}; resumed after the end, {victim} "
            f"exits {code}: {said}"
        )
        return out


# ------------------------------------------------------------------------------------- partition

CUT_OFF_S = 25.0
PARTITION_EPOCHS = 55  # the others still train when it is back (an epoch takes about 1 s)


def partition(work: Path) -> Outcome:
    """One SL cut off for ``CUT_OFF_S`` (SIGSTOP of the SL alone: its keepalive lapses, the broker sends
    its will, the SN marks it offline and it leaves the contract), then SIGCONT: it must join again."""
    with Processes(work / "logs") as procs:
        swarm = _start_swarm(procs, work, env={"EPOCHS": PARTITION_EPOCHS})
        merged = asyncio.run(_wait_round(swarm.port, _merged_after(FAULT_AFTER_ROUND), 120))
        victim = next(n for n in reversed(swarm.names) if n != merged["leader"])
        fault_at = time.time()
        os.kill(procs.started[victim].pid, signal.SIGSTOP)
        time.sleep(CUT_OFF_S)
        os.kill(procs.started[victim].pid, signal.SIGCONT)
        back_at = time.time()
        out = _finish(
            swarm, Outcome(f"one SL cut off for {CUT_OFF_S:g} s ({victim}, SIGSTOP)"), swarm.names, fault_at
        )
        back = asyncio.run(_rounds_of(swarm.port, victim, back_at))
        loads = [t for t in _merge_times(swarm, [victim]) if t > back_at]
        first = f", its program loads a merge {loads[0] - back_at:.2f} s after SIGCONT" if loads else ""
        out.note = (
            f"{victim} is back after {CUT_OFF_S:g} s and contributes to {len(back)} merged round(s){first}; "
            "the recovery column is the others' (they go on without it)"
        )
        return out


async def _rounds_of(port: int, uid: str, since: float) -> list[float]:
    """Ledger times of the merged rounds ``uid`` contributed to after ``since`` (the chain's history;
    a time there may be a round's close later than the merge, ``bench/faults.py``)."""
    async with ledger_session(port, "bench-rounds") as ledger:
        history = await ledger.history(CONTRACT)
    return sorted(
        float(r["time"])
        for r in history["records"]
        if r["kind"] == "round" and float(r["time"]) > since and uid in (r.get("contributors") or [])
    )


# ---------------------------------------------------------------------------- certificate expiry

CERT_LIFETIME_S = 25.0  # from the start of the swarm to the expiry of sl-4's certificate
EXPIRY_EPOCHS = 40  # the others still train when it expires (an epoch takes about 1 s)


def cert_expiry(work: Path) -> Outcome:
    """sl-4's certificate expires mid-training (mutual TLS, signed messages): it leaves just before
    (``EXPIRY_LEAD``), its ML program exits non-zero saying why, the others finish without it."""
    pki = work / "pki"
    init_swarm(pki, sl=PEERS)
    now = dt.datetime.now(dt.UTC)
    valid_from = now - dt.timedelta(days=1) + dt.timedelta(seconds=CERT_LIFETIME_S)
    issue_identity(pki / "ca", f"sl-{PEERS}", "sl", pki, valid_from=valid_from, days=1)
    expires_at = (valid_from + dt.timedelta(days=1)).timestamp()
    with Processes(work / "logs") as procs:
        port = free_port()
        ids = ["--capath", str(pki / "ca" / "capath")]
        sn_ids = [*ids, "--cert", str(pki / "sn-1-cert.pem"), "--key", str(pki / "sn-1-key.pem")]
        procs.start(
            "sn",
            [SWARM, "sn", "--sentinel", "--data-dir", str(work / "sn"), "--sn-api-port", str(port), *sn_ids],
        )
        procs.wait_for_line("sn", "Starting SWARM-API-SERVER", 60)
        swarm = Swarm(procs, port, work / "sn", work, [f"sl-{i}" for i in range(1, PEERS + 1)])
        for i, uid in enumerate(swarm.names, 1):
            files = ["--cert", str(pki / f"{uid}-cert.pem"), "--key", str(pki / f"{uid}-key.pem"), *ids]
            _start_tls_sl(swarm, uid, {**TRAINING, "EPOCHS": EXPIRY_EPOCHS, "SEED": i}, files)
        victim, survivors = swarm.names[-1], swarm.names[:-1]
        fault_at = expires_at - EXPIRY_LEAD
        out = Outcome(f"the certificate of {victim} expires mid-training")
        codes = _wait_exit(swarm, survivors, END_TIMEOUT)
        out.outcome = _failure(swarm, survivors, codes)
        found = _digests(swarm, survivors)
        out.one_digest = len(found) == 1 and None not in found
        exits = "all exit 0" if all(c == 0 for c in codes.values()) else f"exits {list(codes.values())}"
        out.alive = f"SN {'up' if procs.started['sn'].poll() is None else 'DOWN'}, the other SLs {exits}"
        swci = Identity.load(pki / "swci-1-cert.pem", pki / "swci-1-key.pem", pki / "ca" / "capath")
        status = asyncio.run(_member_status(port, swci, victim))
        out.merged = _merge_times(swarm, survivors)
        _recovery(out, fault_at)
        code = _wait_exit(swarm, [victim], 30)[victim]
        out.note = (
            f"{victim} leaves {EXPIRY_LEAD:g} s before the expiry, the ledger counts it {status}; its ML "
            f"program exits {code}: {_swarm_error(procs.output(victim))}"
        )
        return out


async def _member_status(port: int, swci: Identity, uid: str) -> str:
    """``uid``'s member status in the contract (asked over TLS)."""
    address = BrokerAddress("127.0.0.1", port, tls=True)
    async with open_bus(swci, address, swci.uid, "swci", network="swarm") as bus:
        ledger = await LedgerClient.connect(bus, timeout=30)
        members = await ledger.query("contract.perfdata", name=CONTRACT)
    return next((str(m["status"]) for m in members if m["uid"] == uid), "?")


def _start_tls_sl(swarm: Swarm, uid: str, env: dict[str, object], files: list[str]) -> None:
    """A standalone SL with its identity (``--cert``/``--key``/``--capath``: mutual TLS, signed messages)."""
    node = swarm.work / uid
    node.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROGRAM, node / PROGRAM.name)
    argv = [SWARM, "sl", "--name", uid, "--sn-api-port", str(swarm.port), "--ml-w", str(node),
            "--ml-cmd", PROGRAM.name, "--run-dir", str(node / "run"), "--linger", "5", *files]  # fmt: skip
    for key, value in {"SCRATCH_DIR": node / "scratch", **env}.items():
        argv += ["--ml-e", f"{key}={value}"]
    swarm.procs.start(uid, argv)


def _swarm_error(output: str) -> str:
    """The last ``SwarmError`` the ML program raised (the message the user sees), shortened."""
    said = [x.split("SwarmError: ", 1)[1] for x in output.splitlines() if "SwarmError: " in x]
    return said[-1].removeprefix("SwarmCallback: ")[:200] if said else "no message"


def _ml_pid(procs: Processes, name: str) -> int:
    """The PID of the ML program ``name``'s SL runs."""
    for pid in descendants(procs.started[name].pid):
        with contextlib.suppress(OSError):
            if PROGRAM.name.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    raise RuntimeError(f"{name} runs no {PROGRAM.name}")


NODE_ROWS: tuple[Callable[[Path], Outcome], ...] = (swop_kill, hung_ml, partition, cert_expiry)


def main() -> None:
    """Print the rows named on the command line (default: all of them)."""
    names = chosen_names(__doc__, "row", [r.__name__ for r in NODE_ROWS])
    rows = tuple(r for r in NODE_ROWS if not names or r.__name__ in names)
    print_rows(f"Node faults: {PEERS} SLs (tiny torch program)", faults.run(only=rows))


if __name__ == "__main__":
    main()
