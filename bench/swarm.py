"""Swarm benchmark: what the swarm costs an ML program, as wall time against the same program alone.

For each model — the mnist-pyt example's CNN (``examples/mnist-pyt/model/mnist_pyt.py``, run unchanged)
and the reference's 784-512-10 MLP (``bench/mlp_pyt.py``: the same program with that model) — 4 nodes
train on 4 private sets (the bundled digits, shifted and noised, 28x28; MNIST cannot be downloaded here):

- alone: the 4 programs with ``SWARM_LOOPBACK=true``, started together;
- swarm: ``swarm sn`` + 4 standalone ``swarm sl`` running the same program, at syncFrequency 128 and 8;
  the SLs ask one fork server to start their programs, as a SWOP's SLs do (``swarmlearning/forkserver.py``:
  torch imported once, so the 4 programs start together; ``--no-fork-server``: each SL starts its own);
- overlapped: the same with ``SWARM_OVERLAP_SYNC=true`` (training goes on while the swarm merges; each
  merge reaches the model one sync later: ``swarmlearning/client/swarm.py``), its accuracy beside it.

Same data, epochs, seed and batch size (32) everywhere; one torch thread per program. The headline is
overhead = mean training time per node under the swarm / the same alone, where a node's training time is the
program's own clock (``seconds`` of its result.json: from ``on_train_begin`` to the end of ``on_train_end``,
so every sync, validation and the wait for the last peer are in it). Time inside sync rounds and in
validation are details in the note, as is the job's span: from the first node's start of training to the
last node's end, which counts the nodes' staggered starts in both runs. This machine is shared: figures move
2-3x between runs.

Run: ``.venv/bin/python bench/swarm.py [--quick | --per-node N --epochs E [--sync-frequency F]...
[--mode blocking|overlapped]...]``; ``make bench`` runs the quick mode (``run()``). On a GPU the programs
train on it (4 on one GPU): ``--per-node 15000 --epochs 10`` is the size of the measurement in issue 13
(MNIST in 4 shards, 10 epochs).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import ROOT, bench_parser, make_row, positive_int, print_rows
from bench.processes import Processes, children_cpu_seconds
from bench.swarm_setup import forked_programs, start_fork_server, start_sl, start_sn
from daemons.sl.roundtimes import parse_steps
from swarmlearning.client.swarm import EXCHANGE_PARTS

NODES = 4
BATCH_SIZE = 32
SYNC_FREQUENCIES = (128, 8)
EXAMPLE = ROOT / "examples" / "mnist-pyt" / "model" / "mnist_pyt.py"
PROGRAMS = {"CNN (mnist-pyt example)": EXAMPLE, "MLP 784-512-10 (reference)": ROOT / "bench" / "mlp_pyt.py"}
MODEL_NAMES = dict(zip(("cnn", "mlp"), PROGRAMS, strict=True))  # --model's names for them
TEST_COUNT = 2000
TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Run:
    """One run of the 4 nodes: their result.json, the wall time, the CPU time of every process in it, and
    (under the swarm) the SLs' round steps: ``{step: mean ms per node and round}`` (``round_steps``)."""

    results: list[dict[str, Any]]
    wall_s: float
    cpu_s: float
    steps: dict[str, float] | None = None
    forked: int | None = None  # under the swarm: how many programs a fork server started


@dataclass(frozen=True)
class Size:
    """How much work each node does."""

    per_node: int
    epochs: int


FULL = Size(per_node=8192, epochs=3)
QUICK = Size(per_node=4096, epochs=2)


