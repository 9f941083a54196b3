"""The weighted mean merge under secure aggregation, on flat models: what a participant sends and
how the leader turns the unmasked sum back into a model.

Every participant encodes ``share_i * x_i`` in fixed point, where ``share_i = w_i / sum_j w_j`` over the
round's group (the weights are public: they are in the round's check-ins on the ledger), and masks
it (:mod:`daemons.sl.privacy.secagg`). The leader unmasks the sum of the rows that arrived and
divides it by the survivors' total share, so a dropout still gives the weighted mean of the rest.
Every tensor takes part, integer ones too; they are rounded back as the plain mean does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from daemons.sl.privacy import fixedpoint, values
from daemons.sl.privacy.secagg import Advert, Aggregator, Peer, Reveal, SecAggError, Words
from wire.tensors import FlatState

__all__ = [
    "decode_mean",
    "encode_model",
    "masked_model",
    "new_peer",
    "session_id",
    "shares",
    "threshold_for",
    "unmask_mean",
]


def session_id(contract: str, number: int, leader: str = "") -> bytes:
    """What binds a round's keys and masks to it: the contract, the round number and its leader."""
    return f"{contract}\x00{number}\x00{leader}".encode()


def threshold_for(peers: int) -> int:
    """Shares needed to unmask: a strict majority of the group, at least 2."""
    if peers < 2:
        raise SecAggError(f"secure aggregation needs at least 2 peers in a round, got {peers}")
    return max(2, peers // 2 + 1)


def new_peer(uid: str, contract: str, number: int, peers: int, leader: str = "") -> Peer:
    """A participant's fresh secure-aggregation state for round ``number`` of ``contract``."""
    return Peer(uid, session_id(contract, number, leader), threshold_for(peers))


def shares(weights: Mapping[str, float]) -> dict[str, float]:
    """Each peer's share of the total weight (equal shares when every weight is 0)."""
    if any(not w >= 0 for w in weights.values()):
        raise SecAggError(f"weights must be >= 0, got {dict(weights)}")
    total = sum(weights.values())
    if total <= 0:
        return {uid: 1.0 / len(weights) for uid in weights}
    return {uid: w / total for uid, w in weights.items()}


def encode_model(flat: FlatState, share: float) -> Words:
    """``share`` times every value of the model, concatenated in layout order, as fixed-point words."""
    parts = [
        fixedpoint.encode(values.read(flat, spec) * share, what=f"tensor {spec.name!r}")
        for spec in flat.specs
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


def masked_model(peer: Peer, flat: FlatState, weights: Mapping[str, float], group: Iterable[str]) -> Words:
    """Stage 3 for a model: its weighted fixed-point encoding, masked for ``group``."""
    members = set(group)
    share = shares({uid: weights[uid] for uid in members})[peer.uid]
    return peer.mask(encode_model(flat, share), members)


def unmask_mean(
    aggregator: Aggregator,
    adverts: Mapping[str, Advert],
    group: Iterable[str],
    masked: Mapping[str, Words],
    reveals: Sequence[Reveal],
    weights: Mapping[str, float],
    like: FlatState,
) -> FlatState:
    """The weighted mean of the survivors' models (those in ``masked``), laid out as ``like``."""
    members = set(group)
    total = aggregator.unmask(adverts, members, masked, reveals)
    return decode_mean(total, members, masked, weights, like)


def decode_mean(
    total: Words,
    group: Iterable[str],
    survivors: Iterable[str],
    weights: Mapping[str, float],
    like: FlatState,
) -> FlatState:
    """The unmasked sum of the survivors' weighted rows as their weighted mean, laid out as ``like``."""
    size = sum(int(np.prod(spec.shape, dtype=np.int64)) for spec in like.specs)
    if total.size != size:
        raise SecAggError(f"the masked rows hold {total.size} values, the model {size}")
    share = shares({uid: weights[uid] for uid in group})
    portion = sum(share[uid] for uid in survivors)
    mean = fixedpoint.decode(total) / portion
    out = FlatState(like.specs, np.zeros(like.total, dtype=np.uint8))
    start = 0
    for spec in like.specs:
        count = int(np.prod(spec.shape, dtype=np.int64))
        values.write(out, spec, mean[start : start + count])
        start += count
    return out
