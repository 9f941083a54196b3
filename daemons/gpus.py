"""Which GPUs an ML process gets: the reference's ``gpus`` options become ``CUDA_VISIBLE_DEVICES``."""

from __future__ import annotations

import os
import shutil
import subprocess

__all__ = ["cuda_env", "visible_gpus"]


def visible_gpus() -> list[str]:
    """GPUs this host can give out: ``CUDA_VISIBLE_DEVICES`` if set, else what nvidia-smi lists."""
    preset = os.environ.get("CUDA_VISIBLE_DEVICES")
    if preset is not None:
        return [d.strip() for d in preset.split(",") if d.strip()]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def cuda_env(request: object, slot: int = 0, visible: list[str] | None = None) -> dict[str, str]:
    """Environment for a node in position ``slot`` asking for ``request`` GPUs (empty: inherit).

    ``"all"`` inherits every GPU; ``"device=0,1"`` gives those; ``N`` the first N; ``"auto"`` spreads
    nodes over the visible GPUs round robin. Raises ValueError for a request it cannot parse.
    """
    if request is None or request == "":
        return {}
    # Not at the top: taskdefs brings pydantic and every task model, a quarter of an SL's start-up,
    # and an SL asks for GPUs only when its node has a gpus option.
    from taskdefs import parse_gpu_request  # noqa: PLC0415

    gpu = parse_gpu_request(request)
    if gpu.kind == "all":
        return {}
    devices = gpu.select(visible_gpus() if visible is None else visible, slot)
    return {"CUDA_VISIBLE_DEVICES": ",".join(devices)}