def node_data(seed: int, count: int) -> dict[str, np.ndarray]:
    """``count`` 28x28 digit images for one node (the bundled digits, shifted, with noise), and a test set."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    base = np.pad(np.kron(digits.images, np.ones((3, 3))), ((0, 0), (2, 2), (2, 2))) * 255.0 / 16.0

    def draw(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        pick = rng.integers(0, len(base), n)
        shifted = np.stack([np.roll(base[i], tuple(rng.integers(-2, 3, 2)), axis=(0, 1)) for i in pick])
        noisy = np.clip(shifted + rng.normal(0, 12, shifted.shape), 0, 255).astype(np.uint8)
        return noisy, digits.target[pick].astype(np.uint8)

    x_train, y_train = draw(np.random.default_rng(seed), count)
    x_test, y_test = draw(np.random.default_rng(10_000), TEST_COUNT)  # the same test set on every node
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}


def _env(size: Size, sync_frequency: int, node_dir: Path) -> dict[str, str]:
    return {
        "DATA_DIR": str(node_dir / "data"), "SCRATCH_DIR": str(node_dir / "scratch"),
        "MAX_EPOCHS": str(size.epochs), "MIN_PEERS": str(NODES), "SYNC_FREQUENCY": str(sync_frequency),
        "BATCH_SIZE": str(BATCH_SIZE), "SEED": "0", "TORCH_THREADS": "1", "OMP_NUM_THREADS": "1",
        "MNIST_PYT": str(EXAMPLE),
    }  # fmt: skip


def _write_data(work: Path, size: Size) -> list[Path]:
    dirs = []
    for i in range(1, NODES + 1):
        node_dir = work / f"sl-{i}"
        (node_dir / "data").mkdir(parents=True)
        np.savez(node_dir / "data" / "mnist.npz", **node_data(i, size.per_node))  # type: ignore[arg-type]
        dirs.append(node_dir)
    return dirs


def _results(dirs: list[Path], procs: Processes, names: list[str]) -> list[dict[str, Any]]:
    for name in names:
        if procs.started[name].wait(TIMEOUT_S) != 0:
            raise RuntimeError(f"{name} failed:\n{procs.output(name)[-2000:]}")
    return [json.loads((d / "scratch" / "result.json").read_text()) for d in dirs]


def run_alone(work: Path, program: Path, size: Size) -> Run:
    """The 4 programs with SWARM_LOOPBACK=true, started together."""
    dirs = _write_data(work, size)
    cpu = children_cpu_seconds()
    with Processes(work / "logs") as procs:
        start = time.perf_counter()
        for i, node_dir in enumerate(dirs, start=1):
            env = {**_env(size, SYNC_FREQUENCIES[0], node_dir), "SWARM_LOOPBACK": "true"}
            procs.start(f"alone-{i}", [sys.executable, str(program)], env=env, cwd=node_dir)
        results = _results(dirs, procs, [f"alone-{i}" for i in range(1, NODES + 1)])
        wall = time.perf_counter() - start
    return Run(results, wall, children_cpu_seconds() - cpu)


def run_swarm(
    work: Path,
    program: Path,
    size: Size,
    sync_frequency: int,
    *,
    overlap: bool = False,
    fork_server: bool = True,
) -> Run:
    """SN + 4 standalone SLs running ``program``; wall time from the SLs' start, CPU time of all (SN too).
    ``fork_server``: the SLs ask one fork server to start their programs, as a SWOP's SLs do (the
    server's start and torch import are in the wall time and CPU)."""
    dirs = _write_data(work, size)
    envs = [
        {**_env(size, sync_frequency, d), **({"SWARM_OVERLAP_SYNC": "true"} if overlap else {})} for d in dirs
    ]
    cpu = children_cpu_seconds()
    with tempfile.TemporaryDirectory(prefix="swarm-forks-") as sockets, Processes(work / "logs") as procs:
        port = start_sn(procs, work / "sn")
        start = time.perf_counter()
        server = start_fork_server(procs, Path(sockets) / "ml.sock", envs[0]) if fork_server else None
        for node_dir, env in zip(dirs, envs, strict=True):
            start_sl(procs, port, node_dir.name, program=program, work=work, env=env, fork_server=server)
        results = _results(dirs, procs, [d.name for d in dirs])
        wall = time.perf_counter() - start
        forked = forked_programs([procs.output(d.name) for d in dirs]) if fork_server else None
    steps = round_steps([d / "run" / f"{d.name}.log" for d in dirs])
    return Run(results, wall, children_cpu_seconds() - cpu, steps, forked)


def round_steps(logs: list[Path]) -> dict[str, float]:
    """Mean milliseconds of each step of the SLs' sync rounds (not the init round 1), per node and round;
    a step only the leader takes counts 0 on the others."""
    rounds: list[dict[str, float]] = []
    for path in logs:
        for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
            found = parse_steps(line)
            if found is not None and found[0] > 1:
                rounds.append(found[1])
    names = dict.fromkeys(name for steps in rounds for name in steps)
    return {name: float(np.mean([steps.get(name, 0.0) for steps in rounds])) for name in names}


def sync_detail(results: list[dict[str, Any]], steps: dict[str, float] | None) -> str:
    """Where a sync's time goes, in ms per sync: on the ML side (``EXCHANGE_PARTS``) and in the SL."""
    syncs = max(int(results[0]["swarm"].get("syncs", 0)), 1)
    ml = ", ".join(
        f"{part} {_swarm_mean(results, f'sync_{part}') / syncs * 1000:.1f}" for part in EXCHANGE_PARTS
    )
    sl = ", ".join(f"{name} {ms:.1f}" for name, ms in (steps or {}).items())
    return f"per sync (ms): {ml}; SL round steps (ms, mean per node and round): {sl or 'none logged'}"


