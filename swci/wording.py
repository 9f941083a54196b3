"""Small helpers for the wording of messages."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["join_or"]


def join_or(items: Sequence[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} or {items[-1]}"
