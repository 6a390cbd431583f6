"""Creating arrays: full, zeros, ones, ranges, identity matrices and their ``_like`` forms."""

from __future__ import annotations

from typing import Any

from .. import dtypes
from ..ir import Op
from ..trace import Tracer
from ._base import (
    _builder_of,
    _scalar_lit,
    _shape_arg,
    _traceable,
    _tracer,
)
from .elementwise import astype
from .shapes import broadcast_to

__all__ = [
    "full",
    "zeros_like",
    "ones_like",
]



@_traceable
def full(shape: Any, fill_value: Any, dtype: Any = None) -> Tracer:
    """An array of ``shape`` filled with ``fill_value``."""
    shp = _shape_arg(shape, "full's shape")
    b = _builder_of()
    dt = dtypes.canonicalize(dtype, "full") if dtype is not None else dtypes.weak_dtype(fill_value)
    if isinstance(fill_value, Tracer):
        return broadcast_to(astype(fill_value, dt), shp)
    return b.bind(Op.BROADCAST, [_scalar_lit(fill_value, dt)], {"shape": shp})  # type: ignore


@_traceable
def zeros_like(a: Any, dtype: Any = None) -> Tracer:
    """Zeros with the shape (and dtype, unless given) of ``a``."""
    t = _tracer(a)
    return full(t.shape, 0, dtype if dtype is not None else t.var.dtype)


@_traceable
def ones_like(a: Any, dtype: Any = None) -> Tracer:
    """Ones with the shape (and dtype, unless given) of ``a``."""
    t = _tracer(a)
    return full(t.shape, 1, dtype if dtype is not None else t.var.dtype)
