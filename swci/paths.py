"""Where swci keeps its files: XDG base directories (``$XDG_CONFIG_HOME/swci``, ``$XDG_STATE_HOME/swci``)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["config_dir", "contexts_file", "history_file", "log_file", "state_dir"]


def _xdg(variable: str, fallback: str) -> Path:
    value = os.environ.get(variable)
    base = Path(value) if value and os.path.isabs(value) else Path.home() / fallback
    return base / "swci"


def config_dir() -> Path:
    """``$XDG_CONFIG_HOME/swci`` (default ``~/.config/swci``): the contexts."""
    return _xdg("XDG_CONFIG_HOME", ".config")


def state_dir() -> Path:
    """``$XDG_STATE_HOME/swci`` (default ``~/.local/state/swci``): history and log."""
    return _xdg("XDG_STATE_HOME", ".local/state")


def contexts_file() -> Path:
    """The JSON file of the contexts."""
    return config_dir() / "contexts.json"


def history_file() -> Path:
    """The REPL's command history."""
    return state_dir() / "history"


def log_file() -> Path:
    """The default log file (tracebacks go there, never to the user)."""
    return state_dir() / "swci.log"
