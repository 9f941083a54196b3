"""Tab completion driven by the registry and the live state.

:func:`suggest` is the pure part: given the text before the cursor it says what
may come next (keywords, filtered by the word being typed, in upper case; task
types; or placeholders for names and paths). :class:`SwciCompleter` turns that
into prompt-toolkit completions, filling placeholders with live names from a
:class:`~swci.session.NameSource` (the ledger's contexts, contracts, tasks,
taskrunners and node uids) and paths from the file system.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from prompt_toolkit.completion import CompleteEvent, Completer, Completion, PathCompleter
from prompt_toolkit.document import Document

from swci.argtypes import LIVE_KINDS, PATH_KINDS, ArgKind
from swci.grammar import REGISTRY
from swci.matcher import Expected, TokenError, match_pattern
from swci.pattern import Arg, Kw, Rest
from swci.registry import TrieNode
from swci.session import NameSource
from swci.tokenizer import Token, TokenKind, scan

__all__ = ["TASK_TYPES", "NameSource", "SwciCompleter", "Suggestion", "suggest"]

TASK_TYPES = ("RUN_SWARM", "MAKE_USER_CONTAINER", "PULL_IMAGE", "MAKE_SWARM_USER_CONTENT")
"""The task types of the reference system's task schema."""

_QUOTES = "'\""


@dataclass(frozen=True)
class Suggestion:
    """Something that may come next at the cursor.

    Attributes:
        text: the keyword or value to insert, or a placeholder like ``<task>``.
        kind: None for keywords; else what the argument names.
        prefix: the partial word before the cursor that the insertion replaces.
        meta: a short explanation (a command's summary, an argument's description).
        literal: True when ``text`` is inserted as is; False for a placeholder
            that the completer fills with live names or paths.
    """

    text: str
    kind: ArgKind | None
    prefix: str
    meta: str = ""
    literal: bool = True


def suggest(text_before_cursor: str) -> list[Suggestion]:
    """What may come next at the end of ``text_before_cursor`` (its last line)."""
    line = text_before_cursor.rsplit("\n", 1)[-1]
    scanned = scan(line)
    if scanned.comment_column is not None:
        return []
    tokens = list(scanned.tokens)
    prefix = ""
    if tokens and tokens[-1].end_column - 1 == len(line):
        if tokens[-1].kind is TokenKind.STRING:
            return []
        prefix = tokens.pop().text
    if any(token.kind is TokenKind.ERROR for token in tokens):
        return []
    try:
        return _filter(_next(tokens, line, prefix), prefix)
    except TokenError:
        return []


def _next(tokens: Sequence[Token], line: str, prefix: str) -> list[Suggestion]:
    walk = REGISTRY.walk(tokens)
    found: list[Suggestion] = []
    if walk.depth == len(tokens):
        found.extend(_children(walk.node, prefix))
    for depth, spec in walk.terminals:
        outcome = match_pattern(spec.grammar, tokens, depth, line, spec.name)
        furthest = outcome.furthest
        if furthest is None or furthest.position != len(tokens):
            continue
        values = outcome.values or {}
        for item in furthest.expected:
            found.extend(_expected(item, values, prefix))
        break  # the deepest command that reaches the cursor wins, as in the parser
    return found


def _children(node: TrieNode, prefix: str) -> Iterator[Suggestion]:
    for word, child in sorted(node.children.items()):
        if _visible(child):
            yield Suggestion(word, None, prefix, _keyword_meta(child))


def _visible(node: TrieNode) -> bool:
    if node.spec is not None and not node.spec.hidden:
        return True
    return any(_visible(child) for child in node.children.values())


def _keyword_meta(node: TrieNode) -> str:
    if node.spec is not None and not node.spec.hidden:
        return node.spec.summary
    return ", ".join(word for word, child in sorted(node.children.items()) if _visible(child))


def _expected(item: Expected, values: dict[str, object], prefix: str) -> Iterator[Suggestion]:
    if isinstance(item, Kw):
        yield Suggestion(item.word, None, prefix)
    elif isinstance(item, Arg) and item.kind is ArgKind.TASK_TYPE:
        yield from (Suggestion(name, item.kind, prefix, item.description) for name in TASK_TYPES)
    elif isinstance(item, Arg) and item.kind is ArgKind.TOPIC:
        yield from _topic(values.get(item.name, ()), prefix)
    elif isinstance(item, Arg | Rest):
        yield Suggestion(f"<{item.placeholder}>", item.kind, prefix, item.description, False)


def _topic(words: object, prefix: str) -> Iterator[Suggestion]:
    node = REGISTRY.root
    for word in words if isinstance(words, tuple) else ():
        child = node.children.get(str(word).upper())
        if child is None:
            return
        node = child
    yield from _children(node, prefix)


def _filter(found: Iterable[Suggestion], prefix: str) -> list[Suggestion]:
    wanted = prefix.upper()
    seen: set[tuple[str, ArgKind | None]] = set()
    kept: list[Suggestion] = []
    for item in found:
        key = (item.text, item.kind)
        if key in seen or (item.literal and not item.text.upper().startswith(wanted)):
            continue
        seen.add(key)
        kept.append(item)
    return kept


class SwciCompleter(Completer):
    """Completes keywords, live names and paths.

    Args:
        names: where live names come from (typically the executor); None: no names.
        cwd: the directory relative paths start from (typically the session's cwd).
    """

    def __init__(self, names: NameSource | None = None, cwd: Callable[[], Path] | None = None) -> None:
        self._names = names
        self._cwd = cwd or Path.cwd

    def get_completions(self, document: Document, complete_event: CompleteEvent) -> Iterator[Completion]:
        """The completions at the cursor."""
        for item in suggest(document.current_line_before_cursor):
            if item.literal:
                yield Completion(item.text, -len(item.prefix), display_meta=item.meta)
            elif item.kind in LIVE_KINDS:
                yield from self._live(item)
            elif item.kind in PATH_KINDS:
                yield from self._paths(item, complete_event)

    def _live(self, item: Suggestion) -> Iterator[Completion]:
        if self._names is None or item.kind is None:
            return
        typed, quoted = _unquote(item.prefix)
        for name in dict.fromkeys(self._names.names(item.kind)):
            if name.lower().startswith(typed.lower()):
                text = _quote(name) if quoted or _needs_quotes(name) else name
                yield Completion(text, -len(item.prefix), display=name, display_meta=item.kind.value)

    def _paths(self, item: Suggestion, event: CompleteEvent) -> Iterator[Completion]:
        typed, quoted = _unquote(item.prefix)
        completer = PathCompleter(
            only_directories=item.kind is ArgKind.DIRECTORY,
            get_paths=lambda: [str(self._cwd())],
            expanduser=True,
        )
        for found in completer.get_completions(Document(typed), event):
            path = typed[: len(typed) + found.start_position] + found.text
            directory = found.display_text.endswith("/")
            path += "/" if directory else ""
            if quoted or _needs_quotes(path):
                # a directory's quote stays open, so that completion can go on inside it
                path = _quote(path)[:-1] if directory else _quote(path)
            yield Completion(path, -len(item.prefix), display=found.display)


def _unquote(prefix: str) -> tuple[str, bool]:
    """The partial word without its opening quote, and whether it had one."""
    if prefix[:1] in _QUOTES and prefix:
        return prefix[1:], True
    return prefix, False


def _needs_quotes(name: str) -> bool:
    return not name or any(char.isspace() for char in name) or name[0] in _QUOTES + "#"


def _quote(name: str) -> str:
    escaped = name.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
