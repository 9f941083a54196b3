"""Contract commands: training contracts that sync rounds are recorded under."""

from __future__ import annotations

from swci.argtypes import ArgKind
from swci.commands import (
    CreateContract,
    GetContractInfo,
    GetContractStatus,
    ListContracts,
    Perfdata,
    PerfdataHistory,
    ResetContract,
)
from swci.grammar import args
from swci.pattern import Kw, Opt
from swci.registry import Family, Values, command

__all__: list[str] = []

_FAMILY = Family.CONTRACTS
_DEFAULT = "defaultbb.cqdb.sml.hpe"


@command(
    ("CREATE", "CONTRACT"),
    family=_FAMILY,
    grammar=(args.contract(),),
    summary="Register a training contract",
    help=(
        "Registers a training contract on the ledger (permanently). A contract lets "
        f"trainings run side by side; SwarmCallback uses {_DEFAULT} unless told otherwise."
    ),
    examples=("CREATE CONTRACT mnist-contract",),
)
def _create_contract(values: Values) -> CreateContract:
    return CreateContract(values.text("name"))


@command(
    ("GET", "CONTRACT", "INFO"),
    family=_FAMILY,
    grammar=(args.contract(),),
    summary="Show the static information of a contract",
    help="Shows the static information of a training contract.",
    examples=(f"GET CONTRACT INFO {_DEFAULT}",),
)
def _get_contract_info(values: Values) -> GetContractInfo:
    return GetContractInfo(values.text("name"))


@command(
    ("GET", "CONTRACT", "STATUS"),
    family=_FAMILY,
    grammar=(args.contract(),),
    summary="Show the training status of a contract",
    help="Shows the dynamic status of a training contract: its state, sync rounds and peers.",
    examples=(f"GET CONTRACT STATUS {_DEFAULT}",),
)
def _get_contract_status(values: Values) -> GetContractStatus:
    return GetContractStatus(values.text("name"))


@command(
    ("LIST", "CONTRACTS"),
    family=_FAMILY,
    summary="List the registered contracts",
    help="Lists every registered training contract.",
    examples=("LIST CONTRACTS",),
)
def _list_contracts(values: Values) -> ListContracts:
    return ListContracts()


@command(
    ("PERFDATA",),
    family=_FAMILY,
    grammar=(
        args.contract(),
        Opt(
            Kw("HISTORY", name="history"),
            Opt(Kw("TO"), args.path(ArgKind.FILE, "file", "the file to write (.csv or .json)")),
        ),
    ),
    summary="Show per-node training progress of a contract",
    help=(
        "Shows, for every learning node of a contract: its UID, whether it may lead merges, "
        "its latest loss and metric, and its total and completed epochs. With HISTORY (an "
        "extension of open Swarm Learning): every progress report and merged round of the "
        "contract's latest training, read from the ledger's chain (time, node, epoch, loss, "
        "metric, round, digest); TO <file> writes them as CSV, or as JSON for a .json file."
    ),
    examples=(
        f"PERFDATA {_DEFAULT}",
        f"PERFDATA {_DEFAULT} HISTORY",
        f"PERFDATA {_DEFAULT} HISTORY TO h.csv",
    ),
)
def _perfdata(values: Values) -> Perfdata | PerfdataHistory:
    if values.has("history"):
        return PerfdataHistory(values.text("name"), values.opt_text("path"))
    return Perfdata(values.text("name"))


@command(
    ("RESET", "CONTRACT"),
    family=_FAMILY,
    grammar=(args.contract(),),
    summary="Reset a completed contract for reuse",
    help=(
        "Returns a completed training contract to its uninitialised state, so that a new "
        f"training can use it (needed to train again under {_DEFAULT})."
    ),
    examples=(f"RESET CONTRACT {_DEFAULT}",),
)
def _reset_contract(values: Values) -> ResetContract:
    return ResetContract(values.text("name"))
