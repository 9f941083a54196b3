"""Overlapped sync (``overlapSync`` / ``SWARM_OVERLAP_SYNC``): a sync sends the weights and training goes
on; the next sync adds the merge's change (``merged - sent``) to the model. The link's request and
answer apart, the change applied tensor by tensor, the cases where it is refused, and a real swarm."""

from __future__ import annotations

import re
import socket
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from swarmlearning.client.link import LinkError, SLLink
from swarmlearning.client.swarm import SwarmError
from swarmlearning.pyt import SwarmCallback
from tests.conftest import RunningSN
from tests.swarm_helpers import RunningSL, start_sl
from wire.frames import (
    HEADER_PREFIX,
    decode_header,
    encode_frame_head,
    header_length,
    layout_from_wire,
    payload_size,
)
from wire.tensors import FlatState


class _Mixed(torch.nn.Module):
    """Float, bfloat16, int64 (a BatchNorm counter) and bool tensors."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.dense = torch.nn.Linear(5, 3)
        self.norm = torch.nn.BatchNorm1d(3)
        self.low = torch.nn.Parameter(torch.randn(4, dtype=torch.bfloat16))
        self.register_buffer("flags", torch.tensor([True, False, True]))


def _standalone(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> SwarmCallback:
    monkeypatch.setenv("SWARM_LOOPBACK", "true")  # no SL: only the weight paths are used
    return SwarmCallback(4, 1, model=model, totalEpochs=1, **kwargs)


def _shifted(flat: FlatState, by: dict[str, torch.Tensor]) -> FlatState:
    """``flat`` with ``by[name]`` added to (bool: put in place of) tensor ``name``."""
    from swarmlearning.pyt import _host_view

    out = FlatState(flat.specs, flat.buffer.copy())
    for spec in out.specs:
        if spec.name in by:
            view = _host_view(out.buffer, spec)
            view.copy_(by[spec.name] if view.dtype == torch.bool else view + by[spec.name])
    return out


def test_the_merge_is_added_to_what_the_model_learnt_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _Mixed()
    cb = _standalone(model, monkeypatch)
    sent = cb._collect_weights(None)
    sent = FlatState(sent.specs, sent.buffer.copy())
    change = {
        "dense.weight": torch.full((3, 5), 0.5),
        "low": torch.tensor([1.0, -1.0, 0.25, 0.0], dtype=torch.bfloat16),
        "norm.num_batches_tracked": torch.tensor(7),
        "flags": torch.tensor([False, True, False]),
    }
    merged = _shifted(sent, change)
    with torch.no_grad():  # training went on after the weights were sent
        model.dense.weight.add_(1.0)
        model.state_dict()["norm.num_batches_tracked"].add_(3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pointers = {k: v.data_ptr() for k, v in model.state_dict().items()}
    cb._keep_sent(sent)
    cb._apply_merge(merged)
    after = model.state_dict()
    assert torch.allclose(after["dense.weight"], before["dense.weight"] + 0.5)
    assert torch.equal(after["low"], before["low"] + change["low"])
    assert int(after["norm.num_batches_tracked"]) == int(before["norm.num_batches_tracked"]) + 7
    assert torch.equal(after["flags"], change["flags"])  # a bool has no sum: the merged value
    for name in ("dense.bias", "norm.running_mean", "norm.running_var", "norm.weight"):
        assert torch.equal(after[name], before[name]), name  # unchanged by the merge: untouched
    assert {k: v.data_ptr() for k, v in after.items()} == pointers  # in place
    cb._apply_merge(merged)  # the views made for these buffers serve again
    assert torch.allclose(model.dense.weight, before["dense.weight"] + 1.0)


def test_a_merge_of_another_layout_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    cb = _standalone(_Mixed(), monkeypatch)
    sent = cb._collect_weights(None)
    other = _standalone(torch.nn.Linear(2, 2), monkeypatch)._collect_weights(None)
    cb._keep_sent(sent)
    with pytest.raises(SwarmError, match="layout differs"):
        cb._apply_merge(other)


def test_overlapsync_is_a_flag_and_the_environment_turns_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SwarmError, match="overlapSync must be True or False"):
        _standalone(torch.nn.Linear(2, 2), monkeypatch, overlapSync="yes")
    assert not _standalone(torch.nn.Linear(2, 2), monkeypatch).params.overlap_sync
    monkeypatch.setenv("SWARM_OVERLAP_SYNC", "true")
    assert _standalone(torch.nn.Linear(2, 2), monkeypatch).params.overlap_sync
    assert not _standalone(torch.nn.Linear(2, 2), monkeypatch, overlapSync=False).params.overlap_sync


# ------------------------------------------------------------------------------------------ the link
class _UnixSL:
    """A stand-in SL on a unix socket, one connection: each request (header, payload bytes) gets the frame
    ``_answer`` makes of it."""

    def __init__(self, path: Path) -> None:
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(1)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            while prefix := conn.recv(HEADER_PREFIX.size, socket.MSG_WAITALL):
                header = decode_header(conn.recv(header_length(prefix), socket.MSG_WAITALL))
                size = payload_size(header)
                conn.sendall(self._answer(header, conn.recv(size, socket.MSG_WAITALL) if size else b""))

    def _answer(self, header: dict[str, Any], payload: bytes) -> bytes:
        raise NotImplementedError


class _EchoSL(_UnixSL):
    """Answers each request with its header's ``n`` and its payload, once told to (``go``)."""

    def __init__(self, path: Path) -> None:
        self.go = threading.Semaphore(0)
        super().__init__(path)

    def _answer(self, header: dict[str, Any], payload: bytes) -> bytes:
        self.go.acquire()
        return encode_frame_head({"op": "ok", "n": header.get("n")}, len(payload)) + payload


