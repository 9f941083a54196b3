"""Side by side: the sync rounds of two versions of the code, run in turns in one run.

This machine's speed moves 2-3x with load from other work, so a change to the round is judged against
the code before it, the two run back to back in turns, the order swapped every pair (BASE, NEW, NEW,
BASE, BASE, NEW, ...: the first run of a session, often the slowest, and a drift of the machine's speed
fall on both sides alike). Each run is
``bench.rounds.swarm_rounds`` (an SN with its mosquitto, 4 SLs with the stand-in ML program) in a process
whose ``PYTHONPATH`` puts the version's tree first, so that the daemons and programs it starts import that
version; the harness is this tree's for both, so both are measured the same way. A revision other than
``.`` (the working tree) is unpacked with ``git archive`` into a temporary directory.

Each run prints its median and mean round, its median sync call (every node's ``on_batch_end`` that syncs:
with ``--work-s`` what a program waits for, where the round holds the pretend training too) and the CPU a
round took by kind of process (``bench.rounds``);
at the end come each side's means, NEW / BASE, the range of the pairs' ratios and the 95 % interval of the
typical ratio (Student's t on the ratios' logarithms): a difference is "shown" only when that interval
leaves out 1. On a 2-core machine single pairs of 300 rounds moved by 10 % either way (2026-12-02): the
four pairs of one run all fell below 1 and said 0.91, and a run of six pairs of the same change 0.98; another
change read 1.10 with four pairs all above 1, then 0.94 with six all below. The pairs of one run are not
quite independent, so a change of the round under about 5 % needs several runs of 6 pairs or more there.

Run: ``.venv/bin/python bench/compare.py BASE [NEW] [--pairs N] [--mb MB] [--rounds R] [--work-s S]
[--certified]`` (NEW defaults to ``.``; ``--certified``: every node with its certificate, as the third row
of ``bench/rounds.py``), e.g. ``bench/compare.py HEAD~1 --pairs 4 --rounds 1000``.
"""

from __future__ import annotations

import io
import json
import math
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, bench_parser, positive_int

__all__ = [
    "Measured", "env_for", "measure", "ratio_interval", "ratios", "run_order", "summary", "unpack", "verdict"
]  # fmt: skip

WORKING_TREE = "."
_NOT_SAMPLED = "not sampled (the run was too short)"
# Student's t for a two-sided 95 % interval, by degrees of freedom (pairs - 1); 2.0 above 30
_T95 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
    11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
    20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
    29: 2.045, 30: 2.042,
}  # fmt: skip
_T95_LARGE = 2.0
_FIGURES = (
    ("median_ms", "median round"), ("mean_ms", "mean round"), ("sync_ms", "median sync call"),
    ("cpu_total_ms", "CPU a round"),
)  # fmt: skip
_ONE_RUN = """
import json, statistics, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from bench.rounds import PEERS, round_latency, round_mean, swarm_rounds
args = json.loads(sys.argv[2])
with tempfile.TemporaryDirectory(prefix="compare-") as ws:
    run = swarm_rounds(Path(ws) / "w", PEERS, int(args["mb"] * 1e6), args["rounds"], work_s=args["work_s"],
                       certified=args["certified"])
cpu = {kind: seconds * 1e3 for kind, seconds in (run.cpu_by_kind or {}).items()}
calls = [s for node in run.nodes for s in node["sync_s"][1:-1]]
print(json.dumps({"median_ms": round_latency(run.nodes) * 1e3, "mean_ms": round_mean(run.nodes) * 1e3,
                  "sync_ms": statistics.median(calls) * 1e3 if calls else None, "cpu_ms": cpu}))
"""


@dataclass(frozen=True)
class Measured:
    """One run of one version: its median and mean round, its median sync call (every node's, rounds
    2..R-1: with ``--work-s`` the round holds the pretend training, the sync call only what the program
    waits for) and its CPU per round by kind of process, ms."""

    version: str
    median_ms: float
    mean_ms: float
    cpu_ms: dict[str, float]
    sync_ms: float = math.nan

    @property
    def cpu_total_ms(self) -> float:
        """The CPU of a round, every process together."""
        return sum(self.cpu_ms.values())

    def line(self) -> str:
        """One line for the run's table."""
        kinds = ", ".join(f"{kind} {ms:.1f}" for kind, ms in sorted(self.cpu_ms.items()))
        cpu = f"CPU {self.cpu_total_ms:6.1f} ms: {kinds}" if self.cpu_ms else f"CPU {_NOT_SAMPLED}"
        sync = "" if math.isnan(self.sync_ms) else f", sync call {self.sync_ms:6.2f}"
        return f"{self.version:>12}  round {self.median_ms:6.2f} ms (mean {self.mean_ms:6.2f}{sync})  {cpu}"


