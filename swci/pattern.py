"""The little grammar language that describes what follows a command's keywords.

A command's grammar is a tuple of elements: keywords (:class:`Kw`), arguments
(:class:`Arg`), optional parts (:class:`Opt`), alternatives (:class:`Choice` of
:class:`Seq`), repeated arguments (:class:`Many`) and the raw rest of the line
(:class:`Rest`). The same tuple drives the parser (:mod:`swci.matcher`), the
syntax lines of ``HELP`` and the completer, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypeAlias

from swci.argtypes import ArgKind, ArgType, NameType

__all__ = [
    "Arg",
    "Choice",
    "Element",
    "Kw",
    "Many",
    "Opt",
    "Pattern",
    "Rest",
    "Seq",
    "iter_args",
    "render",
    "syntax_lines",
]


@dataclass(frozen=True)
class Kw:
    """A keyword (case-insensitive); ``name`` records which keyword matched."""

    word: str
    name: str | None = None

    @property
    def description(self) -> str:
        """How messages name it."""
        return self.word


@dataclass(frozen=True)
class Arg:
    """An argument: one token, recognised and converted by ``type``.

    Attributes:
        name: key of the value handed to the command's builder.
        kind: what it names (drives completion).
        placeholder: how syntax lines show it (``<placeholder>``).
        description: how error messages name it ("the task name").
        type: how the token is recognised and converted.
    """

    name: str
    kind: ArgKind
    placeholder: str
    description: str
    type: ArgType = field(default=NameType())


@dataclass(frozen=True)
class Rest:
    """The raw rest of the line (comments and quotes kept), at least one character."""

    name: str
    placeholder: str
    description: str
    kind: ArgKind = ArgKind.TEXT


@dataclass(frozen=True)
class Many:
    """Zero or more of one argument; the value is a tuple."""

    item: Arg


@dataclass(frozen=True, init=False)
class Seq:
    """A sequence of elements: one alternative of a :class:`Choice`.

    ``hidden`` alternatives parse but are left out of syntax lines and
    completion (for legacy forms).
    """

    items: tuple[Element, ...]
    hidden: bool

    def __init__(self, *items: Element, hidden: bool = False) -> None:
        object.__setattr__(self, "items", items)
        object.__setattr__(self, "hidden", hidden)


@dataclass(frozen=True, init=False)
class Opt:
    """An optional sequence: taken when it matches, skipped otherwise."""

    items: tuple[Element, ...]

    def __init__(self, *items: Element) -> None:
        object.__setattr__(self, "items", items)


@dataclass(frozen=True, init=False)
class Choice:
    """Ordered alternatives; the first that matches wins."""

    alternatives: tuple[Seq, ...]

    def __init__(self, *alternatives: Seq | Element) -> None:
        seqs = tuple(alt if isinstance(alt, Seq) else Seq(alt) for alt in alternatives)
        object.__setattr__(self, "alternatives", seqs)


Element: TypeAlias = "Kw | Arg | Opt | Choice | Many | Rest"
Pattern: TypeAlias = tuple[Element, ...]


def iter_args(items: tuple[Element, ...]) -> Iterator[Arg | Rest]:
    """Every argument of a pattern, depth first, hidden alternatives included."""
    for item in items:
        if isinstance(item, Arg | Rest):
            yield item
        elif isinstance(item, Many):
            yield item.item
        elif isinstance(item, Opt):
            yield from iter_args(item.items)
        elif isinstance(item, Choice):
            for alt in item.alternatives:
                yield from iter_args(alt.items)


def render(items: tuple[Element, ...]) -> str:
    """The syntax of a sequence: ``TO <taskrunner> [<port>] {A | B}``."""
    return " ".join(part for part in (_render_one(item) for item in items) if part)


def syntax_lines(path: tuple[str, ...], grammar: Pattern) -> tuple[str, ...]:
    """One syntax line per visible form; a trailing choice becomes one line per alternative."""
    head = " ".join(path)
    if grammar and isinstance(grammar[-1], Choice):
        prefix = render(grammar[:-1])
        visible = [alt for alt in grammar[-1].alternatives if not alt.hidden]
        return tuple(_join(head, prefix, render(alt.items)) for alt in visible)
    return (_join(head, render(grammar)),)


def _join(*parts: str) -> str:
    return " ".join(part for part in parts if part)


def _render_one(item: Element) -> str:
    if isinstance(item, Kw):
        return item.word
    if isinstance(item, Arg | Rest):
        return f"<{item.placeholder}>"
    if isinstance(item, Many):
        return f"[<{item.item.placeholder}> ...]"
    if isinstance(item, Opt):
        if len(item.items) == 1 and isinstance(item.items[0], Choice):
            return f"[{_render_alternatives(item.items[0])}]"
        return f"[{render(item.items)}]"
    return _render_choice(item)


def _render_alternatives(choice: Choice) -> str:
    return " | ".join(render(alt.items) for alt in choice.alternatives if not alt.hidden)


def _render_choice(choice: Choice) -> str:
    visible = [alt for alt in choice.alternatives if not alt.hidden]
    if len(visible) == 1:
        return render(visible[0].items)
    return "{" + _render_alternatives(choice) + "}"
