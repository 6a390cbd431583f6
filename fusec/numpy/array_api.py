"""The names the Python Array API standard (version 2023.12) adds to a numpy-like namespace, so
that code written against it runs on fusec with ``xp = fusec.numpy``: the version string, dtype
objects, ``asarray``, the data type functions (``finfo``, ``iinfo``, ``result_type``,
``can_cast``, ``isdtype``), the constants, the inspection namespace and the standard's names of
functions numpy spells differently (``pow``, ``permute_dims``, ``concat``, ``matrix_transpose``,
``vecdot``).

Where fusec deliberately differs from the standard:

* **32-bit dtypes only**: float32, int32, uint32 and bool. There is no float64 (the standard's
  default floating dtype is float32 here), no int8/int16/int64, uint8/uint16/uint64, and no
  complex dtypes: ``fusec.numpy.float64`` and the like do not exist, and operations refuse
  complex inputs with a :class:`~fusec.errors.DTypeError`.
* **64-bit host data is narrowed**, as JAX does with 64-bit types off: ``asarray`` turns numpy's
  float64 into float32 and int64 into int32 (the default integer dtype, also the "indexing"
  one), refusing integers that do not fit rather than wrapping them.
* **Promotion is JAX's lattice without 64-bit types** (:func:`fusec.dtypes.promote`): int32 with
  uint32 gives int32 (the standard would need int64), an integer with a float gives float32 (the
  standard leaves mixed kinds undefined), Python scalars are weak (they take the array's dtype).
* **Arrays are immutable**: there is no in-place ``__setitem__``; use ``x.at[i].set(v)``.
* **Shapes are static**: functions whose result shape depends on values (``nonzero``,
  ``unique_*``, boolean masks as indices) are not available inside ``gpu_jit``.
* **One device**: ``device`` arguments are accepted and must be None (or the default device).
"""

from __future__ import annotations

import builtins
import functools
import math
from typing import Any

import numpy as np

from .. import dtypes
from ..errors import DTypeError, ShapeError, TraceError
from ..ir import Op
from ..ops import broadcast_shapes
from ..trace import Tracer, current_builder, is_device_array
from ._base import _lift, _traceable, _tracer
from .elementwise import astype, multiply, power
from .manipulation import concatenate, stack
from .reductions import sum as _sum
from .shapes import swapaxes, transpose

__all__ = [
    "__array_api_version__",
    "__array_namespace_info__",
    "float32",
    "float16",
    "int32",
    "uint32",
    "bool",
    "e",
    "pi",
    "inf",
    "nan",
    "newaxis",
    "asarray",
    "finfo",
    "iinfo",
    "result_type",
    "can_cast",
    "isdtype",
    "pow",
    "permute_dims",
    "concat",
    "matrix_transpose",
    "vecdot",
]

__array_api_version__ = "2023.12"

# dtype objects: numpy's. They compare equal to the dtype of every fusec array (x.dtype == float32)
float32 = np.float32
float16 = np.float16
int32 = np.int32
uint32 = np.uint32
bool = np.bool_  # noqa: A001 - the standard's name; use builtins.bool for Python's in this module

e = math.e
pi = math.pi
inf = math.inf
nan = math.nan
newaxis = None


# --- asarray --------------------------------------------------------------------------------------


def _narrowed(arr: np.ndarray, what: str) -> np.ndarray:
    """A host array in the fusec dtype of its kind (64-bit ones narrowed, values checked)."""
    kind = arr.dtype.kind
    if kind == "b":
        return arr
    if kind in "iu":
        target = np.int32 if kind == "i" else np.uint32
        info = np.iinfo(target)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise DTypeError(f"{what}: integer values from {arr.min()} to {arr.max()} do not fit "
                             f"in {np.dtype(target).name}, fusec's integer dtype of that kind "
                             "(there are no 64-bit integers)")
        return arr.astype(target)
    if kind == "f":
        return arr if arr.dtype == np.float16 else arr.astype(np.float32)
    raise DTypeError(f"{what}: numpy dtype {arr.dtype} has no fusec counterpart; supported: "
                     f"{', '.join(dtypes.SUPPORTED)}")


