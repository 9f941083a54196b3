"""The swarm's PKI: an EC P-256 CA, node identities (CN = uid, OU = role), checks with clear errors.

Layout (as the reference system's ``gen-cert``): ``<dir>/ca/ca-cert.pem``, ``<dir>/ca/ca-key.pem``,
``<dir>/ca/capath/ca-cert.pem`` and, per identity, ``<dir>/<uid>-cert.pem`` and
``<dir>/<uid>-key.pem``. The capath also holds ``<subject hash>.0``, a copy under the name OpenSSL's
``-CApath`` lookup (and mosquitto's ``capath``) expects. Private keys are unencrypted PKCS#8 PEM
files with mode 0600.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import ipaddress
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import (
    CertificateIssuerPrivateKeyTypes,
    PrivateKeyTypes,
)
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from wire import CodecError, check_uid
from wire.files import MAX_CERT_FILE_BYTES, UnsafeFileError, read_bounded

__all__ = [
    "CA_CERT_NAME",
    "CA_KEY_NAME",
    "DEFAULT_SANS",
    "ROLES",
    "CAFiles",
    "CertError",
    "IdentityFiles",
    "IdentityInfo",
    "StrPath",
    "cert_sans",
    "cert_uid_role",
    "check_identity",
    "check_key_matches",
    "create_ca",
    "find_issuer",
    "format_time",
    "init_swarm",
    "issue_identity",
    "load_ca",
    "load_ca_certs",
    "load_certificate",
    "load_certificates",
    "load_private_key",
    "subject_hash",
]

StrPath: TypeAlias = str | os.PathLike[str]

ROLES = ("sn", "swop", "sl", "swci", "broker")
DEFAULT_SANS = ("localhost", "127.0.0.1")
CA_CERT_NAME = "ca-cert.pem"
CA_KEY_NAME = "ca-key.pem"
_ORG = "open Swarm Learning"
_MAX_CN = 64  # RFC 5280 upper bound for a common name
_CLOCK_SKEW = dt.timedelta(minutes=5)
_CERT_MARK = b"-----BEGIN CERTIFICATE-----"
_ASCII_SPACE = re.compile(r"[ \t\n\v\f\r]+")


class CertError(ValueError):
    """A certificate or key problem: says which file or certificate, and why."""


@dataclass(frozen=True, slots=True)
class CAFiles:
    """Where a CA lives: its certificate, its key and the ``capath`` directory with the copy."""

    cert: Path
    key: Path
    capath: Path


@dataclass(frozen=True, slots=True)
class IdentityFiles:
    """A node identity on disk: certificate and private key."""

    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class IdentityInfo:
    """What ``check_identity`` found: uid (CN), role (OU), expiry and subject alternative names."""

    uid: str
    role: str
    not_after: dt.datetime
    sans: tuple[str, ...]


# ---------------------------------------------------------------- reading


def _read(path: StrPath, what: str) -> bytes:
    try:
        return read_bounded(path, MAX_CERT_FILE_BYTES)
    except FileNotFoundError:
        raise CertError(f"{what} file {path} does not exist") from None
    except IsADirectoryError:
        raise CertError(f"{what} file {path} is a directory, expected a PEM file") from None
    except UnsafeFileError as exc:
        raise CertError(f"{what} file {path} {exc.strerror}") from None
    except OSError as exc:
        raise CertError(f"cannot read {what} file {path}: {exc.strerror or exc}") from None


def _parse_certs(data: bytes, path: StrPath, what: str) -> list[x509.Certificate]:
    if _CERT_MARK not in data:
        msg = f"{what} file {path} is not a PEM certificate (no 'BEGIN CERTIFICATE' block)"
        raise CertError(msg)
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise CertError(f"{what} file {path}: cannot parse the certificate: {exc}") from None


def load_certificate(path: StrPath, *, what: str = "certificate") -> x509.Certificate:
    """Load the first certificate of a PEM file; raise CertError naming the file."""
    return _parse_certs(_read(path, what), path, what)[0]


def load_certificates(path: StrPath, *, what: str = "certificate") -> list[x509.Certificate]:
    """Load every certificate of a PEM file; raise CertError naming the file."""
    return _parse_certs(_read(path, what), path, what)


def load_private_key(path: StrPath, *, what: str = "key") -> PrivateKeyTypes:
    """Load an unencrypted PEM private key; raise CertError naming the file."""
    data = _read(path, what)
    if b"PRIVATE KEY-----" not in data:
        raise CertError(f"{what} file {path} is not a PEM private key (no 'PRIVATE KEY' block)")
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise CertError(f"{what} file {path} is encrypted; an unencrypted key is needed") from None
    except ValueError as exc:
        raise CertError(f"{what} file {path}: cannot parse the private key: {exc}") from None


def load_ca_certs(path: StrPath) -> list[x509.Certificate]:
    """Load CA certificates from a PEM file (one or more) or a capath directory (*.pem, *.crt).

    In a directory, files without a certificate (a CA key, say) are skipped; duplicates are dropped.
    """
    root = Path(path)
    if not root.exists():
        raise CertError(f"CA certificate file or directory {path} does not exist")
    if not root.is_dir():
        return load_certificates(root, what="CA certificate")
    certs: dict[bytes, x509.Certificate] = {}
    for file in sorted(p for p in root.iterdir() if p.suffix in {".pem", ".crt"} and p.is_file()):
        data = _read(file, "CA certificate")
        if _CERT_MARK in data:
            for cert in _parse_certs(data, file, "CA certificate"):
                certs.setdefault(cert.public_bytes(serialization.Encoding.DER), cert)
    if not certs:
        raise CertError(f"no CA certificates (*.pem, *.crt) in directory {path}")
    return list(certs.values())


def load_ca(ca_dir: StrPath) -> tuple[x509.Certificate, CertificateIssuerPrivateKeyTypes]:
    """Load a CA's certificate and key from ``ca_dir`` (or from ``ca_dir/ca``)."""
    folder = Path(ca_dir)
    if not (folder / CA_CERT_NAME).exists() and (folder / "ca" / CA_CERT_NAME).exists():
        folder = folder / "ca"
    cert = load_certificate(folder / CA_CERT_NAME, what="CA certificate")
    key = load_private_key(folder / CA_KEY_NAME, what="CA key")
    if not isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)):
        raise CertError(f"CA key {folder / CA_KEY_NAME} must be an EC or RSA key")
    check_key_matches(cert, key, cert_path=folder / CA_CERT_NAME, key_path=folder / CA_KEY_NAME)
    return cert, key


