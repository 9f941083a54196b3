"""``make demo``: a 4-node swarm trains MNIST-style digits on this machine, end to end.

1. Copies this example into a workspace (``runs/mnist-pyt``) as the reference's README does, replacing
   ``<CURRENT-PATH>`` and the SN port, and writes one private ``mnist.npz`` shard per node (Keras
   format) made from scikit-learn's bundled 8x8 digits scaled to 28x28, so nothing is downloaded.
   Give ``--mnist PATH`` to shard a real ``mnist.npz`` instead.
2. Starts the SN (with its mosquitto) and one SWOP with the 4-node profile.
3. Runs the example's ``swci-init`` with swci and shows each node's progress live.
4. Prints each node's test accuracy and final-model digest: the digests are all the same.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

EXAMPLE = Path(__file__).resolve().parent
ROOT = EXAMPLE.parent.parent
sys.path.insert(0, str(ROOT))

from sklearn.datasets import load_digits  # noqa: E402

from daemons.broker import free_port  # noqa: E402
from daemons.bus import Bus, BusConfig, BusError  # noqa: E402
from daemons.bus.config import BrokerAddress  # noqa: E402
from daemons.ledger_client import LedgerClient  # noqa: E402

NODES = 4
CONTRACT = "defaultbb.cqdb.sml.hpe"
TASKRUNNER = "defaulttaskbb.taskdb.sml.hpe"
console = Console()


# ------------------------------------------------------------------------------------------ data
def digits_as_mnist(seed: int = 0) -> dict[str, np.ndarray]:
    """scikit-learn's digits (1797 8x8 images, 0..16) as 28x28 uint8 MNIST arrays, 80/20 split."""
    digits = load_digits()
    big = np.kron(digits.images, np.ones((3, 3)))  # 24x24
    images = np.clip(np.pad(big, ((0, 0), (2, 2), (2, 2))) * 255.0 / 16.0, 0, 255).astype(np.uint8)
    order = np.random.default_rng(seed).permutation(len(images))
    n_test = len(order) // 5
    test, train = order[:n_test], order[n_test:]
    labels = digits.target.astype(np.uint8)
    return {
        "x_train": images[train],
        "y_train": labels[train],
        "x_test": images[test],
        "y_test": labels[test],
    }


def load_mnist(path: Path) -> dict[str, np.ndarray]:
    """A user's Keras-format mnist.npz."""
    with np.load(path) as data:
        return {k: data[k] for k in ("x_train", "y_train", "x_test", "y_test")}


def write_shards(data: dict[str, np.ndarray], users: list[Path]) -> None:
    """One private training shard per node; every node tests on the whole test set."""
    shards = np.array_split(np.arange(len(data["x_train"])), len(users))
    for user, idx in zip(users, shards, strict=True):
        app_data = user / "data-and-scratch" / "app-data"
        app_data.mkdir(parents=True, exist_ok=True)
        (user / "data-and-scratch" / "scratch").mkdir(parents=True, exist_ok=True)
        np.savez(
            app_data / "mnist.npz",
            x_train=data["x_train"][idx], y_train=data["y_train"][idx],
            x_test=data["x_test"], y_test=data["y_test"],
        )  # fmt: skip


# ------------------------------------------------------------------------------------- workspace
def prepare_workspace(ws: Path, port: int, data: dict[str, np.ndarray]) -> Path:
    """Copy the example into ``ws`` with placeholders replaced; returns the example's copy."""
    if ws.exists():
        shutil.rmtree(ws)
    example = ws / "mnist-pyt"
    for part in ("model", "swci", "swop"):
        shutil.copytree(EXAMPLE / part, example / part)
    for path in [*example.glob("swci/**/*"), *example.glob("swop/*")]:
        if path.is_file():
            text = path.read_text().replace("<CURRENT-PATH>", str(example)).replace("30304", str(port))
            path.write_text(text)
    write_shards(data, [example / f"user{i}" for i in range(1, NODES + 1)])
    return example


def start(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a daemon with its output in ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )


