"""Weights between a GPU model and a host buffer in one copy each way.

A copy between pageable host memory and the GPU waits for the GPU, and with several training processes
sharing one GPU each wait can last a time slice of the others. Copying a model tensor by tensor pays
that wait once per tensor: 8 tensors of the mnist-pyt example's CNN took 3.2 ms to load on an H200 shared
by 4 nodes, the 4 of the reference's MLP 1.2 ms. A ``Staging`` keeps a flat copy of the host layout on
the model's device: the tensors are copied to or from it on the device (queued, no wait) and the whole
buffer crosses to or from the host in one copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from wire.tensors import TensorSpec

__all__ = ["Staging", "add_in_place", "device_of"]


def device_of(tensors: Iterable[torch.Tensor]) -> torch.device | None:
    """The one device every tensor is on, when that is a GPU (None on the CPU or across devices)."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        return None
    (device,) = devices
    return device if device.type == "cuda" else None


def add_in_place(tensor: torch.Tensor, change: torch.Tensor) -> None:
    """``tensor += change``; a bool tensor, which has no sum, takes ``change`` (the merged value)."""
    if tensor.dtype == torch.bool:
        tensor.copy_(change)
    else:
        tensor.add_(change)


class Staging:
    """A zeroed flat buffer laid out as ``specs`` on ``device``, with a typed view per tensor.

    The padding between tensors stays zero: only the views are written, so the host buffer's padding
    (part of the model's digest) stays as ``layout_of`` left it.
    """

    def __init__(
        self, device: torch.device, specs: Sequence[TensorSpec], total: int, dtypes: dict[str, torch.dtype]
    ) -> None:
        self.device, self.specs = device, tuple(specs)
        self.flat = torch.zeros(total, dtype=torch.uint8, device=device)
        self.views = {
            s.name: self.flat[s.offset : s.offset + s.nbytes].view(dtypes[s.dtype]).view(s.shape)
            for s in specs
        }

    def fits(self, device: torch.device, specs: Sequence[TensorSpec]) -> bool:
        """Whether this staging serves tensors on ``device`` laid out as ``specs``."""
        return self.device == device and self.specs == tuple(specs)

    def collect(self, tensors: dict[str, torch.Tensor], host: torch.Tensor) -> None:
        """Copy ``tensors`` (by name) into the host buffer ``host`` (uint8, the layout's size)."""
        with torch.no_grad():
            for name, tensor in tensors.items():
                self.views[name].copy_(tensor.detach())
            host.copy_(self.flat)

    def add(self, host: torch.Tensor, tensors: dict[str, torch.Tensor]) -> None:
        """Add the host buffer ``host`` to ``tensors`` (by name), in place; a bool tensor takes its value."""
        with torch.no_grad():
            self.flat.copy_(host)
            for name, tensor in tensors.items():
                add_in_place(tensor, self.views[name])

    def load(self, host: torch.Tensor, tensors: dict[str, torch.Tensor]) -> None:
        """Copy the host buffer ``host`` into ``tensors`` (by name), in place."""
        with torch.no_grad():
            self.flat.copy_(host)
            for name, tensor in tensors.items():
                tensor.copy_(self.views[name])
