"""``swarm certs``: create a CA and node identities, issue one more, show a certificate.

``add_parser`` registers the command on the ``swarm`` CLI; ``run`` executes parsed arguments and
returns the exit status (errors: one red line on stderr, status 1).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from rich.console import Console
from rich.table import Table
from rich.text import Text

from certs.pki import (
    DEFAULT_SANS,
    ROLES,
    IdentityFiles,
    cert_sans,
    cert_uid_role,
    create_ca,
    format_time,
    init_swarm,
    issue_identity,
    load_certificates,
)

__all__ = ["add_parser", "describe_certificate", "run"]

_Command = Callable[[argparse.Namespace, Console], None]


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _add_common(parser: argparse.ArgumentParser, *, days: int, sans: bool = True) -> None:
    parser.add_argument("--days", type=_positive, default=days, help=f"validity (default {days})")
    if sans:
        parser.add_argument(
            "--san",
            action="append",
            metavar="NAME",
            help=f"DNS name or IP address, repeatable (default {' '.join(DEFAULT_SANS)})",
        )


def _add_init(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("init", help="create a CA and identities sn-1, swop-1, sl-1.., swci-1")
    p.add_argument("--dir", required=True, type=Path, help="output directory (CA in DIR/ca)")
    for role, default in (("sn", 1), ("swop", 1), ("sl", 4), ("swci", 1)):
        p.add_argument(f"--{role}", type=_count, default=default, metavar="N", help=f"{role} nodes")
    _add_common(p, days=365)
    p.add_argument("--ca-days", type=_positive, default=3650, help="CA validity (default 3650)")
    p.add_argument("--force", action="store_true", help="replace an existing CA")


def _add_ca(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("ca", help="create a CA in DIR/ca (with DIR/ca/capath)")
    p.add_argument("--dir", required=True, type=Path, help="output directory")
    p.add_argument("--name", default="swarm-ca", help="CA common name (default swarm-ca)")
    _add_common(p, days=3650, sans=False)
    p.add_argument("--force", action="store_true", help="replace an existing CA")


def _add_issue(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("issue", help="issue a certificate and key for one node")
    p.add_argument("--ca", required=True, type=Path, help="CA directory (with ca-cert/ca-key.pem)")
    p.add_argument("--uid", required=True, help="node uid (the certificate's CN)")
    p.add_argument("--role", required=True, choices=ROLES, help="node role (the certificate's OU)")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    _add_common(p, days=365)


def _add_show(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("show", help="show the certificate(s) in a PEM file")
    p.add_argument("file", type=Path, help="PEM certificate file")
    p.add_argument("--format", choices=("table", "json"), default="table", help="output format")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``certs`` command (init, ca, issue, show) to a CLI's subparsers."""
    parser = subparsers.add_parser(
        "certs",
        help="create and inspect the swarm's certificates",
        description="Create a CA and node identities (CN = uid, OU = role), issue one more, "
        "or show a certificate.",
    )
    sub = parser.add_subparsers(dest="certs_command", required=True, metavar="COMMAND")
    for add in (_add_init, _add_ca, _add_issue, _add_show):
        add(sub)


def _identities_table(identities: dict[str, IdentityFiles]) -> Table:
    table = Table("uid", "role", "certificate", "key")
    for uid, files in identities.items():
        table.add_row(uid, uid.rsplit("-", 1)[0], str(files.cert), str(files.key))
    return table


def _run_init(args: argparse.Namespace, out: Console) -> None:
    identities = init_swarm(
        args.dir,
        sn=args.sn,
        swop=args.swop,
        sl=args.sl,
        swci=args.swci,
        sans=args.san or DEFAULT_SANS,
        days=args.days,
        ca_days=args.ca_days,
        force=args.force,
    )
    out.print(f"CA in {args.dir / 'ca'} (capath {args.dir / 'ca' / 'capath'})", soft_wrap=True)
    out.print(_identities_table(identities))


