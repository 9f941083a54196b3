"""Bounded msgpack decoding: sizes, depth and value types checked before anything uses the data."""

from __future__ import annotations

from typing import Any

import msgpack

from wire.errors import CodecError

__all__ = ["MAX_DEPTH", "MAX_MESSAGE_BYTES", "check_plain", "packb", "unpackb"]

MAX_MESSAGE_BYTES = 8 * 1024 * 1024
MAX_DEPTH = 32
_MAX_ITEMS = 1_000_000


def _refuse_ext(code: int, data: bytes) -> Any:
    raise CodecError(f"msgpack extension type {code} is not allowed")


def packb(obj: Any) -> bytes:
    """Pack plain data (maps, lists, str, bytes, numbers, bool, nil) to msgpack."""
    out = msgpack.packb(obj, use_bin_type=True)
    assert isinstance(out, bytes)  # noqa: S101 - packb returns bytes without a custom stream
    return out


def unpackb(data: bytes | memoryview, *, what: str, max_bytes: int = MAX_MESSAGE_BYTES) -> Any:
    """Unpack msgpack bytes with every size bounded; raise CodecError naming ``what`` on any failure."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(f"{what}: expected bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise CodecError(f"{what}: {len(data)} bytes is over the limit of {max_bytes}")
    try:
        obj = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=_refuse_ext,
            max_str_len=max_bytes,
            max_bin_len=max_bytes,
            max_array_len=_MAX_ITEMS,
            max_map_len=_MAX_ITEMS,
            max_ext_len=max_bytes,
        )
    except CodecError as exc:
        raise CodecError(f"{what}: {exc}") from None
    except (ValueError, TypeError, OverflowError, RecursionError, msgpack.ExtraData) as exc:
        raise CodecError(f"{what}: not valid msgpack ({type(exc).__name__}: {exc})") from None
    except Exception as exc:  # msgpack raises a few non-ValueError types on garbage
        raise CodecError(f"{what}: not valid msgpack ({type(exc).__name__}: {exc})") from None
    check_plain(obj, what=what)
    return obj


_LEAF_TYPES = frozenset({str, bytes, int, float, bool, type(None)})  # what msgpack decodes, exactly


def check_plain(obj: Any, *, what: str) -> None:
    """Check that ``obj`` holds only plain msgpack types and is at most MAX_DEPTH deep."""
    # Exact types (msgpack makes no subclasses), and leaves are never stacked: this runs on every message.
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        value, depth = stack.pop()
        kind = type(value)
        if kind is dict:
            children: Any = value.values()
        elif kind is list:
            children = value
        elif kind in _LEAF_TYPES:
            continue
        else:
            raise CodecError(f"{what}: value of type {kind.__name__} is not allowed")
        if depth >= MAX_DEPTH and len(children):
            raise CodecError(f"{what}: nested deeper than {MAX_DEPTH} levels")
        for child in children:
            if type(child) not in _LEAF_TYPES:
                stack.append((child, depth + 1))
