"""A process's identity files (``--cert/--key/--capath``) turned into signer, verifier and TLS context.

Security is on by default when certificates exist: with an identity, the bus uses mutual TLS and every
envelope is signed and verified. Without one, everything still works, unsigned, on a plain broker.
"""

from __future__ import annotations

import argparse
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from certs import CertError, Signer, Verifier, check_identity, client_context
from daemons.bus import Bus, BusConfig
from daemons.bus.config import BrokerAddress
from wire import check_uid
from wire.envelope import VOUCHING_ROLES

__all__ = [
    "Identity",
    "IdentityError",
    "add_identity_arguments",
    "identity_from_args",
    "node_name",
    "node_uid",
    "open_bus",
]

NODE_NAME_VAR = "SWARM_NODE_NAME"


class IdentityError(ValueError):
    """The identity files are missing, mismatched, or not the role this process runs as."""


@dataclass(frozen=True)
class Identity:
    """Certificate, key and swarm CA of one process."""

    cert: Path
    key: Path
    ca: Path
    uid: str
    role: str

    @classmethod
    def load(cls, cert: Path, key: Path, ca: Path, *, role: str | None = None) -> Identity:
        """Check the files (key matches, issued by the CA, valid now) and, if given, the role."""
        try:
            info = check_identity(cert, key, ca)
        except (CertError, OSError) as exc:
            raise IdentityError(str(exc)) from None
        if role is not None and info.role != role:
            raise IdentityError(f"certificate {cert} is for role {info.role!r}, but this is a {role}")
        return cls(cert, key, ca, info.uid, info.role)

    def signer(self) -> Signer:
        """Signs this process's envelopes."""
        return Signer.from_files(self.cert, self.key)

    def verifier(self) -> Verifier:
        """Checks everyone's envelopes against the swarm CA."""
        return Verifier.from_ca(self.ca)

    def tls(self) -> ssl.SSLContext:
        """Client context for mutual TLS to the broker."""
        return client_context(self.cert, self.key, self.ca)

    def ca_file(self) -> Path:
        """The CA certificate as one file (mosquitto's ``cafile``)."""
        if self.ca.is_dir():
            for name in ("ca-cert.pem", "ca.pem", "cacert.pem"):
                if (self.ca / name).is_file():
                    return self.ca / name
            pems = sorted(self.ca.glob("*.pem"))
            if pems:
                return pems[0]
            raise IdentityError(f"no CA certificate (*.pem) in {self.ca}")
        return self.ca


def node_name(uid: str) -> str:
    """The node's name as LIST NODES shows it (the reference's container name): ``--name``, else the uid."""
    return os.environ.get(NODE_NAME_VAR) or uid


def node_uid(identity: Identity | None, name: str | None, *, option: str = "--name") -> str | None:
    """The uid a node runs as: ``name``, or the certificate's CN.

    A name other than the CN is a node the identity vouches for (the reference's shared SL
    certificate: ``sl1``..``sl4`` all present ``sl-1``); only SL identities may do that.
    """
    if name is None:
        return identity.uid if identity else None
    try:
        check_uid(name, what=option)
    except ValueError as exc:
        raise IdentityError(str(exc)) from None
    if identity is not None and name != identity.uid and identity.role not in VOUCHING_ROLES:
        raise IdentityError(
            f"{option} {name!r} differs from the certificate's CN {identity.uid!r}; only an SL "
            "certificate may be shared by several nodes"
        )
    return name


def open_bus(
    identity: Identity | None,
    broker: BrokerAddress,
    uid: str,
    role: str,
    *,
    network: str,
    presence: dict[str, Any] | None = None,
    answers: bool = False,
) -> Bus:
    """A bus session for ``uid``: with an identity, mutual TLS (mqtts) and signed, verified envelopes;
    ``answers``: it will serve requests (taken from its first connection on, see ``Bus``)."""
    if identity is not None and not broker.tls:
        broker = broker.with_tls()
    config = BusConfig(
        broker,
        uid,
        role,
        network=network,
        identity=identity.uid if identity else None,
        tls=identity.tls() if identity else None,
    )
    return Bus(
        config,
        signer=identity.signer() if identity else None,
        verifier=identity.verifier() if identity else None,
        presence=presence,
        answers=answers,
    )


def add_identity_arguments(parser: argparse.ArgumentParser) -> None:
    """``--cert --key --capath`` as in the reference's run scripts (also from SWARM_ID_* variables)."""
    group = parser.add_argument_group("identity (mutual TLS and signed messages when given)")
    group.add_argument("--cert", type=Path, default=_env_path("SWARM_ID_CERT"), help="certificate (PEM)")
    group.add_argument("--key", type=Path, default=_env_path("SWARM_ID_KEY"), help="private key (PEM)")
    group.add_argument(
        "--capath",
        "--cacert",
        dest="capath",
        type=Path,
        default=_env_path("SWARM_ID_CAPATH") or _env_path("SWARM_ID_CACERT"),
        help="swarm CA certificate or directory",
    )


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def identity_from_args(args: argparse.Namespace, *, role: str) -> Identity | None:
    """The identity given on the command line, or None when no file is given."""
    given = [p for p in (args.cert, args.key, args.capath) if p is not None]
    if not given:
        return None
    if args.cert is None or args.key is None or args.capath is None:
        raise IdentityError("an identity needs --cert, --key and --capath together")
    return Identity.load(args.cert, args.key, args.capath, role=role)
