"""TLS contexts (TLS 1.2 or newer) for mutual TLS between nodes and the broker.

Files are checked with ``certs.pki`` before OpenSSL sees them, so a bad file gets an error that
names it and says why. CA certificates come from a PEM file or a capath directory (no hashed names
needed).
"""

from __future__ import annotations

import ssl

from cryptography.hazmat.primitives import serialization

from certs.pki import (
    CertError,
    StrPath,
    check_key_matches,
    load_ca_certs,
    load_certificate,
    load_private_key,
)

__all__ = ["client_context", "server_context"]


def _base(*, server: bool) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def _load_identity(ctx: ssl.SSLContext, cert: StrPath, key: StrPath) -> None:
    check_key_matches(load_certificate(cert), load_private_key(key), cert_path=cert, key_path=key)
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise CertError(f"TLS cannot load certificate {cert} with key {key}: {exc}") from None


def _load_cas(ctx: ssl.SSLContext, ca: StrPath) -> None:
    pem = "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in load_ca_certs(ca))
    try:
        ctx.load_verify_locations(cadata=pem)
    except ssl.SSLError as exc:
        raise CertError(f"TLS cannot load the CA certificates from {ca}: {exc}") from None


def client_context(
    cert: StrPath | None, key: StrPath | None, ca: StrPath, *, check_hostname: bool = True
) -> ssl.SSLContext:
    """A client context that verifies the server against ``ca`` and presents ``cert``.

    ``cert`` and ``key`` may both be None for a server that does not ask for client certificates.

    Raises:
        CertError: a file is missing, not PEM, or the key does not match the certificate.
    """
    if (cert is None) != (key is None):
        raise CertError("a client certificate needs its key (and a key its certificate)")
    ctx = _base(server=False)
    ctx.check_hostname = check_hostname
    ctx.verify_mode = ssl.CERT_REQUIRED
    _load_cas(ctx, ca)
    if cert is not None and key is not None:
        _load_identity(ctx, cert, key)
    return ctx


def server_context(
    cert: StrPath, key: StrPath, ca: StrPath, *, require_client_cert: bool = True
) -> ssl.SSLContext:
    """A server context presenting ``cert``; clients must show a certificate from ``ca``.

    With ``require_client_cert=False`` a client may come without a certificate, but one it does
    show must still be from ``ca``.

    Raises:
        CertError: a file is missing, not PEM, or the key does not match the certificate.
    """
    ctx = _base(server=True)
    ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    _load_cas(ctx, ca)
    _load_identity(ctx, cert, key)
    return ctx