def test_a_request_sent_first_is_answered_when_finished(tmp_path: Path) -> None:
    sl = _EchoSL(tmp_path / "sl.sock")
    link = SLLink(str(tmp_path / "sl.sock"))
    try:
        with pytest.raises(LinkError, match="no request awaits an answer"):
            link.finish()
        weights = np.arange(1000, dtype=np.uint8)
        link.start("sync", {"n": 1}, weights)
        assert link.awaiting == "sync"
        with pytest.raises(LinkError, match="'progress' sent while the answer to 'sync' is still awaited"):
            link.start("progress", {"n": 2})
        sl.go.release()
        reply, data = link.finish()
        assert reply["n"] == 1 and data is not None and np.array_equal(data, weights)
        assert link.awaiting is None
        sl.go.release()
        reply, _ = link.call("progress", {"n": 3})
        assert reply["n"] == 3
    finally:
        link.close()
        sl.server.close()


# ------------------------------------------------------------------------ the callback and a stand-in SL
class _PlusOneSL(_UnixSL):
    """Every ``sync`` "merges" by adding 1 to each float tensor sent (or answers with an error, for the syncs
    numbered in ``failing``); other requests get their weights back."""

    def __init__(self, path: Path, failing: tuple[int, ...] = ()) -> None:
        self.failing, self.syncs = failing, 0
        super().__init__(path)

    def _answer(self, header: dict[str, Any], raw: bytes) -> bytes:
        from swarmlearning.pyt import _host_view

        if not raw:
            return encode_frame_head({"op": "ok", "uid": "stand-in"}, 0)
        payload = np.frombuffer(raw, np.uint8).copy()
        layout = header["layout"]
        if header["op"] == "sync":
            self.syncs += 1
            if self.syncs in self.failing:
                return encode_frame_head({"op": "error", "message": f"round {self.syncs} failed: boom"}, 0)
            for spec in layout_from_wire(layout, payload.nbytes):
                _host_view(payload, spec).add_(1.0)
        reply = {"op": "ok", "round": self.syncs, "digest": "d", "layout": layout, "next_sync_interval": 2}
        return encode_frame_head(reply, payload.nbytes) + payload.tobytes()


