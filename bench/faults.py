"""The fault matrix: one fault per row against a small real swarm, and the seconds it costs.

Every row starts its own swarm: an SN (with the mosquitto it supervises) and ``PEERS`` standalone SLs
running the tiny torch program (``tests/programs/tiny_train.py``), injects one fault, waits for the
survivors to end (bounded), and reads when their ML programs loaded each merged round (the first
survivor's log line saying so, by its clock). Columns: the outcome (finished, or failed with the
survivors' message), whether the survivors hold one final digest, whether the SN (and its broker) is up
and every survivor exited 0, and the longest the survivors went without a new merged model across the
fault: the gaps between merges from the last one before the fault to the ``AFTER_MERGES``-th after it
(a fault may spare the round in flight, which the leader's data plane merges before the ledger closes
it, and stall the next one); the baseline is the median gap between merges away from the fault (before
it, and from the ``AFTER_MERGES``-th merge after it on). Not the ledger's times of ``round.merged``: the
SN may seal one with the next round's close, up to its check-in hold later. Rows whose fault lasts (the
SN down 60 s, a full disk) count from its end: the SN's return, space back. The disk rows mount a tmpfs
of their own (root needed; skipped otherwise, saying why). Everything a row starts is stopped by PID.

Run: ``.venv/bin/python bench/faults.py [--quick]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, make_row, print_rows, quick_flag
from bench.processes import Processes, descendants
from bench.swarm_setup import CONTRACT, SWARM, ledger_session, start_sn
from contracts.ledger import Ledger

__all__ = ["Outcome", "fill_disk", "run"]

PROGRAM = ROOT / "tests" / "programs" / "tiny_train.py"
PEERS = 4
TRAINING = {"EPOCHS": 3, "BATCHES": 8, "SYNC_FREQ": 4, "SLEEP_PER_BATCH": 0.1, "MIN_PEERS": 2}
FAULT_AFTER_ROUND = 2  # the fault comes once this many rounds have merged
AFTER_MERGES = 3  # merges after a fault whose waits count: it may stall a round after the one in flight
END_TIMEOUT = 150.0  # seconds the survivors get to finish after the fault
SN_DOWN_S = 5.0
SN_LONG_DOWN_S = 60.0
DISK_FULL_S = 5.0  # seconds the SN's disk stays full
BIG_HIDDEN = 200_000  # 8.8 MB of weights: pulls long enough for a kill to land between merge and pull


@dataclass
class Outcome:
    """What one row measured."""

    fault: str
    outcome: str = ""
    one_digest: bool = False
    alive: str = ""
    recovery_s: float = float("nan")
    interval_s: float = float("nan")
    note: str = ""
    merged: list[float] = field(default_factory=list)


@dataclass
class Swarm:
    """One row's swarm: its processes, the SN's port and data, the SL names."""

    procs: Processes
    port: int
    data: Path
    work: Path
    names: list[str]

    def sn_argv(self) -> list[str]:
        return [SWARM, "sn", "--sentinel", "--data-dir", str(self.data), "--sn-api-port", str(self.port)]


def _start_sl(swarm: Swarm, uid: str, env: Mapping[str, object], sl_env: Mapping[str, str]) -> None:
    node = swarm.work / uid
    node.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROGRAM, node / PROGRAM.name)
    argv = [SWARM, "sl", "--name", uid, "--sn-api-port", str(swarm.port), "--ml-w", str(node),
            "--ml-cmd", PROGRAM.name, "--run-dir", str(node / "run"), "--linger", "5"]  # fmt: skip
    for key, value in {"SCRATCH_DIR": node / "scratch", **env}.items():
        argv += ["--ml-e", f"{key}={value}"]
    swarm.procs.start(uid, argv, env=dict(sl_env))


def _start_swarm(
    procs: Processes,
    work: Path,
    *,
    peers: int = PEERS,
    env: Mapping[str, object] | None = None,
    per_node: Mapping[str, Mapping[str, object]] | None = None,
    sl_env: Mapping[str, str] | None = None,
    data: Path | None = None,
) -> Swarm:
    data = data or work / "sn"
    port = start_sn(procs, data)
    swarm = Swarm(procs, port, data, work, [f"sl-{i}" for i in range(1, peers + 1)])
    for i, uid in enumerate(swarm.names, 1):
        node_env = {**TRAINING, "SEED": i, **(env or {}), **(per_node or {}).get(uid, {})}
        _start_sl(swarm, uid, node_env, sl_env or {})
    return swarm


_MERGED_LINE = re.compile(
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) : SwarmCallback : INFO : Finished Swarm merging round (\d+)"
)


def merges_by_round(outputs: Iterable[str]) -> dict[int, float]:
    """When the swarm went on with each merged round: the first of the ML programs' ``outputs`` (their
    own log, or an SL's that relays it) saying it loaded that round's merge, by its log line's clock."""
    first: dict[int, float] = {}
    for output in outputs:
        for stamp, number in _MERGED_LINE.findall(output):
            at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            first[int(number)] = min(at, first.get(int(number), at))
    return first


