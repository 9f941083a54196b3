"""Weights between a GPU model and a host buffer in one copy each way.

A copy between pageable host memory and the GPU waits for the GPU, and with several training processes
sharing one GPU each wait can last a time slice of the others. Copying a model tensor by tensor pays
that wait once per tensor: 8 tensors of the mnist-pyt example's CNN took 3.2 ms to load on an H200 shared
by 4 nodes, the 4 of the reference's MLP 1.2 ms. A ``Staging`` keeps a flat copy of the host layout on
the model's device: the tensors are copied to or from it on the device (queued, no wait) and the whole
buffer crosses to or from the host in one copy. For an overlapped sync the staging also keeps, on the
device, the weights it sent (``keep``), and takes in the merge as ``model += merged - sent`` there
(``add_change``): one copy to the device, no copy of the sent weights on the host and no subtraction there.

The host end is the buffer the ML program shares with its SL. ``PinnedHost`` registers it with CUDA
(page-locked), so that each of those copies goes straight between it and the GPU instead of through the
driver's own pinned bounce buffer in pieces, the way a copy from pageable memory goes.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from wire.tensors import TensorSpec

__all__ = ["PinnedHost", "Staging", "add_in_place", "device_of"]


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


def _cudart() -> Any:
    """The CUDA runtime's functions that torch wraps (``cudaHostRegister``, ``cudaHostUnregister``)."""
    return torch.cuda.cudart()  # type: ignore[no-untyped-call]


def _unregister(address: int, pid: int, array: np.ndarray) -> None:
    """Undo ``cudaHostRegister`` at ``address`` in the process that made it (a forked child, say a data
    loader's worker leaving, has no CUDA of its own); ``array`` owns that memory and is passed only to
    keep it mapped until then."""
    if os.getpid() != pid:
        return
    with contextlib.suppress(Exception):  # at interpreter exit torch may be half gone: nothing to save then
        _cudart().cudaHostUnregister(address)  # an error code changes nothing either


def _consume_last_error(device: torch.device) -> None:
    """Take the error a refused ``cudaHostRegister`` left as the CUDA runtime's last error.

    torch checks that last error after every kernel launch, so the next launch (in the training step)
    would fail with it; a launch here reports it instead (torch reads it, which clears it).
    """
    with contextlib.suppress(RuntimeError):
        torch.zeros(1, device=device)


class PinnedHost:
    """A host array registered with CUDA (page-locked) while this object lives.

    The array stays referenced, and so mapped, until the registration is undone (``release``, or when
    this object goes). Raises RuntimeError when CUDA refuses the registration: the array is then left
    as it was (copies to and from it still work, through the driver's bounce buffer) and so is CUDA.
    """

    def __init__(self, array: np.ndarray, device: torch.device) -> None:
        if not array.flags.c_contiguous or array.nbytes == 0:
            raise RuntimeError("only a contiguous, non-empty array can be pinned")
        register = getattr(_cudart(), "cudaHostRegister", None)
        if register is None:  # a build whose runtime names it otherwise (ROCm's may)
            raise RuntimeError("this torch build's runtime offers no cudaHostRegister")
        address = int(array.ctypes.data)
        error = int(register(address, array.nbytes, 0))
        if error != 0:
            _consume_last_error(device)
            raise RuntimeError(f"cudaHostRegister of {array.nbytes} bytes failed with CUDA error {error}")
        self.nbytes = array.nbytes
        self._finalizer = weakref.finalize(self, _unregister, address, os.getpid(), array)

    @property
    def pinned(self) -> bool:
        """Whether the registration still holds."""
        return self._finalizer.alive

    def release(self) -> None:
        """Undo the registration (once; later calls do nothing)."""
        self._finalizer()


class Staging:
    """A zeroed flat buffer laid out as ``specs`` on ``device``, with a typed view per tensor.

    The padding between tensors stays zero: only the views are written, so the host buffer's padding
    (part of the model's digest) stays as ``layout_of`` left it.
    """

    def __init__(
        self, device: torch.device, specs: Sequence[TensorSpec], total: int, dtypes: dict[str, torch.dtype]
    ) -> None:
        self.device, self.specs = device, tuple(specs)
        self._dtypes = dtypes
        self.flat = torch.zeros(total, dtype=torch.uint8, device=device)
        self.views = {s.name: self._view(self.flat, s) for s in specs}
        self._kept: torch.Tensor | None = None
        self._kept_views: dict[str, torch.Tensor] = {}

    def _view(self, flat: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
        return flat[spec.offset : spec.offset + spec.nbytes].view(self._dtypes[spec.dtype]).view(spec.shape)

    def fits(self, device: torch.device, specs: Sequence[TensorSpec]) -> bool:
        """Whether this staging serves tensors on ``device`` laid out as ``specs``."""
        return self.device == device and self.specs == tuple(specs)

    def gather(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy ``tensors`` (by name) into the flat buffer, on the device."""
        with torch.no_grad():
            for name, tensor in tensors.items():
                self.views[name].copy_(tensor.detach())

    def collect(self, tensors: dict[str, torch.Tensor], host: torch.Tensor) -> None:
        """Copy ``tensors`` (by name) into the host buffer ``host`` (uint8, the layout's size)."""
        self.gather(tensors)
        host.copy_(self.flat)

    def keep(self) -> None:
        """Keep a copy of the flat buffer on the device (the weights an overlapped sync sends), for
        ``add_change``."""
        if self._kept is None:
            self._kept = torch.empty_like(self.flat)
            self._kept_views = {s.name: self._view(self._kept, s) for s in self.specs}
        self._kept.copy_(self.flat)

    @property
    def has_kept(self) -> bool:
        """Whether ``keep`` was called."""
        return self._kept is not None

    def add_change(self, host: torch.Tensor, tensors: dict[str, torch.Tensor]) -> None:
        """Add the host buffer ``host`` minus the kept one to ``tensors`` (by name), in place, on the device;
        a bool tensor takes ``host``'s value."""
        if self._kept is None:
            raise ValueError("Staging.add_change: nothing was kept")
        with torch.no_grad():
            self.flat.copy_(host)
            for name, tensor in tensors.items():
                merged = self.views[name]
                if merged.dtype != torch.bool:
                    torch.sub(merged, self._kept_views[name], out=merged)
                add_in_place(tensor, merged)

    def load(self, host: torch.Tensor, tensors: dict[str, torch.Tensor]) -> None:
        """Copy the host buffer ``host`` into ``tensors`` (by name), in place."""
        with torch.no_grad():
            self.flat.copy_(host)
            for name, tensor in tensors.items():
                tensor.copy_(self.views[name])
