"""Envelopes: every control message on the bus, signed when the sender has a key.

Wire form (msgpack map): ``v`` version, ``k`` kind, ``s`` sender uid, ``r`` sender role, ``t`` time,
``n`` nonce, ``b`` body (msgpack bytes), ``rt`` reply_to, ``c`` correlation id, ``sig`` signature,
``crt`` sender's DER certificate, ``i`` (optional) the identity that vouches for the sender. The signature
covers ``msgpack([v, k, s, r, t, n, b, rt, c])``, with ``i`` appended when it is present.

A *vouched* sender is a node whose uid is not its certificate's CN: the reference system gives several SL
nodes of one profile the same certificate (``sl-1``) and names them by ``slhostname`` (``sl1``..``sl4``).
Such an envelope carries ``i`` = the CN; only SL identities may vouch (``VOUCHING_ROLES``).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from wire.errors import CodecError, SignatureError
from wire.limits import MAX_MESSAGE_BYTES, packb, unpackb

__all__ = [
    "ENVELOPE_VERSION",
    "UID_PATTERN",
    "Envelope",
    "SignerLike",
    "VOUCHING_ROLES",
    "VerifierLike",
    "check_uid",
    "decode_envelope",
    "encode_envelope",
    "make_envelope",
    "verify_envelope",
]

ENVELOPE_VERSION = 1
UID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
ROLES = frozenset({"sn", "swop", "sl", "swci", "broker", "tool"})
VOUCHING_ROLES = frozenset({"sl"})
_MAX_KIND = 64


class SignerLike(Protocol):
    """What signs outgoing envelopes (implemented by ``certs.signing.Signer``)."""

    @property
    def uid(self) -> str: ...

    @property
    def role(self) -> str: ...

    @property
    def cert_der(self) -> bytes: ...

    def sign(self, data: bytes) -> bytes: ...


class VerifierLike(Protocol):
    """What checks incoming signatures (implemented by ``certs.signing.Verifier``).

    ``verify`` returns the role from the certificate and raises ``SignatureError`` when the
    certificate is not from the swarm's CA, is not the claimed uid's, or the signature is bad.
    """

    def verify(self, data: bytes, signature: bytes, cert_der: bytes, claimed_uid: str) -> str: ...


def check_uid(uid: object, *, what: str = "uid") -> str:
    """Return ``uid`` if it is a valid node uid, else raise CodecError saying why."""
    if not isinstance(uid, str) or not UID_PATTERN.match(uid):
        raise CodecError(
            f"{what} {uid!r} is not a valid uid (letters, digits, '.', '_', '-'; at most 128; "
            "starting with a letter or digit)"
        )
    return uid


@dataclass(frozen=True, slots=True)
class Envelope:
    """A decoded envelope; ``body`` is the unpacked map, ``body_bytes`` the signed bytes."""

    kind: str
    sender: str
    role: str
    body: dict[str, Any]
    time: float = 0.0
    nonce: bytes = b""
    reply_to: str | None = None
    corr: str | None = None
    signature: bytes | None = None
    cert: bytes | None = None
    body_bytes: bytes = field(default=b"", repr=False)
    version: int = ENVELOPE_VERSION
    voucher: str | None = None

    @property
    def identity(self) -> str:
        """The identity (certificate CN) the sender speaks under: its voucher, else itself."""
        return self.voucher or self.sender

    def signed_bytes(self) -> bytes:
        """The exact bytes the signature covers."""
        return _signed_part(
            self.version,
            self.kind,
            self.sender,
            self.role,
            self.time,
            self.nonce,
            self.body_bytes,
            self.reply_to,
            self.corr,
            self.voucher,
        )


def _signed_part(
    version: int,
    kind: str,
    sender: str,
    role: str,
    when: float,
    nonce: bytes,
    body: bytes,
    reply_to: str | None,
    corr: str | None,
    voucher: str | None,
) -> bytes:
    fields = [version, kind, sender, role, when, nonce, body, reply_to, corr]
    return packb(fields if voucher is None else [*fields, voucher])


def make_envelope(
    kind: str,
    body: dict[str, Any],
    *,
    sender: str,
    role: str,
    signer: SignerLike | None = None,
    reply_to: str | None = None,
    corr: str | None = None,
    when: float | None = None,
    voucher: str | None = None,
) -> Envelope:
    """Build (and sign, when a signer is given) an envelope for ``body``.

    ``voucher``: the identity that speaks for ``sender`` when the sender is not its certificate's CN.
    """
    voucher = None if voucher == sender else voucher
    identity = voucher or sender
    if signer is not None and (signer.uid != identity or signer.role != role):
        msg = f"signer is {signer.role} {signer.uid!r} but the envelope claims {role} {identity!r}"
        raise SignatureError(msg)
    body_bytes = packb(body)
    env = Envelope(
        kind=kind,
        sender=sender,
        role=role,
        body=body,
        time=time.time() if when is None else when,
        nonce=os.urandom(16),
        reply_to=reply_to,
        corr=corr,
        body_bytes=body_bytes,
        voucher=voucher,
    )
    if signer is None:
        return env
    return Envelope(
        kind=env.kind,
        sender=env.sender,
        role=env.role,
        body=env.body,
        time=env.time,
        nonce=env.nonce,
        reply_to=env.reply_to,
        corr=env.corr,
        signature=signer.sign(env.signed_bytes()),
        cert=signer.cert_der,
        body_bytes=body_bytes,
        voucher=voucher,
    )


def encode_envelope(env: Envelope) -> bytes:
    """Serialise an envelope to its wire bytes."""
    extra = {} if env.voucher is None else {"i": env.voucher}
    return packb(
        {
            **extra,
            "v": env.version,
            "k": env.kind,
            "s": env.sender,
            "r": env.role,
            "t": env.time,
            "n": env.nonce,
            "b": env.body_bytes,
            "rt": env.reply_to,
            "c": env.corr,
            "sig": env.signature,
            "crt": env.cert,
        }
    )


def _field(raw: dict[str, Any], key: str, types: type | tuple[type, ...], what: str) -> Any:
    if key not in raw:
        raise CodecError(f"{what}: field {key!r} is missing")
    value = raw[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        names = "/".join(t.__name__ for t in _as_tuple(types))
        raise CodecError(f"{what}: field {key!r} must be {names}, got {type(value).__name__}")
    return value


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def decode_envelope(
    data: bytes | memoryview,
    *,
    verifier: VerifierLike | None = None,
    what: str = "envelope",
    max_bytes: int = MAX_MESSAGE_BYTES,
) -> Envelope:
    """Decode and validate wire bytes; with a verifier, require and check the signature.

    Raises CodecError (SignatureError for signature problems) naming what is wrong.
    """
    raw = unpackb(data, what=what, max_bytes=max_bytes)
    if not isinstance(raw, dict):
        raise CodecError(f"{what}: expected a map, got {type(raw).__name__}")
    unknown = set(raw) - {"v", "k", "s", "r", "t", "n", "b", "rt", "c", "sig", "crt", "i"}
    if unknown:
        raise CodecError(f"{what}: unknown fields {sorted(unknown)}")
    version = _field(raw, "v", int, what)
    if version != ENVELOPE_VERSION:
        raise CodecError(f"{what}: version {version} is not supported (expected {ENVELOPE_VERSION})")
    kind = _field(raw, "k", str, what)
    if not kind or len(kind) > _MAX_KIND:
        raise CodecError(f"{what}: kind must be 1-{_MAX_KIND} characters")
    sender = check_uid(_field(raw, "s", str, what), what=f"{what}: sender")
    role = _field(raw, "r", str, what)
    if role not in ROLES:
        raise CodecError(f"{what}: role {role!r} is not one of {sorted(ROLES)}")
    when = float(_field(raw, "t", (int, float), what))
    nonce = _field(raw, "n", bytes, what)
    body_bytes = _field(raw, "b", bytes, what)
    reply_to = _field(raw, "rt", (str, type(None)), what)
    if reply_to is not None:
        check_uid(reply_to, what=f"{what}: reply_to")
    corr = _field(raw, "c", (str, type(None)), what)
    signature = _field(raw, "sig", (bytes, type(None)), what)
    cert = _field(raw, "crt", (bytes, type(None)), what)
    voucher = raw.get("i")
    if voucher is not None:
        check_uid(voucher, what=f"{what}: identity")
        if voucher == sender:
            raise CodecError(f"{what}: identity {voucher!r} vouches for itself (leave 'i' out)")
    body = unpackb(body_bytes, what=f"{what} {kind!r} body", max_bytes=max_bytes)
    if not isinstance(body, dict):
        raise CodecError(f"{what} {kind!r}: body must be a map, got {type(body).__name__}")
    env = Envelope(
        kind=kind,
        sender=sender,
        role=role,
        body=body,
        time=when,
        nonce=nonce,
        reply_to=reply_to,
        corr=corr,
        signature=signature,
        cert=cert,
        body_bytes=body_bytes,
        version=version,
        voucher=voucher,
    )
    if verifier is not None:
        verify_envelope(env, verifier, what=what)
    return env


def verify_envelope(env: Envelope, verifier: VerifierLike, *, what: str = "envelope") -> None:
    """Check the envelope's signature and that its certificate is the sender's, with its role."""
    if env.signature is None or env.cert is None:
        raise SignatureError(f"{what} {env.kind!r} from {env.sender!r} is not signed")
    cert_role = verifier.verify(env.signed_bytes(), env.signature, env.cert, env.identity)
    if cert_role != env.role:
        raise SignatureError(
            f"{what} {env.kind!r}: {env.identity!r} claims role {env.role!r} "
            f"but its certificate says {cert_role!r}"
        )
    if env.voucher is not None and cert_role not in VOUCHING_ROLES:
        raise SignatureError(
            f"{what} {env.kind!r}: {env.voucher!r} ({cert_role}) may not act for {env.sender!r}; "
            f"only {'/'.join(sorted(VOUCHING_ROLES))} identities vouch for other nodes"
        )
