"""Split one SWCI command line into located tokens.

A line holds words, numbers and quoted strings separated by whitespace; a word
that starts with ``#`` begins a comment that runs to the end of the line. The
tokenizer never raises: an unterminated string becomes an ``ERROR`` token whose
``value`` says what is wrong, so that the parser reports it where it matters and
the completer and highlighter can still work on half-typed input.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

__all__ = ["Scan", "Token", "TokenKind", "scan", "tokenize"]

_NUMBER = re.compile(r"[+-]?[0-9]+(?:\.[0-9]+)?")
_QUOTES = "'\""
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"'}


class TokenKind(enum.Enum):
    """What a token is."""

    WORD = "word"
    NUMBER = "number"
    STRING = "string"
    ERROR = "error"


@dataclass(frozen=True)
class Token:
    """One token of a command line.

    Attributes:
        kind: word, number, quoted string, or error.
        text: the exact source text (quotes and escapes included).
        value: the string value (unquoted and unescaped for strings; the
            error message for ``ERROR`` tokens).
        line: 1-based line number.
        column: 1-based column of the first character.
    """

    kind: TokenKind
    text: str
    value: str
    line: int
    column: int

    @property
    def end_column(self) -> int:
        """Column just past the token."""
        return self.column + len(self.text)

    def is_keyword(self, keyword: str) -> bool:
        """Whether this is the (case-insensitive) keyword; quoted strings never are."""
        return self.kind is TokenKind.WORD and self.value.upper() == keyword

    @property
    def number(self) -> int | float | None:
        """The numeric value of a ``NUMBER`` token, else None."""
        if self.kind is not TokenKind.NUMBER:
            return None
        return float(self.text) if "." in self.text else int(self.text)


@dataclass(frozen=True)
class Scan:
    """A tokenized line and where its comment starts (1-based column), if it has one."""

    tokens: tuple[Token, ...]
    comment_column: int | None


def tokenize(text: str, *, line: int = 1) -> list[Token]:
    """The tokens of one line; comments and whitespace are dropped.

    Args:
        text: one line of SWCI input (without its line break).
        line: the line number to record in the tokens.

    Returns:
        The tokens in order; empty for blank and comment-only lines.
    """
    return list(scan(text, line=line).tokens)


def scan(text: str, *, line: int = 1) -> Scan:
    """Like :func:`tokenize`, also reporting where a comment starts."""
    tokens: list[Token] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char.isspace():
            index += 1
        elif char == "#":
            return Scan(tuple(tokens), index + 1)
        elif char in _QUOTES:
            token = _string(text, index, line)
            tokens.append(token)
            index += len(token.text)
        else:
            token = _word(text, index, line)
            tokens.append(token)
            index += len(token.text)
    return Scan(tuple(tokens), None)


def _word(text: str, start: int, line: int) -> Token:
    end = start
    while end < len(text) and not text[end].isspace():
        end += 1
    word = text[start:end]
    kind = TokenKind.NUMBER if _NUMBER.fullmatch(word) else TokenKind.WORD
    return Token(kind, word, word, line, start + 1)


def _string(text: str, start: int, line: int) -> Token:
    quote = text[start]
    chars: list[str] = []
    index = start + 1
    while index < len(text):
        char = text[index]
        if char == quote:
            return Token(TokenKind.STRING, text[start : index + 1], "".join(chars), line, start + 1)
        if char == "\\" and index + 1 < len(text):
            following = text[index + 1]
            chars.append(_ESCAPES.get(following, "\\" + following))
            index += 2
            continue
        chars.append(char)
        index += 1
    message = f"unterminated string: missing the closing {quote}"
    return Token(TokenKind.ERROR, text[start:], message, line, start + 1)
