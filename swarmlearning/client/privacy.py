"""SwarmCallback's differential-privacy options: ``dpNoiseMultiplier``, ``dpClipNorm``, ``dpDelta``.

With ``dpNoiseMultiplier`` set, the site's SL clips every update it checks in (the trained model
minus the model last loaded from the swarm) to L2 norm ``dpClipNorm``, adds Gaussian noise of
standard deviation ``dpNoiseMultiplier * dpClipNorm`` and reports epsilon for ``dpDelta`` in PERFDATA.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["DP_OPTIONS", "privacy_params"]

DP_OPTIONS = frozenset({"dpNoiseMultiplier", "dpClipNorm", "dpDelta"})


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
