"""The pool of model-sized buffers (``daemons/sl/buffers.py``): a buffer comes back only once nothing
holds it, not even a view, a memoryview or a FlatState; the pool keeps within its bytes; buffers of the
size shared with an ML program are files it can map, and a full memory directory leaves them on the heap."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

from daemons.sl.buffers import BufferPool
from tests.conftest import SmallDisk
from wire.shared import SharedBuffer
from wire.tensors import FlatState, TensorSpec

MB = 1 << 20


def test_a_buffer_comes_back_once_nothing_holds_it() -> None:
    pool = BufferPool()
    first = pool.take(2 * MB)
    address = first.ctypes.data
    del first
    again = pool.take(2 * MB)
    assert again.ctypes.data == address
    assert pool.take(2 * MB).ctypes.data != address  # still held as ``again``


def test_views_memoryviews_and_flat_states_hold_their_buffer() -> None:
    pool = BufferPool()
    holders = []
    for make in (
        lambda b: b[10:20],
        lambda b: b.data.cast("B"),
        lambda b: b.view(np.float32),
        lambda b: FlatState((TensorSpec("w", "uint8", (2 * MB,), 0, 2 * MB),), b),
    ):
        buffer = pool.take(2 * MB)
        holders.append((make(buffer), buffer.ctypes.data))
        del buffer
    addresses = {address for _, address in holders}
    assert len(addresses) == 4  # each kept its buffer from being handed out again
    holders.clear()
    gc.collect()
    assert pool.take(2 * MB).ctypes.data in addresses


def test_rows_are_a_matrix_over_one_pooled_buffer() -> None:
    pool = BufferPool()
    rows = pool.take_rows(3, MB)
    assert rows.shape == (3, MB) and rows.dtype == np.uint8
    address = rows.ctypes.data
    assert pool.take(3 * MB).ctypes.data != address  # the matrix holds it
    del rows
    assert pool.take(3 * MB).ctypes.data == address


def test_the_pool_keeps_within_its_bytes_and_forgets_sizes_no_longer_used() -> None:
    pool = BufferPool(max_bytes=5 * MB)
    held = [pool.take(2 * MB), pool.take(2 * MB), pool.take(2 * MB)]
    assert pool.pooled_bytes == 4 * MB  # the third did not fit: made, not kept
    held.clear()
    bigger = pool.take(3 * MB)  # the model changed: unused 2 MB buffers make room
    assert pool.pooled_bytes <= 5 * MB
    assert bigger.nbytes == 3 * MB
    assert pool.take(MB // 2).nbytes == MB // 2  # small buffers are never kept
    assert pool.pooled_bytes <= 5 * MB


def test_buffers_of_a_shared_size_are_files_the_pool_names_and_removes(tmp_path: Path) -> None:
    pool = BufferPool()
    pool.share(2 * MB, tmp_path)
    first, second = pool.take(2 * MB), pool.take(2 * MB)
    other = pool.take(3 * MB)  # another size stays on the heap
    names = {pool.file_of(first), pool.file_of(second)}
    assert None not in names and len(names) == 2 and names == set(tmp_path.iterdir())
    assert pool.file_of(first.reshape(2, MB)) == pool.file_of(first)  # a view of all of it is it
    assert pool.file_of(first[1:]) is None and pool.file_of(first[:MB]) is None  # a part is not
    assert pool.file_of(other) is None and pool.file_of(np.empty(2 * MB, np.uint8)) is None

    first[:] = 7  # a file mapped by another process sees what the pool's buffer holds
    path = pool.file_of(first)
    assert path is not None and SharedBuffer.attach(path, 2 * MB).array[5] == 7

    address = first.ctypes.data
    del first
    assert pool.take(2 * MB).ctypes.data == address  # a file is taken again, as any buffer
    pool.unshare(2 * MB)
    assert list(tmp_path.iterdir()) == []  # removed; the arrays still work
    second[:] = 1
    assert pool.file_of(second) is None and int(second[-1]) == 1
    assert pool.file_of(pool.take(2 * MB)) is None  # no new files


def test_a_shared_size_below_the_pooled_minimum_is_still_shared(tmp_path: Path) -> None:
    pool = BufferPool()
    pool.share(4096, tmp_path)  # a small model: its buffers must be files too
    assert pool.file_of(pool.take(4096)) is not None
    pool.unshare(4096)


def test_a_full_memory_directory_leaves_buffers_on_the_heap_and_no_file(
    small_disk: SmallDisk, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(OSError, match="No space left"):  # reserved at once: no SIGBUS later
        SharedBuffer.create(small_disk.path, "weights", 16 * MB)
    assert list(small_disk.path.iterdir()) == []

    pool = BufferPool()
    pool.share(16 * MB, small_disk.path)
    buffers = [pool.take(16 * MB) for _ in range(3)]
    assert all(pool.file_of(b) is None for b in buffers)  # heap buffers, usable as ever
    assert list(small_disk.path.iterdir()) == []
    assert caplog.text.count("no more weight buffers of 16777216 bytes shared") == 1  # said once


def test_buffers_of_a_shared_size_are_kept_beyond_the_pools_bytes(tmp_path: Path) -> None:
    pool = BufferPool(max_bytes=4 * MB)
    pool.share(2 * MB, tmp_path)
    held = [pool.take(2 * MB) for _ in range(3)]  # 6 MiB in use at once
    assert all(pool.file_of(b) is not None for b in held)  # each a file the pool will remove
    del held
    assert len(list(tmp_path.iterdir())) == 3
    pool.take(3 * MB)  # room for another size: shared buffers are not forgotten for it
    assert len(list(tmp_path.iterdir())) == 3
    pool.unshare(2 * MB)
    assert list(tmp_path.iterdir()) == []
