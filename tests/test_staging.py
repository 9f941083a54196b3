"""Weights of a GPU model go to and from the host through one flat buffer on the GPU
(``swarmlearning/staging.py``): the same bytes as tensor by tensor, the padding zero, every tensor loaded;
the host buffer shared with the SL page-locked for a GPU model only.
The GPU cases run where CUDA is; ``Staging`` itself is checked on the CPU too, and so is the bookkeeping of
``PinnedHost`` against a recording stand-in for CUDA's two calls."""

from __future__ import annotations

import gc
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from swarmlearning import pyt as pyt_module
from swarmlearning import staging as staging_module
from swarmlearning.pyt import SwarmCallback
from swarmlearning.staging import PinnedHost, Staging, device_of
from wire.shared import SharedBuffer, memory_dir
from wire.tensors import FlatState

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class _Mixed(torch.nn.Module):
    """Tensors of several dtypes and sizes whose offsets need padding, one of them not contiguous."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.dense = torch.nn.Linear(7, 3)
        self.norm = torch.nn.BatchNorm1d(3)  # running stats and an int64 counter
        self.low = torch.nn.Parameter(torch.randn(5, dtype=torch.bfloat16))
        self.register_buffer("flags", torch.tensor([True, False, True]))
        self.register_buffer("turned", torch.randn(4, 6).t())  # a transposed view: strides differ

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm(self.dense(x))
        return out


@pytest.fixture(autouse=True)
def _alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWARM_LOOPBACK", "true")  # a callback without an SL


def _callback(model: torch.nn.Module) -> SwarmCallback:
    return SwarmCallback(4, 1, model=model, totalEpochs=1)


def _by_tensor(model: torch.nn.Module) -> FlatState:
    """The host buffer the tensor-by-tensor path fills (a CPU model never goes through a staging)."""
    cb = _callback(model)
    flat = cb._collect_weights(None)
    assert cb._staging is None
    return flat


def _staged(model: torch.nn.Module, device: torch.device) -> tuple[Staging, FlatState]:
    from swarmlearning.pyt import _TORCH

    reference = _by_tensor(model)
    staging = Staging(device, reference.specs, reference.total, _TORCH)
    host = FlatState(reference.specs, np.full(reference.total, 0xAB, dtype=np.uint8))
    tensors = {k: v.to(device) for k, v in model.state_dict().items()}
    staging.collect(tensors, torch.from_numpy(host.buffer))
    return staging, host


def test_a_staging_collects_the_bytes_the_tensor_by_tensor_path_does_padding_included() -> None:
    model = _Mixed()
    reference = _by_tensor(model)
    assert reference.total > sum(s.nbytes for s in reference.specs)  # the layout has padding
    _, host = _staged(model, torch.device("cpu"))
    assert host.buffer.tobytes() == reference.buffer.tobytes()


def test_a_staging_loads_every_tensor_in_place() -> None:
    source, target = _Mixed(), _Mixed()
    with torch.no_grad():
        for tensor in target.state_dict().values():
            tensor.zero_()
    staging, host = _staged(source, torch.device("cpu"))
    tensors = target.state_dict()
    before = {k: v.data_ptr() for k, v in tensors.items()}
    staging.load(torch.from_numpy(host.buffer), tensors)
    for name, tensor in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], tensor), name
        assert target.state_dict()[name].data_ptr() == before[name]


def test_a_staging_adds_the_merges_change_from_the_weights_it_kept() -> None:
    model = _Mixed()
    staging, sent = _staged(model, torch.device("cpu"))
    staging.keep()
    tensors = model.state_dict()
    with torch.no_grad():  # training went on after the weights were sent
        model.dense.weight.add_(1.0)
        tensors["norm.num_batches_tracked"].add_(3)
    before = {k: v.clone() for k, v in tensors.items()}
    merged = FlatState(sent.specs, sent.buffer.copy())
    views = {s.name: torch.from_numpy(merged.buffer[s.offset : s.offset + s.nbytes]) for s in merged.specs}
    views["dense.weight"].view(torch.float32).add_(0.5)
    views["low"].view(torch.bfloat16).add_(2.0)
    views["norm.num_batches_tracked"].view(torch.int64).add_(7)
    views["flags"].view(torch.bool).logical_not_()
    staging.add_change(torch.from_numpy(merged.buffer), tensors)
    assert torch.allclose(tensors["dense.weight"], before["dense.weight"] + 0.5)
    assert torch.equal(tensors["low"], before["low"] + 2.0)
    assert int(tensors["norm.num_batches_tracked"]) == int(before["norm.num_batches_tracked"]) + 7
    assert torch.equal(tensors["flags"], ~before["flags"])  # a bool takes the merged value
    for name in ("dense.bias", "norm.running_mean", "turned"):
        assert torch.equal(tensors[name], before[name]), name  # unchanged by the merge
    fresh, _ = _staged(model, torch.device("cpu"))
    with pytest.raises(ValueError, match="nothing was kept"):
        fresh.add_change(torch.from_numpy(merged.buffer), tensors)


def test_a_staging_keeps_what_it_gathered_last() -> None:
    model = _Mixed()
    staging, sent = _staged(model, torch.device("cpu"))
    staging.keep()
    tensors = model.state_dict()
    with torch.no_grad():
        tensors["dense.bias"].add_(1.0)
    staging.gather(tensors)  # the next sync (a rank that sends nothing: on the device only)
    staging.keep()
    with torch.no_grad():
        tensors["dense.bias"].add_(1.0)
    before = tensors["dense.bias"].clone()
    staging.add_change(torch.from_numpy(sent.buffer), tensors)  # merged = the first weights
    assert torch.allclose(tensors["dense.bias"], before - 1.0)  # the change from the second keep


def test_only_a_model_on_one_gpu_is_staged() -> None:
    assert device_of([torch.zeros(2), torch.zeros(3)]) is None
    assert device_of([torch.zeros(2), torch.zeros(2, device="meta")]) is None
    assert device_of([]) is None


@CUDA
def test_a_gpu_model_sends_the_bytes_of_its_cpu_twin_and_loads_them_back() -> None:
    cpu_model = _Mixed()
    reference = _by_tensor(cpu_model)
    gpu_model = _Mixed().cuda()
    cb = _callback(gpu_model)
    sent = cb._collect_weights(None)
    assert cb._staging is not None and cb._staging.device.type == "cuda"
    assert sent.buffer.tobytes() == reference.buffer.tobytes()
    assert device_of(gpu_model.state_dict().values()) == cb._staging.device

    merged = FlatState(reference.specs, reference.buffer.copy())
    weight = next(spec for spec in reference.specs if spec.name == "dense.weight")
    merged.buffer[weight.offset + 3] ^= 0x40  # a merged model differs from what was sent
    cb._load_weights(merged)
    again = cb._collect_weights(None)
    assert again.buffer.tobytes() == merged.buffer.tobytes()
    assert not torch.equal(gpu_model.dense.weight.cpu(), cpu_model.dense.weight)


def test_only_a_contiguous_non_empty_array_is_page_locked() -> None:
    with pytest.raises(RuntimeError, match="contiguous"):
        PinnedHost(np.zeros((4, 4), dtype=np.uint8)[:, 1], torch.device("cpu"))
    with pytest.raises(RuntimeError, match="non-empty"):
        PinnedHost(np.zeros(0, dtype=np.uint8), torch.device("cpu"))


class _RecordingCudart:
    """Stands in for the CUDA runtime on a machine without one: records registrations, answers ``error``."""

    def __init__(self, error: int = 0) -> None:
        self.error = error
        self.calls: list[tuple[object, ...]] = []

    def cudaHostRegister(self, address: int, nbytes: int, flags: int) -> int:  # noqa: N802 - CUDA's name
        self.calls.append(("register", address, nbytes, flags))
        return self.error

    def cudaHostUnregister(self, address: int) -> int:  # noqa: N802 - CUDA's name
        self.calls.append(("unregister", address))
        return 0


@pytest.fixture
def cudart(monkeypatch: pytest.MonkeyPatch) -> _RecordingCudart:
    """CUDA's registrations recorded instead of made: the bookkeeping around them, checked without a GPU."""
    recording = _RecordingCudart()
    monkeypatch.setattr(staging_module, "_cudart", lambda: recording)
    return recording


