"""The mnist-pyt example's program with the reference's model: a 784-512-10 MLP instead of the CNN.

Everything else (data, training loop, SwarmCallback, evaluation, result.json) is the example's own: this
loads ``$MNIST_PYT`` (the example's ``mnist_pyt.py``) as a module, swaps its ``Net`` and runs its ``main``.
The reference system's mnist-pyt example trains this MLP (dense 512, dropout 0.2, dense 10): 1.6 MB.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch
from torch import nn


class MLP(nn.Module):
    """784 -> 512 (ReLU, dropout 0.2) -> 10."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Dropout(0.2), nn.Linear(512, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def main() -> None:
    """Run the example's main with this model."""
    spec = importlib.util.spec_from_file_location("mnist_pyt", os.environ["MNIST_PYT"])
    if spec is None or spec.loader is None:
        sys.exit(f"cannot load the example from {os.environ['MNIST_PYT']}")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    vars(example)["Net"] = MLP
    example.main()


if __name__ == "__main__":
    main()
