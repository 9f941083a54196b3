"""Settings a daemon reads from its environment, parsed one way: a bad value is logged and the default
used, so that a typo never stops a daemon."""

from __future__ import annotations

import logging
import os

__all__ = ["flag_from_env", "seconds_from_env"]

log = logging.getLogger("swarm.settings")


def seconds_from_env(name: str, default: float) -> float:
    """Seconds in ``$name`` (0 or more; negative counts as 0), or ``default`` when unset, empty or not a
    number (logged)."""
    text = os.environ.get(name, "").strip()
    try:
        return max(float(text), 0.0) if text else default
    except ValueError:
        log.warning("%s=%r is not a number of seconds; using %g", name, text, default)
        return default


def flag_from_env(name: str) -> bool:
    """Whether ``$name`` turns a setting on: ``true``, ``1``, ``yes`` or ``on`` in any case; anything else,
    unset included, is off."""
    return os.environ.get(name, "").strip().lower() in ("true", "1", "yes", "on")