def _overlapping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **sl: Any
) -> tuple[SwarmCallback, _PlusOneSL]:
    monkeypatch.delenv("SWARM_LOOPBACK", raising=False)
    monkeypatch.setenv("SWARM_SL_SOCKET", str(tmp_path / "sl.sock"))
    server = _PlusOneSL(tmp_path / "sl.sock", **sl)
    torch.manual_seed(0)
    return SwarmCallback(2, 1, model=torch.nn.Linear(3, 2), totalEpochs=1, overlapSync=True), server


def test_each_merge_is_added_at_the_next_sync_and_the_end_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cb, _ = _overlapping(tmp_path, monkeypatch)
    model = cb.model
    assert isinstance(model, torch.nn.Linear)
    cb.on_train_begin()
    start = model.weight.detach().clone()
    cb.on_batch_end()
    cb.on_batch_end()  # sync 1 sent: the callback returns without its merge
    assert cb._link is not None and cb._link.awaiting == "sync" and cb.syncs_done == 0
    with torch.no_grad():
        model.weight.add_(0.5)  # what training learns meanwhile
    cb.on_batch_end()
    cb.on_batch_end()  # sync 1's merge (+1) taken in, kept with the 0.5; sync 2 sent
    assert cb.syncs_done == 1
    assert torch.allclose(model.weight, start + 1.5)
    cb.on_epoch_end()  # takes sync 2's merge (+1 on what was sent) before reporting progress
    assert cb.syncs_done == 2 and cb._link.awaiting is None
    assert torch.allclose(model.weight, start + 2.5)
    cb.on_train_end()  # a blocking exchange, as always
    assert cb.final_digest == "d" and cb.training_over
    assert torch.allclose(model.weight, start + 2.5)


def test_a_sync_the_sl_failed_raises_its_error_at_the_next_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cb, _ = _overlapping(tmp_path, monkeypatch, failing=(2,))
    cb.on_train_begin()
    for _ in range(4):  # sync 1 sent, then taken in as sync 2 is sent
        cb.on_batch_end()
    cb.on_batch_end()
    with pytest.raises(SwarmError, match="round 2 failed: boom"):
        cb.on_batch_end()
    assert cb.syncs_done == 1


def test_with_adaptive_sync_each_merge_taken_in_is_evaluated_and_sets_the_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SWARM_LOOPBACK", raising=False)
    monkeypatch.setenv("SWARM_SL_SOCKET", str(tmp_path / "sl.sock"))
    _PlusOneSL(tmp_path / "sl.sock")
    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(2))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :2]), batch_size=8)
    args: dict[str, Any] = {"adsValData": loader, "adsValBatches": 1, "lossFunction": "MSELoss"}
    cb = SwarmCallback(
        2, 1, model=torch.nn.Linear(3, 2), totalEpochs=1, overlapSync=True, useAdaptiveSync=True, **args
    )
    assert cb.adaptive is not None
    cb.on_train_begin()
    for sync in range(5):  # 5 syncs sent; from the 2nd on, each first takes in the one before
        for _ in range(cb.steps_before_sync):
            cb.on_batch_end()
        assert cb.syncs_done == sync and cb.val_batches_evaluated == sync  # one batch per merge taken in
        # the interval the policy chose after the merge just taken in (syncFrequency before any)
        assert cb.steps_before_sync == (cb.adaptive.interval if sync else 2)
    assert cb.last_loss is not None
    cb.on_train_end()
    assert cb.syncs_done == 5 and cb.val_batches_evaluated == 5


