"""``swarm sn``: run a Swarm Network node (the ledger), with its own broker unless told otherwise."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from daemons.bus.config import DEFAULT_PORT, BrokerAddress
from daemons.identity import IdentityError, add_identity_arguments, identity_from_args
from daemons.logs import setup_logging
from daemons.sn.node import SNNode, SNOptions

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``swarm sn``."""
    p = subparsers.add_parser("sn", help="run a Swarm Network node: the ledger (and the broker)")
    p.add_argument(
        "--sentinel", action="store_true", help="create the ledger if there is none (the first SN)"
    )
    p.add_argument("--uid", help="node uid (default: the certificate's CN, else sn-1)")
    p.add_argument("--network", default="swarm", help="swarm network name (default swarm)")
    p.add_argument("--data-dir", type=Path, default=Path("swarm-sn"), help="ledger, broker config and logs")
    p.add_argument("--host-ip", default="127.0.0.1", help="address the broker listens on (default 127.0.0.1)")
    p.add_argument(
        "--sn-api-port", type=int, default=DEFAULT_PORT, help=f"broker port (default {DEFAULT_PORT})"
    )
    p.add_argument("--broker", help="use this broker (mqtt[s]://host:port) instead of starting one")
    p.add_argument("--broker-engine", choices=("auto", "mosquitto", "amqtt"), default="auto")
    p.add_argument("--sentinel-ip", help="replicate from the sentinel whose broker is at this address")
    p.add_argument("--sentinel-api-port", type=int, default=DEFAULT_PORT, help="the sentinel's broker port")
    p.add_argument("--sentinel-uid", help="uid of the SN to replicate from (default: the sentinel online)")
    p.add_argument(
        "--cluster",
        metavar="NATS_URLS",
        help="clustered ledger: the NATS servers (nats://host:4222,...) whose JetStream holds the chain "
        "and elects the sealing SN; every SN of the swarm names the same cluster",
    )
    p.add_argument(
        "--lease", type=float, default=3.0, help="seconds a dead sealer keeps its lease (default 3)"
    )
    p.add_argument("--sn-p2p-port", type=int, help="accepted for compatibility; not used")
    p.add_argument("--apls-ip", help="accepted for compatibility; there is no licence server")
    add_identity_arguments(p)


def options_from_args(args: argparse.Namespace) -> SNOptions:
    """SNOptions from the command line; ValueError/IdentityError for bad combinations."""
    identity = identity_from_args(args, role="sn")
    broker = BrokerAddress.parse(args.broker) if args.broker else None
    if args.sentinel_ip:
        if args.sentinel:
            raise ValueError("--sentinel and --sentinel-ip exclude each other")
        broker = broker or BrokerAddress(args.sentinel_ip, args.sentinel_api_port, identity is not None)
    sentinel = args.sentinel or (broker is None and not args.sentinel_uid)
    uid = args.uid or (identity.uid if identity else "sn-1")
    if identity is not None and uid != identity.uid:
        raise ValueError(f"--uid {uid!r} differs from the certificate's CN {identity.uid!r}")
    cluster = [url.strip() for url in (args.cluster or "").split(",") if url.strip()]
    if cluster and broker is None:
        raise ValueError("--cluster needs --broker: the bus of a clustered ledger is the cluster's MQTT")
    if not args.lease > 0:
        raise ValueError(f"--lease must be more than 0 seconds, got {args.lease}")
    return SNOptions(
        uid=uid,
        network=args.network,
        data_dir=args.data_dir,
        sentinel=sentinel,
        sentinel_uid=args.sentinel_uid,
        host=args.host_ip,
        api_port=args.sn_api_port,
        broker=broker,
        broker_engine=args.broker_engine,
        identity=identity,
        cluster=cluster,
        lease=args.lease,
    )


async def _main(node: SNNode) -> None:
    node.install_signal_handlers()
    await node.run()


def run(args: argparse.Namespace) -> int:
    """Run the SN until stopped."""
    try:
        options = options_from_args(args)
    except (ValueError, IdentityError) as exc:
        raise SystemExit(f"swarm sn: {exc}") from None
    setup_logging(options.uid, log_dir=options.data_dir / "logs")
    asyncio.run(_main(SNNode(options)))
    return 0
