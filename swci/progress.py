"""Progress displays of the waiting commands.

``WAIT FOR TASKRUNNER`` shows a live panel on a terminal (spinner, task, state, peers, elapsed time);
elsewhere (a log, a pipe) it prints a ``#`` every few seconds, as the reference system does, and one
line per state change. ``WAIT FOR IP`` shows a spinner with the attempt count on a terminal. In JSON
mode nothing is shown but the result.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Protocol

from rich.console import Console, RenderableType
from rich.live import Live
from rich.spinner import Spinner
from rich.status import Status
from rich.table import Table as RichTable
from rich.text import Text

__all__ = [
    "AttemptDisplay",
    "HashProgress",
    "LiveProgress",
    "NoProgress",
    "TaskrunnerProgress",
    "describe_view",
    "elapsed",
    "taskrunner_progress",
]

View = Mapping[str, Any]


def elapsed(seconds: float) -> str:
    """``H:MM:SS``."""
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def describe_view(name: str, view: View) -> str:
    """One line: taskrunner, task, state and peer counts."""
    task = view.get("task") or "-"
    counts = (
        f"active {view.get('active', 0)}, completed {view.get('completed', 0)}, "
        f"failed {view.get('failed', 0)} of {view.get('required', 0)} required"
    )
    return f"Taskrunner {name}: task {task} {view.get('state')} ({counts})"


class TaskrunnerProgress(Protocol):
    """What ``WAIT FOR TASKRUNNER`` reports to while it waits."""

    def __enter__(self) -> TaskrunnerProgress:
        """Start showing."""
        ...

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop showing."""
        ...

    def update(self, view: View) -> None:
        """The taskrunner's latest status view."""
        ...

    def tick(self) -> None:
        """Time passed (called at least every few seconds)."""
        ...


class NoProgress:
    """Shows nothing (JSON mode)."""

    def __enter__(self) -> NoProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def update(self, view: View) -> None:
        """Ignored."""

    def tick(self) -> None:
        """Ignored."""


class HashProgress:
    """For a console that is not a terminal: a ``#`` every ``every`` seconds, a line per state change."""

    def __init__(self, console: Console, name: str, every: float = 5.0) -> None:
        self._console = console
        self._name = name
        self._every = every
        self._last_hash = time.monotonic()
        self._state: object = None
        self._hashes = 0

    def __enter__(self) -> HashProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._end_hashes()

    def update(self, view: View) -> None:
        """Print a line when the state changed."""
        key = (view.get("state"), view.get("active"), view.get("completed"), view.get("failed"))
        if key != self._state:
            self._state = key
            self._end_hashes()
            self._console.print(describe_view(self._name, view), markup=False, highlight=False)

    def tick(self) -> None:
        """Print a ``#`` when ``every`` seconds have passed since the last one."""
        now = time.monotonic()
        if now - self._last_hash >= self._every:
            self._last_hash = now
            self._hashes += 1
            self._console.print("#", end="", markup=False, highlight=False)

    def _end_hashes(self) -> None:
        if self._hashes:
            self._console.print()
            self._hashes = 0


class _Panel:
    """The live panel's content, drawn afresh on every refresh (so the elapsed time runs)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.view: View = {}
        self.started = time.monotonic()
        self.spinner = Spinner("dots", style="cyan")
        self.extra: Callable[[], RenderableType | None] | None = None

    def _elapsed(self) -> float:
        """Seconds since the assignment (ledger time), else since the wait began."""
        assigned = self.view.get("assigned_at")
        if isinstance(assigned, int | float) and not isinstance(assigned, bool):
            return max(0.0, time.time() - assigned)
        return time.monotonic() - self.started

    def __rich__(self) -> RenderableType:
        view = self.view
        grid = RichTable.grid(padding=(0, 1))
        headline = Text.assemble(
            ("Taskrunner ", ""),
            (self.name, "bold"),
            ("  task ", ""),
            (str(view.get("task") or "-"), "bold"),
            ("  ", ""),
            (str(view.get("state") or "?"), _state_style(view.get("state"))),
        )
        peers = Text(
            f"active {view.get('active', 0)}  completed {view.get('completed', 0)}  "
            f"failed {view.get('failed', 0)}  required {view.get('required', 0)}  "
            f"elapsed {elapsed(self._elapsed())}",
            style="dim",
        )
        grid.add_row(self.spinner, headline)
        grid.add_row("", peers)
        extra = self.extra() if self.extra is not None else None
        if extra is not None:
            grid.add_row("", extra)
        return grid


def _state_style(state: object) -> str:
    return {"COMPLETE": "bold green", "ERROR": "bold red", "RUNNING": "bold yellow"}.get(str(state), "bold")


class LiveProgress:
    """For a terminal: a live panel that disappears when the wait ends (the result follows)."""

    def __init__(self, console: Console, name: str) -> None:
        self._panel = _Panel(name)
        self._live = Live(self._panel, console=console, refresh_per_second=4, transient=True)

    @property
    def extra(self) -> Callable[[], RenderableType | None] | None:
        """What the panel shows below the taskrunner (the training view), if anything."""
        return self._panel.extra

    @extra.setter
    def extra(self, draw: Callable[[], RenderableType | None] | None) -> None:
        self._panel.extra = draw

    def __enter__(self) -> LiveProgress:
        self._live.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._live.stop()

    def update(self, view: View) -> None:
        """Show the new view."""
        self._panel.view = view

    def tick(self) -> None:
        """The panel refreshes itself."""


def taskrunner_progress(
    console: Console, name: str, *, enabled: bool, every: float = 5.0
) -> TaskrunnerProgress:
    """The right display for the console: live on a terminal, ``#`` elsewhere, nothing when disabled."""
    if not enabled:
        return NoProgress()
    if console.is_terminal:
        return LiveProgress(console, name)
    return HashProgress(console, name, every)


class AttemptDisplay:
    """A spinner with a message on a terminal (``WAIT FOR IP``); silent elsewhere or when disabled."""

    def __init__(self, console: Console, enabled: bool) -> None:
        self._status: Status | None = None
        if enabled and console.is_terminal:
            self._status = Status("", console=console, spinner="dots")

    def __enter__(self) -> AttemptDisplay:
        if self._status is not None:
            self._status.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._status is not None:
            self._status.stop()

    def update(self, message: str) -> None:
        """Show what is being tried."""
        if self._status is not None:
            self._status.update(message)
