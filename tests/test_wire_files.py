"""Files users hand us are read with limits: special files are refused at once, big ones refused whole."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest

from certs import CertError, load_certificate
from swci.task_files import create_task_from
from taskdefs import TaskDefError, load_swop_profile, load_task_definition
from wire.files import UnsafeFileError, read_bounded, read_bounded_stream


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.yaml"
    os.mkfifo(path)
    return path


def test_a_regular_file_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "task.yaml"
    path.write_bytes(b"Name: t\n" * 10)
    assert read_bounded(path) == b"Name: t\n" * 10


@pytest.mark.parametrize(
    ("special", "kind"),
    [
        ("/dev/zero", "character device"),
        ("/dev/urandom", "character device"),
        ("/dev/null", "character device"),
    ],
)
def test_devices_are_refused_before_reading(special: str, kind: str) -> None:
    with pytest.raises(UnsafeFileError, match=kind) as caught:
        read_bounded(special)
    assert caught.value.filename == special


def test_a_fifo_is_refused_without_waiting_for_a_writer(fifo: Path) -> None:
    with pytest.raises(UnsafeFileError, match="FIFO"):
        read_bounded(fifo)


def test_a_symlink_to_a_device_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "innocent.yaml"
    link.symlink_to("/dev/zero")
    with pytest.raises(UnsafeFileError, match="character device"):
        read_bounded(link)


def test_a_directory_and_a_missing_file_fail_as_open_would(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        read_bounded(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_bounded(tmp_path / "missing.yaml")


def test_a_file_over_the_limit_is_refused_whole(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    with path.open("wb") as out:
        out.truncate(10 << 30)  # sparse: 10 GiB that cost nothing
    with pytest.raises(UnsafeFileError, match="over the limit of 4 MiB"):
        read_bounded(path)
    small = tmp_path / "small.yaml"
    small.write_bytes(b"x" * 101)
    with pytest.raises(UnsafeFileError, match="over the limit of 100 bytes"):
        read_bounded(small, limit=100)
    assert read_bounded(small, limit=101) == b"x" * 101


def test_a_stream_over_the_limit_is_refused_not_truncated() -> None:
    assert read_bounded_stream(io.BytesIO(b"abc"), limit=3) == b"abc"
    with pytest.raises(UnsafeFileError, match="more than 3 bytes"):
        read_bounded_stream(io.BytesIO(b"abcd"), limit=3)


def test_task_definitions_and_profiles_from_special_files_are_located_errors(fifo: Path) -> None:
    for loader in (load_task_definition, load_swop_profile):
        for path in ("/dev/zero", str(fifo)):
            with pytest.raises(TaskDefError) as caught:
                loader(path)
            assert str(caught.value).startswith(path)
            assert "expected a regular file" in str(caught.value)


def test_create_task_from_dev_zero_fails_with_one_clear_line() -> None:
    unused_link = cast(Any, None)  # the file is refused before the ledger is asked anything
    result = asyncio.run(create_task_from(unused_link, Path("/dev/zero")))
    assert not result.ok
    assert result.messages == [
        "/dev/zero: cannot read the file: is a character device, expected a regular file"
    ]


def test_certificates_from_special_files_are_cert_errors(fifo: Path) -> None:
    expected = "certificate file /dev/zero is a character device, expected a regular file"
    with pytest.raises(CertError, match=expected):
        load_certificate("/dev/zero")
    with pytest.raises(CertError, match="FIFO"):
        load_certificate(fifo)


def test_swci_refuses_a_fifo_script_and_an_endless_stdin(fifo: Path) -> None:
    command = [sys.executable, "-m", "swci.main", "--init-script", str(fifo)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "FIFO" in done.stdout + done.stderr, done
    with Path("/dev/zero").open("rb") as endless:
        command = [sys.executable, "-m", "swci.main"]
        done = subprocess.run(command, stdin=endless, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "more than 4 MiB" in done.stdout + done.stderr, done
