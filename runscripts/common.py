"""What every ``run-*`` command shares: the container options, ``-e``, ``--name``, ``-d``, launching.

A node runs as ``python -m <module> <argv>``: in the foreground the command becomes that process
(``exec``), with ``-d`` it starts in the background in its own session, its output in
``<state>/logs/<name>.log``. Either way ``<state>/nodes/<name>.json`` records it for ``stop-swarm``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from runscripts.state import NodeRecord, alive, process_start, state_dir

__all__ = ["Launch", "add_common_options", "env_pairs", "explain_container_options", "launch"]

# option -> why it changes nothing here (printed once when given)
_CONTAINER_ONLY = {
    "rm": "--rm: no container here; the node is a process, nothing is left to remove when it ends",
    "no_rm": "--no-rm/--keep: no container here; the node's log stays in the state directory",
    "network": "--network: no docker network here; nodes reach each other through the SN's broker",
    "interactive": "-i: no container here; the process reads this terminal when it runs in the foreground",
    "tty": "-t: no container here; the process uses this terminal when it runs in the foreground",
    "apls_ip": "--apls-ip: there is no licence server in open Swarm Learning",
    "apls_port": "--apls-port: there is no licence server in open Swarm Learning",
    "pull": "--pull: no image to pull; the node runs from this installation",
    "sudo": "--sudo: no docker commands are run, so nothing needs sudo",
    "hostname": "--hostname: no container host name; the node runs on this host",
    "publish": "-p: no container ports to publish; the node listens on the host's ports directly",
    "label": "-l: no container to label",
    "user": "-u: the node runs as the user who starts it",
    "group_add": "--group-add: the node runs with the groups of the user who starts it",
    "volume": "-v: no container file system; the node reads the host's paths directly",
    "workdir": "-w: no container file system; the node runs in the current directory",
    "image": "--image: no image; the node runs from this installation",
}


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """The options every reference script takes (docker's, the licence server's, naming, env)."""
    parser.add_argument("--name", help="name of the node (the reference's container name)")
    parser.add_argument(
        "-d", "--detach", action="store_true", help="run in the background (log in the state dir)"
    )
    parser.add_argument(
        "-e", "--env", action="append", default=[], metavar="VAR=VALUE", help="set a variable of the node"
    )
    docker = parser.add_argument_group("container options (accepted; they change nothing here)")
    for flags, dest in (
        (("--rm", "--no-keep"), "rm"),
        (("--no-rm", "--keep"), "no_rm"),
        (("-i", "--interactive"), "interactive"),
        (("-t", "--tty"), "tty"),
        (("--pull",), "pull"),
        (("--sudo",), "sudo"),
    ):
        docker.add_argument(*flags, dest=dest, action="store_true", help=argparse.SUPPRESS)
    for flags, dest in (
        (("--network",), "network"),
        (("--apls-ip", "--primary-apls-ip"), "apls_ip"),
        (("--apls-port", "--primary-apls-port"), "apls_port"),
        (("--hostname",), "hostname"),
        (("--image",), "image"),
        (("-w", "--workdir"), "workdir"),
        (("-u", "--user"), "user"),
    ):
        docker.add_argument(*flags, dest=dest, help=argparse.SUPPRESS)
    for flags, dest in (
        (("-p", "--publish"), "publish"),
        (("-l", "--label"), "label"),
        (("-v", "--volume"), "volume"),
        (("--group-add",), "group_add"),
    ):
        docker.add_argument(*flags, dest=dest, action="append", help=argparse.SUPPRESS)


def explain_container_options(prog: str, args: argparse.Namespace) -> None:
    """One line on stderr for each container-only option given."""
    for dest, why in _CONTAINER_ONLY.items():
        if getattr(args, dest, None):
            print(f"{prog}: {why}", file=sys.stderr)


def env_pairs(prog: str, items: Sequence[str]) -> dict[str, str]:
    """``-e VAR=VALUE`` (``-e VAR=`` sets it empty; ``-e VAR`` passes this shell's value, as docker does)."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not key or not key.replace("_", "a").isalnum():
            raise SystemExit(f"{prog}: -e {item!r}: expected VAR=VALUE")
        env[key] = value if sep else os.environ.get(key, "")
    return env


@dataclass
class Launch:
    """One node to start: ``python -m module argv`` named ``name`` with ``env`` added."""

    prog: str
    role: str
    name: str
    module: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    detach: bool = False


def data_dir(name: str) -> Path:
    """The data directory of node ``name`` in the state directory."""
    return state_dir() / "data" / name


def _check_name_free(launch: Launch) -> None:
    previous = NodeRecord.load(state_dir() / "nodes" / f"{launch.name}.json")
    if previous is not None and alive(previous):
        raise SystemExit(
            f"{launch.prog}: a node named {launch.name!r} runs already (pid {previous.pid}); "
            f"stop it with stop-swarm or choose another --name"
        )


def launch(launch: Launch) -> int:
    """Start the node: exec it in the foreground, or spawn it in the background with ``-d``."""
    _check_name_free(launch)
    env = {**os.environ, **launch.env, "SWARM_NODE_NAME": launch.name}
    command = [sys.executable, "-m", launch.module, *launch.argv]
    log_path = state_dir() / "logs" / f"{launch.name}.log"
    if not launch.detach:
        NodeRecord(launch.name, launch.role, os.getpid(), process_start(os.getpid()), "", False).save()
        sys.stdout.flush()
        os.execve(sys.executable, command, env)  # noqa: S606 - our own daemon, in this process
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    NodeRecord(launch.name, launch.role, proc.pid, process_start(proc.pid), str(log_path), True).save()
    print(f"{launch.name} ({launch.role}) runs in the background, pid {proc.pid}; log: {log_path}")
    print(f"stop it with: stop-swarm --{launch.role}")
    return 0
