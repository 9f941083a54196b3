"""Differential privacy of a site's update: the RDP accountant against published and exact values,
the clip bound, and the noise's standard deviation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from daemons.sl.privacy import values
from daemons.sl.privacy.accountant import (
    GaussianAccountant,
    epsilon_from_rdp,
    exact_gaussian_delta,
    exact_gaussian_epsilon,
    gaussian_rdp,
)
from daemons.sl.privacy.dp import DPError, DPSettings, SitePrivacy, privatize
from wire.tensors import FlatState

# (sigma, rounds, delta) -> epsilon printed by Google's dp-accounting 0.6.0:
#   RdpAccountant().compose(GaussianDpEvent(sigma), rounds).get_epsilon(delta)   and
#   PLDAccountant() likewise (the exact curve of the composed Gaussian, up to its discretisation).
DP_ACCOUNTING_RDP = {
    (1.0, 1, 1e-5): 4.728507067217623,
    (1.1, 100, 1e-5): 83.09977949943618,
    (4.0, 50, 1e-5): 9.234958991683897,
    (10.0, 1000, 1e-6): 20.551991629803823,
}
DP_ACCOUNTING_PLD = {(1.0, 1, 1e-5): 4.37717810002493, (4.0, 50, 1e-5): 8.595865794249383}


@pytest.mark.parametrize(("setting", "expected"), DP_ACCOUNTING_RDP.items())
def test_epsilon_matches_dp_accounting(setting: tuple[float, int, float], expected: float) -> None:
    sigma, rounds, delta = setting
    assert epsilon_from_rdp(gaussian_rdp(sigma, rounds), delta)[0] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("setting", "expected"), DP_ACCOUNTING_PLD.items())
def test_the_exact_gaussian_curve_matches_the_pld_accountant(
    setting: tuple[float, int, float], expected: float
) -> None:
    sigma, rounds, delta = setting
    assert exact_gaussian_epsilon(math.sqrt(rounds) / sigma, delta) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(("sigma", "rounds"), [(0.8, 1), (1.0, 10), (2.0, 100), (5.0, 1000)])
def test_the_rdp_bound_is_sound_and_close_to_exact(sigma: float, rounds: int) -> None:
    """k Gaussian releases with sigma are one Gaussian with sigma / sqrt(k) (Balle & Wang 2018)."""
    rdp_eps = epsilon_from_rdp(gaussian_rdp(sigma, rounds), 1e-5)[0]
    exact = exact_gaussian_epsilon(math.sqrt(rounds) / sigma, 1e-5)
    assert exact <= rdp_eps <= 1.25 * exact


def test_the_classic_calibration_is_within_its_promise() -> None:
    """Dwork & Roth, Thm A.1: sigma = sqrt(2 ln(1.25 / delta)) / epsilon gives (epsilon, delta)-DP."""
    epsilon, delta = 0.5, 1e-5
    sigma = math.sqrt(2 * math.log(1.25 / delta)) / epsilon
    assert exact_gaussian_delta(epsilon, 1 / sigma) <= delta
    assert exact_gaussian_epsilon(1 / sigma, delta) <= epsilon
    # at epsilon = 0 the curve is the total variation of N(0,1) and N(mu,1): 2 Phi(mu / 2) - 1
    assert exact_gaussian_delta(0.0, 1.0) == pytest.approx(math.erf(0.5 / math.sqrt(2)), rel=1e-12)


def test_the_accountant_grows_with_rounds() -> None:
    acc = GaussianAccountant(noise_multiplier=1.1, delta=1e-5)
    assert acc.epsilon == 0.0
    acc.step(100)
    assert acc.epsilon == pytest.approx(DP_ACCOUNTING_RDP[(1.1, 100, 1e-5)], rel=1e-12)


# ------------------------------------------------------------------------ clipping + noise
def _state(weights: np.ndarray, bias: np.ndarray, steps: int) -> FlatState:
    return FlatState.from_arrays(
        {"w": weights.astype(np.float32), "b": bias.astype(np.float32), "steps": np.array(steps)}
    )


def _update(model: FlatState, reference: FlatState) -> np.ndarray:
    floats = [s for s in model.specs if s.dtype == "float32"]
    return np.concatenate([values.read(model, s) - values.read(reference, s) for s in floats])


def test_a_large_update_is_clipped_to_the_bound_and_integers_pass() -> None:
    rng = np.random.default_rng(1)
    reference = _state(rng.normal(0, 1, 3000), rng.normal(0, 1, 10), 5)
    model = _state(values.read(reference, reference.specs[0]) + 2.0, np.zeros(10), 17)
    tiny = DPSettings(noise_multiplier=1e-9, clip_norm=1.5)
    released = privatize(model, reference, tiny, rng)
    assert released.norm > 100 and released.scale == pytest.approx(1.5 / released.norm)
    assert np.linalg.norm(_update(released.flat, reference)) == pytest.approx(1.5, rel=1e-4)
    assert int(released.flat.arrays()["steps"]) == 17
    small = _state(
        values.read(reference, reference.specs[0]) + 1e-3, values.read(reference, reference.specs[1]), 6
    )
    kept = privatize(small, reference, DPSettings(noise_multiplier=1e-9, clip_norm=10.0), rng)
    assert kept.scale == 1.0
    np.testing.assert_allclose(_update(kept.flat, reference), _update(small, reference), atol=1e-6)


def test_the_noise_has_std_sigma_times_clip() -> None:
    rng = np.random.default_rng(2)
    reference = _state(np.zeros(200_000), np.zeros(10), 0)
    settings = DPSettings(noise_multiplier=0.7, clip_norm=0.01)
    noise = _update(privatize(reference, reference, settings, rng).flat, reference)
    assert noise.std() == pytest.approx(0.7 * 0.01, rel=0.01)
    assert abs(noise.mean()) < 5 * 0.007 / math.sqrt(noise.size)


def test_a_site_counts_its_releases() -> None:
    site = SitePrivacy(DPSettings(noise_multiplier=4.0, clip_norm=1.0, delta=1e-5))
    model = _state(np.ones(10), np.ones(10), 1)
    for _ in range(50):
        site.release(model, model)
    assert site.epsilon == pytest.approx(DP_ACCOUNTING_RDP[(4.0, 50, 1e-5)], rel=1e-12)


def test_bad_settings_and_models_are_refused_by_name() -> None:
    with pytest.raises(DPError, match="dpNoiseMultiplier"):
        DPSettings(noise_multiplier=0.0, clip_norm=1.0)
    with pytest.raises(DPError, match="dpClipNorm"):
        DPSettings.from_params({"dp_noise_multiplier": 1.0})
    with pytest.raises(DPError, match="dpDelta"):
        DPSettings.from_params({"dp_noise_multiplier": 1.0, "dp_clip_norm": 1.0, "dp_delta": 2})
    assert DPSettings.from_params({}) is None
    a = _state(np.zeros(3), np.zeros(2), 0)
    b = FlatState.from_arrays({"w": np.zeros(4, dtype=np.float32)})
    with pytest.raises(DPError, match="different layouts"):
        privatize(a, b, DPSettings(1.0, 1.0), np.random.default_rng())
    nan = _state(np.array([np.nan, 0, 0]), np.zeros(2), 0)
    with pytest.raises(DPError, match="NaN"):
        privatize(nan, a, DPSettings(1.0, 1.0), np.random.default_rng())
