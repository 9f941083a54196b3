"""The daemons' log lines (``daemons/logs.py``)."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path

import pytest

from daemons.logs import LineFormatter, setup_logging


def _logger(name: str, streams: list[io.StringIO]) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.handlers.clear()
    logger.propagate = False
    logger.setLevel(logging.INFO)
    for stream in streams:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(LineFormatter())
        logger.addHandler(handler)
    return logger


def test_a_line_is_formatted_once_and_written_the_same_by_every_handler() -> None:
    streams = [io.StringIO() for _ in range(3)]
    logger = _logger("test.logs.same", streams)
    logger.info("round %d steps: hash=%.2fms", 3, 0.25)
    logger.warning("second line")
    texts = [s.getvalue() for s in streams]
    assert texts[0] == texts[1] == texts[2]
    lines = texts[0].splitlines()
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} test\.logs\.same INFO round 3 steps: hash=0\.25ms", lines[0]
    )
    assert lines[1].endswith("test.logs.same WARNING second line")


def test_an_exception_line_carries_its_traceback_to_every_handler() -> None:
    streams = [io.StringIO() for _ in range(2)]
    logger = _logger("test.logs.exc", streams)
    try:
        raise ValueError("bad weights")
    except ValueError:
        logger.exception("the merge failed")
    assert streams[0].getvalue() == streams[1].getvalue()
    assert "the merge failed\nTraceback (most recent call last):" in streams[0].getvalue()
    assert streams[0].getvalue().rstrip().endswith("ValueError: bad weights")


def test_setup_logging_writes_the_same_lines_to_stderr_and_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        path = setup_logging("node-1", log_dir=tmp_path, level="INFO")
        logging.getLogger("swarm.test").info("checked in model %s", "ab12")
        for handler in root.handlers:
            handler.flush()
        assert path is not None
        written = path.read_text()
        assert written.endswith("swarm.test INFO checked in model ab12\n")
        assert written in capsys.readouterr().err
    finally:
        for handler in root.handlers:
            if handler not in saved[0]:
                handler.close()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
