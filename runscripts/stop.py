"""``stop-swarm``: stop the nodes that ``run-sn``, ``run-swop``, ``run-swci`` and ``run-sl`` started."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from runscripts.state import alive, find_records, stop_node

__all__ = ["main"]

_KINDS = {
    "sl": "Swarm Learning",
    "sn": "Swarm Network",
    "swci": "Swarm Command Interface",
    "swop": "Swarm Operator",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Stop (SIGTERM, then SIGKILL after a grace period) the recorded nodes of the chosen kinds."""
    parser = argparse.ArgumentParser(prog="stop-swarm", description="Stop Swarm Learning platform components")
    parser.add_argument("--all", action="store_true", help="stop all components - SL, SN, SWCI and SWOP")
    for role, title in _KINDS.items():
        parser.add_argument(f"--{role}", action="store_true", help=f"stop {title} nodes")
    parser.add_argument(
        "--keep", action="store_true", help="keep the records of stopped nodes (and their logs)"
    )
    parser.add_argument("--sudo", action="store_true", help="accepted; no docker commands are run")
    args = parser.parse_args(argv)
    chosen = {role for role in _KINDS if getattr(args, role)}
    if args.all or not chosen:
        chosen = set(_KINDS)
    for role in ("sl", "swop", "swci", "sn"):  # the SN last: the others report to it as they stop
        if role in chosen:
            _stop_role(role, keep=args.keep)
    return 0


def _stop_role(role: str, *, keep: bool) -> None:
    title = _KINDS[role]
    records = find_records({role})
    running = [r for r in records if alive(r)]
    print(f"Stopping all running {title} nodes")
    if not running:
        print(f"No running {title} nodes found")
    for record in running:
        stop_node(record)
        print(
            f"stopped {record.name} (pid {record.pid})" + (f"; its log is {record.log}" if record.log else "")
        )
    if not keep:
        for record in records:
            record.path.unlink(missing_ok=True)
