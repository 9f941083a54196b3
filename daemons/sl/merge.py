"""Merge the weights of several peers into one model: mean, medians, trimmed mean and Krum.

A model travels as one flat uint8 buffer described by a layout of ``(name, dtype, shape, offset,
nbytes)`` entries (see ``docs/protocol.md``). :func:`merge_flat` merges a matrix of such buffers,
one peer per row, without copying the inputs; :func:`merge_states` does the same for dicts of
arrays. Both validate first and raise :class:`MergeError` naming the tensor, the peer and what
was expected.

Methods (n peers, weights w_i >= 0):

- ``mean``: sum(w_i x_i) / sum(w_i), one BLAS pass per block.
- ``coordmedian``: per coordinate, the lower weighted median (smallest value whose cumulative
  weight reaches half the total).
- ``geomedian``: weighted geometric median of the whole float model by Weiszfeld, started at the
  mean; iterates on n convex coefficients using the peers' Gram matrix, so each step is O(n^2).
  The Gram matrix is centred on the coordinate-wise median, so one huge row (1e30) does not drown
  the honest rows' distances in rounding.
- ``trimmedmean``: per coordinate, unweighted mean after dropping floor(trim_ratio * n) lowest
  and highest values, and at least one of each from 4 peers on.
- ``krum``: the float tensors of the peer with the least sum of squared distances to its
  n - f - 2 nearest peers (unweighted).

Peers of weight 0 have no influence (trimmedmean and krum leave them out); one peer with a
positive weight gives an exact copy of it. Float16 and bfloat16 are computed in float32 and rounded
back to nearest even; float32 and float64 in their own precision. Integer and bool tensors keep
their dtype: medians are exact, every other method takes the weighted mean rounded with ``np.rint``
(half to even; int64 beyond 2**53 loses precision), which for bool is a weighted majority (a tie
gives False); trimmedmean trims them as it does floats.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from daemons.sl.buffers import MODEL_BUFFERS
from wire.tensors import DTYPES
from wire.workers import PARALLEL_BYTES, cut, run_split, threads_for

__all__ = [
    "DTYPE_LABELS",
    "MERGE_METHODS",
    "MergeError",
    "MergeOptions",
    "Rows",
    "TensorLayout",
    "Weights",
    "find_non_finite",
    "float_distance",
    "merge_flat",
    "merge_states",
    "validate_flat",
    "validate_inputs",
]

TensorLayout: TypeAlias = tuple[str, str, tuple[int, ...], int, int]
Weights: TypeAlias = Sequence[float] | npt.NDArray[Any]
_Array: TypeAlias = npt.NDArray[Any]
Rows: TypeAlias = npt.NDArray[Any] | Sequence[npt.NDArray[Any]]
# A reducer maps a (peers, m) block to m merged values; it may write them into the second
# argument (a view of the output in the block's own dtype, or None) and return that.
_Reducer: TypeAlias = Callable[[_Array, "_Array | None"], _Array]

MERGE_METHODS = ("mean", "coordmedian", "geomedian", "trimmedmean", "krum")
_STORAGE: Mapping[str, np.dtype[Any]] = DTYPES
DTYPE_LABELS = tuple(_STORAGE)
_FLOAT_LABELS = frozenset({"float16", "bfloat16", "float32", "float64"})
_NATIVE_LABELS = frozenset({"float32", "float64"})  # computed in their own precision
_ALIGN = 64  # tensor offsets in a flat buffer are multiples of this
_BLOCK_BYTES = 1 << 17  # bytes per peer per step: fits in cache, and BLAS stays on one thread
_GRAM_COLUMNS = 1 << 12  # columns per Gram product: small enough that BLAS keeps it on one thread
_GRAM_PARTS = 8  # partial sums of a large model's Gram matrix (see _gram)
_MAX_ITEMSIZE = max(dtype.itemsize for dtype in _STORAGE.values())  # the widest a Gram block reads
_PAIRWISE_MAX_PEERS = 16  # weighted median by pairwise comparison up to this many peers
_PAIRWISE_COLUMNS = 1 << 14  # columns per pairwise chunk, so its temporaries stay in cache
_BUBBLE_MAX_SWAPS = 128  # trimmed mean by partial bubble sort while 2 * cut * n is at most this
_MIN_PEERS_TO_TRIM = 4  # trimmedmean drops at least one row per side from this many peers on
_HALF_SLACK = 1e-12  # relative slack on "cumulative weight >= half" against rounding


class MergeError(ValueError):
    """Inputs that cannot be merged; the message says which tensor, peer and value is wrong."""


@dataclass(frozen=True)
class MergeOptions:
    """Parameters of the robust merge methods.

    Attributes:
        trim_ratio: trimmedmean drops ``floor(trim_ratio * n)`` lowest and highest values (at
            least one of each when n >= 4).
        krum_byzantine: peers Krum tolerates as faulty; ``None`` means ``max(0, (n - 3) // 2)``.
        geomedian_max_iter: most Weiszfeld iterations.
        geomedian_eps: Weiszfeld stops when a step is below this fraction of the estimate's norm.
    """

    trim_ratio: float = 0.1
    krum_byzantine: int | None = None
    geomedian_max_iter: int = 100
    geomedian_eps: float = 1e-6

    def __post_init__(self) -> None:
        """Reject values that make no sense."""
        if not 0.0 <= self.trim_ratio < 0.5:
            raise MergeError(f"trim_ratio must be in [0, 0.5), got {self.trim_ratio}")
        if self.krum_byzantine is not None and self.krum_byzantine < 0:
            raise MergeError(f"krum_byzantine must be >= 0, got {self.krum_byzantine}")
        if self.geomedian_max_iter < 1:
            raise MergeError(f"geomedian_max_iter must be >= 1, got {self.geomedian_max_iter}")
        if not self.geomedian_eps > 0.0:
            raise MergeError(f"geomedian_eps must be > 0, got {self.geomedian_eps}")


_DEFAULT_OPTIONS = MergeOptions()


@dataclass(frozen=True, slots=True)
class _Tensor:
    """One parsed layout entry."""

    name: str
    label: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def end(self) -> int:
        """First byte after the tensor."""
        return self.offset + self.nbytes


@dataclass(frozen=True, slots=True)
class _Span:
    """Consecutive tensors of one dtype, separated only by alignment padding."""

    label: str
    start: int
    stop: int
    tensors: tuple[_Tensor, ...]

    @property
    def is_float(self) -> bool:
        """Whether the span holds floating point values."""
        return self.label in _FLOAT_LABELS


_LayoutPlan: TypeAlias = tuple[tuple[_Tensor, ...], tuple[_Span, ...]]  # sorted tensors, their spans


@dataclass(frozen=True, slots=True)
class _Peers:
    """The peers' flat buffers: rows of one (peers, total) matrix, or separate buffers, which are never
    copied into one (a 45 MB model's matrix of 4 is 180 MB of fresh pages): each column block is
    stacked when it is reduced."""

    rows: tuple[_Array, ...]
    total: int
    matrix: _Array | None = None
    scratch: _Array | None = None  # (peers, widest block) that separate rows are stacked into

    @property
    def count(self) -> int:
        """How many peers."""
        return len(self.rows)

    def block(self, start: int, stop: int) -> _Array:
        """Bytes ``start:stop`` of every peer: a (peers, stop - start) uint8 array."""
        if self.matrix is not None:
            return self.matrix[:, start:stop]
        if self.scratch is None or stop - start > self.scratch.shape[1]:
            return np.stack([row[start:stop] for row in self.rows])
        # the caller is done with the previous block: its memory is used again, not allocated.
        # Row by row: np.stack's own Python (views, shape checks) cost more than the copies here.
        block = self.scratch[:, : stop - start]
        for target, row in zip(block, self.rows, strict=True):
            target[...] = row[start:stop]
        return block

    def with_own_scratch(self) -> _Peers:
        """The same rows with scratch of their own, for another thread."""
        scratch = None if self.scratch is None else np.empty_like(self.scratch)
        return _Peers(self.rows, self.total, self.matrix, scratch)

    def shares_memory(self, other: _Array) -> bool:
        """Whether ``other`` overlaps any peer's buffer."""
        return any(np.may_share_memory(other, row) for row in self.rows)


@dataclass(frozen=True, slots=True)
class _Gram:
    """Inner products of the peers' float vectors x_i around a centre c (their coordinate-wise median)."""

    g: _Array  # (n, n): (x_i - c) . (x_j - c)
    xc: _Array  # (n,): (x_i - c) . c
    cc: float  # c . c


# --------------------------------------------------------------------------- public API


def merge_flat(
    rows: Rows,
    layout: Sequence[TensorLayout],
    weights: Weights,
    method: str,
    *,
    out: _Array | None = None,
    options: MergeOptions = _DEFAULT_OPTIONS,
) -> _Array:
    """Merge flat model buffers, one peer per row.

    Args:
        rows: (n_peers, total_bytes) uint8 matrix, or one 1-D uint8 buffer of total_bytes per peer (not
            copied into a matrix); every row has the same ``layout``.
        layout: ``(name, dtype, shape, offset, nbytes)`` of every tensor.
        weights: one non-negative weight per peer, not all zero.
        method: one of :data:`MERGE_METHODS`, any case.
        out: total_bytes uint8 buffer to write the result into; a new one when ``None``.
        options: parameters of the robust methods.

    Returns:
        The merged buffer (``out`` when given); padding between tensors is zero. On error,
        ``out`` may have been partly written.

    Raises:
        MergeError: the inputs are inconsistent or hold NaN/inf (named by tensor and peer).
    """
    peers = _peers(rows)
    name, w, (tensors, spans) = _plan(peers, layout, weights, method, options)
    target = _out_buffer(out, peers)
    _require_finite(peers, spans, _peers_to_precheck(name, w))
    _reduce(peers, target, spans, _reducers(name, peers, spans, w, options))
    _zero_gaps(target, tensors)
    _check_result(target, peers, spans)
    return target


def merge_states(
    states: Sequence[Mapping[str, _Array]],
    weights: Weights,
    method: str,
    *,
    dtypes: Mapping[str, str] | None = None,
    options: MergeOptions = _DEFAULT_OPTIONS,
) -> dict[str, _Array]:
    """Merge state dicts (name -> array); see :func:`merge_flat` for the arguments.

    ``dtypes`` gives a tensor's dtype label where it is not the array's numpy dtype name
    (``"bfloat16"`` for uint16 arrays holding bfloat16 words).

    Returns:
        New arrays, by name, in the first state's order, with the inputs' dtypes and shapes.
    """
    validate_inputs(states, weights, method, dtypes=dtypes, options=options)
    layout, total = _layout_of(states[0], _labels(states[0], dtypes))
    merged = merge_flat(_pack(states, layout, total), layout, weights, method, options=options)
    return {t[0]: _tensor_view(merged, t) for t in layout}


def validate_inputs(
    states: Sequence[Mapping[str, _Array]],
    weights: Weights,
    method: str,
    *,
    dtypes: Mapping[str, str] | None = None,
    options: MergeOptions = _DEFAULT_OPTIONS,
) -> None:
    """Check that ``states`` can be merged: names, shapes, dtypes, finite values, weights, method.

    Raises:
        MergeError: naming the first problem found (tensor, peer index, expected and got).
    """
    name = _method_name(method)
    w = _weights(weights, len(states))
    labels = _labels(states[0], dtypes)
    for peer, state in enumerate(states):
        _check_names(state, states[0], peer)
        for tensor, label in labels.items():
            _check_array(tensor, label, state[tensor], states[0][tensor], peer)
    _check_method_fits(name, w, options)


def validate_flat(
    rows: Rows,
    layout: Sequence[TensorLayout],
    weights: Weights,
    method: str,
    *,
    options: MergeOptions = _DEFAULT_OPTIONS,
) -> None:
    """Check a :func:`merge_flat` request without merging: rows, layout, weights, method, values.

    Raises:
        MergeError: naming the first problem found.
    """
    peers = _peers(rows)
    _, w, (_, spans) = _plan(peers, layout, weights, method, options)
    _require_finite(peers, spans, range(len(w)))


def find_non_finite(buffer: _Array, layout: Sequence[TensorLayout]) -> tuple[str, int] | None:
    """The first tensor of one flat buffer that holds NaN or inf, with how many; None when all are finite.

    Raises:
        MergeError: the layout does not fit the buffer.
    """
    _, spans = _layout_plan(layout, _check_buffer(buffer))
    return _find_non_finite(buffer, spans)


def float_distance(a: _Array, b: _Array, layout: Sequence[TensorLayout]) -> float:
    """Euclidean distance between two flat buffers over their float tensors, in float64.

    Integer and bool tensors (counters, masks) do not count; non-finite values give inf or NaN.

    Raises:
        MergeError: the buffers differ in size or the layout does not fit them.
    """
    total = _check_buffer(a)
    if _check_buffer(b) != total:
        raise MergeError(f"buffers of {total} and {b.shape[0]} bytes cannot be compared")
    squares = 0.0
    for span in (s for s in _layout_plan(layout, total)[1] if s.is_float):
        for lo, hi in _blocks(span.start, span.stop):
            pair = _decode(np.stack((a[lo:hi], b[lo:hi])), span.label).astype(np.float64)
            diff = pair[0] - pair[1]
            squares += float(diff @ diff)
    return math.sqrt(squares)


# --------------------------------------------------------------------------- validation


def _check_buffer(buffer: _Array) -> int:
    if not isinstance(buffer, np.ndarray) or buffer.dtype != np.uint8 or buffer.ndim != 1:
        raise MergeError(f"a flat model must be a 1-D uint8 array, got {getattr(buffer, 'shape', buffer)}")
    return int(buffer.shape[0])


def _plan(
    peers: _Peers,
    layout: Sequence[TensorLayout],
    weights: Weights,
    method: str,
    options: MergeOptions,
) -> tuple[str, _Array, _LayoutPlan]:
    """Validate everything but the values; return method name, weights, sorted tensors and their spans."""
    name = _method_name(method)
    w = _weights(weights, peers.count)
    plan = _layout_plan(layout, peers.total)
    _check_method_fits(name, w, options)
    return name, w, plan


def _method_name(method: str) -> str:
    name = method.lower() if isinstance(method, str) else ""
    if name not in MERGE_METHODS:
        valid = ", ".join(MERGE_METHODS)
        raise MergeError(f"unknown merge method {method!r}; valid methods: {valid}")
    return name


def _peers(rows: Rows) -> _Peers:
    if isinstance(rows, np.ndarray):
        _check_matrix(rows)
        return _Peers(tuple(rows), int(rows.shape[1]), rows)
    if isinstance(rows, str | bytes) or not isinstance(rows, Sequence) or not rows:
        raise MergeError(f"rows must be a 2-D uint8 array or a list of 1-D uint8 buffers, got {rows!r:.80}")
    for peer, row in enumerate(rows):
        if not isinstance(row, np.ndarray) or row.dtype != np.uint8 or row.ndim != 1:
            got = (
                f"{row.dtype} array of shape {row.shape}"
                if isinstance(row, np.ndarray)
                else type(row).__name__
            )
            raise MergeError(f"row {peer} must be a 1-D uint8 array, got {got}")
        if row.shape[0] > 1 and row.strides[0] != 1:
            raise MergeError(f"row {peer} must be contiguous (byte stride 1)")
        if row.shape[0] != rows[0].shape[0]:
            raise MergeError(f"row {peer} has {row.shape[0]} bytes, row 0 has {rows[0].shape[0]}")
    widest = max(_BLOCK_BYTES, _GRAM_COLUMNS * _MAX_ITEMSIZE)
    return _Peers(tuple(rows), int(rows[0].shape[0]), scratch=np.empty((len(rows), widest), dtype=np.uint8))


def _check_matrix(rows: _Array) -> None:
    if rows.dtype != np.uint8 or rows.ndim != 2:
        raise MergeError(f"rows must be a 2-D uint8 array with one peer per row, got {rows.dtype} array "
                         f"of shape {rows.shape}")  # fmt: skip
    if rows.shape[1] > 1 and rows.strides[1] != 1:
        raise MergeError("rows must be contiguous within each row (byte stride 1)")


def _weights(weights: Weights, peers: int) -> _Array:
    if peers == 0:
        raise MergeError("nothing to merge: no peers given")
    try:
        w = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError):
        raise MergeError(f"weights must be numbers, got {weights!r}") from None
    if w.ndim != 1 or len(w) != peers:
        raise MergeError(f"got {w.size} weights for {peers} peers; give one weight per peer")
    for peer, value in enumerate(w.tolist()):
        if not math.isfinite(value) or value < 0:
            raise MergeError(f"weight of peer {peer} is {value}; weights must be finite and >= 0")
    if not w.any():
        raise MergeError("all weights are zero; give at least one peer a positive weight")
    return w


def _check_method_fits(name: str, w: _Array, options: MergeOptions) -> None:
    peers = int(np.count_nonzero(w))
    if name == "krum" and peers > 1:
        byzantine = _byzantine(peers, options)
        if peers < byzantine + 3:
            raise MergeError(
                f"krum with krum_byzantine={byzantine} needs at least {byzantine + 3} peers with a "
                f"positive weight (n >= f + 3), got {peers}"
            )


def _byzantine(peers: int, options: MergeOptions) -> int:
    """Krum's f: given, or the most that n >= 2f + 3 allows."""
    if options.krum_byzantine is None:
        return max(0, (peers - 3) // 2)
    return options.krum_byzantine


def _layout_plan(layout: Sequence[TensorLayout], total: int) -> _LayoutPlan:
    """The tensors of ``layout`` sorted by offset and their spans, checked against a buffer of ``total``
    bytes. An SL merges one layout round after round, and checking it cost a fifth of a 1.6 MB merge, so
    the plans of the last few layouts are kept (a layout that is not hashable is checked every time)."""
    key = tuple(layout)
    try:
        hash(key)
    except TypeError:  # an entry holds a list (a shape from msgpack, say)
        return _checked_plan(key, total)
    return _kept_plan(key, total)


def _checked_plan(layout: tuple[TensorLayout, ...], total: int) -> _LayoutPlan:
    tensors = _parse_layout(layout, total)
    return tuple(tensors), tuple(_spans(tensors))


_kept_plan = lru_cache(maxsize=8)(_checked_plan)


def _parse_layout(layout: Sequence[TensorLayout], total: int) -> list[_Tensor]:
    tensors = sorted((_parse_entry(entry, total) for entry in layout), key=lambda t: t.offset)
    seen: set[str] = set()
    for tensor in tensors:
        if tensor.name in seen:
            raise MergeError(f"tensor {tensor.name!r} appears twice in the layout")
        seen.add(tensor.name)
    filled = [t for t in tensors if t.nbytes]
    for a, b in itertools.pairwise(filled):
        if b.offset < a.end:
            raise MergeError(
                f"tensors {a.name!r} (bytes {a.offset}..{a.end}) and {b.name!r} "
                f"(bytes {b.offset}..{b.end}) overlap"
            )
    return tensors


def _parse_entry(entry: TensorLayout, total: int) -> _Tensor:
    try:
        name, label, shape, offset, nbytes = entry
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise MergeError(f"layout entry {entry!r} is not (name, dtype, shape, offset, nbytes)") from None
    if label not in _STORAGE:
        raise MergeError(f"tensor {name!r}: unknown dtype {label!r}; supported: {', '.join(_STORAGE)}")
    needed = math.prod(dims) * _STORAGE[label].itemsize
    if any(d < 0 for d in dims) or nbytes != needed:
        raise MergeError(f"tensor {name!r}: nbytes is {nbytes}, shape {dims} of {label} needs {needed}")
    if offset < 0 or offset + nbytes > total:
        raise MergeError(
            f"tensor {name!r}: bytes {offset}..{offset + nbytes} lie outside the buffer of {total} bytes"
        )
    return _Tensor(str(name), label, dims, int(offset), int(nbytes))


def _out_buffer(out: _Array | None, peers: _Peers) -> _Array:
    total = peers.total
    if out is None:
        return MODEL_BUFFERS.take(total)
    if out.dtype != np.uint8 or out.shape != (total,) or not out.flags.c_contiguous:
        raise MergeError(
            f"out must be a contiguous uint8 array of {total} bytes, got {out.dtype} {out.shape}"
        )
    if not out.flags.writeable or peers.shares_memory(out):
        raise MergeError("out must be writable and must not share memory with rows")
    return out


def _labels(state: Mapping[str, _Array], dtypes: Mapping[str, str] | None) -> dict[str, str]:
    """Dtype label of every tensor of the reference state (peer 0)."""
    labels: dict[str, str] = {}
    for name, array in state.items():
        _check_is_array(name, array, 0)
        label = (dtypes or {}).get(name, array.dtype.name)
        if label not in _STORAGE:
            supported = ", ".join(_STORAGE)
            raise MergeError(f"tensor {name!r}: unsupported dtype {label!r}; supported: {supported}")
        if array.dtype != _STORAGE[label]:
            raise MergeError(
                f"tensor {name!r} is labelled {label} but stored as {array.dtype}; "
                f"{label} is stored as {_STORAGE[label].name}"
            )
        labels[name] = label
    return labels


def _check_is_array(name: str, array: object, peer: int) -> None:
    if not isinstance(name, str):
        raise MergeError(f"peer {peer}: tensor names must be strings, got {name!r}")
    if not isinstance(array, np.ndarray):
        raise MergeError(f"tensor {name!r} of peer {peer} is a {type(array).__name__}, not an ndarray")


def _check_names(state: Mapping[str, _Array], reference: Mapping[str, _Array], peer: int) -> None:
    missing = [name for name in reference if name not in state]
    extra = [name for name in state if name not in reference]
    if missing or extra:
        raise MergeError(f"peer {peer} has different tensors than peer 0: missing {missing}, extra {extra}")


def _check_array(name: str, label: str, array: _Array, reference: _Array, peer: int) -> None:
    _check_is_array(name, array, peer)
    if array.dtype != reference.dtype:
        raise MergeError(
            f"tensor {name!r}: peer {peer} has dtype {array.dtype}, expected {reference.dtype} as peer 0"
        )
    if array.shape != reference.shape:
        raise MergeError(
            f"tensor {name!r}: peer {peer} has shape {array.shape}, expected {reference.shape} as peer 0"
        )
    bad = _count_non_finite(array.reshape(-1), label)
    if bad:
        raise MergeError(f"tensor {name!r} of peer {peer} has {bad} non-finite values (NaN or inf)")


# --------------------------------------------------------------------------- finiteness


def _count_non_finite(values: _Array, label: str) -> int:
    if label not in _FLOAT_LABELS:
        return 0
    if label == "bfloat16":
        return int(np.count_nonzero((values.view(np.uint16) & 0x7F80) == 0x7F80))
    typed = values.view(_STORAGE[label])
    return int(typed.size - np.count_nonzero(np.isfinite(typed)))


def _all_finite(raw: _Array, label: str) -> bool:
    if label == "bfloat16":
        return not np.any((raw.view(np.uint16) & 0x7F80) == 0x7F80)
    return bool(np.isfinite(raw.view(_STORAGE[label])).all())


def _find_non_finite(buffer: _Array, spans: Sequence[_Span]) -> tuple[str, int] | None:
    """First tensor of a flat buffer holding NaN/inf, with the count; padding does not count. A large
    buffer is checked in blocks on several threads first (``wire.workers``), a small one span by span;
    only a bad one is searched in order."""
    threads = threads_for(len(buffer))
    pieces = [
        (span.label, a, b)
        for span in spans
        if span.is_float
        for a, b in (_blocks(span.start, span.stop) if threads > 1 else [(span.start, span.stop)])
    ]

    def finite_run(run: Sequence[tuple[str, int, int]]) -> list[bool]:
        return [all(_all_finite(buffer[a:b], label) for label, a, b in run)]

    finite: list[bool] = run_split(finite_run, pieces, threads)
    if all(finite):
        return None
    for span in spans:
        if not span.is_float:
            continue
        if all(_all_finite(buffer[a:b], span.label) for a, b in _blocks(span.start, span.stop)):
            continue
        for tensor in span.tensors:
            bad = _count_non_finite(buffer[tensor.offset : tensor.end], tensor.label)
            if bad:
                return tensor.name, bad
    return None


def _require_finite(rows: _Peers, spans: Sequence[_Span], peers: Iterable[int]) -> None:
    for peer in peers:
        found = _find_non_finite(rows.rows[peer], spans)
        if found:
            raise MergeError(
                f"tensor {found[0]!r} of peer {peer} has {found[1]} non-finite values (NaN or inf)"
            )


def _peers_to_precheck(name: str, w: _Array) -> Iterable[int]:
    """Peers whose values are checked before merging; the mean's result reveals the others."""
    if name == "mean" or len(w) == 1:
        return (int(p) for p in np.flatnonzero(w == 0))
    return range(len(w))


def _check_result(out: _Array, rows: _Peers, spans: Sequence[_Span]) -> None:
    found = _find_non_finite(out, spans)
    if found is None:
        return
    _require_finite(rows, spans, range(rows.count))
    raise MergeError(f"merged tensor {found[0]!r} overflowed to inf; the peers' values are too large")


# --------------------------------------------------------------------------- layout plumbing


def _spans(tensors: Sequence[_Tensor]) -> list[_Span]:
    """Group offset-sorted tensors into runs that one vectorised call can merge."""
    groups: list[list[_Tensor]] = []
    for tensor in (t for t in tensors if t.nbytes):
        if groups and _joins(groups[-1][0], groups[-1][-1], tensor):
            groups[-1].append(tensor)
        else:
            groups.append([tensor])
    return [_Span(g[0].label, g[0].offset, g[-1].end, tuple(g)) for g in groups]


def _joins(first: _Tensor, last: _Tensor, tensor: _Tensor) -> bool:
    """Whether ``tensor`` continues the run first..last: same dtype, only padding between."""
    itemsize = _STORAGE[tensor.label].itemsize
    return (
        tensor.label == first.label
        and 0 <= tensor.offset - last.end < _ALIGN
        and (tensor.offset - first.offset) % itemsize == 0
    )


def _blocks(start: int, stop: int, step: int = _BLOCK_BYTES) -> Iterator[tuple[int, int]]:
    """Byte ranges of at most ``step`` bytes (a multiple of the itemsize)."""
    for a in range(start, stop, step):
        yield a, min(a + step, stop)


def _zero_gaps(out: _Array, tensors: Sequence[_Tensor]) -> None:
    position = 0
    for tensor in tensors:
        if tensor.offset > position:
            out[position : tensor.offset] = 0
        position = max(position, tensor.end)
    out[position:] = 0


def _layout_of(state: Mapping[str, _Array], labels: Mapping[str, str]) -> tuple[list[TensorLayout], int]:
    """64-byte aligned layout of a state dict, in its order, and the padded total size."""
    layout: list[TensorLayout] = []
    offset = 0
    for name, array in state.items():
        layout.append((name, labels[name], tuple(array.shape), offset, array.nbytes))
        offset = -(-(offset + array.nbytes) // _ALIGN) * _ALIGN
    return layout, offset


def _tensor_view(buffer: _Array, entry: TensorLayout) -> _Array:
    _, label, shape, offset, nbytes = entry
    return buffer[offset : offset + nbytes].view(_STORAGE[label]).reshape(shape)


def _pack(states: Sequence[Mapping[str, _Array]], layout: Sequence[TensorLayout], total: int) -> _Array:
    rows = np.zeros((len(states), total), dtype=np.uint8)
    for row, state in zip(rows, states, strict=True):
        for entry in layout:
            _tensor_view(row, entry)[...] = state[entry[0]]
    return rows


# --------------------------------------------------------------------------- dtype conversion


def _decode(raw: _Array, label: str) -> _Array:
    """Values of a (peers, bytes) uint8 block; float16 and bfloat16 widen to float32."""
    values = raw.view(_STORAGE[label])
    if label == "bfloat16":
        return (values.astype(np.uint32) << 16).view(np.float32)
    if label == "float16":
        return values.astype(np.float32)
    return values


def _encode(values: _Array, label: str, raw: _Array) -> None:
    """Store merged values into a uint8 block: rounded to nearest (even) for narrower types."""
    if label == "bfloat16":
        raw.view(np.uint16)[...] = _f32_to_bf16(values)
        return
    storage = _STORAGE[label]
    if storage.kind in "biu" and values.dtype.kind == "f":
        values = np.rint(values)
    raw.view(storage)[...] = values


def _f32_to_bf16(values: _Array) -> _Array:
    """bfloat16 words of float32 values: round to nearest even, NaN stays (quiet) NaN."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    words = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        words[nan] = ((bits[nan] >> 16) | 0x0040).astype(np.uint16)
    return words


# --------------------------------------------------------------------------- merging


def _reduce(rows: _Peers, out: _Array, spans: Sequence[_Span], reducers: tuple[_Reducer, _Reducer]) -> None:
    """Apply the float or the integer reducer block by block, writing into ``out``; a large model's
    blocks are shared out among threads (``wire.workers``), each with its own scratch rows."""
    pieces = [(span, a, b) for span in spans for a, b in _blocks(span.start, span.stop)]
    threads = threads_for(rows.total)

    def reduce_run(run: Sequence[tuple[_Span, int, int]]) -> list[None]:
        own = rows if threads == 1 else rows.with_own_scratch()
        for span, a, b in run:
            reduce = reducers[0] if span.is_float else reducers[1]
            target = out[a:b].view(_STORAGE[span.label]) if span.label in _NATIVE_LABELS else None
            values = reduce(_decode(own.block(a, b), span.label), target)
            if values is not target:
                _encode(values, span.label, out[a:b])
        return []

    run_split(reduce_run, pieces, threads)


def _reducers(
    name: str, rows: _Peers, spans: Sequence[_Span], w: _Array, options: MergeOptions
) -> tuple[_Reducer, _Reducer]:
    """Column reducers (peers, m) -> (m,) for float tensors and for integer/bool tensors.

    Peers of weight 0 have no say: the weighted methods give them none, and the unweighted ones
    (trimmedmean, krum) leave them out. With one peer left, the result is a copy of it.
    """
    active = np.flatnonzero(w)
    if len(active) == 1:
        copy: _Reducer = partial(_pick_row, row=int(active[0]))
        return copy, copy
    mean: _Reducer = partial(_weighted_sum, weights=w / w.sum())
    if name == "mean":
        return mean, mean
    if name == "coordmedian":
        median: _Reducer = partial(_weighted_median, weights=w)
        return median, median
    if name == "trimmedmean":
        cut = _trim_count(len(active), options.trim_ratio)
        trimmed: _Reducer = partial(_trimmed_mean, cut=cut, peers=_subset(active, len(w)))
        return trimmed, trimmed
    gram = _gram(rows, [t for s in spans if s.is_float for t in s.tensors], w)
    if name == "krum":
        chosen = _krum_pick(gram.g[np.ix_(active, active)], _byzantine(len(active), options))
        return partial(_pick_row, row=int(active[chosen])), mean
    return partial(_weighted_sum, weights=_weiszfeld(gram, w, options)), mean


def _pick_row(x: _Array, _out: _Array | None, *, row: int) -> _Array:
    picked: _Array = x[row]
    return picked


def _weighted_sum(x: _Array, out: _Array | None = None, *, weights: _Array) -> _Array:
    """sum_i weights[i] * x[i]: one BLAS pass for floats, float64 for integers and bool."""
    if x.dtype.kind == "f":
        total: _Array = np.matmul(weights.astype(x.dtype), x, out=out)
    else:
        total = np.matmul(weights, x.astype(np.float64))
    return total


def _weighted_median(x: _Array, _out: _Array | None, *, weights: _Array) -> _Array:
    """Lower weighted median per column: the smallest value whose cumulative weight >= half."""
    if np.all(weights == weights[0]):
        k = (len(weights) + 1) // 2 - 1
        lower: _Array = np.partition(x, k, axis=0)[k]
        return lower
    if len(weights) <= _PAIRWISE_MAX_PEERS:
        return _median_pairwise(x, weights)
    return _median_sorted(x, weights)


def _median_pairwise(x: _Array, weights: _Array) -> _Array:
    """Weight at or below each candidate by one matmul; beats argsort for few peers."""
    half = 0.5 * weights.sum() * (1 - _HALF_SLACK)
    result: _Array = np.empty(x.shape[1], dtype=x.dtype)
    for a in range(0, x.shape[1], _PAIRWISE_COLUMNS):
        b = a + _PAIRWISE_COLUMNS
        result[a:b] = _median_pairwise_chunk(x[:, a:b], weights, half)
    return result


def _median_pairwise_chunk(x: _Array, weights: _Array, half: float) -> _Array:
    result: _Array = x[0].copy()
    found = np.zeros(x.shape[1], dtype=bool)
    for candidate in x:
        below = np.matmul(weights, (x <= candidate).astype(np.float64))
        better = (below >= half) & (~found | (candidate < result))
        np.copyto(result, candidate, where=better)
        found |= better
    return result


def _median_sorted(x: _Array, weights: _Array) -> _Array:
    order = np.argsort(x, axis=0, kind="stable")
    cumulative = np.cumsum(weights[order], axis=0)
    pick = np.argmax(cumulative >= 0.5 * weights.sum() * (1 - _HALF_SLACK), axis=0)
    rows = np.take_along_axis(order, pick[None], axis=0)
    chosen: _Array = np.take_along_axis(x, rows, axis=0)[0]
    return chosen


def _trim_count(peers: int, ratio: float) -> int:
    """Rows dropped at each end: floor(ratio * n), and at least one from 4 peers on (one bad peer
    among four or more is always trimmed)."""
    cut = math.floor(ratio * peers + 1e-9)
    return max(cut, 1) if peers >= _MIN_PEERS_TO_TRIM else cut


def _subset(active: _Array, peers: int) -> _Array | None:
    """Row indices to select, or None when all rows take part."""
    return None if len(active) == peers else active


def _trimmed_mean(x: _Array, out: _Array | None, *, cut: int, peers: _Array | None) -> _Array:
    """Unweighted mean per column after dropping the ``cut`` lowest and highest values."""
    if peers is not None:
        x = x[peers]
    if not cut:
        kept = x
    elif 2 * cut * len(x) <= _BUBBLE_MAX_SWAPS:
        kept = _bubble_trim(x, cut)
    else:
        kept = np.sort(x, axis=0)[cut : len(x) - cut]
    return _weighted_sum(kept, out, weights=np.full(len(kept), 1.0 / len(kept)))


def _bubble_trim(x: _Array, cut: int) -> _Array:
    """The middle rows of x sorted per column, by ``cut`` bubble passes each way (no full sort)."""
    work = x.copy()
    spare = np.empty_like(work[0])
    low, high = 0, len(work) - 1
    for _ in range(cut):
        for i in range(low, high):
            _order_pair(work[i], work[i + 1], spare)
        high -= 1
        for i in range(high, low, -1):
            _order_pair(work[i - 1], work[i], spare)
        low += 1
    kept: _Array = work[low : high + 1]
    return kept


def _order_pair(low: _Array, high: _Array, spare: _Array) -> None:
    """Swap per column so that ``low <= high``."""
    np.minimum(low, high, out=spare)
    np.maximum(low, high, out=high)
    low[...] = spare


def _gram(rows: _Peers, tensors: Sequence[_Tensor], weights: _Array) -> _Gram:
    """Inner products of the peers' float tensors around their coordinate-wise median, in float64.

    Centring on the median (of the peers with a positive weight) rather than the mean keeps the honest
    rows' small differences exact when one row is huge: around the mean they would be lost in rounding.
    """
    active = np.flatnonzero(weights)
    pieces = [
        (tensor.label, a, b)
        for tensor in tensors
        for a, b in _blocks(tensor.offset, tensor.end, _GRAM_COLUMNS * _STORAGE[tensor.label].itemsize)
    ]
    # A large model's sums are made in _GRAM_PARTS fixed parts, added in order: the same bits on any
    # number of threads (a small one's in one part, as they always were).
    groups = cut(pieces, _GRAM_PARTS if rows.total >= PARALLEL_BYTES else 1)
    threads = threads_for(rows.total)

    def sums_run(run: Sequence[Sequence[tuple[str, int, int]]]) -> list[_Gram]:
        own = rows if threads == 1 else rows.with_own_scratch()
        return [_gram_part(own, group, active, len(weights)) for group in run]

    g, xc, cc = np.zeros((len(weights), len(weights))), np.zeros(len(weights)), 0.0
    for part in run_split(sums_run, groups, threads):
        g, xc, cc = g + part.g, xc + part.xc, cc + part.cc
    return _Gram(g, xc, cc)


def _gram_part(rows: _Peers, pieces: Sequence[tuple[str, int, int]], active: _Array, n: int) -> _Gram:
    """``_Gram`` of the byte ranges ``pieces`` only."""
    g, xc, cc = np.zeros((n, n)), np.zeros(n), 0.0
    middle = (len(active) - 1) // 2
    for label, a, b in pieces:
        x = _decode(rows.block(a, b), label).astype(np.float64)
        centre = np.partition(x[active], middle, axis=0)[middle]
        x -= centre
        g += x @ x.T
        xc += x @ centre
        cc += float(centre @ centre)
    return _Gram(g, xc, cc)


def _krum_pick(g: _Array, byzantine: int) -> int:
    """Peer with the least sum of squared distances to its n - f - 2 nearest peers."""
    n = len(g)
    diag = np.diag(g)
    dist = np.maximum(diag[:, None] + diag[None, :] - 2.0 * g, 0.0)
    np.fill_diagonal(dist, np.inf)
    nearest = np.sort(dist, axis=1)[:, : n - byzantine - 2]
    return int(np.argmin(nearest.sum(axis=1)))


def _weiszfeld(gram: _Gram, weights: _Array, options: MergeOptions) -> _Array:
    """Weighted geometric median as convex coefficients over the peers (Weiszfeld).

    The estimate y = sum_j a_j x_j starts at the weighted mean; distances come from the Gram
    matrix, so each iteration costs O(n^2) instead of a pass over the model. Distances are
    floored at 1e-10 of the median peer's distance to the centre (not of the mean spread, which
    one huge row would inflate until it kept itself in the result) so that an estimate on a data
    point divides by no zero.
    """
    a: _Array = weights / weights.sum()
    if float(np.trace(gram.g)) <= 0.0:
        return a
    radii = np.sqrt(np.maximum(np.diag(gram.g)[weights > 0], 0.0))
    floor = max(1e-10 * float(np.median(radii)), 1e-30)
    eye = np.eye(len(a))
    for _ in range(options.geomedian_max_iter):
        diffs = eye - a  # row i: e_i - a, so x_i - y = sum_j diffs[i, j] x_j
        dist = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", diffs, gram.g, diffs), 0.0))
        inverse = weights / np.maximum(dist, floor)
        new = inverse / inverse.sum()
        step = math.sqrt(max(float((new - a) @ gram.g @ (new - a)), 0.0))
        a = new
        norm = math.sqrt(max(gram.cc + 2.0 * float(a @ gram.xc) + float(a @ gram.g @ a), 0.0))
        if step <= options.geomedian_eps * norm:
            break
    return a
