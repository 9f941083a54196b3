"""certs: CA and identities, signing/verifying, check_identity, TLS handshakes, the CLI."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import shutil
import ssl
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs import (
    CertError,
    Signer,
    Verifier,
    check_identity,
    client_context,
    create_ca,
    init_swarm,
    issue_identity,
    load_ca_certs,
    load_certificate,
    server_context,
)
from certs.cli import add_parser, run
from certs.pki import format_time, load_ca, subject_hash
from wire import (
    SignatureError,
    SignerLike,
    VerifierLike,
    decode_envelope,
    encode_envelope,
    make_envelope,
)

DAY = dt.timedelta(days=1)


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA with sn-1, swop-1, sl-1..sl-4, swci-1, plus sl-old (expired) and sl-new (not yet)."""
    out = tmp_path_factory.mktemp("swarm")
    init_swarm(out)
    now = dt.datetime.now(dt.UTC)
    issue_identity(out / "ca", "sl-old", "sl", out, valid_from=now - 10 * DAY, days=1)
    issue_identity(out / "ca", "sl-new", "sl", out, valid_from=now + DAY, days=30)
    return out


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another CA with an identity of the same uid as one in ``swarm``."""
    out = tmp_path_factory.mktemp("other")
    create_ca(out, name="other-ca")
    issue_identity(out, "sl-3", "sl", out)
    return out


def _signer(folder: Path, uid: str) -> Signer:
    return Signer.from_files(folder / f"{uid}-cert.pem", folder / f"{uid}-key.pem")


def _verifier(folder: Path) -> Verifier:
    return Verifier.from_ca(folder / "ca" / "capath")


# ---------------------------------------------------------------- files and certificates


def test_init_swarm_writes_the_reference_layout(swarm: Path) -> None:
    names = ["sn-1", "swop-1", "sl-1", "sl-2", "sl-3", "sl-4", "swci-1"]
    for uid in names:
        assert (swarm / f"{uid}-cert.pem").is_file()
        assert (swarm / f"{uid}-key.pem").stat().st_mode & 0o777 == 0o600
    ca = swarm / "ca"
    assert (ca / "ca-key.pem").stat().st_mode & 0o777 == 0o600
    assert (ca / "capath" / "ca-cert.pem").read_bytes() == (ca / "ca-cert.pem").read_bytes()
    ca_cert = load_certificate(ca / "ca-cert.pem")
    assert (ca / "capath" / f"{subject_hash(ca_cert.subject)}.0").is_file()


def test_identity_certificate_profile(swarm: Path) -> None:
    cert = load_certificate(swarm / "sl-2-cert.pem")
    ca = load_certificate(swarm / "ca" / "ca-cert.pem")
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "sl-2"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == "sl"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature
    assert usage.key_agreement
    aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert aki.key_identifier == ski.digest
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lifetime == dt.timedelta(days=365)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_openssl_accepts_the_capath(swarm: Path) -> None:
    capath = swarm / "ca" / "capath"
    cert = swarm / "sl-1-cert.pem"
    cmd = ["openssl", "verify", "-x509_strict", "-CApath", str(capath), str(cert)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    cmd = ["openssl", "x509", "-hash", "-noout", "-in", str(swarm / "ca" / "ca-cert.pem")]
    hashed = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    assert hashed == subject_hash(load_certificate(swarm / "ca" / "ca-cert.pem").subject)


@pytest.mark.parametrize(
    ("case", "error"),
    [
        (("bad/uid", "sl", "localhost", 30), "not a valid uid"),
        (("sl-9", "admin", "localhost", 30), "role 'admin' is not one of"),
        (("sl-9", "sl", "two words", 30), "neither an IP address nor a DNS name"),
        (("sl-9", "sl", "localhost", 0), "at least 1 day"),
        (("x" * 65, "sl", "localhost", 30), "to fit a certificate's CN"),
    ],
)
def test_issue_rejects_bad_input(
    swarm: Path, tmp_path: Path, case: tuple[str, str, str, int], error: str
) -> None:
    uid, role, san, days = case
    with pytest.raises(CertError, match=error):
        issue_identity(swarm / "ca", uid, role, tmp_path, sans=[san], days=days)


def test_create_ca_refuses_to_replace_a_ca(swarm: Path) -> None:
    with pytest.raises(CertError, match=r"a CA key already exists at .*ca-key\.pem"):
        create_ca(swarm)


def test_issue_from_a_missing_ca_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(CertError, match=r"CA certificate file .*ca-cert\.pem does not exist"):
        issue_identity(tmp_path, "sl-1", "sl", tmp_path)


# ---------------------------------------------------------------- signing and verifying


def test_sign_verify_round_trip_returns_the_role(swarm: Path) -> None:
    verifier = _verifier(swarm)
    for uid, role in (("sl-1", "sl"), ("swop-1", "swop"), ("sn-1", "sn"), ("swci-1", "swci")):
        signer = _signer(swarm, uid)
        assert (signer.uid, signer.role) == (uid, role)
        assert verifier.verify(b"data", signer.sign(b"data"), signer.cert_der, uid) == role


def test_signer_and_verifier_satisfy_the_codec_protocols(swarm: Path) -> None:
    signer_like: SignerLike = _signer(swarm, "sl-1")
    verifier_like: VerifierLike = _verifier(swarm)
    env = make_envelope("ping", {"x": 1}, sender="sl-1", role="sl", signer=signer_like)
    decoded = decode_envelope(encode_envelope(env), verifier=verifier_like)
    assert decoded.body == {"x": 1}


def test_certificate_from_another_ca_is_refused(swarm: Path, other: Path) -> None:
    signer = _signer(other, "sl-3")
    with pytest.raises(SignatureError, match="certificate of 'sl-3' is not issued by the swarm CA"):
        _verifier(swarm).verify(b"data", signer.sign(b"data"), signer.cert_der, "sl-3")


def test_tampered_data_and_bad_signatures_are_refused(swarm: Path) -> None:
    signer, verifier = _signer(swarm, "sl-3"), _verifier(swarm)
    signature = signer.sign(b"data")
    for data, sig in ((b"datA", signature), (b"data", b"\x30\x00"), (b"data", b"junk")):
        with pytest.raises(SignatureError, match="signature by 'sl-3' does not verify"):
            verifier.verify(data, sig, signer.cert_der, "sl-3")


def test_cn_mismatch_is_refused(swarm: Path) -> None:
    signer = _signer(swarm, "sl-2")
    with pytest.raises(SignatureError, match="certificate CN is 'sl-2' but the message claims 'sl-3'"):
        _verifier(swarm).verify(b"data", signer.sign(b"data"), signer.cert_der, "sl-3")


def test_expired_and_not_yet_valid_certificates_are_refused(swarm: Path) -> None:
    verifier = _verifier(swarm)
    for uid, error in (("sl-old", "expired on"), ("sl-new", "is not valid before")):
        signer = _signer(swarm, uid)
        cert = load_certificate(swarm / f"{uid}-cert.pem")
        when = cert.not_valid_after_utc if uid == "sl-old" else cert.not_valid_before_utc
        with pytest.raises(SignatureError, match=f"certificate of '{uid}' {error} {format_time(when)}"):
            verifier.verify(b"data", signer.sign(b"data"), signer.cert_der, uid)


def test_malformed_certificate_is_refused(swarm: Path) -> None:
    with pytest.raises(SignatureError, match="sent by 'sl-1' is not a valid DER certificate"):
        _verifier(swarm).verify(b"data", b"sig", b"not a certificate", "sl-1")


def test_cached_certificate_is_rechecked_for_expiry(swarm: Path) -> None:
    clock = [time.time()]
    verifier = Verifier(load_ca_certs(swarm / "ca" / "ca-cert.pem"), clock=lambda: clock[0])
    signer = _signer(swarm, "sl-1")
    signature = signer.sign(b"data")
    assert verifier.verify(b"data", signature, signer.cert_der, "sl-1") == "sl"
    clock[0] += 400 * 86400
    with pytest.raises(SignatureError, match="certificate of 'sl-1' expired on"):
        verifier.verify(b"data", signature, signer.cert_der, "sl-1")


def test_cache_is_bounded(swarm: Path) -> None:
    verifier = Verifier.from_ca(swarm / "ca" / "ca-cert.pem", cache_size=2)
    for uid in ("sl-1", "sl-2", "sl-3", "sl-4"):
        signer = _signer(swarm, uid)
        verifier.verify(b"d", signer.sign(b"d"), signer.cert_der, uid)
    assert len(verifier._cache) == 2


def _issue_without_ou(ca_dir: Path, out: Path) -> tuple[Path, Path]:
    """A certificate signed by the CA whose subject has a CN but no OU."""
    ca_cert, ca_key = load_ca(ca_dir)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sl-x")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - DAY)
        .not_valid_after(now + DAY)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = out / "sl-x-cert.pem", out / "sl-x-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_certificate_without_role_is_refused(swarm: Path, tmp_path: Path) -> None:
    cert_path, key_path = _issue_without_ou(swarm / "ca", tmp_path)
    with pytest.raises(CertError, match="needs a uid \\(CN\\) and a role \\(OU\\)"):
        Signer.from_files(cert_path, key_path)
    with pytest.raises(CertError, match="has no organizational unit"):
        check_identity(cert_path, key_path, swarm / "ca" / "capath")
    cert = load_certificate(cert_path)
    der = cert.public_bytes(serialization.Encoding.DER)
    with pytest.raises(SignatureError, match="certificate of 'sl-x' has no organizational unit"):
        _verifier(swarm).verify(b"d", b"sig", der, "sl-x")


def test_capath_directory_with_two_cas(swarm: Path, other: Path, tmp_path: Path) -> None:
    shutil.copy(swarm / "ca" / "ca-cert.pem", tmp_path / "swarm.pem")
    shutil.copy(other / "ca" / "ca-cert.pem", tmp_path / "other.crt")
    shutil.copy(other / "ca" / "ca-key.pem", tmp_path / "other-key.pem")  # skipped: no certificate
    assert len(load_ca_certs(tmp_path)) == 2
    verifier = Verifier.from_ca(tmp_path)
    for folder, uid in ((swarm, "sl-1"), (other, "sl-3")):
        signer = _signer(folder, uid)
        assert verifier.verify(b"d", signer.sign(b"d"), signer.cert_der, uid) == "sl"


def test_load_ca_certs_errors(tmp_path: Path) -> None:
    with pytest.raises(CertError, match="no CA certificates"):
        load_ca_certs(tmp_path)
    with pytest.raises(CertError, match="does not exist"):
        load_ca_certs(tmp_path / "missing")


# ---------------------------------------------------------------- check_identity


def test_check_identity_accepts_a_good_identity(swarm: Path) -> None:
    info = check_identity(swarm / "sl-4-cert.pem", swarm / "sl-4-key.pem", swarm / "ca" / "capath")
    assert (info.uid, info.role, info.sans) == ("sl-4", "sl", ("localhost", "127.0.0.1"))
    assert info.not_after > dt.datetime.now(dt.UTC) + 300 * DAY


@pytest.mark.parametrize(
    ("cert", "key", "error"),
    [
        ("sl-1-cert.pem", "sl-2-key.pem", r"key .*sl-2-key\.pem does not match certificate"),
        (
            "missing-cert.pem",
            "sl-1-key.pem",
            r"certificate file .*missing-cert\.pem does not exist",
        ),
        ("sl-1-key.pem", "sl-1-key.pem", r"sl-1-key\.pem is not a PEM certificate"),
        ("sl-1-cert.pem", "sl-1-cert.pem", r"sl-1-cert\.pem is not a PEM private key"),
        ("sl-old-cert.pem", "sl-old-key.pem", r"\(sl-old\) expired on 20"),
        ("sl-new-cert.pem", "sl-new-key.pem", r"\(sl-new\) is not valid before 20"),
    ],
)
def test_check_identity_errors(swarm: Path, cert: str, key: str, error: str) -> None:
    with pytest.raises(CertError, match=error):
        check_identity(swarm / cert, swarm / key, swarm / "ca")


def test_check_identity_refuses_another_ca(swarm: Path, other: Path) -> None:
    with pytest.raises(CertError, match=r"\(sl-3\) is not issued by the CA in"):
        check_identity(other / "sl-3-cert.pem", other / "sl-3-key.pem", swarm / "ca" / "capath")


# ---------------------------------------------------------------- TLS


@contextlib.asynccontextmanager
async def _tls_server(ctx: ssl.SSLContext) -> AsyncIterator[tuple[int, list[str]]]:
    served: list[str] = []

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.append(writer.get_extra_info("peercert")["subject"][-1][0][1])
        writer.write(b"hello\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(greet, "127.0.0.1", 0, ssl=ctx)
    async with server:
        yield server.sockets[0].getsockname()[1], served


async def _greeting(port: int, ctx: ssl.SSLContext) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    try:
        return await reader.readline()
    finally:
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await writer.wait_closed()


async def _refused(port: int, ctx: ssl.SSLContext) -> bool:
    try:
        data = await asyncio.wait_for(_greeting(port, ctx), 10)
    except (ssl.SSLError, ConnectionError):
        return True
    return data == b""


async def test_tls_mutual_authentication(swarm: Path, other: Path) -> None:
    ca = swarm / "ca" / "capath"
    server = server_context(swarm / "sn-1-cert.pem", swarm / "sn-1-key.pem", ca)
    good = client_context(swarm / "sl-1-cert.pem", swarm / "sl-1-key.pem", ca)
    anonymous = client_context(None, None, ca)
    foreign = client_context(other / "sl-3-cert.pem", other / "sl-3-key.pem", ca)
    async with _tls_server(server) as (port, served):
        assert await _greeting(port, good) == b"hello\n"
        assert await _refused(port, anonymous)
        assert await _refused(port, foreign)
    assert served == ["sl-1"]


async def test_tls_client_refuses_a_server_from_another_ca(swarm: Path, other: Path) -> None:
    server = server_context(
        other / "sl-3-cert.pem", other / "sl-3-key.pem", other / "ca", require_client_cert=False
    )
    client = client_context(swarm / "sl-1-cert.pem", swarm / "sl-1-key.pem", swarm / "ca")
    async with _tls_server(server) as (port, _):
        with pytest.raises(ssl.SSLCertVerificationError):
            await _greeting(port, client)


def test_tls_contexts_settings_and_errors(swarm: Path) -> None:
    ca = swarm / "ca" / "ca-cert.pem"
    ctx = client_context(swarm / "sl-1-cert.pem", swarm / "sl-1-key.pem", ca, check_hostname=False)
    assert not ctx.check_hostname
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    optional = server_context(swarm / "sn-1-cert.pem", swarm / "sn-1-key.pem", ca, require_client_cert=False)
    assert optional.verify_mode == ssl.CERT_OPTIONAL
    with pytest.raises(CertError, match=r"key file .*nope-key\.pem does not exist"):
        server_context(swarm / "sn-1-cert.pem", swarm / "nope-key.pem", ca)
    with pytest.raises(CertError, match=r"sl-1-key\.pem does not match certificate"):
        client_context(swarm / "sn-1-cert.pem", swarm / "sl-1-key.pem", ca)
    with pytest.raises(CertError, match="needs its key"):
        client_context(swarm / "sn-1-cert.pem", None, ca)


# ---------------------------------------------------------------- CLI


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="swarm")
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["certs", *argv])


def test_cli_init_issue_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(_args("init", "--dir", str(tmp_path), "--sl", "2", "--days", "90")) == 0
    assert (tmp_path / "sl-2-cert.pem").is_file()
    assert not (tmp_path / "sl-3-cert.pem").exists()
    argv = ["issue", "--ca", str(tmp_path / "ca"), "--uid", "sl-9", "--role", "sl"]
    argv += ["--out", str(tmp_path), "--san", "node9.example", "--san", "10.0.0.9"]
    assert run(_args(*argv)) == 0
    capsys.readouterr()
    assert run(_args("show", str(tmp_path / "sl-9-cert.pem"), "--format", "json")) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["uid"], info["role"], info["status"]) == ("sl-9", "sl", "valid")
    assert info["sans"] == ["node9.example", "10.0.0.9"]
    assert info["issuer"] == "CN=swarm-ca,O=open Swarm Learning"
    assert run(_args("show", str(tmp_path / "sl-1-cert.pem"))) == 0
    assert "sl-1" in capsys.readouterr().out


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(_args("show", str(tmp_path / "nope.pem"))) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "nope.pem does not exist" in err
    assert run(_args("ca", "--dir", str(tmp_path))) == 0
    assert run(_args("ca", "--dir", str(tmp_path))) == 1
    assert "already exists" in capsys.readouterr().err


# ---------------------------------------------------------------- rate


def test_verify_rate_with_cached_certificate(swarm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    signer, verifier = _signer(swarm, "sl-1"), _verifier(swarm)
    data = bytes(512)
    signature, cert = signer.sign(data), signer.cert_der
    verifier.verify(data, signature, cert, "sl-1")
    count = 3000
    start = time.perf_counter()
    for _ in range(count):
        verifier.verify(data, signature, cert, "sl-1")
    rate = count / (time.perf_counter() - start)
    with capsys.disabled():
        print(f"\nverify rate with a cached certificate: {rate:,.0f}/s")
