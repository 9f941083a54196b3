"""The codec's one exception type."""

from __future__ import annotations

__all__ = ["CertificateTimeError", "CodecError", "SignatureError"]


class CodecError(ValueError):
    """Bytes that are not a valid message: says which field or chunk is wrong and why."""


class SignatureError(CodecError):
    """A signature, certificate or sender claim that does not verify."""


class CertificateTimeError(SignatureError):
    """A certificate outside its validity period: expired, or not valid yet."""