def _host(obj: Any, dt: str | None, what: str) -> np.ndarray:
    """Host data as a numpy array of ``dt`` (a cast, as numpy's) or of its own kind's dtype."""
    arr = np.asarray(obj)
    if arr.dtype.kind not in "biuf":
        raise DTypeError(f"{what}: numpy dtype {arr.dtype} has no fusec counterpart; supported: "
                         f"{', '.join(dtypes.SUPPORTED)}")
    if dt is None:
        return _narrowed(arr, what)
    if arr.dtype.kind in "iu" and dt in dtypes.INTS and arr.size:
        info = np.iinfo(np.dtype(dt))
        if arr.min() < info.min or arr.max() > info.max:
            raise DTypeError(f"{what}: integer values from {arr.min()} to {arr.max()} do not fit "
                             f"in {dt}")
    return arr.astype(np.bool_ if dt == "bool" else dtypes.NUMPY_STORAGE[dt])


@_traceable
def _on_device(x: Any) -> Tracer:
    return _tracer(x)


@_traceable
def _copy(x: Any) -> Tracer:
    t = _tracer(x)
    # a select of the value with itself: a kernel that writes a new buffer
    return t.builder.bind(Op.WHERE, [_tracer(True), t, t])


def _has_tracer(obj: Any) -> builtins.bool:
    if isinstance(obj, Tracer):
        return True
    return isinstance(obj, (list, tuple)) and any(_has_tracer(o) for o in obj)


def _traced(obj: Any, dt: str | None) -> Tracer:
    if isinstance(obj, Tracer) or is_device_array(obj):
        t = _tracer(obj)
    elif isinstance(obj, (list, tuple)) and _has_tracer(obj):
        t = stack([_traced(o, None) for o in obj])
    elif isinstance(obj, (builtins.bool, int, float)) and not isinstance(obj, np.generic):
        t = _tracer(obj)  # a Python scalar stays weak, as in JAX
    else:
        t = _tracer(_lift(_host(obj, dt, "asarray")))
    return t if dt is None else astype(t, dt)


def asarray(obj: Any, dtype: Any = None, *, device: Any = None, copy: Any = None) -> Any:
    """``obj`` (an array, a scalar, nested sequences of them, anything with ``__array__``) as a
    fusec array of ``dtype`` (by default its own: numpy's 64-bit dtypes become float32 and int32,
    Python floats float32, ints int32). Outside ``gpu_jit``: a :class:`fusec.Array` on the device.
    Inside: a traced value (a captured constant for host data).

    ``copy=True`` always makes a new array; ``copy=False`` refuses (ValueError) when a copy is
    needed: a dtype change, or host data, which must be copied to the device."""
    if device is not None and device != _DEVICE:
        raise ValueError(f"asarray: fusec has one device; got device={device!r}")
    dt = None if dtype is None else dtypes.canonicalize(dtype, "asarray's dtype")
    if current_builder() is not None:
        return _traced(obj, dt)
    if isinstance(obj, Tracer):
        raise TraceError("asarray: a traced value was used outside of its jitted function")
    if is_device_array(obj):
        if dt is not None and dt != obj.dtype.name:
            if copy is False:
                raise ValueError(f"asarray(copy=False): converting {obj.dtype.name} to {dt} "
                                 "needs a copy")
            return astype(obj, dt)
        return _copy(obj) if copy else obj
    if copy is False:
        raise ValueError("asarray(copy=False): host data must be copied to the device; use "
                         "copy=None or True")
    return _on_device(_host(obj, dt, "asarray"))


# --- data type functions --------------------------------------------------------------------------


