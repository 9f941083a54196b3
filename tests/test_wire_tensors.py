"""Tensor transport: layout, chunking, reassembly and every way a transfer can go wrong."""

from __future__ import annotations

import contextlib
import struct

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wire import CodecError
from wire.tensors import (
    ALIGN,
    BLAKE3,
    HASHES,
    SIGNED_HASHES,
    XXH3,
    FlatState,
    Reassembler,
    accepted_hashes,
    chunk_digest,
    decode_chunk,
    iter_chunks,
    layout_of,
    make_manifest,
    manifest_from_body,
    specs_from_wire,
    weights_hash,
)

CHUNK = 1 << 16


def split(chunk: bytes) -> tuple[dict[str, object], bytes]:
    """A chunk message as (header, raw data)."""
    length = struct.unpack_from("!H", chunk)[0]
    return msgpack.unpackb(chunk[2 : 2 + length]), chunk[2 + length :]


def join(header: dict[str, object], data: bytes) -> bytes:
    packed = msgpack.packb(header)
    return struct.pack("!H", len(packed)) + packed + data


def sample_state(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "conv.weight": rng.standard_normal((8, 3, 5, 5)).astype(np.float32),
        "fc.weight": rng.standard_normal((300, 200)).astype(np.float64),
        "half": rng.standard_normal(1001).astype(np.float16),
        "bf16": rng.integers(0, 2**16, 333, dtype=np.uint16),
        "bn.num_batches_tracked": np.array(17, dtype=np.int64),
        "mask": rng.integers(0, 2, 77).astype(bool),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }


def flat_of(state: dict[str, np.ndarray]) -> FlatState:
    return FlatState.from_arrays(state, {"bf16": "bfloat16"})


def transfer(flat: FlatState, name: str = "t1") -> tuple[list[bytes], object]:
    manifest = make_manifest(flat, name, chunk_size=CHUNK)
    return list(iter_chunks(flat, manifest)), manifest


def test_layout_is_aligned_and_round_trips_every_dtype() -> None:
    state = sample_state(np.random.default_rng(1))
    flat = FlatState.from_arrays(state, {"bf16": "bfloat16"})
    assert all(spec.offset % ALIGN == 0 for spec in flat.specs)
    chunks, manifest = transfer(flat)
    r = Reassembler("t1")
    r.set_manifest(manifest_from_body(manifest.body()))  # type: ignore[attr-defined]
    for chunk in chunks:
        r.add_chunk(chunk)
    out = r.finish().arrays()
    for name, arr in state.items():
        assert out[name].dtype == arr.dtype
        np.testing.assert_array_equal(out[name], arr)
    assert r.finish().dtypes()["bf16"] == "bfloat16"


def test_same_weights_give_same_digest_and_different_weights_do_not() -> None:
    state = sample_state(np.random.default_rng(2))
    d1 = make_manifest(flat_of(state), "a").digest
    d2 = make_manifest(flat_of({k: v.copy() for k, v in state.items()}), "b").digest
    state["half"][0] += 1
    d3 = make_manifest(flat_of(state), "c").digest
    assert d1 == d2 != d3


