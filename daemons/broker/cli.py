"""``swarm broker``: run a managed broker in the foreground until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from daemons.broker.nats import CLUSTER_PORT, NATS_PORT, NatsNode, NatsSettings
from daemons.broker.process import BrokerError, ManagedBroker
from daemons.broker.settings import BrokerSettings, BrokerTLS
from daemons.bus.config import DEFAULT_PORT
from daemons.logs import setup_logging

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``swarm broker``."""
    p = subparsers.add_parser(
        "broker", help="run an MQTT broker (mosquitto, the amqtt fallback, or a node of a NATS cluster)"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = free)")
    p.add_argument("--engine", choices=("auto", "mosquitto", "amqtt", "nats"), default="auto")
    nats = p.add_argument_group("a NATS cluster node (--engine nats): MQTT on --port, JetStream for SNs")
    nats.add_argument("--name", help="this node's name in the cluster (default: nats-<host>)")
    nats.add_argument(
        "--nats-port", type=int, default=NATS_PORT, help=f"NATS client port (default {NATS_PORT})"
    )
    nats.add_argument("--cluster-port", type=int, default=CLUSTER_PORT, help="route port (default 6222)")
    nats.add_argument(
        "--routes", default="", metavar="HOST:PORT,...", help="the other nodes' route addresses (a cluster)"
    )
    p.add_argument("--workdir", type=Path, default=Path("swarm-broker"), help="config, ACL and log")
    p.add_argument("--cert", type=Path, help="broker certificate (enables mutual TLS)")
    p.add_argument("--key", type=Path, help="broker key")
    p.add_argument("--capath", "--cacert", dest="ca", type=Path, help="swarm CA certificate")


def tls_from_args(cert: Path | None, key: Path | None, ca: Path | None) -> BrokerTLS | None:
    """BrokerTLS when all three files are given, None when none is; ValueError otherwise."""
    given = [x for x in (cert, key, ca) if x is not None]
    if not given:
        return None
    if cert is None or key is None or ca is None:
        raise ValueError("mutual TLS needs --cert, --key and --capath together")
    ca_file = ca / "ca-cert.pem" if ca.is_dir() else ca
    return BrokerTLS(ca_file, cert, key)


def _stop_on_signals() -> asyncio.Event:
    """An event that SIGTERM and SIGINT set."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _serve(broker: ManagedBroker) -> None:
    stop = _stop_on_signals()
    async with asyncio.TaskGroup() as group:
        supervisor = group.create_task(broker.supervise())
        await stop.wait()
        await asyncio.to_thread(broker.stop)
        supervisor.cancel()


async def _serve_nats(node: NatsNode) -> None:
    stop = _stop_on_signals()
    async with asyncio.TaskGroup() as group:
        exited = group.create_task(node.wait())
        stopping = group.create_task(stop.wait())
        await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.to_thread(node.stop)
        stopping.cancel()


def _run_nats(args: argparse.Namespace, tls: BrokerTLS | None) -> int:
    routes = tuple(r.strip() for r in args.routes.split(",") if r.strip())
    settings = NatsSettings(
        name=args.name or f"nats-{args.host}",
        workdir=args.workdir,
        host=args.host,
        mqtt_port=args.port,
        nats_port=args.nats_port,
        cluster_port=args.cluster_port,
        routes=routes,
        tls=tls,
    )
    try:
        node = NatsNode(settings)
        node.start()
    except BrokerError as exc:
        raise SystemExit(f"swarm broker: {exc}") from None
    scheme = "mqtts" if tls else "mqtt"
    print(
        f"nats node {settings.name} (pid {node.pid}) listening on {scheme}://{args.host}:{args.port} "
        f"and nats://{args.host}:{args.nats_port}; run its clients with SWARM_SUBSCRIBE_QOS=0 "
        "SWARM_PUBLISH_QOS=0 (docs/protocol.md)",
        flush=True,
    )
    asyncio.run(_serve_nats(node))
    return 0


def run(args: argparse.Namespace) -> int:
    """Start the broker, print where it listens, and run until stopped."""
    setup_logging("broker", log_dir=args.workdir)
    tls = tls_from_args(args.cert, args.key, args.ca)
    if args.engine == "nats":
        return _run_nats(args, tls)
    settings = BrokerSettings(args.workdir, args.host, args.port, tls=tls)
    broker = ManagedBroker(settings, args.engine)
    try:
        address = broker.start()
    except (BrokerError, FileNotFoundError) as exc:
        raise SystemExit(f"swarm broker: {exc}") from None
    print(f"{broker.engine} broker (pid {broker.pid}) listening on {address}", flush=True)
    asyncio.run(_serve(broker))
    return 0