def _run_ca(args: argparse.Namespace, out: Console) -> None:
    files = create_ca(args.dir, name=args.name, days=args.days, force=args.force)
    out.print(f"CA certificate {files.cert}", soft_wrap=True)
    out.print(f"CA key         {files.key}", soft_wrap=True)
    out.print(f"capath         {files.capath}", soft_wrap=True)


def _run_issue(args: argparse.Namespace, out: Console) -> None:
    sans = args.san or DEFAULT_SANS
    files = issue_identity(args.ca, args.uid, args.role, args.out, sans=sans, days=args.days)
    out.print(f"issued {args.role} {args.uid!r}: {files.cert}, {files.key}", soft_wrap=True)


def _status(cert: x509.Certificate, now: dt.datetime) -> str:
    if now < cert.not_valid_before_utc:
        return "not yet valid"
    return "expired" if now > cert.not_valid_after_utc else "valid"


def _key_kind(cert: x509.Certificate) -> str:
    key = cert.public_key()
    if isinstance(key, ec.EllipticCurvePublicKey):
        return f"EC {key.curve.name}"
    if isinstance(key, rsa.RSAPublicKey):
        return f"RSA {key.key_size}"
    return type(key).__name__


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def describe_certificate(cert: x509.Certificate) -> dict[str, Any]:
    """A certificate's subject, uid, role, issuer, SANs, validity and fingerprint as plain data."""
    uid, role = cert_uid_role(cert)
    return {
        "subject": cert.subject.rfc4514_string(),
        "uid": uid,
        "role": role,
        "issuer": cert.issuer.rfc4514_string(),
        "sans": list(cert_sans(cert)),
        "not_before": cert.not_valid_before_utc.isoformat(),
        "not_after": cert.not_valid_after_utc.isoformat(),
        "status": _status(cert, dt.datetime.now(dt.UTC)),
        "is_ca": _is_ca(cert),
        "key": _key_kind(cert),
        "serial": f"{cert.serial_number:x}",
        "sha256": cert.fingerprint(hashes.SHA256()).hex(),
    }


def _cert_table(path: Path, cert: x509.Certificate) -> Table:
    info = describe_certificate(cert)
    table = Table(title=str(path), show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    status_style = {"valid": "green", "expired": "red"}.get(info["status"], "yellow")
    table.add_row("subject", info["subject"])
    table.add_row("uid (CN)", info["uid"] or "-")
    table.add_row("role (OU)", info["role"] or "-")
    table.add_row("issuer", info["issuer"])
    table.add_row("SANs", ", ".join(info["sans"]) or "-")
    table.add_row("not before", format_time(cert.not_valid_before_utc))
    table.add_row("not after", format_time(cert.not_valid_after_utc))
    table.add_row("status", Text(info["status"], style=status_style))
    table.add_row("CA", "yes" if info["is_ca"] else "no")
    table.add_row("key", info["key"])
    table.add_row("serial", info["serial"])
    table.add_row("SHA-256", info["sha256"])
    return table


def _run_show(args: argparse.Namespace, out: Console) -> None:
    path: Path = args.file
    certs = load_certificates(path)
    if args.format == "json":
        infos = [describe_certificate(c) for c in certs]
        sys.stdout.write(json.dumps(infos[0] if len(infos) == 1 else infos, indent=2) + "\n")
        return
    for cert in certs:
        out.print(_cert_table(path, cert))


_COMMANDS: dict[str, _Command] = {
    "init": _run_init,
    "ca": _run_ca,
    "issue": _run_issue,
    "show": _run_show,
}


def run(args: argparse.Namespace) -> int:
    """Execute a parsed ``certs`` command; return 0, or 1 after one red error line on stderr."""
    try:
        _COMMANDS[args.certs_command](args, Console())
    except (ValueError, OSError) as exc:
        Console(stderr=True).print(Text(f"error: {exc}", style="red"), soft_wrap=True)
        return 1
    return 0
