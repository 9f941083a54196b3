"""Ledger reads answered once per ledger state: between two blocks, many SLs ask for the same view.

A view is a pure function of the state, the query's name and its arguments, and the state object is
replaced, never changed, when a block is sealed; so an answer holds until the state is another object.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from contracts.state import State
from contracts.views import query

__all__ = ["Reads"]

_SCALARS = (str, int, float, bool, type(None))
MAX_ANSWERS = 256  # distinct reads kept for one state; past that they are answered without keeping them


class Reads:
    """``contracts.views.query``, each answer kept while the state it was read from is current."""

    def __init__(self) -> None:
        self._state: State | None = None
        self._answers: dict[Hashable, Any] = {}

    def answer(self, state: State, name: str, args: Mapping[str, Any]) -> Any:
        """The answer of read ``name`` with ``args`` on ``state`` (raises what ``query`` raises)."""
        if state is not self._state:
            self._state, self._answers = state, {}
        key = _key(name, args)
        if key is not None and key in self._answers:
            return self._answers[key]
        result = query(state, name, args)
        if key is not None and len(self._answers) < MAX_ANSWERS:
            self._answers[key] = result
        return result


def _key(name: str, args: Mapping[str, Any]) -> Hashable | None:
    """The read as a key: its name and its scalar arguments, each with its type (``True`` is not ``1`` to
    a view); None when an argument is not a scalar or not named by a string."""
    if not all(isinstance(k, str) and isinstance(v, _SCALARS) for k, v in args.items()):
        return None
    return (name, tuple(sorted((k, type(v).__name__, v) for k, v in args.items())))
