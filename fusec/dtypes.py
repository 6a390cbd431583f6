"""Supported dtypes, their numpy and WGSL spellings, and numpy-like type promotion.

fusec computes in 32-bit types only (float32, int32, uint32, bool). Promotion follows numpy within
that set, the way JAX does with 64-bit types disabled: int32 with uint32 gives int32, an integer
with a float gives float32, and Python scalars are "weak": they take the dtype of the array they
meet.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import DTypeError

SUPPORTED = ("float32", "int32", "uint32", "bool")
FLOATS = ("float32",)
INTS = ("int32", "uint32")

WGSL_TYPE = {"float32": "f32", "int32": "i32", "uint32": "u32", "bool": "bool"}
# Storage type in buffers: WGSL bool is not host-shareable, so bools travel as u32 words.
WGSL_STORAGE = {"float32": "f32", "int32": "i32", "uint32": "u32", "bool": "u32"}
NUMPY_STORAGE = {"float32": np.float32, "int32": np.int32, "uint32": np.uint32, "bool": np.uint32}

_ORDER = {"bool": 0, "uint32": 1, "int32": 1, "float32": 2}


def canonicalize(dtype: Any, what: str = "dtype") -> str:
    """Turn a dtype-like (str, numpy dtype, Python type) into one of SUPPORTED, or raise."""
    if dtype is float:
        return "float32"
    if dtype is int:
        return "int32"
    if dtype is bool:
        return "bool"
    try:
        name = np.dtype(dtype).name
    except TypeError as exc:
        raise DTypeError(
            f"{what}: {dtype!r} is not a dtype; supported: {', '.join(SUPPORTED)}"
        ) from exc
    if name not in SUPPORTED:
        raise DTypeError(
            f"{what} has dtype {name}, which fusec does not support; supported dtypes are "
            f"{', '.join(SUPPORTED)}. Convert first, e.g. x.astype(np.float32)."
        )
    return name


def is_float(dtype: str) -> bool:
    return dtype in FLOATS


def is_int(dtype: str) -> bool:
    return dtype in INTS


def promote(a: str, b: str) -> str:
    """Result dtype of a binary op on two (strong) dtypes."""
    if a == b:
        return a
    if _ORDER[a] != _ORDER[b]:
        return a if _ORDER[a] > _ORDER[b] else b
    return "int32"  # int32 with uint32, as JAX does without 64-bit types


def weak_dtype(value: Any) -> str:
    """The dtype of a Python scalar when it stands alone."""
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int32"
    return "float32"


def promote_with_weak(strong: str, value: Any) -> str:
    """Result dtype of a strong-typed array meeting a Python scalar (numpy 2 / JAX rules)."""
    kind = weak_dtype(value)
    if _ORDER[kind] <= _ORDER[strong]:
        return strong
    return kind
