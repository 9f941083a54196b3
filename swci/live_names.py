"""Names for completion (contracts, tasks, taskrunners, node uids), cached from the last listings.

Every command's result teaches the cache (``LIST TASKS`` replaces the task names, ``CREATE TASK``
adds one, ``DELETE TASK`` removes it); :meth:`NameCache.refresh` reads all four listings from the
ledger, which the executor does in the background when the names asked for are stale.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from swci.argtypes import ArgKind
from swci.commands import (
    Command,
    CreateContract,
    CreateTask,
    CreateTaskFrom,
    CreateTaskrunner,
    DeleteTask,
    ListContracts,
    ListNodes,
    ListTaskrunnerPeers,
    ListTaskrunners,
    ListTasks,
)
from swci.connection import LedgerLink
from swci.output import Result

__all__ = ["LISTINGS", "NameCache"]

LISTINGS: dict[ArgKind, tuple[str, str]] = {
    ArgKind.CONTRACT: ("contracts", "name"),
    ArgKind.TASK: ("tasks", "name"),
    ArgKind.TASKRUNNER: ("taskrunners", "name"),
    ArgKind.NODE: ("nodes", "uid"),
}
"""For each kind: the query that lists it and the field holding the name."""

_LISTED: dict[type[Command], ArgKind] = {
    ListContracts: ArgKind.CONTRACT,
    ListTasks: ArgKind.TASK,
    ListTaskrunners: ArgKind.TASKRUNNER,
    ListNodes: ArgKind.NODE,
}
_CREATED: dict[type[Command], ArgKind] = {
    CreateContract: ArgKind.CONTRACT,
    CreateTask: ArgKind.TASK,
    CreateTaskFrom: ArgKind.TASK,
    CreateTaskrunner: ArgKind.TASKRUNNER,
}


def _names(views: object, key: str) -> list[str]:
    if not isinstance(views, list):
        return []
    return [str(view[key]) for view in views if isinstance(view, dict) and key in view]


class NameCache:
    """Live names by kind, with the time each kind was last listed.

    Args:
        max_age: seconds after which a kind's names are stale.
    """

    def __init__(self, max_age: float = 30.0) -> None:
        self.max_age = max_age
        self._names: dict[ArgKind, list[str]] = {}
        self._listed: dict[ArgKind, float] = {}

    def get(self, kind: ArgKind) -> Sequence[str]:
        """The known names of a kind."""
        return tuple(self._names.get(kind, ()))

    def stale(self, kind: ArgKind) -> bool:
        """Whether the kind was never listed, or not for ``max_age`` seconds."""
        return time.monotonic() - self._listed.get(kind, float("-inf")) > self.max_age

    def set(self, kind: ArgKind, names: Iterable[str]) -> None:
        """Replace a kind's names (a fresh listing)."""
        self._names[kind] = sorted(dict.fromkeys(names))
        self._listed[kind] = time.monotonic()

    def add(self, kind: ArgKind, name: str) -> None:
        """Add one name."""
        known = self._names.setdefault(kind, [])
        if name not in known:
            known.append(name)
            known.sort()

    def discard(self, kind: ArgKind, name: str) -> None:
        """Forget one name."""
        known = self._names.get(kind, [])
        if name in known:
            known.remove(name)

    def clear(self) -> None:
        """Forget everything (another context, another ledger)."""
        self._names.clear()
        self._listed.clear()

    def learn(self, cmd: Command, result: Result) -> None:
        """Update the names from a successful command's result."""
        if not result.ok:
            return
        kind = _LISTED.get(type(cmd))
        if kind is not None:
            self.set(kind, _names(result.data, LISTINGS[kind][1]))
        elif type(cmd) in _CREATED and isinstance(result.data, dict) and "name" in result.data:
            self.add(_CREATED[type(cmd)], str(result.data["name"]))
        elif isinstance(cmd, DeleteTask):
            self.discard(ArgKind.TASK, cmd.name)
        elif isinstance(cmd, ListTaskrunnerPeers):
            for uid in _names(result.data, "uid"):
                self.add(ArgKind.NODE, uid)

    async def refresh(self, link: LedgerLink) -> None:
        """Read every listing from the ledger."""
        for kind, (query, key) in LISTINGS.items():
            views: Any = await link.query(query)
            self.set(kind, _names(views, key))