def _merges_by_round(swarm: Swarm, names: list[str]) -> dict[int, float]:
    """``merges_by_round`` of the SLs ``names``."""
    return merges_by_round(swarm.procs.output(name) for name in names)


def _merge_times(swarm: Swarm, names: list[str]) -> list[float]:
    """``_merges_by_round``'s times, in order."""
    return sorted(_merges_by_round(swarm, names).values())


def longest_wait(merged: list[float], fault_at: float, *, from_fault: bool = False) -> float:
    """The longest the swarm went without a new merged model across a fault at ``fault_at``: the gaps
    between the sorted merge times ``merged`` from the last one before the fault (from the fault itself
    with ``from_fault``, for a fault counted from its end) to the ``AFTER_MERGES``-th after it; NaN when
    none came after."""
    after = [t for t in merged if t > fault_at][:AFTER_MERGES]
    before = [t for t in merged if t <= fault_at]
    start = before[-1] if before and not from_fault else fault_at
    return max((b - a for a, b in itertools.pairwise([start, *after])), default=float("nan"))


def usual_gap(merged: list[float], fault_at: float) -> float:
    """The median gap between the merges ``merged`` away from a fault at ``fault_at``: those before it,
    and those after the ``AFTER_MERGES``-th merge after it (NaN without any)."""
    before = [t for t in merged if t <= fault_at]
    later = [t for t in merged if t > fault_at][AFTER_MERGES - 1 :]
    gaps = [b - a for run in (before, later) for a, b in itertools.pairwise(run)]
    return statistics.median(gaps) if gaps else float("nan")


async def _wait_round(
    port: int, pick: Callable[[dict[str, Any]], dict[str, Any] | None], timeout: float
) -> Any:
    """The first round ``pick`` returns from the ledger's rounds view, watched as it changes."""
    async with ledger_session(port, "bench-faults-watch") as ledger:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with ledger.watch("round", CONTRACT) as watch:
            while True:
                with_view = dict(await ledger.query("contract.rounds", name=CONTRACT))
                found = pick(with_view)
                if found is not None:
                    return found
                if loop.time() > deadline:
                    raise RuntimeError(f"no such round within {timeout:g} s")
                await watch.next(timeout=max(deadline - loop.time(), 0.05))


def _merged_after(count: int) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    def pick(view: dict[str, Any]) -> dict[str, Any] | None:
        merged = [r for r in view["finished"] if r["status"] == "MERGED" and not r["init"]]
        return merged[count - 1] if len(merged) >= count else None

    return pick


def _closed_round(view: dict[str, Any]) -> dict[str, Any] | None:
    closed = [r for r in view["closed"] if not r["init"] and r["leader"] and r["round"] > FAULT_AFTER_ROUND]
    return closed[0] if closed else None


def _wait_exit(swarm: Swarm, names: list[str], timeout: float) -> dict[str, int | None]:
    deadline = time.monotonic() + timeout
    codes: dict[str, int | None] = {}
    for name in names:
        proc = swarm.procs.started[name]
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        codes[name] = proc.poll()
    return codes


