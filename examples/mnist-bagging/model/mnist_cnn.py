"""The MNIST CNN of a bagging study: one bootstrap sample and one draw of the network's parameters.

Run as a trial of the ``RUN_TRIALS`` task ``mnist_bagging``, it reads its parameters from the
environment (``n_conv_layer``, ``kernel_size``, ``n_hidden_layer``, ``lr``, ``momentum``,
``BOOTSTRAP_SEED``), trains on a bootstrap sample of ``$DATA_DIR/mnist.npz`` (Keras format) and reports
its validation error and the class probabilities it gives four test images with ``report_trial``.

The same program trains a Swarm Learning node (``RUN_SWARM``: ``SwarmCallback`` merges with the other
nodes) and a multi-GPU site: under torchrun (``nproc`` in the SWOP profile) every rank trains on its
part of each epoch with DistributedDataParallel, NCCL on GPUs and gloo on CPU. ``AMP=1`` trains with
automatic mixed precision (``torch.autocast``, float16 with a ``GradScaler`` on a GPU, bfloat16 on CPU).
"""

import os
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from swarmlearning.distributed import end_distributed, is_main_rank, start_distributed
from swarmlearning.pyt import SwarmCallback
from swarmlearning.trial import report_trial

env = os.environ.get
data_dir = Path(env("DATA_DIR", "./data"))
epochs = int(env("EPOCHS", "2"))
batch_size = int(env("BATCH_SIZE", "64"))
train_limit = int(env("TRAIN_LIMIT", "0"))  # use only the first N training images (0: all)
amp = env("AMP", "0").lower() in ("1", "true", "yes")
torch.set_num_threads(int(env("TORCH_THREADS", "1")))
PROBES = 4


class Net(nn.Module):
    """Convolutions (8, 16, 32 channels), then dense layers of 64 units, then 10 classes."""

    def __init__(self, n_conv_layer: int, kernel_size: int, n_hidden_layer: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels, size = 1, 28
        for i in range(n_conv_layer):
            layers += [nn.Conv2d(channels, 8 * 2**i, kernel_size, padding=kernel_size // 2), nn.ReLU()]
            channels = 8 * 2**i
            if size >= 14:
                layers.append(nn.MaxPool2d(2))
                size //= 2
        layers.append(nn.Flatten())
        width = channels * size * size
        for _ in range(n_hidden_layer):
            layers += [nn.Linear(width, 64), nn.ReLU()]
            width = 64
        layers.append(nn.Linear(width, 10))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def load() -> tuple[TensorDataset, TensorDataset]:
    """This site's mnist.npz as tensors; a bootstrap sample of the training set with BOOTSTRAP_SEED."""
    with np.load(data_dir / "mnist.npz") as data:
        x_train, y_train, x_test, y_test = (data[k] for k in ("x_train", "y_train", "x_test", "y_test"))
    if train_limit:
        x_train, y_train = x_train[:train_limit], y_train[:train_limit]
    if env("BOOTSTRAP_SEED") is not None:
        pick = np.random.default_rng(int(env("BOOTSTRAP_SEED", "0"))).integers(0, len(x_train), len(x_train))
        x_train, y_train = x_train[pick], y_train[pick]

    def tensors(x: np.ndarray, y: np.ndarray) -> TensorDataset:
        images = torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1)
        return TensorDataset(images, torch.from_numpy(y.astype(np.int64)))

    return tensors(x_train, y_train), tensors(x_test, y_test)


def autocast(device: torch.device) -> torch.autocast:
    """Mixed precision when AMP is on: float16 on a GPU, bfloat16 on CPU."""
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    return torch.autocast(device.type, dtype=dtype, enabled=amp)


def predict(model: nn.Module, loader: DataLoader, device: torch.device) -> torch.Tensor:
    """Class probabilities for every sample of ``loader``."""
    model.eval()
    with torch.no_grad(), autocast(device):
        out = torch.cat([torch.softmax(model(x.to(device)).float(), 1).cpu() for x, _ in loader])
    model.train()
    return out


def main() -> None:
    device = start_distributed()
    torch.manual_seed(int(env("SEED", "0")))
    train_ds, test_ds = load()
    net = Net(int(env("n_conv_layer", "2")), int(env("kernel_size", "3")), int(env("n_hidden_layer", "1")))
    net = net.to(device)
    distributed = torch.distributed.is_initialized()
    model: nn.Module = net
    if distributed:
        model = nn.parallel.DistributedDataParallel(
            net, device_ids=[device] if device.type == "cuda" else None
        )
    sampler = DistributedSampler(train_ds) if distributed else None
    train = DataLoader(train_ds, batch_size=batch_size, shuffle=sampler is None, sampler=sampler)
    test = DataLoader(test_ds, batch_size=256)
    opt = torch.optim.SGD(
        model.parameters(), lr=float(env("lr", "0.05")), momentum=float(env("momentum", "0.5"))
    )
    scaler = torch.amp.GradScaler(device.type, enabled=amp and device.type == "cuda")
    loss_fn = nn.CrossEntropyLoss()
    callback = SwarmCallback(
        int(env("SYNC_FREQUENCY", "64")), int(env("MIN_PEERS", "2")), model=model, totalEpochs=epochs
    )
    started = time.perf_counter()
    callback.on_train_begin()
    for epoch in range(epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for batch, (x, y) in enumerate(train):
            opt.zero_grad()
            with autocast(device):
                loss = loss_fn(model(x.to(device)), y.to(device))
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            callback.on_batch_end(batch)
        callback.on_epoch_end(epoch)
    callback.on_train_end()
    probabilities = predict(net, test, device)
    labels = test_ds.tensors[1]
    val_error = float((probabilities.argmax(1) != labels).float().mean())
    if is_main_rank():
        seconds = time.perf_counter() - started
        print(f"val_error {val_error:.4f} after {epochs} epoch(s) in {seconds:.1f} s on {device}", flush=True)
        probes = test_ds.tensors[0][:PROBES].flatten(1)
        report_trial(
            {"val_error": val_error, "train_seconds": seconds},
            probabilities=probabilities[:PROBES].tolist(),
            probes=probes.tolist(),
        )
    del callback, model, opt  # they hold the process group: let it go before leaving (see end_distributed)
    end_distributed()


if __name__ == "__main__":
    main()
