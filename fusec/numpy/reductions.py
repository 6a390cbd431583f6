"""Reductions over axes: sum, prod, max, min, mean, var, std, all, any, count_nonzero, logsumexp,
argmax, argmin and the NaN-ignoring forms.

Every function here is built from the reduction primitives (``sum``, ``reduce_max``,
``reduce_min``, ``reduce_prod``) and elementwise ops, so that it fuses: two reductions over the
same rows, one reading the other (argmax's maximum, then the first index holding it; var's mean,
then the mean of squared deviations), become one kernel that reads the rows once.

NaN propagates as in numpy: max, min, argmax and argmin see NaN as larger (and smaller) than
everything; the ``nan*`` forms ignore it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import dtypes
from ..errors import ShapeError, TraceError
from ..ir import Op
from ..trace import Tracer
from ._base import (
    _norm_axes,
    _norm_axis,
    _scalar_lit,
    _stop_gradient,
    _traceable,
    _tracer,
)
from .elementwise import (
    add,
    astype,
    divide,
    equal,
    exp,
    greater,
    log,
    maximum,
    minimum,
    multiply,
    not_equal,
    sqrt,
    subtract,
    where,
)
from .shapes import reshape

__all__ = [
    "sum",
    "prod",
    "max",
    "min",
    "mean",
    "var",
    "std",
    "all",
    "any",
    "count_nonzero",
    "logsumexp",
    "argmax",
    "argmin",
    "nanmax",
    "nanmin",
    "nansum",
    "nanmean",
]

_F32_MAX = float(np.finfo(np.float32).max)


# --- helpers --------------------------------------------------------------------------------------


def _kept_shape(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` with the reduced ``axes`` kept as length 1 (keepdims)."""
    return tuple(1 if k in axes else d for k, d in enumerate(shape))


def _reduce(op: Op, a: Any, axis: Any, keepdims: bool, name: str,
            allow_empty: bool = False) -> Tracer:
    t = _tracer(a)
    axes = _norm_axes(axis, t.ndim)
    if op in (Op.SUM, Op.PROD) and t.var.dtype == "bool":
        t = astype(t, "int32")  # numpy counts (and multiplies) bools as integers
    if not axes:
        return t
    empty = [k for k in axes if t.shape[k] == 0]
    if empty and op in (Op.RMAX, Op.RMIN) and not allow_empty:
        raise ShapeError(f"{name}: zero-size array to reduction operation {name}, which has no "
                         f"identity: axis {empty[0]} of shape {t.shape} has length 0")
    if op in (Op.RMAX, Op.RMIN) and t.var.dtype == "bool":
        # WGSL has no max/min of bool: reduce the 0/1 words, then compare back
        out = astype(t.builder.bind(op, [astype(t, "uint32")], {"axes": axes}), "bool")
    else:
        out = t.builder.bind(op, [t], {"axes": axes})
    if keepdims:
        out = reshape(out, _kept_shape(t.shape, axes))
    return out


def _isnan(t: Tracer) -> Tracer:
    """Elementwise isnan as a bit test (ops table), False for integers and bools."""
    return t.builder.bind(Op.ISNAN, [t])


def _truth(a: Any) -> Tracer:
    """``a != 0`` as bool; NaN counts as true, as in numpy (tested on the bits, not by the
    comparison, which a GPU compiler may fold assuming there is no NaN)."""
    t = _tracer(a)
    if t.var.dtype == "bool":
        return t
    nz = not_equal(t, 0)
    if dtypes.is_float(t.var.dtype):
        nz = where(_isnan(t), True, nz)
    return nz


def _float(a: Any) -> Tracer:
    """``a`` as float32 (integers, bools and float16: statistics compute in float32)."""
    t = _tracer(a)
    return t if t.var.dtype == "float32" else astype(t, "float32")


def _result_of(a: Any) -> str:
    """The dtype of a statistic (mean, var, ...) of ``a``: float16 stays float16 (computed in
    float32 and rounded once, as JAX does), everything else gives float32."""
    return "float16" if isinstance(a, Tracer) and a.var.dtype == "float16" else "float32"


