"""The pool of model-sized buffers (``daemons/sl/buffers.py``): a buffer comes back only once nothing
holds it, not even a view, a memoryview or a FlatState; the pool keeps within its bytes."""

from __future__ import annotations

import gc

import numpy as np

from daemons.sl.buffers import BufferPool
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
