"""Weight merging (daemons.sl.merge) against plain numpy oracles; no broker, no torch."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from daemons.sl import merge as merge_module
from daemons.sl.merge import (
    MERGE_METHODS,
    MergeError,
    MergeOptions,
    TensorLayout,
    find_non_finite,
    merge_flat,
    merge_states,
    validate_flat,
    validate_inputs,
)

State = dict[str, np.ndarray]
SHAPES = {"conv.weight": (4, 3, 3), "conv.bias": (4,), "fc.weight": (5, 7)}


def make_states(rng: np.random.Generator, n: int, dtype: Any = np.float32) -> list[State]:
    return [
        {name: rng.standard_normal(shape).astype(dtype) for name, shape in SHAPES.items()} for _ in range(n)
    ]


def stacked(states: Sequence[Mapping[str, np.ndarray]], name: str) -> np.ndarray:
    return np.stack([s[name] for s in states]).astype(np.float64)


def pack(states: Sequence[Mapping[str, np.ndarray]], labels: Mapping[str, str] | None = None):
    """Test-side packer: 64-byte aligned offsets, padding filled with NaN-looking 0xFF bytes."""
    layout: list[TensorLayout] = []
    offset = 0
    for name, array in states[0].items():
        label = (labels or {}).get(name, array.dtype.name)
        layout.append((name, label, array.shape, offset, array.nbytes))
        offset = (offset + array.nbytes + 63) // 64 * 64
    rows = np.full((len(states), offset), 0xFF, dtype=np.uint8)
    for row, state in zip(rows, states, strict=True):
        for name, _, _, off, nbytes in layout:
            row[off : off + nbytes] = np.ascontiguousarray(state[name]).reshape(-1).view(np.uint8)
    return rows, layout


def oracle_lower_median(values: np.ndarray, weights: Sequence[float]) -> np.ndarray:
    """Direct weighted lower median per coordinate: smallest v with weight(x <= v) >= total/2."""
    total = sum(weights)
    flat = values.reshape(len(values), -1)
    out = np.empty(flat.shape[1])
    for c in range(flat.shape[1]):
        column = flat[:, c]
        for v in sorted(set(column.tolist())):
            if sum(w for x, w in zip(column.tolist(), weights, strict=True) if x <= v) >= total / 2:
                out[c] = v
                break
    return out.reshape(values.shape[1:])


def oracle_trimmed(values: np.ndarray, cut: int) -> np.ndarray:
    flat = values.reshape(len(values), -1)
    kept = [sorted(flat[:, c].tolist())[cut : len(values) - cut] for c in range(flat.shape[1])]
    return np.array([sum(k) / len(k) for k in kept]).reshape(values.shape[1:])


def flat_vectors(states: Sequence[Mapping[str, np.ndarray]]) -> np.ndarray:
    return np.stack([np.concatenate([s[k].astype(np.float64).ravel() for k in s]) for s in states])


def krum_scores(vectors: np.ndarray, f: int) -> list[float]:
    """Brute force: sum of squared distances to the n - f - 2 nearest other peers."""
    n = len(vectors)
    scores = []
    for i in range(n):
        dists = sorted(float(np.sum((vectors[i] - vectors[j]) ** 2)) for j in range(n) if j != i)
        scores.append(sum(dists[: n - f - 2]))
    return scores


def oracle_krum(vectors: np.ndarray, f: int) -> int:
    return int(np.argmin(krum_scores(vectors, f)))


def oracle_weiszfeld(vectors: np.ndarray, weights: Sequence[float], eps: float, iters: int):
    w = np.asarray(weights, dtype=np.float64)
    y = w @ vectors / w.sum()
    for _ in range(iters):
        d = np.maximum(np.linalg.norm(vectors - y, axis=1), 1e-12)
        new = (w / d) @ vectors / np.sum(w / d)
        step = np.linalg.norm(new - y)
        y = new
        if step <= eps * np.linalg.norm(y):
            break
    return y


def bf16_to_f32(words: np.ndarray) -> np.ndarray:
    return (words.astype(np.uint32) << 16).view(np.float32)


# ------------------------------------------------------------------------------- semantics


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_mean_matches_np_average(dtype: Any, n: int) -> None:
    rng = np.random.default_rng(n)
    states = make_states(rng, n, dtype)
    weights = rng.uniform(0.1, 5.0, n).tolist()
    merged = merge_states(states, weights, "MEAN")
    rtol = 1e-6 if dtype == np.float32 else 1e-13
    for name in SHAPES:
        assert merged[name].dtype == dtype
        expected = np.average(stacked(states, name), axis=0, weights=weights)
        np.testing.assert_allclose(merged[name], expected, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("n", [2, 3, 4, 7, 8, 20])
@pytest.mark.parametrize("weighting", ["equal", "random", "integer"])
def test_coordmedian_matches_weighted_median(n: int, weighting: str) -> None:
    rng = np.random.default_rng(n)
    states = make_states(rng, n, np.float64)
    states[0]["fc.weight"][:] = np.round(states[0]["fc.weight"])  # ties between peers
    states[-1]["fc.weight"][:] = np.round(states[-1]["fc.weight"])
    weights = {
        "equal": [2.0] * n,
        "random": rng.uniform(0.0, 3.0, n).tolist(),
        "integer": rng.integers(1, 4, n).astype(float).tolist(),
    }[weighting]
    merged = merge_states(states, weights, "coordmedian")
    for name in SHAPES:
        expected = oracle_lower_median(stacked(states, name), weights)
        np.testing.assert_array_equal(merged[name], expected)


def test_coordmedian_of_even_count_is_the_lower_middle() -> None:
    states = [{"x": np.array([v], dtype=np.float32)} for v in (4.0, 1.0, 3.0, 2.0)]
    assert merge_states(states, [1, 1, 1, 1], "coordmedian")["x"][0] == 2.0
    assert merge_states(states, [1, 1, 1, 5], "coordmedian")["x"][0] == 2.0
    assert merge_states(states, [5, 1, 1, 1], "coordmedian")["x"][0] == 4.0


@pytest.mark.parametrize(("n", "ratio"), [(3, 0.1), (5, 0.2), (8, 0.125), (8, 0.4), (20, 0.45)])
def test_trimmedmean_matches_sorted_slice(n: int, ratio: float) -> None:
    rng = np.random.default_rng(n)
    states = make_states(rng, n, np.float64)
    merged = merge_states(states, [1.0] * n, "trimmedmean", options=MergeOptions(trim_ratio=ratio))
    cut = math.floor(ratio * n)
    for name in SHAPES:
        np.testing.assert_allclose(merged[name], oracle_trimmed(stacked(states, name), cut))


def test_trimmedmean_ignores_weights_and_outliers() -> None:
    states = [{"x": np.array([v], dtype=np.float32)} for v in (1.0, 2.0, 3.0, 1e6, -1e6)]
    options = MergeOptions(trim_ratio=0.2)
    assert merge_states(states, [1, 9, 1, 1, 1], "trimmedmean", options=options)["x"][0] == 2.0


@pytest.mark.parametrize(("n", "f"), [(3, None), (5, None), (8, None), (8, 1), (9, 3)])
def test_krum_picks_the_brute_force_peer(n: int, f: int | None) -> None:
    rng = np.random.default_rng(n)
    states = make_states(rng, n, np.float32)
    states[1] = {k: v + 50.0 for k, v in states[1].items()}  # a byzantine peer
    merged = merge_states(states, [1.0] * n, "krum", options=MergeOptions(krum_byzantine=f))
    byzantine = max(0, (n - 3) // 2) if f is None else f
    chosen = oracle_krum(flat_vectors(states), byzantine)
    assert chosen != 1
    for name in SHAPES:
        np.testing.assert_array_equal(merged[name], states[chosen][name])


@pytest.mark.parametrize("n", [3, 4, 8])
def test_geomedian_matches_weiszfeld_reference(n: int) -> None:
    rng = np.random.default_rng(n)
    states = make_states(rng, n, np.float64)
    weights = rng.uniform(0.5, 2.0, n).tolist()
    options = MergeOptions(geomedian_eps=1e-12, geomedian_max_iter=2000)
    merged = merge_states(states, weights, "geomedian", options=options)
    got = flat_vectors([merged])[0]
    expected = oracle_weiszfeld(flat_vectors(states), weights, 1e-14, 5000)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    default = flat_vectors([merge_states(states, weights, "geomedian")])[0]
    cost = lambda y: float(np.asarray(weights) @ np.linalg.norm(flat_vectors(states) - y, axis=1))  # noqa: E731
    assert cost(default) <= cost(expected) * (1 + 1e-5)  # 100 iterations: near the optimum


def test_geomedian_on_a_data_point_and_of_identical_peers() -> None:
    points = [np.array([0.0, 0.0]), np.array([1.0, 0.0]), np.array([0.0, 1.0])]
    states = [{"x": p.astype(np.float32)} for p in points]
    merged = merge_states(states, [10.0, 1.0, 1.0], "geomedian")  # dominant weight wins
    np.testing.assert_allclose(merged["x"], [0.0, 0.0], atol=1e-6)
    same = merge_states([states[1]] * 3, [1, 2, 3], "geomedian")
    np.testing.assert_array_equal(same["x"], states[1]["x"])


def test_geomedian_resists_an_outlier_unlike_mean() -> None:
    states = [{"x": np.array([v, v], dtype=np.float32)} for v in (1.0, 1.1, 0.9, 1000.0)]
    assert abs(merge_states(states, [1] * 4, "geomedian")["x"][0] - 1.0) < 0.2
    assert merge_states(states, [1] * 4, "mean")["x"][0] > 200


# ------------------------------------------------------------------------------- dtypes


def test_float16_is_computed_in_float32_and_rounded_back() -> None:
    rng = np.random.default_rng(7)
    states = make_states(rng, 5, np.float16)
    weights = [1.0, 2.0, 3.0, 4.0, 5.0]
    for method in MERGE_METHODS:
        merged = merge_states(states, weights, method)
        assert all(v.dtype == np.float16 for v in merged.values())
    merged = merge_states(states, weights, "mean")
    for name in SHAPES:
        expected = np.average(stacked(states, name), axis=0, weights=weights).astype(np.float16)
        np.testing.assert_array_max_ulp(merged[name], expected, maxulp=1)
    same = merge_states([states[0]] * 3, [1, 1, 1], "mean")
    for name in SHAPES:
        np.testing.assert_array_equal(same[name], states[0][name])


@pytest.mark.parametrize(
    ("value", "word"),
    [
        (1.0, 0x3F80),
        (np.float32(1.0) + np.float32(2**-8), 0x3F80),  # tie, round to even (down)
        (np.float32(1.0) + np.float32(3 * 2**-8), 0x3F82),  # tie, round to even (up)
        (np.float32(1.0) + np.float32(2**-8 + 2**-20), 0x3F81),  # above the tie
        (-2.5, 0xC020),
        (np.inf, 0x7F80),
        (np.finfo(np.float32).max, 0x7F80),  # rounds up to inf
    ],
)
def test_bfloat16_rounds_to_nearest_even(value: float, word: int) -> None:
    got = merge_module._f32_to_bf16(np.array([value], dtype=np.float32))
    assert got.dtype == np.uint16
    assert int(got[0]) == word


def test_bfloat16_keeps_nan() -> None:
    words = merge_module._f32_to_bf16(np.array([np.nan, -np.nan], dtype=np.float32))
    assert np.isnan(bf16_to_f32(words)).all()
    assert int(words[1]) & 0x8000


def test_bfloat16_merge_round_trip() -> None:
    rng = np.random.default_rng(3)
    words = [merge_module._f32_to_bf16(rng.standard_normal(64).astype(np.float32)) for _ in range(4)]
    states = [{"w": w} for w in words]
    dtypes = {"w": "bfloat16"}
    weights = [1.0, 2.0, 3.0, 4.0]
    merged = merge_states(states, weights, "mean", dtypes=dtypes)["w"]
    assert merged.dtype == np.uint16
    exact = np.average(np.stack([bf16_to_f32(w) for w in words]), axis=0, weights=weights)
    low = bf16_to_f32(merged)
    other = bf16_to_f32(merged + np.where(low < exact, 1, -1).astype(np.uint16))
    assert np.all(np.abs(low - exact) <= np.abs(other - exact) + 1e-7)
    same = merge_states([states[0]] * 3, [1, 1, 1], "mean", dtypes=dtypes)["w"]
    np.testing.assert_array_equal(same, words[0])
    median = merge_states(states, weights, "coordmedian", dtypes=dtypes)["w"]
    np.testing.assert_array_equal(
        bf16_to_f32(median), oracle_lower_median(np.stack([bf16_to_f32(w) for w in words]), weights)
    )


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8])
def test_integer_buffers_keep_dtype_and_round(dtype: Any) -> None:
    states = [{"n": np.array(v, dtype=dtype)} for v in (10, 11)]
    merged = merge_states(states, [1, 1], "mean")["n"]
    assert merged.dtype == dtype
    assert merged.shape == ()
    assert int(merged) == 10  # rint: half to even
    assert int(merge_states([*states, states[1]], [1, 1, 1], "mean")["n"]) == 11
    assert int(merge_states(states, [1, 3], "mean")["n"]) == 11


def test_integers_with_every_method() -> None:
    states = [
        {"w": np.full(3, v, dtype=np.float32), "n": np.array([v, 2 * v], dtype=np.int64)}
        for v in (1, 2, 4, 7, 100)
    ]
    weights = [1, 1, 1, 1, 2]
    mean_rule = np.rint(np.average([[1, 2], [2, 4], [4, 8], [7, 14], [100, 200]], axis=0, weights=weights))
    for method in ("mean", "geomedian", "krum"):
        merged = merge_states(states, weights, method)["n"]
        assert merged.dtype == np.int64
        np.testing.assert_array_equal(merged, mean_rule)
    np.testing.assert_array_equal(merge_states(states, weights, "coordmedian")["n"], [4, 8])
    options = MergeOptions(trim_ratio=0.2)
    np.testing.assert_array_equal(merge_states(states, weights, "trimmedmean", options=options)["n"], [4, 9])


def test_bool_is_a_weighted_majority() -> None:
    states = [{"m": np.array(v)} for v in ([True, True, False], [False, True, False], [False, False, True])]
    for method in MERGE_METHODS:
        merged = merge_states(states, [3, 1, 1], method)["m"]
        assert merged.dtype == np.bool_
        expected = [False, True, False] if method == "trimmedmean" else [True, True, False]
        np.testing.assert_array_equal(merged, expected, err_msg=method)  # trimmedmean: unweighted
    tie = merge_states(states[:2], [1, 1], "mean")["m"]
    np.testing.assert_array_equal(tie, [False, True, False])


def test_single_peer_returns_an_exact_copy() -> None:
    state = {
        "w": np.array([-0.0, 1.5, 3e38], dtype=np.float32),
        "n": np.array([2**62 + 1], dtype=np.int64),
    }
    for method in MERGE_METHODS:
        merged = merge_states([state], [0.5], method)
        assert merged["w"] is not state["w"]
        assert merged["w"].tobytes() == state["w"].tobytes()
        assert merged["n"].tobytes() == state["n"].tobytes()


def test_zero_weight_peers_have_no_say() -> None:
    states = [{"x": np.array([v], dtype=np.float32)} for v in (1.0, 2.0, 3.0, 4.0, 1e6)]
    for method in MERGE_METHODS:
        with_outlier = merge_states(states, [1, 1, 1, 1, 0], method)["x"]
        without = merge_states(states[:4], [1, 1, 1, 1], method)["x"]
        np.testing.assert_array_equal(with_outlier, without, err_msg=method)
        only = merge_states(states, [0, 0, 2, 0, 0], method)["x"]
        np.testing.assert_array_equal(only, states[2]["x"], err_msg=method)


# ------------------------------------------------------------------------------- flat API


def mixed_states(rng: np.random.Generator, n: int) -> tuple[list[State], dict[str, str]]:
    states = []
    for _ in range(n):
        state = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()}
        state["half"] = rng.standard_normal(9).astype(np.float16)
        state["brain"] = merge_module._f32_to_bf16(rng.standard_normal(6).astype(np.float32))
        state["double"] = rng.standard_normal((2, 2))
        state["bn.num_batches_tracked"] = np.array(rng.integers(0, 100), dtype=np.int64)
        state["mask"] = rng.random(5) > 0.5
        states.append(state)
    return states, {"brain": "bfloat16"}


@pytest.mark.parametrize("method", MERGE_METHODS)
def test_merge_flat_equals_merge_states(method: str) -> None:
    rng = np.random.default_rng(11)
    states, dtypes = mixed_states(rng, 6)
    weights = rng.uniform(0.5, 2.0, 6).tolist()
    by_state = merge_states(states, weights, method, dtypes=dtypes)
    rows, layout = pack(states, dtypes)  # padding holds 0xFF garbage
    out = np.full(rows.shape[1], 7, dtype=np.uint8)
    flat = merge_flat(rows, layout, weights, method, out=out)
    assert flat is out
    covered = np.zeros(len(out), dtype=bool)
    for name, label, shape, offset, nbytes in layout:
        got = out[offset : offset + nbytes].view(by_state[name].dtype).reshape(shape)
        np.testing.assert_array_equal(got, by_state[name], err_msg=f"{name} ({label})")
        covered[offset : offset + nbytes] = True
    assert not out[~covered].any(), "padding must be zero"


@pytest.mark.parametrize("method", MERGE_METHODS)
def test_separate_row_buffers_merge_exactly_like_their_matrix(method: str) -> None:
    rng = np.random.default_rng(12)
    states, dtypes = mixed_states(rng, 5)
    weights = rng.uniform(0.5, 2.0, 5).tolist()
    rows, layout = pack(states, dtypes)
    separate = [row.copy() for row in rows]  # buffers of their own, as a leader holds pushed rows
    np.testing.assert_array_equal(
        merge_flat(separate, layout, weights, method), merge_flat(rows, layout, weights, method)
    )
    validate_flat(separate, layout, weights, method)


def test_large_separate_rows_span_many_blocks() -> None:
    rng = np.random.default_rng(13)
    states = [{"w": rng.standard_normal(300_000).astype(np.float32)} for _ in range(3)]
    rows, layout = pack(states)
    for method in ("mean", "trimmedmean", "geomedian"):
        expected = merge_flat(rows, layout, [1, 2, 3], method)
        np.testing.assert_array_equal(merge_flat(list(rows), layout, [1, 2, 3], method), expected)


def sorted_lower_median(values: np.ndarray, weights: Sequence[float]) -> np.ndarray:
    """Vectorised oracle for large inputs: cumulative weights along the sorted peer axis."""
    w = np.asarray(weights, dtype=np.float64)
    order = np.argsort(values, axis=0, kind="stable")
    first = np.argmax(np.cumsum(w[order], axis=0) >= w.sum() / 2, axis=0)
    return np.take_along_axis(np.sort(values, axis=0), first[None], axis=0)[0]


def test_large_tensors_span_many_blocks() -> None:
    rng = np.random.default_rng(5)
    big = 300_000  # several processing blocks and median chunks
    states = [
        {"a": rng.standard_normal(big).astype(np.float32), "h": rng.standard_normal(big).astype(np.float16)}
        for _ in range(4)
    ]
    weights = [1.0, 2.0, 3.0, 4.5]
    mean = merge_states(states, weights, "mean")
    median = merge_states(states, weights, "coordmedian")
    trimmed = merge_states(states, weights, "trimmedmean", options=MergeOptions(trim_ratio=0.25))
    for name in ("a", "h"):
        values = stacked(states, name)
        expected = np.average(values, axis=0, weights=weights).astype(states[0][name].dtype)
        np.testing.assert_allclose(mean[name], expected, atol=1e-6 if name == "a" else 4e-3)
        np.testing.assert_array_equal(median[name], sorted_lower_median(values, weights))
        middle = np.sort(values, axis=0)[1:3].mean(axis=0).astype(states[0][name].dtype)
        np.testing.assert_allclose(trimmed[name], middle, atol=1e-6 if name == "a" else 4e-3)


# ------------------------------------------------------------------------------- validation


def two_states() -> list[State]:
    return [
        {"a": np.zeros((2, 3), dtype=np.float32), "b": np.zeros(4, dtype=np.int64)},
        {"a": np.ones((2, 3), dtype=np.float32), "b": np.ones(4, dtype=np.int64)},
    ]


def broken(change: str) -> tuple[list[State], list[float], str, dict[str, Any]]:
    states, weights, method, kwargs = two_states(), [1.0, 1.0], "mean", {}
    if change == "missing":
        del states[1]["b"]
        states[1]["c"] = np.zeros(1)
    elif change == "shape":
        states[1]["a"] = np.zeros((3, 2), dtype=np.float32)
    elif change == "dtype":
        states[1]["a"] = np.zeros((2, 3), dtype=np.float64)
    elif change == "nan":
        states[1]["a"][1, 2] = np.nan
    elif change == "inf":
        states[0]["a"][0, 0] = -np.inf
    elif change == "negative":
        weights = [1.0, -0.5]
    elif change == "zero":
        weights = [0.0, 0.0]
    elif change == "count":
        weights = [1.0, 1.0, 1.0]
    elif change == "method":
        method = "median"
    elif change == "krum":
        method = "krum"
    elif change == "label":
        kwargs = {"dtypes": {"a": "bfloat16"}}
    elif change == "unsupported":
        states = [{"a": np.zeros(2, dtype=np.complex64)} for _ in range(2)]
    return states, weights, method, kwargs


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("missing", r"peer 1 has different tensors than peer 0: missing \['b'\], extra \['c'\]"),
        ("shape", r"tensor 'a': peer 1 has shape \(3, 2\), expected \(2, 3\) as peer 0"),
        ("dtype", r"tensor 'a': peer 1 has dtype float64, expected float32 as peer 0"),
        ("nan", r"tensor 'a' of peer 1 has 1 non-finite values \(NaN or inf\)"),
        ("inf", r"tensor 'a' of peer 0 has 1 non-finite values"),
        ("negative", r"weight of peer 1 is -0.5; weights must be finite and >= 0"),
        ("zero", r"all weights are zero; give at least one peer a positive weight"),
        ("count", r"got 3 weights for 2 peers; give one weight per peer"),
        ("method", r"unknown merge method 'median'; valid methods: mean, coordmedian, geomedian"),
        (
            "krum",
            r"krum_byzantine=0 needs at least 3 peers with a positive weight \(n >= f \+ 3\), got 2",
        ),
        ("label", r"tensor 'a' is labelled bfloat16 but stored as float32; bfloat16 is stored as uint16"),
        ("unsupported", r"tensor 'a': unsupported dtype 'complex64'; supported: float16, bfloat16"),
    ],
)
def test_validation_errors_say_what_is_wrong(change: str, message: str) -> None:
    states, weights, method, kwargs = broken(change)
    with pytest.raises(MergeError, match=message):
        validate_inputs(states, weights, method, **kwargs)
    with pytest.raises(MergeError, match=message):
        merge_states(states, weights, method, **kwargs)


def test_no_peers() -> None:
    with pytest.raises(MergeError, match="nothing to merge: no peers given"):
        merge_states([], [], "mean")


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        (
            [("a", "float32", (4,), 0, 16), ("b", "float32", (4,), 8, 16)],
            r"tensors 'a' \(bytes 0..16\) and 'b' \(bytes 8..24\) overlap",
        ),
        ([("a", "float32", (40,), 0, 160)], r"tensor 'a': bytes 0..160 lie outside the buffer of 128 bytes"),
        ([("a", "float32", (4,), 0, 12)], r"tensor 'a': nbytes is 12, shape \(4,\) of float32 needs 16"),
        ([("a", "complex", (4,), 0, 16)], r"tensor 'a': unknown dtype 'complex'; supported: float16"),
        ([("a", "float32", (4,), 0, 16), ("a", "float32", (4,), 64, 16)], r"tensor 'a' appears twice"),
        (
            [("a", "float32")],
            r"layout entry \('a', 'float32'\) is not \(name, dtype, shape, offset, nbytes\)",
        ),
    ],
)
def test_flat_layout_errors(layout: list[Any], message: str) -> None:
    rows = np.zeros((2, 128), dtype=np.uint8)
    with pytest.raises(MergeError, match=message):
        merge_flat(rows, layout, [1, 1], "mean")
    with pytest.raises(MergeError, match=message):
        validate_flat(rows, layout, [1, 1], "mean")


def test_a_layout_merged_before_is_still_checked_against_each_buffer() -> None:
    """The checked plan of a layout is kept for the next merges (``_layout_plan``): it still has to fit
    every buffer, and a layout whose shapes are lists (not hashable) is checked and merged the same."""
    layout = [("a", "float32", (4,), 0, 16), ("b", "int64", (2,), 64, 16)]
    rows = np.zeros((2, 128), dtype=np.uint8)
    rows[0, :16] = np.arange(4, dtype=np.float32).view(np.uint8)
    rows[1, 64:80] = np.array([4, 8], dtype=np.int64).view(np.uint8)
    first = merge_flat(rows, layout, [1, 1], "mean")
    assert merge_flat(rows, layout, [1, 1], "mean").tobytes() == first.tobytes()
    as_lists: list[Any] = [
        (name, label, list(shape), offset, nbytes) for name, label, shape, offset, nbytes in layout
    ]
    assert merge_flat(rows, as_lists, [1, 1], "mean").tobytes() == first.tobytes()
    with pytest.raises(MergeError, match=r"tensor 'b': bytes 64\.\.80 lie outside the buffer of 72 bytes"):
        merge_flat(np.zeros((2, 72), dtype=np.uint8), layout, [1, 1], "mean")
    assert find_non_finite(first, layout) is None
    with pytest.raises(MergeError, match=r"tensor 'b': bytes 64\.\.80 lie outside the buffer of 72 bytes"):
        find_non_finite(np.zeros(72, dtype=np.uint8), as_lists)


def test_flat_rows_and_out_errors() -> None:
    layout = [("a", "float32", (4,), 0, 16)]
    with pytest.raises(MergeError, match="rows must be a 2-D uint8 array with one peer per row"):
        merge_flat(np.zeros((2, 64), dtype=np.float32), layout, [1, 1], "mean")
    rows = np.zeros((2, 64), dtype=np.uint8)
    with pytest.raises(MergeError, match="out must be a contiguous uint8 array of 64 bytes"):
        merge_flat(rows, layout, [1, 1], "mean", out=np.zeros(32, dtype=np.uint8))
    with pytest.raises(MergeError, match="must not share memory with rows"):
        merge_flat(rows, layout, [1, 1], "mean", out=rows[0])
    a, b = np.zeros(64, dtype=np.uint8), np.zeros(64, dtype=np.uint8)
    with pytest.raises(MergeError, match="must not share memory with rows"):
        merge_flat([a, b], layout, [1, 1], "mean", out=b)
    with pytest.raises(MergeError, match="row 1 has 128 bytes, row 0 has 64"):
        merge_flat([a, np.zeros(128, dtype=np.uint8)], layout, [1, 1], "mean")
    with pytest.raises(MergeError, match="row 1 must be a 1-D uint8 array, got float32 array of shape"):
        merge_flat([a, np.zeros(16, dtype=np.float32)], layout, [1, 1], "mean")
    with pytest.raises(MergeError, match="row 0 must be contiguous"):
        merge_flat([np.zeros(128, dtype=np.uint8)[::2], a], layout, [1, 1], "mean")
    with pytest.raises(MergeError, match="rows must be a 2-D uint8 array or a list of 1-D uint8 buffers"):
        merge_flat([], layout, [], "mean")


@pytest.mark.parametrize("weights", [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
def test_flat_mean_reports_non_finite_peer(weights: list[float]) -> None:
    states = [{"x": np.ones(10, dtype=np.float32), "y": np.ones(3, dtype=np.float16)} for _ in range(3)]
    states[2]["y"] = states[2]["y"].copy()
    states[2]["y"][1] = np.inf
    rows, layout = pack(states)  # 0xFF padding decodes as NaN and must not matter
    with pytest.raises(MergeError, match=r"tensor 'y' of peer 2 has 1 non-finite values"):
        merge_flat(rows, layout, weights, "mean")
    with pytest.raises(MergeError, match=r"tensor 'y' of peer 2 has 1 non-finite values"):
        validate_flat(rows, layout, weights, "mean")
    bf16 = [
        {"z": np.array([0x3F80, 0x7FC0], dtype=np.uint16)},
        {"z": np.array([0x3F80] * 2, dtype=np.uint16)},
    ]
    with pytest.raises(MergeError, match=r"tensor 'z' of peer 0 has 1 non-finite values"):
        merge_states(bf16, [1, 1], "coordmedian", dtypes={"z": "bfloat16"})


def test_options_are_checked() -> None:
    with pytest.raises(MergeError, match=r"trim_ratio must be in \[0, 0.5\), got 0.5"):
        MergeOptions(trim_ratio=0.5)
    with pytest.raises(MergeError, match="krum_byzantine must be >= 0"):
        MergeOptions(krum_byzantine=-1)
    with pytest.raises(MergeError, match="geomedian_max_iter must be >= 1"):
        MergeOptions(geomedian_max_iter=0)
    with pytest.raises(MergeError, match="geomedian_eps must be > 0"):
        MergeOptions(geomedian_eps=0.0)


# ------------------------------------------------------------------------------- properties

finite32 = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32)


@st.composite
def peers_and_weights(draw: st.DrawFn) -> tuple[list[State], list[float]]:
    n = draw(st.integers(1, 7))
    size = draw(st.integers(1, 12))
    arrays = draw(st.lists(hnp.arrays(np.float32, size, elements=finite32), min_size=n, max_size=n))
    weights = draw(st.lists(st.floats(0.1, 10.0), min_size=n, max_size=n))
    return [{"x": a} for a in arrays], weights


@settings(max_examples=60, deadline=None)
@given(data=peers_and_weights(), copies=st.integers(1, 6))
def test_mean_of_identical_inputs_is_the_input(data: tuple[list[State], list[float]], copies: int) -> None:
    states, weights = data
    merged = merge_states([states[0]] * copies, weights[:1] * copies, "mean")["x"]
    np.testing.assert_allclose(merged, states[0]["x"], rtol=4e-7, atol=1e-30)


@settings(max_examples=60, deadline=None)
@given(data=peers_and_weights(), method=st.sampled_from(MERGE_METHODS), seed=st.integers(0, 2**16))
def test_results_are_permutation_invariant(
    data: tuple[list[State], list[float]], method: str, seed: int
) -> None:
    states, weights = data
    if method == "krum" and len(states) == 2:
        states, weights = [*states, states[0]], [*weights, weights[0]]
    order = np.random.default_rng(seed).permutation(len(states))
    first = merge_states(states, weights, method)["x"]
    second = merge_states([states[i] for i in order], [weights[i] for i in order], method)["x"]
    if method == "krum":  # ties may pick another peer, but always one with the least score
        vectors = flat_vectors(states)
        scores = krum_scores(vectors, max(0, (len(states) - 3) // 2))
        picked = [i for i, v in enumerate(vectors) if np.array_equal(v, second.astype(np.float64))]
        slack = 1e-9 * (float(np.sum(vectors**2)) + 1.0)
        assert any(scores[i] <= min(scores) + slack for i in picked)
        return
    scale = float(np.max(np.abs(flat_vectors(states)))) + 1.0  # float32 sums: error ~ n eps max|x|
    atol = (1e-4 if method == "geomedian" else 1e-6 * len(states)) * scale
    np.testing.assert_allclose(first, second, rtol=1e-5, atol=atol)
