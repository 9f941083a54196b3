"""What adsValData costs: bounded evaluations, on the documented schedule, and the adaptive sync rule.

Unit tests: the policy is pure; the callback's schedule is checked with its SL exchange replaced by a
stand-in that answers like an SL (no socket), with real torch models and DataLoaders.
"""

from __future__ import annotations

import re
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from swarmlearning.client.adaptive import AdaptiveSync
from swarmlearning.client.swarm import DEFAULT_VAL_BATCHES, SwarmError
from swarmlearning.pyt import SwarmCallback
from tests.conftest import RunningSN
from tests.swarm_helpers import start_sl


# ------------------------------------------------------------------------------------- the policy
def test_the_interval_doubles_while_improving_up_to_the_cap() -> None:
    policy = AdaptiveSync(8, max_factor=4)
    assert policy.update(1.0) == 8  # the first value only sets the reference
    assert policy.update(0.9) == 16
    assert policy.update(0.8) == 32
    assert policy.update(0.7) == 32  # capped at 4 x 8


def test_the_interval_halves_when_stalling_or_degrading_down_to_the_base() -> None:
    policy = AdaptiveSync(8, max_factor=8)
    for value in (1.0, 0.5, 0.25, 0.1):
        policy.update(value)
    assert policy.interval == 64
    assert policy.update(0.0999) == 32  # within the 1 % tolerance: stalling
    assert policy.update(0.2) == 16  # worse
    assert policy.update(0.3) == 8
    assert policy.update(0.4) == 8  # never below syncFrequency


def test_a_metric_where_higher_is_better_counts_rises_as_improvement() -> None:
    policy = AdaptiveSync(4)
    policy.update(0.5, lower_is_better=False)
    assert policy.update(0.7, lower_is_better=False) == 8
    assert policy.update(0.6, lower_is_better=False) == 4


def test_missing_or_non_finite_values_change_nothing() -> None:
    policy = AdaptiveSync(4)
    policy.update(1.0)
    assert policy.update(None) == 4
    assert policy.update(float("nan")) == 4
    assert policy.update(0.5) == 8  # compared with 1.0, the last real value


def test_the_policy_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="base"):
        AdaptiveSync(0)
    with pytest.raises(ValueError, match="power of two"):
        AdaptiveSync(8, max_factor=3)


# ----------------------------------------------------------------------------------- the callback
class CountingDataset(TensorDataset):
    """A dataset that counts the samples read from it."""

    def __init__(self, n: int) -> None:
        x = torch.randn(n, 4, generator=torch.Generator().manual_seed(1))
        super().__init__(x, (x[:, 0] > 0).long())
        self.reads = 0

    def __getitem__(self, index: Any) -> Any:
        self.reads += 1
        return super().__getitem__(index)


