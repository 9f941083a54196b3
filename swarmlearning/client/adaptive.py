"""Adaptive sync (``useAdaptiveSync``): how many batches to train before the next sync round.

The rule, applied after every sync round to the validation value of the merged model:

- it improved on the previous one by more than ``tolerance`` (relative): sync half as often — the interval
  doubles, up to ``max_factor`` x syncFrequency;
- it stalled or got worse: sync twice as often — the interval halves, down to syncFrequency.

So the interval is always syncFrequency x 2^k (k = 0 .. log2(max_factor)) and moves one step per round.
The first evaluation only sets the reference value. A missing or non-finite value changes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["DEFAULT_MAX_FACTOR", "DEFAULT_TOLERANCE", "AdaptiveSync"]

DEFAULT_MAX_FACTOR = 8
DEFAULT_TOLERANCE = 0.01


@dataclass(slots=True)
class AdaptiveSync:
    """The sync interval of one node under adaptive sync (a pure policy: no I/O, no clock)."""

    base: int
    max_factor: int = DEFAULT_MAX_FACTOR
    tolerance: float = DEFAULT_TOLERANCE
    interval: int = field(init=False)
    previous: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.base < 1:
            raise ValueError(f"AdaptiveSync: base interval must be >= 1, got {self.base}")
        if self.max_factor < 1 or self.max_factor & (self.max_factor - 1):
            raise ValueError(f"AdaptiveSync: max_factor must be a power of two, got {self.max_factor}")
        self.interval = self.base

    @property
    def cap(self) -> int:
        """The longest interval: ``max_factor`` x the base."""
        return self.base * self.max_factor

    def update(self, value: float | None, *, lower_is_better: bool = True) -> int:
        """Take the latest validation value (loss, or a metric); return the next interval in batches."""
        if value is None or not math.isfinite(value):
            return self.interval
        score = value if lower_is_better else -value
        previous, self.previous = self.previous, score
        if previous is None:
            return self.interval
        if score < previous - self.tolerance * abs(previous):
            self.interval = min(self.interval * 2, self.cap)
        else:
            self.interval = max(self.interval // 2, self.base)
        return self.interval
