"""Reductions over axes: sum, max, min, mean and the rest."""

from __future__ import annotations

import math
from typing import Any

from ..errors import ShapeError
from ..ir import Op
from ..trace import Tracer
from ._base import (
    _norm_axes,
    _traceable,
    _tracer,
)
from .elementwise import astype, divide
from .shapes import reshape

__all__ = [
    "sum",
    "max",
    "min",
    "mean",
]



# --- reductions -----------------------------------------------------------------------------------


def _reduce(op: Op, a: Any, axis: Any, keepdims: bool, name: str) -> Tracer:
    t = _tracer(a)
    axes = _norm_axes(axis, t.ndim)
    if not axes:
        return t
    if any(t.shape[k] == 0 for k in axes) and op is not Op.SUM:
        raise ShapeError(f"{name}: zero-size array to reduction operation {name}, which has no "
                         "identity")
    if op is Op.SUM and t.var.dtype == "bool":
        t = astype(t, "int32")
    if op is not Op.SUM and t.var.dtype == "bool":
        # WGSL has no max/min of bool: reduce the 0/1 words, then compare back
        out = astype(t.builder.bind(op, [astype(t, "uint32")], {"axes": axes}), "bool")
    else:
        out = t.builder.bind(op, [t], {"axes": axes})
    if keepdims:
        out = reshape(out, tuple(1 if k in axes else d for k, d in enumerate(t.shape)))
    return out


@_traceable
def sum(a: Any, axis: Any = None, keepdims: bool = False) -> Tracer:  # noqa: A001
    """Sum over ``axis`` (all axes when None). bool sums count as int32."""
    return _reduce(Op.SUM, a, axis, keepdims, "sum")


@_traceable
def max(a: Any, axis: Any = None, keepdims: bool = False) -> Tracer:  # noqa: A001
    """Maximum over ``axis``."""
    return _reduce(Op.RMAX, a, axis, keepdims, "max")


@_traceable
def min(a: Any, axis: Any = None, keepdims: bool = False) -> Tracer:  # noqa: A001
    """Minimum over ``axis``."""
    return _reduce(Op.RMIN, a, axis, keepdims, "min")


@_traceable
def mean(a: Any, axis: Any = None, keepdims: bool = False) -> Tracer:
    """Arithmetic mean over ``axis``; integers average as float32."""
    t = _tracer(a)
    axes = _norm_axes(axis, t.ndim)
    n = math.prod(t.shape[k] for k in axes)
    s = sum(astype(t, "float32"), axis=axes, keepdims=keepdims)
    return divide(s, float(n)) if n else divide(s, 0.0)