def unpack(revision: str, into: Path) -> Path:
    """The source tree of ``revision``: this one for ``.``, a directory that holds one (a tree unpacked
    before, as on a machine without this checkout's history), else its ``git archive`` under ``into``.

    Raises:
        SystemExit: the revision is not one git knows here.
    """
    if revision == WORKING_TREE:
        return ROOT
    given = Path(revision)
    if (given / "daemons" / "sl" / "rounds.py").is_file() and (given / "bench" / "rounds.py").is_file():
        return given.resolve()
    done = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", revision], capture_output=True, check=False
    )
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip() or f"git exited with {done.returncode}"
        raise SystemExit(f"bench/compare.py: cannot unpack {revision!r}: {why}")
    tree = into / f"tree-{len(list(into.iterdir()))}"
    tree.mkdir()
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
        archive.extractall(tree, filter="data")
    return tree


def measure(
    version: str, tree: Path, *, mb: float, rounds: int, work_s: float, certified: bool = False
) -> Measured:
    """One ``swarm_rounds`` run of the code in ``tree`` (``certified``: every node with its certificate);
    RuntimeError with its output when it fails."""
    args = json.dumps({"mb": mb, "rounds": rounds, "work_s": work_s, "certified": certified})
    done = subprocess.run(
        [sys.executable, "-c", _ONE_RUN, str(ROOT), args], capture_output=True, env=env_for(tree), check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"the run of {version} failed:\n{done.stderr.decode(errors='replace')[-3000:]}")
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    sync = result.get("sync_ms")
    return Measured(
        version, result["median_ms"], result["mean_ms"], dict(result["cpu_ms"]),
        math.nan if sync is None else float(sync),
    )  # fmt: skip


def run_order(pair: int) -> tuple[str, str]:
    """Which side runs first in pair ``pair`` (0-based): BASE in the even pairs, NEW in the odd ones."""
    return ("base", "new") if pair % 2 == 0 else ("new", "base")


