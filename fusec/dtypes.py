"""Supported dtypes, their numpy and WGSL spellings, and numpy-like type promotion.

fusec computes in float32, int32, uint32 and bool, and stores float16 (where the adapter has the
WebGPU feature ``shader-f16``). Promotion follows numpy within that set, the way JAX does with
64-bit types disabled: int32 with uint32 gives int32, an integer with a float gives that float
(float32 for integers meeting float32, float16 for integers meeting float16), float16 with
float32 gives float32, and Python scalars are "weak": they take the dtype of the array they meet
(``float16 array * 2.0`` stays float16).

float16 is a storage type: kernels load ``array<f16>`` elements as f32, compute in f32 and round
to f16 where a value is stored (or cast to float16 explicitly), so sums and products accumulate
in float32 and are rounded once. Each dtype has two WGSL spellings: :data:`WGSL_TYPE`, the type a
value has in registers, and :data:`WGSL_STORAGE`, its element type in a buffer (bool travels as
u32 words, float16 as f16); :data:`NUMPY_STORAGE` is the buffer's element type on the host.

Other real dtypes are converted at the boundary, as JAX does with 64-bit types off: float64
becomes float32, int64/int16/int8 become int32, uint64/uint16/uint8 become uint32, with a
warning once per conversion; ``FUSEC_STRICT_DTYPES=1`` makes them an error instead. Complex,
object, string and datetime dtypes are always refused.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from . import config
from .errors import DTypeError

SUPPORTED = ("float32", "float16", "int32", "uint32", "bool")
FLOATS = ("float32", "float16")
INTS = ("int32", "uint32")

# The type of a value in a kernel's registers: float16 values are computed in f32.
WGSL_TYPE = {"float32": "f32", "float16": "f32", "int32": "i32", "uint32": "u32", "bool": "bool"}
# Storage type in buffers: WGSL bool is not host-shareable, so bools travel as u32 words; float16
# as f16 (2 bytes; the WGSL needs ``enable f16;``, the device the feature ``shader-f16``).
WGSL_STORAGE = {"float32": "f32", "float16": "f16", "int32": "i32", "uint32": "u32",
                "bool": "u32"}
NUMPY_STORAGE = {"float32": np.float32, "float16": np.float16, "int32": np.int32,
                 "uint32": np.uint32, "bool": np.uint32}
# The dtype whose WGSL expressions compute a value of each dtype (float16 computes as float32).
COMPUTE = {"float32": "float32", "float16": "float32", "int32": "int32", "uint32": "uint32",
           "bool": "bool"}

# promotion order of strong dtypes
_ORDER = {"bool": 0, "uint32": 1, "int32": 1, "float16": 2, "float32": 3}
# kinds, for Python scalars (weak): a weak float meeting any float array takes its dtype
_KIND = {"bool": 0, "uint32": 1, "int32": 1, "float16": 2, "float32": 2}

# dtypes converted at the boundary (JAX with 64-bit types off), to the 32-bit type of their kind
NARROWED = {"float64": "float32", "longdouble": "float32", "float128": "float32",
            "float96": "float32",
            "int64": "int32", "int16": "int32", "int8": "int32",
            "uint64": "uint32", "uint16": "uint32", "uint8": "uint32"}
_warned: set[tuple[str, str]] = set()


def _narrow(name: str, what: str) -> str:
    """The 32-bit dtype ``name`` becomes (warning once per conversion), or a DTypeError under
    FUSEC_STRICT_DTYPES=1."""
    to = NARROWED[name]
    if config.get("strict_dtypes"):
        raise DTypeError(
            f"{what} has dtype {name}, which fusec does not support (FUSEC_STRICT_DTYPES=1); "
            f"supported dtypes are {', '.join(SUPPORTED)}. Convert first, e.g. "
            f"x.astype(np.{to}).")
    if (name, to) not in _warned:
        _warned.add((name, to))
        warnings.warn(
            f"fusec: {what} has dtype {name}; fusec computes in 32-bit types (as JAX does by "
            f"default), so it becomes {to}. This warning is shown once per dtype; set "
            "FUSEC_STRICT_DTYPES=1 to make it an error.", UserWarning, stacklevel=_user_level())
    return to


def _user_level() -> int:
    """The stack level of the first frame outside fusec (where a warning should point)."""
    import sys

    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("fusec"):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


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
    if name in NARROWED:
        return _narrow(name, what)
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


def compute_dtype(dtype: str) -> str:
    """The dtype a value of ``dtype`` is computed in inside a kernel (float16: float32)."""
    return COMPUTE[dtype]


def itemsize(dtype: str) -> int:
    """Bytes per element in a buffer (bool is stored as a 32-bit word, float16 in 2 bytes)."""
    return 2 if dtype == "float16" else 4


def promote(a: str, b: str) -> str:
    """Result dtype of a binary op on two (strong) dtypes."""
    if a == b:
        return a
    if _ORDER[a] != _ORDER[b]:
        return a if _ORDER[a] > _ORDER[b] else b
    return "int32"  # int32 with uint32, as JAX does without 64-bit types


def weak_wins(weak: str, strong: str) -> bool:
    """Does a weak (Python scalar) operand of dtype ``weak`` decide the result dtype over a
    strong one? Only when it is of a higher kind (a float scalar with an integer array): a float
    scalar with a float16 array stays float16."""
    return _KIND[weak] > _KIND[strong]


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
    return kind if weak_wins(kind, strong) else strong
