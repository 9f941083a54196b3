"""``swarm broker``: run a managed broker in the foreground until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from daemons.broker.process import BrokerError, ManagedBroker
from daemons.broker.settings import BrokerSettings, BrokerTLS
from daemons.bus.config import DEFAULT_PORT
from daemons.logs import setup_logging

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``swarm broker``."""
    p = subparsers.add_parser("broker", help="run an MQTT broker (mosquitto, or the amqtt fallback)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = free)")
    p.add_argument("--engine", choices=("auto", "mosquitto", "amqtt"), default="auto")
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


async def _serve(broker: ManagedBroker) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with asyncio.TaskGroup() as group:
        supervisor = group.create_task(broker.supervise())
        await stop.wait()
        await asyncio.to_thread(broker.stop)
        supervisor.cancel()


def run(args: argparse.Namespace) -> int:
    """Start the broker, print where it listens, and run until stopped."""
    setup_logging("broker", log_dir=args.workdir)
    tls = tls_from_args(args.cert, args.key, args.ca)
    settings = BrokerSettings(args.workdir, args.host, args.port, tls=tls)
    broker = ManagedBroker(settings, args.engine)
    try:
        address = broker.start()
    except (BrokerError, FileNotFoundError) as exc:
        raise SystemExit(f"swarm broker: {exc}") from None
    print(f"{broker.engine} broker (pid {broker.pid}) listening on {address}", flush=True)
    asyncio.run(_serve(broker))
    return 0
