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
while a GPU trains, so the cores are idle when a round starts.

Run: ``.venv/bin/python bench/chain.py [--mb MB] [--rounds R] [--work-s S]``.
"""

from __future__ import annotations

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

__all__ = ["Stamp", "chain", "main", "read_stamps", "report", "trace_rounds"]

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


def read_stamps(directory: Path) -> Events:
    """Every node's stamps from the tracer's files in ``directory``."""
    events: Events = defaultdict(list)
    for path in sorted(directory.glob("*.txt")):
        node = path.stem.rsplit("-", 1)[0]
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


def chain(events: Events) -> list[Stamp]:
    """The median of every stamp by kind of round and role (see the module's docstring)."""
    spans = {node: _requests(stamps) for node, stamps in events.items()}
    count = min((len(s) for s in spans.values()), default=0)
    found: defaultdict[tuple[str, str, str], list[float]] = defaultdict(list)
    kinds: Counter[str] = Counter()
    for number in range(_SKIP, count - _SKIP):
        kind = _one_round(events, {node: s[number] for node, s in spans.items()}, found)
        if kind is not None:
            kinds[kind] += 1
    stamps = [
        Stamp(kind, role, label, statistics.median(times), kinds[kind])
        for (kind, role, label), times in found.items()
        if len(times) * 2 >= kinds[kind]  # in most rounds of its kind
    ]
    return sorted(stamps, key=lambda s: (s.kind, s.median_ms))


def _one_round(
    events: Events, window: dict[str, tuple[int, int]], found: defaultdict[tuple[str, str, str], list[float]]
) -> str | None:
    """Add one round's stamps (each node's request ``window``) to ``found``; its kind, or None when it
    did not go on early (no single leader merged early in it)."""
    last = max(window, key=lambda node: window[node][0])
    zero = window[last][0]
    leaders = [
        node
        for node, (start, end) in window.items()
        if any(label == "merge_early+" and start <= ns <= end for ns, label in events[node])
    ]
    if len(leaders) != 1:
        return None
    leader = leaders[0]
    kind = "leader last" if leader == last else "participant last"
    earliest = min(start for start, _ in window.values())
    latest = max(end for _, end in window.values())
    for node, (start, end) in window.items():
        role = "leader" if node == leader else "last" if node == last else "other"
        # a leader takes the rows and hands the merge over outside its own request
        lo, hi = (earliest, latest) if role == "leader" else (start, end)
        seen: Counter[str] = Counter()
        for ns, label in events[node]:
            if lo <= ns <= hi:
                seen[label] += 1
                found[(kind, role, f"{label}#{seen[label]}")].append((ns - zero) / 1e6)
    first = min(end for _, end in window.values())
    found[(kind, "all", "first program answered")].append((first - zero) / 1e6)
    found[(kind, "all", "last program answered")].append((latest - zero) / 1e6)
    return kind


def report(stamps: list[Stamp]) -> str:
    """The stamps as one table per kind of round."""
    lines = []
    for kind in dict.fromkeys(s.kind for s in stamps):
        rounds = next(s.rounds for s in stamps if s.kind == kind)
        lines.append(f"rounds with the {kind} ({rounds}); ms from the last request reaching its SL:")
        lines += [f"  {s.median_ms:8.2f}  {s.role:7s} {s.label}" for s in stamps if s.kind == kind]
    return "\n".join(lines)


def trace_rounds(mb: float, rounds: int, work_s: float) -> Events:
    """Run ``rounds`` sync rounds of a ``mb`` MB model with the tracer on the SLs; their stamps."""
    from bench.rounds import swarm_rounds  # the daemons' imports, once a command line was checked

    with tempfile.TemporaryDirectory(prefix="chain-") as scratch:
        traces = Path(scratch) / "traces"
        traces.mkdir()
        path = os.pathsep.join(filter(None, [str(TRACER), os.environ.get("PYTHONPATH")]))
        # the daemons swarm_rounds starts inherit this environment; ours is as it was afterwards
        with mock.patch.dict(os.environ, SWARM_CHAIN_TRACE_DIR=str(traces), PYTHONPATH=path):
            swarm_rounds(Path(scratch) / "w", PEERS, int(mb * 1e6), rounds, work_s=work_s)
        return read_stamps(traces)


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--mb", type=float, default=1.6, help="model size in MB (default 1.6)")
    parser.add_argument("--rounds", type=positive_int, default=150, help="sync rounds (default 150)")
    parser.add_argument("--work-s", type=float, default=0.1, help="pretend training before each sync, s")
    args = parser.parse_args(argv)
    if args.mb <= 0 or args.work_s < 0 or args.rounds <= 2 * _SKIP:
        parser.error(f"--mb must be above 0, --work-s not below 0 and --rounds above {2 * _SKIP}")
    stamps = chain(trace_rounds(args.mb, args.rounds, args.work_s))
    size = f"{PEERS} peers, {args.mb:g} MB, {args.work_s:g} s of training, {args.rounds} rounds"
    print(f"chain of a sync round: {size}")
    print(report(stamps) if stamps else "no round went on early: nothing to show")


if __name__ == "__main__":
    main()
