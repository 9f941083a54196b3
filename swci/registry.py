"""The command registry: the single source of the parser's dispatch, HELP and completion.

Each command registers itself with the :func:`command` decorator on the function
that builds its typed command object::

    @command(
        ("ASSIGN", "TASK"),
        family=Family.TASKRUNNERS,
        grammar=(task_arg, Kw("TO"), runner_arg, Choice(...)),
        summary="Start a task on a taskrunner's peers",
        help="...",
        examples=("ASSIGN TASK train TO defaulttaskbb.taskdb.sml.hpe WITH 2 PEERS",),
    )
    def _assign_task(values: Values) -> AssignTask: ...

The registry records the keyword path, grammar (from which the syntax lines and
the kinds of the arguments are derived), summary, help and examples, and keeps a
keyword trie for longest-path dispatch.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar, get_args, get_type_hints

from swci.argtypes import ArgKind
from swci.commands import Command
from swci.pattern import Choice, Kw, Opt, Pattern, iter_args, syntax_lines
from swci.tokenizer import Token, TokenKind

__all__ = [
    "REGISTRY",
    "ArgKind",
    "CommandSpec",
    "Family",
    "Registry",
    "TrieNode",
    "Values",
    "Walk",
    "command",
]

C = TypeVar("C", bound=Command)
_CLOSE = 0.6


class Family(enum.Enum):
    """Command families, in the order HELP lists them."""

    CONTEXTS = "Contexts"
    CONTRACTS = "Contracts"
    TASKS = "Tasks"
    TASKRUNNERS = "Taskrunners"
    SESSION = "Session and files"


class Values:
    """The values a grammar matched, with typed accessors for builders."""

    def __init__(self, raw: Mapping[str, object]) -> None:
        self._raw = dict(raw)

    def has(self, name: str) -> bool:
        """Whether the value was matched."""
        return name in self._raw

    def text(self, name: str) -> str:
        """A required string value."""
        return _typed(self._raw[name], str, name)

    def opt_text(self, name: str) -> str | None:
        """An optional string value."""
        return None if name not in self._raw else self.text(name)

    def integer(self, name: str) -> int:
        """A required int value."""
        return _typed(self._raw[name], int, name)

    def opt_integer(self, name: str) -> int | None:
        """An optional int value."""
        return None if name not in self._raw else self.integer(name)

    def number(self, name: str) -> float:
        """A required float value."""
        return _typed(self._raw[name], float, name)

    def opt_number(self, name: str) -> float | None:
        """An optional float value."""
        return None if name not in self._raw else self.number(name)

    def words(self, name: str) -> tuple[str, ...]:
        """A tuple of strings (from :class:`~swci.pattern.Many`)."""
        value = _typed(self._raw.get(name, ()), tuple, name)
        return tuple(_typed(word, str, name) for word in value)

    def get(self, name: str) -> object:
        """Any value, untyped."""
        return self._raw[name]


_T = TypeVar("_T")


def _typed(value: object, kind: type[_T], name: str) -> _T:
    if not isinstance(value, kind):
        message = f"grammar value {name!r} is {type(value).__name__}, not {kind.__name__}"
        raise TypeError(message)
    return value


@dataclass(frozen=True)
class CommandSpec:
    """Everything known about one command.

    Attributes:
        path: the leading keywords.
        family: the group HELP lists it under.
        summary: one line for the HELP table and completion menus.
        help: the longer explanation of ``HELP <command>``.
        grammar: what follows the keywords.
        build: turns matched values into the command object.
        command_types: the classes ``build`` may return.
        examples: example lines (tests check that each parses to one of ``command_types``).
        hidden: parses, but is not listed by HELP nor offered by completion.
    """

    path: tuple[str, ...]
    family: Family
    summary: str
    help: str
    grammar: Pattern
    build: Callable[[Values], Command]
    command_types: tuple[type[Command], ...]
    examples: tuple[str, ...] = ()
    hidden: bool = False

    @property
    def name(self) -> str:
        """The keyword path as one string: ``ASSIGN TASK``."""
        return " ".join(self.path)

    @property
    def syntax_lines(self) -> tuple[str, ...]:
        """One syntax line per form."""
        return syntax_lines(self.path, self.grammar)

    @property
    def syntax(self) -> str:
        """All forms on one line, separated by ``|``."""
        return " | ".join(self.syntax_lines)

    @property
    def args(self) -> tuple[ArgKind, ...]:
        """The kinds of the arguments, in order, without repeats."""
        kinds = (arg.kind for arg in iter_args(self.grammar))
        return tuple(dict.fromkeys(kinds))


@dataclass
class TrieNode:
    """A node of the keyword trie: the keywords so far, the command ending here, what follows."""

    path: tuple[str, ...]
    spec: CommandSpec | None = None
    children: dict[str, TrieNode] = field(default_factory=dict)


@dataclass(frozen=True)
class Walk:
    """How far a line's leading words follow the keyword trie.

    Attributes:
        node: the deepest node reached.
        depth: the number of keyword tokens consumed.
        terminals: ``(depth, spec)`` of the commands passed on the way, deepest first.
    """

    node: TrieNode
    depth: int
    terminals: tuple[tuple[int, CommandSpec], ...]


class Registry:
    """Commands by keyword path, with a keyword trie for dispatch."""

    def __init__(self) -> None:
        self._specs: dict[tuple[str, ...], CommandSpec] = {}
        self._by_type: dict[type[Command], CommandSpec] = {}
        self.root = TrieNode(())

    def register(self, spec: CommandSpec) -> None:
        """Add a command; its path and command type must be new."""
        if spec.path in self._specs:
            raise ValueError(f"command {spec.name} is registered twice")
        for command_type in spec.command_types:
            if command_type in self._by_type:
                raise ValueError(f"{command_type.__name__} has two commands")
            self._by_type[command_type] = spec
        self._specs[spec.path] = spec
        node = self.root
        for depth, word in enumerate(spec.path, start=1):
            node = node.children.setdefault(word, TrieNode(spec.path[:depth]))
        node.spec = spec

    def __iter__(self) -> Iterator[CommandSpec]:
        """Every command, hidden ones included, in registration order."""
        return iter(self._specs.values())

    def visible(self) -> tuple[CommandSpec, ...]:
        """The commands HELP lists, in registration order."""
        return tuple(spec for spec in self if not spec.hidden)

    def get(self, path: Sequence[str]) -> CommandSpec | None:
        """The command with exactly this (upper-case) keyword path."""
        return self._specs.get(tuple(path))

    def spec_for(self, cmd: Command) -> CommandSpec:
        """The command a parsed command object came from."""
        return self._by_type[type(cmd)]

    @property
    def keywords(self) -> frozenset[str]:
        """Every keyword of every command path and grammar."""
        words: set[str] = set()
        for spec in self:
            words.update(spec.path)
            words.update(_grammar_keywords(spec.grammar))
        return frozenset(words)

    def closest(self, words: Sequence[str], *, limit: int = 3) -> list[str]:
        """The names of the visible commands closest to the typed (upper-case) words.

        The first word weighs most: it is the one that did not match any command.
        """
        scored: list[tuple[float, str]] = []
        for spec in self.visible():
            typed = " ".join(words[: len(spec.path)])
            whole = difflib.SequenceMatcher(None, typed, spec.name).ratio()
            first = difflib.SequenceMatcher(None, words[0] if words else "", spec.path[0]).ratio()
            score = 0.6 * first + 0.4 * whole
            if score >= _CLOSE:
                scored.append((score, spec.name))
        scored.sort(key=lambda pair: (-pair[0], pair[1]))
        return [name for _, name in scored[:limit]]

    def walk(self, tokens: Sequence[Token]) -> Walk:
        """Follow the leading keyword tokens down the trie as far as they go."""
        node, depth = self.root, 0
        terminals: list[tuple[int, CommandSpec]] = []
        while True:
            if node.spec is not None:
                terminals.append((depth, node.spec))
            if not node.children or depth >= len(tokens):
                break
            token = tokens[depth]
            child = node.children.get(token.value.upper())
            if token.kind is not TokenKind.WORD or child is None:
                break
            node, depth = child, depth + 1
        return Walk(node, depth, tuple(reversed(terminals)))


def _grammar_keywords(grammar: Pattern) -> Iterator[str]:
    for item in grammar:
        if isinstance(item, Kw):
            yield item.word
        elif isinstance(item, Opt):
            yield from _grammar_keywords(item.items)
        elif isinstance(item, Choice):
            for alt in item.alternatives:
                yield from _grammar_keywords(alt.items)


def _returned_types(build: Callable[..., object]) -> tuple[type[Command], ...]:
    annotation = get_type_hints(build)["return"]
    types = get_args(annotation) or (annotation,)
    if not all(isinstance(kind, type) and issubclass(kind, Command) for kind in types):
        raise TypeError(f"{build.__name__} must be annotated to return Command classes")
    return tuple(types)


REGISTRY = Registry()
"""The registry the grammar modules fill (import :mod:`swci.grammar` to fill it)."""


def command(
    path: tuple[str, ...],
    *,
    family: Family,
    summary: str,
    help: str,
    grammar: Pattern = (),
    examples: tuple[str, ...] = (),
    hidden: bool = False,
    registry: Registry = REGISTRY,
) -> Callable[[Callable[[Values], C]], Callable[[Values], C]]:
    """Register the decorated builder as the command with this keyword path.

    The builder's return annotation names the command class.
    """

    def decorate(build: Callable[[Values], C]) -> Callable[[Values], C]:
        spec = CommandSpec(
            path=tuple(word.upper() for word in path),
            family=family,
            summary=summary,
            help=help,
            grammar=grammar,
            build=build,
            command_types=_returned_types(build),
            examples=examples,
            hidden=hidden,
        )
        registry.register(spec)
        return build

    return decorate
