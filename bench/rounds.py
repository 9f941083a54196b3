"""Sync-round latency with 4 peers for a 1.6 MB and a 45 MB (ResNet-18 size) model, against the floor.

An SN (with mosquitto) and 4 standalone SLs, each running the stand-in ML program (``standin_ml.py``: a
numpy model, no training time, each node changing its model its own way), sync ``ROUNDS`` times. A
round's latency is the time between the moments the last node got the merged model of round k-1 and of
round k (the median over rounds 2..R; the note gives their mean, slow rounds included): check-ins and
close on the ledger (one durable block), 3 models pushed to the predicted leader over the SLs' data
plane meanwhile, the mean merge, the result sent to the 3 peers (the SN holds the leader's
``round.merged`` and seals it with the next round's close, except in the final round), and the ML<->SL
socket hops. The floor measured in the same
run: the 6 model copies any round must move (3 to the leader, 3 back) over raw loopback TCP.

A third row runs the 1.6 MB round again with every node holding its certificate (``certs.init_swarm``):
mutual TLS to mosquitto and on the SLs' data plane, every transaction and weight manifest signed and
checked, chunks hashed with BLAKE3 (XXH3-128 without certificates). Its baseline is the first row, the
same round without certificates in the same run, so its ratio is what security costs a round.

A fourth row (``sync_calls``) times what a program waits for when it trains between syncs: every stand-in
sleeps ``PAUSE_S`` before each sync (its training, the CPU left to the swarm, as when a GPU trains), and
the row gives the median of every node's sync call (``on_batch_end`` that syncs, rounds 2..R-1). Its
baseline is the same 6 copies over raw loopback TCP.

The note says where the time went: the CPU one round costs all processes together (the CPU every
process of the run used between the first node's round 2 and its round R-1, read from ``/proc`` while
they run, per round: start-up, the init round and the end stay out; on C cores the mean round cannot
take less wall time than that CPU / C), the median of every step the SLs log per round
(``daemons/sl/roundtimes.py``: hash, checkin, close_wait, lead_query, pull (taking the pushed rows, or
pulling), merge (with the hash of the merged model, on the same worker thread), merged_wait (a
participant: from the close to the merged model in hand), load; merged_tx only where a round waits for
it, the final one), the CPU seconds by process kind, and how many ledger blocks (durable writes) a round
took.

Run: ``.venv/bin/python bench/rounds.py``.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import MB, ROOT, bench_parser, loopback_tcp_rate, make_row, print_rows
from bench.processes import Processes, children_cpu_seconds, cpu_seconds, descendants
from bench.swarm_setup import start_sl, start_sn
from certs import Verifier, init_swarm
from contracts.block import decode_block
from contracts.ledger import Ledger
from daemons.sl.roundtimes import parse_steps
from wire import decode_envelope

__all__ = [
    "SwarmRun",
    "measure",
    "round_latency",
    "round_mean",
    "run",
    "step_medians",
    "swarm_rounds",
    "sync_calls",
]

STANDIN = ROOT / "bench" / "standin_ml.py"
PEERS = 4
CASES = ((1.6, 60), (45.0, 20))  # (model MB, rounds)
PAUSE_S = 0.05  # pretend training before each sync in the sync-call row
PAUSED_ROUNDS = 100
_KIND_ORDER = ("SLs", "ML programs", "SN", "mosquitto", "other")
_LOG_TAIL = 8192  # bytes of an SL's log read to find its last round
TIMEOUT_S = 240.0


class _RoundCpu:
    """The CPU of every process of the run between two rounds of the first node, sampled from ``/proc``
    while they run (the SL logs each round's steps when it ends), in all and by kind of process."""

    def __init__(self, procs: Processes, name: str, last: int) -> None:
        self._procs, self._log, self._last = procs, procs.log_path(name), last
        self._kinds: dict[int, str] = {}  # every process of the run, once all have started (by round 2)
        self.first: tuple[int, dict[str, float]] | None = None
        self.latest: tuple[int, dict[str, float]] | None = None

    def sample(self) -> None:
        """Note the round the node has ended and the CPU so far, between round 2 and round R-1."""
        done = self._rounds_done()
        if not 2 <= done < self._last or (self.latest is not None and self.latest[0] == done):
            return
        self._kinds = self._kinds or self._kinds_now()
        used: dict[str, float] = {}
        for pid, kind in self._kinds.items():
            used[kind] = used.get(kind, 0.0) + cpu_seconds(pid)
        self.latest = (done, used)
        if self.first is None:
            self.first = self.latest

    def _kinds_now(self) -> dict[int, str]:
        """Every process of the run by kind: the SN, its broker, the SLs, their ML programs."""
        kinds: dict[int, str] = {}
        for name, proc in self._procs.started.items():
            kinds[proc.pid] = "SN" if name == "sn" else "SLs"
            kinds.update(dict.fromkeys(descendants(proc.pid), "mosquitto" if name == "sn" else "ML programs"))
        kinds.update({pid: "other" for pid in descendants(os.getpid()) if pid not in kinds})
        return kinds

    def _rounds_done(self) -> int:
        """The last round in the node's log (its tail: reading it all would cost the cores measured)."""
        with self._log.open("rb") as log:
            log.seek(max(log.seek(0, os.SEEK_END) - _LOG_TAIL, 0))
            tail = log.read().decode(errors="replace")
        return max((s[0] for s in map(parse_steps, tail.splitlines()) if s), default=0)

    def per_round(self) -> dict[str, float] | None:
        """CPU seconds per round between the first and the latest sample, by kind of process; None
        without two samples."""
        if self.first is None or self.latest is None or self.latest[0] == self.first[0]:
            return None
        rounds = self.latest[0] - self.first[0]
        before = self.first[1]
        return {kind: (used - before.get(kind, 0.0)) / rounds for kind, used in self.latest[1].items()}


def _wait_all(procs: Processes, names: list[str], timeout: float, cpu: _RoundCpu | None = None) -> None:
    """Wait until every named process exits (sampling ``cpu`` meanwhile); RuntimeError naming the first
    that failed or hung."""
    deadline = time.monotonic() + timeout
    for name in names:
        proc = procs.started[name]
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} still runs after {timeout:g} s:\n{procs.output(name)[-2000:]}")
            if cpu is not None:
                cpu.sample()
            time.sleep(0.1)
        if proc.returncode != 0:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{procs.output(name)[-2000:]}")


