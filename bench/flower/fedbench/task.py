"""What both sides of the Flower comparison share: the example's CNN, its data, one round of training.

The model, the data loading and the evaluation are the mnist-pyt example's own (``Net``, ``load_data``,
``evaluate`` of ``examples/mnist-pyt/model/mnist_pyt.py``), loaded from the file the ``MNIST_PYT`` environment
variable or the caller names. A round is ``local_epochs`` whole passes over the node's shard in batches of
``batch_size`` (``round_steps``), in an order fixed by the node's partition and the round number, with a
fresh Adam optimizer (the same on both sides), on one torch thread.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

__all__ = ["evaluate", "example", "load_shard", "make_net", "round_steps", "train_round"]

LEARNING_RATE = 1e-3
SEED = 0


@cache
def example(path: str | None = None) -> ModuleType:
    """The example's model program as a module (importing it runs no training)."""
    source = Path(path or os.environ["MNIST_PYT"])
    spec = importlib.util.spec_from_file_location("mnist_pyt_example", source)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the example's model program from {source}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    torch.set_num_threads(1)
    return module


def make_net(path: str | None = None) -> nn.Module:
    """The example's ``Net``, initialised from the same seed on every node and on the server."""
    torch.manual_seed(SEED)
    net: nn.Module = example(path).Net()
    return net


@cache
def load_shard(data_dir: str, path: str | None = None) -> tuple[TensorDataset, TensorDataset]:
    """The node's private ``mnist.npz`` in ``data_dir``, through the example's ``load_data``."""
    module = example(path)
    vars(module)["data_dir"] = Path(data_dir)  # where the example's load_data reads mnist.npz
    train, test = module.load_data()
    return train, test


def round_steps(data: TensorDataset, *, local_epochs: int, batch_size: int) -> int:
    """Batches in ``local_epochs`` whole passes over ``data``."""
    return local_epochs * math.ceil(len(data) / batch_size)


def _batches(data: TensorDataset, batch_size: int, seed: int) -> Iterator[Any]:
    generator = torch.Generator().manual_seed(seed)
    while True:
        yield from DataLoader(data, batch_size=batch_size, shuffle=True, generator=generator)


def round_batches(
    data: TensorDataset, *, partition: int, rnd: int, steps: int, batch_size: int
) -> Iterator[Any]:
    """The ``steps`` batches of round ``rnd`` (1-based) of node ``partition``: the same on both sides."""
    batches = _batches(data, batch_size, 1000 * partition + rnd)
    for _ in range(steps):
        yield next(batches)


def train_round(
    model: nn.Module, data: TensorDataset, *, partition: int, rnd: int, steps: int, batch_size: int
) -> Iterator[None]:
    """Train ``steps`` batches; yields after each one (where the swarm side calls ``on_batch_end``)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for x, y in round_batches(data, partition=partition, rnd=rnd, steps=steps, batch_size=batch_size):
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
        yield


def evaluate(model: nn.Module, test: TensorDataset, path: str | None = None) -> float:
    """Test accuracy with the example's ``evaluate``."""
    return float(example(path).evaluate(model, DataLoader(test, batch_size=256)))
