"""GPU requests: the ``gpus`` option of a SWOP profile's ``usrcontaineropts``.

The reference passes it to Docker (``--gpus``); we turn it into the ``CUDA_VISIBLE_DEVICES`` of
the ML process. Forms: ``"all"``, ``"device=0,1"`` (indexes or GPU UUIDs), a count (``2`` or
``"2"``), and ours, ``"auto"``: the SWOP's nodes are spread over the visible GPUs, one each.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from taskdefs.fields import find_placeholder
from taskdefs.validation import describe

__all__ = ["GpuRequest", "parse_gpu_request"]

_DEVICE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:/._-]*$")
_EXPECTED = "must be 'all', 'auto', a GPU count such as 2, or 'device=0,1'"


class GpuRequest(BaseModel):
    """Which GPUs one ML process may use.

    Attributes:
        kind: ``all``, ``auto`` (one visible GPU per node, round robin), ``count`` or ``devices``.
        count: how many GPUs (``kind == "count"``).
        devices: GPU indexes or UUIDs as written (``kind == "devices"``).
    """

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    kind: Literal["all", "auto", "count", "devices"]
    count: int | None = None
    devices: tuple[str, ...] = ()

    def __str__(self) -> str:
        """The Docker form (``all``, ``2``, ``device=0,1``), or ``auto``."""
        if self.kind == "count":
            return str(self.count)
        if self.kind == "devices":
            return "device=" + ",".join(self.devices)
        return self.kind

    def select(self, visible: Sequence[str], slot: int) -> list[str]:
        """The devices for the node in position ``slot`` when ``visible`` GPUs are present.

        Args:
            visible: the GPUs the SWOP sees (indexes or UUIDs), in order; may be empty.
            slot: the node's position among the SWOP's nodes (0, 1, ...).

        Returns:
            The value for ``CUDA_VISIBLE_DEVICES`` as a list; empty means no GPU.
        """
        if self.kind == "devices":
            return list(self.devices)
        if self.kind == "count":
            return list(visible[: self.count or 0])
        if self.kind == "auto":
            return [visible[slot % len(visible)]] if visible else []
        return list(visible)


def _count(value: int) -> GpuRequest:
    if value < 1:
        msg = f"{_EXPECTED}; a count must be at least 1, got {value}"
        raise ValueError(msg)
    return GpuRequest(kind="count", count=value)


def _devices(listed: str) -> GpuRequest:
    devices = tuple(item.strip() for item in listed.split(","))
    bad = [item for item in devices if not _DEVICE.match(item)]
    if bad or not devices:
        msg = f"{_EXPECTED}; {bad[0] if bad else listed!r} is not a GPU index or UUID"
        raise ValueError(msg)
    if len(set(devices)) != len(devices):
        msg = f"lists a GPU twice: {listed!r}"
        raise ValueError(msg)
    return GpuRequest(kind="devices", devices=devices)


def _from_text(text: str) -> GpuRequest:
    placeholder = find_placeholder(text)
    if placeholder is not None:
        msg = f"placeholder {placeholder} was not replaced; {_EXPECTED}"
        raise ValueError(msg)
    cleaned = text.strip().strip("\"'").strip()
    lowered = cleaned.lower()
    if lowered in {"all", "auto"}:
        return GpuRequest(kind="all" if lowered == "all" else "auto")
    if cleaned.isdigit():
        return _count(int(cleaned))
    key, sep, rest = cleaned.partition("=")
    if sep and key.strip().lower() == "count" and rest.strip().isdigit():
        return _count(int(rest.strip()))
    if sep and key.strip().lower() in {"device", "devices"}:
        return _devices(rest)
    msg = f"{_EXPECTED}, got {describe(text)}"
    raise ValueError(msg)


def parse_gpu_request(value: object) -> GpuRequest:
    """Parse a ``gpus`` value (``"all"``, ``"device=3,5"``, ``2``, ``"auto"``).

    Raises:
        ValueError: any other value, with what is expected.
    """
    if isinstance(value, GpuRequest):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return _count(value)
    if isinstance(value, str):
        return _from_text(value)
    msg = f"{_EXPECTED}, got {describe(value)}"
    raise ValueError(msg)
