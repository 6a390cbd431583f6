"""Shape functions: reshape, transpose, axis moves, broadcasting, inserting and removing unit axes.

Also the thin wrappers of the index primitives (``iota``, ``slice``, ``pad``, ``gather``) that the
creation and manipulation functions are written with: none of them moves data, each is computed
inside whatever kernel reads it, so the functions built on them fuse with the ops around them."""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from typing import Any, Union

import numpy as np

from ..errors import ShapeError, TraceError
from ..ir import Op
from ..ops import broadcast_shapes
from ..trace import Tracer
from ._base import (
    _builder_of,
    _norm_axes,
    _norm_axis,
    _shape_arg,
    _traceable,
    _tracer,
)

Number = Union[bool, int, float]

__all__ = [
    "reshape",
    "transpose",
    "broadcast_to",
    "expand_dims",
    "squeeze",
    "ravel",
    "flatten",
    "moveaxis",
    "swapaxes",
    "broadcast_arrays",
    "atleast_1d",
    "atleast_2d",
    "atleast_3d",
]


# --- index primitives -----------------------------------------------------------------------------


def _iota(shape: Sequence[int], axis: int, dtype: str = "int32") -> Tracer:
    """Each element's coordinate along ``axis`` of an array of ``shape``."""
    return _builder_of().bind(Op.IOTA, [], {"shape": tuple(int(d) for d in shape),
                                             "axis": int(axis), "dtype": dtype})


def _axis_iota(ndim: int, axis: int, n: int, dtype: str = "int32") -> Tracer:
    """The coordinates 0..n-1 laid along ``axis`` of an ``ndim``-axis array with unit axes
    elsewhere: it broadcasts against any array of length ``n`` there."""
    shape = [1] * ndim
    shape[axis] = n
    return _iota(shape, axis, dtype)


def _slice(t: Tracer, starts: Sequence[int], steps: Sequence[int],
           shape: Sequence[int]) -> Tracer:
    """``out[o] = t[start + o * step]`` on every axis (steps non-zero, may be negative)."""
    if (tuple(shape) == t.shape and all(s == 0 for s in starts)
            and all(st == 1 for st in steps)):
        return t
    return t.builder.bind(Op.SLICE, [t], {"starts": tuple(int(s) for s in starts),
                                          "steps": tuple(int(s) for s in steps),
                                          "shape": tuple(int(d) for d in shape)}, weak=t.weak)


def _slice_axis(t: Tracer, axis: int, start: int, stop: int, step: int = 1) -> Tracer:
    """``t[..., start:stop:step, ...]`` along one axis (Python's slice rules for the bounds)."""
    d = t.shape[axis]
    idx = range(d)[slice(start, stop, step)]
    starts = [0] * t.ndim
    steps = [1] * t.ndim
    shape = list(t.shape)
    starts[axis] = idx.start if len(idx) else 0
    steps[axis] = step
    shape[axis] = len(idx)
    return _slice(t, starts, steps, shape)


def _pad(t: Tracer, widths: Sequence[tuple[int, int]], value: Union[bool, int, float] = 0
         ) -> Tracer:
    """``t`` with ``widths[k] = (before, after)`` elements of ``value`` around axis k."""
    w = tuple((int(lo), int(hi)) for lo, hi in widths)
    if all(lo == 0 and hi == 0 for lo, hi in w):
        return t
    params: dict[str, object] = {"widths": w}
    if value != 0 or (isinstance(value, float) and math.copysign(1.0, value) < 0):
        params["value"] = value  # (absent means 0; -0.0 is kept)
    return t.builder.bind(Op.PAD, [t], params, weak=t.weak)


def _gather(t: Tracer, indices: Sequence[Tracer]) -> Tracer:
    """``out[o] = t[indices[0][o], ..., indices[n-1][o]]`` (index arrays broadcast)."""
    return t.builder.bind(Op.GATHER, [t, *indices], weak=t.weak)


def _take_axes(t: Tracer, indices: dict[int, Tracer]) -> Tracer:
    """``t`` read along each axis k in ``indices`` at ``indices[k]`` (1-D, integer, every entry
    within the axis); the other axes read themselves. One gather: one load per element."""
    nd = t.ndim
    idx: list[Tracer] = []
    for k in range(nd):
        shape = [1] * nd
        if k in indices:
            shape[k] = indices[k].shape[0]
            idx.append(reshape(indices[k], tuple(shape)))
        else:
            idx.append(_axis_iota(nd, k, t.shape[k], "uint32"))
    return _gather(t, idx)


