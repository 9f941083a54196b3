"""``from swarmlearning.pyt import SwarmCallback``: the PyTorch SwarmCallback of the reference system.

Weights move device → host once per sync, straight into a reused flat buffer (one ``copy_`` per tensor
into a torch view of that buffer), and back with in-place ``copy_`` — no per-sync allocations; a model on
one GPU goes through a flat buffer on that GPU, one host copy each way (``swarmlearning.staging``), and an
overlapped sync keeps the weights it sent there and adds the merge's change there. Under
``torch.distributed`` (torchrun/DDP), rank 0 talks to the SL and broadcasts the merged weights.
"""

from __future__ import annotations

import logging
from itertools import islice
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from swarmlearning.client.swarm import SwarmCallbackBase, SwarmError, Validation
from swarmlearning.staging import PinnedHost, Staging, add_in_place, device_of
from wire.frames import layout_from_wire, layout_to_wire
from wire.limits import packb, unpackb
from wire.shared import SharedBuffer, memory_dir
from wire.tensors import FlatState, TensorSpec, layout_of

__all__ = ["SwarmCallback", "torch_dtype_label"]

_LABELS = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.bool: "bool",
}
_TORCH = {label: dtype for dtype, label in _LABELS.items()}

PIN_BUDGET = 2 << 30
"""Bytes of weight buffers one ML program page-locks at most: the SL lends and answers in 8 to 12 buffers of
the model's size over a run (4 peers), and page-locked memory is memory the system cannot page out."""


def torch_dtype_label(dtype: torch.dtype) -> str:
    """Wire dtype label of a torch dtype; SwarmError for one the swarm cannot carry."""
    try:
        return _LABELS[dtype]
    except KeyError:
        raise SwarmError(f"SwarmCallback: tensors of dtype {dtype} cannot be merged") from None


def _host_view(buffer: np.ndarray, spec: TensorSpec) -> torch.Tensor:
    """A torch tensor sharing ``spec``'s bytes of ``buffer`` (no copy)."""
    raw = torch.from_numpy(buffer[spec.offset : spec.offset + spec.nbytes])
    return raw.view(_TORCH[spec.dtype]).view(spec.shape)


class _HostViews:
    """Tensor views of the last few flat buffers, made once per buffer and layout: the weights go out
    and come back in buffers shared with the SL, which take turns."""

    def __init__(self, keep: int = 4) -> None:
        self._keep = keep
        self._made: dict[int, tuple[np.ndarray, tuple[TensorSpec, ...], list[torch.Tensor]]] = {}

    def of(self, buffer: np.ndarray, specs: tuple[TensorSpec, ...]) -> list[torch.Tensor]:
        """A view per spec of ``buffer``."""
        made = self._made.get(id(buffer))  # the views keep the buffer alive: no other takes its id
        if made is None or made[0] is not buffer or made[1] != specs:
            if len(self._made) >= self._keep:
                del self._made[next(iter(self._made))]  # the oldest
            made = (buffer, specs, [_host_view(buffer, s) for s in specs])
            self._made[id(buffer)] = made
        return made[2]


class _Change:
    """``merged - sent`` of two flat buffers of one layout, tensor by tensor, into a buffer of that
    layout (a bool tensor: the merged value); made once for the sent buffer and its layout."""

    def __init__(self, sent: FlatState) -> None:
        self.sent = sent  # the weights sent, which ``serves`` compares by identity
        self.buffer = np.zeros(sent.total, dtype=np.uint8)
        self.views = [_host_view(self.buffer, s) for s in sent.specs]
        self._sent = [_host_view(sent.buffer, s) for s in sent.specs]

    def serves(self, sent: FlatState) -> bool:
        """Whether it was made for this sent buffer and layout."""
        return sent.buffer is self.sent.buffer and sent.specs == self.sent.specs

    def compute(self, merged: list[torch.Tensor]) -> None:
        """Fill the buffer with the change of ``merged`` (views in the sent layout) from the sent one."""
        with torch.no_grad():
            for out, new, old in zip(self.views, merged, self._sent, strict=True):
                if out.dtype == torch.bool:
                    out.copy_(new)
                else:
                    torch.sub(new, old, out=out)


