"""Secure aggregation: Shamir shares, pairwise and self masks, dropouts, and the mean of a real model."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import numpy as np
import pytest
import torch

from daemons.sl.merge import merge_flat
from daemons.sl.privacy import fixedpoint, shamir
from daemons.sl.privacy.secagg import Advert, Aggregator, Peer, Reveal, SecAggError, Words
from daemons.sl.privacy.secure_mean import decode_mean, encode_model, masked_model, new_peer, shares
from wire.tensors import FlatState

SESSION = b"contract\x001"
UIDS = ("sl-a", "sl-b", "sl-c", "sl-d")


# ------------------------------------------------------------------------------ shamir
def test_any_threshold_shares_give_the_secret_back_and_fewer_do_not() -> None:
    secret = os.urandom(32)
    parts = shamir.split(secret, 3, 5)
    assert shamir.combine(parts[:3], 3, 32) == secret
    assert shamir.combine([parts[4], parts[1], parts[2]], 3, 32) == secret
    assert shamir.combine(parts, 3, 32) == secret
    with pytest.raises(shamir.ShamirError, match="2 share"):
        shamir.combine(parts[:2], 3, 32)
    with pytest.raises(shamir.ShamirError, match="same x"):
        shamir.combine([parts[0], parts[0], parts[1]], 3, 32)


def test_two_shares_of_a_2_of_n_secret_say_nothing_alone() -> None:
    """One share of a 2-of-n sharing is uniform: the same share value fits any secret."""
    one = shamir.split(b"\x01" * 32, 2, 3)[0]
    other = shamir.split(b"\x02" * 32, 2, 3)[0]
    assert one.x == other.x and one.y != other.y  # fresh random slopes
    with pytest.raises(shamir.ShamirError, match="threshold"):
        shamir.split(b"x", 4, 3)


# ------------------------------------------------------------------------- a round
def _setup(uids: Iterable[str], threshold: int) -> tuple[dict[str, Peer], dict[str, Advert]]:
    peers = {uid: Peer(uid, SESSION, threshold) for uid in uids}
    adverts = {uid: p.advertise() for uid, p in peers.items()}
    sealed = [s for p in peers.values() for s in p.share_keys(adverts.values())]
    for uid, inbox in Aggregator.route(sealed).items():
        peers[uid].receive_shares(inbox)
    return peers, adverts


def _reveal(peers: Mapping[str, Peer], alive: Iterable[str]) -> list[Reveal]:
    survivors = sorted(alive)
    return [peers[uid].reveal(survivors) for uid in survivors]


def _rows(n: int, size: int, seed: int = 7) -> dict[str, Words]:
    rng = np.random.default_rng(seed)
    return {uid: fixedpoint.encode(rng.normal(0, 3, size)) for uid in UIDS[:n]}


def _plain_sum(rows: Iterable[Words]) -> Words:
    listed = list(rows)
    total = np.zeros_like(listed[0])
    for row in listed:
        total += row
    return total


def test_the_masked_sum_is_the_plain_fixed_point_sum_to_the_last_bit() -> None:
    rows = _rows(4, 10_001)
    peers, adverts = _setup(UIDS, 3)
    masked = {uid: peers[uid].mask(rows[uid], UIDS) for uid in UIDS}
    for uid in UIDS:  # a masked row looks nothing like its input
        assert np.count_nonzero(masked[uid] == rows[uid]) < 5
    total = Aggregator(SESSION, 3).unmask(adverts, UIDS, masked, _reveal(peers, UIDS))
    assert np.array_equal(total, _plain_sum(rows.values()))


def test_a_peer_that_drops_after_sharing_keys_has_its_masks_removed() -> None:
    rows = _rows(4, 5000)
    peers, adverts = _setup(UIDS, 3)
    alive = UIDS[:3]  # sl-d never sends its masked row
    masked = {uid: peers[uid].mask(rows[uid], UIDS) for uid in alive}
    reveals = _reveal(peers, alive)
    assert all(set(r.s_shares) == {"sl-d"} and set(r.b_shares) == set(alive) for r in reveals)
    total = Aggregator(SESSION, 3).unmask(adverts, UIDS, masked, reveals)
    assert np.array_equal(total, _plain_sum(rows[uid] for uid in alive))


def test_a_peer_that_drops_before_sharing_keys_is_simply_not_in_the_group() -> None:
    rows = _rows(4, 3000)
    peers = {uid: Peer(uid, SESSION, 3) for uid in UIDS}
    adverts = {uid: p.advertise() for uid, p in peers.items()}
    group = UIDS[:3]  # sl-d advertised keys, then vanished before sharing
    sealed = [s for uid in group for s in peers[uid].share_keys(adverts.values())]
    for uid, inbox in Aggregator.route(sealed).items():
        if uid in group:
            peers[uid].receive_shares(inbox)
    with pytest.raises(SecAggError, match="no shares were received from sl-d"):
        peers["sl-a"].mask(rows["sl-a"], UIDS)
    masked = {uid: peers[uid].mask(rows[uid], group) for uid in group}
    total = Aggregator(SESSION, 3).unmask(adverts, group, masked, _reveal(peers, group))
    assert np.array_equal(total, _plain_sum(rows[uid] for uid in group))


def test_a_late_row_of_a_dropped_peer_stays_hidden_behind_its_self_mask() -> None:
    """After the survivors revealed sl-d's pairwise key, its late row minus every pairwise mask is
    still its input plus the self-mask, whose seed no one revealed."""
    rows = _rows(4, 2000)
    peers, adverts = _setup(UIDS, 3)
    masked = {uid: peers[uid].mask(rows[uid], UIDS) for uid in UIDS}
    alive = UIDS[:3]
    reveals = _reveal(peers, alive)
    assert all("sl-d" not in r.b_shares for r in reveals)
    with pytest.raises(SecAggError, match="revealed its shares for this round already"):
        peers["sl-a"].reveal(UIDS)  # asked again, now with sl-d as a survivor: refused
    # the aggregator learns exactly the sum of the survivors, nothing of sl-d's late row
    total = Aggregator(SESSION, 3).unmask(adverts, UIDS, {u: masked[u] for u in alive}, reveals)
    assert np.array_equal(total, _plain_sum(rows[u] for u in alive))


def test_fewer_survivors_than_the_threshold_cannot_unmask() -> None:
    rows = _rows(4, 100)
    peers, adverts = _setup(UIDS, 3)
    masked = {uid: peers[uid].mask(rows[uid], UIDS) for uid in UIDS[:2]}
    with pytest.raises(SecAggError, match="threshold is 3: refusing"):
        peers["sl-a"].reveal(UIDS[:2])
    with pytest.raises(SecAggError, match="2 masked row"):
        Aggregator(SESSION, 3).unmask(adverts, UIDS, masked, [])


def test_two_reveals_are_not_enough_for_a_threshold_of_three() -> None:
    rows = _rows(4, 100)
    peers, adverts = _setup(UIDS, 3)
    masked = {uid: peers[uid].mask(rows[uid], UIDS) for uid in UIDS}
    reveals = _reveal(peers, UIDS)[:2]
    with pytest.raises(SecAggError, match="2 survivor"):
        Aggregator(SESSION, 3).unmask(adverts, UIDS, masked, reveals)


def test_a_share_meant_for_another_peer_or_tampered_with_is_refused() -> None:
    peers = {uid: Peer(uid, SESSION, 2) for uid in UIDS[:3]}
    adverts = [p.advertise() for p in peers.values()]
    sealed = peers["sl-a"].share_keys(adverts)
    for_b = next(s for s in sealed if s.recipient == "sl-b")
    peers["sl-b"].share_keys(adverts)
    peers["sl-c"].share_keys(adverts)
    with pytest.raises(SecAggError, match="meant for 'sl-b', not 'sl-c'"):
        peers["sl-c"].receive_shares([for_b])
    bad = type(for_b)(for_b.sender, for_b.recipient, for_b.sealed[:-1] + bytes([for_b.sealed[-1] ^ 1]))
    with pytest.raises(SecAggError, match="does not open"):
        peers["sl-b"].receive_shares([bad])


def test_shares_of_another_round_do_not_open() -> None:
    """Keys and shares are bound to the round's session: a replay from another round is refused."""
    here = {uid: Peer(uid, SESSION, 2) for uid in UIDS[:2]}
    there = Peer("sl-c", b"contract\x002", 2)
    adverts = [p.advertise() for p in (*here.values(), there)]
    for peer in here.values():
        peer.share_keys(adverts)
    sealed = [s for s in there.share_keys(adverts) if s.recipient == "sl-a"]
    with pytest.raises(SecAggError, match="from 'sl-c' does not open"):
        here["sl-a"].receive_shares(sealed)


