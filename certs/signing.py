"""Signing and verifying messages: ECDSA P-256/SHA-256 (RSA PKCS#1 v1.5 too) against the swarm CA.

``Signer`` and ``Verifier`` implement ``wire.SignerLike`` / ``VerifierLike``. The verifier
checks a certificate once (issued by one of the CAs, has CN and OU), caches it by the SHA-256 of its
DER bytes, and re-checks the validity period, the claimed uid and the signature on every use.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from certs.pki import (
    CertError,
    StrPath,
    cert_uid_role,
    check_key_matches,
    find_issuer,
    format_time,
    load_ca_certs,
    load_certificate,
    load_private_key,
)
from wire.errors import CertificateTimeError, SignatureError

__all__ = ["DEFAULT_CACHE_SIZE", "Signer", "Verifier"]

DEFAULT_CACHE_SIZE = 1024
_ECDSA = ec.ECDSA(hashes.SHA256())
_PKCS1 = padding.PKCS1v15()
_SHA256 = hashes.SHA256()

_PrivateKey: TypeAlias = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
_PublicKey: TypeAlias = ec.EllipticCurvePublicKey | rsa.RSAPublicKey


class Signer:
    """Signs bytes with a node's private key; knows its certificate, uid (CN) and role (OU)."""

    __slots__ = ("_cert_der", "_key", "_role", "_uid")

    def __init__(self, cert: x509.Certificate, key: PrivateKeyTypes) -> None:
        """Build a signer from a certificate and its private key (EC or RSA).

        Raises:
            CertError: the key is of another type or does not match, or CN / OU is missing.
        """
        uid, role = cert_uid_role(cert)
        if not uid or not role:
            msg = f"certificate {cert.subject.rfc4514_string()!r} needs a uid (CN) and a role (OU)"
            raise CertError(msg)
        if not isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)):
            raise CertError(f"key of {uid!r} must be EC or RSA, not {type(key).__name__}")
        check_key_matches(cert, key, cert_path=f"of {uid!r}", key_path="given")
        self._uid, self._role, self._key = uid, role, key
        self._cert_der = cert.public_bytes(serialization.Encoding.DER)

    @classmethod
    def from_files(cls, cert_path: StrPath, key_path: StrPath) -> Signer:
        """Load a signer from PEM files; errors name the file at fault."""
        cert = load_certificate(cert_path)
        key = load_private_key(key_path)
        check_key_matches(cert, key, cert_path=cert_path, key_path=key_path)
        try:
            return cls(cert, key)
        except CertError as exc:
            raise CertError(f"{cert_path}: {exc}") from None

    @property
    def uid(self) -> str:
        """The node uid: the certificate's CN."""
        return self._uid

    @property
    def role(self) -> str:
        """The node role: the certificate's OU."""
        return self._role

    @property
    def cert_der(self) -> bytes:
        """The certificate in DER form, as it travels in envelopes."""
        return self._cert_der

    def sign(self, data: bytes) -> bytes:
        """Sign ``data``: ECDSA with SHA-256 (DER signature), or RSA PKCS#1 v1.5 with SHA-256."""
        if isinstance(self._key, ec.EllipticCurvePrivateKey):
            return self._key.sign(data, _ECDSA)
        return self._key.sign(data, _PKCS1, _SHA256)


@dataclass(frozen=True, slots=True)
class _Trusted:
    """A certificate already checked against a CA, with what each use needs."""

    uid: str
    role: str
    key: _PublicKey
    start: float
    end: float
    cert: x509.Certificate
    ca: x509.Certificate


def _check_signature(key: _PublicKey, signature: bytes, data: bytes) -> None:
    if isinstance(key, ec.EllipticCurvePublicKey):
        key.verify(signature, data, _ECDSA)
    else:
        key.verify(signature, data, _PKCS1, _SHA256)


def _ca_name(ca: x509.Certificate) -> str:
    uid, _ = cert_uid_role(ca)
    return uid or ca.subject.rfc4514_string()


