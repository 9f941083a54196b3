"""``run-sn``, ``run-swop``, ``run-sl`` and ``run-swci``: the reference's scripts over our commands.

Each takes the reference script's options: the container options (explained, see
:mod:`runscripts.common`), ``--name``, ``-e VAR=VALUE``, ``-d``, and hands the rest to ``swarm sn``,
``swarm swop``, ``swarm sl`` or ``swci``, which accept the reference's names (``--host-ip``,
``--sn-api-port``, ``--key/--cert/--capath``, ``--usr-dir``, ``--profile-file-name``, ``--ml-*`` ...).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from runscripts.common import (
    Launch,
    add_common_options,
    data_dir,
    env_pairs,
    explain_container_options,
    launch,
)
from runscripts.state import find_records

__all__ = ["run_sl", "run_sn", "run_swci", "run_swop"]

_IGNORED_NOTES = {
    "--sn-p2p-port": "no blockchain peer-to-peer port; SNs replicate the ledger over the broker",
    "--docker-group-id": "no docker here; the SWOP starts its SL and ML nodes as processes",
    "--swop-uid": "the SWOP runs as the user who starts it",
    "--sl-fs-port": "no SL file server port; SLs exchange models over the broker",
    "--ml-image": "no image; the ML program runs with this installation's Python "
    "(or a SWOP-built environment, --ml-python)",
    "--ml-name": "no ML container; the ML program is a child process of its SL",
}


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=description, epilog="Other options go to the command this one wraps."
    )
    add_common_options(parser)
    return parser


def _default_name(role: str) -> str:
    taken = {record.name for record in find_records()}
    return next(f"{role}{n}" for n in range(1, 10_000) if f"{role}{n}" not in taken)


def _note_ignored(prog: str, rest: Sequence[str]) -> None:
    for option, why in _IGNORED_NOTES.items():
        if any(arg == option or arg.startswith(option + "=") for arg in rest):
            print(f"{prog}: {option}: {why}", file=sys.stderr)


def _check(prog: str, argv: list[str]) -> None:
    """Parse the wrapped command's arguments now, so that a mistake shows before ``-d`` detaches."""
    from daemons.cli import build_parser  # noqa: PLC0415 - only the daemons' wrappers need it

    parser = build_parser()
    parser.prog = prog
    parser.parse_args(argv)


def _run(
    prog: str,
    role: str,
    description: str,
    build: Callable[[argparse.Namespace, list[str], str], list[str]],
    argv: Sequence[str] | None,
    *,
    module: str = "daemons.cli",
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> int:
    parser = _parser(prog, description)
    if extra is not None:
        extra(parser)
    args, rest = parser.parse_known_args(argv)
    explain_container_options(prog, args)
    _note_ignored(prog, rest)
    name = args.name or _default_name(role)
    forwarded = build(args, rest, name)
    if module == "daemons.cli":
        _check(prog, forwarded)
    return launch(Launch(prog, role, name, module, forwarded, env_pairs(prog, args.env), args.detach))


def _sentinel_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sentinel", nargs="?", const="1", default=None, help="this SN creates the ledger (the first SN)"
    )


def _sn_argv(args: argparse.Namespace, rest: list[str], name: str) -> list[str]:
    sentinel = ["--sentinel"] if str(args.sentinel or "").lower() in ("1", "true", "yes") else []
    return ["sn", *sentinel, *rest, "--data-dir", str(data_dir(name) / "sn")]


def run_sn(argv: Sequence[str] | None = None) -> int:
    """``run-sn``: a Swarm Network node (the ledger, with its broker on --host-ip:--sn-api-port)."""
    return _run("run-sn", "sn", "Start a Swarm Network node.", _sn_argv, argv, extra=_sentinel_flag)


def _swop_argv(args: argparse.Namespace, rest: list[str], name: str) -> list[str]:
    return ["swop", *_without(rest, ("--docker-group-id", "--swop-uid")), "--work-dir", str(data_dir(name))]


def run_swop(argv: Sequence[str] | None = None) -> int:
    """``run-swop``: a SWOP with ``--usr-dir`` and ``--profile-file-name``."""
    return _run("run-swop", "swop", "Start a Swarm Operator node.", _swop_argv, argv)


def _sl_argv(args: argparse.Namespace, rest: list[str], name: str) -> list[str]:
    has_run_dir = any(arg == "--run-dir" or arg.startswith("--run-dir=") for arg in rest)
    run_dir = [] if has_run_dir else ["--run-dir", str(data_dir(name))]
    return ["sl", "--name", name, *run_dir, *rest]


def run_sl(argv: Sequence[str] | None = None) -> int:
    """``run-sl``: one SL node and its ML program, named by ``--name`` (an SL certificate may be shared)."""
    return _run("run-sl", "sl", "Start a Swarm Learning node and its ML program.", _sl_argv, argv)


def _swci_argv(args: argparse.Namespace, rest: list[str], name: str) -> list[str]:
    return list(rest)


def run_swci(argv: Sequence[str] | None = None) -> int:
    """``run-swci``: the SWCI shell (``--usr-dir``, ``--init-script-name``; ``-e SWCI_MODE=WEB``)."""
    return _run("run-swci", "swci", "Start the SWCI shell.", _swci_argv, argv, module="swci.main")


def _without(args: list[str], options: tuple[str, ...]) -> list[str]:
    """``args`` without ``options`` and their values (``--opt value`` or ``--opt=value``)."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in options:
            skip = True
        elif not any(arg.startswith(option + "=") for option in options):
            out.append(arg)
    return out
