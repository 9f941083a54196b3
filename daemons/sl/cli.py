"""``swarm sl``: one Swarm Learning node with its ML program (the reference's ``run-sl``, without Docker).

The ML program runs as a child process: ``--ml-entrypoint`` + ``--ml-cmd`` in ``--ml-w``. With
``--ml-v HOST:CONTAINER`` mounts, ``--ml-w`` is a container path and a per-node run directory emulates the
container's file system with symlinks; without mounts, ``--ml-w`` is a directory of this host.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shlex
import sys
import tempfile
from pathlib import Path

from daemons.bus import BusConnectError
from daemons.bus.config import DEFAULT_PORT, BrokerAddress
from daemons.gpus import cuda_env, visible_gpus
from daemons.identity import IdentityError, add_identity_arguments, identity_from_args, node_uid
from daemons.logs import LineFormatter, setup_logging
from daemons.rundir import build_run_dir, parse_mount, settle
from daemons.sl.malloc import keep_freed_memory
from daemons.sl.mlprocess import MLSpec
from daemons.sl.node import SLNode, SLOptions

__all__ = ["add_parser", "options_from_args", "run"]

_PYTHONS = ("python", "python3", sys.executable)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``swarm sl``."""
    p = subparsers.add_parser("sl", help="run a Swarm Learning node and its ML program")
    p.add_argument(
        "--name",
        "--uid",
        dest="uid",
        help="node uid (default: the certificate's CN; another name shares the SL certificate)",
    )
    p.add_argument("--network", default="swarm", help="swarm network name (default swarm)")
    p.add_argument(
        "--broker", help="broker of the swarm, mqtt[s]://host:port (default: --sn-ip/--sn-api-port)"
    )
    p.add_argument("--sn-ip", default="127.0.0.1", help="host of the SN's broker (default 127.0.0.1)")
    p.add_argument("--sn-api-port", type=int, default=DEFAULT_PORT, help=f"its port (default {DEFAULT_PORT})")
    p.add_argument("--sn-uid", help="talk to this SN (default: the sentinel online)")
    p.add_argument("--parent", help="uid of the SWOP that started this node")
    p.add_argument(
        "--taskrunner", help="the parent SWOP's taskrunner (the SL reports its end there if the SWOP dies)"
    )
    p.add_argument("--ml-entrypoint", default="python3", help="program that runs --ml-cmd (default python3)")
    p.add_argument(
        "--ml-cmd", required=True, help="the model program and its arguments, e.g. model/mnist_pyt.py"
    )
    p.add_argument("--ml-w", required=True, help="working directory of the ML program")
    p.add_argument("--ml-v", action="append", default=[], metavar="HOST:CONTAINER", help="mount (repeatable)")
    p.add_argument(
        "--ml-e", action="append", default=[], metavar="KEY=VALUE", help="environment (repeatable)"
    )
    p.add_argument("--ml-gpus", help='GPUs: "all", "device=0,1", a count, or "auto"')
    p.add_argument(
        "--ml-nproc",
        default="1",
        help='processes of the ML program: a number or "gpus" (one per GPU); several run under torchrun',
    )
    p.add_argument("--ml-python", help="python of the ML environment (what python/python3 entrypoints run)")
    p.add_argument("--gpu-slot", type=int, default=0, help="position of this node for --ml-gpus auto")
    p.add_argument("--run-dir", type=Path, help="where the node's run directory and logs go")
    p.add_argument("--linger", type=float, default=30.0, help="seconds to keep serving the final model")
    for ignored in ("--host-ip", "--sl-fs-port", "--ml-image", "--ml-name", "--apls-ip"):
        p.add_argument(ignored, help="accepted for compatibility with run-sl; not used")
    add_identity_arguments(p)


