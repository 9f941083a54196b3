"""Secure aggregation of a mean sync round over the bus (see ``docs/privacy.md``).

A participant that checked in under secure aggregation *offers* its model for the round instead of
serving it; the round's leader then drives the four stages of :mod:`daemons.sl.privacy.secagg` with
one request method (``secagg``, field ``stage``) to every participant: ``advertise`` (its public keys),
``share`` (its sealed key shares for the others), ``mask`` (open the shares meant for it, mask its
weighted model for the group and serve the masked row, answering its digest), and ``reveal`` (the
shares that remove the masks of the survivors and of the peers that dropped). The leader pulls the
masked rows like any model (``fetch_state``), unmasks their sum and decodes the weighted mean.

A participant answers only the round's leader as the ledger names it (``lookup``), and only for a
round it offered a model to; a peer that does not answer a stage in time is left out of the round
(before ``mask``: it is not in the group; after: it dropped, and the survivors' shares remove its masks).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from contracts.views import find_round
from daemons.bus import Bus, BusError
from daemons.bus.rpc import Request, RpcError
from daemons.bus.transfer import StateHolder, TransferError, fetch_state
from daemons.ledger_client import LedgerClient
from daemons.sl.privacy import messages
from daemons.sl.privacy.secagg import Advert, Aggregator, Peer, Reveal, SealedShare, SecAggError, Words
from daemons.sl.privacy.secure_mean import decode_mean, masked_model, new_peer, session_id, threshold_for
from wire.tensors import FlatState, layout_of

__all__ = ["SECAGG_METHOD", "RoundInfo", "SecureRounds", "lead", "ledger_lookup", "round_info"]

log = logging.getLogger("swarm.sl.secagg")
SECAGG_METHOD = "secagg"
_STAGES = ("advertise", "share", "mask", "reveal")
_MASKED = "masked"
T = TypeVar("T")


@dataclass(frozen=True)
class RoundInfo:
    """What the ledger says of a closed round: its leader, its participants and their public weights."""

    contract: str
    number: int
    leader: str
    participants: tuple[str, ...]
    weights: Mapping[str, float]


Lookup = Callable[[str, int], Awaitable[RoundInfo | None]]


def round_info(contract: str, number: int, rnd: Mapping[str, Any]) -> RoundInfo:
    """A round of a ``contract.rounds`` view as :class:`RoundInfo` (weights from its check-ins)."""
    checkins = {c["uid"]: c for c in rnd.get("checkins") or []}
    participants = tuple(uid for uid in rnd.get("participants") or [] if uid in checkins)
    weights = {uid: float(checkins[uid].get("weight") or 0.0) for uid in participants}
    return RoundInfo(contract, number, str(rnd.get("leader") or ""), participants, weights)


def ledger_lookup(ledger: LedgerClient) -> Lookup:
    """A lookup that reads closed rounds from the ledger."""

    async def lookup(contract: str, number: int) -> RoundInfo | None:
        view = await ledger.query("contract.rounds", name=contract)
        rnd = find_round(view, number)
        if rnd is None or rnd.get("status") != "CLOSED":
            return None
        return round_info(contract, number, rnd)

    return lookup


@dataclass
class _Slot:
    """A participant's state for one round: its model and, once the leader asked, its keys."""

    flat: FlatState
    info: RoundInfo | None = None
    peer: Peer | None = None


def _masked_state(words: Words) -> FlatState:
    specs, total = layout_of([(_MASKED, "int64", (int(words.size),))])
    buffer = np.zeros(total, dtype=np.uint8)
    buffer[: words.nbytes] = words.view(np.uint8)
    return FlatState(specs, buffer)


def _words(flat: FlatState, size: int, who: str) -> Words:
    spec = flat.specs[0] if len(flat.specs) == 1 else None
    if spec is None or spec.name != _MASKED or spec.dtype != "int64" or spec.shape != (size,):
        raise SecAggError(f"the masked row of {who!r} is not one int64 tensor of {size} values")
    return flat.view(spec).view(np.uint64)


