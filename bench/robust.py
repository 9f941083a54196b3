"""One bad peer against each merge method: final accuracy, clean vs poisoned, on ``load_digits``.

An in-process simulation of sync rounds that takes the leader's real path: every peer trains a small
torch MLP on its share of the digits for one local epoch from the last merged model, its weights go into
a flat uint8 row, and the leader screens the rows (``daemons.sl.screening.screen``), sets the weights
(``merge_weights``) and merges (``merge_flat``) exactly as ``RoundEngine`` does. One peer of 4 or 5 is
bad: it sends its weights x100, all 1e30, sign-flipped, NaN, or sign-flipped with a declared sample count
of one million. The row's ratio is poisoned accuracy / clean accuracy of the same method and peer count;
the target is a loss of less than one accuracy point. ``mean`` is not robust by design (its rows have no
target); ``mean+bound`` is mean with the contract's ``max_update_norm`` set, which leaves the attacker
out whenever its update is larger than the bound.

Run: ``.venv/bin/python bench/robust.py [--quick]``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import make_row, print_rows, quick_flag
from daemons.sl.merge import MergeOptions, TensorLayout, merge_flat
from daemons.sl.screening import merge_weights, required_rows, screen

__all__ = ["run", "simulate"]

METHODS = ("coordmedian", "trimmedmean", "krum", "geomedian", "mean", "mean+bound")
ATTACKS = ("x100", "1e30", "signflip", "nan", "samples")
PEER_COUNTS = (4, 5)
ROUNDS = 12
MIN_PEERS = 2
HIDDEN = 32
UPDATE_BOUND = 5.0  # max_update_norm of "mean+bound": several times an honest update's norm (about 0.5-1.5)
_ALIGN = 64


@dataclass(frozen=True)
class Data:
    """Train shards (one per peer) and the test set."""

    shards: list[tuple[torch.Tensor, torch.Tensor]]
    test: tuple[torch.Tensor, torch.Tensor]


@functools.cache
def _data(peers: int) -> Data:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x / 16.0, y, test_size=0.3, random_state=0, stratify=y
    )
    parts = np.array_split(np.random.default_rng(0).permutation(len(x_train)), peers)
    shards = [
        (torch.tensor(x_train[p], dtype=torch.float32), torch.tensor(y_train[p], dtype=torch.long))
        for p in parts
    ]
    return Data(shards, (torch.tensor(x_test, dtype=torch.float32), torch.tensor(y_test, dtype=torch.long)))


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 10))


def _layout(model: torch.nn.Module) -> tuple[list[TensorLayout], int]:
    layout: list[TensorLayout] = []
    offset = 0
    for name, tensor in model.state_dict().items():
        nbytes = tensor.numel() * 4
        layout.append((name, "float32", tuple(tensor.shape), offset, nbytes))
        offset = -(-(offset + nbytes) // _ALIGN) * _ALIGN
    return layout, offset


def _to_row(model: torch.nn.Module, layout: Sequence[TensorLayout], row: np.ndarray) -> None:
    row[:] = 0
    state = model.state_dict()
    for name, _, _, offset, nbytes in layout:
        row[offset : offset + nbytes].view(np.float32)[:] = state[name].numpy().ravel()


def _from_row(model: torch.nn.Module, layout: Sequence[TensorLayout], row: np.ndarray) -> None:
    state = {
        name: torch.from_numpy(row[offset : offset + nbytes].view(np.float32).reshape(shape).copy())
        for name, _, shape, offset, nbytes in layout
    }
    model.load_state_dict(state)


def _train(model: torch.nn.Module, shard: tuple[torch.Tensor, torch.Tensor], seed: int) -> None:
    x, y = shard
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    for start in range(0, len(x), 32):
        batch = order[start : start + 32]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
        opt.step()


def _poison(row: np.ndarray, layout: Sequence[TensorLayout], attack: str) -> None:
    for _, _, _, offset, nbytes in layout:
        values = row[offset : offset + nbytes].view(np.float32)
        if attack == "x100":
            values *= 100
        elif attack == "1e30":
            values[:] = 1e30
        elif attack in ("signflip", "samples"):
            values *= -1
        elif attack == "nan":
            values[:] = np.nan


def _accuracy(model: torch.nn.Module, test: tuple[torch.Tensor, torch.Tensor]) -> float:
    with torch.no_grad():
        return float((model(test[0]).argmax(dim=1) == test[1]).float().mean()) * 100


def simulate(method: str, peers: int, attack: str | None, rounds: int = ROUNDS) -> dict[str, Any]:
    """Train ``rounds`` sync rounds; peer 0 is bad when ``attack`` is given. Final accuracy and exclusions."""
    torch.set_num_threads(1)  # small tensors: threads cost more than they give, and the machine is shared
    data = _data(peers)
    model = _model()
    layout, total = _layout(model)
    merged = np.empty(total, dtype=np.uint8)
    _to_row(model, layout, merged)
    rows = np.empty((peers, total), dtype=np.uint8)
    uids = [f"sl-{i}" for i in range(peers)]
    algorithm, bound = ("mean", UPDATE_BOUND) if method == "mean+bound" else (method, 0.0)
    options = MergeOptions()  # trim_ratio 0.1: trimmedmean still trims one row per side from 4 peers
    excluded = abandoned = 0
    for number in range(rounds):
        for peer in range(peers):
            _from_row(model, layout, merged)
            _train(model, data.shards[peer], seed=1000 * number + peer)
            _to_row(model, layout, rows[peer])
        declared = [float(len(shard[0])) for shard in data.shards]
        if attack is not None:
            _poison(rows[0], layout, attack)
            if attack == "samples":
                declared[0] = 1e6
        screened = screen(list(rows), uids, layout, base=merged, max_update_norm=bound)
        excluded += len(screened.excluded)
        keep = screened.keep
        if len(keep) < required_rows(MIN_PEERS, final=False):
            abandoned += 1  # the leader fails the round: every peer goes on from the last merged model
            continue
        weights = merge_weights(algorithm, [declared[i] for i in keep])
        merged = merge_flat(np.ascontiguousarray(rows[keep]), layout, weights, algorithm, options=options)
    _from_row(model, layout, merged)
    return {"accuracy": _accuracy(model, data.test), "excluded": excluded, "abandoned": abandoned}


def measure(quick: bool = False) -> list[dict[str, Any]]:
    """Every method x peer count x attack, against the clean run of the same method and peer count."""
    results = []
    for peers in PEER_COUNTS[:1] if quick else PEER_COUNTS:
        for method in METHODS:
            clean = simulate(method, peers, None)["accuracy"]
            for attack in ATTACKS:
                found = simulate(method, peers, attack)
                results.append({"method": method, "peers": peers, "attack": attack, "clean": clean, **found})
    return results


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Table rows: poisoned vs clean accuracy; target: less than one point lost (robust methods)."""
    rows = []
    for r in measure(quick):
        robust = r["method"] != "mean"
        floor = (r["clean"] - 1.0) / r["clean"] if r["clean"] > 0 else 0.0
        note = (
            f"{r['clean'] - r['accuracy']:+.2f} points lost; {r['excluded']} rows excluded, "
            f"{r['abandoned']} of {ROUNDS} rounds abandoned"
        )
        rows.append(
            make_row(
                f"{r['method']}, {r['peers']} peers, one sends {r['attack']}",
                round(r["accuracy"], 2), "% accuracy",
                f"{r['method']} with no bad peer", round(r["clean"], 2),
                target=f"ratio > {floor:.4f}" if robust else "",
                note=note if robust else f"{note}; mean is not robust by design",
            )
        )  # fmt: skip
    return rows


def main() -> None:
    """Print the table."""
    quick = quick_flag(__doc__, "the first peer count only")
    print_rows("One bad peer: final accuracy on load_digits, poisoned vs clean", run(quick))


if __name__ == "__main__":
    main()