def test_chunks_are_hashed_with_blake3_as_the_protocol_says() -> None:
    # the test vector of "abc" from the BLAKE3 reference; a peer hashing otherwise refuses every chunk
    expected = "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
    assert chunk_digest(b"abc").hex() == expected
    flat = flat_of({"w": np.arange(3 * CHUNK // 4, dtype=np.float32)})
    raw = flat.buffer.tobytes()
    manifest = make_manifest(flat, "t", chunk_size=CHUNK)
    assert list(manifest.chunks) == [chunk_digest(raw[i : i + CHUNK]) for i in range(0, len(raw), CHUNK)]


def test_where_nothing_is_signed_chunks_are_checksummed_with_xxh3_and_the_digest_says_so() -> None:
    assert weights_hash(signed=True) == BLAKE3 and weights_hash(signed=False) == XXH3
    assert (
        accepted_hashes(signed=True) == SIGNED_HASHES == (BLAKE3,) and accepted_hashes(signed=False) == HASHES
    )
    # XXH3_128bits of "abc" with seed 0, in its canonical (big-endian) form
    assert chunk_digest(b"abc", XXH3).hex() == "06b05ab6733a618578af5f94892f3950"
    flat = flat_of(sample_state(np.random.default_rng(8)))
    manifest = make_manifest(flat, "t1", chunk_size=CHUNK, hash=XXH3)
    raw = flat.buffer.tobytes()
    assert list(manifest.chunks) == [
        chunk_digest(raw[i : i + CHUNK], XXH3) for i in range(0, len(raw), CHUNK)
    ]
    assert manifest.body()["hash"] == XXH3 and "hash" not in make_manifest(flat, "t1").body()
    # the digest commits to the hash: the same weights under BLAKE3 have another one
    assert manifest.digest != make_manifest(flat, "t1", chunk_size=CHUNK).digest
    r = Reassembler("t1")
    r.set_manifest(manifest_from_body(manifest.body()))
    for chunk in iter_chunks(flat, manifest):
        r.add_chunk(chunk)
    assert np.array_equal(r.finish().buffer, flat.buffer)
    with pytest.raises(ValueError, match="no chunk hash 'md5'"):
        make_manifest(flat, "t1", hash="md5")


def test_a_manifest_checksummed_with_xxh3_is_refused_where_weights_are_signed() -> None:
    flat = flat_of(sample_state(np.random.default_rng(9)))
    body = make_manifest(flat, "t1", chunk_size=CHUNK, hash=XXH3).body()
    with pytest.raises(
        CodecError,
        match="hashed with xxh3-128, which is not cryptographic; a node with certificates takes blake3 only",
    ):
        manifest_from_body(body, what="manifest from sl-2", hashes=SIGNED_HASHES)
    assert manifest_from_body(make_manifest(flat, "t1").body(), hashes=SIGNED_HASHES).hash == BLAKE3
    with pytest.raises(CodecError, match="'hash' must be one of blake3, xxh3-128, got 'md5'"):
        manifest_from_body({**body, "hash": "md5"})
    # BLAKE3's digests named XXH3 (a hash said to be another) do not pass for it
    with pytest.raises(CodecError, match="chunk digests must be 16-byte xxh3-128 values"):
        manifest_from_body({**make_manifest(flat, "t1", chunk_size=CHUNK).body(), "hash": XXH3})


def test_a_corrupt_chunk_is_named_under_xxh3_too() -> None:
    flat = flat_of(sample_state(np.random.default_rng(10)))
    manifest = make_manifest(flat, "t1", chunk_size=CHUNK, hash=XXH3)
    chunks = list(iter_chunks(flat, manifest))
    header, data = split(chunks[1])
    chunks[1] = join(header, bytes([data[0] ^ 1]) + data[1:])
    r = Reassembler("t1")
    r.set_manifest(manifest_from_body(manifest.body()))
    for chunk in chunks:
        r.add_chunk(chunk)
    with pytest.raises(CodecError, match="chunks 1 are corrupt"):
        r.finish()


def test_chunks_in_any_order_with_duplicates_and_manifest_last() -> None:
    flat = flat_of(sample_state(np.random.default_rng(3)))
    chunks, manifest = transfer(flat)
    r = Reassembler("t1")
    added = [r.add_chunk(c) for c in reversed(chunks)] + [r.add_chunk(chunks[0])]
    assert added[-1] is False
    assert all(added[:-1])
    assert not r.complete
    r.set_manifest(manifest)  # type: ignore[arg-type]
    assert r.complete
    np.testing.assert_array_equal(r.finish().buffer, flat.buffer)


def test_missing_chunks_are_named() -> None:
    flat = flat_of(sample_state(np.random.default_rng(4)))
    chunks, manifest = transfer(flat)
    r = Reassembler("t1")
    r.set_manifest(manifest)  # type: ignore[arg-type]
    for chunk in chunks[:1] + chunks[3:]:
        r.add_chunk(chunk)
    assert r.missing() == [1, 2]
    with pytest.raises(CodecError, match="chunks 1-2 are missing"):
        r.finish()


def test_corrupt_chunk_is_named() -> None:
    flat = flat_of(sample_state(np.random.default_rng(5)))
    chunks, manifest = transfer(flat)
    header, data = split(chunks[2])
    chunks[2] = join(header, data[:-1] + bytes([data[-1] ^ 1]))
    r = Reassembler("t1")
    r.set_manifest(manifest)  # type: ignore[arg-type]
    for chunk in chunks:
        r.add_chunk(chunk)
    with pytest.raises(CodecError, match="chunks 2 are corrupt"):
        r.finish()


def test_extra_and_foreign_chunks_are_refused() -> None:
    flat = flat_of(sample_state(np.random.default_rng(6)))
    chunks, manifest = transfer(flat)
    r = Reassembler("t1")
    r.set_manifest(manifest)  # type: ignore[arg-type]
    header, data = split(chunks[0])
    header["n"] = int(header["n"]) + 1  # type: ignore[call-overload]
    header["i"] = header["n"] - 1  # type: ignore[operator]
    with pytest.raises(CodecError, match="disagrees"):
        r.add_chunk(join(header, data))
    other, _ = transfer(flat, "t2")
    with pytest.raises(CodecError, match="sent to"):
        r.add_chunk(other[0])


def test_manifest_whose_digest_lies_is_refused() -> None:
    flat = flat_of(sample_state(np.random.default_rng(7)))
    body = make_manifest(flat, "t1").body()
    body["tensors"][0][2] = [1, 2]
    with pytest.raises(CodecError):
        manifest_from_body(body)
    body = make_manifest(flat, "t1").body()
    body["digest"] = b"\0" * 32
    with pytest.raises(CodecError, match="digest does not match"):
        manifest_from_body(body)


def test_reassembly_refuses_states_over_the_limit() -> None:
    flat = flat_of(sample_state(np.random.default_rng(8)))
    chunks, _ = transfer(flat)
    with pytest.raises(CodecError, match="over"):
        Reassembler("t1", max_total=1000).add_chunk(chunks[0])


_SMALL = FlatState.from_arrays({"w": np.arange(100, dtype=np.float32)})
GOOD_CHUNK = next(iter_chunks(_SMALL, make_manifest(_SMALL, "t1", chunk_size=CHUNK)))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_fed_to_chunk_decoder_only_raise_codec_error(data: bytes) -> None:
    with contextlib.suppress(CodecError):
        decode_chunk(data)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(GOOD_CHUNK) - 1), st.integers(0, 255))
def test_truncated_or_flipped_chunks_only_raise_codec_error(cut: int, byte: int) -> None:
    for data in (GOOD_CHUNK[:cut], GOOD_CHUNK[:cut] + bytes([byte]) + GOOD_CHUNK[cut + 1 :]):
        r = Reassembler("t1")
        with contextlib.suppress(CodecError):
            r.add_chunk(data)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8),
        st.one_of(st.integers(), st.binary(max_size=40), st.lists(st.integers(), max_size=5), st.none()),
        max_size=8,
    )
)
def test_random_manifest_bodies_only_raise_codec_error(body: dict[str, object]) -> None:
    with contextlib.suppress(CodecError):
        manifest_from_body(body)


