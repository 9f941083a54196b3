"""``swarm swop``: run a SWOP on this host with a profile of the reference format."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
from pathlib import Path

from daemons.bus import BusConnectError
from daemons.bus.config import DEFAULT_PORT, BrokerAddress
from daemons.identity import IdentityError, add_identity_arguments, identity_from_args
from daemons.logs import setup_logging
from daemons.swop.checks import check_profile
from daemons.swop.node import SwopNode, SwopOptions
from taskdefs import SwopProfile, TaskDefError, load_swop_profile

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``swarm swop``."""
    p = subparsers.add_parser("swop", help="run a SWOP: runs the tasks assigned to its taskrunner")
    p.add_argument("--profile", type=Path, help="SWOP profile (YAML)")
    p.add_argument("--usr-dir", type=Path, help="directory of the profile (the reference's --usr-dir)")
    p.add_argument("--profile-file-name", help="profile file in --usr-dir (the reference's option)")
    p.add_argument("--uid", help="SWOP uid (default: the certificate's CN, else swop-<host>)")
    p.add_argument("--network", default="swarm", help="swarm network name (default swarm)")
    p.add_argument("--broker", help="broker of the swarm, mqtt[s]://host:port")
    p.add_argument("--sn-ip", default="127.0.0.1", help="host of the SN's broker (profile apisrv wins)")
    p.add_argument("--sn-api-port", type=int, default=DEFAULT_PORT, help=f"its port (default {DEFAULT_PORT})")
    p.add_argument("--sn-uid", help="talk to this SN (default: the sentinel online)")
    p.add_argument(
        "--work-dir", type=Path, help="run directories, environments, logs (default ./swarm-<uid>)"
    )
    p.add_argument(
        "--offline-grace",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long a task keeps running while every SWOP of it is unreachable (default 120)",
    )
    p.add_argument(
        "--cpu-slots",
        type=int,
        default=int(os.environ.get("SWOP_CPU_SLOTS", "1")),
        help="RUN_TRIALS: trials run at once on a host without GPUs (default 1; a GPU host runs one per GPU)",
    )
    p.add_argument("--apls-ip", help="accepted for compatibility; there is no licence server")
    add_identity_arguments(p)


def _profile_path(args: argparse.Namespace) -> Path:
    if args.profile is not None:
        return Path(str(args.profile))
    if args.usr_dir is not None and args.profile_file_name:
        return Path(str(args.usr_dir)) / str(args.profile_file_name)
    raise ValueError("give the profile: --profile FILE (or --usr-dir DIR --profile-file-name NAME)")


def _broker(args: argparse.Namespace, profile: SwopProfile) -> BrokerAddress:
    if args.broker:
        return BrokerAddress.parse(args.broker)
    locator = profile.apisrv.locator
    return BrokerAddress(locator.host or args.sn_ip, locator.port or args.sn_api_port)


def options_from_args(args: argparse.Namespace) -> SwopOptions:
    """SwopOptions from the command line; ValueError/IdentityError/TaskDefError when wrong."""
    identity = identity_from_args(args, role="swop")
    profile = load_swop_profile(_profile_path(args))
    uid = args.uid or (identity.uid if identity else f"swop-{socket.gethostname().split('.')[0]}")
    if identity is not None and uid != identity.uid:
        raise ValueError(f"--uid {uid!r} differs from the certificate's CN {identity.uid!r}")
    check_profile(profile, _profile_path(args), uid, identity)
    work_dir = (args.work_dir or Path.cwd() / f"swarm-{uid}").resolve()
    return SwopOptions(
        uid=uid,
        profile=profile,
        broker=_broker(args, profile),
        work_dir=work_dir,
        network=args.network,
        identity=identity,
        sn_uid=args.sn_uid,
        offline_grace=args.offline_grace,
        cpu_slots=_positive(args.cpu_slots, "--cpu-slots"),
    )


def _positive(value: int, flag: str) -> int:
    if value < 1:
        raise ValueError(f"{flag} must be at least 1, got {value}")
    return value


async def _main(node: SwopNode) -> None:
    node.install_signal_handlers()
    await node.run()


def run(args: argparse.Namespace) -> int:
    """Run the SWOP until stopped."""
    try:
        options = options_from_args(args)
    except (ValueError, IdentityError, TaskDefError, OSError) as exc:
        raise SystemExit(f"swarm swop: {exc}") from None
    setup_logging(options.uid, log_dir=options.work_dir / "logs")
    try:
        asyncio.run(_main(SwopNode(options)))
    except BusConnectError as exc:  # no broker, or a certificate mismatch: the message says which
        raise SystemExit(f"swarm swop: {exc}") from None
    return 0