# ------------------------------------------------------------------ a real model's mean
def _model_state(seed: int) -> FlatState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 26 * 26, 10),
    )
    model.train()
    model(torch.randn(8, 1, 28, 28))  # moves BatchNorm's running stats and its integer counter
    arrays = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    return FlatState.from_arrays(arrays)


def _secure_round(
    models: Mapping[str, FlatState], weights: Mapping[str, float], alive: Iterable[str]
) -> tuple[Words, FlatState]:
    """A whole round in process: the unmasked sum and the merged model."""
    group = sorted(models)
    peers = {uid: new_peer(uid, "mnist", 3, len(group)) for uid in group}
    adverts = {uid: p.advertise() for uid, p in peers.items()}
    sealed = [s for p in peers.values() for s in p.share_keys(adverts.values())]
    for uid, inbox in Aggregator.route(sealed).items():
        peers[uid].receive_shares(inbox)
    survivors = sorted(alive)
    masked = {uid: masked_model(peers[uid], models[uid], weights, group) for uid in survivors}
    reveals = [peers[uid].reveal(survivors) for uid in survivors]
    aggregator = Aggregator(peers[group[0]].session, peers[group[0]].threshold)
    total = aggregator.unmask(adverts, group, masked, reveals)
    return total, decode_mean(total, group, survivors, weights, models[group[0]])


