"""Deterministic allocation of a task's units (SL slots or SWOP runs) to enrolled SWOPs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contracts.tx import RejectError

__all__ = ["Allocation", "Offer", "allocate"]


@dataclass(frozen=True, slots=True)
class Offer:
    """An online SWOP enrolled on the taskrunner and how many SL nodes it can start."""

    uid: str
    capacity: int


@dataclass(frozen=True, slots=True)
class Allocation:
    """Units per SWOP and how many units must complete for the task to be COMPLETE."""

    units: dict[str, int]
    required: int


def allocate(
    runner: str, swarm: bool, peers: int | str | None, target: str | None, offers: Sequence[Offer]
) -> Allocation:
    """Allocate per docs/ledger.md; ``offers`` sorted by uid; ``swarm`` for RUN_SWARM tasks.

    Raises:
        RejectError: naming the numbers when the SWOPs cannot supply what is asked.
    """
    if not offers:
        raise RejectError(f"no online SWOP is enrolled on taskrunner {runner!r}; start a SWOP for it first")
    if target is not None:
        return _targeted(runner, swarm, target, offers)
    if peers is None:
        raise RejectError("taskrunner.assign needs peers (a number or ALL) or a target")
    if swarm:
        return _swarm(runner, peers, offers)
    return _per_swop(runner, peers, offers)


def _targeted(runner: str, swarm: bool, target: str, offers: Sequence[Offer]) -> Allocation:
    offer = next((o for o in offers if o.uid == target), None)
    if offer is None:
        names = ", ".join(o.uid for o in offers)
        raise RejectError(
            f"SWOP {target!r} is not an online SWOP enrolled on taskrunner {runner!r} (those are: {names})"
        )
    units = offer.capacity if swarm else 1
    if units < 1:
        raise RejectError(f"SWOP {target!r} has no SL node to start (its capacity is 0)")
    return Allocation({target: units}, units)


def _describe(offers: Sequence[Offer]) -> str:
    return ", ".join(f"{o.uid}: {o.capacity}" for o in offers)


def _swarm(runner: str, peers: int | str, offers: Sequence[Offer]) -> Allocation:
    total = sum(o.capacity for o in offers)
    if peers == "ALL":
        if total < 1:
            raise RejectError(f"the SWOPs enrolled on taskrunner {runner!r} have no SL nodes to start")
        return Allocation({o.uid: o.capacity for o in offers if o.capacity}, total)
    wanted = int(peers)
    if total < wanted:
        raise RejectError(
            f"WITH {wanted} PEERS needs {wanted} SL slots but the {len(offers)} online SWOP(s) enrolled "
            f"on taskrunner {runner!r} offer {total} ({_describe(offers)})"
        )
    units = dict.fromkeys((o.uid for o in offers), 0)
    left = wanted
    while left:
        for offer in offers:
            if left and units[offer.uid] < offer.capacity:
                units[offer.uid] += 1
                left -= 1
    return Allocation({uid: n for uid, n in units.items() if n}, wanted)


def _per_swop(runner: str, peers: int | str, offers: Sequence[Offer]) -> Allocation:
    wanted = len(offers) if peers == "ALL" else int(peers)
    if len(offers) < wanted:
        names = ", ".join(o.uid for o in offers)
        raise RejectError(
            f"WITH {wanted} PEERS needs {wanted} SWOPs but only {len(offers)} online SWOP(s) are "
            f"enrolled on taskrunner {runner!r} ({names})"
        )
    return Allocation({o.uid: 1 for o in offers[:wanted]}, wanted)