def _env_pairs(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--ml-e {item!r} must be KEY=VALUE")
        env[key] = value
    return env


def _entrypoint(entrypoint: str, python: str | None) -> str:
    """``python``/``python3`` runs the ML environment's interpreter (this one, unless told otherwise)."""
    parts = shlex.split(entrypoint)
    if parts and parts[0] in _PYTHONS:
        parts[0] = python or sys.executable
    return shlex.join(parts)


def _nproc(value: str, env: dict[str, str]) -> int:
    """``--ml-nproc``: a number of processes, or ``gpus``: one per GPU the program may use."""
    if value.strip().lower() == "gpus":
        given = env.get("CUDA_VISIBLE_DEVICES")
        gpus = [d for d in given.split(",") if d.strip()] if given is not None else visible_gpus()
        return max(1, len(gpus))
    if not value.strip().isdigit() or not 1 <= int(value) <= 64:
        raise ValueError(f'--ml-nproc {value!r} must be a number of processes (1-64) or "gpus"')
    return int(value)


def options_from_args(args: argparse.Namespace) -> SLOptions:
    """SLOptions from the command line; ValueError/IdentityError/FileNotFoundError when wrong."""
    identity = identity_from_args(args, role="sl")
    uid = node_uid(identity, args.uid)
    if uid is None:
        raise ValueError("give the node a name with --name (or an identity with --cert)")
    broker = BrokerAddress.parse(args.broker) if args.broker else BrokerAddress(args.sn_ip, args.sn_api_port)
    run_dir = (args.run_dir or Path(tempfile.mkdtemp(prefix=f"swarm-{uid}-"))).resolve()
    env = {**_env_pairs(args.ml_e), **cuda_env(args.ml_gpus, args.gpu_slot)}
    mounts = [parse_mount(m) for m in args.ml_v]
    notes: list[str] = []
    if mounts:
        run = build_run_dir(run_dir, args.ml_w, mounts)
        notes = list(run.notes)
        cwd = run.cwd
        env = run.translate_env(env, [args.ml_w, *(str(m.tgt) for m in mounts)])
    else:
        cwd = Path(args.ml_w).expanduser().resolve()
        if not cwd.is_dir():
            raise FileNotFoundError(
                f"--ml-w {cwd} is not a directory (give --ml-v mounts for container paths)"
            )
    spec = MLSpec(
        entrypoint=_entrypoint(args.ml_entrypoint, args.ml_python),
        command=args.ml_cmd,
        cwd=cwd,
        env=env,
        log_path=run_dir / "ml.log",
        nproc=_nproc(args.ml_nproc, env),
        python=args.ml_python or sys.executable,
    )
    return SLOptions(
        uid=uid,
        broker=broker,
        ml=spec,
        network=args.network,
        sn_uid=args.sn_uid,
        identity=identity,
        parent=args.parent,
        taskrunner=args.taskrunner,
        linger=args.linger,
        meta={"run_dir": str(run_dir), "mount_notes": notes},
    )


def program_log(spec: MLSpec) -> Path:
    """``<program>_sw.log`` beside the model program, as the reference writes it."""
    parts = shlex.split(spec.command)
    program = spec.cwd / (parts[0] if parts else "ml")
    return program.parent / f"{program.stem}_sw.log"


def _add_program_log(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path)
    except OSError:
        logging.getLogger("swarm.sl").warning("cannot write %s; continuing without it", path)
        return
    handler.setFormatter(LineFormatter())
    handler.setLevel(logging.INFO)
    handler.addFilter(logging.Filter("swarm"))
    logging.getLogger().addHandler(handler)


async def _main(node: SLNode) -> int:
    node.install_signal_handlers()
    return await node.run()


def run(args: argparse.Namespace) -> int:
    """Run the node; the exit status is the ML program's (1 when the node itself failed)."""
    try:
        options = options_from_args(args)
    except (ValueError, IdentityError, FileNotFoundError) as exc:
        raise SystemExit(f"swarm sl: {exc}") from None
    run_dir = Path(options.meta["run_dir"])
    setup_logging(options.uid, log_dir=run_dir)
    for note in options.meta.pop("mount_notes", []):
        logging.getLogger("swarm.sl").warning("%s", note)
    _add_program_log(program_log(options.ml))
    keep_freed_memory()
    try:
        return asyncio.run(_main(SLNode(options)))
    except BusConnectError as exc:  # no broker, or a certificate mismatch: the message says which
        logging.getLogger("swarm.sl").error("%s", exc)
        raise SystemExit(f"swarm sl {options.uid}: {exc}") from None
    except Exception as exc:
        logging.getLogger("swarm.sl").exception("the SL failed")
        raise SystemExit(f"swarm sl {options.uid}: {exc}") from None
    finally:
        for line in settle(run_dir, [parse_mount(m) for m in args.ml_v]):
            logging.getLogger("swarm.sl").info("%s", line)