def _kill(swarm: Swarm, name: str) -> None:
    """SIGKILL ``name`` and its process group (its ML program), as a crash would."""
    proc = swarm.procs.started[name]
    for pid in descendants(proc.pid):
        _sigkill(pid)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _sigkill(pid: int) -> None:
    """SIGKILL one PID, gone or not."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _broker_pid(sn_pid: int) -> int:
    for pid in descendants(sn_pid):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "mosquitto":
                return pid
        except OSError:
            continue
    raise RuntimeError("the SN runs no mosquitto")


def _digests(swarm: Swarm, names: list[str]) -> set[str | None]:
    found = set()
    for name in names:
        hits = re.findall(r"FINAL_DIGEST ([0-9a-f]{64})", swarm.procs.output(name))
        found.add(hits[-1] if hits else None)
    return found


def _failure(swarm: Swarm, names: list[str], codes: Mapping[str, int | None]) -> str:
    for name in names:
        if codes[name] != 0:
            lines = [
                line for line in swarm.procs.output(name).splitlines()
                if re.search(r"error|cannot|failed|timed out", line, re.IGNORECASE)
            ]  # fmt: skip
            why = lines[-1].strip()[-160:] if lines else "no message"
            state = "still running" if codes[name] is None else f"exit {codes[name]}"
            return f"failed: {name} {state}: {why}"
    return "finished"


def _finish(swarm: Swarm, out: Outcome, survivors: list[str], fault_at: float) -> Outcome:
    """Wait for ``survivors``, then fill ``out`` from their exits, their digests, their programs' merges
    (``longest_wait`` across ``fault_at``)."""
    codes = _wait_exit(swarm, survivors, END_TIMEOUT)
    out.outcome = _failure(swarm, survivors, codes)
    digests = _digests(swarm, survivors)
    out.one_digest = len(digests) == 1 and None not in digests
    sn = swarm.procs.started["sn"]
    broker_up = any(
        Path(f"/proc/{p}/comm").exists() and Path(f"/proc/{p}/comm").read_text().strip() == "mosquitto"
        for p in descendants(sn.pid)
    )
    sn_up = sn.poll() is None
    exits = "all exit 0" if all(c == 0 for c in codes.values()) else f"exits {list(codes.values())}"
    out.alive = f"SN {'up' if sn_up else 'DOWN'}, broker {'up' if broker_up else 'DOWN'}, SLs {exits}"
    out.merged = _merge_times(swarm, survivors)
    _recovery(out, fault_at)
    return out


def _recovery(out: Outcome, fault_at: float) -> None:
    """Fill ``out``'s columns from its merge times: ``longest_wait`` and ``usual_gap`` across ``fault_at``."""
    out.recovery_s = longest_wait(out.merged, fault_at)
    out.interval_s = usual_gap(out.merged, fault_at)


# ------------------------------------------------------------------------------------------- rows


def sl_kill(work: Path) -> Outcome:
    """SIGKILL of an SL that is not leading."""
    with Processes(work / "logs") as procs:
        swarm = _start_swarm(procs, work)
        merged = asyncio.run(_wait_round(swarm.port, _merged_after(FAULT_AFTER_ROUND), 120))
        victim = next(n for n in reversed(swarm.names) if n != merged["leader"])
        fault_at = time.time()
        _kill(swarm, victim)
        survivors = [n for n in swarm.names if n != victim]
        return _finish(swarm, Outcome(f"SIGKILL of an SL ({victim})"), survivors, fault_at)


def leader_mid_merge(work: Path) -> Outcome:
    """SIGKILL of a round's leader while it merges (every SL waits 3 s before merging)."""
    with Processes(work / "logs") as procs:
        swarm = _start_swarm(procs, work, sl_env={"SWARM_DEBUG_MERGE_DELAY": "3"})
        closed = asyncio.run(_wait_round(swarm.port, _closed_round, 120))
        leader = str(closed["leader"])
        fault_at = time.time()
        _kill(swarm, leader)
        out = Outcome(f"SIGKILL of the leader during its merge (round {closed['round']})")
        out.note = "every SL waits 3 s before merging (SWARM_DEBUG_MERGE_DELAY), the replacement too"
        return _finish(swarm, out, [n for n in swarm.names if n != leader], fault_at)


