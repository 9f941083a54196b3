"""The waiting commands: ``WAIT FOR TASKRUNNER``, ``WAIT FOR IP`` and ``WAIT FOR SERVICE``.

``WAIT FOR TASKRUNNER`` subscribes to the taskrunner's ledger events first, then reads its status,
then reacts to each event, so that no change is missed: it ends when the state is ``COMPLETE``,
``ERROR`` (a failed result with the ledger's reason) or ``IDLE`` (nothing is running, or the
taskrunner was reset meanwhile), or when the time limit is over. Ctrl-C ends only the wait.

``WAIT FOR IP`` tries to reach an SN at a broker every ``SWCI_WAIT_INTERVAL`` seconds (5 by
default), ``retries`` more times after the first.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from daemons.bus import BusError
from daemons.ledger_client import Watch
from swci.connection import Endpoint, LedgerLink, probe_sn
from swci.output import Result
from swci.progress import AttemptDisplay, TaskrunnerProgress, elapsed

__all__ = [
    "DEFAULT_RETRIES",
    "DEFAULT_WAIT_INTERVAL",
    "DEFAULT_WAIT_MINUTES",
    "GENERIC_TASK_WAIT_VAR",
    "RUN_TASK_WAIT_VAR",
    "TIMEOUT_WARNING",
    "WAIT_INTERVAL_VAR",
    "Settings",
    "wait_for_sn",
    "wait_for_taskrunner",
    "wait_interval",
    "wait_limit",
]

log = logging.getLogger("swci.waiting")

Settings = Callable[[str], "str | None"]
"""Looks a setting up by name: the current context's env vars, then the process environment."""

View = Mapping[str, Any]

RUN_TASK_WAIT_VAR = "SWCI_RUN_TASK_MAX_WAIT_TIME"
GENERIC_TASK_WAIT_VAR = "SWCI_GENERIC_TASK_MAX_WAIT_TIME"
DEFAULT_WAIT_MINUTES = 120.0
TIMEOUT_WARNING = "WARNING - Maximum configured SWCI wait time is over"
WAIT_INTERVAL_VAR = "SWCI_WAIT_INTERVAL"
DEFAULT_WAIT_INTERVAL = 5.0
DEFAULT_RETRIES = 360
TICK = 5.0
"""Seconds between progress ticks (and checks for a lost connection) while no event comes."""