def _as_result(t: Tracer, dt: str) -> Tracer:
    return t if t.var.dtype == dt else astype(t, dt)


def _count(shape: tuple[int, ...], axes: tuple[int, ...]) -> int:
    return math.prod(shape[k] for k in axes)


# --- reductions -----------------------------------------------------------------------------------


@_traceable
def sum(a: Any, axis: Any = None, keepdims: bool = False) -> Tracer:  # noqa: A001
    """Sum over ``axis`` (all axes when None). bool sums count as int32; integer sums wrap
    around modulo 2^32 as int32/uint32."""
    return _reduce(Op.SUM, a, axis, keepdims, "sum")


@_traceable
def prod(a: Any, axis: Any = None, keepdims: bool = False) -> Tracer:
    """Product over ``axis`` (all axes when None); 1 over an empty axis. bool products are int32
    (as numpy gives an integer); integer products wrap around modulo 2^32."""
    return _reduce(Op.PROD, a, axis, keepdims, "prod")


@_traceable
def max(a: Any, axis: Any = None, keepdims: bool = False) -> Tracer:  # noqa: A001
    """Maximum over ``axis``; NaN if the values reduced hold a NaN (as numpy)."""
    return _reduce(Op.RMAX, a, axis, keepdims, "max")


@_traceable
def min(a: Any, axis: Any = None, keepdims: bool = False) -> Tracer:  # noqa: A001
    """Minimum over ``axis``; NaN if the values reduced hold a NaN (as numpy)."""
    return _reduce(Op.RMIN, a, axis, keepdims, "min")


@_traceable
def mean(a: Any, axis: Any = None, keepdims: bool = False) -> Tracer:
    """Arithmetic mean over ``axis``; integers average as float32, float16 as float16 (summed in
    float32)."""
    t = _tracer(a)
    axes = _norm_axes(axis, t.ndim)
    n = _count(t.shape, axes)
    s = sum(astype(t, "float32"), axis=axes, keepdims=keepdims)
    if n == 0:  # numpy: NaN (a division by a literal 0.0 is not reliable in WGSL: lavapipe gave 0)
        return _as_result(where(True, math.nan, s), _result_of(t))
    return _as_result(divide(s, float(n)), _result_of(t))


def _ddof(ddof: Any, correction: Any, name: str) -> float:
    if correction is not None:
        if ddof != 0:
            raise TraceError(f"{name}: give ddof or correction (its Array API name), not both")
        ddof = correction
    if isinstance(ddof, bool) or not isinstance(ddof, (int, float, np.integer, np.floating)):
        raise TraceError(f"{name}: ddof must be a number known at trace time; got {ddof!r}")
    return float(ddof)


@_traceable
def var(a: Any, axis: Any = None, ddof: Any = 0, keepdims: bool = False, *,
        correction: Any = None) -> Tracer:
    """Variance over ``axis``: the mean of squared deviations from the mean, divided by
    ``n - ddof`` in place of ``n`` (``correction`` is the Array API's name for ``ddof``).
    Computed in two passes (the mean, then the squared deviations) for accuracy; both fuse
    into one kernel. Integers give float32; ``n - ddof <= 0`` gives inf or NaN, as numpy."""
    d_of = _ddof(ddof, correction, "var")
    dt = _result_of(_tracer(a))
    t = _float(a)
    axes = _norm_axes(axis, t.ndim)
    n = _count(t.shape, axes)
    mu = mean(t, axis=axes, keepdims=True)
    d = subtract(t, mu)
    ss = sum(multiply(d, d), axis=axes, keepdims=keepdims)
    if n - d_of <= 0:
        # numpy divides by zero here: inf, or NaN where the sum is 0 (or NaN). Selected, not
        # divided: WGSL leaves a division by zero indeterminate (lavapipe gave 0)
        return _as_result(where(greater(ss, 0.0), math.inf, math.nan), dt)
    return _as_result(divide(ss, n - d_of), dt)