# ------------------------------------------------------------------------------------- a real swarm
@pytest.mark.slow
def test_three_overlapping_nodes_take_in_every_merge_and_end_with_one_model(
    sn: RunningSN, tmp_path: Path
) -> None:
    nodes = [
        start_sl(
            sn,
            f"ov-{i}",
            tmp_path,
            SEED=i,
            MIN_PEERS=3,
            SYNC_FREQ=2,
            EPOCHS=2,
            BATCHES=8,
            SWARM_OVERLAP_SYNC="true",
        )
        for i in range(1, 4)
    ]
    codes = [node.wait() for node in nodes]
    assert codes == [0, 0, 0], [n.output()[-2000:] for n in nodes]
    digests = {node.final_digest() for node in nodes}
    assert len(digests) == 1 and None not in digests
    for node in nodes:
        out = node.output()
        found = re.search(r"SYNCS (\d+)", out)
        assert found is not None and int(found[1]) == 8, out[-2000:]  # 16 batches, every 2nd a sync
        assert out.count("taken in while training went on") == 8, out[-3000:]
        assert "All peers and Swarm training rounds finished. Final Swarm model was loaded." in out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_gpu_model_takes_in_the_merge_its_cpu_twin_does(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_model, gpu_model = _Mixed(), _Mixed().cuda()
    cpu_cb, gpu_cb = _standalone(cpu_model, monkeypatch), _standalone(gpu_model, monkeypatch)
    sent = gpu_cb._collect_weights(None)
    gpu_cb._keep_sent(sent)
    sent = FlatState(sent.specs, sent.buffer.copy())
    cpu_cb._keep_sent(sent)
    assert gpu_cb._sent is None and gpu_cb._staging is not None and gpu_cb._staging.has_kept  # on the GPU
    assert cpu_cb._sent is not None  # on the host
    for model in (cpu_model, gpu_model):  # training went on after the weights were sent
        with torch.no_grad():
            model.dense.weight.mul_(1.5)
            model.low.add_(0.125)
            model.state_dict()["norm.num_batches_tracked"].add_(3)
    change = {
        "dense.weight": torch.full((3, 5), -0.25),
        "low": torch.tensor([0.5, -1.0, 0.0, 2.0], dtype=torch.bfloat16),
        "norm.num_batches_tracked": torch.tensor(5),
        "flags": torch.zeros(3) > 0,
    }
    merged = _shifted(sent, change)
    for cb in (cpu_cb, gpu_cb):
        cb._apply_merge(merged)
    for name, tensor in cpu_model.state_dict().items():
        assert torch.equal(gpu_model.state_dict()[name].cpu(), tensor), name
    assert int(gpu_model.state_dict()["norm.num_batches_tracked"]) == 8
    other = _standalone(torch.nn.Linear(2, 2), monkeypatch)._collect_weights(None)
    with pytest.raises(SwarmError, match="layout differs"):
        gpu_cb._apply_merge(other)


@pytest.mark.slow
def test_an_overlapping_two_process_gloo_site_ends_with_the_swarms_model_on_every_rank(
    sn: RunningSN, tmp_path: Path
) -> None:
    def node(uid: str, seed: int, **more: Any) -> RunningSL:
        return start_sl(
            sn, uid, tmp_path, SEED=seed, SWARM_OVERLAP_SYNC="true", MIN_PEERS=3, SYNC_FREQ=2, **more
        )

    # gloo on CPU even on a GPU host
    ddp = node("ov-ddp", 1, sl_args=["--ml-nproc", "2"], CUDA_VISIBLE_DEVICES="")
    singles = [node(f"ov-{i}", i) for i in (2, 3)]
    codes = [ddp.wait(), *(node.wait() for node in singles)]
    assert codes == [0, 0, 0], [n.output()[-3000:] for n in (ddp, *singles)]
    # 16 batches, every 2nd a sync, taken in by each of the 2 ranks (each logs its own)
    assert ddp.output().count("taken in while training went on") == 2 * 8, ddp.output()[-3000:]
    ranks = ddp.final_digests()
    assert len(ranks) == 2, ddp.output()[-2000:]  # both ranks hold the final model
    assert set(ranks) == {node.final_digest() for node in singles}