class SecureRounds:
    """A participant's side of secure rounds: the models it offered, answering the leader's stages."""

    def __init__(self, bus: Bus, holder: StateHolder, lookup: Lookup, *, keep: int = 4) -> None:
        self.bus = bus
        self.holder = holder
        self._lookup = lookup
        self._keep = keep
        self._slots: OrderedDict[tuple[str, int], _Slot] = OrderedDict()

    @property
    def uid(self) -> str:
        """This node."""
        return self.bus.uid

    def offer(self, contract: str, number: int, flat: FlatState) -> None:
        """``flat`` is this node's model for round ``number`` of ``contract``; it is never served as is."""
        self._slots[(contract, number)] = _Slot(flat)
        self._slots.move_to_end((contract, number))
        while len(self._slots) > self._keep:
            self._slots.popitem(last=False)

    async def handle(self, request: Request) -> dict[str, Any]:
        """RPC handler for ``secagg``."""
        try:
            return await self.answer(request.sender, request.body)
        except ValueError as exc:  # SecAggError, and a model the fixed-point encoding cannot hold
            raise RpcError("secagg-refused", str(exc)) from None

    async def answer(self, sender: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """One stage for ``sender`` (it must be the round's leader); raises SecAggError saying why not."""
        contract, number, stage = body.get("contract"), body.get("round"), body.get("stage")
        if not isinstance(contract, str) or isinstance(number, bool) or not isinstance(number, int):
            raise SecAggError("a secagg request needs 'contract' (str) and 'round' (int)")
        if stage not in _STAGES:
            raise SecAggError(f"unknown secagg stage {stage!r}; one of {', '.join(_STAGES)}")
        slot = self._slots.get((contract, number))
        if slot is None:
            raise SecAggError(f"{self.uid!r} offered no model to round {number} of {contract!r}")
        if stage == "advertise":
            return await self._advertise(slot, sender, contract, number)
        if slot.peer is None or slot.info is None or slot.info.leader != sender:
            raise SecAggError(
                f"{sender!r} is not the leader this node advertised its keys to for round {number}"
            )
        if stage == "share":
            adverts = [
                messages.advert_from_wire(a, "adverts[]") for a in _list(body.get("adverts"), "adverts")
            ]
            strangers = sorted({a.uid for a in adverts} - set(slot.info.participants))
            if strangers:
                raise SecAggError(
                    f"adverts of {', '.join(strangers)}, which are not participants of round {number}"
                )
            return {"sealed": [messages.sealed_to_wire(s) for s in slot.peer.share_keys(adverts)]}
        if stage == "mask":
            return await self._mask(slot, slot.peer, slot.info, body)
        survivors = [str(u) for u in _list(body.get("survivors"), "survivors")]
        return {"reveal": messages.reveal_to_wire(slot.peer.reveal(survivors))}

    async def _advertise(self, slot: _Slot, sender: str, contract: str, number: int) -> dict[str, Any]:
        info = await self._lookup(contract, number)
        if info is None or info.leader != sender:
            raise SecAggError(f"{sender!r} is not the leader of round {number} of {contract!r} on the ledger")
        if self.uid not in info.participants:
            raise SecAggError(f"{self.uid!r} is not a participant of round {number} of {contract!r}")
        if (
            slot.peer is not None
            and slot.peer.masked
            and slot.info is not None
            and slot.info.leader == sender
        ):
            # a second masking for the same leader could let it subtract two different sums
            raise SecAggError(
                f"{self.uid!r} has sent its masked model to {sender!r} for round {number} already"
            )
        slot.info = info
        slot.peer = new_peer(self.uid, contract, number, len(info.participants), leader=info.leader)
        return {"advert": messages.advert_to_wire(slot.peer.advertise())}

    async def _mask(
        self, slot: _Slot, peer: Peer, info: RoundInfo, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        inbox = [messages.sealed_from_wire(s, "sealed[]") for s in _list(body.get("sealed"), "sealed")]
        group = [str(u) for u in _list(body.get("group"), "group")]
        peer.receive_shares(inbox)
        words = await asyncio.to_thread(masked_model, peer, slot.flat, info.weights, group)
        manifest = await self.holder.add(_masked_state(words))
        return {"digest": manifest.digest}


def _list(raw: Any, what: str) -> list[Any]:
    if not isinstance(raw, list) or len(raw) > messages.MAX_PEERS * messages.MAX_PEERS:
        raise SecAggError(f"'{what}' must be a list")
    return raw


async def _each(uids: Iterable[str], stage: str, call: Callable[[str], Awaitable[T]]) -> dict[str, T]:
    """``call(uid)`` for every uid at once; those that fail are logged and left out."""

    async def one(uid: str) -> tuple[str, T | None]:
        try:
            return uid, await call(uid)
        except (BusError, SecAggError, TransferError) as exc:
            log.warning("secure aggregation: leaving %s out at stage %s: %s", uid, stage, exc)
            return uid, None

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(uid)) for uid in uids]
    return {uid: out for uid, out in (t.result() for t in tasks) if out is not None}


