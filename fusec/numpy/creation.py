"""Creating arrays: filled arrays, ranges, identity and triangular matrices, coordinate grids and
the ``_like`` forms.

Every array made here from static arguments is index arithmetic (a broadcast literal, or an
``iota`` and a few elementwise ops): it has no buffer of its own and is computed inside the kernel
that reads it. Outside ``gpu_jit`` these functions return a :class:`fusec.Array`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import dtypes
from ..errors import DTypeError, ShapeError
from ..ir import Op
from ..trace import Tracer
from ._base import (
    _builder_of,
    _describe,
    _lift,
    _scalar_lit,
    _shape_arg,
    _traceable,
    _tracer,
)
from .elementwise import add, astype, equal, less_equal, multiply, subtract, where
from .shapes import Number, _iota, _static_count, _static_number, broadcast_to, ravel, reshape

__all__ = [
    "full",
    "zeros",
    "ones",
    "empty",
    "zeros_like",
    "ones_like",
    "full_like",
    "empty_like",
    "arange",
    "linspace",
    "eye",
    "identity",
    "tri",
    "tril",
    "triu",
    "meshgrid",
]

def _new_shape(shape: Any, what: str) -> tuple[int, ...]:
    shp = _shape_arg(shape, what)
    if any(d < 0 for d in shp):
        raise ShapeError(f"{what} {shp} has a negative dimension")
    return shp


# --- filled arrays --------------------------------------------------------------------------------


@_traceable
def full(shape: Any, fill_value: Any, dtype: Any = None) -> Tracer:
    """An array of ``shape`` filled with ``fill_value`` (a scalar, or an array that broadcasts
    to ``shape``). Without ``dtype``: float32 for a Python float, int32 for an int, bool for a
    bool, the array's dtype for an array."""
    shp = _new_shape(shape, "full's shape")
    b = _builder_of()
    dt = dtypes.canonicalize(dtype, "full's dtype") if dtype is not None else None
    if isinstance(fill_value, (bool, int, float)) and not isinstance(fill_value, np.generic):
        if dt is not None and dtypes.is_int(dt) and isinstance(fill_value, float):
            if not math.isfinite(fill_value):
                raise DTypeError(f"full: fill value {fill_value} cannot be converted to {dt}")
            fill_value = math.trunc(fill_value)  # as numpy's cast: toward zero
        lit = _scalar_lit(fill_value, dt or dtypes.weak_dtype(fill_value))
        return b.bind(Op.BROADCAST, [lit], {"shape": shp})
    v = _tracer(fill_value)
    return broadcast_to(astype(v, dt or v.var.dtype), shp)


@_traceable
def zeros(shape: Any, dtype: Any = None) -> Tracer:
    """An array of ``shape`` filled with 0 (float32 unless ``dtype`` says otherwise)."""
    return full(shape, 0, dtype if dtype is not None else "float32")


@_traceable
def ones(shape: Any, dtype: Any = None) -> Tracer:
    """An array of ``shape`` filled with 1 (float32 unless ``dtype`` says otherwise)."""
    return full(shape, 1, dtype if dtype is not None else "float32")


@_traceable
def empty(shape: Any, dtype: Any = None) -> Tracer:
    """Same as :func:`zeros`: arrays are never uninitialised here."""
    return zeros(shape, dtype)


def _like(a: Any, dtype: Any, shape: Any) -> tuple[tuple[int, ...], str]:
    t = _tracer(a)
    shp = t.shape if shape is None else _new_shape(shape, "shape")
    dt = t.var.dtype if dtype is None else dtypes.canonicalize(dtype, "dtype")
    return shp, dt


@_traceable
def zeros_like(a: Any, dtype: Any = None, shape: Any = None) -> Tracer:
    """Zeros with the shape (unless ``shape`` is given) and dtype (unless given) of ``a``."""
    shp, dt = _like(a, dtype, shape)
    return full(shp, 0, dt)


@_traceable
def ones_like(a: Any, dtype: Any = None, shape: Any = None) -> Tracer:
    """Ones with the shape (unless ``shape`` is given) and dtype (unless given) of ``a``."""
    shp, dt = _like(a, dtype, shape)
    return full(shp, 1, dt)


