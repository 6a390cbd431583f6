"""Shape functions: reshape, transpose, broadcasting, inserting and removing unit axes."""

from __future__ import annotations

import builtins
import math
from typing import Any

from ..errors import ShapeError
from ..ir import Op
from ..ops import broadcast_shapes
from ..trace import Tracer
from ._base import (
    _norm_axes,
    _norm_axis,
    _shape_arg,
    _traceable,
    _tracer,
)

__all__ = [
    "reshape",
    "transpose",
    "broadcast_to",
    "expand_dims",
    "squeeze",
]



# --- shapes ---------------------------------------------------------------------------------------


@_traceable
def reshape(a: Any, newshape: Any) -> Tracer:
    """numpy's reshape (C order); one dimension may be -1."""
    t = _tracer(a)
    shape = list(_shape_arg(newshape, "reshape's shape"))
    if shape.count(-1) > 1:
        raise ShapeError("reshape: only one dimension may be -1")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or t.size % known:
            raise ShapeError(f"cannot reshape array of shape {t.shape} into {tuple(newshape)}")
        shape[shape.index(-1)] = t.size // known
    if math.prod(shape) != t.size or builtins.min(shape, default=0) < 0:
        raise ShapeError(f"cannot reshape array of size {t.size} (shape {t.shape}) into shape "
                         f"{tuple(shape)}")
    if tuple(shape) == t.shape:
        return t
    return t.builder.bind(Op.RESHAPE, [t], {"shape": tuple(shape)}, weak=t.weak)


@_traceable
def transpose(a: Any, axes: Any = None) -> Tracer:
    """Permute axes; reverses them when ``axes`` is None."""
    t = _tracer(a)
    nd = t.ndim
    perm = tuple(reversed(range(nd))) if axes is None else tuple(
        _norm_axis(x, nd, "transpose axis") for x in axes)
    if sorted(perm) != list(range(nd)):
        raise ShapeError(f"transpose: axes {tuple(axes)} are not a permutation of {nd} axes")
    if perm == tuple(range(nd)):
        return t
    return t.builder.bind(Op.TRANSPOSE, [t], {"perm": perm}, weak=t.weak)


@_traceable
def broadcast_to(array: Any, shape: Any) -> Tracer:
    """Broadcast to ``shape`` with numpy's rules."""
    t = _tracer(array)
    shp = _shape_arg(shape, "broadcast_to's shape")
    if len(shp) < t.ndim or broadcast_shapes(t.shape, shp) != shp:
        raise ShapeError(f"cannot broadcast an array of shape {t.shape} to shape {shp}")
    if shp == t.shape:
        return t
    return t.builder.bind(Op.BROADCAST, [t], {"shape": shp}, weak=t.weak)


@_traceable
def expand_dims(a: Any, axis: Any) -> Tracer:
    """Insert length-1 axes at the positions in ``axis``."""
    t = _tracer(a)
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    nd = t.ndim + len(axes)
    pos = sorted(_norm_axis(x, nd) for x in axes)
    if len(set(pos)) != len(pos):
        raise ShapeError(f"expand_dims: repeated axis in {axis}")
    shape = list(t.shape)
    for p in pos:
        shape.insert(p, 1)
    return reshape(t, tuple(shape))


@_traceable
def squeeze(a: Any, axis: Any = None) -> Tracer:
    """Remove length-1 axes (all of them, or those in ``axis``)."""
    t = _tracer(a)
    if axis is None:
        axes = tuple(k for k, d in enumerate(t.shape) if d == 1)
    else:
        axes = _norm_axes(axis, t.ndim)
        for k in axes:
            if t.shape[k] != 1:
                raise ShapeError(f"squeeze: axis {k} has length {t.shape[k]}, not 1 (shape "
                                 f"{t.shape})")
    return reshape(t, tuple(d for k, d in enumerate(t.shape) if k not in axes))
