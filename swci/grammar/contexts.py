"""Context commands: named connections to a Swarm Network node."""

from __future__ import annotations

from swci.argtypes import ArgKind
from swci.commands import (
    CreateContext,
    CreateContextService,
    GetContextEnv,
    GetContextInfo,
    GetContextVersion,
    ListContextEnv,
    ListContexts,
    SetContextEnv,
    SwitchContext,
)
from swci.grammar import args
from swci.pattern import Arg, Choice, Kw, Opt, Seq
from swci.registry import Family, Values, command

__all__: list[str] = []

_FAMILY = Family.CONTEXTS
_ENV = Arg("env", ArgKind.ENV, "env", "the variable name")


@command(
    ("CREATE", "CONTEXT"),
    family=_FAMILY,
    grammar=(
        args.context(),
        Choice(
            Seq(Kw("WITH"), Kw("IP"), args.host(), Opt(args.port())),
            Seq(Kw("WITH"), Kw("SERVICE"), args.service()),
            Seq(args.host(reserved=frozenset({"WITH"})), Opt(args.port()), hidden=True),
        ),
    ),
    summary="Create a context: a named connection to a Swarm Network node",
    help=(
        "Creates a context that points at the API of a Swarm Network (SN) node, given by IP "
        "address or host name and an optional port, or by the service name of a reverse "
        "proxy. Create contexts once; SWITCH CONTEXT makes one the active one. "
        "The pre-2.0 form CREATE CONTEXT <ctx> <ip> [<port>] is accepted too."
    ),
    examples=(
        "CREATE CONTEXT demo WITH IP sn1",
        "CREATE CONTEXT demo WITH IP 10.0.0.5 30304",
        "CREATE CONTEXT demo WITH SERVICE api.sn-1.swarm:443",
    ),
)
def _create_context(values: Values) -> CreateContext | CreateContextService:
    if values.has("service"):
        return CreateContextService(values.text("name"), values.text("service"))
    return CreateContext(values.text("name"), values.text("host"), values.opt_integer("port"))


@command(
    ("SWITCH", "CONTEXT"),
    family=_FAMILY,
    grammar=(args.context(),),
    summary="Make a context the active one",
    help="Makes the named context the active one; later commands go to its Swarm Network node.",
    examples=("SWITCH CONTEXT demo",),
)
def _switch_context(values: Values) -> SwitchContext:
    return SwitchContext(values.text("name"))


@command(
    ("GET", "CONTEXT", "INFO"),
    family=_FAMILY,
    grammar=(Opt(args.context()),),
    summary="Show a context (the active one by default)",
    help="Shows the named context, or the active one when no name is given.",
    examples=("GET CONTEXT INFO", "GET CONTEXT INFO demo"),
)
def _get_context_info(values: Values) -> GetContextInfo:
    return GetContextInfo(values.opt_text("name"))


@command(
    ("GET", "CONTEXT", "ENV"),
    family=_FAMILY,
    grammar=(args.context("context"), _ENV),
    summary="Show one environment variable of a context",
    help="Shows the value of one environment variable of a context.",
    examples=("GET CONTEXT ENV demo SWCI_RUN_TASK_MAX_WAIT_TIME",),
)
def _get_context_env(values: Values) -> GetContextEnv:
    return GetContextEnv(values.text("context"), values.text("env"))


@command(
    ("SET", "CONTEXT", "ENV"),
    family=_FAMILY,
    grammar=(
        args.context("context"),
        _ENV,
        Arg("value", ArgKind.TEXT, "value", "the value"),
    ),
    summary="Set an environment variable of a context",
    help="Sets an environment variable of a context. Quote a value that contains spaces.",
    examples=("SET CONTEXT ENV demo SWCI_RUN_TASK_MAX_WAIT_TIME 60",),
)
def _set_context_env(values: Values) -> SetContextEnv:
    return SetContextEnv(values.text("context"), values.text("env"), values.text("value"))


@command(
    ("LIST", "CONTEXT", "ENV"),
    family=_FAMILY,
    grammar=(args.context("context"),),
    summary="List the environment variables of a context",
    help="Lists every environment variable of a context with its value.",
    examples=("LIST CONTEXT ENV demo",),
)
def _list_context_env(values: Values) -> ListContextEnv:
    return ListContextEnv(values.text("context"))


@command(
    ("GET", "CONTEXT", "VERSION"),
    family=_FAMILY,
    summary="Show the version of the active context's Swarm Network node",
    help="Shows the software version of the Swarm Network node the active context points at.",
    examples=("GET CONTEXT VERSION",),
)
def _get_context_version(values: Values) -> GetContextVersion:
    return GetContextVersion()


@command(
    ("LIST", "CONTEXTS"),
    family=_FAMILY,
    summary="List the contexts of this session",
    help="Lists the contexts created so far and marks the active one.",
    examples=("LIST CONTEXTS",),
)
def _list_contexts(values: Values) -> ListContexts:
    return ListContexts()
