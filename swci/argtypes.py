"""What a command's arguments are: their kind (for completion) and type (for parsing).

``ArgKind`` says what an argument names, so that the completer knows where to
look (the ledger's contexts, contracts, tasks, taskrunners and nodes; the file
system). An ``ArgType`` decides whether a token can be the argument at all
(``accepts``, used to choose between alternatives) and converts it, raising
:class:`ArgValueError` for a token that is clearly meant as the argument but is
out of range (a port of 70000, 0 peers).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from swci.tokenizer import Token, TokenKind

__all__ = [
    "LIVE_KINDS",
    "PATH_KINDS",
    "ArgKind",
    "ArgType",
    "ArgValueError",
    "IntType",
    "NameType",
    "PeerRefType",
    "SecondsType",
    "ServiceType",
]

_VALUE_KINDS = frozenset({TokenKind.WORD, TokenKind.NUMBER, TokenKind.STRING})
MAX_PORT = 65535


class ArgKind(enum.Enum):
    """What an argument names."""

    CONTEXT = "context"
    CONTRACT = "contract"
    TASK = "task"
    TASKRUNNER = "taskrunner"
    NODE = "node uid"
    FILE = "file path"
    DIRECTORY = "directory"
    NUMBER = "number"
    HOST = "host"
    SERVICE = "service"
    ENV = "env var"
    TEXT = "text"
    TASK_TYPE = "task type"
    TOPIC = "help topic"


LIVE_KINDS = frozenset({ArgKind.CONTEXT, ArgKind.CONTRACT, ArgKind.TASK, ArgKind.TASKRUNNER, ArgKind.NODE})
"""Kinds whose values come from the live state (the ledger, the session)."""

PATH_KINDS = frozenset({ArgKind.FILE, ArgKind.DIRECTORY})
"""Kinds completed from the file system."""


class ArgValueError(ValueError):
    """A token meant as an argument has a bad value; the message says what is valid."""


class ArgType(Protocol):
    """How one argument is recognised and converted."""

    def accepts(self, token: Token) -> bool:
        """Whether the token can be this argument (used to pick between alternatives)."""
        ...

    def convert(self, token: Token, what: str) -> object:
        """The argument's value.

        Args:
            token: an accepted token.
            what: the argument's description for messages ("the port").

        Raises:
            ArgValueError: the value is out of range.
        """
        ...


@dataclass(frozen=True)
class NameType:
    """Any word, number or quoted string, except the reserved keywords."""

    reserved: frozenset[str] = frozenset()
    upper: bool = False

    def accepts(self, token: Token) -> bool:
        """Words, numbers and strings, but not a reserved word."""
        if token.kind not in _VALUE_KINDS:
            return False
        return not (token.kind is TokenKind.WORD and token.value.upper() in self.reserved)

    def convert(self, token: Token, what: str) -> object:
        """The name as typed (upper-cased if asked)."""
        if not token.value:
            raise ArgValueError(f"{what} must not be empty")
        return token.value.upper() if self.upper else token.value


@dataclass(frozen=True)
class IntType:
    """A whole number in ``[minimum, maximum]``."""

    minimum: int
    maximum: int | None = None

    def accepts(self, token: Token) -> bool:
        """Only number tokens."""
        return token.kind is TokenKind.NUMBER

    def convert(self, token: Token, what: str) -> object:
        """The int, range-checked."""
        value = token.number
        if not isinstance(value, int):
            raise ArgValueError(f"{what} must be a whole number, got {token.text}")
        if self.maximum is not None and not self.minimum <= value <= self.maximum:
            raise ArgValueError(f"{what} must be between {self.minimum} and {self.maximum}, got {value}")
        if value < self.minimum:
            raise ArgValueError(f"{what} must be at least {self.minimum}, got {value}")
        return value


@dataclass(frozen=True)
class SecondsType:
    """A non-negative number of seconds (fractions allowed)."""

    def accepts(self, token: Token) -> bool:
        """Only number tokens."""
        return token.kind is TokenKind.NUMBER

    def convert(self, token: Token, what: str) -> object:
        """The seconds as a float."""
        value = token.number
        if value is None or value < 0:
            raise ArgValueError(f"{what} must not be negative, got {token.text}")
        return float(value)


@dataclass(frozen=True)
class PeerRefType:
    """A SWOP index (a whole number >= 0) or a SWOP uid (anything else)."""

    def accepts(self, token: Token) -> bool:
        """Words, numbers and strings."""
        return token.kind in _VALUE_KINDS

    def convert(self, token: Token, what: str) -> object:
        """An int index or the uid string."""
        if token.kind is TokenKind.NUMBER:
            return IntType(0).convert(token, what)
        return NameType().convert(token, what)


@dataclass(frozen=True)
class ServiceType:
    """A service name ``fqdn[:port]``; a port, when given, must be 1-65535."""

    def accepts(self, token: Token) -> bool:
        """Words and strings (a number is no service name)."""
        return token.kind in (TokenKind.WORD, TokenKind.STRING)

    def convert(self, token: Token, what: str) -> object:
        """The service string, its port checked."""
        value = str(NameType().convert(token, what))
        host, colon, port = value.rpartition(":")
        if not colon:
            return value
        if not host:
            raise ArgValueError(f"{what} needs a host name before ':', got {value!r}")
        if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= MAX_PORT:
            raise ArgValueError(f"the port of {what} must be between 1 and {MAX_PORT}, got {port!r}")
        return value