def _number(setting: Settings, name: str, default: float) -> float:
    raw = setting(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        log.warning("%s=%r is not a number; using %g", name, raw, default)
        return default
    return value if value >= 0 else default


def wait_limit(timeout: float | None, view: View, setting: Settings) -> float:
    """Seconds ``WAIT FOR TASKRUNNER`` may wait.

    The command's timeout when given; else ``SWCI_RUN_TASK_MAX_WAIT_TIME`` (RUN_SWARM tasks, whose
    peers are SLs) or ``SWCI_GENERIC_TASK_MAX_WAIT_TIME`` (other tasks), in minutes, 120 by default.
    """
    if timeout is not None:
        return timeout
    name = RUN_TASK_WAIT_VAR if view.get("peer_type") == "SL" else GENERIC_TASK_WAIT_VAR
    return _number(setting, name, DEFAULT_WAIT_MINUTES) * 60.0


def wait_interval(setting: Settings | None = None) -> float:
    """Seconds between the attempts of ``WAIT FOR IP`` (``SWCI_WAIT_INTERVAL``, default 5)."""
    return _number(setting or os.environ.get, WAIT_INTERVAL_VAR, DEFAULT_WAIT_INTERVAL)


# --- WAIT FOR TASKRUNNER -----------------------------------------------------------------------------


class _Follower:
    """The taskrunner's latest view, fed by events (and re-read after a reconnect)."""

    def __init__(self, link: LedgerLink, watch: Watch, name: str, view: View) -> None:
        self.link, self.watch, self.name = link, watch, name
        self.view = view
        self.ran = view.get("state") == "RUNNING"
        self._reconnects = link.reconnects

    async def next(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the next change."""
        try:
            event = await self.watch.next(timeout)
        except TimeoutError:
            if self.link.reconnects != self._reconnects:  # events may have been lost: read again
                self._reconnects = self.link.reconnects
                self._see(await self.link.query("taskrunner.status", name=self.name))
            return
        if event.view is not None:
            self._see(event.view)

    def _see(self, view: View) -> None:
        self.view = view
        self.ran = self.ran or view.get("state") == "RUNNING"

    def outcome(self) -> Result | None:
        """The result once the wait is over, else None."""
        view, state = self.view, self.view.get("state")
        task = view.get("task") or "-"
        done = f"{view.get('completed', 0)} of {view.get('required', 0)} peers completed"
        if state == "COMPLETE":
            return Result.success(
                f"Task {task} on taskrunner {self.name} is COMPLETE ({done})", data=dict(view)
            )
        if state == "ERROR":
            reason = view.get("error") or "no reason recorded"
            return Result.failure(f"Task {task} on taskrunner {self.name} failed: {reason}", data=dict(view))
        if state == "IDLE":
            what = "was reset while waiting" if self.ran else "is IDLE: no task is running"
            return Result.success(f"Taskrunner {self.name} {what}", data=dict(view))
        return None


async def wait_for_taskrunner(
    link: LedgerLink,
    name: str,
    *,
    limit: Callable[[View], float],
    progress: TaskrunnerProgress,
    tick: float = TICK,
) -> Result:
    """Wait until the taskrunner's task is over (see the module's docstring).

    Args:
        link: the connection to the SN.
        name: the taskrunner.
        limit: the time limit in seconds for the first status view (see :func:`wait_limit`).
        progress: where to show progress.
        tick: seconds between progress ticks.
    """
    loop = asyncio.get_running_loop()
    async with link.watch("taskrunner", name) as watch:
        height = (await link.status()).get("height")
        follower = _Follower(link, watch, name, await link.query("taskrunner.status", name=name))
        if isinstance(height, int):
            watch.seen(name, height)  # events up to the read are stale
        seconds = limit(follower.view)
        deadline = loop.time() + seconds
        with progress:
            while (outcome := follower.outcome()) is None:
                progress.update(follower.view)
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return _timed_out(name, follower.view, seconds)
                await follower.next(min(remaining, tick))
                progress.tick()
            progress.update(follower.view)
    return outcome


def _timed_out(name: str, view: View, seconds: float) -> Result:
    still = f"taskrunner {name} is still {view.get('state')} after {elapsed(seconds)}"
    return Result.failure(TIMEOUT_WARNING, still, data=dict(view))


# --- WAIT FOR IP / SERVICE ---------------------------------------------------------------------------


async def wait_for_sn(
    endpoint: Endpoint, *, retries: int, interval: float, display: AttemptDisplay
) -> Result:
    """Try to reach an SN at ``endpoint`` once, then up to ``retries`` more times, ``interval`` s apart.

    Each attempt gets at most ``interval`` seconds (at least one) to connect and find an SN.
    """
    loop = asyncio.get_running_loop()
    attempts = retries + 1
    probe = Endpoint(
        endpoint.broker,
        endpoint.uid,
        endpoint.network,
        endpoint.identity,
        connect_timeout=min(endpoint.connect_timeout, max(1.0, interval)),
    )
    last: BusError | None = None
    with display:
        for attempt in range(1, attempts + 1):
            started = loop.time()
            display.update(
                f"Waiting for a Swarm Network node at {endpoint.broker} (attempt {attempt}/{attempts})"
            )
            try:
                uid = await probe_sn(probe)
            except BusError as exc:
                last = exc
                log.info("attempt %d/%d at %s: %s", attempt, attempts, endpoint.broker, exc)
            else:
                data = {"sn": uid, "broker": str(endpoint.broker), "attempts": attempt}
                return Result.success(f"Swarm Network node {uid} is up at {endpoint.broker}", data=data)
            if attempt < attempts:
                await asyncio.sleep(max(0.0, started + interval - loop.time()))
    return Result.failure(
        f"no Swarm Network node answered at {endpoint.broker} after {attempts} attempt(s): {last}",
        data={"broker": str(endpoint.broker), "attempts": attempts},
    )
