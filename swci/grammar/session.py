"""Session and file commands: help, the working directory, pauses, waits and exiting."""

from __future__ import annotations

from swci.argtypes import ArgKind, NameType
from swci.commands import (
    Cd,
    Exit,
    ExitOnFailure,
    Help,
    ListNodes,
    Ls,
    Pwd,
    Sleep,
    WaitForIp,
    WaitForService,
)
from swci.grammar import args
from swci.pattern import Arg, Choice, Kw, Many, Opt, Seq
from swci.registry import Family, Values, command

__all__: list[str] = []

_FAMILY = Family.SESSION


@command(
    ("HELP",),
    family=_FAMILY,
    grammar=(Many(Arg("topic", ArgKind.TOPIC, "command", "a command word", NameType(upper=True))),),
    summary="List the commands, or show how to use one",
    help=(
        "HELP alone lists every command with a one-line summary. HELP followed by the "
        "first words of a command shows its syntax, explanation and examples; HELP CREATE "
        "shows every CREATE command. Keywords are case-insensitive; Tab completes them."
    ),
    examples=("HELP", "HELP ASSIGN TASK", "help create"),
)
def _help(values: Values) -> Help:
    words = values.words("topic")
    return Help(words or None)


@command(
    ("CD",),
    family=_FAMILY,
    grammar=(args.path(ArgKind.DIRECTORY, "dir", "the directory"),),
    summary="Change the current directory",
    help=(
        "Changes the directory that relative paths (CREATE TASK FROM, LS) start from. "
        "/platform/swarm/usr stands for the user directory given with --usr-dir."
    ),
    examples=("CD /platform/swarm/usr", "cd taskdefs"),
)
def _cd(values: Values) -> Cd:
    return Cd(values.text("path"))


@command(
    ("LS",),
    family=_FAMILY,
    grammar=(Opt(args.path(ArgKind.FILE, "path", "the path")),),
    summary="List a directory (the current one by default)",
    help="Lists the files of a directory, the current one when none is given.",
    examples=("LS", "ls taskdefs"),
)
def _ls(values: Values) -> Ls:
    return Ls(values.opt_text("path"))


@command(
    ("PWD",),
    family=_FAMILY,
    summary="Show the current directory",
    help="Shows the directory that relative paths start from.",
    examples=("PWD",),
)
def _pwd(values: Values) -> Pwd:
    return Pwd()


@command(
    ("EXIT",),
    family=_FAMILY,
    summary="Leave the shell",
    help="Leaves the shell at once; in a script, nothing after it runs. Ctrl-D does the same.",
    examples=("EXIT",),
)
def _exit(values: Values) -> Exit:
    return Exit()


@command(
    ("EXIT", "ON", "FAILURE"),
    family=_FAMILY,
    grammar=(Opt(Choice(Seq(Kw("ON", name="state")), Seq(Kw("OFF", name="state")))),),
    summary="Leave the shell when a later command fails (bare form: ON)",
    help=(
        "With ON (or no argument), the first command that fails afterwards (a syntax error "
        "or a command that reports an error) ends the session, and a script ends with "
        "failure. OFF (the default) goes on after failures."
    ),
    examples=("EXIT ON FAILURE", "EXIT ON FAILURE OFF"),
)
def _exit_on_failure(values: Values) -> ExitOnFailure:
    return ExitOnFailure(values.opt_text("state") != "OFF")


@command(
    ("LIST", "NODES"),
    family=_FAMILY,
    summary="List the active swarm nodes",
    help=(
        "Lists the live nodes of the swarm (SN, SWOP, SL, ML): type, host, port, name, UID, "
        "parent UID and when each was last seen."
    ),
    examples=("LIST NODES",),
)
def _list_nodes(values: Values) -> ListNodes:
    return ListNodes()


@command(
    ("SLEEP",),
    family=_FAMILY,
    grammar=(args.seconds(),),
    summary="Pause for some seconds",
    help="Pauses for the given number of seconds (fractions allowed); Ctrl-C cuts it short.",
    examples=("SLEEP 15",),
)
def _sleep(values: Values) -> Sleep:
    return Sleep(values.number("seconds"))


@command(
    ("WAIT", "FOR", "IP"),
    family=_FAMILY,
    grammar=(args.host(), Opt(args.port(), Opt(args.retries()))),
    summary="Wait until a Swarm Network node answers at an address",
    help=(
        "Waits until the Swarm Network node at this IP address or host name (and port) "
        "answers, trying every 5 seconds up to <retries> times (360 by default: 30 minutes)."
    ),
    examples=("WAIT FOR IP sn1", "WAIT FOR IP 10.0.0.5 30304 60"),
)
def _wait_for_ip(values: Values) -> WaitForIp:
    return WaitForIp(values.text("host"), values.opt_integer("port"), values.opt_integer("retries"))


@command(
    ("WAIT", "FOR", "SERVICE"),
    family=_FAMILY,
    grammar=(args.service(), Opt(args.retries())),
    summary="Wait until a Swarm Network node answers at a service name",
    help=(
        "Like WAIT FOR IP, for a Swarm Network node reached through a reverse-proxy "
        "service name, fqdn[:port]."
    ),
    examples=("WAIT FOR SERVICE api.sn-1.swarm", "WAIT FOR SERVICE api.sn-1.swarm:443 10"),
)
def _wait_for_service(values: Values) -> WaitForService:
    return WaitForService(values.text("service"), values.opt_integer("retries"))