@dataclass(frozen=True)
class SwarmRun:
    """What a stand-in swarm gave: every node's ``{"sync_s", "done"}`` and where the CPU time went."""

    nodes: list[dict[str, Any]]
    cpu_sn: float
    cpu_broker: float
    cpu_total: float
    cpu_by_kind: dict[str, float] | None  # per round, in the middle of the run (``_RoundCpu``)
    steps: dict[str, float]
    blocks: int  # blocks the SN sealed with a round.* or contract.progress transaction

    @property
    def cpu_per_round(self) -> float | None:
        """CPU seconds per round, every process of the run together."""
        return None if self.cpu_by_kind is None else sum(self.cpu_by_kind.values())

    def per_round_note(self) -> str:
        """The CPU one round took, all processes together and by kind; on C cores the mean round cannot
        take less wall time than that CPU / C."""
        cpu_s = self.cpu_per_round
        if cpu_s is None or self.cpu_by_kind is None:
            return "CPU per round not sampled (the run was too short)"
        cpu_ms = cpu_s * 1000
        cores = os.cpu_count() or 1
        kinds = ", ".join(
            f"{kind} {self.cpu_by_kind[kind] * 1000:.1f}" for kind in _KIND_ORDER if kind in self.cpu_by_kind
        )
        return (
            f"CPU per round {cpu_ms:.0f} ms, all processes together ({kinds}; on {cores} cores the mean "
            f"round takes at least {cpu_ms / cores:.0f} ms)"
        )

    def blocks_note(self, rounds: int) -> str:
        """Durable writes of the ledger per sync round."""
        return f"SN blocks per round {self.blocks / rounds:.1f}"

    def cpu_note(self) -> str:
        """CPU seconds by process kind: the SN, its mosquitto, and the SL+ML pairs."""
        rest = self.cpu_total - self.cpu_sn - self.cpu_broker
        return f"CPU s: SN {self.cpu_sn:.1f}, mosquitto {self.cpu_broker:.1f}, SL+ML pairs {rest:.1f}"


