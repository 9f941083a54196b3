"""Differential privacy of a site's update: clip it to an L2 bound and add Gaussian noise.

The update is the difference between the model a site checks in and the model it last loaded from
the swarm. Its float tensors together are clipped to L2 norm ``clip_norm`` (C) and every value gets
independent N(0, (sigma C)^2) noise; integer and bool tensors (counters such as BatchNorm's
``num_batches_tracked``) are released as they are. The noise comes from numpy's PCG64 seeded from
the operating system's entropy. :class:`SitePrivacy` counts the releases in an RDP accountant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from daemons.sl.privacy import values
from daemons.sl.privacy.accountant import GaussianAccountant
from wire.tensors import FlatState

__all__ = ["DPError", "DPSettings", "Release", "SitePrivacy", "privatize"]


class DPError(ValueError):
    """Settings or models that differential privacy cannot work with."""


@dataclass(frozen=True)
class DPSettings:
    """``noise_multiplier`` (sigma), ``clip_norm`` (C) and the ``delta`` that epsilon is reported for."""

    noise_multiplier: float
    clip_norm: float
    delta: float = 1e-5

    def __post_init__(self) -> None:
        """Reject settings that make no sense, naming the SwarmCallback option."""
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise DPError(f"dpNoiseMultiplier must be a number > 0, got {self.noise_multiplier!r}")
        if not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise DPError(f"dpClipNorm must be a number > 0, got {self.clip_norm!r}")
        if not 0 < self.delta < 1:
            raise DPError(f"dpDelta must be in (0, 1), got {self.delta!r}")

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> DPSettings | None:
        """The settings in a session's ``hello`` params; None when DP is off (no noise multiplier)."""
        sigma = params.get("dp_noise_multiplier")
        if sigma is None:
            return None
        clip = params.get("dp_clip_norm")
        if clip is None:
            raise DPError("dpNoiseMultiplier needs dpClipNorm (the L2 bound of a site's update)")
        try:
            return cls(float(sigma), float(clip), float(params.get("dp_delta") or 1e-5))
        except (TypeError, ValueError) as exc:
            if isinstance(exc, DPError):
                raise
            raise DPError(f"the dp* options must be numbers: {exc}") from None


@dataclass(frozen=True)
class Release:
    """A privatized model and what clipping did to its update."""

    flat: FlatState
    norm: float  # L2 norm of the update before clipping
    scale: float  # factor applied to the update, min(1, C / norm)


def privatize(
    model: FlatState, reference: FlatState, settings: DPSettings, rng: np.random.Generator
) -> Release:
    """``reference + clip(model - reference) + noise``, as a new flat state."""
    if model.specs != reference.specs:
        raise DPError("the checked-in model and the last loaded one have different layouts")
    floats = [s for s in model.specs if s.dtype in values.FLOAT_DTYPES]
    updates = [values.read(model, s) - values.read(reference, s) for s in floats]
    norm = math.sqrt(sum(float(np.dot(u, u)) for u in updates))
    if not math.isfinite(norm):
        raise DPError("the update holds NaN or inf; it cannot be clipped")
    scale = min(1.0, settings.clip_norm / norm) if norm > 0 else 1.0
    std = settings.noise_multiplier * settings.clip_norm
    out = FlatState(model.specs, model.buffer.copy())
    for spec, update in zip(floats, updates, strict=True):
        noisy = values.read(reference, spec) + update * scale + rng.normal(0.0, std, update.size)
        values.write(out, spec, noisy)
    return Release(out, norm, scale)


@dataclass
class SitePrivacy:
    """A site's DP: privatizes every release against the model it last loaded; keeps epsilon so far."""

    settings: DPSettings
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    reference: FlatState | None = None  # the model the site last loaded from the swarm

    def __post_init__(self) -> None:
        """Start the accountant at zero releases."""
        self.accountant = GaussianAccountant(self.settings.noise_multiplier, self.settings.delta)

    def loaded(self, model: FlatState) -> None:
        """The site continues training from ``model``: later updates are measured against it."""
        self.reference = model

    def release(self, model: FlatState, reference: FlatState | None = None) -> Release:
        """The privatized ``model`` (its update against ``reference``, by default the last loaded
        model); counts one release."""
        base = reference if reference is not None else self.reference
        if base is None:
            raise DPError("no model was loaded from the swarm yet; there is no update to privatize")
        result = privatize(model, base, self.settings, self.rng)
        self.accountant.step()
        return result

    @property
    def epsilon(self) -> float:
        """Epsilon for the configured delta after the releases so far."""
        return self.accountant.epsilon
