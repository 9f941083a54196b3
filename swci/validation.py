"""Show syntax errors in the prompt, at the offending token, before the command runs.

:class:`SwciValidator` runs the parser on the line being edited. On Enter
(``validate``) every error counts: the line is not accepted, the cursor moves to
the offending token and the message appears under the prompt. While typing
(``validate_async``) errors at the word being typed or at the end of the line are
kept quiet, since the line is simply not finished yet.
"""

from __future__ import annotations

from prompt_toolkit.document import Document
from prompt_toolkit.validation import ValidationError, Validator

from swci.errors import SwciSyntaxError
from swci.parser import parse_line
from swci.tokenizer import tokenize

__all__ = ["SwciValidator", "error_offset"]


class SwciValidator(Validator):
    """Validates SWCI command lines with :func:`swci.parser.parse_line`."""

    def validate(self, document: Document) -> None:
        """Strict validation (on Enter).

        Raises:
            ValidationError: at the offending token.
        """
        try:
            parse_line(document.text)
        except SwciSyntaxError as exc:
            raise ValidationError(error_offset(document, exc), exc.message) from None

    async def validate_async(self, document: Document) -> None:
        """Lenient validation (while typing): an unfinished line is no error yet."""
        try:
            parse_line(document.text)
        except SwciSyntaxError as exc:
            offset = error_offset(document, exc)
            if _unfinished(document.text, offset):
                return
            raise ValidationError(offset, exc.message) from None


def error_offset(document: Document, error: SwciSyntaxError) -> int:
    """The cursor position of an error's column in the document."""
    row = min(max(error.line - 1, 0), max(document.line_count - 1, 0))
    offset = document.translate_row_col_to_index(row, max(error.column - 1, 0))
    return min(offset, len(document.text))


def _unfinished(text: str, offset: int) -> bool:
    """Whether the error sits at the end of the text or in the word still being typed."""
    tail = text[offset:]
    tokens = tokenize(tail)
    return not tokens or (len(tokens) == 1 and tokens[0].end_column - 1 == len(tail))
