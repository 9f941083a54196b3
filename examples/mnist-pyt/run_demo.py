"""``make demo``: a 4-node swarm trains MNIST-style digits on this machine, end to end.

1. Prepares the example in a workspace (``runs/mnist-pyt-demo``) with ``prepare.py``: its files with
   the paths filled in and one private data shard per node (``--mnist PATH`` shards a real mnist.npz).
2. Starts the SN (with its mosquitto) and one SWOP with the 4-node profile, as a user would.
3. Runs the example's ``swci-init`` with swci, whose ``WAIT FOR TASKRUNNER`` shows the training live
   (on a terminal; elsewhere ``#`` progress). swci keeps its contexts in the workspace, so the demo does
   not change the user's current context.
4. Prints each node's test accuracy and final-model digest: the digests are all the same.

Ctrl-C or SIGTERM (as ``timeout`` sends) stops everything it started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from rich.console import Console
from rich.table import Table

EXAMPLE = Path(__file__).resolve().parent
ROOT = EXAMPLE.parent.parent
sys.path.insert(0, str(EXAMPLE))

from prepare import NODES, load_mnist, prepare  # noqa: E402

console = Console()


def start(argv: list[str], log: Path | None, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a process in its own session, with its output in ``log`` (None: this terminal)."""
    env = {**os.environ, **(env or {})}
    if log is None:
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_for_line(log: Path, pattern: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Wait until ``pattern`` appears in ``log`` (a daemon's ready line)."""
    deadline = time.monotonic() + timeout
    while pattern not in (log.read_text(errors="replace") if log.exists() else ""):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(
                f"demo: {log.name} did not become ready:\n{log.read_text(errors='replace')[-3000:]}"
            )
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM its process group (a SWOP stops its SLs, an SL its ML program), then SIGKILL."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM ends the demo as Ctrl-C does: through the ``finally`` that stops what it started."""
    raise KeyboardInterrupt


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
    signal.signal(signal.SIGTERM, _interrupt)
    t0 = time.time()
    port = args.port or (30304 if _free(30304) else _free_port())
    ws = args.workspace.resolve()
    example = prepare(ws / "mnist-pyt", port=port, mnist=args.mnist)
    n_train = len(load_mnist(example / "user1" / "data-and-scratch" / "app-data" / "mnist.npz")["x_train"])
    console.print(f"[bold]workspace[/] {ws}  ({NODES} private shards, about {n_train} training images each)")
    bin_dir = Path(sys.executable).parent
    swarm, swci_bin = str(bin_dir / "swarm"), str(bin_dir / "swci")
    procs: list[subprocess.Popen[bytes]] = []
    code = 1
    try:
        sn_log = ws / "logs" / "sn.log"
        procs.append(
            start(
                [swarm, "sn", "--sentinel", "--data-dir", str(ws / "sn"), "--sn-api-port", str(port)], sn_log
            )
        )
        wait_for_line(sn_log, "Starting SWARM-API-SERVER", procs[-1])
        console.print(f"[green]SN ready[/] on port {port} ({time.time() - t0:.1f} s)")
        swop_log = ws / "logs" / "swop.log"
        profile = ["--usr-dir", str(example / "swop"), "--profile-file-name", "swop_profile.yaml"]
        swop = [swarm, "swop", *profile, "--uid", "swop-1", "--sn-api-port", str(port)]
        procs.append(start([*swop, "--work-dir", str(ws / "swop-work")], swop_log))
        wait_for_line(swop_log, "listening on taskrunner", procs[-1])
        console.print(f"[green]SWOP ready[/] with {NODES} SL slots ({time.time() - t0:.1f} s)")
        swci_env = {"SWCI_WAIT_INTERVAL": "0.5", "XDG_CONFIG_HOME": str(ws / "swci-config")}
        procs.append(
            start(
                [swci_bin, "--usr-dir", str(example / "swci"), "--init-script-name", "swci-init"],
                None,
                swci_env,
            )
        )
        code = procs[-1].wait()
    except KeyboardInterrupt:
        console.print("[yellow]stopping the demo[/]: swci, the SWOP with its nodes, the SN")
        return 130
    finally:
        for proc in reversed(procs):
            stop(proc)
    console.print(results(example))
    found = digests(example)
    same = len(found) == 1 and len(list(example.glob("user*/data-and-scratch/scratch/result.json"))) == NODES
    console.print(
        f"[bold]{'identical final model on all nodes' if same else 'final models differ or are missing'}[/]"
        f" — {time.time() - t0:.1f} s in all; logs in {ws / 'logs'} and {ws / 'swop-work' / 'logs'}"
    )
    if code != 0:
        console.print(f"[red]swci ended with status {code}[/]")
    return 0 if code == 0 and same else 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


if __name__ == "__main__":
    sys.exit(main())
