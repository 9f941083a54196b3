"""Parse SWCI command lines and scripts into typed commands.

Dispatch follows the longest keyword path in the registry's trie (``GET
TASKRUNNER PEER STATUS`` before ``GET TASKRUNNER STATUS``); the command's grammar
then matches the rest of the line. When nothing matches, the error points at
the furthest token any candidate reached and lists everything that would have
been accepted there.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from swci.commands import Command
from swci.errors import ScriptError, SwciSyntaxError
from swci.grammar import REGISTRY
from swci.matcher import END, Expected, Failure, TokenError, describe, match_pattern
from swci.pattern import Kw
from swci.registry import Values, Walk
from swci.tokenizer import Token, TokenKind, tokenize
from swci.wording import join_or

__all__ = ["ScriptError", "SwciSyntaxError", "parse_line", "parse_script"]

_CLOSE = 0.6


def parse_line(text: str, *, line_no: int = 1) -> Command | None:
    """Parse one command line.

    Args:
        text: the line (a trailing line break is ignored).
        line_no: the line number used in error locations.

    Returns:
        The command, or None for a blank or comment-only line.

    Raises:
        SwciSyntaxError: the line is not a valid command; the error says where and
            what was expected.
    """
    text = text.removesuffix("\n").removesuffix("\r")
    first, newline, _ = text.partition("\n")
    if newline:
        column = len(first) + 1
        raise SwciSyntaxError(line_no, column, "one command per line; use a script", first)
    tokens = tokenize(text, line=line_no)
    if not tokens:
        return None
    try:
        return _parse_tokens(tokens, text)
    except TokenError as exc:
        raise _located(exc.token, exc.message, text) from None


def parse_script(text: str, *, source: str | None = None) -> list[tuple[int, Command]]:
    """Parse a whole script, collecting every syntax error.

    Args:
        text: the script; one command per line, ``#`` comments and blank lines allowed.
        source: the script's name for error locations.

    Returns:
        ``(line number, command)`` for every command line.

    Raises:
        ScriptError: with every :class:`SwciSyntaxError` of the script.
    """
    commands: list[tuple[int, Command]] = []
    errors: list[SwciSyntaxError] = []
    for line_no, line in enumerate(text.removeprefix("\ufeff").splitlines(), start=1):
        try:
            parsed = parse_line(line, line_no=line_no)
        except SwciSyntaxError as exc:
            errors.append(exc.with_source(source))
            continue
        if parsed is not None:
            commands.append((line_no, parsed))
    if errors:
        raise ScriptError(errors, source)
    return commands


def _parse_tokens(tokens: Sequence[Token], text: str) -> Command:
    walk = REGISTRY.walk(tokens)
    if walk.depth == 0:
        raise _unknown_command(tokens, text)
    failures: list[tuple[int, Failure]] = []
    for depth, spec in walk.terminals:
        outcome = match_pattern(spec.grammar, tokens, depth, text, spec.name)
        if outcome.values is not None:
            return spec.build(Values(outcome.values))
        if outcome.furthest is not None:
            failures.append((depth, outcome.furthest))
    if walk.node.children:
        failures.append((walk.depth, _keyword_failure(walk)))
    raise _error(_furthest(failures), tokens, text, walk)


def _keyword_failure(walk: Walk) -> Failure:
    expected = tuple(Kw(word) for word in sorted(walk.node.children))
    return Failure(walk.depth, expected, " ".join(walk.node.path))


def _furthest(failures: list[tuple[int, Failure]]) -> Failure:
    """The failure that got furthest; on a tie, the longest keyword path's (merged)."""
    position = max(failure.position for _, failure in failures)
    depth = max(depth for depth, failure in failures if failure.position == position)
    at_best = [f for d, f in failures if f.position == position and d == depth]
    expected: dict[Expected, None] = {}
    for failure in at_best:
        expected.update(dict.fromkeys(failure.expected))
    if END in expected:  # "end of line" reads best last
        del expected[END]
        expected[END] = None
    return Failure(position, tuple(expected), at_best[0].after)


def _error(failure: Failure, tokens: Sequence[Token], text: str, walk: Walk) -> SwciSyntaxError:
    names = join_or([describe(item) for item in failure.expected])
    got = tokens[failure.position] if failure.position < len(tokens) else None
    message = f"expected {names} after {failure.after}, got {_describe_token(got)}"
    message += _keyword_hint(failure, got, tokens, walk)
    if got is None:
        return SwciSyntaxError(tokens[0].line, _end_column(tokens), message, text)
    return _located(got, message, text)


def _keyword_hint(failure: Failure, got: Token | None, tokens: Sequence[Token], walk: Walk) -> str:
    keywords = [item.word for item in failure.expected if isinstance(item, Kw)]
    if got is not None and got.kind is TokenKind.WORD:
        close = difflib.get_close_matches(got.value.upper(), keywords, n=1, cutoff=_CLOSE)
        if close:
            return f" (did you mean {close[0]}?)"
    stop = tokens[walk.depth] if walk.depth < len(tokens) else None
    if stop is None or stop is got or stop.kind is not TokenKind.WORD or not walk.node.children:
        return ""
    children = list(walk.node.children)
    close = difflib.get_close_matches(stop.value.upper(), children, n=1, cutoff=_CLOSE)
    if not close:
        return ""
    return f" (did you mean {' '.join((*walk.node.path, close[0]))}?)"


def _unknown_command(tokens: Sequence[Token], text: str) -> SwciSyntaxError:
    first = tokens[0]
    words = [token.value.upper() for token in tokens if token.kind is TokenKind.WORD]
    close = REGISTRY.closest(words)
    hint = f"; did you mean {join_or(close)}?" if close else "; type HELP to list the commands"
    return _located(first, f"unknown command {first.text!r}{hint}", text)


def _located(token: Token, message: str, text: str) -> SwciSyntaxError:
    width = min(len(token.text), max(1, len(text) - token.column + 1))
    return SwciSyntaxError(token.line, token.column, message, text, width=width)


def _end_column(tokens: Sequence[Token]) -> int:
    return tokens[-1].end_column + 1


def _describe_token(token: Token | None) -> str:
    if token is None:
        return "end of line"
    return repr(token.text)