def _dtype_name(x: Any, what: str) -> str:
    """The fusec dtype of an array or a dtype-like."""
    if isinstance(x, Tracer) or is_device_array(x):
        return str(np.dtype(x.dtype).name)
    if isinstance(x, np.ndarray):
        return str(_narrowed(np.zeros((), x.dtype), what).dtype.name)
    return dtypes.canonicalize(x, what)


def finfo(type: Any) -> np.finfo:  # noqa: A002 - the standard's parameter name
    """Machine limits of a floating dtype (float32, float16), as numpy's ``finfo`` object;
    ``type`` is the dtype or an array of it."""
    dt = _dtype_name(type, "finfo")
    if not dtypes.is_float(dt):
        raise DTypeError(f"finfo: {dt} is not a floating dtype; use iinfo for integers")
    return np.finfo(np.dtype(dt))


def iinfo(type: Any) -> np.iinfo:  # noqa: A002 - the standard's parameter name
    """Machine limits of an integer dtype (int32, uint32), as numpy's ``iinfo`` object; ``type``
    is the dtype or an array of it."""
    dt = _dtype_name(type, "iinfo")
    if not dtypes.is_int(dt):
        raise DTypeError(f"iinfo: {dt} is not an integer dtype; use finfo for floats")
    return np.iinfo(np.dtype(dt))


def result_type(*arrays_and_dtypes: Any) -> np.dtype:  # type: ignore[type-arg]
    """The dtype that operations on these arrays and dtypes give: JAX's promotion with 64-bit
    types off (int32 with uint32 gives int32, an integer with a float gives float32). Python
    scalars are weak: they take the dtype of the arrays unless their kind is higher."""
    if not arrays_and_dtypes:
        raise ValueError("result_type: at least one array or dtype is required")
    strong: list[str] = []
    weak: list[str] = []
    for x in arrays_and_dtypes:
        if isinstance(x, Tracer) and x.weak:
            weak.append(x.var.dtype)
        elif isinstance(x, (builtins.bool, int, float)) and not isinstance(x, np.generic):
            weak.append(dtypes.weak_dtype(x))
        else:
            strong.append(_dtype_name(x, "result_type"))
    if strong:
        dt = functools.reduce(dtypes.promote, strong)
        for w in weak:
            if dtypes.weak_wins(w, dt):
                dt = w
    else:
        dt = functools.reduce(dtypes.promote, weak)
    return np.dtype(dt)


def can_cast(from_: Any, to: Any, /) -> builtins.bool:
    """Whether ``from_`` (a dtype or an array) converts to dtype ``to`` without losing values:
    numpy's "safe" casting among float32, int32, uint32 and bool (so int32 to float32 is not:
    float32 cannot hold every int32)."""
    src = _dtype_name(from_, "can_cast's from_")
    dst = dtypes.canonicalize(to, "can_cast's to")
    return builtins.bool(np.can_cast(np.dtype(src), np.dtype(dst)))


_KINDS = {
    "bool": "b",
    "signed integer": "i",
    "unsigned integer": "u",
    "integral": "iu",
    "real floating": "f",
    "complex floating": "c",
    "numeric": "iufc",
}


def isdtype(dtype: Any, kind: Any) -> builtins.bool:
    """Whether ``dtype`` is of ``kind``: a dtype (equality), one of the names ``'bool'``,
    ``'signed integer'``, ``'unsigned integer'``, ``'integral'``, ``'real floating'``,
    ``'complex floating'``, ``'numeric'``, or a tuple of these (any matches)."""
    if isinstance(dtype, Tracer) or is_device_array(dtype) or isinstance(dtype, np.ndarray):
        raise DTypeError("isdtype: expected a dtype, got an array; pass x.dtype")
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise DTypeError(f"isdtype: {dtype!r} is not a dtype") from exc
    if isinstance(kind, tuple):
        return any(isdtype(dt, k) for k in kind)
    if isinstance(kind, str):
        if kind not in _KINDS:
            raise ValueError(f"isdtype: unknown kind {kind!r}; kinds: {', '.join(_KINDS)}")
        return dt.kind in _KINDS[kind]
    try:
        return builtins.bool(dt == np.dtype(kind))
    except TypeError as exc:
        raise DTypeError(f"isdtype: kind {kind!r} is neither a dtype, a kind name nor a "
                         "tuple of them") from exc


