"""``swarm``: the daemons' command line (sn, swop, sl, broker, certs)."""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

__all__ = ["build_parser", "main"]

# command -> module with add_parser(subparsers) and run(args) -> int
_SUBCOMMANDS = {
    "sn": "daemons.sn.cli",
    "swop": "daemons.swop.cli",
    "sl": "daemons.sl.cli",
    "broker": "daemons.broker.cli",
    "certs": "certs.cli",
}


def _modules() -> dict[str, ModuleType]:
    found: dict[str, ModuleType] = {}
    for command, name in _SUBCOMMANDS.items():
        try:
            found[command] = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if not (exc.name and name.startswith(exc.name)):
                raise
    return found


def build_parser(modules: dict[str, ModuleType] | None = None) -> argparse.ArgumentParser:
    """The ``swarm`` parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="swarm", description="open Swarm Learning daemons: decentralised training over MQTT"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (modules or _modules()).values():
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``swarm`` console script."""
    modules = _modules()
    args = build_parser(modules).parse_args(argv)
    try:
        return int(modules[args.command].run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
