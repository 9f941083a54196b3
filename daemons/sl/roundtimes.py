"""Where a sync round's time goes on one node: named steps, logged as one line per round.

``bench/rounds.py`` reads these lines (``round <n> steps: name=1.23ms ...``) to say which step costs what.
"""

from __future__ import annotations

import logging
import re
import time

__all__ = ["STEPS_LINE", "RoundTimer", "parse_steps"]

log = logging.getLogger("swarm.sl.rounds.steps")
STEPS_LINE = re.compile(r"round (\d+) steps: (.*)$")
_STEP = re.compile(r"([a-z_]+)=([0-9.]+)ms")


class RoundTimer:
    """Marks the end of each step of a round; ``report`` logs the step durations in milliseconds."""

    def __init__(self) -> None:
        self._last = time.perf_counter()
        self.steps: dict[str, float] = {}
        self._reported = False

    def mark(self, step: str) -> None:
        """``step`` ended now; its duration is the time since the previous mark (summed if repeated)."""
        now = time.perf_counter()
        self.steps[step] = self.steps.get(step, 0.0) + (now - self._last)
        self._last = now

    def report(self, number: int | None) -> None:
        """Log the steps of round ``number`` (at INFO, one line), once: the ledger's round and the early
        merge may both end a round, a moment apart."""
        if self._reported:
            return
        self._reported = True
        text = " ".join(f"{name}={seconds * 1000:.2f}ms" for name, seconds in self.steps.items())
        log.info("round %s steps: %s", number, text)


def parse_steps(line: str) -> tuple[int, dict[str, float]] | None:
    """``(round, {step: ms})`` from a log line written by ``RoundTimer.report``, else None."""
    found = STEPS_LINE.search(line)
    if found is None:
        return None
    return int(found.group(1)), {name: float(ms) for name, ms in _STEP.findall(found.group(2))}
