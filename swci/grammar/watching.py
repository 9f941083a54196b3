"""Training views: the live view of a contract and its curves as PNG files (open Swarm Learning)."""

from __future__ import annotations

from swci.argtypes import ArgKind
from swci.commands import PlotContract, WatchContract
from swci.grammar import args
from swci.pattern import Kw, Opt
from swci.registry import Family, Values, command

__all__: list[str] = []

_FAMILY = Family.CONTRACTS
_DEFAULT = "defaultbb.cqdb.sml.hpe"


@command(
    ("WATCH", "CONTRACT"),
    family=_FAMILY,
    grammar=(args.contract(), Opt(args.seconds("timeout", "timeout", "the timeout in seconds"))),
    summary="Watch a contract's training live",
    help=(
        "Shows the training under a contract as it happens, one row per node: epochs done of "
        "the total, the last loss and metric, the last round it merged in, who leads the "
        "rounds, its state and the time left (from totalEpochs), until the training is "
        "COMPLETE. Without a terminal it prints a line per change. Ctrl-C stops watching "
        "(the training goes on). An extension of open Swarm Learning."
    ),
    examples=(f"WATCH CONTRACT {_DEFAULT}", f"WATCH CONTRACT {_DEFAULT} 600"),
)
def _watch_contract(values: Values) -> WatchContract:
    return WatchContract(values.text("name"), values.opt_number("timeout"))


@command(
    ("PLOT", "CONTRACT"),
    family=_FAMILY,
    grammar=(args.contract(), Opt(Kw("TO"), args.path(ArgKind.DIRECTORY, "dir", "the directory"))),
    summary="Write a contract's training curves as PNG files",
    help=(
        "Writes the loss and metric curves of a contract's latest training as PNG files: "
        "<contract>.png with every node and the merged model, and <contract>-<node>.png per "
        "node, into the directory given (default: the current one). An extension of open "
        "Swarm Learning."
    ),
    examples=(f"PLOT CONTRACT {_DEFAULT}", f"PLOT CONTRACT {_DEFAULT} TO plots"),
)
def _plot_contract(values: Values) -> PlotContract:
    return PlotContract(values.text("name"), values.opt_text("path"))
