"""Our swarm against Flower on the same job: wall time to finish, time per round, final test accuracy.

The job: the mnist-pyt example's CNN (``Net``) on 4 private shards of ``PER_NODE`` 28x28 digits
(scikit-learn's digits, shifted and noised: ``bench.swarm.node_data``; MNIST cannot be downloaded here),
``ROUNDS`` rounds of ``LOCAL_EPOCHS`` whole local epochs in batches of 32 per node, Adam (lr 1e-3, fresh
each round on both sides), one torch thread per training process, CPU, loopback; the final model is
tested on the same 2,000 digits on both sides after the same number of merges (one per round).

- Flower (its own venv, ``bench/.flower-venv``, with this project's torch through a ``.pth`` file):
  the deployment engine, ``flower-superlink`` and 4 ``flower-supernode`` processes, ``flwr run`` of the
  Flower App in ``bench/flower`` (FedAvg weighted by examples; the final model tested by the ServerApp).
- Ours: ``swarm sn`` (with mosquitto), ``swarm swop`` with a 4-node profile, the RUN_SWARM task submitted
  on the ledger as ``swci`` does, 4 SL+ML pairs running ``bench/flower/fedbench/swarm_ml.py``
  (SwarmCallback, syncFrequency = the batches of a round, mean merge weighted by samples). The SWOP's
  fork server imports torch once and each program is a fork of it (``swarmlearning/forkserver.py``).

- Alone: the same 4 programs with ``SWARM_LOOPBACK=true`` (no SN, no SLs, no merges), started together
  as a user would start them, each importing torch: the programs' own time, which ours would add to
  were it not for the fork server; the Flower row's note gives it as a share of Flower's time.

All clocks start before the first process starts and stop when the final model has been tested.
Run: ``.venv/bin/python bench/flower_compare.py [rounds] [local_epochs]``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, bench_parser, make_row, positive_int, print_rows
from bench.processes import Processes
from bench.swarm import node_data
from bench.swarm_setup import (
    SwarmNode,
    ledger_session,
    register_task,
    run_task,
    start_sn,
    start_swop,
    wait_enrolled,
    wait_sn,
    write_profile,
    write_run_task,
)
from daemons.broker import free_port

__all__ = ["ensure_flower_env", "run"]

BENCH = ROOT / "bench"
FLOWER_VENV = BENCH / ".flower-venv"
FLOWER_APP = BENCH / "flower"
SWARM_PROGRAM = FLOWER_APP / "fedbench" / "swarm_ml.py"
EXAMPLE = ROOT / "examples" / "mnist-pyt"
FLWR_VERSION = "1.41.0"  # the newest that installs here (1.42.0 needs a certifi release PyPI lacks)
NODES = 4
PER_NODE = 4096  # 128 batches of 32: an epoch is real work next to Flower's per-round process start
ROUNDS = 5
LOCAL_EPOCHS = 1
BATCH_SIZE = 32
FLOWER_TIMEOUT_S = 480.0
SWARM_TIMEOUT_S = 480.0


@dataclass(frozen=True)
class Outcome:
    """One side's result."""

    wall_s: float
    round_s: float
    first_round_s: float
    accuracy: float
    extra: dict[str, Any]


