"""What a leader checks before it merges: each fetched row, the merge weights, and whether enough is left.

A row is left out, not fatal, when it holds NaN or inf, or (when the contract sets ``max_update_norm``)
when its distance to the previous merged model is beyond that bound. Rows whose layout differs never
reach the matrix: the fetch leaves them out with the reason. The leader merges the rest when at least
``min_peers`` rows remain (one in a final round, which closes with whoever finished); otherwise it fails
the round at once.

Weights: ``mean`` weighs rows by their declared sample count times ``nodeWeightage``, as the user asked;
it is not robust (one row of 1e30 or a huge sample count moves it anywhere). The robust methods
(``coordmedian``, ``trimmedmean``, ``krum``, ``geomedian``) ignore declared sample counts: every row with
a positive weight counts once, so no peer can buy the median by claiming a million samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from daemons.sl.merge import MergeError, TensorLayout, find_non_finite, float_distance

__all__ = [
    "ROBUST_METHODS",
    "Exclusion",
    "Screened",
    "merge_weights",
    "required_rows",
    "row_problem",
    "screen",
]

ROBUST_METHODS = frozenset({"coordmedian", "trimmedmean", "krum", "geomedian"})
_MAX_REASON = 300  # the ledger's limit on a reason


@dataclass(frozen=True, slots=True)
class Exclusion:
    """A row left out of a merge: whose, and why (for the ledger and the logs)."""

    uid: str
    reason: str

    def wire(self) -> dict[str, str]:
        """The ``{uid, reason}`` entry of a ``round.merged``/``round.failed`` body."""
        return {"uid": self.uid, "reason": self.reason[:_MAX_REASON]}


@dataclass(frozen=True, slots=True)
class Screened:
    """The rows to merge (indices into the matrix) and the ones left out."""

    keep: list[int]
    excluded: list[Exclusion]


def row_problem(
    row: npt.NDArray[np.uint8],
    layout: Sequence[TensorLayout],
    *,
    base: npt.NDArray[np.uint8] | None = None,
    max_update_norm: float = 0.0,
) -> str | None:
    """Why one flat row must not be merged, or None when it may.

    Args:
        row: the row's bytes.
        layout: its tensors.
        base: the previous merged model (same layout); the update is ``row - base``.
        max_update_norm: the largest L2 norm of the update over float tensors; 0 means no bound.
    """
    try:
        bad = find_non_finite(row, layout)
        if bad is not None:
            return f"tensor {bad[0]!r} has {bad[1]} non-finite values (NaN or inf)"
        if max_update_norm > 0 and base is not None:
            norm = float_distance(row, base, layout)
            if not norm <= max_update_norm:
                bound = f"the contract's max_update_norm {max_update_norm:g}"
                return f"its update has L2 norm {norm:.4g}, beyond {bound}"
    except MergeError as exc:
        return f"its model does not fit the layout: {exc}"
    return None


def screen(
    rows: Sequence[npt.NDArray[np.uint8]],
    uids: Sequence[str],
    layout: Sequence[TensorLayout],
    *,
    base: npt.NDArray[np.uint8] | None = None,
    max_update_norm: float = 0.0,
) -> Screened:
    """Check every row (one per uid; ``keep`` indexes ``rows``); see :func:`row_problem`."""
    keep: list[int] = []
    excluded: list[Exclusion] = []
    for i, uid in enumerate(uids):
        problem = row_problem(rows[i], layout, base=base, max_update_norm=max_update_norm)
        if problem is None:
            keep.append(i)
        else:
            excluded.append(Exclusion(uid, problem))
    return Screened(keep, excluded)


def merge_weights(method: str, declared: Sequence[Any]) -> list[float]:
    """The weights a merge uses: declared ones for ``mean``, 1 per positive weight for the robust methods.

    A row with weight 0 (``checkinModelOnTrainEnd='inactive'``) keeps no say; when every weight is 0, every
    row counts once.
    """
    weights = [max(float(w or 0.0), 0.0) for w in declared]
    if method.lower() in ROBUST_METHODS:
        weights = [1.0 if w > 0 else 0.0 for w in weights]
    if sum(weights) <= 0:
        return [1.0] * len(weights)
    return weights


def required_rows(min_peers: int, *, final: bool) -> int:
    """Usable rows a merge needs: ``min_peers``, or one in a final round."""
    return 1 if final else max(1, min_peers)