def env_for(tree: Path) -> dict[str, str]:
    """Our environment with ``tree`` first on ``PYTHONPATH``: the processes started with it (and theirs)
    import that tree's packages, ahead of this checkout's editable install."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])),
    }


def _values(pairs: list[tuple[Measured, Measured]], figure: str) -> list[tuple[float, float]]:
    """``figure`` (``median_ms``, ``mean_ms``, ``sync_ms`` or ``cpu_total_ms``) of BASE and NEW in each pair
    that has it on both sides (a run too short for its CPU to be sampled has none)."""
    return _on_both_sides(pairs, lambda run: float(getattr(run, figure)))


def _cpu_values(pairs: list[tuple[Measured, Measured]], kind: str) -> list[tuple[float, float]]:
    """The CPU of ``kind`` of process in BASE and NEW in each pair that has it on both sides."""
    return _on_both_sides(pairs, lambda run: run.cpu_ms.get(kind, 0.0))


def _on_both_sides(
    pairs: list[tuple[Measured, Measured]], value: Callable[[Measured], float]
) -> list[tuple[float, float]]:
    values = [(value(base), value(new)) for base, new in pairs]
    return [(base, new) for base, new in values if base > 0 and new > 0]


def ratios(pairs: list[tuple[Measured, Measured]], figure: str) -> list[float]:
    """NEW / BASE of ``figure`` for each pair that has it on both sides."""
    return [new / base for base, new in _values(pairs, figure)]


def ratio_interval(spread: list[float]) -> tuple[float, float] | None:
    """The 95 % interval of the typical NEW / BASE ratio from the pairs' ratios (Student's t on their
    logarithms, so that 0.9 and 1/0.9 weigh alike); None below 2 pairs."""
    if len(spread) < 2:
        return None
    logs = [math.log(r) for r in spread]
    centre = statistics.mean(logs)
    half = _T95.get(len(logs) - 1, _T95_LARGE) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(centre - half), math.exp(centre + half)


def verdict(spread: list[float]) -> str:
    """Whether the pairs show a difference: their 95 % interval, and "shown" only when it leaves out 1."""
    interval = ratio_interval(spread)
    if interval is None:
        return "one pair: no interval"
    low, high = interval
    shown = "shown" if high < 1.0 or low > 1.0 else "not shown"
    return f"95 % interval {low:.3f}-{high:.3f}: {shown}"


def summary(pairs: list[tuple[Measured, Measured]]) -> list[str]:
    """For each figure: each side's mean, NEW / BASE of the means, the range of the pairs' ratios and
    whether they show a difference (``verdict``)."""
    lines = []
    for figure, label in _FIGURES:
        values = _values(pairs, figure)
        if not values:
            lines.append(f"{label:>16}: {_NOT_SAMPLED}")
            continue
        spread = ratios(pairs, figure)
        base = statistics.mean(b for b, _ in values)
        new = statistics.mean(n for _, n in values)
        lines.append(
            f"{label:>16}: base {base:6.2f} ms, new {new:6.2f} ms, new / base {new / base:.3f} "
            f"(pairs {min(spread):.3f}-{max(spread):.3f}; {verdict(spread)})"
        )
    kinds = sorted({kind for b, n in pairs for kind in (*b.cpu_ms, *n.cpu_ms)})
    for kind in kinds:
        values = _cpu_values(pairs, kind)
        if not values:  # a run too short to sample; a mean with its 0 in it would read as a change
            lines.append(f"{'CPU ' + kind:>16}: {_NOT_SAMPLED}")
            continue
        base = statistics.mean(b for b, _ in values)
        new = statistics.mean(n for _, n in values)
        spread = [n / b for b, n in values]
        shown = f" ({verdict(spread)})" if len(spread) > 1 else ""
        lines.append(f"{'CPU ' + kind:>16}: base {base:6.2f} ms, new {new:6.2f} ms{shown}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument(
        "base", help="git revision to compare against ('.' for the working tree, or a directory with a tree)"
    )
    parser.add_argument(
        "new", nargs="?", default=WORKING_TREE, help="git revision, directory or '.' (default: '.')"
    )
    parser.add_argument("--pairs", type=positive_int, default=3, help="BASE and NEW runs (default 3)")
    parser.add_argument("--mb", type=float, default=1.6, help="model size in MB (default 1.6)")
    parser.add_argument("--rounds", type=positive_int, default=300, help="sync rounds a run (default 300)")
    parser.add_argument("--work-s", type=float, default=0.0, help="pretend training before each sync, s")
    parser.add_argument(
        "--certified", action="store_true", help="every node with its certificate (mutual TLS, signatures)"
    )
    args = parser.parse_args(argv)
    if args.mb <= 0 or args.work_s < 0:
        parser.error("--mb must be above 0 and --work-s not below 0")
    with tempfile.TemporaryDirectory(prefix="compare-trees-") as scratch:
        trees = {name: unpack(name, Path(scratch)) for name in dict.fromkeys((args.base, args.new))}
        pairs_text = f"{args.pairs} pair" + ("s" if args.pairs > 1 else "")
        certified = ", with certificates" if args.certified else ""
        training = f"{args.work_s:g} s of training{certified}"
        print(f"{pairs_text} of {args.rounds} rounds, {args.mb:g} MB, {training}")
        pairs = []
        for number in range(args.pairs):
            runs: dict[str, Measured] = {}
            for side in run_order(number):
                name = args.base if side == "base" else args.new
                try:
                    measured = measure(
                        name, trees[name], mb=args.mb, rounds=args.rounds, work_s=args.work_s,
                        certified=args.certified,
                    )  # fmt: skip
                except RuntimeError as exc:
                    raise SystemExit(f"bench/compare.py: {exc}") from None
                print(measured.line(), flush=True)
                runs[side] = measured
            pairs.append((runs["base"], runs["new"]))
    print("\n".join(summary(pairs)))


if __name__ == "__main__":
    main()
