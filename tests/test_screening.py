"""What a leader leaves out before merging (daemons/sl/screening.py), and the robust methods against one bad
peer among four or five (daemons/sl/merge.py)."""

from __future__ import annotations

import numpy as np
import pytest

from daemons.sl.merge import (
    MERGE_METHODS,
    MergeError,
    MergeOptions,
    TensorLayout,
    find_non_finite,
    float_distance,
    merge_flat,
)
from daemons.sl.screening import merge_weights, required_rows, row_problem, screen

# a float32 matrix, a bfloat16 vector and an int64 counter, 64-byte aligned
LAYOUT: list[TensorLayout] = [
    ("w", "float32", (4, 8), 0, 128),
    ("b", "bfloat16", (8,), 128, 16),
    ("steps", "int64", (1,), 192, 8),
]
TOTAL = 256


def make_row(rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    row = np.zeros(TOTAL, dtype=np.uint8)
    row[0:128].view(np.float32)[:] = rng.normal(size=32).astype(np.float32) * scale
    b = rng.normal(size=8).astype(np.float32) * scale
    row[128:144].view(np.uint16)[:] = (b.view(np.uint32) >> 16).astype(np.uint16)
    row[192:200].view(np.int64)[:] = 7
    return row


def test_non_finite_values_are_found_in_float32_and_bfloat16_not_in_padding() -> None:
    rng = np.random.default_rng(1)
    row = make_row(rng)
    row[150:190] = 0xFF  # padding may hold anything
    assert find_non_finite(row, LAYOUT) is None
    row[0:128].view(np.float32)[[3, 5]] = [np.nan, np.inf]
    assert find_non_finite(row, LAYOUT) == ("w", 2)
    other = make_row(rng)
    other[128:144].view(np.uint16)[0] = 0x7FC0  # bfloat16 NaN
    assert find_non_finite(other, LAYOUT) == ("b", 1)


def test_float_distance_counts_float_tensors_only() -> None:
    rng = np.random.default_rng(2)
    a = make_row(rng)
    b = a.copy()
    b[0:128].view(np.float32)[0] += 3.0
    b[128:144].view(np.uint16)[0] = 0x4080  # bfloat16 4.0
    b[192:200].view(np.int64)[:] = 10**6  # a counter is no update of the weights
    old_b = float((a[128:144].view(np.uint16)[:1].astype(np.uint32) << 16).view(np.float32)[0])
    expected = np.hypot(3.0, 4.0 - old_b)
    assert float_distance(a, b, LAYOUT) == pytest.approx(expected, rel=1e-6)


def test_screen_leaves_out_nan_and_too_large_updates_naming_them() -> None:
    rng = np.random.default_rng(3)
    base = make_row(rng)
    rows = [base.copy() for _ in range(4)]
    rows[1][0:128].view(np.float32)[:] = np.nan
    rows[3][0:128].view(np.float32)[:] *= 1000
    screened = screen(rows, ["a", "b", "c", "d"], LAYOUT, base=base, max_update_norm=10.0)
    assert screened.keep == [0, 2]
    assert [e.uid for e in screened.excluded] == ["b", "d"]
    assert screened.excluded[0].reason == "tensor 'w' has 32 non-finite values (NaN or inf)"
    assert "beyond the contract's max_update_norm 10" in screened.excluded[1].reason
    # without a bound (or a base) only non-finite rows go
    assert screen(rows, ["a", "b", "c", "d"], LAYOUT, base=base).keep == [0, 2, 3]
    assert screen(rows, ["a", "b", "c", "d"], LAYOUT, max_update_norm=10.0).keep == [0, 2, 3]


def test_a_row_that_does_not_fit_the_layout_is_a_problem_not_a_crash() -> None:
    assert "does not fit the layout" in str(row_problem(np.zeros(100, dtype=np.uint8), LAYOUT))
    assert len(screen([], [], LAYOUT).keep) == 0


# Positions of one bad value: float32 bytes 0..127 (value index 0..31), bfloat16 bytes 128..143 (0..7).
_BAD_SPOTS = [("w", 0), ("w", 31), ("b", 3)]


@pytest.mark.parametrize("method", MERGE_METHODS)
@pytest.mark.parametrize("spot", _BAD_SPOTS)
@pytest.mark.parametrize("weights", [[1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 0.0, 3.0, 4.0, 5.0]])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_merge_without_screening_refuses_every_row_the_screen_would_leave_out(
    method: str, spot: tuple[str, int], weights: list[float], bad: float
) -> None:
    """The leader merges before it screens: that is sound only if the merge refuses whatever the screen
    (without a norm bound) would leave out, whichever row holds it, whatever its weight."""
    rng = np.random.default_rng(11)
    options = MergeOptions(trim_ratio=0.2)
    clean = [make_row(rng) for _ in range(5)]
    factors = merge_weights(method, weights)
    merge_flat(clean, LAYOUT, factors, method, options=options)  # clean rows merge
    assert screen(clean, list("abcde"), LAYOUT).keep == [0, 1, 2, 3, 4]
    tensor, index = spot
    for row in range(5):
        rows = [r.copy() for r in clean]
        if tensor == "w":
            rows[row][0:128].view(np.float32)[index] = bad
        else:
            word = (np.array([bad], dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
            rows[row][128:144].view(np.uint16)[index] = word[0]
        assert screen(rows, list("abcde"), LAYOUT).keep == [i for i in range(5) if i != row]
        with pytest.raises(MergeError):
            merge_flat(rows, LAYOUT, factors, method, options=options)


def test_a_merge_without_screening_refuses_a_row_that_does_not_fit_the_layout() -> None:
    rng = np.random.default_rng(12)
    rows = [make_row(rng) for _ in range(3)] + [np.zeros(100, dtype=np.uint8)]
    assert screen(rows, list("abcd"), LAYOUT).keep == [0, 1, 2]
    with pytest.raises(MergeError):
        merge_flat(rows, LAYOUT, [1.0] * 4, "mean")


def test_robust_methods_ignore_declared_sample_counts_mean_keeps_them() -> None:
    assert merge_weights("coordmedian", [10.0, 1e9, 0.0, 3]) == [1.0, 1.0, 0.0, 1.0]
    assert merge_weights("krum", [0, 0]) == [1.0, 1.0]
    assert merge_weights("mean", [10.0, 1e9, None]) == [10.0, 1e9, 0.0]
    assert required_rows(3, final=False) == 3
    assert required_rows(3, final=True) == 1


def test_trimmedmean_trims_one_row_per_side_from_four_peers() -> None:
    x = np.array([[1.0], [2.0], [3.0], [1e30]], dtype=np.float32)
    rows = np.ascontiguousarray(x.view(np.uint8))
    layout: list[TensorLayout] = [("x", "float32", (1,), 0, 4)]
    merged = merge_flat(rows, layout, [1.0] * 4, "trimmedmean", options=MergeOptions(trim_ratio=0.1))
    assert merged.view(np.float32)[0] == 2.5
    three = merge_flat(rows[:3], layout, [1.0] * 3, "trimmedmean", options=MergeOptions(trim_ratio=0.1))
    assert three.view(np.float32)[0] == 2.0  # nothing trimmed below four peers


@pytest.mark.parametrize("method", ["coordmedian", "trimmedmean", "krum", "geomedian"])
@pytest.mark.parametrize("attack", ["x100", "1e30", "signflip", "samples"])
@pytest.mark.parametrize("peers", [4, 5])
def test_one_bad_peer_barely_moves_a_robust_merge(method: str, attack: str, peers: int) -> None:
    rng = np.random.default_rng(peers)
    centre = rng.normal(size=64).astype(np.float32)
    honest = [centre + 0.01 * rng.normal(size=64).astype(np.float32) for _ in range(peers)]
    bad = {"x100": honest[0] * 100, "1e30": np.full(64, 1e30, np.float32), "signflip": -honest[0]}
    values = [bad.get(attack, honest[0]), *honest[1:]]
    declared = [1e9 if attack == "samples" else 100.0] + [100.0] * (peers - 1)
    rows = np.ascontiguousarray(np.stack(values).view(np.uint8))
    layout: list[TensorLayout] = [("w", "float32", (64,), 0, 256)]
    merged = merge_flat(rows, layout, merge_weights(method, declared), method).view(np.float32)
    spread = max(float(np.abs(h - centre).max()) for h in honest[1:])
    assert float(np.abs(merged - centre).max()) <= 2 * spread, (method, attack)


@pytest.mark.parametrize("method", ["coordmedian", "trimmedmean", "krum", "geomedian"])
def test_a_poisoned_peer_costs_a_robust_merge_under_one_accuracy_point(method: str) -> None:
    from bench.robust import simulate

    clean = simulate(method, 5, None, rounds=4)["accuracy"]
    for attack in ("1e30", "samples"):
        poisoned = simulate(method, 5, attack, rounds=4)
        assert poisoned["accuracy"] > clean - 1.0, (method, attack, poisoned, clean)
    assert simulate(method, 5, "nan", rounds=4)["excluded"] == 4  # left out of every round


def test_a_round_short_of_its_quorum_says_whom_it_waits_for() -> None:
    from daemons.sl.rounds import waiting_for

    view = {"round": 3, "min_peers": 3, "checkins": [{"uid": "sl-2"}], "expected": ["sl-1", "sl-2"]}
    assert waiting_for(view, 3) == (
        "round 3 waits for 3 peers (minPeers); 1 checked in (sl-2); waiting for sl-1 to check in"
    )
    alone = {**view, "expected": ["sl-2"]}
    assert str(waiting_for(alone, 3)).endswith(
        "no other member is online: start 2 more node(s) or lower minPeers"
    )
    assert waiting_for({**view, "min_peers": 1}, 3) is None
    assert waiting_for(view, 4) is None and waiting_for(None, 3) is None


def test_only_the_rounds_leader_may_fetch_a_nodes_checked_in_weights() -> None:
    from daemons.sl.rounds import fetch_refusal

    rnd = {"round": 4, "leader": "sl-2", "status": "CLOSED"}
    assert fetch_refusal(rnd, "sl-2", "sl-1", "c") is None
    assert fetch_refusal(rnd, "swci-1", "sl-1", "c") == (
        "'swci-1' may not fetch the weights 'sl-1' checked in to round 4 of 'c': only that round's leader "
        "(sl-2) may"
    )
    assert "leader (none yet)" in str(fetch_refusal({"round": 5, "leader": None}, "sl-2", "sl-1", "c"))


def test_only_a_cheap_merge_stays_on_the_event_loop() -> None:
    """The weighted mean of a few small rows runs on the loop; larger or robust merges go to a thread."""
    from daemons.sl.rounds import _merges_inline

    small = 1_600_000
    assert _merges_inline("mean", small, 4) and _merges_inline("MEAN", small, 5)
    assert not _merges_inline("mean", small, 6)  # more than 8 MiB of rows to read
    assert not _merges_inline("mean", 45_000_000, 2)
    for robust in ("coordmedian", "geomedian", "trimmedmean", "krum"):
        assert not _merges_inline(robust, small, 4)