def wait_for_line(log: Path, pattern: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Wait until ``pattern`` appears in ``log`` (the SN's ready line)."""
    deadline = time.monotonic() + timeout
    while pattern not in (log.read_text(errors="replace") if log.exists() else ""):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(
                f"demo: {log.name} did not become ready:\n{log.read_text(errors='replace')[-3000:]}"
            )
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


# ------------------------------------------------------------------------------------- dashboard
def render(
    perf: list[dict[str, Any]],
    runner: dict[str, Any],
    rounds: dict[str, Any],
    swci_tail: list[str],
    t0: float,
) -> Group:
    """The live view: a row per node and the end of swci's output."""
    table = Table(title=f"mnist-pyt on {NODES} nodes — {time.time() - t0:5.1f} s", expand=True)
    for col in ("node", "status", "epochs", "", "val loss", "val accuracy"):
        table.add_column(col)
    for row in perf:
        done, total = int(row.get("completed_epochs") or 0), int(row.get("total_epochs") or 0)
        bar = ProgressBar(total=max(total, 1), completed=done, width=24)
        loss, metric = row.get("loss"), row.get("metric")
        table.add_row(
            row["uid"], row.get("status", ""), f"{done}/{total}", bar,
            f"{loss:.4f}" if isinstance(loss, float) else "-",
            f"{metric:.4f}" if isinstance(metric, float) else "-",
        )  # fmt: skip
    state = runner.get("state", "?")
    latest = (rounds.get("finished") or [{}])[-1]
    summary = Text(
        f"task {runner.get('task') or '-'}: {state}  |  peers active {runner.get('active', 0)} "
        f"completed {runner.get('completed', 0)} failed {runner.get('failed', 0)}  |  "
        f"last merged round {latest.get('round', '-')}",
        style="bold",
    )
    return Group(table, summary, Panel("\n".join(swci_tail[-8:]) or "…", title="swci", border_style="dim"))


async def wait_enrolled(port: int, swop: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    """Wait until the SWOP listens on the taskrunner (so the init script's ASSIGN finds it)."""
    config = BusConfig(BrokerAddress("127.0.0.1", port), "demo-wait", "swci")
    async with Bus(config) as bus:
        ledger = await LedgerClient.connect(bus, timeout=30)
        async with ledger.watch("taskrunner", TASKRUNNER) as events:
            deadline = time.monotonic() + timeout
            while not any(p["online"] for p in await ledger.query("taskrunner.peers", name=TASKRUNNER)):
                log_text = await asyncio.to_thread(_lines, log)
                if swop.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("demo: the SWOP did not enroll:\n" + "\n".join(log_text[-30:]))
                with contextlib.suppress(TimeoutError):
                    await events.next(timeout=1)


async def watch(port: int, swci: subprocess.Popen[bytes], swci_log: Path, t0: float) -> None:
    """Refresh the dashboard from the ledger until swci ends."""
    config = BusConfig(BrokerAddress("127.0.0.1", port), "demo-watch", "swci")
    async with Bus(config) as bus:
        ledger = await LedgerClient.connect(bus, timeout=30)
        shown: dict[str, Any] = {"perf": [], "runner": {}, "rounds": {}}
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            while swci.poll() is None:
                with contextlib.suppress(BusError):
                    latest = {
                        "perf": await ledger.query("contract.perfdata", name=CONTRACT),
                        "runner": await ledger.query("taskrunner.status", name=TASKRUNNER),
                        "rounds": await ledger.query("contract.rounds", name=CONTRACT),
                    }
                    if latest["perf"] or not shown["perf"]:  # the script resets at its end: keep the last run
                        shown = latest
                    tail = [ln for ln in await asyncio.to_thread(_lines, swci_log) if _is_message(ln)]
                    live.update(render(shown["perf"], shown["runner"], shown["rounds"], tail, t0))
                await asyncio.sleep(0.5)


def _is_message(line: str) -> bool:
    """swci's commands and messages, not the borders of its tables."""
    return bool(line.strip()) and line.lstrip()[0] not in "│┃┏┡└╭╰┌├┗━─═"


def _lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.exists() else []


# --------------------------------------------------------------------------------------- results
def results(example: Path) -> Table:
    """Each node's accuracy and final digest, read from its scratch directory."""
    table = Table(title="final swarm model on every node")
    for col in ("node", "test accuracy", "final-model digest", "device", "train time"):
        table.add_column(col)
    for i in range(1, NODES + 1):
        path = example / f"user{i}" / "data-and-scratch" / "scratch" / "result.json"
        if not path.exists():
            table.add_row(f"user{i}", "-", "(no result)", "-", "-")
            continue
        r = json.loads(path.read_text())
        table.add_row(
            f"user{i}", f"{r['accuracy']:.4f}", r["digest"][:32], r["device"], f"{r['seconds']:.1f} s"
        )
    return table


def digests(example: Path) -> set[str]:
    """The distinct final digests of the nodes that finished."""
    found = set()
    for path in example.glob("user*/data-and-scratch/scratch/result.json"):
        found.add(json.loads(path.read_text())["digest"])
    return found


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workspace", type=Path, default=ROOT / "runs" / "mnist-pyt-demo")
    parser.add_argument(
        "--mnist", type=Path, help="a Keras-format mnist.npz to use instead of the bundled digits"
    )
    parser.add_argument(
        "--port", type=int, default=0, help="SN port (default: 30304 if free, else any free port)"
    )
    args = parser.parse_args()
    t0 = time.time()
    port = args.port or (30304 if _free(30304) else free_port())
    data = load_mnist(args.mnist) if args.mnist else digits_as_mnist()
    ws = args.workspace.resolve()
    example = prepare_workspace(ws, port, data)
    console.print(
        f"[bold]workspace[/] {ws}  ({len(data['x_train'])} training images in {NODES} private shards)"
    )
    bin_dir = Path(sys.executable).parent
    swarm, swci_bin = str(bin_dir / "swarm"), str(bin_dir / "swci")
    sn = start(
        [swarm, "sn", "--sentinel", "--data-dir", str(ws / "sn"), "--sn-api-port", str(port)],
        ws / "logs" / "sn.log",
    )
    procs = [sn]
    try:
        wait_for_line(ws / "logs" / "sn.log", "Starting SWARM-API-SERVER", sn)
        console.print(f"[green]SN ready[/] on port {port} ({time.time() - t0:.1f} s)")
        swop = start(
            [swarm, "swop", "--usr-dir", str(example / "swop"), "--profile-file-name", "swop_profile.yaml",
             "--uid", "swop-1", "--sn-api-port", str(port), "--work-dir", str(ws / "swop-work")],
            ws / "logs" / "swop.log",
            {"SWOP_KEEP_CONTAINERS": "True"},
        )  # fmt: skip
        procs.append(swop)
        asyncio.run(wait_enrolled(port, swop, ws / "logs" / "swop.log"))
        console.print(f"[green]SWOP ready[/] with {NODES} SL slots ({time.time() - t0:.1f} s)")
        swci_log = ws / "logs" / "swci.log"
        swci = start(
            [swci_bin, "--usr-dir", str(example / "swci"), "--init-script-name", "swci-init"],
            swci_log,
            {"SWCI_WAIT_INTERVAL": "0.5", "COLUMNS": "120"},
        )
        procs.append(swci)
        asyncio.run(watch(port, swci, swci_log, t0))
        code = swci.wait()
    finally:
        for proc in reversed(procs):
            stop(proc)
    console.print(results(example))
    found = digests(example)
    same = len(found) == 1 and len(list(example.glob("user*/data-and-scratch/scratch/result.json"))) == NODES
    console.print(
        f"[bold]{'identical final model on all nodes' if same else 'final models differ or are missing'}[/]"
        f" — {time.time() - t0:.1f} s in all; logs in {ws / 'logs'} and {ws / 'swop-work' / 'runs'}"
    )
    if code != 0:
        console.print(f"[red]swci ended with status {code}[/]; see {swci_log}")
    return 0 if code == 0 and same else 1


def _free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


if __name__ == "__main__":
    sys.exit(main())