def _time_problem(entry: _Trusted, now: float) -> str:
    when = dt.datetime.fromtimestamp(now, dt.UTC)
    ca_label = f"the swarm CA {_ca_name(entry.ca)!r} that issued the certificate of {entry.uid!r}"
    checks = ((entry.cert, f"certificate of {entry.uid!r}"), (entry.ca, ca_label))
    for cert, label in checks:
        if when < cert.not_valid_before_utc:
            start = format_time(cert.not_valid_before_utc)
            return f"{label} is not valid before {start} (now {format_time(when)})"
        if when > cert.not_valid_after_utc:
            return f"{label} expired on {format_time(cert.not_valid_after_utc)}"
    return f"certificate of {entry.uid!r} is outside its validity period"


class Verifier:
    """Checks signatures against certificates issued by the swarm's CA(s); thread-safe."""

    def __init__(
        self,
        cas: Sequence[x509.Certificate],
        *,
        cache_size: int = DEFAULT_CACHE_SIZE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Trust certificates issued directly by any of ``cas``; cache up to ``cache_size``."""
        if not cas:
            raise CertError("a verifier needs at least one CA certificate")
        self._cas = tuple(cas)
        self._cache: OrderedDict[bytes, _Trusted] = OrderedDict()
        self._cache_size = max(1, cache_size)
        self._clock = clock
        self._lock = threading.Lock()

    @classmethod
    def from_ca(
        cls,
        path: StrPath,
        *,
        cache_size: int = DEFAULT_CACHE_SIZE,
        clock: Callable[[], float] = time.time,
    ) -> Verifier:
        """Trust the CA certificate(s) in a PEM file or a capath directory."""
        return cls(load_ca_certs(path), cache_size=cache_size, clock=clock)

    @property
    def cas(self) -> tuple[x509.Certificate, ...]:
        """The trusted CA certificates."""
        return self._cas

    def verify(self, data: bytes, signature: bytes, cert_der: bytes, claimed_uid: str) -> str:
        """Return the role (OU) of ``cert_der`` once it and ``signature`` over ``data`` check out.

        Raises:
            SignatureError: the certificate is malformed, not from the swarm CA, not currently
                valid, not the claimed uid's, has no role, or the signature does not verify.
        """
        entry = self._trusted(cert_der, claimed_uid)
        if entry.uid != claimed_uid:
            msg = f"certificate CN is {entry.uid!r} but the message claims {claimed_uid!r}"
            raise SignatureError(msg)
        now = self._clock()
        if not entry.start <= now <= entry.end:
            raise CertificateTimeError(_time_problem(entry, now))
        try:
            _check_signature(entry.key, signature, data)
        except (InvalidSignature, ValueError):
            raise SignatureError(f"signature by {claimed_uid!r} does not verify") from None
        return entry.role

    def _trusted(self, cert_der: bytes, claimed_uid: str) -> _Trusted:
        digest = hashlib.sha256(cert_der).digest()
        with self._lock:
            entry = self._cache.get(digest)
            if entry is not None:
                self._cache.move_to_end(digest)
                return entry
        entry = self._validate(cert_der, claimed_uid)
        with self._lock:
            self._cache[digest] = entry
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return entry

    def _validate(self, cert_der: bytes, claimed_uid: str) -> _Trusted:
        try:
            with warnings.catch_warnings():  # cryptography only warns about some malformed fields today
                warnings.simplefilter("error")
                cert = x509.load_der_x509_certificate(cert_der)
            uid, role = cert_uid_role(cert)
            key = cert.public_key()
        except (ValueError, UnsupportedAlgorithm, Warning) as exc:
            msg = f"certificate sent by {claimed_uid!r} is not a valid DER certificate: {exc}"
            raise SignatureError(msg) from None
        ca = find_issuer(cert, self._cas)
        if ca is None:
            issuer = cert.issuer.rfc4514_string()
            who = uid or claimed_uid
            msg = f"certificate of {who!r} is not issued by the swarm CA (its issuer is {issuer!r})"
            raise SignatureError(msg)
        if not uid or not role:
            what = "common name (CN)" if not uid else "organizational unit (OU) naming its role"
            raise SignatureError(f"certificate of {uid or claimed_uid!r} has no {what}")
        if not isinstance(key, (ec.EllipticCurvePublicKey, rsa.RSAPublicKey)):
            raise SignatureError(f"certificate of {uid!r} has an unsupported {type(key).__name__}")
        start = max(cert.not_valid_before_utc, ca.not_valid_before_utc).timestamp()
        end = min(cert.not_valid_after_utc, ca.not_valid_after_utc).timestamp()
        return _Trusted(uid, role, key, start, end, cert, ca)