def _plain_mean(models: Mapping[str, FlatState], weights: Mapping[str, float]) -> FlatState:
    like = next(iter(models.values()))
    layout = [(s.name, s.dtype, s.shape, s.offset, s.nbytes) for s in like.specs]
    rows = np.stack([m.buffer for m in models.values()])
    return FlatState(like.specs, merge_flat(rows, layout, [weights[u] for u in models], "mean"))


def test_the_secure_mean_of_a_torch_model_matches_the_plain_mean() -> None:
    models = {uid: _model_state(i) for i, uid in enumerate(UIDS)}
    weights = {"sl-a": 100.0, "sl-b": 300.0, "sl-c": 50.0, "sl-d": 550.0}
    total, merged = _secure_round(models, weights, UIDS)
    share = shares(weights)
    # to the last bit of the encoding: the unmasked sum is the sum of the encoded weighted rows
    assert np.array_equal(total, _plain_sum(encode_model(models[u], share[u]) for u in UIDS))
    plain = _plain_mean(models, weights)
    for spec in merged.specs:
        got, want = merged.view(spec), plain.view(spec)
        if spec.dtype == "float32":
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)  # merge_flat sums float32 in float32
        else:  # num_batches_tracked: the same integer
            assert np.array_equal(got, want), spec.name


def test_a_dropout_during_a_secure_round_gives_the_mean_of_the_others() -> None:
    models = {uid: _model_state(10 + i) for i, uid in enumerate(UIDS)}
    weights = {"sl-a": 1.0, "sl-b": 2.0, "sl-c": 3.0, "sl-d": 4.0}
    survivors = UIDS[:3]
    total, merged = _secure_round(models, weights, survivors)
    share = shares(weights)
    assert np.array_equal(total, _plain_sum(encode_model(models[u], share[u]) for u in survivors))
    plain = _plain_mean({u: models[u] for u in survivors}, weights)
    for spec in merged.specs:
        np.testing.assert_allclose(
            merged.view(spec), plain.view(spec), rtol=1e-5, atol=1e-7
        )  # merge_flat sums float32 in float32


def test_values_beyond_the_encoding_are_refused_by_name() -> None:
    with pytest.raises(fixedpoint.FixedPointError, match=r"w\[1\] = inf"):
        fixedpoint.encode(np.array([0.0, np.inf]), what="w")
    with pytest.raises(fixedpoint.FixedPointError, match="within"):
        fixedpoint.encode(np.array([1e7]))
    assert fixedpoint.decode(fixedpoint.encode(np.array([-1.5, 2**-40, 0.0]))).tolist() == [-1.5, 2**-40, 0.0]
