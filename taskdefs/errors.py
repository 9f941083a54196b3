"""The one exception of ``taskdefs``: every problem of a file, each located at its line and column."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Issue", "TaskDefError"]


@dataclass(frozen=True)
class Issue:
    """One problem in a task definition or SWOP profile.

    Attributes:
        source: the file name as given by the caller (or ``<string>``).
        line: 1-based line, ``None`` when the problem has no place in the text.
        column: 1-based column, ``None`` when the problem has no place in the text.
        path: where in the document, e.g. ``Body.SharedContent[0].MType``; empty for the whole file.
        message: what is wrong and what is expected.
    """

    source: str
    line: int | None
    column: int | None
    path: str
    message: str

    def __str__(self) -> str:
        """Format as ``source:line:col: path: message`` (the parts that exist)."""
        where = self.source
        if self.line is not None:
            where += f":{self.line}:{self.column if self.column is not None else 1}"
        if self.path:
            return f"{where}: {self.path}: {self.message}"
        return f"{where}: {self.message}"


def _order(issue: Issue) -> tuple[int, int]:
    return (issue.line or 0, issue.column or 0)


class TaskDefError(ValueError):
    """A task definition, task body or SWOP profile that is not valid.

    ``issues`` holds every problem found (not just the first), ordered by position; ``str()`` gives
    one line per issue.
    """

    def __init__(self, issues: Iterable[Issue]) -> None:
        """Keep the issues (deduplicated, ordered by line and column)."""
        unique = list(dict.fromkeys(issues))
        self.issues: list[Issue] = sorted(unique, key=_order)
        super().__init__("\n".join(str(issue) for issue in self.issues))

    @classmethod
    def single(
        cls,
        source: str,
        message: str,
        *,
        path: str = "",
        line: int | None = None,
        column: int | None = None,
    ) -> TaskDefError:
        """Build an error holding one issue."""
        return cls([Issue(source, line, column, path, message)])
