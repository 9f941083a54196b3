"""A flat model's tensors as float64 values and back, whatever their wire dtype.

Floats are rounded to nearest even when stored back into a narrower type (bfloat16 included);
integer and bool tensors are rounded with ``np.rint`` as the mean merge does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from wire.tensors import FlatState, TensorSpec

__all__ = ["FLOAT_DTYPES", "read", "write"]

FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})


def read(flat: FlatState, spec: TensorSpec) -> npt.NDArray[np.float64]:
    """Tensor ``spec`` of ``flat`` as a new flat float64 array."""
    values = flat.view(spec).reshape(-1)
    if spec.dtype == "bfloat16":
        values = (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float64)


def write(flat: FlatState, spec: TensorSpec, values: npt.NDArray[Any]) -> None:
    """Store float64 ``values`` into tensor ``spec`` of ``flat``, rounded to its dtype."""
    target = flat.view(spec).reshape(-1)
    if spec.dtype == "bfloat16":
        target[...] = _bf16_words(values.astype(np.float32))
    elif spec.dtype in FLOAT_DTYPES:
        target[...] = values
    elif spec.dtype == "bool":
        target[...] = np.rint(values) != 0
    else:
        target[...] = np.rint(values)


def _bf16_words(values: npt.NDArray[np.float32]) -> npt.NDArray[np.uint16]:
    """bfloat16 words of float32 values: round to nearest even (finite inputs)."""
    bits = np.ascontiguousarray(values).view(np.uint32)
    return ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)