class SwarmCallback(SwarmCallbackBase):
    """SwarmCallback for PyTorch: call its hooks from your training loop.

    ``SwarmCallback(syncFrequency, minPeers, model=model, ...)``; then ``on_train_begin()`` before
    training, ``on_batch_end()`` after every batch, ``on_epoch_end()`` after every epoch and
    ``on_train_end()`` at the end.

    ``adsValData`` (a DataLoader) is evaluated on its first ``adsValBatches`` batches (default 2, ``None``
    for all): once per epoch, or after every sync round with ``useAdaptiveSync=True``, which then sets
    the sync interval (``swarmlearning.client.adaptive``). Use a loader without shuffling to compare the
    same samples every time.

    ``overlapSync=True`` (or ``SWARM_OVERLAP_SYNC=true``) trains on while the swarm merges: each merge is
    added to the model one sync later (``swarmlearning.client.swarm``; under DDP on every rank).
    """

    platform = "PYTORCH"

    def _validate_platform(self, kwargs: dict[str, Any]) -> None:
        model = kwargs.get("model")
        if not isinstance(model, torch.nn.Module):
            raise SwarmError("SwarmCallback: model (a torch.nn.Module) is required for PyTorch")
        self.model = model
        loader = kwargs.get("adsValData")
        if loader is not None and not isinstance(loader, DataLoader):
            raise SwarmError("SwarmCallback: adsValData must be a torch.utils.data.DataLoader for PyTorch")
        self.val_loader = loader
        self.loss_fn = self._make_loss(kwargs.get("lossFunction"), kwargs.get("lossFunctionArgs") or {})
        self.metric = self._make_metric(kwargs.get("metricFunction"), kwargs.get("metricFunctionArgs") or {})
        if self.params.use_adaptive_sync and self.loss_fn is None and self.metric is None:
            raise SwarmError("SwarmCallback: useAdaptiveSync needs lossFunction or metricFunction")
        self._views = _HostViews()  # of the buffers the weights are collected into
        self._in_views = _HostViews()  # of the buffers merged weights come in
        self._change: _Change | None = None
        self._staging: Staging | None = None
        self._incoming: FlatState | None = None  # the merged weights a rank other than 0 is broadcast
        self._pinned: list[PinnedHost] = []  # the buffers shared with the SL, page-locked for a GPU model
        self._pageable = False  # one of them could not be page-locked: the others are not tried

    @staticmethod
    def _make_loss(name: Any, args: dict[str, Any]) -> torch.nn.Module | None:
        if name is None:
            return None
        cls = getattr(torch.nn, str(name), None)
        if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
            raise SwarmError(f"SwarmCallback: lossFunction {name!r} is not a loss class of torch.nn")
        loss: torch.nn.Module = cls(**args)
        return loss

    @staticmethod
    def _make_metric(name: Any, args: dict[str, Any]) -> Any:
        if name is None:
            return None
        try:
            import torchmetrics  # noqa: PLC0415 - optional, only when a metric is asked for
        except ImportError:
            raise SwarmError(
                "SwarmCallback: metricFunction needs torchmetrics (pip install torchmetrics)"
            ) from None
        modules = [torchmetrics, *(getattr(torchmetrics, m, None) for m in ("classification", "regression"))]
        cls = next((getattr(m, str(name)) for m in modules if m is not None and hasattr(m, str(name))), None)
        if cls is None:
            raise SwarmError(f"SwarmCallback: metricFunction {name!r} is not a torchmetrics class")
        return cls(**args)

    # --------------------------------------------------------------- weights
    def _module(self) -> torch.nn.Module:
        inner = getattr(self.model, "module", None)  # DistributedDataParallel / DataParallel wrap it
        return inner if isinstance(inner, torch.nn.Module) else self.model

    def _state(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self._module().state_dict().items() if isinstance(v, torch.Tensor)}

    def _collect_weights(self, reuse: FlatState | None) -> FlatState:
        state = self._state()
        specs, total = self._layout(state)
        if reuse is None or reuse.specs != specs:
            reuse = FlatState(specs, np.zeros(total, dtype=np.uint8))
        staging = self._staging_for(state, specs, total)
        if staging is not None:
            staging.collect(state, torch.from_numpy(reuse.buffer))
            return reuse
        with torch.no_grad():
            for host, tensor in zip(self._views.of(reuse.buffer, specs), state.values(), strict=True):
                host.copy_(tensor.detach())
        return reuse

    @staticmethod
    def _layout(state: dict[str, torch.Tensor]) -> tuple[tuple[TensorSpec, ...], int]:
        return layout_of((name, torch_dtype_label(t.dtype), tuple(t.shape)) for name, t in state.items())

    def _staging_for(
        self, state: dict[str, torch.Tensor], specs: tuple[TensorSpec, ...], total: int
    ) -> Staging | None:
        """The staging buffer of a model on one GPU laid out as ``specs`` (None for any other model)."""
        device = device_of(state.values())
        if device is None:
            return None
        if self._staging is None or not self._staging.fits(device, specs):
            self._staging = Staging(device, specs, total, _TORCH)
        return self._staging

    def _shared_attached(self, shared: SharedBuffer) -> None:
        """A model on a GPU copies to and from the shared buffers at every sync: page-lock each once, when
        it lives in memory (``/dev/shm``, where the SL makes them on a host that has one; a file elsewhere
        may be on disk, and registering a buffer in a file on disk failed on an H100 machine). After one
        stays pageable, the others are left pageable too (said once); so are those beyond ``PIN_BUDGET``."""
        device = device_of(self._state().values())
        if device is None or self._pageable:
            return
        pinned = sum(p.nbytes for p in self._pinned)
        if pinned + shared.nbytes > PIN_BUDGET:
            self._pageable = True
            self.logger.info(
                "SwarmCallback: %d weight buffers (%d MB) are page-locked, the most one program locks; "
                "the others stay pageable", len(self._pinned), pinned >> 20,
            )  # fmt: skip
            return
        memory = memory_dir()
        if memory is None or not shared.path.is_relative_to(memory):
            self._pageable = True
            self.logger.info(
                "SwarmCallback: the weight buffers stay pageable: %s is not in memory", shared.path
            )
            return
        try:
            self._pinned.append(PinnedHost(shared.array, device))
        except RuntimeError as exc:
            self._pageable = True
            self.logger.warning("SwarmCallback: the weight buffers stay pageable: %s", exc)
            return
        self.logger.log(
            logging.INFO if len(self._pinned) == 1 else logging.DEBUG,
            "SwarmCallback: a weight buffer shared with the SL (%d bytes) is page-locked for the GPU",
            shared.nbytes,
        )

    def _load_weights(self, flat: FlatState) -> None:
        state = self._state()
        names = {s.name for s in flat.specs}
        missing = sorted(set(state) - names)
        if missing:
            raise SwarmError(f"SwarmCallback: merged model lacks tensors {missing[:5]}")
        staging = self._staging_for(state, flat.specs, flat.total) if set(state) == names else None
        if staging is not None:
            staging.load(torch.from_numpy(flat.buffer), state)
            return
        by_name = dict(
            zip((s.name for s in flat.specs), self._in_views.of(flat.buffer, flat.specs), strict=True)
        )
        with torch.no_grad():
            for name, tensor in state.items():
                tensor.copy_(by_name[name])

    def _keep_sent(self, flat: FlatState | None) -> None:
        """A model on one GPU keeps the weights it sends there (its staging buffer holds them once
        collected); any other model, on the host."""
        state = self._state()
        specs, total = (flat.specs, flat.total) if flat is not None else self._layout(state)
        staging = self._staging_for(state, specs, total)
        if staging is None:
            super()._keep_sent(flat)
            return
        if flat is None:  # a rank that sends nothing: its weights are the sync rank's
            staging.gather(state)
        staging.keep()
        self._sent = None

    def _apply_merge(self, merged: FlatState) -> None:
        """``model += merged - sent``, tensor by tensor (a bool tensor takes the merged value): on the GPU
        for a model on one GPU (the merged weights cross in one copy), else on the host."""
        state = self._state()
        differs = SwarmError("SwarmCallback: the merged model's layout differs from the weights sent")
        if set(state) != {s.name for s in merged.specs}:
            raise differs
        sent = self._sent
        if sent is None:  # kept on the GPU, in the staging buffer (replaced should the layout differ)
            staging = self._staging_for(state, merged.specs, merged.total)
            if staging is None or not staging.has_kept:
                raise differs
            staging.add_change(torch.from_numpy(merged.buffer), state)
            return
        if merged.specs != sent.specs:
            raise differs
        if self._change is None or not self._change.serves(sent):
            self._change = _Change(sent)
        self._change.compute(self._in_views.of(merged.buffer, merged.specs))
        with torch.no_grad():
            for spec, change in zip(merged.specs, self._change.views, strict=True):
                add_in_place(state[spec.name], change)

    # ------------------------------------------------------- loss and metric
    def _validation(self, max_batches: int | None) -> Validation:
        loader = self.val_loader
        if loader is None or (self.loss_fn is None and self.metric is None):
            return Validation(None, None, 0)
        model = self.model
        was_training = model.training
        model.eval()
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        total_loss, count, batches = 0.0, 0, 0
        if self.metric is not None:
            self.metric = self.metric.to(device)
            self.metric.reset()
        with torch.no_grad():
            for batch_inputs, batch_targets in islice(loader, max_batches):
                inputs, targets = batch_inputs.to(device), batch_targets.to(device)
                outputs = model(inputs)
                count += len(targets)
                batches += 1
                if self.loss_fn is not None:
                    loss = float(self.loss_fn(outputs, targets))
                    mean = getattr(self.loss_fn, "reduction", "mean") == "mean"
                    total_loss += loss * len(targets) if mean else loss
                if self.metric is not None:
                    self.metric.update(outputs, targets)
        model.train(was_training)
        loss_value = total_loss / max(count, 1) if self.loss_fn is not None else None
        metric_value = float(self.metric.compute()) if self.metric is not None and batches else None
        higher = bool(getattr(self.metric, "higher_is_better", True) is not False)
        return Validation(loss_value, metric_value, batches, higher)

    # ------------------------------------------------- torchrun / DDP ranks
    @staticmethod
    def _dist() -> Any:
        dist = torch.distributed
        return dist if dist.is_available() and dist.is_initialized() else None

    def _is_sync_rank(self) -> bool:
        dist = self._dist()
        return dist is None or dist.get_rank() == 0

    def _share(self, reply: dict[str, Any], flat: FlatState | None) -> tuple[dict[str, Any], FlatState]:
        dist = self._dist()
        if dist is None or dist.get_world_size() == 1:
            return super()._share(reply, flat)
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        head = (
            packb({"reply": reply, "layout": layout_to_wire(flat.specs), "total": flat.total})
            if flat
            else b""
        )
        head = self._broadcast_bytes(dist, head, device)
        meta = unpackb(head, what="broadcast header")
        total = int(meta["total"])
        specs = layout_from_wire(meta["layout"], total, what="broadcast layout")
        if flat is None:  # another rank: the merge comes into a buffer kept for the next sync
            if self._incoming is None or self._incoming.specs != specs:
                self._incoming = FlatState(specs, np.empty(total, dtype=np.uint8))
            flat = self._incoming
        self._broadcast_buffer(dist, flat.buffer, device)
        return dict(meta["reply"]), FlatState(specs, flat.buffer)

    def _agree(self, value: int) -> int:
        dist = self._dist()
        if dist is None or dist.get_world_size() == 1:
            return value
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        box = torch.tensor([value], dtype=torch.int64, device=device)
        dist.broadcast(box, src=0)
        return int(box.item())

    @staticmethod
    def _broadcast_bytes(dist: Any, data: bytes, device: torch.device | None) -> bytes:
        size = torch.tensor([len(data)], dtype=torch.int64, device=device)
        dist.broadcast(size, src=0)
        out = np.frombuffer(data, np.uint8).copy() if data else np.empty(int(size.item()), np.uint8)
        SwarmCallback._broadcast_buffer(dist, out, device)
        return out.tobytes()

    @staticmethod
    def _broadcast_buffer(dist: Any, buffer: np.ndarray, device: torch.device | None) -> None:
        host = torch.from_numpy(buffer)
        if device is None:
            dist.broadcast(host, src=0)
            return
        on_device = host.to(device)
        dist.broadcast(on_device, src=0)
        host.copy_(on_device)  # straight into the host buffer: no host tensor in between
