"""A secure-aggregation round over a real broker: four nodes' buses, their holders and the leader's
four stages (real mosquitto, real X25519 and ChaCha20, real torch models); no ledger (the round's
facts are given as the ledger would give them)."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any

import numpy as np
import pytest
import torch

from daemons.bus import Bus, RemoteError, Request, RpcError
from daemons.bus.transfer import FETCH_METHOD, StateHolder
from daemons.sl.merge import merge_flat
from daemons.sl.privacy.secagg import SecAggError
from daemons.sl.secure_round import SECAGG_METHOD, RoundInfo, SecureRounds, lead
from tests.conftest import MakeBus
from wire.tensors import FlatState

UIDS = ("sl-a", "sl-b", "sl-c", "sl-d")
WEIGHTS = {"sl-a": 10.0, "sl-b": 20.0, "sl-c": 30.0, "sl-d": 40.0}
INFO = RoundInfo("mnist", 5, "sl-a", UIDS, WEIGHTS)


def _model(seed: int) -> FlatState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.BatchNorm1d(64), torch.nn.Linear(64, 10))
    model(torch.randn(16, 20))
    return FlatState.from_arrays({k: v.detach().numpy() for k, v in model.state_dict().items()})


class _Dropping(SecureRounds):
    """A node that goes away after sharing its keys (it never sends its masked row)."""

    async def answer(self, sender: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if body.get("stage") in ("mask", "reveal"):
            raise SecAggError(f"{self.uid} is gone")
        return await super().answer(sender, body)


async def _lookup(contract: str, number: int) -> RoundInfo | None:
    return INFO if (contract, number) == (INFO.contract, INFO.number) else None


def _serve(bus: Bus, holder: StateHolder, service: SecureRounds) -> None:
    async def handler(request: Request) -> Any:
        if request.method == FETCH_METHOD:
            return await holder.handle_fetch(request)
        if request.method == SECAGG_METHOD:
            return await service.handle(request)
        raise RpcError("unknown-method", request.method)

    bus.serve(handler)


async def _nodes(
    stack: AsyncExitStack, make_bus: MakeBus, models: Mapping[str, FlatState], dropping: str | None = None
) -> dict[str, tuple[Bus, SecureRounds]]:
    nodes = {}
    for uid in UIDS:
        bus = await stack.enter_async_context(make_bus(uid, "sl"))
        holder = StateHolder(bus)
        service = (_Dropping if uid == dropping else SecureRounds)(bus, holder, _lookup)
        service.offer(INFO.contract, INFO.number, models[uid])
        _serve(bus, holder, service)
        nodes[uid] = (bus, service)
    return nodes


def _plain_mean(models: Mapping[str, FlatState]) -> FlatState:
    like = next(iter(models.values()))
    layout = [(s.name, s.dtype, s.shape, s.offset, s.nbytes) for s in like.specs]
    rows = np.stack([m.buffer for m in models.values()])
    return FlatState(like.specs, merge_flat(rows, layout, [WEIGHTS[u] for u in models], "mean"))


def _assert_close(got: FlatState, want: FlatState) -> None:
    for spec in want.specs:
        if spec.dtype == "float32":
            np.testing.assert_allclose(
                got.view(spec), want.view(spec), rtol=1e-5, atol=1e-7
            )  # merge_flat sums float32 in float32
        else:
            assert np.array_equal(got.view(spec), want.view(spec)), spec.name


async def test_the_leader_merges_masked_rows_into_the_weighted_mean(make_bus: MakeBus) -> None:
    models = {uid: _model(i) for i, uid in enumerate(UIDS)}
    async with AsyncExitStack() as stack:
        nodes = await _nodes(stack, make_bus, models)
        bus, service = nodes["sl-a"]
        merged, survivors = await lead(bus, service, INFO, models["sl-a"], timeout=5.0)
    assert survivors == list(UIDS)
    _assert_close(merged, _plain_mean(models))


async def test_a_node_that_drops_after_sharing_keys_is_unmasked_away(make_bus: MakeBus) -> None:
    models = {uid: _model(10 + i) for i, uid in enumerate(UIDS)}
    async with AsyncExitStack() as stack:
        nodes = await _nodes(stack, make_bus, models, dropping="sl-d")
        bus, service = nodes["sl-a"]
        merged, survivors = await lead(bus, service, INFO, models["sl-a"], timeout=5.0)
    assert survivors == ["sl-a", "sl-b", "sl-c"]
    _assert_close(merged, _plain_mean({u: models[u] for u in survivors}))


async def test_only_the_ledgers_leader_gets_answers(make_bus: MakeBus) -> None:
    models = {uid: _model(i) for i, uid in enumerate(UIDS)}
    async with AsyncExitStack() as stack:
        nodes = await _nodes(stack, make_bus, models)
        intruder = nodes["sl-c"][0]
        with pytest.raises(RemoteError, match="'sl-c' is not the leader of round 5"):
            await intruder.request(
                "sl-b", SECAGG_METHOD, {"contract": "mnist", "round": 5, "stage": "advertise"}
            )
        with pytest.raises(RemoteError, match="offered no model to round 6"):
            await intruder.request(
                "sl-b", SECAGG_METHOD, {"contract": "mnist", "round": 6, "stage": "advertise"}
            )
        with pytest.raises(RemoteError, match="not the leader this node advertised"):
            await intruder.request(
                "sl-b", SECAGG_METHOD, {"contract": "mnist", "round": 5, "stage": "reveal"}
            )


async def test_a_participant_masks_only_once_for_a_leader(
    make_bus: MakeBus, caplog: pytest.LogCaptureFixture
) -> None:
    """A leader that asked twice could subtract two sums over different survivors: refused."""
    models = {uid: _model(i) for i, uid in enumerate(UIDS)}
    async with AsyncExitStack() as stack:
        nodes = await _nodes(stack, make_bus, models)
        bus, service = nodes["sl-a"]
        await lead(bus, service, INFO, models["sl-a"], timeout=5.0)
        with pytest.raises(SecAggError, match=r"only 0 peer\(s\) advertised keys"):
            await lead(bus, service, INFO, models["sl-a"], timeout=5.0)
    assert "'sl-b' has sent its masked model to 'sl-a' for round 5 already" in caplog.text
