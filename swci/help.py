"""HELP: the command list and per-command help, rendered from the registry.

``HELP`` lists every command grouped by family with its summary; ``HELP <words>``
shows the syntax, explanation and examples of the command those words name, or
every command they begin (``HELP CREATE``); unknown words get the closest
commands.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table as RichTable
from rich.text import Text

from swci.grammar import REGISTRY
from swci.output import Table
from swci.registry import CommandSpec, Family
from swci.wording import join_or

__all__ = [
    "HelpTopic",
    "find_help",
    "help_data",
    "help_table",
    "not_found_message",
    "render_help",
    "styled_syntax",
]

_PLACEHOLDER = re.compile(r"<[^>]+>")
_PUNCTUATION = re.compile(r"[\[\]{}|]|\.\.\.")


@dataclass(frozen=True)
class HelpTopic:
    """What ``HELP <words>`` refers to.

    Attributes:
        words: the topic, upper-cased (empty: every command).
        specs: the commands to show.
        exact: whether ``specs[0]`` is the one command the words name
            (the others are related commands that start with the same words).
        suggestions: the closest command names when nothing matched.
    """

    words: tuple[str, ...]
    specs: tuple[CommandSpec, ...]
    exact: bool
    suggestions: tuple[str, ...] = ()

    @property
    def found(self) -> bool:
        """Whether any command matched."""
        return bool(self.specs)


def find_help(topic: Sequence[str] | None) -> HelpTopic:
    """Resolve a help topic to commands.

    Args:
        topic: command words as typed (any case), or None for every command.
    """
    words = tuple(word.upper() for word in topic or ())
    order = list(Family)
    visible = tuple(sorted(REGISTRY.visible(), key=lambda spec: order.index(spec.family)))
    if not words:
        return HelpTopic(words, visible, exact=False)
    starting = tuple(spec for spec in visible if spec.path[: len(words)] == words)
    exact = REGISTRY.get(words)
    if exact is not None and not exact.hidden:
        related = tuple(spec for spec in starting if spec is not exact)
        return HelpTopic(words, (exact, *related), exact=True)
    if starting:
        return HelpTopic(words, starting, exact=len(starting) == 1)
    for length in range(len(words) - 1, 0, -1):
        spec = REGISTRY.get(words[:length])
        if spec is not None and not spec.hidden:
            return HelpTopic(words, (spec,), exact=True)
    return HelpTopic(words, (), exact=False, suggestions=tuple(REGISTRY.closest(words)))


def render_help(topic: Sequence[str] | None) -> RenderableType:
    """The rich rendering of ``HELP [topic]``."""
    found = find_help(topic)
    if not found.words:
        return _overview(found.specs)
    if not found.found:
        return Text(_not_found_message(found), style="bold red")
    if found.exact:
        return _details(found.specs[0], found.specs[1:])
    return _listing(found)


def help_table(topic: Sequence[str] | None) -> Table | None:
    """The plain table behind ``HELP [topic]`` (for JSON output), None if nothing matched."""
    found = find_help(topic)
    if not found.found:
        return None
    rows = ((spec.family.value, spec.name, spec.syntax, spec.summary) for spec in found.specs)
    return Table.of("SWCI commands", ("family", "command", "syntax", "summary"), rows)


def help_data(topic: Sequence[str] | None) -> dict[str, Any]:
    """Structured help: the matched commands in full, or the suggestions."""
    found = find_help(topic)
    commands = [
        {
            "command": spec.name,
            "family": spec.family.value,
            "syntax": list(spec.syntax_lines),
            "summary": spec.summary,
            "help": spec.help,
            "examples": list(spec.examples),
            "args": [kind.value for kind in spec.args],
        }
        for spec in found.specs
    ]
    return {"topic": list(found.words), "commands": commands, "suggestions": list(found.suggestions)}


def not_found_message(topic: Sequence[str]) -> str:
    """The message for a topic that names no command."""
    return _not_found_message(find_help(topic))


def _not_found_message(found: HelpTopic) -> str:
    typed = " ".join(found.words)
    if found.suggestions:
        return f"no command matches {typed!r}; did you mean {join_or(found.suggestions)}?"
    return f"no command matches {typed!r}; HELP lists every command"


def _overview(specs: Sequence[CommandSpec]) -> RenderableType:
    table = RichTable(
        title="SWCI commands",
        title_justify="left",
        caption="HELP <command> shows its syntax and examples. Keywords are case-insensitive; "
        "Tab completes commands and names.",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        header_style="bold",
    )
    table.add_column("Command", no_wrap=True)
    table.add_column("Summary")
    for family in Family:
        members = [spec for spec in specs if spec.family is family]
        if not members:
            continue
        table.add_row(Text(family.value, style="bold magenta"), "")
        for index, spec in enumerate(members):
            table.add_row(
                Text("  " + spec.name, style="bold"),
                spec.summary,
                end_section=index == len(members) - 1,
            )
    return table


def _details(spec: CommandSpec, related: Sequence[CommandSpec]) -> RenderableType:
    title = Text.assemble((spec.name, "bold"), " - ", spec.summary)
    parts: list[RenderableType] = [title, Text()]
    parts.extend(Text("  ") + styled_syntax(line) for line in spec.syntax_lines)
    parts.extend([Text(), Text(spec.help)])
    if spec.examples:
        parts.extend([Text(), Text("Examples", style="bold")])
        parts.extend(Text("  " + example, style="green") for example in spec.examples)
    if related:
        names = ", ".join(other.name for other in related)
        parts.extend([Text(), Text.assemble(("See also: ", "bold"), names)])
    return Group(*parts)


def _listing(found: HelpTopic) -> RenderableType:
    table = RichTable(
        title=f"Commands starting with {' '.join(found.words)}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        header_style="bold",
    )
    table.add_column("Syntax")
    table.add_column("Summary")
    for spec in found.specs:
        syntax = Text("\n").join(styled_syntax(line) for line in spec.syntax_lines)
        table.add_row(syntax, spec.summary)
    return table


def styled_syntax(line: str) -> Text:
    """A syntax line with keywords bold and placeholders in italic cyan."""
    text = Text(line, style="bold")
    text.highlight_regex(_PLACEHOLDER, "not bold italic cyan")
    text.highlight_regex(_PUNCTUATION, "not bold dim")
    return text
