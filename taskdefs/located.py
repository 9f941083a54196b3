"""YAML documents with the line and column of every mapping key and sequence item.

PyYAML composes the text into nodes that carry marks; ``load_located`` turns the nodes into plain
Python data (safe scalars only) and records, for each path, where its key or item starts. Problems
that PyYAML would silently accept (duplicate keys, merge keys, recursive aliases) and every syntax
error become :class:`~taskdefs.errors.Issue` objects, raised together as one ``TaskDefError``.

Paths are tuples of mapping keys (``str``: the key's text as written) and sequence indexes
(``int``), e.g. ``("Body", "SharedContent", 0, "MType")``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from taskdefs.errors import Issue, TaskDefError
from wire.files import read_bounded

__all__ = [
    "MAX_DEPTH",
    "MAX_NODES",
    "MAX_TEXT",
    "Located",
    "KeyPath",
    "format_path",
    "load_located",
    "read_text",
]

KeyPath = tuple[str | int, ...]

MAX_TEXT = 1_000_000
MAX_NODES = 100_000
MAX_DEPTH = 64
_MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class Located:
    """Plain data of one YAML document and where each part of it is written.

    Attributes:
        source: file name used in issues.
        data: the document as dicts, lists and scalars (``None`` for an empty document).
        marks: ``path -> (line, column)`` (1-based) of each mapping key and sequence item; the
            path ``root`` maps to the start of the document.
        root: path prefix of ``data`` inside the whole document (``("Body",)`` for a task body).
    """

    source: str
    data: object
    marks: dict[KeyPath, tuple[int, int]] = field(default_factory=dict)
    root: KeyPath = ()

    def resolve(self, rel: KeyPath) -> tuple[KeyPath, KeyPath]:
        """Follow ``rel`` (relative to ``root``) through the data.

        A string step into a list of single-key maps (``- gpus: all``) finds the item holding
        that key. Returns ``(shown, found)``: the full path to show (found part, then the rest of
        ``rel``) and the deepest full path that exists in the text.
        """
        found: list[str | int] = []
        current = self.data
        for pos, part in enumerate(rel):
            step = _step(current, part)
            if step is None:
                shown = self.root + tuple(found) + rel[pos:]
                return shown, self.root + tuple(found)
            found.extend(step[0])
            current = step[1]
        return self.root + tuple(found), self.root + tuple(found)

    def mark(self, path: KeyPath) -> tuple[int, int]:
        """Line and column of ``path``, or of its nearest written ancestor."""
        for end in range(len(path), -1, -1):
            hit = self.marks.get(path[:end])
            if hit is not None:
                return hit
        return (1, 1)


def _step(current: object, part: str | int) -> tuple[KeyPath, object] | None:
    if isinstance(current, dict) and isinstance(part, str) and part in current:
        return (part,), current[part]
    if isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current):
        return (part,), current[part]
    if isinstance(current, list) and isinstance(part, str):
        for index, item in enumerate(current):
            if isinstance(item, dict) and part in item:
                return (index, part), item[part]
    return None


def format_path(path: KeyPath) -> str:
    """``("Body", "SharedContent", 0, "MType")`` -> ``Body.SharedContent[0].MType``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


class _TooLargeError(Exception):
    """The document expands to more nodes than ``MAX_NODES`` (e.g. an alias bomb)."""


