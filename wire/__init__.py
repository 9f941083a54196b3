"""The wire format, a leaf: bounded msgpack, signed envelopes, local-socket frames, flat tensors and chunks,
and bounded reads of the files users hand us.

It imports nothing of the project; the ledger, the PKI, the daemons and the ML-side library all use it.
No pickle anywhere.
"""

from wire.envelope import (
    Envelope,
    SignerLike,
    VerifierLike,
    check_uid,
    decode_envelope,
    encode_envelope,
    make_envelope,
    verify_envelope,
)
from wire.errors import CertificateTimeError, CodecError, SignatureError

__all__ = [
    "CertificateTimeError",
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
