"""Msgpack envelopes and tensor transport. No pickle anywhere."""

from daemons.codec.envelope import (
    Envelope,
    SignerLike,
    VerifierLike,
    check_uid,
    decode_envelope,
    encode_envelope,
    make_envelope,
    verify_envelope,
)
from daemons.codec.errors import CodecError, SignatureError

__all__ = [
    "CodecError",
    "Envelope",
    "SignatureError",
    "SignerLike",
    "VerifierLike",
    "check_uid",
    "decode_envelope",
    "encode_envelope",
    "make_envelope",
    "verify_envelope",
]
