"""Rényi-DP accounting of a site that releases its Gaussian-noised, clipped update once per round.

A round releases ``update / max(1, |update| / C) + N(0, (sigma C)^2)``: the Gaussian mechanism of L2
sensitivity C (the site's whole data set is one "example" here: every round uses it, so there is no
subsampling amplification). Its Rényi DP of order alpha is ``alpha / (2 sigma^2)`` (Mironov 2017,
Prop. 7); k rounds compose to ``k alpha / (2 sigma^2)``. That becomes (epsilon, delta) by the
conversion of Balle et al. 2020 (Thm. 21), minimised over a grid of orders:

    epsilon = rdp(alpha) + log((alpha - 1) / alpha) - (log(delta) + log(alpha)) / (alpha - 1)

For the pure Gaussian mechanism the exact epsilon is known too (Balle & Wang 2018, the analytic
Gaussian mechanism); :func:`exact_gaussian_epsilon` computes it so that tests can check the RDP
bound is sound (never below the exact value) and tight (close to it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ORDERS",
    "AccountantError",
    "GaussianAccountant",
    "epsilon_from_rdp",
    "exact_gaussian_delta",
    "exact_gaussian_epsilon",
    "gaussian_rdp",
]

# The orders of Google's dp-accounting (DEFAULT_RDP_ORDERS): 1.1 ... 10.9, 11 ... 63, 128 ... 1024.
ORDERS: tuple[float, ...] = (
    *(1 + x / 10.0 for x in range(1, 100)),
    *(float(a) for a in range(11, 64)),
    128.0,
    256.0,
    512.0,
    1024.0,
)


class AccountantError(ValueError):
    """Parameters that make no sense for the accountant."""


def gaussian_rdp(noise_multiplier: float, rounds: int, orders: Sequence[float] = ORDERS) -> list[float]:
    """RDP of ``rounds`` compositions of the Gaussian mechanism with ``sigma = noise_multiplier``."""
    if noise_multiplier <= 0:
        raise AccountantError(f"the noise multiplier must be > 0, got {noise_multiplier}")
    return [rounds * a / (2.0 * noise_multiplier**2) for a in orders]


def epsilon_from_rdp(
    rdp: Sequence[float], delta: float, orders: Sequence[float] = ORDERS
) -> tuple[float, float]:
    """The least epsilon (and the order that gives it) for ``delta``, by Balle et al. 2020."""
    if not 0 < delta < 1:
        raise AccountantError(f"delta must be in (0, 1), got {delta}")
    best, order = math.inf, math.nan
    for a, r in zip(orders, rdp, strict=True):
        eps = r + math.log1p(-1.0 / a) - (math.log(delta) + math.log(a)) / (a - 1)
        if eps < best:
            best, order = eps, a
    return max(best, 0.0), order


def exact_gaussian_delta(epsilon: float, mu: float) -> float:
    """delta(epsilon) of the Gaussian mechanism with ``mu = sensitivity / sigma`` (Balle & Wang 2018)."""
    return _phi(-epsilon / mu + mu / 2) - math.exp(epsilon) * _phi(-epsilon / mu - mu / 2)


def exact_gaussian_epsilon(mu: float, delta: float) -> float:
    """The least epsilon with delta(epsilon) <= ``delta``, by bisection on the exact curve."""
    lo, hi = 0.0, 1.0
    while exact_gaussian_delta(hi, mu) > delta:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if exact_gaussian_delta(mid, mu) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


@dataclass
class GaussianAccountant:
    """Epsilon so far of a site that noises every released update with ``noise_multiplier``."""

    noise_multiplier: float
    delta: float
    rounds: int = 0

    def __post_init__(self) -> None:
        """Reject settings that make no sense."""
        if self.noise_multiplier <= 0:
            raise AccountantError(f"the noise multiplier must be > 0, got {self.noise_multiplier}")
        if not 0 < self.delta < 1:
            raise AccountantError(f"delta must be in (0, 1), got {self.delta}")

    def step(self, rounds: int = 1) -> None:
        """Count ``rounds`` more releases."""
        self.rounds += rounds

    @property
    def epsilon(self) -> float:
        """Epsilon for ``delta`` after the releases so far (0 before the first)."""
        if self.rounds == 0:
            return 0.0
        return epsilon_from_rdp(gaussian_rdp(self.noise_multiplier, self.rounds), self.delta)[0]