async def lead(
    bus: Bus, service: SecureRounds, info: RoundInfo, like: FlatState, *, timeout: float = 10.0
) -> tuple[FlatState, list[str]]:
    """Drive a secure round as its leader: the weighted mean of the survivors and who they are."""
    threshold = threshold_for(len(info.participants))
    base = {"contract": info.contract, "round": info.number}

    async def ask(uid: str, stage: str, **extra: Any) -> dict[str, Any]:
        body = {**base, "stage": stage, **extra}
        if uid == bus.uid:
            return await service.answer(bus.uid, body)
        reply = await bus.request(uid, SECAGG_METHOD, body, timeout=timeout)
        if not isinstance(reply, dict):
            raise SecAggError(f"{uid!r} answered stage {stage} with {type(reply).__name__}")
        return reply

    async def advert(uid: str) -> Advert:
        found = messages.advert_from_wire((await ask(uid, "advertise")).get("advert"), f"advert of {uid!r}")
        if found.uid != uid:
            raise SecAggError(f"{uid!r} sent the advert of {found.uid!r}")
        return found

    adverts = await _each(info.participants, "advertise", advert)
    _enough(adverts, threshold, "advertised keys")
    wired = [messages.advert_to_wire(a) for a in adverts.values()]

    async def share(uid: str) -> list[SealedShare]:
        raw = _list((await ask(uid, "share", adverts=wired)).get("sealed"), "sealed")
        sealed = [messages.sealed_from_wire(s, f"a share of {uid!r}") for s in raw]
        if any(s.sender != uid for s in sealed) or {s.recipient for s in sealed} != set(adverts):
            raise SecAggError(f"{uid!r} sent shares that are not its own for every advertised peer")
        return sealed

    sealed = await _each(adverts, "share", share)
    _enough(sealed, threshold, "shared keys")
    group = sorted(sealed)
    inbox = Aggregator.route(s for uid in group for s in sealed[uid] if s.recipient in sealed)
    size = sum(int(np.prod(spec.shape, dtype=np.int64)) for spec in like.specs)

    async def masked(uid: str) -> Words:
        body = {"sealed": [messages.sealed_to_wire(s) for s in inbox[uid]], "group": group}
        digest = (await ask(uid, "mask", **body)).get("digest")
        if not isinstance(digest, bytes):
            raise SecAggError(f"{uid!r} answered no digest for its masked row")
        flat = service.holder.get(digest) if uid == bus.uid else None
        if flat is None:
            flat = await fetch_state(bus, uid, digest, idle_timeout=timeout)
        return _words(flat, size, uid)

    rows = await _each(group, "mask", masked)
    _enough(rows, threshold, "sent masked rows")
    survivors = sorted(rows)

    async def reveal(uid: str) -> Reveal:
        found = messages.reveal_from_wire((await ask(uid, "reveal", survivors=survivors)).get("reveal"))
        if found.sender != uid:
            raise SecAggError(f"{uid!r} sent the reveal of {found.sender!r}")
        return found

    reveals = await _each(survivors, "reveal", reveal)
    aggregator = Aggregator(session_id(info.contract, info.number, info.leader), threshold)
    total = await asyncio.to_thread(aggregator.unmask, adverts, group, rows, list(reveals.values()))
    merged = await asyncio.to_thread(decode_mean, total, group, survivors, info.weights, like)
    dropped = sorted(set(info.participants) - set(survivors))
    log.info(
        "round %d of %s: unmasked the sum of %d masked models%s",
        info.number,
        info.contract,
        len(survivors),
        f" ({', '.join(dropped)} left out)" if dropped else "",
    )
    return merged, survivors


def _enough(found: Mapping[str, Any], threshold: int, what: str) -> None:
    if len(found) < threshold:
        raise SecAggError(
            f"only {len(found)} peer(s) {what} ({', '.join(sorted(found))}); {threshold} needed"
        )
