"""``fusec.lax``: lower-level array operations in the style of ``jax.lax``.

The dynamic slices: windows of a static size whose start is known only when the program runs (a
traced value) or is a Python int; and ``top_k``, ``cummax``, ``cummin`` (defined with the sorts and
scans of :mod:`fusec.numpy`). As in JAX, a start is clamped so that the window fits
inside the array (after a negative start has counted from the end, unless
``allow_negative_indices=False``); nothing is ever read or written out of bounds.

Compiled control flow (``fori_loop``, ``while_loop``, ``scan``, ``cond``, ``switch``) lives
in :mod:`fusec.control_flow` and is exported here.

Like :mod:`fusec.numpy`, these functions trace inside ``gpu_jit`` and run eagerly on the device
outside it. A dynamic slice is a gather and a dynamic update is an elementwise ``where``: both are
computed inside the kernel that reads them, fused with the work around them.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, Union

import numpy as np

from . import dtypes
from .control_flow import cond, fori_loop, scan, switch, while_loop
from .errors import DTypeError, ShapeError
from .ir import Lit, Op
from .numpy._base import _compare, _elementwise, _norm_axis, _stop_gradient, _traceable, _tracer
from .numpy.indexing import _host_indices, _iota, _reshape, _slice, _window_update
from .numpy.scans import cummax, cummin
from .numpy.sorting import top_k
from .trace import Tracer, is_device_array

__all__ = [
    "stop_gradient",
    "dynamic_slice",
    "dynamic_update_slice",
    "dynamic_slice_in_dim",
    "dynamic_update_slice_in_dim",
    "dynamic_index_in_dim",
    "top_k",
    "cummax",
    "cummin",
    "fori_loop",
    "while_loop",
    "scan",
    "cond",
    "switch",
]

_INT32_MAX = 2**31 - 1
Start = Union[int, Tracer]


def _start_list(start_indices: Any, ndim: int, what: str) -> list[Any]:
    """The start indices as one entry per axis: a sequence of scalars, or a 1-d array."""
    if isinstance(start_indices, Tracer) or is_device_array(start_indices) or isinstance(
            start_indices, np.ndarray):
        t = _tracer(start_indices)
        if t.ndim != 1:
            raise ShapeError(f"{what}: start_indices as an array must be 1-d; got shape {t.shape}")
        if t.shape[0] != ndim:
            raise ShapeError(f"{what}: {t.shape[0]} start indices for an array of {ndim} axes")
        return [_reshape(_slice(t, (k,), (1,), (1,)), ()) for k in range(ndim)]
    try:
        starts = list(start_indices)
    except TypeError:
        raise ShapeError(f"{what}: start_indices must be a sequence with one start per axis; got "
                         f"{start_indices!r}") from None
    if len(starts) != ndim:
        raise ShapeError(f"{what}: {len(starts)} start indices for an array of {ndim} axes")
    return starts


def _host_starts(start_indices: Any, what: str) -> Any:
    """Start indices given as a numpy array of any integer dtype, as int32 (an eager call would
    refuse int64); anything else unchanged."""
    if isinstance(start_indices, np.ndarray):
        return _host_indices(start_indices, f"{what}'s start_indices")
    return start_indices


def _clamped_start(s: Any, d: int, size: int, allow_negative: bool, what: str) -> Start:
    """A start index clamped into [0, d - size] (a negative one first counts from the end)."""
    if isinstance(s, (bool, np.bool_)):
        raise DTypeError(f"{what} is the bool {s!r}; expected an integer")
    if isinstance(s, (int, np.integer)):
        v = int(s)
        if allow_negative and v < 0:
            v += d
        return min(max(v, 0), d - size)
    t = _tracer(s)
    if t.ndim != 0:
        raise ShapeError(f"{what} must be a scalar; got shape {t.shape}")
    if t.var.dtype not in dtypes.INTS:
        raise DTypeError(f"{what} has dtype {t.var.dtype}; expected an integer (int32 or uint32)")
    b = t.builder
    if t.var.dtype == "uint32":  # starts past int32's range clamp to the end anyway
        t = b.bind(Op.CAST, [_elementwise(Op.MIN, t, _INT32_MAX)], {"dtype": "int32"})
    elif allow_negative:
        wrap = b.bind(Op.WHERE, [_compare(Op.LT, t, 0), Lit(d, "int32"), Lit(0, "int32")])
        t = _elementwise(Op.ADD, t, wrap)
    return _elementwise(Op.MIN, _elementwise(Op.MAX, t, 0), d - size)


def _sizes(sizes: Any, shape: tuple[int, ...], what: str) -> list[int]:
    try:
        out = [operator.index(n) for n in sizes]
    except TypeError:
        raise ShapeError(f"{what}: slice_sizes must be Python ints known at trace time; got "
                         f"{sizes!r}") from None
    if len(out) != len(shape):
        raise ShapeError(f"{what}: {len(out)} slice sizes for an array of {len(shape)} axes")
    for k, (n, d) in enumerate(zip(out, shape)):
        if not 0 <= n <= d:
            raise ShapeError(f"{what}: slice size {n} on axis {k} does not fit in its length {d} "
                             f"(shape {shape})")
    return out


def dynamic_slice(operand: Any, start_indices: Any, slice_sizes: Sequence[int], *,
                  allow_negative_indices: bool = True) -> Any:
    """``operand[s_0 : s_0 + n_0, s_1 : s_1 + n_1, ...]`` for starts ``s_k`` (Python ints or
    traced integer scalars, or one 1-d integer array) and static sizes ``n_k``. Each start is
    clamped into [0, d_k - n_k] so that the window fits; a negative start first counts from the
    end, unless ``allow_negative_indices`` is False."""
    return _dynamic_slice(operand, _host_starts(start_indices, "dynamic_slice"), slice_sizes,
                          allow_negative_indices)


@_traceable
def _dynamic_slice(operand: Any, start_indices: Any, slice_sizes: Sequence[int],
                   allow_negative_indices: bool) -> Tracer:
    t = _tracer(operand)
    sizes = _sizes(slice_sizes, t.shape, "dynamic_slice")
    raw = _start_list(start_indices, t.ndim, "dynamic_slice")
    starts = [_clamped_start(s, d, n, allow_negative_indices, f"dynamic_slice's start {k}")
              for k, (s, d, n) in enumerate(zip(raw, t.shape, sizes))]
    if all(isinstance(s, int) for s in starts):
        return _slice(t, [int(s) for s in starts], [1] * t.ndim, sizes)
    b = t.builder
    index: list[Union[Tracer, Lit]] = []
    for k, (s, n) in enumerate(zip(starts, sizes)):
        c = _iota(b, t.ndim, k, n)
        index.append(c if isinstance(s, int) and s == 0 else _elementwise(Op.ADD, c, s))
    return b.bind(Op.GATHER, [t, *index], weak=t.weak)


def dynamic_update_slice(operand: Any, update: Any, start_indices: Any, *,
                         allow_negative_indices: bool = True) -> Any:
    """``operand`` with the window ``[s_0 : s_0 + u_0, ...]`` replaced by ``update`` (of shape
    ``(u_0, u_1, ...)``, the operand's dtype and number of axes). Starts as in
    :func:`dynamic_slice`: clamped so that the whole update fits. One elementwise kernel: each
    output element reads the update inside the window and the operand outside it."""
    return _dynamic_update_slice(operand, update, _host_starts(start_indices,
                                                               "dynamic_update_slice"),
                                 allow_negative_indices)


@_traceable
def _dynamic_update_slice(operand: Any, update: Any, start_indices: Any,
                          allow_negative_indices: bool) -> Tracer:
    t = _tracer(operand)
    u = _tracer(update)
    if u.var.dtype != t.var.dtype:
        raise DTypeError(f"dynamic_update_slice: the update has dtype {u.var.dtype} but the "
                         f"operand {t.var.dtype}; they must match (astype first)")
    if u.ndim != t.ndim:
        raise ShapeError(f"dynamic_update_slice: the update (shape {u.shape}) must have as many "
                         f"axes as the operand (shape {t.shape})")
    sizes = _sizes(u.shape, t.shape, "dynamic_update_slice's update")
    raw = _start_list(start_indices, t.ndim, "dynamic_update_slice")
    starts = [_clamped_start(s, d, n, allow_negative_indices, f"dynamic_update_slice's start {k}")
              for k, (s, d, n) in enumerate(zip(raw, t.shape, sizes))]
    if 0 in sizes:
        return t
    return _window_update(t, starts, [1] * t.ndim, sizes, u, lambda old, new: new)


def _in_dim(ndim: int, axis: int, value: Any, other: Any) -> list[Any]:
    return [value if k == axis else other for k in range(ndim)]


@_traceable
def dynamic_slice_in_dim(operand: Any, start_index: Any, slice_size: int, axis: int = 0, *,
                         allow_negative_indices: bool = True) -> Tracer:
    """:func:`dynamic_slice` along one axis: ``slice_size`` elements from ``start_index``; the
    other axes are kept whole."""
    t = _tracer(operand)
    ax = _norm_axis(axis, t.ndim, "dynamic_slice_in_dim's axis")
    sizes = [operator.index(slice_size) if k == ax else d for k, d in enumerate(t.shape)]
    return dynamic_slice(t, _in_dim(t.ndim, ax, start_index, 0), sizes,
                         allow_negative_indices=allow_negative_indices)


@_traceable
def dynamic_update_slice_in_dim(operand: Any, update: Any, start_index: Any, axis: int, *,
                                allow_negative_indices: bool = True) -> Tracer:
    """:func:`dynamic_update_slice` along one axis: ``update`` goes in at ``start_index`` on
    ``axis`` and at 0 on the others."""
    t = _tracer(operand)
    ax = _norm_axis(axis, t.ndim, "dynamic_update_slice_in_dim's axis")
    return dynamic_update_slice(t, update, _in_dim(t.ndim, ax, start_index, 0),
                                allow_negative_indices=allow_negative_indices)


@_traceable
def dynamic_index_in_dim(operand: Any, index: Any, axis: int = 0, keepdims: bool = True, *,
                         allow_negative_indices: bool = True) -> Tracer:
    """The element ``index`` along ``axis`` (clamped into the axis; negative counts from the
    end); ``keepdims`` keeps that axis with length 1."""
    t = _tracer(operand)
    ax = _norm_axis(axis, t.ndim, "dynamic_index_in_dim's axis")
    out = dynamic_slice_in_dim(t, index, 1, ax, allow_negative_indices=allow_negative_indices)
    if keepdims:
        return out
    return _reshape(out, tuple(d for k, d in enumerate(out.shape) if k != ax))


def stop_gradient(x: Any) -> Any:
    """``x``, with a zero derivative: autodiff (fusec.grad, vjp, jvp) treats it as a constant.
    Works on pytrees; non-float leaves and values outside a trace come back as they are."""
    from .numpy._base import _tracer
    from .trace import current_builder
    from .tree import flatten_with_paths, unflatten

    if current_builder() is None:
        return x
    leaves, td = flatten_with_paths(x, "x")
    return unflatten(td, [_stop_gradient(_tracer(v)) for _, v in leaves])
