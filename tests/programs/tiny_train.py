"""A tiny real training program for end-to-end tests: a 2-layer net on synthetic data, with SwarmCallback.

Environment: MIN_PEERS, SYNC_FREQ, EPOCHS, BATCHES (per epoch), SEED, CONTRACT, MERGE, SCRATCH_DIR,
FAIL_AT_BATCH (exit 3 there), SLEEP_PER_BATCH (seconds), HIDDEN (width: another width, another model),
DP_NOISE and DP_CLIP (differential privacy: dpNoiseMultiplier, dpClipNorm), SECURE=1 (secureAggregation).
POISON=nan (a broken site: its first weight matrix turns NaN after every step).
ADAPTIVE (1: useAdaptiveSync), VAL_BATCHES (adsValBatches; validation batches are 8 samples).
Under torchrun (RANK set; ``swarm sl --ml-nproc 2``) it trains with DistributedDataParallel on the gloo
backend, each rank on its half of every batch; rank 0 alone talks to the SL.
"""

import gc
import hashlib
import os
import sys
import time
from pathlib import Path

import torch

from swarmlearning.distributed import end_distributed, start_distributed
from swarmlearning.pyt import SwarmCallback

torch.set_num_threads(1)
env = os.environ.get
seed = int(env("SEED", "0"))
torch.manual_seed(seed)
hidden = int(env("HIDDEN", "16"))
model = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2))
rank, world = int(env("RANK", "0")), int(env("WORLD_SIZE", "1"))
start_distributed()
if torch.distributed.is_initialized():
    model = torch.nn.parallel.DistributedDataParallel(model)
data = torch.randn(256, 8, generator=torch.Generator().manual_seed(100 + seed))
labels = (data[:, 0] + data[:, 1] > 0).long()
val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data[:64], labels[:64]), batch_size=8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = torch.nn.CrossEntropyLoss()
epochs, batches = int(env("EPOCHS", "2")), int(env("BATCHES", "8"))
dp = {"dpNoiseMultiplier": float(env("DP_NOISE", "0")), "dpClipNorm": float(env("DP_CLIP", "1"))}
callback = SwarmCallback(
    int(env("SYNC_FREQ", "4")),
    int(env("MIN_PEERS", "2")),
    trainingContract=env("CONTRACT", "defaultbb.cqdb.sml.hpe"),
    mergeMethod=env("MERGE", "mean"),
    model=model,
    totalEpochs=epochs,
    adsValData=val,
    useAdaptiveSync=env("ADAPTIVE", "0") == "1",
    adsValBatches=int(env("VAL_BATCHES", "4")),
    lossFunction="CrossEntropyLoss",
    **(dp if env("DP_NOISE") else {}),
    **({"secureAggregation": True} if env("SECURE") else {}),
)
gate = env("START_GATE")  # tests: every node joins its contract before any starts training
while gate and not Path(gate).exists():
    time.sleep(0.05)
callback.on_train_begin()
fail_at = int(env("FAIL_AT_BATCH", "-1"))
pause = float(env("SLEEP_PER_BATCH", "0"))
poison = env("POISON", "")
step = 0
for epoch in range(epochs):
    for b in range(batches):
        lo = b * 32 % 256 + rank * 32 // world
        x, y = data[lo : lo + 32 // world], labels[lo : lo + 32 // world]
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        if poison == "nan":
            with torch.no_grad():
                next(model.parameters()).fill_(float("nan"))
        step += 1
        if step == fail_at:
            print("failing on purpose at batch", step, flush=True)
            sys.exit(3)
        if pause:
            time.sleep(pause)
        callback.on_batch_end(b)
    callback.on_epoch_end(epoch)
callback.on_train_end()
module = model.module if hasattr(model, "module") else model
state = module.state_dict()
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in state.values())).hexdigest()
scratch = Path(env("SCRATCH_DIR", "."))
scratch.mkdir(parents=True, exist_ok=True)
if rank == 0:
    torch.save(state, scratch / "final_model.pt")
print(f"SYNCS {callback.syncs_done} VAL_BATCHES_EVALUATED {callback.val_batches_evaluated}", flush=True)
print(f"FINAL_DIGEST {digest}" + (f" rank {rank}" if world > 1 else ""), flush=True)
# DDP (and the callback holding it) keep the process group alive; a group left to the interpreter's exit
# aborts the rank there ("terminate called without an active exception"). Drop them, then leave.
del callback, model, opt
end_distributed()
# Leave without the interpreter's last collections over torch's objects (about 280,000): they took 1.1-1.5 s
# of CPU at every exit of this program on a 2-core machine, the nodes of a test all exiting at once.
gc.freeze()