def leader_after_merged(work: Path, *, dataplane: bool = True) -> Outcome:
    """SIGKILL of a round's leader as soon as the ledger says ``round.merged`` (before the pulls).

    With the data plane the others pull the merge early (from the round's close), so they mostly hold
    it already, and the SN seals such a record with the next round's close: the kill then lands in the
    round after. Without it (``SWARM_DATAPLANE=off``) they pull through the broker after the record,
    which the SN seals at once."""
    with Processes(work / "logs") as procs:
        sl_env = {} if dataplane else {"SWARM_DATAPLANE": "off"}
        swarm = _start_swarm(procs, work, env={"HIDDEN": BIG_HIDDEN}, sl_env=sl_env)
        merged = asyncio.run(_wait_round(swarm.port, _merged_after(FAULT_AFTER_ROUND), 120))
        leader = str(merged["leader"])
        fault_at = time.time()
        _kill(swarm, leader)
        how = "" if dataplane else ", no data plane"
        out = Outcome(f"SIGKILL of the leader right after round.merged (round {merged['round']}{how})")
        out.note = f"{BIG_HIDDEN * 11 * 4 / 1e6:.1f} MB model"
        return _finish(swarm, out, [n for n in swarm.names if n != leader], fault_at)


def leader_after_merged_broker(work: Path) -> Outcome:
    """The same, every model through the broker (``SWARM_DATAPLANE=off``): no early pull."""
    return leader_after_merged(work, dataplane=False)


def _final_merged(view: dict[str, Any]) -> dict[str, Any] | None:
    merged = [r for r in view["finished"] if r["status"] == "MERGED" and r["final"]]
    return merged[0] if merged else None


def leader_after_final_merged(work: Path) -> Outcome:
    """The final round's leader SIGKILLs itself right after its ``round.merged`` is sealed
    (``SWARM_DEBUG_KILL_AFTER_MERGED=final``: a kill from outside comes too late to land before the
    pulls). It records that merge only once another participant took the model, which then serves it.
    No round comes after the final one: the note gives the seconds until the survivors had exited."""
    with Processes(work / "logs") as procs:
        die = {"SWARM_DEBUG_KILL_AFTER_MERGED": "final"}
        swarm = _start_swarm(procs, work, env={"HIDDEN": BIG_HIDDEN}, sl_env=die)
        final = asyncio.run(_wait_round(swarm.port, _final_merged, 150))
        leader, fault_at = str(final["leader"]), time.time()
        out = Outcome(
            f"SIGKILL of the final round's leader right after its round.merged (round {final['round']})"
        )
        out = _finish(swarm, out, [n for n in swarm.names if n != leader], fault_at)
        out.note = (
            f"{BIG_HIDDEN * 11 * 4 / 1e6:.1f} MB model; survivors exited {time.time() - fault_at:.2f} s after"
        )
        return out


def sn_restart(work: Path, down: float = SN_DOWN_S) -> Outcome:
    """SIGKILL of the SN (and its broker), restarted on the same data and port after ``down`` seconds."""
    with Processes(work / "logs") as procs:
        swarm = _start_swarm(procs, work)
        asyncio.run(_wait_round(swarm.port, _merged_after(FAULT_AFTER_ROUND), 120))
        fault_at = time.time()
        _kill(swarm, "sn")
        procs.started.pop("sn")
        time.sleep(down)
        procs.start("sn", swarm.sn_argv())
        procs.wait_for_line("sn", "Starting SWARM-API-SERVER", 60)
        back_at = time.time()
        out = _finish(swarm, Outcome(f"SIGKILL of the SN (and its broker), restarted after {down:g} s"),
                      list(swarm.names), fault_at)  # fmt: skip
        after = [t for t in out.merged if t > back_at]
        since_back = f"{after[0] - back_at:.2f} s from the SN's return to the next merge" if after else ""
        if down > 10:  # the target: training resumes within 10 s of the SN's return
            out.recovery_s = longest_wait(out.merged, back_at, from_fault=True)
            out.note = f"counted from the SN's return (it serves again); {down:g} s down; {since_back}"
        else:
            out.note = since_back
        return out


