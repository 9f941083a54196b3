"""Shamir secret sharing (t-of-n) of byte strings over the prime field GF(2**521 - 1).

A secret of up to 64 bytes is read as a big-endian integer below the prime; any ``threshold`` shares
give it back by Lagrange interpolation at zero, fewer give no information about it.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PRIME", "Share", "ShamirError", "combine", "split"]

PRIME = (1 << 521) - 1  # a Mersenne prime: every 64-byte secret fits below it
_MAX_SECRET = 64


class ShamirError(ValueError):
    """Shares that cannot give the secret back (too few, repeated, out of range)."""


@dataclass(frozen=True, slots=True)
class Share:
    """One point ``(x, y)`` of the sharing polynomial; ``x`` is 1..n, never 0."""

    x: int
    y: int


def split(secret: bytes, threshold: int, count: int) -> list[Share]:
    """``count`` shares of ``secret``, any ``threshold`` of which recover it."""
    if not 1 <= threshold <= count:
        raise ShamirError(f"threshold must be in 1..{count}, got {threshold}")
    if len(secret) > _MAX_SECRET:
        raise ShamirError(f"a secret holds at most {_MAX_SECRET} bytes, got {len(secret)}")
    coefficients = [int.from_bytes(secret, "big")]
    coefficients += [secrets.randbelow(PRIME) for _ in range(threshold - 1)]
    return [Share(x, _evaluate(coefficients, x)) for x in range(1, count + 1)]


def combine(shares: Sequence[Share], threshold: int, size: int) -> bytes:
    """The ``size``-byte secret from at least ``threshold`` distinct shares."""
    points = {s.x: s.y for s in shares}
    if len(points) != len(shares):
        raise ShamirError("two shares have the same x")
    if len(points) < threshold:
        raise ShamirError(f"{len(points)} share(s) given, {threshold} needed")
    if any(not 0 < x < PRIME or not 0 <= y < PRIME for x, y in points.items()):
        raise ShamirError("a share lies outside the field")
    chosen = sorted(points.items())[:threshold]
    value = _interpolate_at_zero(chosen)
    if value >= 1 << (8 * size):
        raise ShamirError(f"the shares do not agree on a {size}-byte secret")
    return value.to_bytes(size, "big")


def _evaluate(coefficients: Sequence[int], x: int) -> int:
    """The polynomial at ``x`` (Horner), mod the prime."""
    value = 0
    for c in reversed(coefficients):
        value = (value * x + c) % PRIME
    return value


def _interpolate_at_zero(points: Sequence[tuple[int, int]]) -> int:
    """Lagrange interpolation of the points at x = 0, mod the prime."""
    total = 0
    for i, (xi, yi) in enumerate(points):
        num, den = 1, 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                num = num * -xj % PRIME
                den = den * (xi - xj) % PRIME
        total = (total + yi * num * pow(den, -1, PRIME)) % PRIME
    return total
