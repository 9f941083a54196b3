"""Match a token list against a command's grammar (see :mod:`swci.pattern`).

A small backtracking matcher in the PEG style: ordered choice, optional parts
taken greedily. It remembers the furthest position where something was
expected and everything expected there, which gives precise errors ("expected
TO after the task name, got 'INTO'") and, when the furthest position is the
end of the input, exactly what the completer may offer next.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from swci.argtypes import ArgValueError
from swci.pattern import Arg, Choice, Element, Kw, Many, Opt, Pattern, Rest
from swci.tokenizer import Token, TokenKind

__all__ = [
    "END",
    "EndOfLine",
    "Expected",
    "Failure",
    "MatchOutcome",
    "TokenError",
    "describe",
    "match_pattern",
]


@dataclass(frozen=True)
class EndOfLine:
    """What is expected where the command could end."""

    description: str = "end of line"


END: Final = EndOfLine()

Expected: TypeAlias = "Kw | Arg | Rest | EndOfLine"
_Step: TypeAlias = tuple[int, str]


class TokenError(Exception):
    """A token that is wrong whatever the alternative (a bad value, an unterminated string)."""

    def __init__(self, token: Token, message: str) -> None:
        super().__init__(message)
        self.token = token
        self.message = message


@dataclass(frozen=True)
class Failure:
    """The furthest point the match reached.

    Attributes:
        position: index of the token where something else was expected
            (``len(tokens)`` for the end of the line).
        expected: everything that would have been accepted there.
        after: description of what came just before ("the task name").
    """

    position: int
    expected: tuple[Expected, ...]
    after: str


@dataclass(frozen=True)
class MatchOutcome:
    """``values`` when the whole line matched (else None) and the furthest expectations."""

    values: dict[str, object] | None
    furthest: Failure | None = field(default=None)


def describe(item: Expected) -> str:
    """How an error message names an expected item."""
    return item.description


def match_pattern(
    grammar: Pattern, tokens: Sequence[Token], start: int, text: str, after: str
) -> MatchOutcome:
    """Match ``tokens[start:]`` against ``grammar`` and require the end of the line.

    Args:
        grammar: the command's grammar.
        tokens: all tokens of the line.
        start: index of the first token after the command's keywords.
        text: the source line (for :class:`~swci.pattern.Rest`).
        after: description of what precedes ``start`` (the command's keywords).

    Returns:
        The values on success; the furthest expectations in any case.

    Raises:
        TokenError: a token's value is invalid, or it is an unterminated string.
    """
    matcher = _Matcher(tokens, text)
    values: dict[str, object] = {}
    step = matcher.seq(grammar, start, values, after)
    if step is not None and step[0] == len(tokens):
        return MatchOutcome(values, matcher.furthest())
    if step is not None:
        matcher.expect(step[0], END, step[1])
    return MatchOutcome(None, matcher.furthest())


class _Matcher:
    def __init__(self, tokens: Sequence[Token], text: str) -> None:
        self.tokens = tokens
        self.text = text
        self.best_position = -1
        self.best: list[Expected] = []
        self.best_after = ""
        self.quiet: list[int] = []  # start positions of hidden alternatives being tried

    def furthest(self) -> Failure | None:
        if self.best_position < 0:
            return None
        return Failure(self.best_position, tuple(self.best), self.best_after)

    def expect(self, position: int, item: Expected, after: str) -> None:
        if position in self.quiet:  # a hidden form is not offered where it starts
            return
        if position > self.best_position:
            self.best_position, self.best, self.best_after = position, [item], after
        elif position == self.best_position and item not in self.best:
            self.best.append(item)

    def peek(self, position: int) -> Token | None:
        if position >= len(self.tokens):
            return None
        token = self.tokens[position]
        if token.kind is TokenKind.ERROR:
            raise TokenError(token, token.value)
        return token

    def seq(
        self, items: tuple[Element, ...], position: int, values: dict[str, object], after: str
    ) -> _Step | None:
        step: _Step | None = (position, after)
        for item in items:
            if step is None:
                return None
            step = self.element(item, step[0], values, step[1])
        return step

    def element(self, item: Element, position: int, values: dict[str, object], after: str) -> _Step | None:
        if isinstance(item, Kw):
            return self.keyword(item, position, values, after)
        if isinstance(item, Arg):
            return self.argument(item, position, values, after)
        if isinstance(item, Opt):
            return self.optional(item, position, values, after)
        if isinstance(item, Choice):
            return self.choice(item, position, values, after)
        if isinstance(item, Many):
            return self.many(item, position, values, after)
        return self.rest(item, position, values, after)

    def keyword(self, item: Kw, position: int, values: dict[str, object], after: str) -> _Step | None:
        token = self.peek(position)
        if token is not None and token.is_keyword(item.word):
            if item.name is not None:
                values[item.name] = item.word
            return position + 1, item.word
        self.expect(position, item, after)
        return None

    def argument(self, item: Arg, position: int, values: dict[str, object], after: str) -> _Step | None:
        token = self.peek(position)
        if token is None or not item.type.accepts(token):
            self.expect(position, item, after)
            return None
        try:
            values[item.name] = item.type.convert(token, item.description)
        except ArgValueError as exc:
            raise TokenError(token, str(exc)) from None
        return position + 1, item.description

    def optional(self, item: Opt, position: int, values: dict[str, object], after: str) -> _Step | None:
        trial = dict(values)
        step = self.seq(item.items, position, trial, after)
        if step is None:
            return position, after
        values.update(trial)
        return step

    def choice(self, item: Choice, position: int, values: dict[str, object], after: str) -> _Step | None:
        for alternative in item.alternatives:
            trial = dict(values)
            if alternative.hidden:
                self.quiet.append(position)
            try:
                step = self.seq(alternative.items, position, trial, after)
            finally:
                if alternative.hidden:
                    self.quiet.pop()
            if step is not None:
                values.update(trial)
                return step
        return None

    def many(self, item: Many, position: int, values: dict[str, object], after: str) -> _Step:
        found: list[object] = []
        step: _Step | None = (position, after)
        while step is not None:
            position, after = step
            step = self.argument(item.item, position, values, after)
            if step is not None:
                found.append(values[item.item.name])
        values[item.item.name] = tuple(found)
        return position, after

    def rest(self, item: Rest, position: int, values: dict[str, object], after: str) -> _Step | None:
        begin = self.tokens[position - 1].end_column - 1 if position > 0 else 0
        raw = self.text[begin:].strip()
        if not raw:
            self.expect(position, item, after)
            return None
        remaining = self.tokens[position:]
        single = len(remaining) == 1 and remaining[0].kind is TokenKind.STRING
        values[item.name] = remaining[0].value if single and remaining[0].text == raw else raw
        return len(self.tokens), item.description
