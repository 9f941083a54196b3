"""Secure aggregation by pairwise and self masks with dropout recovery (Bonawitz et al., CCS 2017).

Each peer ``u`` of a round makes two X25519 key pairs (``c`` to encrypt its shares to the other
peers, ``s`` to agree on masks) and a self-mask seed ``b``. The four stages:

1. advertise: ``u`` publishes its two public keys (the bus signs them with the node identity).
2. share keys: ``u`` splits ``s_sk`` and ``b`` into t-of-n Shamir shares, one per peer, each sealed
   with ChaCha20-Poly1305 under a key only that peer can derive; the aggregator routes them.
3. masked input: ``u`` sends ``y_u = x_u + PRG(b_u) + sum_{v > u} PRG(s_uv) - sum_{v < u} PRG(s_uv)``
   over Z / 2**64; the pairwise terms cancel in the sum over all peers.
4. unmask: for every peer that dropped after stage 2, the survivors reveal shares of its ``s_sk`` (the
   aggregator recomputes and removes its pairwise masks); for every survivor, shares of its ``b`` (the
   aggregator removes its self-mask). A peer never reveals both for the same peer, so a late masked
   row of a peer declared dropped still hides its input behind ``PRG(b)``.

The PRG is ChaCha20 keyed by HKDF-SHA256 of the X25519 secret, bound to the round's session id and the
pair. Every stage refuses input that does not fit (too few peers, unknown senders, a peer named both
dropped and surviving) with a :class:`SecAggError` that says what and who.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from daemons.sl.privacy import shamir

__all__ = [
    "Advert",
    "Aggregator",
    "Peer",
    "Reveal",
    "SealedShare",
    "SecAggError",
    "add_mask",
]

_KEY = 32
_NONCE = 12
_Y_BYTES = 66  # a field element of GF(2**521 - 1)
_CHUNK_WORDS = 1 << 18  # mask words generated per step (2 MiB): stays in cache, bounded memory
Words = npt.NDArray[np.uint64]


class SecAggError(ValueError):
    """A stage of secure aggregation that cannot go on; the message names the peer and the reason."""


@dataclass(frozen=True, slots=True)
class Advert:
    """Stage 1: a peer's public keys (raw 32-byte X25519)."""

    uid: str
    c_pk: bytes
    s_pk: bytes


@dataclass(frozen=True, slots=True)
class SealedShare:
    """Stage 2: the shares of ``sender``'s secrets meant for ``recipient``, sealed for it."""

    sender: str
    recipient: str
    sealed: bytes  # nonce + ChaCha20-Poly1305 ciphertext


@dataclass(frozen=True, slots=True)
class Reveal:
    """Stage 4: a survivor's shares of the dropped peers' ``s_sk`` and of the survivors' ``b``."""

    sender: str
    s_shares: Mapping[str, shamir.Share]
    b_shares: Mapping[str, shamir.Share]


