"""Products: matmul, dot."""

from __future__ import annotations

from typing import Any

from ..errors import DTypeError, ShapeError
from ..ir import Op
from ..ops import broadcast_shapes
from ..trace import Tracer
from ._base import (
    _as,
    _describe,
    _lift,
    _result_dtype,
    _traceable,
)
from .elementwise import multiply
from .shapes import broadcast_to, reshape, transpose

__all__ = [
    "matmul",
    "dot",
]



# --- matmul ---------------------------------------------------------------------------------------


@_traceable
def matmul(x1: Any, x2: Any) -> Tracer:
    """Matrix product with numpy's rules: 1-D operands and broadcast batch dimensions."""
    a, b = _lift(x1), _lift(x2)
    if not isinstance(a, Tracer) or not isinstance(b, Tracer) or a.ndim == 0 or b.ndim == 0:
        raise ShapeError("matmul: operands must be arrays of at least 1 dimension (numpy refuses "
                         "scalars too); use multiply for scaling")
    dt = _result_dtype([a, b])
    if dt == "bool":
        raise DTypeError("matmul of bool arrays is not supported; cast to int32 or float32")
    a, b = _as(a, dt), _as(b, dt)  # type: ignore[assignment]
    assert isinstance(a, Tracer) and isinstance(b, Tracer)
    k1 = a.shape[-1]
    k2 = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    if k1 != k2:
        raise ShapeError(
            f"matmul: {_describe(a)} has shape {a.shape} and {_describe(b)} has shape {b.shape}; "
            f"the first's last dimension ({k1}) must equal the second's "
            f"{'second-to-last' if b.ndim >= 2 else 'only'} dimension ({k2})")
    aa = reshape(a, (1, k1)) if a.ndim == 1 else a
    bb = reshape(b, (k2, 1)) if b.ndim == 1 else b
    try:
        batch = broadcast_shapes(aa.shape[:-2], bb.shape[:-2])
    except ShapeError as exc:
        raise ShapeError(f"matmul: batch dimensions of {a.shape} and {b.shape} do not broadcast"
                         ) from exc
    aa = broadcast_to(aa, batch + aa.shape[-2:])
    bb = broadcast_to(bb, batch + bb.shape[-2:])
    out = aa.builder.bind(Op.MATMUL, [aa, bb])
    shape = (batch + ((a.shape[-2],) if a.ndim >= 2 else ())
             + ((b.shape[-1],) if b.ndim >= 2 else ()))
    return reshape(out, shape)


@_traceable
def dot(a: Any, b: Any) -> Tracer:
    """numpy's dot: matmul for 1-D and 2-D, a sum over the last axis of ``a`` and the second-to-last
    of ``b`` for N-D."""
    x, y = _lift(a), _lift(b)
    if not isinstance(x, Tracer) or not isinstance(y, Tracer) or x.ndim == 0 or y.ndim == 0:
        return multiply(x, y)
    if x.ndim <= 2 and y.ndim <= 2 or y.ndim == 1:
        return matmul(x, y)
    k = x.shape[-1]
    if y.shape[-2] != k:
        raise ShapeError(f"dot: shapes {x.shape} and {y.shape} not aligned: {k} (dim "
                         f"{x.ndim - 1}) != {y.shape[-2]} (dim {y.ndim - 2})")
    lhs = reshape(x, (-1, k))
    perm = (y.ndim - 2,) + tuple(i for i in range(y.ndim) if i != y.ndim - 2)
    rhs = reshape(transpose(y, perm), (k, -1))
    return reshape(matmul(lhs, rhs), x.shape[:-1] + y.shape[:-2] + y.shape[-1:])
