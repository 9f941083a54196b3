"""Multi-process sites: join and leave the local process group when the SL runs the program under torchrun.

A node with ``nproc`` > 1 (``usrcontaineropts: [nproc: gpus]``, or ``swarm sl --ml-nproc``) runs its
program as one rank per process. ``start_distributed()`` joins them (NCCL on GPUs, gloo on CPU) and
returns this rank's device; ``SwarmCallback`` then syncs through rank 0 and broadcasts to the others.
``end_distributed()`` leaves. Drop the DistributedDataParallel model (and the SwarmCallback that holds
it) before calling it: DDP keeps the process group alive, and a group that is only destroyed when the
interpreter exits takes gloo's threads down with it there, which aborts the rank ("terminate called
without an active exception", SIGABRT; torchrun then stops the other ranks and the node fails).
"""

from __future__ import annotations

import gc
import os

import torch
import torch.distributed as dist

__all__ = ["end_distributed", "is_main_rank", "start_distributed"]


def start_distributed() -> torch.device:
    """Join the process group torchrun set up (none outside torchrun); returns this rank's device."""
    cuda = torch.cuda.is_available()
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return torch.device("cuda" if cuda else "cpu")
    if not cuda:
        dist.init_process_group("gloo")
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    return device


def is_main_rank() -> bool:
    """Whether this process is rank 0 (or the only one): the one that saves files and prints results."""
    return not dist.is_initialized() or dist.get_rank() == 0


def end_distributed() -> None:
    """Leave the process group (nothing outside torchrun): free what dropped models held, wait for every
    rank, then destroy the group while the interpreter is fully alive."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