# ---------------------------------------------------------------- inspecting


def _attr(name: x509.Name, oid: x509.ObjectIdentifier) -> str | None:
    values = name.get_attributes_for_oid(oid)
    if not values:
        return None
    value = values[0].value
    return value.decode() if isinstance(value, bytes) else value


def cert_uid_role(cert: x509.Certificate) -> tuple[str | None, str | None]:
    """The certificate's CN (the node uid) and OU (its role); None where absent."""
    return _attr(cert.subject, NameOID.COMMON_NAME), _attr(cert.subject, NameOID.ORGANIZATIONAL_UNIT_NAME)


def cert_sans(cert: x509.Certificate) -> tuple[str, ...]:
    """The DNS names and IP addresses in the subject alternative names, as strings."""
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ()
    dns = ext.get_values_for_type(x509.DNSName)
    ips = [str(ip) for ip in ext.get_values_for_type(x509.IPAddress)]
    return (*dns, *ips)


def format_time(when: dt.datetime) -> str:
    """A UTC time as ``YYYY-MM-DD HH:MM:SS UTC``."""
    return when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _public_der(key: PrivateKeyTypes | x509.Certificate) -> bytes:
    public = key.public_key()
    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def check_key_matches(
    cert: x509.Certificate, key: PrivateKeyTypes, *, cert_path: StrPath, key_path: StrPath
) -> None:
    """Raise CertError when ``key`` is not the private key of ``cert``."""
    if _public_der(cert) != _public_der(key):
        raise CertError(f"key {key_path} does not match certificate {cert_path}")


def find_issuer(cert: x509.Certificate, cas: Iterable[x509.Certificate]) -> x509.Certificate | None:
    """The CA among ``cas`` that signed ``cert`` (name and signature checked), or None."""
    for ca in cas:
        if ca.subject != cert.issuer:
            continue
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return ca
    return None


def _check_times(cert: x509.Certificate, label: str, now: dt.datetime) -> None:
    if now < cert.not_valid_before_utc:
        raise CertError(f"{label} is not valid before {format_time(cert.not_valid_before_utc)}")
    if now > cert.not_valid_after_utc:
        raise CertError(f"{label} expired on {format_time(cert.not_valid_after_utc)}")


