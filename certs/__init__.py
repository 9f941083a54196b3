"""PKI for the swarm: CA and node identities, TLS contexts, message signing and verifying.

It may import ``wire`` (for the signer/verifier protocols and codec errors), nothing else of the project.
"""

from certs.pki import (
    DEFAULT_SANS,
    ROLES,
    CAFiles,
    CertError,
    IdentityFiles,
    IdentityInfo,
    cert_sans,
    cert_uid_role,
    check_identity,
    create_ca,
    init_swarm,
    issue_identity,
    load_ca_certs,
    load_certificate,
    load_certificates,
    load_private_key,
)
from certs.signing import Signer, Verifier
from certs.tls import client_context, server_context

__all__ = [
    "DEFAULT_SANS",
    "ROLES",
    "CAFiles",
    "CertError",
    "IdentityFiles",
    "IdentityInfo",
    "Signer",
    "Verifier",
    "cert_sans",
    "cert_uid_role",
    "check_identity",
    "client_context",
    "create_ca",
    "init_swarm",
    "issue_identity",
    "load_ca_certs",
    "load_certificate",
    "load_certificates",
    "load_private_key",
    "server_context",
]
