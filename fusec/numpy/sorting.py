"""Sorting and searching: sort, argsort, searchsorted, and ``top_k`` (for ``fusec.lax``).

Order: numpy's, as JAX sorts. Sorts are stable (ties keep their input order); NaN sorts after
every other value (+inf included), and -0.0 equals 0.0. ``descending=True`` follows JAX: ``sort``
gives the ascending sort reversed (NaN first; equal values, such as -0.0 and 0.0, in reverse
input order), ``argsort`` the indices of a stable descending sort (NaN first, ties in input
order). Two primitives sort along the last axis (see :mod:`fusec.passes.sort`): ``argsort``
gives the indices, ``sort`` the values, each of which keeps its bits.
"""

from __future__ import annotations

import operator
from typing import Any

from ..errors import DTypeError, ShapeError, StaticArgumentError, TraceError
from ..ir import Op
from ..trace import Tracer
from ._base import _as, _lift, _result_dtype, _traceable, _tracer

__all__ = ["sort", "argsort", "searchsorted"]


def _check_int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise TraceError(f"{what} must be an int; got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TraceError(f"{what} must be an int known at trace time; got {value!r} (pass it "
                         "as a static argument)") from None


def _sort_axis(t: Tracer, axis: Any, name: str) -> tuple[Tracer, int]:
    """The array to sort (flattened when ``axis`` is None) and the axis, checked."""
    if axis is None:
        if t.ndim != 1:
            t = t.builder.bind(Op.RESHAPE, [t], {"shape": (t.size,)}, weak=t.weak)
        return t, 0
    ax = _check_int(axis, f"{name}: axis")
    if not -t.ndim <= ax < t.ndim:
        raise ShapeError(f"{name}: axis {ax} is out of bounds for an array of {t.ndim} "
                         f"dimension{'s' if t.ndim != 1 else ''} (shape {t.shape}); "
                         "use axis=None to sort the flattened array")
    return t, ax % t.ndim


def _check_kind(name: str, order: Any) -> None:
    if order is not None:
        raise TraceError(f"{name}: order= sorts structured arrays, which fusec does not have")


def _move_last(t: Tracer, ax: int) -> Tracer:
    if ax == t.ndim - 1:
        return t
    perm = tuple(k for k in range(t.ndim) if k != ax) + (ax,)
    return t.builder.bind(Op.TRANSPOSE, [t], {"perm": perm}, weak=t.weak)


def _move_back(t: Tracer, ax: int) -> Tracer:
    if ax == t.ndim - 1:
        return t
    perm = list(range(t.ndim - 1))
    perm.insert(ax, t.ndim - 1)
    return t.builder.bind(Op.TRANSPOSE, [t], {"perm": tuple(perm)}, weak=t.weak)


def _argsort_last(t: Tracer, descending: bool) -> Tracer:
    return t.builder.bind(Op.ARGSORT, [t], {"descending": bool(descending)})


def _take_last(x: Tracer, idx: Tracer) -> Tracer:
    """x[..., idx[..., j]]: a gather along the last axis, the leading axes by coordinate."""
    b = x.builder
    if idx.size == 0:
        return b.bind(Op.BROADCAST, [_as(0, x.var.dtype)], {"shape": idx.shape}, weak=x.weak)
    inds = []
    for k in range(x.ndim - 1):
        shape = tuple(d if j == k else 1 for j, d in enumerate(idx.shape))
        inds.append(b.bind(Op.IOTA, [], {"shape": shape, "axis": k, "dtype": "int32"}))
    return b.bind(Op.GATHER, [x, *inds, idx], weak=x.weak)


def _reverse_last(t: Tracer) -> Tracer:
    n = t.shape[-1]
    if n <= 1:
        return t
    starts = (0,) * (t.ndim - 1) + (n - 1,)
    steps = (1,) * (t.ndim - 1) + (-1,)
    return t.builder.bind(Op.SLICE, [t], {"starts": starts, "steps": steps, "shape": t.shape},
                          weak=t.weak)


@_traceable
def argsort(a: Any, axis: Any = -1, kind: Any = None, order: Any = None, *, stable: bool = True,
            descending: bool = False) -> Tracer:
    """Indices that sort ``a`` along ``axis`` (the flattened array when None), as int32.

    Always stable (``stable`` and numpy's ``kind`` are accepted and ignored): equal values keep
    their input order. NaN sorts last, -0.0 equals 0.0. ``descending=True``: the indices of the
    stable descending sort, as JAX gives (NaN first, ties still in input order)."""
    _check_kind("argsort", order)
    t, ax = _sort_axis(_tracer(a), axis, "argsort")
    return _move_back(_argsort_last(_move_last(t, ax), descending), ax)


@_traceable
def sort(a: Any, axis: Any = -1, kind: Any = None, order: Any = None, *, stable: bool = True,
         descending: bool = False) -> Tracer:
    """A sorted copy of ``a`` along ``axis`` (the flattened array when None).

    Always stable (``stable`` and numpy's ``kind`` are accepted and ignored). NaN sorts last, and
    -0.0 equals 0.0 (each keeps its sign, in input order). ``descending=True`` reverses the
    ascending sort, as JAX does (NaN first)."""
    _check_kind("sort", order)
    t, ax = _sort_axis(_tracer(a), axis, "sort")
    values = t.builder.bind(Op.SORT, [_move_last(t, ax)], {"descending": False}, weak=t.weak)
    if descending:
        values = _reverse_last(values)
    return _move_back(values, ax)


@_traceable
def searchsorted(a: Any, v: Any, side: str = "left", sorter: Any = None) -> Tracer:
    """Where ``v``'s values would go in the sorted 1-D ``a`` to keep it sorted, as int32.

    ``side="left"``: the first such place (before equal values), ``"right"``: the last. Values
    compare as numpy sorts them (NaN after everything, -0.0 equal to 0.0); ``a`` and ``v`` are
    promoted to a common dtype first. ``sorter``: int indices that sort ``a`` (as from argsort)."""
    if side not in ("left", "right"):
        raise StaticArgumentError(f"searchsorted: side must be 'left' or 'right'; got {side!r}")
    ta = _tracer(a)
    if ta.ndim != 1:
        raise ShapeError(f"searchsorted: a must be 1-D; got an array of shape {ta.shape}")
    if sorter is not None:
        ts = _tracer(sorter)
        if ts.shape != ta.shape:
            raise ShapeError(f"searchsorted: sorter must have a's shape {ta.shape}; got "
                             f"{ts.shape}")
        if ts.var.dtype not in ("int32", "uint32"):
            raise DTypeError(f"searchsorted: sorter must hold integer indices; got "
                             f"{ts.var.dtype}")
        ta = ta.builder.bind(Op.GATHER, [ta, ts], weak=ta.weak)
    tv = _lift(v)
    dt = _result_dtype([ta, tv])
    qa = _as(ta, dt)
    qv = _as(_tracer(tv) if not isinstance(tv, Tracer) else tv, dt)
    assert isinstance(qa, Tracer) and isinstance(qv, Tracer)
    return qa.builder.bind(Op.SEARCHSORTED, [qa, qv], {"side": side})


@_traceable
def top_k(operand: Any, k: int) -> tuple[Tracer, Tracer]:
    """The ``k`` largest entries along the last axis and their int32 indices, largest first, as
    ``jax.lax.top_k``: equal values in index order; NaN counts as larger than every number."""
    t = _tracer(operand)
    if t.ndim < 1:
        raise ShapeError("top_k: operand must have at least one axis; got a 0-d array")
    kk = _check_int(k, "top_k: k")
    n = t.shape[-1]
    if not 0 <= kk <= n:
        raise ShapeError(f"top_k: k={kk} must be between 0 and the last axis' length {n} "
                         f"(operand shape {t.shape})")
    idx = _argsort_last(t, True)
    if kk < n:
        idx = t.builder.bind(Op.SLICE, [idx], {"starts": (0,) * t.ndim,
                                               "steps": (1,) * t.ndim,
                                               "shape": t.shape[:-1] + (kk,)})
    return _take_last(t, idx), idx
