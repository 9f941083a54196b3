"""A contract's merge policy and its record of excluded rows.

The first ``contract.join`` pins how the contract merges (method, trim ratio, update-norm bound); a later
join asking for anything else is refused, so a node cannot switch the swarm to a weaker method for the
rounds it leads. A leader that leaves rows out of a merge names them (``excluded``); the contract and
the members keep a count and the last reason, for ``GET CONTRACT STATUS`` and ``PERFDATA``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from contracts.state import Contract, MergePolicy, Params, Round
from contracts.tx import RejectError

__all__ = ["MERGE_METHODS", "check_excluded", "pin", "policy_of", "record_exclusions"]

MERGE_METHODS = ("mean", "coordmedian", "geomedian", "trimmedmean", "krum")


def policy_of(params: Params, uid: str) -> MergePolicy:
    """The policy a member's join parameters ask for."""
    return MergePolicy(params.merge_method.lower(), params.trim_ratio, params.max_update_norm, uid)


def _describe(policy: MergePolicy) -> str:
    words = [f"mergeMethod={policy.method}"]
    if policy.method == "trimmedmean":
        words.append(f"trim_ratio={policy.trim_ratio:g}")
    words.append(f"max_update_norm={policy.max_update_norm:g}" if policy.max_update_norm else "no norm bound")
    return ", ".join(words)


def _same(a: MergePolicy, b: MergePolicy) -> bool:
    return (a.method, a.max_update_norm) == (b.method, b.max_update_norm) and (
        a.method != "trimmedmean" or a.trim_ratio == b.trim_ratio
    )


def pin(contract: Contract, params: Params, uid: str) -> Contract:
    """``contract`` with its merge policy: pinned now by this first join, or checked against ``params``.

    Raises:
        RejectError: an unknown method, or one other than the contract's.
    """
    asked = policy_of(params, uid)
    if asked.method not in MERGE_METHODS:
        raise RejectError(f"mergeMethod {asked.method!r} is not one of {', '.join(MERGE_METHODS)}")
    pinned = contract.merge
    if pinned is None:
        return replace(contract, merge=asked)
    if not _same(pinned, asked):
        raise RejectError(
            f"contract {contract.name!r} merges with {_describe(pinned)} (set by {pinned.set_by}, the first "
            f"node to join); {uid!r} asks for {_describe(asked)}. Use the contract's settings, or another "
            f"contract, or RESET CONTRACT {contract.name} once its training is over"
        )
    return contract


def check_excluded(
    rnd: Round, name: str, contributors: Iterable[str], excluded: tuple[tuple[str, str], ...]
) -> None:
    """Rows left out must be the round's participants and not also contributors.

    Raises:
        RejectError: naming the node that is wrong.
    """
    merged_from = set(contributors)
    for uid, _ in excluded:
        if uid not in rnd.participants:
            raise RejectError(f"excluded node {uid!r} did not take part in round {rnd.number} of {name!r}")
        if uid in merged_from:
            raise RejectError(f"node {uid!r} is both a contributor and excluded in round {rnd.number}")


def record_exclusions(contract: Contract, number: int, excluded: tuple[tuple[str, str], ...]) -> Contract:
    """Count each exclusion on the contract and on the member, with the last reason."""
    if not excluded:
        return contract
    members = dict(contract.members)
    for uid, reason in excluded:
        member = members.get(uid)
        if member is not None:
            members[uid] = replace(member, excluded=member.excluded + 1, excluded_reason=reason)
    uid, reason = excluded[-1]
    return replace(
        contract,
        members=members,
        exclusions=contract.exclusions + len(excluded),
        last_exclusion=f"round {number}: {uid}: {reason}",
    )
