"""Logging for daemons: one line format, stderr plus a log file per node."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

__all__ = ["LOG_FORMAT", "LineFormatter", "setup_logging"]

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


class LineFormatter(logging.Formatter):
    """``LOG_FORMAT``, formatted once per record however many handlers write it (a daemon writes each
    line to stderr and its log file, an SL also to ``<program>_sw.log``)."""

    def __init__(self) -> None:
        super().__init__(LOG_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = record.__dict__.get("_swarm_line")
        if not isinstance(line, str):
            line = super().format(record)
            record.__dict__["_swarm_line"] = line
        return line


class _FileHandler(logging.FileHandler):
    """A log file that, when it cannot be written (a full disk), says so once on stderr and carries on."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.failing = False
        self._failed_now = False

    def emit(self, record: logging.LogRecord) -> None:
        self._failed_now = False
        super().emit(record)
        if self.failing and not self._failed_now:
            self.failing = False  # written again: the next failure is reported again

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        self._failed_now = True
        if not self.failing:
            self.failing = True
            error = sys.exc_info()[1]
            sys.stderr.write(
                f"swarm: cannot write the log file {self.baseFilename}: {error}; "
                "its lines go to stderr only until it can\n"
            )


def setup_logging(name: str, *, log_dir: Path | None = None, level: str | None = None) -> Path | None:
    """Log to stderr and, when ``log_dir`` is given, to ``<log_dir>/<name>.log``; returns the file.

    Raises:
        SystemExit: with one line saying why, when the log file cannot be written.
    """
    level_name = (
        level or os.environ.get("SL_LOG_LEVEL") or os.environ.get("SWARM_LOG_LEVEL") or "INFO"
    ).upper()
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(getattr(logging, level_name, logging.INFO))
    formatter = LineFormatter()
    stream = logging.StreamHandler()
    stream.setFormatter(formatter)
    root.addHandler(stream)
    for noisy in ("amqtt", "transitions", "swarm.bus.mqtt"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if log_dir is None:
        return None
    path = log_dir / f"{name}.log"
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        handler = _FileHandler(path)
    except OSError as exc:  # a read-only or full data directory: say so in one line
        raise SystemExit(f"swarm: cannot write the log file {path}: {exc.strerror or exc}") from None
    handler.setFormatter(formatter)
    root.addHandler(handler)
    return path