def _mean(results: list[dict[str, Any]], key: str) -> float:
    return float(np.mean([r[key] for r in results]))


def _swarm_mean(results: list[dict[str, Any]], key: str) -> float:
    return float(np.mean([r["swarm"].get(key, 0.0) for r in results]))


def _loop_outside_swarm(results: list[dict[str, Any]]) -> float:
    """Mean time per node outside every SwarmCallback call (training, the program's own evaluation)."""
    calls = ("begin", "sync", "end", "validation")
    return float(np.mean([r["seconds"] - sum(r["swarm"].get(k, 0.0) for k in calls) for r in results]))


def _span(results: list[dict[str, Any]]) -> float:
    """Seconds from the first node's start of training to the last node's end: the training its user waits
    for (the nodes start staggered in both runs)."""
    return float(max(r["ended_at"] for r in results) - min(r["started_at"] for r in results))


def _span_detail(swarm: Run, alone: list[Run]) -> str:
    ours, solo = _span(swarm.results), float(np.mean([_span(run.results) for run in alone]))
    return f"first start to last end {ours:.1f} s vs {solo:.1f} s alone ({ours / solo:.2f}x)"


def _started_how(swarm: Run) -> str:
    if swarm.forked is None:
        return "the SLs started their programs themselves"
    return f"{swarm.forked} of {NODES} programs forked from one fork server (as a SWOP's SLs start them)"


def overhead_row(
    model: str, sync_frequency: int, size: Size, alone: list[Run], swarm: Run, *, overlap: bool = False
) -> dict[str, Any]:
    """One row: mean training time per node under the swarm against the same program alone.

    ``alone`` holds the runs alone before and after the swarm's; the baseline is their mean.
    """
    ours = swarm.results
    solo = [r for run in alone for r in run.results]
    syncs = int(ours[0]["swarm"]["syncs"])
    in_sync = _swarm_mean(ours, "sync")
    digests = {r["digest"] for r in ours}
    solo_times = " and ".join(f"{_mean(run.results, 'seconds'):.1f}" for run in alone)
    solo_cpu = float(np.mean([run.cpu_s for run in alone]))
    solo_wall = float(np.mean([run.wall_s for run in alone]))
    ours_s, solo_s, outside = _mean(ours, "seconds"), _mean(solo, "seconds"), _loop_outside_swarm(ours)
    calls_only = (ours_s - outside + solo_s) / solo_s  # the calls' share alone, whatever slowed the loop
    target = "ratio <= 1.05" if sync_frequency >= 128 else "ratio <= 1.3"
    note = (
        f"{NODES} nodes x {size.per_node} samples x {size.epochs} epochs, batch {BATCH_SIZE}; alone "
        f"{solo_times} s (before and after); all processes' wall {swarm.wall_s:.1f} s vs {solo_wall:.1f} s "
        f"alone, their CPU {swarm.cpu_s:.0f} s vs {solo_cpu:.0f} s; "
        f"detail per node: {syncs} syncs, {in_sync:.2f} s in sync rounds "
        f"({in_sync / max(syncs, 1) * 1000:.0f} ms each), {_swarm_mean(ours, 'validation'):.2f} s in "
        f"validation, {_swarm_mean(ours, 'begin'):.2f} s in begin, {_swarm_mean(ours, 'end'):.2f} s in end, "
        f"{outside:.1f} s outside SwarmCallback (alone {solo_s:.1f} s), "
        f"so the calls alone make {calls_only:.2f}x; {sync_detail(ours, swarm.steps)}; "
        f"begin: wait {_swarm_mean(ours, 'begin_wait'):.2f} s of it (the init round: the last peer's start); "
        f"{_span_detail(swarm, alone)}; "
        f"accuracy {_mean(ours, 'accuracy'):.3f} (alone {_mean(solo, 'accuracy'):.3f}); identical final "
        f"digests: {len(digests) == 1}; {_started_how(swarm)}"
    )
    how = ", overlapped (SWARM_OVERLAP_SYNC=true)" if overlap else ""
    return make_row(
        f"overhead: {model}, {NODES} nodes, syncFrequency {sync_frequency}{how}",
        ours_s,
        "s training per node",
        "same program alone (SWARM_LOOPBACK=true, 4 at once)",
        solo_s,
        target=target,
        note=note,
    )