def sn_down_60(work: Path) -> Outcome:
    """The SN (and its broker) gone for 60 s: the nodes wait (``SWARM_SN_DEADLINE``, 300 s) and go on."""
    return sn_restart(work, down=SN_LONG_DOWN_S)


def sn_disk_full(work: Path) -> Outcome:
    """The disk under the SN's data directory (a tmpfs of its own) full for ``DISK_FULL_S`` seconds."""
    disk = work / "disk"
    disk.mkdir()
    title = f"the SN's disk full for {DISK_FULL_S:g} s"
    mount = ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(disk)]
    mounted = subprocess.run(mount, capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        return Outcome(
            title, outcome=f"skipped: cannot mount a tmpfs (root needed): {mounted.stderr.strip()}"
        )
    try:
        with Processes(work / "logs") as procs:
            swarm = _start_swarm(procs, work, data=disk / "sn")
            asyncio.run(_wait_round(swarm.port, _merged_after(FAULT_AFTER_ROUND), 120))
            filled_at = time.time()
            fill_disk(disk / "filler")
            time.sleep(DISK_FULL_S)
            (disk / "filler").unlink()
            back_at = time.time()
            out = _finish(swarm, Outcome(title), list(swarm.names), filled_at)
            out.recovery_s = longest_wait(out.merged, back_at, from_fault=True)
            refused = "cannot store blocks now" in procs.output("sn")
        ledger = Ledger.open(disk / "sn" / "ledger.db", verifier=None)  # stopped: verify what it stored
        blocks = ledger.height + 1
        ledger.close()
        meanwhile = "refused writes meanwhile" if refused else "was never short of space"
        out.note = f"counted from space back; the SN {meanwhile}; ledger reopened: {blocks} blocks"
        return out
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def sn_read_only(work: Path) -> Outcome:
    """``swarm sn`` started on a read-only data directory (a tmpfs mounted read-only): one line, exit 1."""
    disk = work / "ro"
    disk.mkdir()
    out = Outcome("the SN started on a read-only data directory")
    mount = ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(disk)]
    mounted = subprocess.run(mount, capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        out.outcome = f"skipped: cannot mount a tmpfs (root needed): {mounted.stderr.strip()}"
        return out
    try:
        argv = [SWARM, "sn", "--sentinel", "--data-dir", str(disk / "sn")]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    lines = done.stderr.strip().splitlines()
    out.outcome = f"exit {done.returncode}, {len(lines)} line(s) on stderr"
    out.alive = "nothing started"
    out.note = lines[-1][:200] if lines else ""
    return out


def fill_disk(path: Path) -> None:
    """Write ``path`` until its disk is full.

    Unbuffered: a buffered file keeps the bytes the full disk refused and raises again on close.
    """
    with path.open("ab", buffering=0) as out, contextlib.suppress(OSError):
        while True:
            out.write(bytes(65536))


def broker_kill(work: Path) -> Outcome:
    """SIGKILL of the mosquitto the SN supervises (the SN restarts it)."""
    with Processes(work / "logs") as procs:
        swarm = _start_swarm(procs, work)
        asyncio.run(_wait_round(swarm.port, _merged_after(FAULT_AFTER_ROUND), 120))
        fault_at = time.time()
        _sigkill(_broker_pid(procs.started["sn"].pid))
        return _finish(swarm, Outcome("SIGKILL of the broker (mosquitto)"), list(swarm.names), fault_at)


def nan_peer(work: Path) -> Outcome:
    """One peer's weights turn NaN after every step (coordmedian), from its first check-in on: the
    longest gap between merges of the whole run against their median."""
    with Processes(work / "logs") as procs:
        swarm = _start_swarm(procs, work, env={"MERGE": "coordmedian"}, per_node={"sl-1": {"POISON": "nan"}})
        out = _finish(swarm, Outcome("one peer sends NaN weights (coordmedian)"), list(swarm.names), 0.0)
        gaps = [b - a for a, b in itertools.pairwise(out.merged)]
        out.recovery_s = max(gaps, default=float("nan"))
        out.interval_s = statistics.median(gaps) if gaps else float("nan")
        out.note = f"the NaN row left out of every merge; the longest of {len(gaps)} gaps between merges"
        return out


def min_peers_unreachable(work: Path) -> Outcome:
    """minPeers 4 with 3 SLs: nobody can merge; the SLs must say whom they wait for."""
    with Processes(work / "logs") as procs:
        swarm = _start_swarm(procs, work, peers=3, env={"MIN_PEERS": PEERS})
        deadline = time.monotonic() + 90
        line = ""
        while not line and time.monotonic() < deadline:
            for name in swarm.names:
                hits = [x for x in procs.output(name).splitlines() if "waits for" in x]
                if hits:
                    line = hits[-1].strip()
                    break
            time.sleep(0.2)
        out = Outcome("minPeers 4, 3 SLs (unreachable quorum)")
        out.outcome = "waits, as asked" if line else "waits silently"
        out.alive = "SN up" if procs.started["sn"].poll() is None else "SN DOWN"
        out.note = line[line.find("round ") :][:200] if line else "no line says whom it waits for within 90 s"
        return out


ROWS: tuple[Callable[[Path], Outcome], ...] = (
    sl_kill,
    leader_mid_merge,
    leader_after_merged,
    leader_after_merged_broker,
    leader_after_final_merged,
    sn_restart,
    sn_down_60,
    sn_disk_full,
    sn_read_only,
    broker_kill,
    nan_peer,
    min_peers_unreachable,
)
QUICK: tuple[Callable[[Path], Outcome], ...] = (sl_kill, leader_after_merged_broker, nan_peer)


def measure(quick: bool = False, rows: tuple[Callable[[Path], Outcome], ...] = ()) -> list[Outcome]:
    """Every row, or ``rows`` (a failing row says why and the others still run)."""
    results = []
    for row in rows or (QUICK if quick else all_rows()):
        with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
            try:
                results.append(row(Path(tmp)))
            except Exception as exc:
                why = f"bench error: {type(exc).__name__}: {exc}"[:300]
                results.append(Outcome(row.__name__, outcome=why))
        print(f"[faults] {results[-1]}", flush=True)
    return results


def run(quick: bool = False, only: tuple[Callable[[Path], Outcome], ...] = ()) -> list[dict[str, Any]]:
    """Table rows (of ``only``, when given): the longest wait for a merge across the fault; target 10 s."""
    rows = []
    for r in measure(quick, only):
        no_end = r.fault.startswith("minPeers") or r.alive == "nothing started"  # no final model, no round
        no_next = no_end or "final round" in r.fault  # no round after it to count the seconds to
        digest = "" if no_end else f"; one final digest: {'yes' if r.one_digest else 'no'}"
        note = "; ".join(x for x in (f"{r.outcome}{digest}", r.alive, r.note) if x)
        rows.append(
            make_row(
                r.fault, round(r.recovery_s, 2), "s, longest wait for a merge",
                "median gap between merges away from the fault", round(r.interval_s, 2),
                target="" if no_next else "value <= 10", note=note,
            )
        )  # fmt: skip
    return rows


def main() -> None:
    """Print the table."""
    title = f"Fault matrix: {PEERS} SLs (tiny torch program), one fault per row"
    print_rows(title, run(quick_flag(__doc__, "three rows only")))


def all_rows() -> tuple[Callable[[Path], Outcome], ...]:
    """``ROWS`` and the node rows of ``bench/faults_nodes.py`` (imported late: they use the helpers here)."""
    from bench.faults_nodes import NODE_ROWS

    return (*ROWS, *NODE_ROWS)


if __name__ == "__main__":
    main()