# ------------------------------------------------------------------------- primitives
def _raw(key: X25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _derive(secret: bytes, session: bytes, label: str, a: str, b: str) -> bytes:
    """A 32-byte key for the pair (a, b), bound to the session and its purpose."""
    first, second = sorted((a, b))
    info = b"\x00".join([b"swarm-secagg-v1", label.encode(), session, first.encode(), second.encode()])
    return HKDF(algorithm=hashes.SHA256(), length=_KEY, salt=None, info=info).derive(secret)


def _agree(own: X25519PrivateKey, theirs: bytes, who: str) -> bytes:
    try:
        return own.exchange(X25519PublicKey.from_public_bytes(theirs))
    except ValueError as exc:
        raise SecAggError(f"the public key of {who!r} is unusable: {exc}") from None


def add_mask(target: Words, key: bytes, *, subtract: bool = False) -> None:
    """Add (or subtract) the ChaCha20 stream of ``key`` to ``target`` in place, mod 2**64."""
    encryptor = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    zeros = bytes(min(target.size, _CHUNK_WORDS) * 8)
    op = np.subtract if subtract else np.add
    for start in range(0, target.size, _CHUNK_WORDS):
        part = target[start : start + _CHUNK_WORDS]
        stream = np.frombuffer(encryptor.update(zeros[: part.size * 8]), dtype=np.uint64)
        op(part, stream, out=part)


def _pair_sign(me: str, other: str) -> bool:
    """Whether ``me`` subtracts the pair's mask (the larger uid does, the smaller adds it)."""
    return me > other


def _pack_shares(s_share: shamir.Share, b_share: shamir.Share) -> bytes:
    if s_share.x != b_share.x:
        raise SecAggError("internal: the two shares for one peer must have the same x")
    return (
        s_share.x.to_bytes(2, "big")
        + s_share.y.to_bytes(_Y_BYTES, "big")
        + b_share.y.to_bytes(_Y_BYTES, "big")
    )


def _unpack_shares(data: bytes, who: str) -> tuple[shamir.Share, shamir.Share]:
    if len(data) != 2 + 2 * _Y_BYTES:
        raise SecAggError(f"the sealed share from {who!r} has {len(data)} bytes, expected {2 + 2 * _Y_BYTES}")
    x = int.from_bytes(data[:2], "big")
    s_y = int.from_bytes(data[2 : 2 + _Y_BYTES], "big")
    b_y = int.from_bytes(data[2 + _Y_BYTES :], "big")
    return shamir.Share(x, s_y), shamir.Share(x, b_y)


def _check_threshold(threshold: int) -> None:
    if threshold < 2:
        raise SecAggError(f"the threshold must be at least 2, got {threshold}")


# ------------------------------------------------------------------------------ peer
class Peer:
    """One participant's side of one secure-aggregation round."""

    def __init__(self, uid: str, session: bytes, threshold: int) -> None:
        _check_threshold(threshold)
        self.uid = uid
        self.session = session
        self.threshold = threshold
        self._c_sk = X25519PrivateKey.generate()
        self._s_sk = X25519PrivateKey.generate()
        self._b = os.urandom(_KEY)
        self._adverts: dict[str, Advert] = {}
        self._s_from: dict[str, shamir.Share] = {}  # shares of others' s_sk held here
        self._b_from: dict[str, shamir.Share] = {}  # shares of others' b held here
        self._masked_for: frozenset[str] | None = None
        self._revealed = False

    @property
    def masked(self) -> bool:
        """Whether this peer has sent its masked input (its keys must not be replaced after that)."""
        return self._masked_for is not None

    # stage 1
    def advertise(self) -> Advert:
        """This peer's public keys."""
        return Advert(self.uid, _raw(self._c_sk.public_key()), _raw(self._s_sk.public_key()))

    # stage 2
    def share_keys(self, adverts: Iterable[Advert]) -> list[SealedShare]:
        """Shares of ``s_sk`` and ``b`` for every advertised peer (this one included), sealed."""
        book = {a.uid: a for a in adverts}
        if self.uid not in book or book[self.uid] != self.advertise():
            raise SecAggError(f"the adverts of this round do not hold {self.uid!r}'s own keys")
        if len(book) < self.threshold:
            raise SecAggError(f"{len(book)} peer(s) advertised keys, the threshold is {self.threshold}")
        if len({a.c_pk for a in book.values()} | {a.s_pk for a in book.values()}) != 2 * len(book):
            raise SecAggError("two advertised keys are the same; every peer needs its own fresh keys")
        self._adverts = book
        order = sorted(book)
        s_raw = self._s_sk.private_bytes_raw()
        s_shares = shamir.split(s_raw, self.threshold, len(order))
        b_shares = shamir.split(self._b, self.threshold, len(order))
        sealed = []
        for uid, s_share, b_share in zip(order, s_shares, b_shares, strict=True):
            key = self._share_key(uid)
            nonce = os.urandom(_NONCE)
            box = ChaCha20Poly1305(key).encrypt(
                nonce, _pack_shares(s_share, b_share), self._ad(self.uid, uid)
            )
            sealed.append(SealedShare(self.uid, uid, nonce + box))
        return sealed

    def receive_shares(self, sealed: Iterable[SealedShare]) -> None:
        """Open the shares others sealed for this peer; the senders are the peers that may mask."""
        for item in sealed:
            if item.recipient != self.uid:
                raise SecAggError(
                    f"a share from {item.sender!r} is meant for {item.recipient!r}, not {self.uid!r}"
                )
            if item.sender not in self._adverts:
                raise SecAggError(f"a share comes from {item.sender!r}, which advertised no keys")
            key = self._share_key(item.sender)
            nonce, box = item.sealed[:_NONCE], item.sealed[_NONCE:]
            try:
                plain = ChaCha20Poly1305(key).decrypt(nonce, box, self._ad(item.sender, self.uid))
            except InvalidTag:
                raise SecAggError(
                    f"the share from {item.sender!r} does not open (tampered or misrouted)"
                ) from None
            s_share, b_share = _unpack_shares(plain, item.sender)
            self._s_from[item.sender] = s_share
            self._b_from[item.sender] = b_share

    # stage 3
    def mask(self, values: Words, peers: Iterable[str]) -> Words:
        """``values`` (fixed-point words) masked for the peers that shared keys (``peers``, with us)."""
        group = frozenset(peers)
        if self.uid not in group:
            raise SecAggError(f"{self.uid!r} masks only for a group it belongs to")
        missing = sorted(group - set(self._s_from))
        if missing:
            raise SecAggError(
                f"no shares were received from {', '.join(missing)}; they cannot be in the group"
            )
        if len(group) < self.threshold:
            raise SecAggError(f"{len(group)} peer(s) shared keys, the threshold is {self.threshold}")
        masked = np.array(values, dtype=np.uint64, copy=True)
        add_mask(masked, _derive(self._b, self.session, "self", self.uid, self.uid))
        for other in sorted(group - {self.uid}):
            secret = _agree(self._s_sk, self._adverts[other].s_pk, other)
            key = _derive(secret, self.session, "pair", self.uid, other)
            add_mask(masked, key, subtract=_pair_sign(self.uid, other))
        self._masked_for = group
        return masked

    # stage 4
    def reveal(self, survivors: Iterable[str]) -> Reveal:
        """Shares of the dropped peers' ``s_sk`` and of the survivors' ``b``; once per round."""
        alive = frozenset(survivors)
        if self._masked_for is None:
            raise SecAggError(f"{self.uid!r} reveals nothing before it has sent its masked input")
        if self._revealed:
            raise SecAggError(f"{self.uid!r} has revealed its shares for this round already")
        if self.uid not in alive:
            raise SecAggError(f"{self.uid!r} is not among the survivors it is asked to help")
        if not alive <= self._masked_for:
            raise SecAggError(f"survivors {sorted(alive - self._masked_for)} never shared keys")
        if len(alive) < self.threshold:
            raise SecAggError(
                f"{len(alive)} survivor(s) left, the threshold is {self.threshold}: refusing to reveal"
            )
        dropped = self._masked_for - alive
        self._revealed = True
        return Reveal(
            self.uid,
            {uid: self._s_from[uid] for uid in sorted(dropped)},
            {uid: self._b_from[uid] for uid in sorted(alive)},
        )

    # helpers
    def _share_key(self, other: str) -> bytes:
        secret = _agree(self._c_sk, self._adverts[other].c_pk, other)
        return _derive(secret, self.session, "share", self.uid, other)

    def _ad(self, sender: str, recipient: str) -> bytes:
        return b"\x00".join([self.session, sender.encode(), recipient.encode()])


# ------------------------------------------------------------------------ aggregator
class Aggregator:
    """The leader's side: sums masked rows and removes what is left of the masks."""

    def __init__(self, session: bytes, threshold: int) -> None:
        _check_threshold(threshold)
        self.session = session
        self.threshold = threshold

    @staticmethod
    def route(sealed: Iterable[SealedShare]) -> dict[str, list[SealedShare]]:
        """Stage 2's shares by recipient (the aggregator cannot open them)."""
        inbox: dict[str, list[SealedShare]] = {}
        for item in sealed:
            inbox.setdefault(item.recipient, []).append(item)
        return inbox

    def unmask(
        self,
        adverts: Mapping[str, Advert],
        group: Iterable[str],
        masked: Mapping[str, Words],
        reveals: Sequence[Reveal],
    ) -> Words:
        """The sum of the survivors' inputs (fixed-point words), exact mod 2**64.

        ``group``: the peers that shared keys (they masked for each other); ``masked``: the masked
        rows that arrived, by peer; ``reveals``: at least ``threshold`` survivors' shares.
        """
        members = frozenset(group)
        alive = frozenset(masked)
        if not alive <= members:
            raise SecAggError(f"masked rows came from {sorted(alive - members)}, which are not in the group")
        if len(alive) < self.threshold:
            raise SecAggError(f"{len(alive)} masked row(s) arrived, the threshold is {self.threshold}")
        helpers = [r for r in reveals if r.sender in alive]
        if len({r.sender for r in helpers}) < self.threshold:
            raise SecAggError(f"{len(helpers)} survivor(s) revealed shares, {self.threshold} needed")
        sizes = {row.size for row in masked.values()}
        if len(sizes) != 1:
            raise SecAggError(f"the masked rows differ in length: {sorted(sizes)}")
        total = np.zeros(sizes.pop(), dtype=np.uint64)
        for uid in sorted(alive):
            np.add(total, masked[uid], out=total)
        for uid in sorted(alive):
            b = shamir.combine([r.b_shares[uid] for r in helpers if uid in r.b_shares], self.threshold, _KEY)
            add_mask(total, _derive(b, self.session, "self", uid, uid), subtract=True)
        for gone in sorted(members - alive):
            raw = shamir.combine(
                [r.s_shares[gone] for r in helpers if gone in r.s_shares], self.threshold, _KEY
            )
            if _raw(X25519PrivateKey.from_private_bytes(raw).public_key()) != adverts[gone].s_pk:
                raise SecAggError(f"the shares of {gone!r}'s key do not give back its advertised key")
            s_sk = X25519PrivateKey.from_private_bytes(raw)
            for uid in sorted(alive):
                key = _derive(_agree(s_sk, adverts[uid].s_pk, uid), self.session, "pair", gone, uid)
                # survivor uid applied the pair mask with its own sign; undo exactly that
                add_mask(total, key, subtract=not _pair_sign(uid, gone))
        return total