# ------------------------------------------------------------------------------------ environment
def _quiet(argv: list[str]) -> str:
    """Run ``argv``; its output, or RuntimeError with the end of it."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout


def ensure_flower_env() -> Path:
    """``bench/.flower-venv`` with flwr (from PyPI) and this project's torch (via a .pth, never reinstalled).

    Made once (about 30 s); torch, numpy's build and this project come from ``.venv``'s site-packages,
    which a ``.pth`` file adds after the venv's own, so pip never sees nor fetches torch.
    """
    python = FLOWER_VENV / "bin" / "python"
    marker = FLOWER_VENV / f".flwr-{FLWR_VERSION}"
    ours = sysconfig.get_paths()["purelib"]  # .venv's site-packages: torch, and this project
    if not marker.exists() or marker.read_text() != ours:
        shutil.rmtree(FLOWER_VENV, ignore_errors=True)
        _quiet([sys.executable, "-m", "venv", str(FLOWER_VENV)])
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        _quiet([*pip, f"flwr=={FLWR_VERSION}"])
        code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        purelib = Path(_quiet([str(python), "-c", code]).strip())
        (purelib / "zz_open_swarm_torch.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
        _quiet([str(python), "-c", "import torch, flwr, swarmlearning"])
        marker.write_text(ours)
    return FLOWER_VENV / "bin"


def write_shards(ws: Path) -> list[Path]:
    """4 private shards of ``PER_NODE`` digits with the same test set, as ``mnist.npz`` where the example
    keeps its data (``user<i>/data-and-scratch/app-data``)."""
    shards = []
    for i in range(1, NODES + 1):
        shard = ws / f"user{i}" / "data-and-scratch" / "app-data"
        shard.mkdir(parents=True)
        np.savez(shard / "mnist.npz", **node_data(i, PER_NODE))  # type: ignore[arg-type]
        shards.append(shard)
    return shards


# ----------------------------------------------------------------------------------------- Flower
def _wait_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing listens on port {port} after {timeout:g} s")
        time.sleep(0.02)


def _wait_file(path: Path, procs: Processes, watched: list[str], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not path.exists():
        dead = [n for n in watched if n in procs.started and procs.started[n].poll() is not None]
        if (dead and not path.exists()) or time.monotonic() > deadline:
            why = f"{dead[0]} exited" if dead else f"no result after {timeout:g} s"
            tail = procs.output(dead[0] if dead else watched[0])[-3000:]
            raise RuntimeError(f"{why}:\n{tail}")
        time.sleep(0.05)
    return dict(json.loads(path.read_text()))


def _flower_env(bin_dir: Path, home: Path) -> dict[str, str]:
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_HOME": str(home),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }


def _run_config(shards: list[Path], result: Path, rounds: int, epochs: int) -> str:
    values = {
        "num-rounds": rounds,
        "num-nodes": NODES,
        "local-epochs": epochs,
        "batch-size": BATCH_SIZE,
        "example": json.dumps(str(EXAMPLE / "model" / "mnist_pyt.py")),
        "test-data-dir": json.dumps(str(shards[0])),
        "result-file": json.dumps(str(result)),
    }
    return " ".join(f"{k}={v}" for k, v in values.items())


def run_flower(ws: Path, shards: list[Path], rounds: int, epochs: int) -> Outcome:
    """Flower's deployment engine on loopback: SuperLink, 4 SuperNodes, ``flwr run``."""
    bin_dir = ensure_flower_env()
    home, port, result = ws / "flwr-home", free_port(), ws / "flower-result.json"
    home.mkdir(parents=True)
    connection = f'[superlink.bench]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    (home / "config.toml").write_text(f'[superlink]\ndefault = "bench"\n\n{connection}')
    env = _flower_env(bin_dir, home)
    with Processes(ws / "flower-logs") as procs:
        start = time.time()
        link = [str(bin_dir / "flower-superlink"), "--insecure", "--disable-runtime-dependency-installation"]
        procs.start("superlink", [*link, "--port", str(port)], env=env)
        _wait_port(port)
        for i, shard in enumerate(shards):
            config = f'partition-id={i} num-partitions={NODES} data-dir="{shard}"'
            node = [str(bin_dir / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{port}"]
            node += ["--port", str(free_port()), "--node-config", config]
            procs.start(f"supernode{i}", node, env=env)
        run_cmd = [str(bin_dir / "flwr"), "run", str(FLOWER_APP), "bench", "--stream"]
        run_cmd += ["--run-config", _run_config(shards, result, rounds, epochs)]
        procs.start("flwr-run", run_cmd, env=env)
        out = _wait_file(result, procs, ["flwr-run", "superlink", "supernode0"], FLOWER_TIMEOUT_S)
    done = out["round_done"]  # [before round 1, after round 1, ..., after round R]
    return Outcome(
        wall_s=out["end"] - start,
        round_s=(done[-1] - done[1]) / max(len(done) - 2, 1),
        first_round_s=done[1] - start,
        accuracy=float(out["accuracy"]),
        extra={"flwr": FLWR_VERSION},
    )


# ------------------------------------------------------------------------------------------ swarm
def _program_env(results: Path, rounds: int, epochs: int) -> dict[str, Any]:
    """What ``swarm_ml.py`` reads, under the swarm and alone alike (``DATA_DIR`` and ``PARTITION`` aside)."""
    return {
        "MNIST_PYT": EXAMPLE / "model" / "mnist_pyt.py",
        "RESULT_DIR": results,
        "ROUNDS": rounds,
        "LOCAL_EPOCHS": epochs,
        "BATCH_SIZE": BATCH_SIZE,
        "MIN_PEERS": NODES,
        "OMP_NUM_THREADS": 1,
    }


def _swarm_files(ws: Path, shards: list[Path], rounds: int, epochs: int) -> tuple[Path, Path]:
    results = ws / "swarm-results"
    results.mkdir()
    nodes = [
        SwarmNode(f"fc-sl{i + 1}", shard.parent.parent, {"PARTITION": i}) for i, shard in enumerate(shards)
    ]
    profile = write_profile(ws / "swop_profile.yaml", nodes, envvars={"SL_LOG_LEVEL": "INFO"})
    task = write_run_task(
        ws / "flower_compare.yaml",
        "flower_compare",
        program=SWARM_PROGRAM,
        envvars={"DATA_DIR": "data-and-scratch/app-data", **_program_env(results, rounds, epochs)},
    )
    return profile, task


async def _submit(port: int, task_file: Path) -> tuple[dict[str, Any], float]:
    async with ledger_session(port) as ledger:
        task = await register_task(ledger, task_file)  # while the SWOP starts
        await wait_enrolled(ledger, 1)
        status = await run_task(ledger, task, NODES, SWARM_TIMEOUT_S)
        return status, time.time()


def _start_daemons(procs: Processes, ws: Path, profile: Path) -> int:
    """The SN and the SWOP, started at once (the SWOP's bus waits for the SN's broker); returns the port.

    A SWOP that gave up waiting (the SN took longer than its bus's connect timeout) is started again.
    """
    port = start_sn(procs, ws / "sn", timeout=0, port=free_port())
    start_swop(procs, port, profile, ws / "swop-work")
    wait_sn(procs)
    if procs.started["swop-1"].poll() is not None:
        start_swop(procs, port, profile, ws / "swop-work", uid="swop-1", name="swop-1-again")
    return port


def run_swarm(ws: Path, shards: list[Path], rounds: int, epochs: int) -> Outcome:
    """Our swarm: SN, SWOP, the task on the ledger, 4 SL+ML pairs."""
    profile, task_file = _swarm_files(ws, shards, rounds, epochs)
    with Processes(ws / "swarm-logs") as procs:
        start = time.time()
        port = _start_daemons(procs, ws, profile)
        status, complete = asyncio.run(_submit(port, task_file))
    if status["state"] != "COMPLETE":
        raise RuntimeError(f"the swarm task ended {status['state']}: {status.get('error')}")
    node0 = json.loads((ws / "swarm-results" / "node0.json").read_text())
    return _program_outcome(node0, start, {"complete_s": complete - start})


def _program_outcome(node0: dict[str, Any], start: float, extra: dict[str, Any]) -> Outcome:
    """A side run by ``swarm_ml.py``, from the result of node 0 (which tests the final model)."""
    done = node0["round_done"]  # after each round
    return Outcome(
        wall_s=node0["end"] - start,
        round_s=(done[-1] - done[0]) / max(len(done) - 1, 1),
        first_round_s=done[0] - start,
        accuracy=float(node0["accuracy"]),
        extra=extra,
    )


# ------------------------------------------------------------------------------------------- alone
def run_alone(ws: Path, shards: list[Path], rounds: int, epochs: int) -> Outcome:
    """The same 4 programs with ``SWARM_LOOPBACK=true``, started together: training without the swarm."""
    results = ws / "alone-results"
    results.mkdir()
    common = {k: str(v) for k, v in _program_env(results, rounds, epochs).items()}
    with Processes(ws / "alone-logs") as procs:
        start = time.time()
        for i, shard in enumerate(shards):
            env = {**common, "SWARM_LOOPBACK": "true", "DATA_DIR": str(shard), "PARTITION": str(i)}
            procs.start(f"alone{i}", [sys.executable, str(SWARM_PROGRAM)], env=env)
        nodes = [
            _wait_file(results / f"node{i}.json", procs, [f"alone{i}"], SWARM_TIMEOUT_S) for i in range(NODES)
        ]
    return _program_outcome(nodes[0], start, {})


# ------------------------------------------------------------------------------------------- rows
def _failed(exc: Exception) -> Outcome:
    """A side that did not finish: no numbers, and why."""
    nan = float("nan")
    why = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    return Outcome(nan, nan, nan, nan, {"error": why, "complete_s": nan})


def rows_for(
    ours: Outcome, flower: Outcome, alone: Outcome, rounds: int, epochs: int
) -> list[dict[str, Any]]:
    """The comparison as table rows (ratio = ours / Flower's, and ours / the programs' alone)."""
    job = f"{NODES} nodes x {PER_NODE} digits, {rounds} rounds x {epochs} epoch{'s' if epochs > 1 else ''}"
    base = f"Flower {FLWR_VERSION} deployment engine, FedAvg"
    errors = "; ".join(
        f"{side} FAILED: {o.extra['error']}"
        for side, o in (("ours", ours), ("Flower", flower), ("alone", alone))
        if "error" in o.extra
    )
    prefix = f"{errors}; " if errors else ""
    floor = alone.wall_s / flower.wall_s if flower.wall_s else float("nan")
    return [
        make_row(
            f"vs Flower: wall time to a tested final model ({job})", ours.wall_s, "s", base, flower.wall_s,
            target="ratio <= 0.2",
            note=(
                f"{prefix}from the first process started; accuracy {ours.accuracy:.4f} (Flower "
                f"{flower.accuracy:.4f}) after {rounds} merges; first round done after "
                f"{ours.first_round_s:.1f} s "
                f"(Flower {flower.first_round_s:.1f} s); our taskrunner COMPLETE (all SLs exited) at "
                f"{ours.extra['complete_s']:.1f} s; the same programs alone took {alone.wall_s:.1f} s, "
                f"{floor:.3f} of Flower's, each importing torch (ours fork from one server that did)"
            ),
        ),
        make_row(
            f"vs the same programs alone: wall time to a tested final model ({job})", ours.wall_s, "s",
            "the same 4 programs with SWARM_LOOPBACK=true, started together", alone.wall_s,
            note=(
                f"{prefix}what the swarm adds to the programs' own time (the SN, SWOP and SLs starting "
                f"before the programs, {rounds} merges) and saves (4 programs forked from one torch import "
                f"instead of 4 imports); a round {ours.round_s:.2f} s against "
                f"{alone.round_s:.2f} s alone; alone, without merges, node 0's model tests "
                f"{alone.accuracy:.4f} (the swarm's {ours.accuracy:.4f})"
            ),
        ),
        make_row(
            f"vs Flower: time per round ({job})", ours.round_s, "s", base, flower.round_s,
            target="ratio < 1.0",
            note=(
                f"{prefix}rounds 2..{rounds}; Flower starts a flwr-clientapp process per node per round "
                "(torch + flwr imports and torch warm-up every time); our ML processes live through"
            ),
        ),
        make_row(
            f"vs Flower: final test accuracy ({job})", ours.accuracy, "acc", base, flower.accuracy,
            target="ratio >= 1.0",
            note=(
                f"{prefix}{ours.accuracy:.4f} against {flower.accuracy:.4f}: the same 2,000 test digits "
                f"after {rounds} merges on both sides; same Net, shards, batches, Adam; both means weighted "
                "by samples; how far the merges' float32 rounding alone moves it: the next row "
                "(bench/summation_order.py)"
            ),
        ),
    ]  # fmt: skip


def run(rounds: int = ROUNDS, epochs: int = LOCAL_EPOCHS) -> list[dict[str, Any]]:
    """Run the sides one after the other (Flower, ours, alone) and compare; a side that fails is reported."""
    ws = BENCH / "results" / "flower_compare.tmp"
    shutil.rmtree(ws, ignore_errors=True)
    ws.mkdir(parents=True)
    shards = write_shards(ws)
    outcomes = []
    for side in (run_flower, run_swarm, run_alone):
        try:
            outcomes.append(side(ws, shards, rounds, epochs))
        except Exception as exc:
            traceback.print_exc()
            outcomes.append(_failed(exc))
    flower, ours, alone = outcomes
    if not any("error" in o.extra for o in outcomes):
        shutil.rmtree(ws, ignore_errors=True)  # kept, with every log, when a side failed
    return rows_for(ours, flower, alone, rounds, epochs)


def main() -> None:
    """Print the comparison."""
    parser = bench_parser(__doc__)
    parser.add_argument(
        "rounds", nargs="?", type=positive_int, default=ROUNDS, help="merges (default %(default)s)"
    )
    parser.add_argument(
        "epochs", nargs="?", type=positive_int, default=LOCAL_EPOCHS,
        help="local epochs between merges (default %(default)s)",
    )  # fmt: skip
    args = parser.parse_args()
    print_rows("swarm vs Flower", run(args.rounds, args.epochs))


if __name__ == "__main__":
    main()
