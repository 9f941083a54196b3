"""MNIST with PyTorch and Swarm Learning: the model program of the mnist-pyt example.

It reads ``$DATA_DIR/mnist.npz`` in Keras format (x_train, y_train, x_test, y_test), trains a small CNN
with ``SwarmCallback`` (merging with the other nodes every SYNC_FREQUENCY batches), and saves the final
swarm model and a result summary in ``$SCRATCH_DIR``. It runs unchanged on CPU and on a GPU (whatever
``CUDA_VISIBLE_DEVICES`` gives it); with ``SWARM_LOOPBACK=true`` it trains alone.
"""

import hashlib
import importlib.util
import json
import logging
import os
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from swarmlearning.pyt import SwarmCallback

data_dir = Path(os.getenv("DATA_DIR", "./data"))
scratch_dir = Path(os.getenv("SCRATCH_DIR", "./scratch"))
max_epochs = int(os.getenv("MAX_EPOCHS", "5"))
min_peers = int(os.getenv("MIN_PEERS", "2"))
sync_frequency = int(os.getenv("SYNC_FREQUENCY", "128"))
batch_size = int(os.getenv("BATCH_SIZE", "32"))
merge_method = os.getenv("MERGE_METHOD", "mean")
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.set_num_threads(int(os.getenv("TORCH_THREADS", "1")))
torch.manual_seed(int(os.getenv("SEED", "0")))


class Net(nn.Module):
    """Two convolutions and two dense layers: plenty for MNIST."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def load_data() -> tuple[TensorDataset, TensorDataset]:
    """The Keras-format mnist.npz of this node (its private data)."""
    with np.load(data_dir / "mnist.npz") as data:
        x_train, y_train, x_test, y_test = (data[k] for k in ("x_train", "y_train", "x_test", "y_test"))

    def tensors(x: np.ndarray, y: np.ndarray) -> TensorDataset:
        images = torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1)
        return TensorDataset(images, torch.from_numpy(y.astype(np.int64)))

    return tensors(x_train, y_train), tensors(x_test, y_test)


def evaluate(model: nn.Module, loader: DataLoader) -> float:
    """Accuracy on ``loader``."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x.to(device)).argmax(1) == y.to(device)).sum().item()
            total += len(y)
    model.train()
    return correct / max(total, 1)


def main() -> None:
    train_ds, test_ds = load_data()
    train_loader = DataLoader(train_ds, batch_size=batch_size, shuffle=True)
    test_loader = DataLoader(test_ds, batch_size=256)
    model = Net().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    swarm = SwarmCallback(
        syncFrequency=sync_frequency,
        minPeers=min_peers,
        useAdaptiveSync=False,
        adsValData=test_loader,
        adsValBatchSize=256,
        model=model,
        totalEpochs=max_epochs,
        mergeMethod=merge_method,
        lossFunction="CrossEntropyLoss",
        metricFunction="Accuracy" if _has_torchmetrics() else None,
        metricFunctionArgs={"task": "multiclass", "num_classes": 10},
    )
    swarm.logger.setLevel(logging.INFO)
    print(f"training on {device} with {len(train_ds)} local samples, {max_epochs} epochs", flush=True)
    start = time.time()
    swarm.on_train_begin()
    for epoch in range(max_epochs):
        for batch, (x, y) in enumerate(train_loader):
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
            swarm.on_batch_end(batch)
        print(f"epoch {epoch + 1}/{max_epochs}: test accuracy {evaluate(model, test_loader):.4f}", flush=True)
        swarm.on_epoch_end(epoch)
    swarm.on_train_end()
    accuracy = evaluate(model, test_loader)
    save(model, accuracy, start, time.time(), {**swarm.timings, "syncs": swarm.syncs_done})


def _has_torchmetrics() -> bool:
    return importlib.util.find_spec("torchmetrics") is not None


def save(
    model: nn.Module, accuracy: float, started: float, ended: float, swarm_timings: dict[str, float]
) -> None:
    """Save the final swarm model and what the demo prints about it (``started``, ``ended``: unix times of
    the start of training and of the final evaluation's end)."""
    scratch_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch.save(state, scratch_dir / "mnist_final.pt")
    digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in state.values())).hexdigest()
    result = {
        "accuracy": accuracy,
        "digest": digest,
        "seconds": ended - started,
        "started_at": started,
        "ended_at": ended,
        "device": str(device),
        "swarm": swarm_timings,
    }
    (scratch_dir / "result.json").write_text(json.dumps(result))
    print(
        f"final model: test accuracy {accuracy:.4f}, digest {digest[:16]}, saved in {scratch_dir}", flush=True
    )


if __name__ == "__main__":
    main()