def check_identity(cert_path: StrPath, key_path: StrPath, ca_path: StrPath) -> IdentityInfo:
    """Check that cert + key form a valid identity issued by the CA at ``ca_path``.

    Raises:
        CertError: a file is missing or not PEM, the key does not match, the certificate is
            expired or not yet valid, not issued by this CA, or has no uid (CN) or role (OU).
    """
    cert = load_certificate(cert_path)
    check_key_matches(cert, load_private_key(key_path), cert_path=cert_path, key_path=key_path)
    uid, role = cert_uid_role(cert)
    label = f"certificate {cert_path} ({uid or 'no CN'})"
    if not uid:
        raise CertError(f"{label} has no common name (CN), which must hold the node uid")
    if not role:
        raise CertError(f"{label} has no organizational unit (OU), which must hold the role")
    cas = load_ca_certs(ca_path)
    issuer = find_issuer(cert, cas)
    if issuer is None:
        names = ", ".join(repr(ca.subject.rfc4514_string()) for ca in cas)
        raise CertError(
            f"{label} is not issued by the CA in {ca_path} "
            f"(its issuer is {cert.issuer.rfc4514_string()!r}; CA: {names})"
        )
    now = dt.datetime.now(dt.UTC)
    _check_times(cert, label, now)
    _check_times(issuer, f"CA certificate {issuer.subject.rfc4514_string()!r} in {ca_path}", now)
    return IdentityInfo(uid, role, cert.not_valid_after_utc, cert_sans(cert))


# ---------------------------------------------------------------- OpenSSL's capath names


def _der(tag: int, content: bytes) -> bytes:
    size = len(content)
    if size < 0x80:
        return bytes([tag, size]) + content
    raw = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(raw)]) + raw + content


def _der_oid(oid: x509.ObjectIdentifier) -> bytes:
    first, second, *rest = (int(part) for part in oid.dotted_string.split("."))
    body = bytearray()
    for arc in (40 * first + second, *rest):
        chunk, rest_bits = [arc & 0x7F], arc >> 7
        while rest_bits:
            chunk.append(0x80 | (rest_bits & 0x7F))
            rest_bits >>= 7
        body.extend(reversed(chunk))
    return _der(0x06, bytes(body))


def _canon_value(value: str | bytes) -> bytes:
    text = value.decode() if isinstance(value, bytes) else value
    collapsed = _ASCII_SPACE.sub(" ", text).strip(" ")
    return "".join(c.lower() if c.isascii() else c for c in collapsed).encode()


def subject_hash(name: x509.Name) -> str:
    """OpenSSL's subject hash of ``name`` (``openssl x509 -hash``): the capath file name stem."""
    canon = b""
    for rdn in name.rdns:
        parts = sorted(_der(0x30, _der_oid(a.oid) + _der(0x0C, _canon_value(a.value))) for a in rdn)
        canon += _der(0x31, b"".join(parts))
    return f"{int.from_bytes(hashlib.sha1(canon).digest()[:4], 'little'):08x}"  # noqa: S324


# ---------------------------------------------------------------- writing


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as exc:
        raise CertError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        Path(tmp).chmod(mode)
        Path(tmp).replace(path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise CertError(f"cannot write {path}: {exc.strerror or exc}") from None


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    _write_atomic(path, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write_atomic(path, pem, 0o600)


# ---------------------------------------------------------------- building


def _validity(valid_from: dt.datetime | None, days: int) -> tuple[dt.datetime, dt.datetime]:
    if days < 1:
        raise CertError(f"validity must be at least 1 day, got {days}")
    if valid_from is None:
        start = dt.datetime.now(dt.UTC) - _CLOCK_SKEW
    elif valid_from.tzinfo is None:
        start = valid_from.replace(tzinfo=dt.UTC)
    else:
        start = valid_from
    return start, start + dt.timedelta(days=days)


def _san(value: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(value))
    except ValueError:
        pass
    if not value or any(c.isspace() for c in value):
        msg = f"subject alternative name {value!r} is neither an IP address nor a DNS name"
        raise CertError(msg)
    return x509.DNSName(value)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public: ec.EllipticCurvePublicKey,
    valid_from: dt.datetime | None,
    days: int,
) -> x509.CertificateBuilder:
    start, end = _validity(valid_from, days)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
    )


def _subject(common_name: str, role: str | None = None) -> x509.Name:
    if not 1 <= len(common_name) <= _MAX_CN:
        msg = f"name {common_name!r} must be 1-{_MAX_CN} characters to fit a certificate's CN"
        raise CertError(msg)
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, _ORG)]
    if role is not None:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role))
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _key_usage(*, sign_certs: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=not sign_certs,
        key_cert_sign=sign_certs,
        crl_sign=sign_certs,
        encipher_only=False,
        decipher_only=False,
    )