@_traceable
def full_like(a: Any, fill_value: Any, dtype: Any = None, shape: Any = None) -> Tracer:
    """``fill_value`` with the shape (unless ``shape`` is given) and dtype (unless given) of
    ``a``."""
    shp, dt = _like(a, dtype, shape)
    return full(shp, fill_value, dt)


@_traceable
def empty_like(a: Any, dtype: Any = None, shape: Any = None) -> Tracer:
    """Same as :func:`zeros_like`."""
    return zeros_like(a, dtype, shape)


# --- ranges ---------------------------------------------------------------------------------------


def _check_fits(values: tuple[Number, ...], dt: str, what: str) -> None:
    if dt not in ("int32", "uint32"):
        return
    lo, hi = (-(2**31), 2**31 - 1) if dt == "int32" else (0, 2**32 - 1)
    for v in values:
        if not lo <= v <= hi:
            raise DTypeError(f"{what}: the value {v} does not fit in {dt} (range {lo}..{hi})")


@_traceable
def arange(start: Any, stop: Any = None, step: Any = None, dtype: Any = None) -> Tracer:
    """Evenly spaced values ``start, start + step, ...`` below ``stop`` (above, for a negative
    step), like numpy's arange. The arguments are static Python numbers: the length is computed
    on the host. Without ``dtype`` the result is int32 when every argument is an int, float32
    otherwise (JAX's rule with 64-bit types off)."""
    if stop is None:
        start, stop = 0, start
    a = _static_number(start, "arange's start")
    z = _static_number(stop, "arange's stop")
    s = _static_number(1 if step is None else step, "arange's step")
    if s == 0:
        raise ShapeError("arange's step must not be zero")
    all_int = not any(isinstance(v, float) for v in (a, z, s))
    if dtype is not None:
        dt = dtypes.canonicalize(dtype, "arange's dtype")
    else:
        dt = "int32" if all_int else "float32"
    if dt == "bool":
        raise DTypeError("arange: dtype bool is not supported (numpy allows only lengths 0 to 2); "
                         "use arange(...) != 0")
    if all_int:
        n = len(range(int(a), int(z), int(s)))
    else:
        n = max(0, math.ceil((float(z) - float(a)) / float(s)))
    if n and dtypes.is_int(dt):
        _check_fits((a, a + (n - 1) * s), dt, "arange")
    if dtypes.is_int(dt) and all_int:
        # exact integer arithmetic in the result dtype; a negative step is added modulo 2**32 in
        # uint32 (wrapping), which gives the same values
        out = _iota((n,), 0, dt)
        if s != 1 and n > 1:
            out = multiply(out, int(s) % 2**32 if dt == "uint32" else int(s))
        return add(out, int(a)) if a else out
    # floats (or float arguments with an integer dtype): start + i * step in float32
    vals = _iota((n,), 0, "float32")
    if s != 1:
        vals = multiply(vals, float(s))
    if a:
        vals = add(vals, float(a))
    return astype(vals, dt)


@_traceable
def linspace(start: Any, stop: Any, num: int = 50, endpoint: bool = True,
             dtype: Any = None) -> Tracer:
    """``num`` evenly spaced values from ``start`` to ``stop`` (included when ``endpoint``), with
    numpy's formula ``start + i * step`` where ``step = (stop - start) / (num - 1)`` (``/ num``
    without the endpoint); the first and last values are exactly ``start`` and ``stop``. float32
    unless ``dtype`` is given; an integer dtype rounds down, as numpy 2 does."""
    a = float(_static_number(start, "linspace's start"))
    z = float(_static_number(stop, "linspace's stop"))
    n = _static_count(num, "linspace's num")
    dt = "float32" if dtype is None else dtypes.canonicalize(dtype, "linspace's dtype")
    div = n - 1 if endpoint else n
    i = _iota((n,), 0, "float32")
    step = (z - a) / div if div > 0 else 0.0
    y = add(multiply(i, step), a)
    if endpoint and n > 1:
        y = where(equal(i, float(n - 1)), z, y)
    if dtypes.is_float(dt):
        return astype(y, dt)
    if dt == "bool":
        return astype(y, "bool")
    # round down, then convert (a cast alone would round toward zero)
    t = astype(y, dt)
    return where(astype(t, "float32") > y, subtract(t, 1), t)


