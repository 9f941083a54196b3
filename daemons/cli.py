"""``swarm``: the daemons' command line (sn, swop, sl, broker, certs, dashboard)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from types import ModuleType

__all__ = ["BLAS_LIMITED", "build_parser", "limit_blas_threads", "main"]

BLAS_LIMITED = "SWARM_BLAS_LIMITED"

# command -> module with add_parser(subparsers) and run(args) -> int; imported after limit_blas_threads()
_SUBCOMMANDS = {
    "sn": "daemons.sn.cli",
    "swop": "daemons.swop.cli",
    "sl": "daemons.sl.cli",
    "broker": "daemons.broker.cli",
    "certs": "certs.cli",
    "dashboard": "daemons.dashboard.cli",
}


def _modules(only: str | None = None) -> dict[str, ModuleType]:
    """The subcommands' modules: all of them, or just ``only``'s (a daemon's start then imports only
    its own code: each of them imports a lot, and several start at once on small machines)."""
    names = {only: _SUBCOMMANDS[only]} if only in _SUBCOMMANDS else _SUBCOMMANDS
    return {command: importlib.import_module(name) for command, name in names.items()}


def build_parser(modules: dict[str, ModuleType] | None = None) -> argparse.ArgumentParser:
    """The ``swarm`` parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="swarm", description="open Swarm Learning daemons: decentralised training over MQTT"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (modules or _modules()).values():
        module.add_parser(subparsers)
    return parser


def limit_blas_threads() -> None:
    """One OpenBLAS thread for the daemons, set before numpy loads.

    Merging is memory-bound; with OpenBLAS threads competing with the training processes for the
    cores, a 45 MB merge was measured 40x slower. The ML program gets the original setting back.
    """
    if "OPENBLAS_NUM_THREADS" not in os.environ:
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
        os.environ[BLAS_LIMITED] = "1"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``swarm`` console script."""
    limit_blas_threads()
    given = sys.argv[1:] if argv is None else argv
    modules = _modules(given[0] if given else None)
    args = build_parser(modules).parse_args(argv)
    try:
        return int(modules[args.command].run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
