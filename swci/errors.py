"""Located syntax errors of SWCI command lines and scripts."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ScriptError", "SwciSyntaxError"]


class SwciSyntaxError(Exception):
    """A command line that does not parse, located at the offending token.

    ``str()`` gives the location and message, then the source line with carets
    under the offending token::

        line 1, col 22: expected TO after the task name, got 'INTO'
          ASSIGN TASK my_task INTO runner WITH 2 PEERS
                              ^^^^

    Attributes:
        line: 1-based line number.
        column: 1-based column of the offending token (one past the last token
            for errors at the end of the line).
        message: what was expected and what was found.
        excerpt: the source line.
        width: number of characters to underline.
        source: name of the script the line comes from, if any.
    """

    def __init__(
        self,
        line: int,
        column: int,
        message: str,
        excerpt: str,
        *,
        width: int = 1,
        source: str | None = None,
    ) -> None:
        super().__init__(message)
        self.line = line
        self.column = column
        self.message = message
        self.excerpt = excerpt
        self.width = max(1, width)
        self.source = source

    @property
    def location(self) -> str:
        """``[source: ]line L, col C``."""
        where = f"line {self.line}, col {self.column}"
        return f"{self.source}: {where}" if self.source else where

    @property
    def headline(self) -> str:
        """The one-line form: location and message."""
        return f"{self.location}: {self.message}"

    @property
    def caret(self) -> str:
        """Carets under the offending token, aligned with :attr:`excerpt` (tabs kept)."""
        prefix = "".join("\t" if ch == "\t" else " " for ch in self.excerpt[: self.column - 1])
        prefix += " " * max(0, self.column - 1 - len(self.excerpt))
        return prefix + "^" * self.width

    def with_source(self, source: str | None) -> SwciSyntaxError:
        """A copy that names the script the line comes from."""
        return SwciSyntaxError(
            self.line, self.column, self.message, self.excerpt, width=self.width, source=source
        )

    def __str__(self) -> str:
        return f"{self.headline}\n  {self.excerpt}\n  {self.caret}"

    def __repr__(self) -> str:
        return f"SwciSyntaxError({self.line}, {self.column}, {self.message!r})"


class ScriptError(Exception):
    """Every syntax error of a script, collected in one pass.

    Attributes:
        errors: the errors in line order.
        source: the script's name, if known.
    """

    def __init__(self, errors: Iterable[SwciSyntaxError], source: str | None = None) -> None:
        self.errors = tuple(errors)
        self.source = source
        super().__init__(self._summary())

    def _summary(self) -> str:
        count = len(self.errors)
        noun = "syntax error" if count == 1 else "syntax errors"
        where = f" in {self.source}" if self.source else ""
        return f"{count} {noun}{where}"

    def __str__(self) -> str:
        return "\n".join([f"{self._summary()}:", *(str(err) for err in self.errors)])