@_traceable
def std(a: Any, axis: Any = None, ddof: Any = 0, keepdims: bool = False, *,
        correction: Any = None) -> Tracer:
    """Standard deviation over ``axis``: the square root of :func:`var` (same arguments)."""
    dt = _result_of(_tracer(a))
    v = var(_float(a), axis=axis, ddof=ddof, keepdims=keepdims, correction=correction)
    return _as_result(sqrt(v), dt)


@_traceable
def all(a: Any, axis: Any = None, keepdims: bool = False) -> Tracer:  # noqa: A001
    """Are all elements over ``axis`` non-zero? (bool; NaN counts as true; True over an empty
    axis.)"""
    return _reduce(Op.RMIN, _truth(a), axis, keepdims, "all", allow_empty=True)


@_traceable
def any(a: Any, axis: Any = None, keepdims: bool = False) -> Tracer:  # noqa: A001
    """Is any element over ``axis`` non-zero? (bool; NaN counts as true; False over an empty
    axis.)"""
    return _reduce(Op.RMAX, _truth(a), axis, keepdims, "any", allow_empty=True)


@_traceable
def count_nonzero(a: Any, axis: Any = None, keepdims: bool = False) -> Tracer:
    """How many elements over ``axis`` are non-zero (int32; NaN counts)."""
    return sum(astype(_truth(a), "int32"), axis=axis, keepdims=keepdims)


@_traceable
def logsumexp(a: Any, axis: Any = None, keepdims: bool = False) -> Tracer:
    """``log(sum(exp(a)))`` over ``axis``, computed stably: shifted by the maximum, so large
    values do not overflow. A row of -inf gives -inf, a +inf gives +inf, NaN propagates; -inf
    over an empty axis. Integers give float32; float16 gives float16 (computed in float32)."""
    dt = _result_of(_tracer(a))
    t = _float(a)
    axes = _norm_axes(axis, t.ndim)
    if not axes:
        return _as_result(t, dt)
    if _count(t.shape, axes) == 0:
        out_shape = _kept_shape(t.shape, axes) if keepdims else tuple(
            d for k, d in enumerate(t.shape) if k not in axes)
        ninf = _scalar_lit(-math.inf, dt)
        return t.builder.bind(Op.BROADCAST, [ninf], {"shape": out_shape})
    m = max(t, axis=axes, keepdims=True)
    # the shift clamped to finite values: a row of -inf (or one holding +inf) shifted by its own
    # maximum would compute inf - inf = NaN; shifted by -FLT_MAX (+FLT_MAX) it sums exp(-inf) = 0
    # (exp(+inf) = inf) and gives -inf (+inf). A NaN maximum comes from a NaN in the row, which
    # makes the sum NaN whatever the shift.
    shift = minimum(maximum(m, -_F32_MAX), _F32_MAX)
    # any shift gives the same value: its derivative is zero, so autodiff need not go through
    # the maximum (as JAX does)
    shift = _stop_gradient(shift)
    s = sum(exp(subtract(t, shift)), axis=axes, keepdims=True)
    out = add(log(s), shift)
    if not keepdims:
        out = reshape(out, tuple(d for k, d in enumerate(t.shape) if k not in axes))
    return _as_result(out, dt)


