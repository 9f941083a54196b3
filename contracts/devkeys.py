"""A small Ed25519 signer/verifier for tests and benchmarks, without X.509 (not for production).

A ``DevAuthority`` plays the swarm CA: it issues ``DevSigner``s whose "certificate" is
``msgpack([MAGIC, uid, role, public_key, ca_signature])`` and gives the ``DevVerifier`` that checks them.
Both satisfy ``wire.SignerLike`` / ``VerifierLike``. Keys derive from a seed, so runs repeat.
"""

from __future__ import annotations

import hashlib

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from wire.errors import SignatureError
from wire.limits import packb, unpackb

__all__ = ["DevAuthority", "DevSigner", "DevVerifier"]

_MAGIC = "osl-dev-cert-1"


def _key(seed: str) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(seed.encode()).digest())


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


class DevSigner:
    """Signs with an Ed25519 key; its ``cert_der`` is issued by a ``DevAuthority``."""

    def __init__(self, uid: str, role: str, key: Ed25519PrivateKey, cert: bytes) -> None:
        self._uid, self._role, self._key, self._cert = uid, role, key, cert

    @property
    def uid(self) -> str:
        """The node uid."""
        return self._uid

    @property
    def role(self) -> str:
        """The node role."""
        return self._role

    @property
    def cert_der(self) -> bytes:
        """The dev certificate."""
        return self._cert

    def sign(self, data: bytes) -> bytes:
        """Ed25519 signature of ``data``."""
        return self._key.sign(data)


class DevVerifier:
    """Checks dev certificates against the authority's key (cached) and signatures against them."""

    def __init__(self, ca_public: Ed25519PublicKey) -> None:
        self._ca = ca_public
        self._known: dict[bytes, tuple[str, str, Ed25519PublicKey]] = {}

    def _certificate(self, cert: bytes) -> tuple[str, str, Ed25519PublicKey]:
        known = self._known.get(cert)
        if known is not None:
            return known
        fields = unpackb(cert, what="dev certificate")
        if not isinstance(fields, list) or len(fields) != 5 or fields[0] != _MAGIC:
            raise SignatureError("not a dev certificate")
        _, uid, role, public, ca_sig = fields
        try:
            self._ca.verify(ca_sig, packb([_MAGIC, uid, role, public]))
            key = Ed25519PublicKey.from_public_bytes(public)
        except (InvalidSignature, TypeError, ValueError):
            raise SignatureError(f"the certificate of {uid!r} is not from the swarm's CA") from None
        self._known[cert] = (uid, role, key)
        return uid, role, key

    def verify(self, data: bytes, signature: bytes, cert_der: bytes, claimed_uid: str) -> str:
        """Return the certificate's role; raise ``SignatureError`` when anything does not check out."""
        uid, role, key = self._certificate(cert_der)
        if uid != claimed_uid:
            raise SignatureError(f"the certificate is {uid!r}'s, not {claimed_uid!r}'s")
        try:
            key.verify(signature, data)
        except InvalidSignature:
            raise SignatureError(f"the signature of {claimed_uid!r} does not verify") from None
        return role


class DevAuthority:
    """The dev CA: issues signers and gives the matching verifier."""

    def __init__(self, seed: str = "osl-dev-ca") -> None:
        self._seed = seed
        self._key = _key(seed)

    def issue(self, uid: str, role: str) -> DevSigner:
        """A signer for ``uid`` with ``role`` (the same key every time for the same seed)."""
        key = _key(f"{self._seed}/{uid}/{role}")
        public = _raw(key.public_key())
        ca_sig = self._key.sign(packb([_MAGIC, uid, role, public]))
        return DevSigner(uid, role, key, packb([_MAGIC, uid, role, public, ca_sig]))

    def verifier(self) -> DevVerifier:
        """A verifier that trusts this authority."""
        return DevVerifier(self._key.public_key())
