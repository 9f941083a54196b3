"""``swarm dashboard``: serve the read-only web dashboard of a swarm.

It joins the swarm's bus as a ``swci`` identity (with ``--cert/--key/--capath``: the swci certificate,
mutual TLS to the broker, and HTTPS for the page with the same certificate), finds the SN and serves
``http(s)://HOST:PORT/``. With certificates, a browser needs a client certificate of the swarm's CA
or the token printed at start (``--token`` or ``SWARM_DASHBOARD_TOKEN`` sets it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import socket
import sys

from daemons.bus import BusError
from daemons.bus.config import DEFAULT_PORT, BrokerAddress
from daemons.identity import Identity, IdentityError, add_identity_arguments, identity_from_args, open_bus
from daemons.ledger_client import LedgerClient
from daemons.logs import setup_logging
from daemons.processes import install_stop_signals

__all__ = ["DEFAULT_WEB_PORT", "add_parser", "run"]

DEFAULT_WEB_PORT = 30310
TOKEN_VAR = "SWARM_DASHBOARD_TOKEN"  # noqa: S105 - the name of a variable, not a secret
log = logging.getLogger("swarm.dashboard")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``swarm dashboard``."""
    p = subparsers.add_parser("dashboard", help="serve a read-only web dashboard of the swarm")
    p.add_argument(
        "--broker", help="broker of the swarm, mqtt[s]://host:port (default: --sn-ip/--sn-api-port)"
    )
    p.add_argument("--sn-ip", default="127.0.0.1", help="host of the SN's broker (default 127.0.0.1)")
    p.add_argument("--sn-api-port", type=int, default=DEFAULT_PORT, help=f"its port (default {DEFAULT_PORT})")
    p.add_argument("--sn-uid", help="read from this SN (default: the sentinel online)")
    p.add_argument("--network", default="swarm", help="swarm network name (default swarm)")
    p.add_argument("--uid", help="bus uid (default: the certificate's CN, else dashboard-<host>)")
    p.add_argument("--host", default="127.0.0.1", help="address to serve the page on (default 127.0.0.1)")
    p.add_argument(
        "--port", type=int, default=DEFAULT_WEB_PORT, help=f"port of the page (default {DEFAULT_WEB_PORT})"
    )
    p.add_argument("--token", default=os.environ.get(TOKEN_VAR), help=f"access token (default ${TOKEN_VAR})")
    add_identity_arguments(p)


async def _serve(args: argparse.Namespace, identity: Identity | None) -> None:
    # The web stack loads only here, so that `swarm sl` and the other daemons start without it.
    from daemons.dashboard.server import (  # noqa: PLC0415
        Access,
        DashboardTLS,
        make_app,
        serve,
        server_config,
    )
    from daemons.dashboard.source import LedgerSource  # noqa: PLC0415

    broker = BrokerAddress.parse(args.broker) if args.broker else BrokerAddress(args.sn_ip, args.sn_api_port)
    uid = args.uid or (identity.uid if identity else f"dashboard-{socket.gethostname().split('.')[0]}")
    token = args.token or secrets.token_urlsafe(24)
    access = Access(open=True) if identity is None else Access(open=False, token=token)
    tls = DashboardTLS(identity.cert, identity.key, identity.ca_file()) if identity else None
    stop = asyncio.Event()
    install_stop_signals(stop.set)
    async with open_bus(identity, broker, uid, "swci", network=args.network) as bus:
        client = await LedgerClient.connect(bus, timeout=30, prefer=args.sn_uid)
        config = server_config(make_app(LedgerSource(client), access), args.host, args.port, tls)
        scheme = "https" if tls else "http"
        url = f"{scheme}://{args.host}:{args.port}/"
        shown = f"{url}?token={access.token}" if access.token else url

        def started() -> None:
            log.info("dashboard of SN %s at %s serving %s", client.sn, broker, shown)
            print(f"Dashboard: {shown}", flush=True)

        async with asyncio.TaskGroup() as group:
            server = group.create_task(serve(config, started), name="dashboard.serve")
            waiter = group.create_task(stop.wait(), name="dashboard.stop")
            await asyncio.wait({server, waiter}, return_when=asyncio.FIRST_COMPLETED)
            server.cancel()
            waiter.cancel()


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT."""
    try:
        identity = identity_from_args(args, role="swci")
    except IdentityError as exc:
        raise SystemExit(f"swarm dashboard: {exc}") from None
    setup_logging("dashboard")
    failure: BaseException | None = None
    try:
        asyncio.run(_serve(args, identity))
    except* (OSError, BusError) as group:  # no port, no broker or no SN: one line, not a traceback
        failure = group.exceptions[0]
    if failure is not None:
        print(f"swarm dashboard: {failure}", file=sys.stderr)
        return 1
    return 0
