"""Argument definitions shared by the command families (placeholders and error wording)."""

from __future__ import annotations

from swci.argtypes import MAX_PORT, ArgKind, IntType, NameType, SecondsType, ServiceType
from swci.pattern import Arg

__all__ = [
    "context",
    "contract",
    "host",
    "path",
    "port",
    "retries",
    "seconds",
    "service",
    "task",
    "taskrunner",
]


def context(name: str = "name") -> Arg:
    """A context name."""
    return Arg(name, ArgKind.CONTEXT, "ctx", "the context name")


def contract(name: str = "name") -> Arg:
    """A training contract name."""
    return Arg(name, ArgKind.CONTRACT, "contract", "the contract name")


def task(name: str = "name") -> Arg:
    """A task name."""
    return Arg(name, ArgKind.TASK, "task", "the task name")


def taskrunner(name: str = "name") -> Arg:
    """A taskrunner name."""
    return Arg(name, ArgKind.TASKRUNNER, "taskrunner", "the taskrunner name")


def host(*, reserved: frozenset[str] = frozenset()) -> Arg:
    """An IP address or host name."""
    return Arg("host", ArgKind.HOST, "ip", "the IP address or host name", NameType(reserved))


def port() -> Arg:
    """A TCP port, 1-65535."""
    return Arg("port", ArgKind.NUMBER, "port", "the port", IntType(1, MAX_PORT))


def retries() -> Arg:
    """A number of retries, >= 0."""
    return Arg("retries", ArgKind.NUMBER, "retries", "the number of retries", IntType(0))


def seconds(
    name: str = "seconds", placeholder: str = "seconds", description: str = "the number of seconds"
) -> Arg:
    """A non-negative number of seconds."""
    return Arg(name, ArgKind.NUMBER, placeholder, description, SecondsType())


def service() -> Arg:
    """A reverse-proxy service name, ``fqdn[:port]``."""
    return Arg("service", ArgKind.SERVICE, "fqdn[:port]", "the service name", ServiceType())


def path(kind: ArgKind, placeholder: str, description: str) -> Arg:
    """A file-system path."""
    return Arg("path", kind, placeholder, description)
