"""The differential-privacy options of SwarmCallback and the epsilon column of PERFDATA."""

from __future__ import annotations

from typing import Any

import pytest

from swarmlearning.client.privacy import privacy_params, secure_params
from swci.tables import perfdata_table


class _Bad(ValueError):
    pass


def test_dp_is_off_unless_a_noise_multiplier_is_given() -> None:
    assert privacy_params({}, _Bad) == {}
    assert privacy_params({"dpNoiseMultiplier": 1.1, "dpClipNorm": 2}, _Bad) == {
        "dp_noise_multiplier": 1.1,
        "dp_clip_norm": 2.0,
        "dp_delta": 1e-5,
    }


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dpClipNorm": 1.0}, "dpClipNorm need"),
        ({"dpNoiseMultiplier": 1.0}, "needs dpClipNorm"),
        ({"dpNoiseMultiplier": 0, "dpClipNorm": 1.0}, "dpNoiseMultiplier must be a number > 0, got 0"),
        ({"dpNoiseMultiplier": 1.0, "dpClipNorm": "1"}, "dpClipNorm must be a number"),
        ({"dpNoiseMultiplier": 1.0, "dpClipNorm": 1.0, "dpDelta": 1.0}, "dpDelta must be below 1"),
    ],
)
def test_bad_dp_options_are_refused_by_name(options: dict[str, Any], message: str) -> None:
    with pytest.raises(_Bad, match=message):
        privacy_params(options, _Bad)


def test_secure_aggregation_is_off_by_default_and_only_with_the_mean() -> None:
    assert secure_params({}, "mean", _Bad) == {}
    assert secure_params({"secureAggregation": True}, "mean", _Bad) == {"secure_aggregation": True}
    with pytest.raises(_Bad, match=r"works only with mergeMethod='mean'.*got mergeMethod='krum'"):
        secure_params({"secureAggregation": True}, "krum", _Bad)
    with pytest.raises(_Bad, match="must be True or False"):
        secure_params({"secureAggregation": "yes"}, "mean", _Bad)
    assert secure_params({"secureAggregation": False}, "geomedian", _Bad) == {}


def _headers(rows: list[dict[str, Any]]) -> list[str]:
    table = perfdata_table("c", rows)
    return [str(c) for c in table.columns]


def test_perfdata_shows_epsilon_only_when_a_site_reports_it() -> None:
    row = {"uid": "sl1", "status": "active", "loss": 0.5, "completed_epochs": 1, "total_epochs": 2}
    assert "Epsilon" not in _headers([row])
    assert "Epsilon" in _headers([row, {**row, "uid": "sl2", "epsilon": 3.2}])
