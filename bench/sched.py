"""Which process had the cores when: ``perf sched`` records every context switch of the machine, and
a ``Timeline`` of them adds up, for a time window, how long each process ran in it.

``perf sched record -k mono`` stamps with ``CLOCK_MONOTONIC``, the clock of ``time.monotonic_ns`` and of
``bench/chaintrace``'s stamps, so a window cut from those stamps can be laid over the switches. It needs
``perf`` (Debian's ``linux-perf``) and the right to trace the whole machine (root).
"""

from __future__ import annotations

import bisect
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SchedError", "Slice", "Timeline", "parse_timehist", "recording"]

_LINE = re.compile(r"^\s*(\d+\.\d+)\s+\[\d+\]\s+(.+?)\[(\d+)(?:/(\d+))?\]\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s*$")


class SchedError(Exception):
    """``perf sched`` is missing here, or could not record."""


@dataclass(frozen=True)
class Slice:
    """A thread of process ``pid`` (command ``comm``) on a core from ``start`` to ``end`` ns."""

    start: int
    end: int
    pid: int
    comm: str


def parse_timehist(text: str) -> list[Slice]:
    """The run slices of ``perf sched timehist`` output (idle time and lines it cannot read left out)."""
    slices = []
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        ended, comm, tid, pid, ran_ms = match.groups()
        end = round(float(ended) * 1e9)
        slices.append(Slice(end - round(float(ran_ms) * 1e6), end, int(pid or tid), comm))
    return slices


class Timeline:
    """Run slices in the order they started, to find those of a window by bisection: a window's
    slices started before its end and at most the longest slice's length before its start."""

    def __init__(self, slices: list[Slice]) -> None:
        self._slices = sorted(slices, key=lambda piece: piece.start)
        self._starts = [piece.start for piece in self._slices]
        self._longest = max((piece.end - piece.start for piece in self._slices), default=0)

    def cpu_in(self, start: int, end: int) -> dict[int, float]:
        """Milliseconds each process ran between ``start`` and ``end`` ns (on all cores together)."""
        first = bisect.bisect_right(self._starts, start - self._longest)
        ran: dict[int, float] = {}
        for piece in self._slices[first : bisect.bisect_left(self._starts, end)]:
            overlap = min(piece.end, end) - max(piece.start, start)
            if overlap > 0:
                ran[piece.pid] = ran.get(piece.pid, 0.0) + overlap / 1e6
        return ran


@contextmanager
def recording(directory: Path) -> Iterator[list[Slice]]:
    """Record every context switch of the machine for the duration of the block; the list it gives
    is filled with the slices when the block ends. SchedError when ``perf`` is missing or refuses."""
    perf = shutil.which("perf")
    if perf is None:
        raise SchedError("no perf on PATH (Debian: apt-get install linux-perf)")
    data = directory / "perf.data"
    record = [perf, "sched", "record", "-k", "mono", "-o", str(data)]
    proc = subprocess.Popen(record, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    slices: list[Slice] = []
    try:
        yield slices
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    if not data.exists() or data.stat().st_size == 0:
        raise SchedError(f"perf sched record wrote nothing: {err.decode(errors='replace').strip()[-300:]}")
    shown = subprocess.run(
        [perf, "sched", "timehist", "-i", str(data)], capture_output=True, text=True, timeout=300, check=False
    )
    if shown.returncode != 0:
        raise SchedError(f"perf sched timehist failed: {shown.stderr.strip()[-300:]}")
    slices.extend(parse_timehist(shown.stdout))