def measure(
    size: Size,
    sync_frequencies: tuple[int, ...] = SYNC_FREQUENCIES,
    modes: tuple[bool, ...] = (False, True),
    models: tuple[str, ...] = tuple(PROGRAMS),
    *,
    fork_server: bool = True,
) -> list[dict[str, Any]]:
    """Every model of ``models`` (keys of ``PROGRAMS``): alone, the swarm at each sync frequency in each
    mode (blocking: False, then overlapped: True), alone again (``fork_server``: ``run_swarm``'s)."""
    rows = []
    cases = [(sf, overlap) for overlap in modes for sf in sync_frequencies]
    with tempfile.TemporaryDirectory(prefix="bench-swarm-") as tmp:
        for m, (model, program) in enumerate(PROGRAMS.items()):
            if model not in models:
                continue
            before = run_alone(Path(tmp) / f"{m}-alone", program, size)
            swarms = {
                (sf, overlap): run_swarm(
                    Path(tmp) / f"{m}-sf{sf}{'-overlap' if overlap else ''}",
                    program,
                    size,
                    sf,
                    overlap=overlap,
                    fork_server=fork_server,
                )
                for sf, overlap in cases
            }
            after = run_alone(Path(tmp) / f"{m}-alone-after", program, size)
            for (sf, overlap), swarm in swarms.items():
                rows.append(overhead_row(model, sf, size, [before, after], swarm, overlap=overlap))
            print_rows("swarm overhead (so far)", rows[-len(swarms) :])
    return rows


def merge_rows() -> list[dict[str, Any]]:
    """The mean merge of 8 peers of a 45 MB model vs memcpy (bench/merge.py)."""
    from bench import merge

    rows = [r for r in merge.measure() if r.get("case") == "mean" and r.get("model_mb", 0) > 40]
    return [
        make_row(
            f"mean merge of {merge.PEERS} peers, {row['model_mb']:.0f} MB model",
            row["input_gb_s"],
            "GB/s of input",
            "memcpy (np.copyto)",
            row["memcpy_gb_s"],
            target="ratio >= 0.5",
        )
        for row in rows[:1]
    ]


def run(quick: bool = True) -> list[dict[str, Any]]:
    """The overhead rows (quick for ``make bench``; it has the merge rows from bench/merge.py)."""
    return measure(QUICK if quick else FULL)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="4 x 4,096 samples x 2 epochs (make bench's run) instead of 4 x 8,192 x 3, and no merge rows",
    )
    parser.add_argument(
        "--per-node", type=positive_int, help="samples per node (with --epochs; no merge rows)"
    )
    parser.add_argument("--epochs", type=positive_int, help="epochs (with --per-node)")
    parser.add_argument(
        "--sync-frequency",
        type=positive_int,
        action="append",
        help="only this syncFrequency (repeatable; with --per-node; default: 128 and 8)",
    )
    parser.add_argument(
        "--mode",
        choices=("blocking", "overlapped"),
        action="append",
        help="only syncs of this kind (repeatable; with --per-node; default: both)",
    )
    parser.add_argument(
        "--model",
        choices=tuple(MODEL_NAMES),
        action="append",
        help="only this model (repeatable; with --per-node; default: both)",
    )
    parser.add_argument(
        "--no-fork-server",
        action="store_true",
        help="each SL starts its program itself (a standalone SL without a SWOP's fork server)",
    )
    args = parser.parse_args()
    if (args.per_node is None) != (args.epochs is None):
        parser.error("--per-node and --epochs go together")
    if args.quick and args.per_node is not None:
        parser.error("--quick or --per-node/--epochs, not both")
    if (args.sync_frequency or args.mode or args.model or args.no_fork_server) and args.per_node is None:
        parser.error("--sync-frequency, --mode, --model and --no-fork-server go with --per-node/--epochs")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if args.per_node is not None:
        frequencies = tuple(args.sync_frequency or SYNC_FREQUENCIES)
        modes = tuple(m == "overlapped" for m in args.mode or ("blocking", "overlapped"))
        models = tuple(MODEL_NAMES[name] for name in args.model or MODEL_NAMES)
        size = Size(args.per_node, args.epochs)
        print_rows("swarm", measure(size, frequencies, modes, models, fork_server=not args.no_fork_server))
    else:
        print_rows("swarm", run(args.quick) + ([] if args.quick else merge_rows()))


if __name__ == "__main__":
    main()
