"""What ``swarm swop`` checks at start, so that a profile's mistake is found before any SL runs.

Every node's ``privatedata`` source must exist (BIND) and every identity file too. A node's
certificate must fit it: its key matches, the swarm's CA issued it, it is valid now and its role (OU)
is ``sl`` (several nodes may share one SL certificate, as the reference's profiles do). With
certificates on the SWOP every node needs an identity (the broker requires mutual TLS); without them
no node may have one (the broker speaks plain MQTT). All problems are reported together, each naming
the profile's node.
"""

from __future__ import annotations

from pathlib import Path

from certs import CertError, check_identity
from daemons.identity import Identity
from daemons.swop.slpeers import sl_uid
from taskdefs import SlNodeDef, SwopProfile

__all__ = ["ProfileCheckError", "check_profile"]


class ProfileCheckError(ValueError):
    """The profile names files that are missing or certificates that do not fit its nodes."""


def _node(node: SlNodeDef, swop_uid: str) -> str:
    return f"node idx {node.idx} ({sl_uid(node, swop_uid)})"


def _missing_files(node: SlNodeDef, where: str) -> list[str]:
    problems = []
    data = node.privatedata
    if data is not None and data.m_type == "BIND" and not Path(data.src).exists():
        problems.append(f"{where}: privatedata src {data.src} does not exist")
    for entry in node.identity:
        attribute = entry.attribute
        if attribute.m_type == "BIND" and not Path(attribute.src).exists():
            problems.append(f"{where}: identity {attribute.a_type} src {attribute.src} does not exist")
    return problems


def _identity_problems(node: SlNodeDef, where: str, swop: Identity | None) -> list[str]:
    cert, key = node.identity_src("CERT"), node.identity_src("KEY")
    ca = node.identity_src("CAPATH") or node.identity_src("CACERT")
    if swop is None:
        if cert or key:
            return [f"{where}: has an identity, but this SWOP runs without certificates (plain MQTT)"]
        return []
    if not (cert and key and ca):
        return [
            f"{where}: this swarm uses certificates, so the node needs an identity with KEY, CERT and "
            "CAPATH attributes (its own SL certificate, e.g. from `swarm certs init`)"
        ]
    try:
        info = check_identity(cert, key, ca)
    except (CertError, OSError) as exc:
        return [f"{where}: {exc}"]
    if info.role != "sl":
        return [f"{where}: certificate {cert} is for role {info.role!r}, not 'sl'"]
    return []


def check_profile(profile: SwopProfile, source: Path, swop_uid: str, identity: Identity | None) -> None:
    """Check every node's files and certificates (see the module's docstring).

    Raises:
        ProfileCheckError: naming every problem found, one per line.
    """
    problems: list[str] = []
    for node in sorted(profile.node_defs, key=lambda n: n.idx):
        where = f"{source}: {_node(node, swop_uid)}"
        missing = _missing_files(node, where)
        problems += missing or _identity_problems(node, where, identity)
    if problems:
        raise ProfileCheckError("the profile does not fit this host:\n  " + "\n  ".join(problems))
