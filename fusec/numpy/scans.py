"""Cumulative operations along an axis: numpy's cumsum and cumprod, the Array API's
cumulative_sum and cumulative_prod, and cummax / cummin (as JAX's ``lax.cummax``).

Each traces one ``cumulative`` primitive (an inclusive scan along one axis); the pass
:func:`fusec.passes.scan.lower_scan` turns it into the kernels that compute it on the GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes
from ..errors import ShapeError, TraceError
from ..ir import Op
from ..ops import scan_identity
from ..trace import Tracer
from ._base import _norm_axis, _traceable, _tracer
from .elementwise import astype
from .shapes import reshape

__all__ = ["cumsum", "cumprod", "cumulative_sum", "cumulative_prod", "cummax", "cummin"]


def _axis_of(t: Tracer, axis: Any, name: str) -> tuple[Tracer, int]:
    """The scanned array and axis: numpy's rules (None: the flattened array; a 0-d array is
    scanned as one element)."""
    if axis is None:
        return (reshape(t, (-1,)) if t.ndim != 1 else t), 0
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TraceError(f"{name}: axis must be an int or None; got {axis!r}. Axes must be known "
                         "at trace time: pass them as static arguments")
    if t.ndim == 0:
        t = reshape(t, (1,))
    return t, _norm_axis(int(axis), t.ndim, f"{name}: axis")


def cumulative(x: Any, reduce: str, axis: int, reverse: bool = False) -> Tracer:
    """The inclusive scan of ``x`` along ``axis`` (an int, normalised or negative) under
    ``reduce`` (sum, prod, max or min), from the last position backwards when ``reverse``: the
    primitive the public functions trace. Sums and products of bool become logical or / and."""
    t = _tracer(x)
    t, ax = _axis_of(t, int(axis), f"cumulative {reduce}")
    if t.var.dtype == "bool" and reduce in ("sum", "prod"):
        reduce = "max" if reduce == "sum" else "min"
    if t.size == 0:
        return t
    return t.builder.bind(Op.CUMULATIVE, [t], {"reduce": reduce, "axis": ax,
                                               "reverse": bool(reverse)})


def _accumulate(a: Any, axis: Any, dtype: Any, reduce: str, name: str) -> Tracer:
    """numpy's cumsum / cumprod: bool and int32 accumulate as int32, uint32 as uint32 (numpy's
    64-bit results, restricted to 32 bits as JAX does), floats as float32; ``dtype`` casts the
    operand first and accumulates in it."""
    t = _tracer(a)
    if dtype is not None:
        dt = dtypes.canonicalize(dtype, f"{name}'s dtype")
    else:
        dt = "int32" if t.var.dtype == "bool" else t.var.dtype
    t, ax = _axis_of(t, axis, name)
    return cumulative(astype(t, dt), reduce, ax)


@_traceable
def cumsum(a: Any, axis: Any = None, dtype: Any = None) -> Tracer:
    """Cumulative sum along ``axis`` (of the flattened array when None), as numpy's cumsum:
    bool and int32 sum as int32 and wrap around on overflow, uint32 as uint32, float32 as
    float32 (in another order than numpy's: rounding differs; NaN and inf propagate)."""
    return _accumulate(a, axis, dtype, "sum", "cumsum")


@_traceable
def cumprod(a: Any, axis: Any = None, dtype: Any = None) -> Tracer:
    """Cumulative product along ``axis`` (of the flattened array when None), as numpy's
    cumprod; dtypes as :func:`cumsum`."""
    return _accumulate(a, axis, dtype, "prod", "cumprod")


def _array_api(x: Any, axis: Any, dtype: Any, include_initial: bool, reduce: str,
               name: str) -> Tracer:
    t = _tracer(x)
    if axis is None:
        if t.ndim > 1:
            raise ShapeError(f"{name}: axis is required for an array of {t.ndim} dimensions "
                             f"(shape {t.shape})")
        axis = 0
    out = _accumulate(t, axis, dtype, reduce, name)
    if not include_initial:
        return out
    ax = _norm_axis(axis, out.ndim, f"{name}: axis")
    widths = tuple((1, 0) if k == ax else (0, 0) for k in range(out.ndim))
    value = scan_identity(reduce, out.var.dtype)
    if dtypes.is_float(out.var.dtype):
        value = float(value)
    return out.builder.bind(Op.PAD, [out], {"widths": widths, "value": value})


@_traceable
def cumulative_sum(x: Any, /, *, axis: Any = None, dtype: Any = None,
                   include_initial: bool = False) -> Tracer:
    """The Array API's cumulative sum: as :func:`cumsum`, but ``axis`` may be left out only for
    a 1-d array, and ``include_initial`` puts a 0 before the sums along the axis (one more
    element)."""
    return _array_api(x, axis, dtype, include_initial, "sum", "cumulative_sum")


@_traceable
def cumulative_prod(x: Any, /, *, axis: Any = None, dtype: Any = None,
                    include_initial: bool = False) -> Tracer:
    """The Array API's cumulative product: as :func:`cumprod`, but ``axis`` may be left out
    only for a 1-d array, and ``include_initial`` puts a 1 before the products along the
    axis."""
    return _array_api(x, axis, dtype, include_initial, "prod", "cumulative_prod")


@_traceable
def cummax(a: Any, axis: Any = None, reverse: bool = False) -> Tracer:
    """Running maximum along ``axis`` (of the flattened array when None), from the last
    element backwards when ``reverse`` (as JAX's ``lax.cummax``); keeps the dtype. A NaN makes
    every later result NaN, as numpy's ``np.maximum.accumulate``."""
    t, ax = _axis_of(_tracer(a), axis, "cummax")
    return cumulative(t, "max", ax, reverse)


@_traceable
def cummin(a: Any, axis: Any = None, reverse: bool = False) -> Tracer:
    """Running minimum along ``axis``; as :func:`cummax`."""
    t, ax = _axis_of(_tracer(a), axis, "cummin")
    return cumulative(t, "min", ax, reverse)
