"""Models copied out of another SL's buffer file on this host: only this user's SL buffers are opened, each
copied chunk is checked, mappings are kept for the next rounds and dropped once their files are gone."""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from daemons.sl.peer_files import FileRefused, PeerFiles, checked_path, local_host
from wire import CodecError
from wire.shared import SharedBuffer
from wire.tensors import FlatState, Manifest, make_manifest

ROOT = Path(__file__).resolve().parent.parent
NBYTES = 300_032  # a whole number of the flat buffer's aligned tensors


@pytest.fixture
def sl_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "swarm-sl-peer"
    directory.mkdir(mode=0o700)
    return directory


@pytest.fixture
def files() -> Iterator[PeerFiles]:
    peer_files = PeerFiles()
    yield peer_files
    peer_files.forget()


def _buffer_file(directory: Path, name: str, seed: int = 0) -> tuple[SharedBuffer, Manifest]:
    """A peer's pool buffer: a model in a shared file, and its manifest."""
    rng = np.random.default_rng(seed)
    flat = FlatState.from_arrays({"w": rng.standard_normal(NBYTES // 4, dtype=np.float32)})
    assert flat.total == NBYTES
    shared = SharedBuffer.create(directory, name, NBYTES)
    shared.array[:] = flat.buffer
    return shared, make_manifest(flat, "row", chunk_size=64 << 10)


def test_a_peers_buffer_is_copied_and_its_mapping_kept_until_the_file_goes(
    sl_dir: Path, files: PeerFiles
) -> None:
    first, manifest = _buffer_file(sl_dir, "weights-1")
    into = np.zeros(NBYTES, dtype=np.uint8)
    files.copy_verified(str(first.path), manifest, into)
    assert np.array_equal(into, first.array)
    files.copy_verified(str(first.path), manifest, np.zeros(NBYTES, dtype=np.uint8))
    assert files.mapped_bytes == NBYTES  # mapped once for both copies
    second, other = _buffer_file(sl_dir, "weights-2", seed=1)
    first.path.unlink()
    files.copy_verified(str(second.path), other, into)
    assert np.array_equal(into, second.array)
    assert files.mapped_bytes == NBYTES  # the removed file's mapping went with the next mapping
    files.forget()
    assert files.mapped_bytes == 0


def test_copied_chunks_that_differ_from_the_manifest_are_named(sl_dir: Path, files: PeerFiles) -> None:
    shared, manifest = _buffer_file(sl_dir, "weights-1")
    shared.array[70_000] ^= 0xFF  # chunk 1 of 64 KiB chunks
    with pytest.raises(CodecError, match=r"chunks \[1\] of .*weights-1 do not match the manifest"):
        files.copy_verified(str(shared.path), manifest, np.zeros(NBYTES, dtype=np.uint8))


def test_only_this_users_sl_buffers_of_the_models_size_are_opened(
    tmp_path: Path, sl_dir: Path, files: PeerFiles
) -> None:
    shared, manifest = _buffer_file(sl_dir, "weights-1")
    elsewhere = tmp_path / "not-an-sl"
    elsewhere.mkdir()
    (elsewhere / "weights-1").write_bytes(shared.array.tobytes())
    (sl_dir / "weights-link").symlink_to(shared.path)
    os.mkfifo(sl_dir / "weights-fifo")
    (sl_dir / "weights-small").write_bytes(b"\0" * 10)
    into = np.zeros(NBYTES, dtype=np.uint8)
    for path, why in [
        (elsewhere / "weights-1", "not in an SL's directory"),
        (sl_dir / "key.pem", "not an SL's weight buffer"),
        (sl_dir / "weights-link", "Too many levels of symbolic links"),
        (sl_dir / "weights-fifo", "not a regular file"),
        (sl_dir / "weights-small", "10 bytes, not 300032"),
        (sl_dir / "weights-gone", "No such file"),
    ]:
        with pytest.raises(FileRefused, match=why):
            files.copy_verified(str(path), manifest, into)
    if os.geteuid() == 0:  # root can hand a file to another user
        os.chown(shared.path, 12345, 12345)
        with pytest.raises(FileRefused, match="owned by another user"):
            files.copy_verified(str(shared.path), manifest, into)
    assert not into.any() and files.mapped_bytes == 0


def test_a_named_file_must_look_like_an_sl_buffer() -> None:
    assert checked_path("/dev/shm/swarm-sl-ab12/weights-3") == "/dev/shm/swarm-sl-ab12/weights-3"
    escaping = "/dev/shm/swarm-sl-a/../../etc/weights-1"
    for bad in ("", "weights-1", "/etc/passwd", escaping, 7, "/x/\0/weights-1"):
        with pytest.raises(CodecError, match="'file'"):
            checked_path(bad)


def test_an_address_is_of_this_host_when_we_can_bind_to_it() -> None:
    assert local_host("127.0.0.1")
    assert not local_host("192.0.2.1")  # TEST-NET-1: nobody's
    assert not local_host("not an address")


def test_copies_of_one_file_at_once_keep_one_mapping_and_leak_no_descriptor(
    sl_dir: Path, files: PeerFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared, manifest = _buffer_file(sl_dir, "weights-1")
    both_mapped = threading.Barrier(2, timeout=10)
    real_mmap = mmap.mmap

    def mapped_by_both(*args: Any, **kwargs: Any) -> mmap.mmap:
        mapping = real_mmap(*args, **kwargs)
        both_mapped.wait()  # neither keeps its mapping before the other made one
        return mapping

    monkeypatch.setattr(mmap, "mmap", mapped_by_both)
    open_before = len(os.listdir("/proc/self/fd"))
    targets = [np.zeros(NBYTES, dtype=np.uint8) for _ in range(2)]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda into: files.copy_verified(str(shared.path), manifest, into), targets))
    assert all(np.array_equal(into, shared.array) for into in targets)
    assert files.mapped_bytes == NBYTES
    files.forget()
    assert len(os.listdir("/proc/self/fd")) == open_before