def test_a_layout_seen_lately_is_answered_from_memory_and_a_bad_one_is_still_refused() -> None:
    items = [["a", "float32", [4, 3], 0, 48], ["b", "int64", [2], 64, 16]]
    first = specs_from_wire(items, 80, "layout")
    assert specs_from_wire([list(item) for item in items], 80, "layout") is first
    with pytest.raises(CodecError, match="overruns 70"):
        specs_from_wire(items, 70, "layout")  # the same tensors in a buffer too small
    items[1][3] = 32  # the caller's list changed after it was read: "b" now overlaps "a"
    with pytest.raises(CodecError, match="tensor 'b' overlaps another"):
        specs_from_wire(items, 80, "layout")
    assert specs_from_wire([["a", "float32", [4, 3], 0, 48], ["b", "int64", [2], 64, 16]], 80, "x") is first


def test_a_models_layout_is_worked_out_once_and_an_unsupported_dtype_is_still_refused() -> None:
    entries = [("w", "float32", (64, 8)), ("b", "int64", (3,)), ("bn.num_batches_tracked", "int64", ())]
    specs, total = layout_of(iter(entries))  # a generator, as a program's state dict gives it
    assert [(s.name, s.offset, s.nbytes) for s in specs] == [
        ("w", 0, 2048),
        ("b", 2048, 24),
        ("bn.num_batches_tracked", 2112, 8),
    ]
    assert total == 2176
    assert layout_of(list(entries))[0] is specs  # the same tensors again: the specs made the first time
    assert (
        layout_of([("w", "float32", (64, 9)), *entries[1:]])[0] is not specs
    )  # another shape, another layout
    assert layout_of([("w", "float32", [64, 8])])[1] == 2048  # a shape that cannot be a key is worked out
    with pytest.raises(CodecError, match="dtype 'complex64' is not supported"):
        layout_of([("w", "complex64", (2,))])
    with pytest.raises(CodecError, match="dtype 'complex64' is not supported"):
        layout_of([("w", "complex64", (2,))])  # refused every time, not kept
    flat = FlatState.from_arrays({"w": np.ones(3, np.float32), "u": np.ones(2, np.uint16)}, {"u": "bfloat16"})
    assert [s.dtype for s in flat.specs] == ["float32", "bfloat16"]
    with pytest.raises(CodecError, match="uint16"):
        FlatState.from_arrays({"u": np.ones(2, np.uint16)})  # uint16 is no wire dtype of its own