def _drop_hash_link(files: CAFiles) -> None:
    """Remove the old CA's ``<hash>.0`` from capath before the CA is replaced."""
    if files.cert.is_file():
        with contextlib.suppress(CertError, OSError):
            old = load_certificate(files.cert)
            (files.capath / f"{subject_hash(old.subject)}.0").unlink(missing_ok=True)


def create_ca(out_dir: StrPath, *, name: str = "swarm-ca", days: int = 3650, force: bool = False) -> CAFiles:
    """Create a CA in ``<out_dir>/ca`` (and its ``capath``) with an EC P-256 key.

    Raises:
        CertError: a CA key exists already and ``force`` is False, or a file cannot be written.
    """
    folder = Path(out_dir) / "ca"
    files = CAFiles(folder / CA_CERT_NAME, folder / CA_KEY_NAME, folder / "capath")
    if files.key.exists() and not force:
        raise CertError(
            f"a CA key already exists at {files.key}; replacing it would invalidate every "
            "certificate it issued (use force=True / --force to replace it)"
        )
    _drop_hash_link(files)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _subject(name)
    public = key.public_key()
    cert = (
        _builder(subject, subject, public, None, days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(sign_certs=True), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(files.key, key)
    _write_cert(files.cert, cert)
    _write_cert(files.capath / CA_CERT_NAME, cert)
    _write_cert(files.capath / f"{subject_hash(cert.subject)}.0", cert)
    return files


def _check_uid_role(uid: str, role: str) -> None:
    try:
        check_uid(uid)
    except CodecError as exc:
        raise CertError(str(exc)) from None
    if role not in ROLES:
        raise CertError(f"role {role!r} is not one of {', '.join(ROLES)}")


def issue_identity(
    ca_dir: StrPath,
    uid: str,
    role: str,
    out_dir: StrPath,
    *,
    sans: Sequence[str] = DEFAULT_SANS,
    days: int = 365,
    valid_from: dt.datetime | None = None,
) -> IdentityFiles:
    """Issue ``<out_dir>/<uid>-cert.pem`` + ``<uid>-key.pem`` (CN=uid, OU=role) from the CA.

    ``ca_dir`` holds ``ca-cert.pem`` and ``ca-key.pem`` (or is the parent of such a ``ca``).
    Validity starts at ``valid_from`` (default: five minutes ago) and lasts ``days``.

    Raises:
        CertError: bad uid, role or SAN, the CA cannot be loaded, or a file cannot be written.
    """
    _check_uid_role(uid, role)
    names = [_san(s) for s in sans]
    ca_cert, ca_key = load_ca(ca_dir)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _subject(uid, role)
    builder = _builder(subject, ca_cert.subject, key.public_key(), valid_from, days)
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    eku = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    cert = (
        builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(sign_certs=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(eku), critical=False)
        .add_extension(_authority_key_id(ca_cert, ca_key), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    files = IdentityFiles(Path(out_dir) / f"{uid}-cert.pem", Path(out_dir) / f"{uid}-key.pem")
    _write_key(files.key, key)
    _write_cert(files.cert, cert)
    return files


def _authority_key_id(
    ca_cert: x509.Certificate, ca_key: CertificateIssuerPrivateKeyTypes
) -> x509.AuthorityKeyIdentifier:
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def init_swarm(
    out_dir: StrPath,
    *,
    sn: int = 1,
    swop: int = 1,
    sl: int = 4,
    swci: int = 1,
    sans: Sequence[str] = DEFAULT_SANS,
    days: int = 365,
    ca_days: int = 3650,
    force: bool = False,
) -> dict[str, IdentityFiles]:
    """Create a CA in ``<out_dir>/ca`` and identities sn-1, swop-1, sl-1.., swci-1 in out_dir."""
    counts = {"sn": sn, "swop": swop, "sl": sl, "swci": swci}
    for role, count in counts.items():
        if count < 0:
            raise CertError(f"number of {role} identities must be >= 0, got {count}")
    ca = create_ca(out_dir, days=ca_days, force=force)
    return {
        f"{role}-{i}": issue_identity(ca.cert.parent, f"{role}-{i}", role, out_dir, sans=sans, days=days)
        for role, count in counts.items()
        for i in range(1, count + 1)
    }
