"""The chain of a sync round: when each SL did each step, from the moment the last program's request
reached its SL, by role (the leader, the last node to ask, the others).

A diagnostic, not a benchmark with a baseline: it runs ``bench.rounds.swarm_rounds`` (an SN with its
mosquitto, 4 SLs with the stand-in ML program) with ``bench/chaintrace`` on the SLs' ``PYTHONPATH``,
whose ``sitecustomize`` stamps ``CLOCK_MONOTONIC`` at the start (+) and end (-) of the coroutines a
round runs through (its ``TRACED``: the program's request, the hash, the push to the predicted leader,
the leader taking a pushed row, merging and handing the merge over, the participants' fetch of it, the
answer to the program). For every round but the first and last two it takes the moment the last request
reached its SL as 0, finds the leader (the SL whose early merge ran in the round), and prints the median
of every stamp by role, apart for the rounds whose last request was the leader's own. Only rounds that
went on early (the usual ones) are counted. With ``--work-s`` the programs sleep before each sync, as
while a GPU trains, so the cores are idle when a round starts. With ``--sched`` it also records every
context switch of the machine (``bench/sched.py``: ``perf sched``, as root) and adds up the CPU each
kind of process ran in two parts of a round: from the last request to the leader's merge, and from
the merge to the last program's answer (the hand-over).

Run: ``.venv/bin/python bench/chain.py [--mb MB] [--rounds R] [--work-s S] [--sched]``.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import statistics
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_parser, positive_int
from bench.sched import SchedError, Slice, Timeline, recording
from wire.workers import cores

__all__ = [
    "Round", "Stamp", "Traced", "chain", "cpu_by_role", "cpu_report", "main", "merged_at", "read_pids",
    "read_stamps", "report", "rounds", "trace_rounds",
]  # fmt: skip

TRACER = Path(__file__).resolve().parent / "chaintrace"
PEERS = 4
_SKIP = 2  # rounds left out at each end: the init round, the first prediction, the final round
Events = dict[str, list[tuple[int, str]]]  # node -> [(ns, "label+" or "label-")], in time order


@dataclass(frozen=True)
class Stamp:
    """The median time of one stamp of one role, ms from the last request, over the rounds of its kind
    (of the two nodes that are neither the leader nor the last, for role "other")."""

    kind: str  # "participant last" or "leader last"
    role: str  # "leader", "last", "other" or "all"
    label: str  # e.g. "take-#3": the third end of a pushed row's copy in the round
    median_ms: float
    rounds: int  # rounds of its kind


def _trace_files(directory: Path) -> list[tuple[Path, str, int]]:
    """The tracer's files in ``directory`` (``<node>-<pid>.txt``), with their node and process id."""
    files = []
    for path in sorted(directory.glob("*.txt")):
        node, _, pid = path.stem.rpartition("-")
        if node and pid.isdigit():
            files.append((path, node, int(pid)))
    return files


def read_pids(directory: Path) -> dict[int, str]:
    """The process id of every node that wrote a file of stamps in ``directory``."""
    return {pid: node for _, node, pid in _trace_files(directory)}


def read_stamps(directory: Path) -> Events:
    """Every node's stamps from the tracer's files in ``directory``."""
    events: Events = defaultdict(list)
    for path, node, _ in _trace_files(directory):
        for line in path.read_text().splitlines():
            ns, _, label = line.partition(" ")
            if label:
                events[node].append((int(ns), label))
    for stamps in events.values():
        stamps.sort()
    return dict(events)