# --- matrices -------------------------------------------------------------------------------------


def _diagonal_offset(n: int, m: int) -> Tracer:
    """``j - i`` for every element (i, j) of an n x m matrix (int32)."""
    return subtract(_iota((n, m), 1), _iota((n, m), 0))


@_traceable
def eye(N: int, M: Any = None, k: int = 0, dtype: Any = "float32") -> Tracer:  # noqa: N803
    """An ``N`` x ``M`` matrix (``M`` defaults to ``N``) with ones on diagonal ``k`` (above the
    main one for k > 0, below for k < 0) and zeros elsewhere."""
    n = _static_count(N, "eye's N")
    m = n if M is None else _static_count(M, "eye's M")
    kk = _static_number(k, "eye's k")
    dt = dtypes.canonicalize(dtype, "eye's dtype")
    return astype(equal(_diagonal_offset(n, m), int(kk)), dt)


@_traceable
def identity(n: int, dtype: Any = "float32") -> Tracer:
    """The ``n`` x ``n`` identity matrix."""
    return eye(n, dtype=dtype)


@_traceable
def tri(N: int, M: Any = None, k: int = 0, dtype: Any = "float32") -> Tracer:  # noqa: N803
    """An ``N`` x ``M`` matrix with ones at and below diagonal ``k``, zeros above it."""
    n = _static_count(N, "tri's N")
    m = n if M is None else _static_count(M, "tri's M")
    kk = _static_number(k, "tri's k")
    dt = dtypes.canonicalize(dtype, "tri's dtype")
    return astype(less_equal(_diagonal_offset(n, m), int(kk)), dt)


def _triangle(m: Any, k: Any, lower: bool, name: str) -> Tracer:
    t = _tracer(m)
    if t.ndim < 2:
        raise ShapeError(f"{name}: {_describe(t)} has shape {t.shape}; it needs at least 2 "
                         "dimensions (the last two are the matrix)")
    kk = int(_static_number(k, f"{name}'s k"))
    offset = _diagonal_offset(t.shape[-2], t.shape[-1])
    keep = less_equal(offset, kk) if lower else less_equal(kk, offset)
    zero = _scalar_lit(0, t.var.dtype)
    return t.builder.bind(Op.WHERE, [keep, t, zero], weak=t.weak)


@_traceable
def tril(m: Any, k: int = 0) -> Tracer:
    """``m`` with the elements above diagonal ``k`` zeroed, on its last two axes (the leading
    ones are a batch)."""
    return _triangle(m, k, True, "tril")


@_traceable
def triu(m: Any, k: int = 0) -> Tracer:
    """``m`` with the elements below diagonal ``k`` zeroed, on its last two axes (the leading
    ones are a batch)."""
    return _triangle(m, k, False, "triu")


# --- grids ----------------------------------------------------------------------------------------


@_traceable
def meshgrid(*xi: Any, indexing: str = "xy", sparse: bool = False) -> list[Tracer]:
    """Coordinate arrays from 1-D coordinate vectors (N-D inputs are flattened, as numpy does).
    ``indexing="xy"`` (Cartesian: the first two output axes are swapped) or ``"ij"`` (matrix).
    ``sparse=True`` returns arrays with unit axes that broadcast to the grid."""
    if indexing not in ("xy", "ij"):
        raise ValueError(f"meshgrid's indexing must be 'xy' or 'ij'; got {indexing!r}")
    vecs = [ravel(_tracer(_lift(x))) for x in xi]
    nd = len(vecs)
    pos = list(range(nd))
    if indexing == "xy" and nd >= 2:
        pos[0], pos[1] = 1, 0
    shape = [1] * nd
    for v, p in zip(vecs, pos):
        shape[p] = v.shape[0]
    outs = []
    for v, p in zip(vecs, pos):
        view = [1] * nd
        view[p] = v.shape[0]
        r = reshape(v, tuple(view))
        outs.append(r if sparse else broadcast_to(r, tuple(shape)))
    return outs