def swarm_rounds(
    ws: Path,
    peers: int,
    model_bytes: int,
    rounds: int,
    *,
    work_s: float = 0.0,
    prefix: str = "sl",
    extra_env: dict[str, Any] | None = None,
    certified: bool = False,
) -> SwarmRun:
    """Run ``peers`` SLs with stand-in MLs on a fresh SN until they finish ``rounds`` syncs.
    ``certified``: every node with its certificate (``certs.init_swarm``; nodes sl-1..): mutual TLS to
    the broker and between the SLs, signed transactions and weights, chunks hashed with BLAKE3."""
    shutil.rmtree(ws, ignore_errors=True)
    ws.mkdir(parents=True)
    pki = ws / "pki" if certified else None
    if pki is not None:
        init_swarm(pki, sl=peers)
        prefix = "sl-"
    names = [f"{prefix}{i}" for i in range(1, peers + 1)]
    cpu_before = children_cpu_seconds()
    with Processes(ws / "logs") as procs:
        port = start_sn(procs, ws / "sn", pki=pki)
        for i, name in enumerate(names):
            env = {
                "MODEL_BYTES": model_bytes, "ROUNDS": rounds, "WORK_S": work_s, "MIN_PEERS": peers,
                "SEED": i, "RESULT": ws / f"{name}.json", **(extra_env or {}),
            }  # fmt: skip
            start_sl(procs, port, name, program=STANDIN, work=ws / "runs", env=env, pki=pki)
        cpu = _RoundCpu(procs, names[0], rounds)
        _wait_all(procs, names, TIMEOUT_S + 2 * peers, cpu)
        sn = procs.started["sn"].pid
        cpu_sn = cpu_seconds(sn)
        cpu_broker = sum(cpu_seconds(pid) for pid in descendants(sn))
    nodes = [json.loads((ws / f"{name}.json").read_text()) for name in names]
    steps = step_medians([procs.output(name) for name in names])
    blocks = round_blocks(ws / "sn" / "ledger.db", pki)
    return SwarmRun(
        nodes, cpu_sn, cpu_broker, children_cpu_seconds() - cpu_before, cpu.per_round(), steps, blocks
    )


def round_blocks(path: Path, pki: Path | None = None) -> int:
    """How many blocks of the ledger at ``path`` hold a sync-round or progress transaction (``pki``: the
    swarm's certificates, which a signed chain is opened with)."""
    verifier = None if pki is None else Verifier.from_ca(pki / "ca" / "capath")
    ledger = Ledger.open(path, verifier=verifier)
    try:
        count = 0
        for raw in ledger.raw_blocks(0):
            kinds = {decode_envelope(tx, what="tx").kind for tx in decode_block(raw).txs}
            count += any(k.startswith("tx:round.") or k == "tx:contract.progress" for k in kinds)
        return count
    finally:
        ledger.close()


def step_medians(logs: list[str]) -> dict[str, float]:
    """The median milliseconds of every round step the SLs logged (``daemons/sl/roundtimes.py``), over
    rounds 2.. and over nodes (a leader's steps come from the leaders only)."""
    found: dict[str, list[float]] = {}
    for text in logs:
        for line in text.splitlines():
            parsed = parse_steps(line)
            if parsed is None or parsed[0] < 2:
                continue
            for name, ms in parsed[1].items():
                found.setdefault(name, []).append(ms)
    return {name: statistics.median(values) for name, values in found.items()}


def steps_note(steps: dict[str, float]) -> str:
    """``step ms`` of every step, in the order a round runs them."""
    return ", ".join(f"{name} {ms:.1f}" for name, ms in steps.items())


def round_latency(nodes: list[dict[str, Any]]) -> float:
    """Median time between consecutive rounds' completion on the last node (rounds 2..R)."""
    return statistics.median(b - a for a, b in itertools.pairwise(_round_ends(nodes)))


def round_mean(nodes: list[dict[str, Any]]) -> float:
    """Mean time a round took on the last node (rounds 2..R): what the rounds cost in wall time, slow
    ones included, where the median leaves them out."""
    ends = _round_ends(nodes)
    return (ends[-1] - ends[0]) / (len(ends) - 1)


def _round_ends(nodes: list[dict[str, Any]]) -> list[float]:
    """When the last node had the merged model of each round."""
    return [max(float(node["done"][k]) for node in nodes) for k in range(len(nodes[0]["done"]))]


def measure(model_mb: float, rounds: int, peers: int = PEERS, *, certified: bool = False) -> dict[str, Any]:
    """Round latency and its floor for one model size (``certified``: see ``swarm_rounds``)."""
    nbytes = int(model_mb * MB)
    ws = ROOT / "bench" / "results" / "rounds.tmp"
    swarm = swarm_rounds(ws, peers, nbytes, rounds, certified=certified)
    shutil.rmtree(ws, ignore_errors=True)
    floor = 2 * (peers - 1) * nbytes / loopback_tcp_rate(nbytes, repeat=15)
    return {
        "model_mb": model_mb,
        "latency_s": round_latency(swarm.nodes),
        "mean_s": round_mean(swarm.nodes),
        "floor_s": floor,
        "rounds": rounds,
        "cpu": f"{swarm.per_round_note()}; {swarm.cpu_note()}; {swarm.blocks_note(rounds + 1)}",
        "steps": steps_note(swarm.steps),
    }


