"""``gen-cert -e EXAMPLE -i N``: the certificates of one host, as the reference's ``gen-cert`` lays them out.

Writes ``workspace/EXAMPLE/cert/{sn,swop,swci,sl}-N-{key,cert}.pem`` and the CA in
``workspace/EXAMPLE/cert/ca`` (``ca/capath`` for ``--capath``), relative to the current directory. A CA
that exists already is reused, so ``-i 2`` issues the second host's identities from the same CA. Keys are
never written inside the installed package or the source tree unless ``--out`` says so explicitly.
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from certs.pki import CA_KEY_NAME, DEFAULT_SANS, CertError, create_ca, issue_identity

__all__ = ["main"]

_ROLES = ("sn", "swop", "swci", "sl")
_PROJECT = Path(__file__).resolve().parents[1]


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def main(argv: Sequence[str] | None = None) -> int:
    """Create (or reuse) the CA and issue this host's four identities."""
    parser = argparse.ArgumentParser(prog="gen-cert", description="Generate the certificates of one host.")
    parser.add_argument(
        "-e", "--example", required=True, metavar="EXAMPLE", help="example name (workspace/EXAMPLE)"
    )
    parser.add_argument(
        "-i", "--index", required=True, type=int, metavar="N", help="host index: sn-N, sl-N ..."
    )
    parser.add_argument("--out", type=Path, help="certificate directory (default workspace/EXAMPLE/cert)")
    parser.add_argument("--san", action="append", metavar="NAME", help="DNS name or IP (repeatable)")
    parser.add_argument("--days", type=int, default=365, help="validity of the identities (default 365)")
    args = parser.parse_args(argv)
    if args.index < 1:
        parser.error(f"-i {args.index}: the host index starts at 1")
    out = (args.out or Path("workspace") / args.example / "cert").resolve()
    if args.out is None and _inside(out, _PROJECT):
        print(
            f"gen-cert: refusing to write private keys into {out}, inside {_PROJECT} (the installed package "
            "or the source tree); run it from your work directory, or give --out",
            file=sys.stderr,
        )
        return 1
    sans = args.san or [*DEFAULT_SANS, socket.gethostname()]
    try:
        if not (out / "ca" / CA_KEY_NAME).exists():
            create_ca(out)
            print(f"created the CA in {out / 'ca'} (capath {out / 'ca' / 'capath'})")
        for role in _ROLES:
            uid = f"{role}-{args.index}"
            files = issue_identity(out / "ca", uid, role, out, sans=sans, days=args.days)
            print(f"{uid}: {files.cert}, {files.key}")
    except CertError as exc:
        print(f"gen-cert: {exc}", file=sys.stderr)
        return 1
    return 0