def test_a_pinned_array_is_registered_once_and_unregistered_once(cudart: _RecordingCudart) -> None:
    array = np.zeros(4096, dtype=np.uint8)
    pinned = PinnedHost(array, torch.device("cpu"))
    assert cudart.calls == [("register", array.ctypes.data, 4096, 0)] and pinned.pinned
    pinned.release()
    pinned.release()
    assert cudart.calls[1:] == [("unregister", array.ctypes.data)] and not pinned.pinned


def test_a_pinned_array_is_unregistered_when_its_owner_goes(cudart: _RecordingCudart) -> None:
    array = np.zeros(4096, dtype=np.uint8)
    pinned = PinnedHost(array, torch.device("cpu"))
    del pinned
    gc.collect()
    assert cudart.calls[-1] == ("unregister", array.ctypes.data)


def test_only_the_process_that_registered_unregisters(cudart: _RecordingCudart) -> None:
    array = np.zeros(16, dtype=np.uint8)
    staging_module._unregister(int(array.ctypes.data), os.getpid() + 1, array)  # a forked child's exit
    assert cudart.calls == []


def test_a_refused_registration_raises_and_takes_the_error_it_left(
    cudart: _RecordingCudart, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken: list[torch.device] = []
    monkeypatch.setattr(staging_module, "_consume_last_error", taken.append)
    cudart.error = 1
    with pytest.raises(RuntimeError, match="CUDA error 1"):
        PinnedHost(np.zeros(4096, dtype=np.uint8), torch.device("cpu"))
    assert taken == [torch.device("cpu")]
    assert [call[0] for call in cudart.calls] == ["register"]  # nothing to undo


def test_a_runtime_without_cuda_host_register_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(staging_module, "_cudart", object)  # a runtime without it
    with pytest.raises(RuntimeError, match="no cudaHostRegister"):
        PinnedHost(np.zeros(4096, dtype=np.uint8), torch.device("cpu"))


def test_a_cpu_model_leaves_the_shared_buffer_pageable(tmp_path: Path) -> None:
    cb = _callback(_Mixed())
    cb._shared_attached(SharedBuffer.create(tmp_path, "weights", 64))
    assert cb._pinned == [] and not cb._pageable


def test_page_locked_buffers_stop_at_the_budget_and_the_rest_stay_pageable(
    cudart: _RecordingCudart, in_memory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program sees 8-12 shared buffers over a run: it page-locks them until PIN_BUDGET, not beyond."""
    monkeypatch.setattr(pyt_module, "device_of", lambda tensors: torch.device("cpu"))  # as if on a GPU
    monkeypatch.setattr(pyt_module, "PIN_BUDGET", 3 * 4096)
    cb = _callback(_Mixed())
    for index in range(5):
        cb._shared_attached(SharedBuffer.create(in_memory, f"weights-{index}", 4096))
    assert [call[0] for call in cudart.calls] == ["register"] * 3
    assert len(cb._pinned) == 3 and cb._pageable


@pytest.fixture
def in_memory() -> Iterator[Path]:
    """A directory in memory (``/dev/shm``), where the SL makes the shared buffer."""
    memory = memory_dir()
    if memory is None:
        pytest.skip("no /dev/shm here")
    with tempfile.TemporaryDirectory(dir=memory) as directory:
        yield Path(directory)


@CUDA
def _wide() -> torch.nn.Module:
    """A model of some 260 KB (many pages), the same every time it is made."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.BatchNorm1d(256))


@CUDA
def test_a_gpu_models_shared_buffer_is_page_locked_and_carries_its_cpu_twins_bytes(in_memory: Path) -> None:
    reference = _by_tensor(_wide())
    cb = _callback(_wide().cuda())
    shared = SharedBuffer.create(in_memory, "weights", reference.total)
    host = torch.from_numpy(shared.array)
    assert not host.is_pinned()
    cb._shared_attached(shared)
    assert len(cb._pinned) == 1 and cb._pinned[0].pinned and host.is_pinned()

    sent = cb._collect_weights(FlatState(reference.specs, shared.array))
    assert sent.buffer is shared.array and sent.buffer.tobytes() == reference.buffer.tobytes()
    merged = reference.buffer.copy()
    weight = next(spec for spec in reference.specs if spec.name == "0.weight")
    merged[weight.offset + 3] ^= 0x40
    np.copyto(shared.array, merged)  # the SL writes the merged model into the shared buffer
    cb._load_weights(FlatState(reference.specs, shared.array))
    assert cb._collect_weights(None).buffer.tobytes() == merged.tobytes()

    cb._pinned[0].release()
    assert not cb._pinned[0].pinned and not host.is_pinned()
    cb._pinned[0].release()  # once only: a second release does nothing


@CUDA
def test_a_shared_buffer_outside_memory_stays_pageable(tmp_path: Path) -> None:
    memory = memory_dir()
    if memory is not None and tmp_path.is_relative_to(memory):
        pytest.skip("the temporary directory is in /dev/shm")
    cb = _callback(_Mixed().cuda())
    cb._shared_attached(SharedBuffer.create(tmp_path, "weights", 4096))
    assert cb._pinned == [] and cb._pageable
    cb._shared_attached(SharedBuffer.create(tmp_path, "weights-2", 4096))  # not tried again
    assert cb._pinned == []


@CUDA
def test_a_refused_registration_leaves_cuda_working(in_memory: Path) -> None:
    shared = SharedBuffer.create(in_memory, "weights", 1 << 20)
    device = torch.device("cuda")
    first = PinnedHost(shared.array, device)
    with pytest.raises(RuntimeError, match="cudaHostRegister"):
        PinnedHost(shared.array, device)  # registered already: CUDA refuses it
    assert torch.zeros(4, device=device).add(1).sum().item() == 4  # no error left for the next launch
    first.release()
