"""Identity commands (ours): revoke a node identity, list the revoked ones."""

from __future__ import annotations

from swci.argtypes import ArgKind
from swci.commands import ListRevokedIdentities, RevokeIdentity
from swci.pattern import Arg, Opt
from swci.registry import Family, Values, command

__all__: list[str] = []

_FAMILY = Family.SESSION


@command(
    ("REVOKE", "IDENTITY"),
    family=_FAMILY,
    grammar=(
        Arg("identity", ArgKind.NODE, "identity", "the identity (certificate CN)"),
        Opt(Arg("reason", ArgKind.TEXT, "reason", "the reason")),
    ),
    summary="Revoke a node identity: the ledger refuses it from then on (ours)",
    help=(
        "Records in the ledger that the identity (a certificate's CN, e.g. sl-2) is revoked. From then "
        "on the SN refuses its transactions, and every node it registered, or vouched for, goes offline. "
        "Quote a reason that contains spaces."
    ),
    examples=("REVOKE IDENTITY sl-2", 'REVOKE IDENTITY sl-2 "key left the building"'),
)
def _revoke(values: Values) -> RevokeIdentity:
    return RevokeIdentity(values.text("identity"), values.opt_text("reason") or "")


@command(
    ("LIST", "REVOKED", "IDENTITIES"),
    family=_FAMILY,
    summary="List the revoked identities (ours)",
    help="Lists every revoked identity with who revoked it, when and why.",
    examples=("LIST REVOKED IDENTITIES",),
)
def _list_revoked(values: Values) -> ListRevokedIdentities:
    return ListRevokedIdentities()
