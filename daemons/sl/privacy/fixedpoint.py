"""The fixed-point encoding that secure aggregation sums: value * 2**40, rounded, as an element of
Z / 2**64 (numpy uint64, whose arithmetic wraps around).

Sums stay exact as long as the true sum lies in ±2**23 (8 388 608): the rows a round adds are
weighted by each peer's share of the total weight, so the sum is the weighted mean and obeys the
same bound as the model's values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["FRACTION_BITS", "LIMIT", "FixedPointError", "decode", "encode"]

FRACTION_BITS = 40
LIMIT = float(1 << (63 - FRACTION_BITS))  # |value| must stay below this
_SCALE = float(1 << FRACTION_BITS)


class FixedPointError(ValueError):
    """A value the encoding cannot hold (NaN, inf, or beyond ±LIMIT)."""


def encode(values: npt.NDArray[Any], *, what: str = "values") -> npt.NDArray[np.uint64]:
    """``values`` (any real dtype) as fixed-point uint64 words, rounded half to even."""
    scaled = np.asarray(values, dtype=np.float64) * _SCALE
    if scaled.size and not np.all(np.abs(scaled) < LIMIT * _SCALE):
        bad = int(np.flatnonzero(~(np.abs(scaled) < LIMIT * _SCALE))[0])
        raise FixedPointError(
            f"{what}[{bad}] = {float(np.asarray(values).ravel()[bad])!r} cannot be encoded: "
            f"secure aggregation holds finite values within ±{LIMIT:.0f}"
        )
    return np.rint(scaled).astype(np.int64).view(np.uint64)


def decode(words: npt.NDArray[np.uint64]) -> npt.NDArray[np.float64]:
    """Fixed-point words (two's complement) back to float64."""
    return words.view(np.int64).astype(np.float64) / _SCALE
