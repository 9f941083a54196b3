"""Logging for daemons: one line format, stderr plus a log file per node."""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["LOG_FORMAT", "setup_logging"]

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def setup_logging(name: str, *, log_dir: Path | None = None, level: str | None = None) -> Path | None:
    """Log to stderr and, when ``log_dir`` is given, to ``<log_dir>/<name>.log``; returns the file."""
    level_name = (
        level or os.environ.get("SL_LOG_LEVEL") or os.environ.get("SWARM_LOG_LEVEL") or "INFO"
    ).upper()
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(getattr(logging, level_name, logging.INFO))
    formatter = logging.Formatter(LOG_FORMAT)
    stream = logging.StreamHandler()
    stream.setFormatter(formatter)
    root.addHandler(stream)
    for noisy in ("amqtt", "transitions", "swarm.bus.mqtt"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if log_dir is None:
        return None
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"{name}.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(formatter)
    root.addHandler(handler)
    return path