def _requests(stamps: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """(start, end) of each of a node's requests, in order."""
    spans, start = [], None
    for ns, label in stamps:
        if label == "request+":
            start = ns
        elif label == "request-" and start is not None:
            spans.append((start, ns))
            start = None
    return spans


def _between(stamps: list[tuple[int, str]], lo: int, hi: int) -> list[tuple[int, str]]:
    """A node's stamps from ``lo`` to ``hi`` ns, both included (they are in time order)."""
    return stamps[bisect.bisect_left(stamps, lo, key=_time) : bisect.bisect_right(stamps, hi, key=_time)]


def _time(stamp: tuple[int, str]) -> int:
    return stamp[0]


@dataclass(frozen=True)
class Round:
    """One round that went on early: every node's request (start, end ns), who led it, who asked last."""

    requests: dict[str, tuple[int, int]]
    leader: str
    last: str

    @property
    def kind(self) -> str:
        """ "leader last" or "participant last"."""
        return "leader last" if self.leader == self.last else "participant last"

    @property
    def zero(self) -> int:
        """When the last request reached its SL."""
        return self.requests[self.last][0]

    @property
    def span(self) -> tuple[int, int]:
        """From the first request to the last answer."""
        return min(a for a, _ in self.requests.values()), max(b for _, b in self.requests.values())

    def role(self, node: str) -> str:
        """ "leader", "last" or "other"."""
        return "leader" if node == self.leader else "last" if node == self.last else "other"


def rounds(events: Events) -> list[Round]:
    """The rounds that went on early (a single SL merged early in them), but the first and last two."""
    spans = {node: _requests(stamps) for node, stamps in events.items()}
    count = min((len(s) for s in spans.values()), default=0)
    found = []
    for number in range(_SKIP, count - _SKIP):
        requests = {node: s[number] for node, s in spans.items()}
        leaders = [
            node
            for node, (start, end) in requests.items()
            if any(label == "merge_early+" for _, label in _between(events[node], start, end))
        ]
        if len(leaders) == 1:
            last = max(requests, key=lambda node: requests[node][0])
            found.append(Round(requests, leaders[0], last))
    return found


def merged_at(events: Events, rnd: Round) -> int | None:
    """When the leader of ``rnd`` had its early merge (its ``merge_early-``), if it stamped one."""
    lo, hi = rnd.span
    return next((ns for ns, label in _between(events[rnd.leader], lo, hi) if label == "merge_early-"), None)


def chain(events: Events) -> list[Stamp]:
    """The median of every stamp by kind of round and role (see the module's docstring)."""
    found: defaultdict[tuple[str, str, str], list[float]] = defaultdict(list)
    kinds: Counter[str] = Counter()
    for rnd in rounds(events):
        kinds[rnd.kind] += 1
        _add_stamps(events, rnd, found)
    stamps = [
        Stamp(kind, role, label, statistics.median(times), kinds[kind])
        for (kind, role, label), times in found.items()
        if len(times) * 2 >= kinds[kind]  # in most rounds of its kind
    ]
    return sorted(stamps, key=lambda s: (s.kind, s.median_ms))


def _add_stamps(events: Events, rnd: Round, found: defaultdict[tuple[str, str, str], list[float]]) -> None:
    earliest, latest = rnd.span
    for node, (start, end) in rnd.requests.items():
        role = rnd.role(node)
        # a leader takes the rows and hands the merge over outside its own request
        lo, hi = (earliest, latest) if role == "leader" else (start, end)
        seen: Counter[str] = Counter()
        for ns, label in _between(events[node], lo, hi):
            seen[label] += 1
            found[(rnd.kind, role, f"{label}#{seen[label]}")].append((ns - rnd.zero) / 1e6)
    first = min(end for _, end in rnd.requests.values())
    found[(rnd.kind, "all", "first program answered")].append((first - rnd.zero) / 1e6)
    found[(rnd.kind, "all", "last program answered")].append((latest - rnd.zero) / 1e6)


def report(stamps: list[Stamp]) -> str:
    """The stamps as one table per kind of round."""
    lines = []
    for kind in dict.fromkeys(s.kind for s in stamps):
        count = next(s.rounds for s in stamps if s.kind == kind)
        lines.append(f"rounds with the {kind} ({count}); ms from the last request reaching its SL:")
        lines += [f"  {s.median_ms:8.2f}  {s.role:7s} {s.label}" for s in stamps if s.kind == kind]
    return "\n".join(lines)


@dataclass(frozen=True)
class Traced:
    """A traced run: the SLs' stamps and process ids, and, when recorded, every context switch."""

    events: Events
    pids: dict[int, str]
    slices: list[Slice] | None = None


def trace_rounds(mb: float, rounds: int, work_s: float, *, sched: bool = False) -> Traced:
    """Run ``rounds`` sync rounds of a ``mb`` MB model with the tracer on the SLs (and with ``sched``,
    ``perf sched`` recording the machine: SchedError when it cannot)."""
    from bench.rounds import swarm_rounds  # the daemons' imports, once a command line was checked

    with tempfile.TemporaryDirectory(prefix="chain-") as scratch:
        traces = Path(scratch) / "traces"
        traces.mkdir()
        path = os.pathsep.join(filter(None, [str(TRACER), os.environ.get("PYTHONPATH")]))
        # the daemons swarm_rounds starts inherit this environment; ours is as it was afterwards
        with (
            mock.patch.dict(os.environ, SWARM_CHAIN_TRACE_DIR=str(traces), PYTHONPATH=path),
            recording(Path(scratch)) if sched else contextlib.nullcontext(None) as slices,
        ):
            swarm_rounds(Path(scratch) / "w", PEERS, int(mb * 1e6), rounds, work_s=work_s)
        return Traced(read_stamps(traces), read_pids(traces), slices)


def cpu_by_role(traced: Traced, own_pid: int) -> list[tuple[str, str, str, float]]:
    """(kind of round, part, role, mean ms of CPU a round) of every process that ran in the two parts
    of a round: from the last request to the leader's merge, and from the merge to the last answer."""
    assert traced.slices is not None
    comms = {piece.pid: piece.comm for piece in traced.slices}
    sums: defaultdict[tuple[str, str, str], float] = defaultdict(float)
    kinds: Counter[str] = Counter()
    lo, hi = min(p.start for p in traced.slices), max(p.end for p in traced.slices)
    timeline = Timeline(traced.slices)
    for rnd in rounds(traced.events):
        merged = merged_at(traced.events, rnd)
        if merged is None or not lo <= rnd.zero < rnd.span[1] <= hi:
            continue  # no early merge stamped, or not all of it recorded
        kinds[rnd.kind] += 1
        for part, (start, end) in (
            ("to the merge", (rnd.zero, merged)),
            ("the hand-over", (merged, rnd.span[1])),
        ):
            for pid, ms in timeline.cpu_in(start, end).items():
                node = traced.pids.get(pid)
                role = _process_role(rnd, node, comms.get(pid, ""), pid == own_pid)
                sums[(rnd.kind, part, role)] += ms
            sums[(rnd.kind, part, "window x cores")] += (end - start) / 1e6 * cores()
    return [(kind, part, role, total / kinds[kind]) for (kind, part, role), total in sums.items()]


def _process_role(rnd: Round, node: str | None, comm: str, ours: bool) -> str:
    if node is not None:
        return {"leader": "leader SL", "last": "last SL", "other": "other SLs"}[rnd.role(node)]
    if comm == "mosquitto":
        return "mosquitto"
    if comm == "swarm":
        return "SN"
    if comm.startswith("python") and not ours:
        return "programs"
    return "kernel and the rest"


def cpu_report(rows: list[tuple[str, str, str, float]]) -> str:
    """``cpu_by_role`` as one table per kind of round."""
    lines = []
    for kind in sorted({r[0] for r in rows}):
        got = {(part, role): ms for k, part, role, ms in rows if k == kind}
        roles = sorted(
            {role for _, role in got if role != "window x cores"},
            key=lambda r: -got.get(("the hand-over", r), 0),
        )
        lines.append(f"CPU ms a round, all cores (perf sched), rounds with the {kind}:")
        lines.append(f"  {'':20s} {'to the merge':>14s} {'the hand-over':>14s}")
        for role in [*roles, "window x cores"]:
            cells = [f"{got.get((part, role), 0.0):14.2f}" for part in ("to the merge", "the hand-over")]
            lines.append(f"  {role:20s} {' '.join(cells)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--mb", type=float, default=1.6, help="model size in MB (default 1.6)")
    parser.add_argument("--rounds", type=positive_int, default=150, help="sync rounds (default 150)")
    parser.add_argument("--work-s", type=float, default=0.1, help="pretend training before each sync, s")
    parser.add_argument("--sched", action="store_true", help="also which process had the cores (perf sched)")
    args = parser.parse_args(argv)
    if args.mb <= 0 or args.work_s < 0 or args.rounds <= 2 * _SKIP:
        parser.error(f"--mb must be above 0, --work-s not below 0 and --rounds above {2 * _SKIP}")
    try:
        traced = trace_rounds(args.mb, args.rounds, args.work_s, sched=args.sched)
    except SchedError as exc:
        raise SystemExit(f"bench/chain.py: --sched: {exc}") from None
    stamps = chain(traced.events)
    size = f"{PEERS} peers, {args.mb:g} MB, {args.work_s:g} s of training, {args.rounds} rounds"
    print(f"chain of a sync round: {size}")
    print(report(stamps) if stamps else "no round went on early: nothing to show")
    if traced.slices is not None:
        print(cpu_report(cpu_by_role(traced, os.getpid())))


if __name__ == "__main__":
    main()
