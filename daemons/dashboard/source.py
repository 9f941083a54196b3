"""What the dashboard shows, read from the ledger: the SN's views and the history from its chain.

One :class:`LedgerSource` per dashboard, on its own bus session. Views are read when a page asks
(a few small queries); the history is folded incrementally from the blocks the dashboard has not seen
(``contracts.history``), so a page that polls costs the SN the new blocks only.
"""

from __future__ import annotations

import asyncio
from typing import Any

from contracts.history import HistoryIndex
from daemons.ledger_client import LedgerClient

__all__ = ["LedgerSource"]


class LedgerSource:
    """Read-only access to one SN for the dashboard."""

    def __init__(self, client: LedgerClient) -> None:
        self.client = client
        self.index = HistoryIndex()
        self._lock = asyncio.Lock()

    async def overview(self) -> dict[str, Any]:
        """The SN, nodes, contracts (with their open round and latest model), tasks, taskrunners."""
        client = self.client
        runners = [
            await client.query("taskrunner.status", name=view["name"])
            for view in await client.query("taskrunners")
        ]
        return {
            "sn": await client.status(),
            "nodes": await client.query("nodes"),
            "contracts": await client.query("contracts"),
            "tasks": await client.query("tasks"),
            "taskrunners": runners,
        }

    async def contract(self, name: str) -> dict[str, Any]:
        """One contract: status, PERFDATA and rounds."""
        client = self.client
        return {
            "status": await client.query("contract.status", name=name),
            "perfdata": await client.query("contract.perfdata", name=name),
            "rounds": await client.query("contract.rounds", name=name),
        }

    async def history(self, name: str, since: int = -1) -> dict[str, Any]:
        """The latest run's records of ``name`` above height ``since`` (all when -1)."""
        async with self._lock:  # one fold at a time: the index has a single cursor
            await self.client.read_history(self.index)
        run = self.index.latest_run(name)
        records = [r.as_dict() for r in self.index.records(name, run, since)]
        return {"contract": name, "run": run, "height": self.index.height, "records": records}
