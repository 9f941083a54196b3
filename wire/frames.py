"""Frames of the local SL <-> ML socket: ``u32 header length | msgpack header | raw payload``.

The header is a bounded msgpack map; ``nbytes`` in it says how many raw payload bytes follow (a weight
buffer, received straight into a reusable array, never through msgpack).
"""

from __future__ import annotations

import struct
from typing import Any

from wire.errors import CodecError
from wire.limits import packb, unpackb
from wire.tensors import MAX_STATE_BYTES, TensorSpec, specs_from_wire

__all__ = [
    "HEADER_PREFIX",
    "MAX_HEADER_BYTES",
    "decode_header",
    "encode_frame_head",
    "header_length",
    "layout_from_wire",
    "layout_to_wire",
    "payload_size",
]

HEADER_PREFIX = struct.Struct("!I")
MAX_HEADER_BYTES = 16 << 20  # big enough for the layout of a model with many thousands of tensors


def encode_frame_head(header: dict[str, Any], nbytes: int = 0) -> bytes:
    """Length prefix + msgpack header announcing ``nbytes`` of payload."""
    body = packb({**header, "nbytes": nbytes})
    return HEADER_PREFIX.pack(len(body)) + body


def header_length(prefix: bytes) -> int:
    """Decode and bound the 4-byte length prefix."""
    (length,) = HEADER_PREFIX.unpack(prefix)
    if not 0 < length <= MAX_HEADER_BYTES:
        raise CodecError(f"frame header of {length} bytes is outside 1..{MAX_HEADER_BYTES}")
    return int(length)


def decode_header(data: bytes) -> dict[str, Any]:
    """Decode a frame header: a map with a string ``op`` and an integer ``nbytes``."""
    header = unpackb(data, what="frame header", max_bytes=MAX_HEADER_BYTES)
    if not isinstance(header, dict) or not isinstance(header.get("op"), str):
        raise CodecError("frame header must be a map with a string 'op'")
    payload_size(header)
    return header


def payload_size(header: dict[str, Any]) -> int:
    """The announced payload size, checked."""
    nbytes = header.get("nbytes", 0)
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or not 0 <= nbytes <= MAX_STATE_BYTES:
        raise CodecError(f"frame 'nbytes' must be 0..{MAX_STATE_BYTES}, got {nbytes!r}")
    return nbytes


def layout_to_wire(specs: tuple[TensorSpec, ...]) -> list[list[Any]]:
    """Specs as ``[[name, dtype, shape, offset, nbytes], ...]``."""
    return [spec.as_list() for spec in specs]


def layout_from_wire(items: Any, total: int, *, what: str = "layout") -> tuple[TensorSpec, ...]:
    """Validate a wire layout against a buffer of ``total`` bytes (``specs_from_wire``)."""
    return specs_from_wire(items, total, what)
