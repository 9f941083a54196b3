"""Envelopes: round trips, signatures, and garbage that only ever raises CodecError."""

from __future__ import annotations

import contextlib
import hashlib
import hmac

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wire import (
    CodecError,
    SignatureError,
    decode_envelope,
    encode_envelope,
    make_envelope,
)
from wire.limits import MAX_DEPTH, packb, unpackb


class HmacSigner:
    """A stand-in for certs.signing.Signer: the 'certificate' is the uid and role."""

    def __init__(self, uid: str, role: str, key: bytes = b"k") -> None:
        self._uid, self._role, self._key = uid, role, key

    @property
    def uid(self) -> str:
        return self._uid

    @property
    def role(self) -> str:
        return self._role

    @property
    def cert_der(self) -> bytes:
        return f"{self._uid}|{self._role}".encode()

    def sign(self, data: bytes) -> bytes:
        return hmac.new(self._key, data, hashlib.sha256).digest()


class HmacVerifier:
    def __init__(self, key: bytes = b"k") -> None:
        self._key = key

    def verify(self, data: bytes, signature: bytes, cert_der: bytes, claimed_uid: str) -> str:
        uid, role = cert_der.decode().split("|")
        if uid != claimed_uid:
            raise SignatureError(f"certificate is {uid!r}, message claims {claimed_uid!r}")
        if not hmac.compare_digest(hmac.new(self._key, data, hashlib.sha256).digest(), signature):
            raise SignatureError(f"signature by {uid!r} does not verify")
        return role


def test_round_trip_keeps_every_field() -> None:
    env = make_envelope(
        "req:ping",
        {"a": [1, 2.5, b"x", None]},
        sender="sl-1",
        role="sl",
        corr="c1",
        reply_to="sl-1",
    )
    back = decode_envelope(encode_envelope(env))
    assert back == env


def test_signed_envelope_verifies_and_tampering_is_caught() -> None:
    signer = HmacSigner("sl-1", "sl")
    wire = encode_envelope(make_envelope("tx:x", {"n": 1}, sender="sl-1", role="sl", signer=signer))
    assert decode_envelope(wire, verifier=HmacVerifier()).body == {"n": 1}
    raw = msgpack.unpackb(wire)
    raw["b"] = msgpack.packb({"n": 2})
    with pytest.raises(SignatureError, match="does not verify"):
        decode_envelope(msgpack.packb(raw), verifier=HmacVerifier())


def test_unsigned_envelope_is_refused_when_signatures_are_required() -> None:
    wire = encode_envelope(make_envelope("tx:x", {}, sender="sl-1", role="sl"))
    with pytest.raises(SignatureError, match="not signed"):
        decode_envelope(wire, verifier=HmacVerifier())


def test_sender_cannot_claim_another_identity() -> None:
    wire = encode_envelope(
        make_envelope("tx:x", {}, sender="sl-1", role="sl", signer=HmacSigner("sl-1", "sl"))
    )
    raw = msgpack.unpackb(wire)
    raw["s"] = "sl-2"
    with pytest.raises(SignatureError):
        decode_envelope(msgpack.packb(raw), verifier=HmacVerifier())


def test_role_must_match_certificate() -> None:
    signer = HmacSigner("sl-1", "sl")
    wire = encode_envelope(make_envelope("tx:x", {}, sender="sl-1", role="sl", signer=signer))
    raw = msgpack.unpackb(wire)
    raw["crt"] = b"sl-1|sn"
    with pytest.raises(SignatureError):
        decode_envelope(msgpack.packb(raw), verifier=HmacVerifier())


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.pop("k"), "field 'k' is missing"),
        (lambda r: r.update(v=2), "version 2"),
        (lambda r: r.update(s="a/b"), "not a valid uid"),
        (lambda r: r.update(r="root"), "role 'root'"),
        (lambda r: r.update(t="now"), "field 't'"),
        (lambda r: r.update(b=b"\xc1"), "body"),
        (lambda r: r.update(b=msgpack.packb([1])), "body must be a map"),
        (lambda r: r.update(extra=1), "unknown fields"),
    ],
)
def test_malformed_fields_are_named(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    raw = msgpack.unpackb(encode_envelope(make_envelope("k", {}, sender="sl-1", role="sl")))
    mutate(raw)
    with pytest.raises(CodecError, match=message):
        decode_envelope(msgpack.packb(raw))


def test_deep_nesting_and_ext_types_are_refused() -> None:
    deep: object = 1
    for _ in range(40):
        deep = [deep]
    with pytest.raises(CodecError, match="deeper"):
        decode_envelope(encode_envelope(make_envelope("k", {"d": deep}, sender="sl-1", role="sl")))
    raw = msgpack.unpackb(encode_envelope(make_envelope("k", {}, sender="sl-1", role="sl")))
    raw["b"] = msgpack.packb({"x": msgpack.ExtType(5, b"zz")})
    with pytest.raises(CodecError, match="extension"):
        decode_envelope(msgpack.packb(raw))


def test_plain_data_is_checked_to_exactly_the_depth_limit_and_msgpack_timestamps_are_refused() -> None:
    def nested(depth: int, inner: object) -> object:
        for _ in range(depth):
            inner = [inner]
        return inner

    assert unpackb(packb(nested(MAX_DEPTH, 1)), what="x") == nested(MAX_DEPTH, 1)
    assert unpackb(packb(nested(MAX_DEPTH, {})), what="x") == nested(MAX_DEPTH, {})
    for too_deep in (nested(MAX_DEPTH + 1, 1), nested(MAX_DEPTH, [{}]), nested(MAX_DEPTH, {"k": 2})):
        with pytest.raises(CodecError, match=f"x: nested deeper than {MAX_DEPTH} levels"):
            unpackb(packb(too_deep), what="x")
    plain = {"s": "a", "b": b"b", "i": -1, "f": 0.5, "t": True, "n": None, "l": [[], {}]}
    assert unpackb(packb(plain), what="x") == plain
    stamped = msgpack.packb({"when": [msgpack.Timestamp(1, 0)]})
    with pytest.raises(CodecError, match="x: value of type Timestamp is not allowed"):
        unpackb(stamped, what="x")


def test_oversize_message_is_refused_before_unpacking() -> None:
    with pytest.raises(CodecError, match="over the limit"):
        decode_envelope(b"\x00" * 100, max_bytes=10)


VALID = encode_envelope(
    make_envelope("tx:round.checkin", {"digest": b"d" * 32, "samples": 10}, sender="sl-1", role="sl")
)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_only_raise_codec_error(data: bytes) -> None:
    with contextlib.suppress(CodecError):
        decode_envelope(data)


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=len(VALID) - 1), st.integers(min_value=0, max_value=255))
def test_truncated_or_flipped_envelopes_only_raise_codec_error(cut: int, byte: int) -> None:
    for data in (VALID[:cut], VALID[:cut] + bytes([byte]) + VALID[cut + 1 :]):
        with contextlib.suppress(CodecError):
            decode_envelope(data, verifier=HmacVerifier())