class StandInSL(SwarmCallback):
    """SwarmCallback whose SL is a stand-in: a sync returns the same weights and a round number."""

    def _open_session(self) -> None:
        self.calls: list[str] = []

    def _exchange(self, op: str, header: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(op)
        return {"round": len(self.calls), "next_sync_interval": self.params.sync_frequency}

    def _call(self, op: str, header: dict[str, Any], flat: Any = None) -> dict[str, Any]:
        self.calls.append(op)
        return {"op": "ok"}


def _callback(val: CountingDataset, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> StandInSL:
    monkeypatch.delenv("SWARM_LOOPBACK", raising=False)
    model = torch.nn.Linear(4, 2)
    args: dict[str, Any] = {"model": model, "adsValData": DataLoader(val, batch_size=8)}
    return StandInSL(4, 1, lossFunction="CrossEntropyLoss", totalEpochs=2, **args, **kwargs)


def _train(cb: SwarmCallback, epochs: int, batches: int) -> None:
    cb.on_train_begin()
    for epoch in range(epochs):
        for batch in range(batches):
            cb.on_batch_end(batch)
        cb.on_epoch_end(epoch)
    cb.on_train_end()


def test_without_adaptive_sync_validation_runs_once_per_epoch_on_a_few_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    val = CountingDataset(800)  # 100 batches of 8
    cb = _callback(val, monkeypatch)
    _train(cb, epochs=3, batches=16)  # 4 syncs per epoch
    assert cb.syncs_done == 12
    assert cb.val_batches_evaluated == 3 * DEFAULT_VAL_BATCHES
    assert val.reads == 3 * DEFAULT_VAL_BATCHES * 8
    assert cb.last_loss is not None


def test_adsvalbatches_sets_the_bound_and_none_means_the_whole_set(monkeypatch: pytest.MonkeyPatch) -> None:
    cb = _callback(CountingDataset(800), monkeypatch, adsValBatches=2)
    _train(cb, epochs=2, batches=4)
    assert cb.val_batches_evaluated == 2 * 2
    whole = _callback(CountingDataset(80), monkeypatch, adsValBatches=None)
    _train(whole, epochs=2, batches=4)
    assert whole.val_batches_evaluated == 2 * 10


def test_with_adaptive_sync_each_round_is_evaluated_within_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    cb = _callback(CountingDataset(800), monkeypatch, useAdaptiveSync=True, adsValBatches=3)
    _train(cb, epochs=2, batches=16)
    assert cb.syncs_done >= 1
    assert cb.val_batches_evaluated == 3 * cb.syncs_done
    assert cb.adaptive is not None and cb.steps_before_sync in (4, 8, 16, 32)


def test_adaptive_sync_follows_the_policy_in_the_training_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model that keeps getting better (it is trained between syncs) syncs less and less often."""
    torch.manual_seed(0)
    x = torch.randn(512, 4, generator=torch.Generator().manual_seed(2))
    y = (x[:, 0] > 0).long()
    cb = _callback(CountingDataset(64), monkeypatch, useAdaptiveSync=True)
    cb.val_loader = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=16)
    opt = torch.optim.SGD(cb.model.parameters(), lr=0.05)
    intervals = []
    cb.on_train_begin()
    for step in range(64):
        lo = step * 8 % 512
        opt.zero_grad()
        torch.nn.functional.cross_entropy(cb.model(x[lo : lo + 8]), y[lo : lo + 8]).backward()
        opt.step()
        before = cb.syncs_done
        cb.on_batch_end(step)
        if cb.syncs_done > before:
            intervals.append(cb.steps_before_sync)
    assert intervals[0] == 4  # the first round sets the reference value
    assert max(intervals) > 4  # and a steadily falling loss lengthens the interval
    assert all(b in (a * 2, a // 2, a) for a, b in pairwise(intervals))


def test_loopback_evaluates_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWARM_LOOPBACK", "true")
    val = CountingDataset(80)
    cb = SwarmCallback(4, 1, model=torch.nn.Linear(4, 2), adsValData=DataLoader(val, batch_size=8),
                       lossFunction="CrossEntropyLoss", totalEpochs=1)  # fmt: skip
    _train(cb, epochs=2, batches=8)
    assert val.reads == 0 and cb.val_batches_evaluated == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"adsValBatches": 0}, "adsValBatches"),
        ({"adsValBatches": "4"}, "adsValBatches"),
        ({"useAdaptiveSync": True, "adsValData": None}, "needs adsValData"),
        ({"useAdaptiveSync": True, "lossFunction": None}, "needs lossFunction or metricFunction"),
    ],
)
def test_bad_validation_settings_are_refused(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], message: str
) -> None:
    monkeypatch.setenv("SWARM_LOOPBACK", "true")
    args: dict[str, Any] = {
        "model": torch.nn.Linear(4, 2),
        "adsValData": DataLoader(CountingDataset(8), batch_size=8),
        "lossFunction": "CrossEntropyLoss",
        **kwargs,
    }
    with pytest.raises(SwarmError, match=message):
        SwarmCallback(4, 1, **args)


# ----------------------------------------------------------------------------------- a real swarm
@pytest.mark.slow
@pytest.mark.parametrize("overlap", ["", "true"], ids=["blocking", "overlapped"])
def test_nodes_under_adaptive_sync_meet_in_rounds_and_end_with_one_model(
    sn: RunningSN, tmp_path: Path, overlap: str
) -> None:
    """Two real SLs with useAdaptiveSync: each picks its own interval, rounds close on quorum, both end.

    Validation is bounded: 1 batch per round (the program prints its syncs and batches evaluated); with
    overlapped sync, one per merge taken in.
    """
    env: dict[str, object] = {"MIN_PEERS": 2, "ADAPTIVE": 1, "VAL_BATCHES": 1, "SYNC_FREQ": 2, "EPOCHS": 1}
    env |= {"BATCHES": 16, "SWARM_OVERLAP_SYNC": overlap}
    nodes = [start_sl(sn, f"ads-{i}", tmp_path, SEED=i, **env) for i in (1, 2)]
    codes = [node.wait() for node in nodes]
    assert codes == [0, 0], [n.output()[-2000:] for n in nodes]
    assert len({node.final_digest() for node in nodes} - {None}) == 1
    for node in nodes:
        found = re.search(r"SYNCS (\d+) VAL_BATCHES_EVALUATED (\d+)", node.output())
        assert found is not None, node.output()[-2000:]
        syncs, evaluated = int(found[1]), int(found[2])
        assert 1 <= syncs <= 8 and evaluated == syncs
        assert "next sync in" in node.output()
        assert ("taken in while training went on" in node.output()) == bool(overlap)