def _static_number(value: Any, what: str) -> Number:
    """A Python (or numpy) scalar known at trace time; a traced value is refused."""
    if isinstance(value, Tracer):
        raise TraceError(f"{what} must be a Python number known at trace time, not a traced "
                         "value; pass it as a static argument")
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    raise TraceError(f"{what} must be a Python int or float; got {type(value).__name__}")


def _static_int(value: Any, what: str) -> int:
    """A Python int known at trace time."""
    n = _static_number(value, what)
    if isinstance(n, bool) or not isinstance(n, int):
        raise TraceError(f"{what} must be an int; got {value!r}")
    return n


def _static_count(value: Any, what: str) -> int:
    """A non-negative Python int known at trace time (a length)."""
    n = _static_int(value, what)
    if n < 0:
        raise ShapeError(f"{what} must be non-negative; got {n}")
    return n


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


# --- flattening, moving axes ----------------------------------------------------------------------


@_traceable
def ravel(a: Any) -> Tracer:
    """The elements as a 1-D array, in C order (a reshape: no copy)."""
    t = _tracer(a)
    return reshape(t, (t.size,))


@_traceable
def flatten(a: Any) -> Tracer:
    """Same as :func:`ravel` (the name of ndarray's method; arrays are immutable, so the copy
    numpy's ``flatten`` promises is never needed)."""
    return ravel(a)


def _axes_arg(axes: Any) -> tuple[Any, ...]:
    return tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)


@_traceable
def moveaxis(a: Any, source: Any, destination: Any) -> Tracer:
    """Move the axes ``source`` (an int or a sequence) to the positions ``destination``; the
    other axes keep their order."""
    t = _tracer(a)
    nd = t.ndim
    src = [_norm_axis(s, nd, "moveaxis source") for s in _axes_arg(source)]
    dst = [_norm_axis(d, nd, "moveaxis destination")
           for d in _axes_arg(destination)]
    if len(src) != len(dst):
        raise ShapeError(f"moveaxis: source {source!r} and destination {destination!r} must have "
                         "the same number of elements")
    if len(set(src)) != len(src):
        raise ShapeError(f"moveaxis: repeated axis in source {source!r}")
    if len(set(dst)) != len(dst):
        raise ShapeError(f"moveaxis: repeated axis in destination {destination!r}")
    rest = iter(k for k in range(nd) if k not in src)
    placed = dict(zip(dst, src))
    perm = tuple(placed[k] if k in placed else next(rest) for k in range(nd))
    return transpose(t, perm)


@_traceable
def swapaxes(a: Any, axis1: int, axis2: int) -> Tracer:
    """Exchange two axes."""
    t = _tracer(a)
    i = _norm_axis(axis1, t.ndim, "swapaxes axis1")
    j = _norm_axis(axis2, t.ndim, "swapaxes axis2")
    perm = list(range(t.ndim))
    perm[i], perm[j] = perm[j], perm[i]
    return transpose(t, tuple(perm))


# --- broadcasting, minimum ranks ------------------------------------------------------------------


@_traceable
def broadcast_arrays(*args: Any) -> list[Tracer]:
    """The arguments broadcast against each other (numpy's rules), as a list."""
    ts = [_tracer(a) for a in args]
    shape = broadcast_shapes(*(t.shape for t in ts))
    return [broadcast_to(t, shape) for t in ts]


def _atleast(args: tuple[Any, ...], new_shape: Any) -> Any:
    outs = [reshape(t, new_shape(t.shape)) for t in map(_tracer, args)]
    return outs[0] if len(outs) == 1 else outs


@_traceable
def atleast_1d(*arys: Any) -> Any:
    """Each argument with at least one axis (a 0-d value becomes shape (1,)); one argument gives
    an array, several a list."""
    return _atleast(arys, lambda s: s if len(s) >= 1 else (1,))


@_traceable
def atleast_2d(*arys: Any) -> Any:
    """Each argument with at least two axes: shape (n,) becomes (1, n), a 0-d value (1, 1)."""
    return _atleast(arys, lambda s: s if len(s) >= 2 else (1,) * (2 - len(s)) + s)


@_traceable
def atleast_3d(*arys: Any) -> Any:
    """Each argument with at least three axes, as numpy: (n,) becomes (1, n, 1), (m, n) becomes
    (m, n, 1), a 0-d value (1, 1, 1)."""

    def shape3(s: tuple[int, ...]) -> tuple[int, ...]:
        if len(s) == 0:
            return (1, 1, 1)
        if len(s) == 1:
            return (1, s[0], 1)
        if len(s) == 2:
            return s + (1,)
        return s

    return _atleast(arys, shape3)