class _Builder:
    """Turns composed nodes into data, recording marks and issues."""

    def __init__(self, source: str, root: KeyPath) -> None:
        self.source = source
        self.root = root
        self.marks: dict[KeyPath, tuple[int, int]] = {}
        self.issues: list[Issue] = []
        self._constructor = SafeConstructor()
        self._active: set[int] = set()
        self._count = 0

    def issue(self, node: Node, path: KeyPath, message: str) -> None:
        mark = node.start_mark
        self.issues.append(Issue(self.source, mark.line + 1, mark.column + 1, format_path(path), message))

    def build(self, node: Node, path: KeyPath) -> object:
        self._count += 1
        if self._count > MAX_NODES:
            raise _TooLargeError
        if id(node) in self._active:
            self.issue(node, path, "recursive YAML alias; the value refers to itself")
            return None
        if len(path) - len(self.root) > MAX_DEPTH:
            self.issue(node, path, f"nested more than {MAX_DEPTH} levels deep")
            return None
        self._active.add(id(node))
        try:
            if isinstance(node, MappingNode):
                return self._mapping(node, path)
            if isinstance(node, SequenceNode):
                return self._sequence(node, path)
            return self._scalar(node, path)
        finally:
            self._active.discard(id(node))

    def _scalar(self, node: Node, path: KeyPath) -> object:
        try:
            return self._constructor.construct_object(node)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
            reason = getattr(exc, "problem", None) or str(exc)
            self.issue(node, path, f"cannot read this value: {reason}")
            return None

    def _sequence(self, node: SequenceNode, path: KeyPath) -> list[object]:
        items: list[object] = []
        for index, child in enumerate(node.value):
            child_path = (*path, index)
            self.marks[child_path] = _mark(child)
            items.append(self.build(child, child_path))
        return items

    def _mapping(self, node: MappingNode, path: KeyPath) -> dict[str, object]:
        out: dict[str, object] = {}
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = self._key(key_node, path)
            if key is None:
                continue
            child_path = (*path, key)
            if key in seen:
                self.issue(key_node, child_path, f"duplicate key '{key}' (first at line {seen[key]})")
                continue
            seen[key] = key_node.start_mark.line + 1
            self.marks[child_path] = _mark(key_node)
            out[key] = self.build(value_node, child_path)
        return out

    def _key(self, key_node: Node, path: KeyPath) -> str | None:
        if key_node.tag == _MERGE_TAG:
            self.issue(key_node, path, "YAML merge keys ('<<') are not supported; write the keys out")
            return None
        if not isinstance(key_node, ScalarNode):
            self.issue(key_node, path, "a mapping key must be a plain name, not a list or mapping")
            return None
        return str(key_node.value)


def _mark(node: Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _syntax_issue(source: str, text: str, exc: yaml.YAMLError) -> Issue:
    line, column = 1, 1
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        line, column = mark.line + 1, mark.column + 1
    elif isinstance(exc, yaml.reader.ReaderError):
        before = text[: exc.position]
        line = before.count("\n") + 1
        column = exc.position - (before.rfind("\n") + 1) + 1
    problem = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    if isinstance(exc, yaml.reader.ReaderError):
        character = chr(exc.character) if isinstance(exc.character, int) else exc.character
        problem = f"character {character!r} is not allowed in YAML"
    message = str(problem or exc)
    if context and problem:
        context_mark = getattr(exc, "context_mark", None)
        started = f" at line {context_mark.line + 1}" if context_mark is not None else ""
        message = f"{context}{started}: {message.removeprefix('but ')}"
    return Issue(source, line, column, "", f"YAML syntax error: {message}")


def load_located(text: str, source: str = "<string>", root: KeyPath = ()) -> Located:
    """Parse one YAML document into plain data with the position of every key and item.

    Args:
        text: the YAML text.
        source: name used in issues (usually the file name).
        root: path prefix of this document inside a larger one (``("Body",)`` for a task body).

    Returns:
        The located document.

    Raises:
        TaskDefError: syntax errors, duplicate keys, unsupported YAML features, oversized input.
    """
    if len(text) > MAX_TEXT:
        raise TaskDefError.single(source, f"larger than {MAX_TEXT} characters")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise TaskDefError([_syntax_issue(source, text, exc)]) from None
    except RecursionError:
        raise TaskDefError.single(source, "YAML nested too deeply") from None
    builder = _Builder(source, root)
    if node is None:
        return Located(source, None, {root: (1, 1)}, root)
    builder.marks[root] = _mark(node)
    try:
        data = builder.build(node, root)
    except _TooLargeError:
        raise TaskDefError.single(source, f"YAML expands to more than {MAX_NODES} values") from None
    if builder.issues:
        raise TaskDefError(builder.issues)
    return Located(source, data, builder.marks, root)


def read_text(path: str | os.PathLike[str]) -> str:
    """Read a UTF-8 file; unreadable files and bad bytes become a located ``TaskDefError``."""
    source = os.fspath(path)
    try:
        raw = read_bounded(path)
    except OSError as exc:
        raise TaskDefError.single(source, f"cannot read the file: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        before = raw[: exc.start]
        line = before.count(b"\n") + 1
        column = exc.start - (before.rfind(b"\n") + 1) + 1
        message = f"not UTF-8 text (byte 0x{raw[exc.start]:02x})"
        raise TaskDefError.single(source, message, line=line, column=column) from None