# --- the standard's names of numpy functions ------------------------------------------------------

pow = power  # noqa: A001 - the standard's name of numpy's power


@_traceable
def permute_dims(x: Any, axes: Any) -> Tracer:
    """Permute the axes of ``x``: axis k of the result is axis ``axes[k]`` of ``x`` (numpy's
    transpose with the permutation required)."""
    if axes is None:
        raise ShapeError("permute_dims: axes is required (a permutation of the axes)")
    return transpose(x, tuple(axes))


@_traceable
def concat(arrays: Any, axis: Any = 0) -> Tracer:
    """Join arrays along an existing axis (``axis=None``: flatten them first); the standard's
    name of :func:`concatenate`."""
    return concatenate(arrays, axis=axis)


@_traceable
def matrix_transpose(x: Any) -> Tracer:
    """Swap the last two axes (transpose each matrix of a stack)."""
    t = _tracer(x)
    if t.ndim < 2:
        raise ShapeError(f"matrix_transpose: x has shape {t.shape}; it needs at least 2 "
                         "dimensions")
    return swapaxes(t, -1, -2)


@_traceable
def vecdot(x1: Any, x2: Any, axis: int = -1) -> Tracer:
    """Dot products of vectors along ``axis``: ``sum(x1 * x2, axis)``. The other axes broadcast;
    along ``axis`` both must have the same length. (Real dtypes only: no complex conjugate.)"""
    a, b = _tracer(x1), _tracer(x2)
    shape = broadcast_shapes(a.shape, b.shape) if a.ndim and b.ndim else ()
    nd = len(shape)
    if not isinstance(axis, int) or not -nd <= axis < nd:
        raise ShapeError(f"vecdot: axis {axis!r} is out of bounds for shapes {a.shape} and "
                         f"{b.shape}")
    k = axis - nd if axis >= 0 else axis  # counted from the end, where both operands align
    da = a.shape[k] if -k <= a.ndim else 1
    db = b.shape[k] if -k <= b.ndim else 1
    if da != db:
        raise ShapeError(f"vecdot: x1 has shape {a.shape} and x2 has shape {b.shape}; along axis "
                         f"{axis} they must have the same length ({da} vs {db})")
    return _sum(multiply(a, b), axis=axis)


# --- inspection -----------------------------------------------------------------------------------

_DEVICE = "default"


class _Info:
    """What :func:`__array_namespace_info__` returns: the standard's inspection functions."""

    def capabilities(self) -> dict[str, Any]:
        """Optional features: no boolean-mask indexing, no value-dependent shapes."""
        return {"boolean indexing": False, "data-dependent shapes": False,
                "max dimensions": None}

    def default_device(self) -> str:
        """The one device fusec computes on."""
        return _DEVICE

    def devices(self) -> list[str]:
        """The devices arrays can live on (one)."""
        return [_DEVICE]

    def default_dtypes(self, *, device: Any = None) -> dict[str, Any]:
        """float32 for reals and int32 for integers and indices; no complex dtype."""
        return {"real floating": np.dtype(np.float32), "complex floating": None,
                "integral": np.dtype(np.int32), "indexing": np.dtype(np.int32)}

    def dtypes(self, *, device: Any = None, kind: Any = None) -> dict[str, Any]:
        """The supported dtypes by name (those of ``kind``, as :func:`isdtype` reads it)."""
        out = {name: np.dtype(name) for name in dtypes.SUPPORTED}
        if kind is None:
            return out
        return {n: d for n, d in out.items() if isdtype(d, kind)}


def __array_namespace_info__() -> _Info:
    """The standard's inspection namespace: capabilities, devices and dtypes of fusec."""
    return _Info()