def sync_calls(model_mb: float, rounds: int, pause_s: float = PAUSE_S) -> dict[str, Any]:
    """What each node's sync call took when every node trains ``pause_s`` (a sleep) before each sync:
    the median over nodes and rounds 2..R-1, the slowest node's median, the program's own part of a
    sync (``SwarmCallback.timings``), and where the CPU went."""
    ws = ROOT / "bench" / "results" / "rounds.tmp"
    swarm = swarm_rounds(ws, PEERS, int(model_mb * MB), rounds, work_s=pause_s)
    shutil.rmtree(ws, ignore_errors=True)
    calls = [[float(s) for s in node["sync_s"][1:-1]] for node in swarm.nodes]
    slowest = [max(node[k] for node in calls) for k in range(len(calls[0]))]
    own = {
        part: statistics.mean(float(node["timings"].get(f"sync_{part}", 0.0)) for node in swarm.nodes)
        / rounds
        for part in ("collect", "load")
    }
    return {
        "median_s": statistics.median(s for node in calls for s in node),
        "slowest_s": statistics.median(slowest),
        "own_s": own,
        "cpu": swarm.per_round_note(),
        "steps": steps_note(swarm.steps),
    }


def run() -> list[dict[str, Any]]:
    """A row per model size (ratio = round latency / the floor), then the small model's round with
    certificates (ratio = its latency / the same round's without them, this run), then its sync call
    with pretend training between syncs (ratio = the call / the floor)."""
    rows, plain = [], {}
    for model_mb, rounds in CASES:
        plain[model_mb] = m = measure(model_mb, rounds)
        rows.append(
            make_row(
                f"sync round, {PEERS} peers, {model_mb:g} MB model", m["latency_s"] * 1000, "ms",
                "6 model copies over raw loopback TCP", m["floor_s"] * 1000, note=_note(m, rounds),
            )
        )  # fmt: skip
    model_mb, rounds = CASES[0]
    m = measure(model_mb, rounds, certified=True)
    baseline = f"the {model_mb:g} MB round without certificates, this run"
    rows.append(
        make_row(
            f"sync round, {PEERS} peers, {model_mb:g} MB model, with certificates", m["latency_s"] * 1000,
            "ms", baseline, plain[model_mb]["latency_s"] * 1000,
            note=f"mutual TLS (broker and data plane), signed transactions and weights, BLAKE3 chunk hashes; "
            f"6 copies over raw loopback TCP: {m['floor_s'] * 1000:.2f} ms; {_note(m, rounds)}",
        )
    )  # fmt: skip
    c = sync_calls(model_mb, PAUSED_ROUNDS)
    own = c["own_s"]
    rows.append(
        make_row(
            f"sync call, {PEERS} peers, {model_mb:g} MB model, {PAUSE_S * 1000:g} ms of training before each",
            c["median_s"] * 1000, "ms", "6 model copies over raw loopback TCP",
            plain[model_mb]["floor_s"] * 1000,
            note=f"what a program waits for in each sync when it trains between syncs and leaves the CPU to "
            f"the swarm (as on a GPU): every stand-in sleeps {PAUSE_S * 1000:g} ms before each; median of "
            f"every node's sync call, rounds 2..{PAUSED_ROUNDS - 1} (the slowest node's, per round: "
            f"{c['slowest_s'] * 1000:.1f} ms); the program's own part: collect {own['collect'] * 1000:.2f} "
            f"ms, load {own['load'] * 1000:.2f} ms; {c['cpu']}; steps (median ms): {c['steps']}",
        )
    )  # fmt: skip
    return rows


def _note(m: dict[str, Any], rounds: int) -> str:
    return (
        f"median of rounds 2..{rounds} (mean {m['mean_s'] * 1000:.1f} ms); SN, mosquitto, 4 SL + stand-in "
        f"ML; {m['cpu']}; steps (median ms): {m['steps']}"
    )


def main() -> None:
    """Print the rows."""
    bench_parser(__doc__).parse_args()
    print_rows("sync-round latency", run())


if __name__ == "__main__":
    main()
