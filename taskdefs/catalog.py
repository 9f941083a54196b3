"""The task definitions shipped with open Swarm Learning (``taskdefs/shipped/*.yaml``)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["SHIPPED_DIR", "shipped_names", "shipped_path"]

SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"


def shipped_names() -> list[str]:
    """File names of the shipped task definitions, sorted."""
    return sorted(path.name for path in SHIPPED_DIR.glob("*.yaml"))


def shipped_path(name: str) -> Path:
    """Path of a shipped task definition, by file name with or without ``.yaml``.

    Raises:
        FileNotFoundError: no such shipped file (the message lists the ones there are).
    """
    file_name = name if name.endswith(".yaml") else f"{name}.yaml"
    path = SHIPPED_DIR / file_name
    if "/" in name or "\\" in name or not path.is_file():
        available = ", ".join(shipped_names()) or "none"
        msg = f"no shipped task definition {name!r}; available: {available}"
        raise FileNotFoundError(msg)
    return path
