"""swci's own version (the installed distribution's, or the source tree's)."""

from __future__ import annotations

from importlib import metadata

__all__ = ["DISTRIBUTION", "swci_version"]

DISTRIBUTION = "open-swarm-learning"


def swci_version() -> str:
    """The version of the installed ``open-swarm-learning`` distribution ("unknown" when not installed)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"
