"""The messages of secure aggregation as msgpack-able maps, and back with bounded, named checks.

``Advert``: ``{"uid", "c_pk", "s_pk"}`` (32-byte keys). ``SealedShare``: ``{"sender", "recipient",
"sealed"}``. ``Reveal``: ``{"sender", "s": {uid: [x, y]}, "b": {uid: [x, y]}}`` with ``y`` as 66 bytes.
Anything else is a :class:`SecAggError` that says which field of which message is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from daemons.sl.privacy import shamir
from daemons.sl.privacy.secagg import Advert, Reveal, SealedShare, SecAggError

__all__ = [
    "MAX_PEERS",
    "advert_from_wire",
    "advert_to_wire",
    "reveal_from_wire",
    "reveal_to_wire",
    "sealed_from_wire",
    "sealed_to_wire",
]

MAX_PEERS = 1024
_KEY = 32
_Y_BYTES = 66
_SEALED_BYTES = 12 + 2 + 2 * _Y_BYTES + 16  # nonce + (x, y_s, y_b) + tag
_MAX_UID = 256


def _map(raw: Any, what: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise SecAggError(f"{what} must be a map, got {type(raw).__name__}")
    missing = [k for k in keys if k not in raw]
    if missing:
        raise SecAggError(f"{what} lacks {', '.join(missing)}")
    return raw


def _uid(raw: Any, what: str) -> str:
    if not isinstance(raw, str) or not 0 < len(raw) <= _MAX_UID:
        raise SecAggError(f"{what} must be a node uid (a non-empty string), got {raw!r:.80}")
    return raw


def _bytes(raw: Any, size: int, what: str) -> bytes:
    if not isinstance(raw, bytes) or len(raw) != size:
        got = f"{len(raw)} bytes" if isinstance(raw, bytes) else type(raw).__name__
        raise SecAggError(f"{what} must be {size} bytes, got {got}")
    return raw


def advert_to_wire(advert: Advert) -> dict[str, Any]:
    """An advert as a map."""
    return {"uid": advert.uid, "c_pk": advert.c_pk, "s_pk": advert.s_pk}


def advert_from_wire(raw: Any, what: str = "advert") -> Advert:
    """An advert from a map, checked."""
    m = _map(raw, what, ("uid", "c_pk", "s_pk"))
    uid = _uid(m["uid"], f"{what}.uid")
    return Advert(uid, _bytes(m["c_pk"], _KEY, f"{what}.c_pk"), _bytes(m["s_pk"], _KEY, f"{what}.s_pk"))


def sealed_to_wire(item: SealedShare) -> dict[str, Any]:
    """A sealed share as a map."""
    return {"sender": item.sender, "recipient": item.recipient, "sealed": item.sealed}


def sealed_from_wire(raw: Any, what: str = "sealed share") -> SealedShare:
    """A sealed share from a map, checked."""
    m = _map(raw, what, ("sender", "recipient", "sealed"))
    return SealedShare(
        _uid(m["sender"], f"{what}.sender"),
        _uid(m["recipient"], f"{what}.recipient"),
        _bytes(m["sealed"], _SEALED_BYTES, f"{what}.sealed"),
    )


def _shares_to_wire(shares: Mapping[str, shamir.Share]) -> dict[str, list[Any]]:
    return {uid: [s.x, s.y.to_bytes(_Y_BYTES, "big")] for uid, s in shares.items()}


def _shares_from_wire(raw: Any, what: str) -> dict[str, shamir.Share]:
    if not isinstance(raw, Mapping) or len(raw) > MAX_PEERS:
        raise SecAggError(f"{what} must be a map of at most {MAX_PEERS} shares")
    out = {}
    for uid, item in raw.items():
        where = f"{what}[{uid!r:.40}]"
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise SecAggError(f"{where} must be [x, y]")
        x = item[0]
        if isinstance(x, bool) or not isinstance(x, int) or not 0 < x <= MAX_PEERS:
            raise SecAggError(f"{where}: x must be an integer in 1..{MAX_PEERS}, got {x!r:.40}")
        out[_uid(uid, where)] = shamir.Share(
            x, int.from_bytes(_bytes(item[1], _Y_BYTES, f"{where}.y"), "big")
        )
    return out


def reveal_to_wire(reveal: Reveal) -> dict[str, Any]:
    """A survivor's reveal as a map."""
    return {
        "sender": reveal.sender,
        "s": _shares_to_wire(reveal.s_shares),
        "b": _shares_to_wire(reveal.b_shares),
    }


def reveal_from_wire(raw: Any, what: str = "reveal") -> Reveal:
    """A reveal from a map, checked."""
    m = _map(raw, what, ("sender", "s", "b"))
    return Reveal(
        _uid(m["sender"], f"{what}.sender"),
        _shares_from_wire(m["s"], f"{what}.s"),
        _shares_from_wire(m["b"], f"{what}.b"),
    )
