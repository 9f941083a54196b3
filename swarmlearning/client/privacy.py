"""SwarmCallback's privacy options: ``dpNoiseMultiplier``, ``dpClipNorm``, ``dpDelta`` and
``secureAggregation``.

With ``dpNoiseMultiplier`` set, the site's SL clips every update it checks in (the trained model
minus the model last loaded from the swarm) to L2 norm ``dpClipNorm``, adds Gaussian noise of
standard deviation ``dpNoiseMultiplier * dpClipNorm`` and reports epsilon for ``dpDelta`` in PERFDATA.
With ``secureAggregation=True`` (only with ``mergeMethod='mean'``; every site of the contract must set
it) the round's leader sees only masked models and their sum.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["DP_OPTIONS", "SECURE_OPTION", "privacy_params", "secure_params"]

DP_OPTIONS = frozenset({"dpNoiseMultiplier", "dpClipNorm", "dpDelta"})
SECURE_OPTION = "secureAggregation"


def _positive(name: str, value: Any, error: type[ValueError]) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise error(f"SwarmCallback: {name} must be a number > 0, got {value!r}")
    return float(value)


def privacy_params(kwargs: dict[str, Any], error: type[ValueError]) -> dict[str, Any]:
    """The DP options for the SL (empty when DP is off); ``error`` is raised for a bad one."""
    sigma = kwargs.get("dpNoiseMultiplier")
    if sigma is None:
        extra = sorted(DP_OPTIONS & {k for k, v in kwargs.items() if v is not None})
        if extra:
            raise error(f"SwarmCallback: {', '.join(extra)} need(s) dpNoiseMultiplier")
        return {}
    if kwargs.get("dpClipNorm") is None:
        raise error("SwarmCallback: dpNoiseMultiplier needs dpClipNorm (the L2 bound of the site's update)")
    delta = _positive("dpDelta", kwargs.get("dpDelta", 1e-5), error)
    if delta >= 1:
        raise error(f"SwarmCallback: dpDelta must be below 1, got {delta!r}")
    return {
        "dp_noise_multiplier": _positive("dpNoiseMultiplier", sigma, error),
        "dp_clip_norm": _positive("dpClipNorm", kwargs["dpClipNorm"], error),
        "dp_delta": delta,
    }


def secure_params(kwargs: dict[str, Any], merge_method: str, error: type[ValueError]) -> dict[str, Any]:
    """``{"secure_aggregation": True}`` when asked (and the merge is the mean), else empty."""
    secure = kwargs.get(SECURE_OPTION, False)
    if not isinstance(secure, bool):
        raise error(f"SwarmCallback: {SECURE_OPTION} must be True or False, got {secure!r}")
    if not secure:
        return {}
    if merge_method != "mean":
        raise error(
            f"SwarmCallback: {SECURE_OPTION} works only with mergeMethod='mean' (the leader sees only the "
            f"sum of masked models, which a {merge_method} cannot use); got mergeMethod={merge_method!r}"
        )
    return {"secure_aggregation": True}
