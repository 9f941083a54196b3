"""What a command returns and how it is shown: rich text for people, JSON lines for programs.

An executor returns a :class:`Result`; :func:`render` prints it. Text mode prints
the messages and a rich table (errors as one red line, never a traceback); JSON
mode prints exactly one JSON object per command on one line::

    {"command": "LIST TASKS", "ok": true, "messages": [], "table": {...}, "data": null}
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Literal

from rich.console import Console, RenderableType
from rich.table import Table as RichTable
from rich.text import Text

__all__ = ["Format", "Result", "Table", "render", "render_table", "to_json"]

Format = Literal["text", "json"]


@dataclass(frozen=True)
class Table:
    """Tabular output: a title, column names and rows of cells.

    Cells may be anything; text mode shows ``str(cell)`` (None as empty), JSON mode
    keeps JSON-able values as they are.
    """

    title: str | None
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...] = ()

    @classmethod
    def of(cls, title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
        """Build a table from any sequences."""
        return cls(title, tuple(columns), tuple(tuple(row) for row in rows))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: ``{"title": ..., "columns": [...], "rows": [[...], ...]}``."""
        return {
            "title": self.title,
            "columns": list(self.columns),
            "rows": [list(row) for row in self.rows],
        }


@dataclass(frozen=True)
class Result:
    """The outcome of one command.

    Attributes:
        ok: whether the command succeeded (False counts for EXIT ON FAILURE).
        messages: lines for the user; for a failure, what went wrong.
        table: tabular output, if any.
        data: structured output for JSON mode and for programs.
        renderable: a richer text-mode rendering that replaces messages and table
            (used by HELP and LS); JSON mode ignores it.
    """

    ok: bool
    messages: list[str] = field(default_factory=list)
    table: Table | None = None
    data: Any = None
    renderable: RenderableType | None = field(default=None, compare=False)

    @classmethod
    def success(cls, *messages: str, table: Table | None = None, data: Any = None) -> Result:
        """A successful result."""
        return cls(True, list(messages), table, data)

    @classmethod
    def failure(cls, *messages: str, data: Any = None) -> Result:
        """A failed result; the messages say what went wrong."""
        return cls(False, list(messages), None, data)


def render(result: Result, console: Console, fmt: Format = "text", *, command: str | None = None) -> None:
    """Print a result.

    Args:
        result: what the command returned.
        console: where to print.
        fmt: ``"text"`` for people, ``"json"`` for one JSON object per command.
        command: the command line, for the JSON object's ``"command"``.
    """
    if fmt == "json":
        console.print(to_json(result, command), markup=False, highlight=False, soft_wrap=True)
        return
    if result.renderable is not None:
        console.print(result.renderable)
        return
    style = "" if result.ok else "bold red"
    for message in result.messages:
        console.print(Text(message, style=style), soft_wrap=True)
    if result.table is not None:
        console.print(render_table(result.table))


def to_json(result: Result, command: str | None = None) -> str:
    """The one-line JSON object of a result."""
    payload = {
        "command": command,
        "ok": result.ok,
        "messages": result.messages,
        "table": None if result.table is None else result.table.to_dict(),
        "data": result.data,
    }
    return json.dumps(payload, default=_jsonable, ensure_ascii=False)


def render_table(table: Table) -> RichTable:
    """A rich table for text mode."""
    rich_table = RichTable(title=table.title, title_justify="left", header_style="bold")
    for column in table.columns:
        rich_table.add_column(column, overflow="fold")
    for row in table.rows:
        rich_table.add_row(*(Text("" if cell is None else str(cell)) for cell in row))
    return rich_table


def _jsonable(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    if isinstance(value, bytes):
        return value.hex()
    return repr(value)
