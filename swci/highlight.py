"""Syntax highlighting of the line being typed: keywords, numbers, strings, comments."""

from __future__ import annotations

from collections.abc import Callable

from prompt_toolkit.document import Document
from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.lexers import Lexer
from prompt_toolkit.styles import Style

from swci.grammar import REGISTRY
from swci.tokenizer import Token, TokenKind, scan

__all__ = ["STYLE", "SwciLexer", "fragments"]

STYLE = Style.from_dict(
    {
        "prompt": "bold",
        "rprompt": "ansibrightblack",
        "keyword": "bold ansiblue",
        "number": "ansicyan",
        "string": "ansigreen",
        "comment": "italic ansibrightblack",
        "error": "ansired underline",
    }
)
"""The prompt's style: classes used by :class:`SwciLexer` and the prompt."""

_KEYWORDS = REGISTRY.keywords


class SwciLexer(Lexer):
    """A prompt-toolkit lexer built on :func:`swci.tokenizer.scan`."""

    def lex_document(self, document: Document) -> Callable[[int], StyleAndTextTuples]:
        """Style every line of the document."""
        lines = document.lines

        def get_line(number: int) -> StyleAndTextTuples:
            return fragments(lines[number]) if 0 <= number < len(lines) else []

        return get_line


def fragments(line: str) -> StyleAndTextTuples:
    """The styled fragments of one line (their texts concatenate to ``line``)."""
    scanned = scan(line)
    styled: StyleAndTextTuples = []
    position = 0
    for token in scanned.tokens:
        start = token.column - 1
        if start > position:
            styled.append(("", line[position:start]))
        styled.append((_style(token), token.text))
        position = start + len(token.text)
    if scanned.comment_column is not None:
        start = scanned.comment_column - 1
        styled.append(("", line[position:start]))
        styled.append(("class:comment", line[start:]))
    elif position < len(line):
        styled.append(("", line[position:]))
    return [fragment for fragment in styled if fragment[1]]


def _style(token: Token) -> str:
    if token.kind is TokenKind.WORD:
        return "class:keyword" if token.value.upper() in _KEYWORDS else ""
    return {
        TokenKind.NUMBER: "class:number",
        TokenKind.STRING: "class:string",
        TokenKind.ERROR: "class:error",
    }[token.kind]