def _arg(a: Any, axis: Any, keepdims: bool, largest: bool) -> Tracer:
    """argmax (``largest``) or argmin: the first index along ``axis`` holding the maximum (the
    minimum), or the first NaN. Two reductions over the same rows, which fuse into one kernel:
    the NaN-propagating maximum m, then the least index i with x[i] == m or isnan(x[i]) (only
    when m is NaN can x[i] be NaN, and then x[i] == m holds nowhere)."""
    name = "argmax" if largest else "argmin"
    t = _tracer(a)
    ndim = t.ndim
    if axis is None:
        if t.size == 0:
            raise ShapeError(f"{name} of an empty array (shape {t.shape}): there is no index to "
                             "return")
        src = reshape(t, (t.size,))
        ax = 0
    else:
        if isinstance(axis, (tuple, list)):
            raise TraceError(f"{name}: axis must be an int or None; got {axis!r}")
        ax = _norm_axis(axis, ndim)
        src = t
        if t.shape[ax] == 0:
            raise ShapeError(f"{name}: axis {ax} of the array of shape {t.shape} has length 0; "
                             "there is no index to return")
    if src.var.dtype == "bool":
        src = astype(src, "uint32")
    n = src.shape[ax]
    m = _reduce(Op.RMAX if largest else Op.RMIN, src, ax, True, name)
    hit = equal(src, m)
    if dtypes.is_float(src.var.dtype):
        hit = where(_isnan(src), True, hit)
    iota = src.builder.bind(Op.IOTA, [], {"shape": src.shape, "axis": ax, "dtype": "int32"})
    out = _reduce(Op.RMIN, where(hit, iota, n), ax, False, name)
    if keepdims:
        out = reshape(out, (1,) * ndim if axis is None else _kept_shape(t.shape, (ax,)))
    return out


@_traceable
def argmax(a: Any, axis: Any = None, keepdims: bool = False) -> Tracer:
    """Index (int32) of the maximum along ``axis`` (of the flattened array when None): the first
    one where it repeats, the first NaN if there is one (as numpy)."""
    return _arg(a, axis, keepdims, largest=True)


@_traceable
def argmin(a: Any, axis: Any = None, keepdims: bool = False) -> Tracer:
    """Index (int32) of the minimum along ``axis`` (of the flattened array when None): the first
    one where it repeats, the first NaN if there is one (as numpy)."""
    return _arg(a, axis, keepdims, largest=False)


def _nan_extreme(a: Any, axis: Any, keepdims: bool, largest: bool) -> Tracer:
    name = "nanmax" if largest else "nanmin"
    t = _tracer(a)
    op = Op.RMAX if largest else Op.RMIN
    if not dtypes.is_float(t.var.dtype):
        return _reduce(op, t, axis, keepdims, name)
    isnan = _isnan(t)
    skip = -math.inf if largest else math.inf  # NaN replaced by the reduction's identity
    r = _reduce(op, where(isnan, skip, t), axis, keepdims, name)
    # a row of NaN only gives NaN (numpy warns and gives NaN)
    return where(all(isnan, axis=axis, keepdims=keepdims), math.nan, r)


@_traceable
def nanmax(a: Any, axis: Any = None, keepdims: bool = False) -> Tracer:
    """Maximum over ``axis`` ignoring NaN; NaN where every value is NaN."""
    return _nan_extreme(a, axis, keepdims, largest=True)


@_traceable
def nanmin(a: Any, axis: Any = None, keepdims: bool = False) -> Tracer:
    """Minimum over ``axis`` ignoring NaN; NaN where every value is NaN."""
    return _nan_extreme(a, axis, keepdims, largest=False)


@_traceable
def nansum(a: Any, axis: Any = None, keepdims: bool = False) -> Tracer:
    """Sum over ``axis`` counting NaN as zero."""
    t = _tracer(a)
    if dtypes.is_float(t.var.dtype):
        t = where(_isnan(t), 0.0, t)
    return sum(t, axis=axis, keepdims=keepdims)


@_traceable
def nanmean(a: Any, axis: Any = None, keepdims: bool = False) -> Tracer:
    """Mean over ``axis`` of the values that are not NaN; NaN where every value is NaN."""
    t = _tracer(a)
    if not dtypes.is_float(t.var.dtype):
        return mean(t, axis=axis, keepdims=keepdims)
    dt = t.var.dtype
    t = _float(t)
    nans = sum(astype(_isnan(t), "int32"), axis=axis, keepdims=keepdims)
    n = subtract(_count(t.shape, _norm_axes(axis, t.ndim)), nans)
    mean_ = divide(nansum(t, axis=axis, keepdims=keepdims), astype(n, "float32"))
    # no value left: NaN as numpy, selected (WGSL leaves 0 / 0 indeterminate)
    return _as_result(where(equal(n, 0), math.nan, mean_), dt)

