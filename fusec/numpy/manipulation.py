"""Rearranging arrays: concatenate, stack, split, flip, roll, tile, repeat, pad.

None of these copies data into a buffer of its own. Each is index arithmetic on its operands —
slices, pads, gathers, broadcasts and selects on an ``iota`` — computed inside whatever kernel
reads the result, so ``relu(concatenate([a, b]))`` or ``pad(x, 1, mode="reflect") + 1`` is one
kernel that reads ``a`` and ``b`` (or ``x``) once per output element.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import dtypes
from ..errors import ShapeError, TraceError
from ..ir import Op
from ..trace import Tracer, is_device_array
from ._base import (
    _describe,
    _norm_axes,
    _norm_axis,
    _result_dtype,
    _traceable,
    _tracer,
)
from .elementwise import abs as _abs
from .elementwise import add, astype, greater, less, maximum, minimum, subtract, where
from .shapes import (
    _axis_iota,
    _iota,
    _pad,
    _slice,
    _slice_axis,
    _static_count,
    _static_int,
    _take_axes,
    atleast_1d,
    atleast_2d,
    atleast_3d,
    broadcast_to,
    expand_dims,
    ravel,
    reshape,
    squeeze,
)

__all__ = [
    "concatenate",
    "stack",
    "hstack",
    "vstack",
    "dstack",
    "column_stack",
    "split",
    "array_split",
    "unstack",
    "flip",
    "roll",
    "tile",
    "repeat",
    "pad",
]


def _array_list(arrays: Any, name: str) -> list[Tracer]:
    """The arrays of a sequence argument (a single array stands for the list of its rows)."""
    if isinstance(arrays, Tracer) or is_device_array(arrays) or isinstance(arrays, np.ndarray):
        t = _tracer(arrays)
        if t.ndim == 0:
            raise ShapeError(f"{name}: expected a sequence of arrays, got a 0-d array")
        return list(unstack(t, 0))
    if not isinstance(arrays, (list, tuple)):
        raise TraceError(f"{name}: expected a sequence of arrays, got {type(arrays).__name__}")
    if not arrays:
        raise ShapeError(f"{name}: need at least one array")
    return [_tracer(a) for a in arrays]


def _common_dtype(ts: Sequence[Tracer], dtype: Any, name: str) -> list[Tracer]:
    dt = dtypes.canonicalize(dtype, f"{name}'s dtype") if dtype is not None else _result_dtype(ts)
    return [astype(t, dt) for t in ts]


# --- joining --------------------------------------------------------------------------------------


def _join(ts: Sequence[Tracer], ax: int) -> Tracer:
    """Arrays of equal shapes but along ``ax``, one after another along ``ax``: each piece padded
    to the result's shape, and a chain of selects on the coordinate along ``ax`` picks the piece
    (one fused kernel, whatever the number of pieces)."""
    total = builtins.sum(t.shape[ax] for t in ts)
    shape = list(ts[0].shape)
    shape[ax] = total
    pieces: list[tuple[Tracer, int]] = []
    offset = 0
    for t in ts:
        if t.shape[ax]:
            pieces.append((t, offset))
        offset += t.shape[ax]
    if not pieces:
        return broadcast_to(ts[0], tuple(shape)) if ts[0].size else _slice(
            ts[0], [0] * len(shape), [1] * len(shape), shape)
    if len(pieces) == 1:
        return pieces[0][0]

    def placed(t: Tracer, off: int) -> Tracer:
        widths = [(0, 0)] * len(shape)
        widths[ax] = (off, total - off - t.shape[ax])
        return _pad(t, widths)

    pos = _axis_iota(len(shape), ax, total, "uint32")
    last, off = pieces[-1]
    out = placed(last, off)
    for t, off in reversed(pieces[:-1]):
        inside = less(pos, off + t.shape[ax])
        out = t.builder.bind(Op.WHERE, [inside, placed(t, off), out], weak=out.weak)
    return out


@_traceable
def concatenate(arrays: Any, axis: Any = 0, dtype: Any = None) -> Tracer:
    """Join arrays along an existing axis (``axis=None``: flatten them first). Shapes must match
    except along ``axis``; the result has the arrays' promoted dtype (or ``dtype``)."""
    ts = _array_list(arrays, "concatenate")
    if axis is None:
        ts = [ravel(t) for t in ts]
        axis = 0
    for i, t in enumerate(ts):
        if t.ndim == 0:
            raise ShapeError(f"concatenate: array {i} ({_describe(t)}) is 0-d; zero-dimensional "
                             "arrays cannot be concatenated")
    nd = ts[0].ndim
    for i, t in enumerate(ts):
        if t.ndim != nd:
            raise ShapeError(f"concatenate: all arrays must have the same number of dimensions; "
                             f"array 0 has shape {ts[0].shape} and array {i} has shape {t.shape}")
    ax = _norm_axis(axis, nd, "concatenate's axis")
    for i, t in enumerate(ts):
        for k in range(nd):
            if k != ax and t.shape[k] != ts[0].shape[k]:
                raise ShapeError(
                    f"concatenate along axis {ax}: array 0 has shape {ts[0].shape} and array {i} "
                    f"has shape {t.shape}; all dimensions but axis {ax} must match (dimension "
                    f"{k}: {ts[0].shape[k]} vs {t.shape[k]})")
    return _join(_common_dtype(ts, dtype, "concatenate"), ax)


@_traceable
def stack(arrays: Any, axis: int = 0, dtype: Any = None) -> Tracer:
    """Join arrays of one shape along a new axis ``axis``."""
    ts = _array_list(arrays, "stack")
    for i, t in enumerate(ts):
        if t.shape != ts[0].shape:
            raise ShapeError(f"stack: all arrays must have the same shape; array 0 has shape "
                             f"{ts[0].shape} and array {i} has shape {t.shape}")
    ax = _norm_axis(axis, ts[0].ndim + 1, "stack's axis")
    return _join(_common_dtype([expand_dims(t, ax) for t in ts], dtype, "stack"), ax)


def _ranked(arrays: Any, name: str, fn: Any) -> list[Tracer]:
    ts = _array_list(arrays, name)
    return [fn(t) for t in ts]


@_traceable
def hstack(tup: Any, dtype: Any = None) -> Tracer:
    """Join along the second axis (the first for 1-D arrays)."""
    ts = _ranked(tup, "hstack", atleast_1d)
    return concatenate(ts, axis=0 if ts[0].ndim == 1 else 1, dtype=dtype)


@_traceable
def vstack(tup: Any, dtype: Any = None) -> Tracer:
    """Join along the first axis, 1-D arrays as rows."""
    return concatenate(_ranked(tup, "vstack", atleast_2d), axis=0, dtype=dtype)


@_traceable
def dstack(tup: Any, dtype: Any = None) -> Tracer:
    """Join along the third axis (after :func:`atleast_3d`)."""
    return concatenate(_ranked(tup, "dstack", atleast_3d), axis=2, dtype=dtype)


@_traceable
def column_stack(tup: Any) -> Tracer:
    """Join 1-D arrays as columns (2-D arrays as they are) along the second axis."""
    ts = _ranked(tup, "column_stack", lambda t: reshape(t, (-1, 1)) if t.ndim < 2 else t)
    return concatenate(ts, axis=1)


# --- splitting ------------------------------------------------------------------------------------


def _split_at(t: Tracer, ax: int, bounds: Sequence[int]) -> list[Tracer]:
    """Pieces between consecutive bounds (Python's slice rules: out of range clips, a bound
    below the previous one gives an empty piece)."""
    d = t.shape[ax]
    edges = [0, *bounds, d]
    return [_slice_axis(t, ax, lo, hi) for lo, hi in zip(edges[:-1], edges[1:])]


def _split_args(ary: Any, indices_or_sections: Any, axis: Any, name: str
                ) -> tuple[Tracer, int, Any]:
    t = _tracer(ary)
    if t.ndim == 0:
        raise ShapeError(f"{name}: {_describe(t)} is 0-d; there is no axis to split")
    ax = _norm_axis(axis, t.ndim, f"{name}'s axis")
    if isinstance(indices_or_sections, Tracer) or is_device_array(indices_or_sections):
        raise TraceError(f"{name}: indices_or_sections must be static (an int or a sequence of "
                         "Python ints): the pieces' shapes depend on it")
    return t, ax, indices_or_sections


def _indices(value: Any, name: str) -> list[int]:
    return [_static_int(i, f"{name}'s indices") for i in np.asarray(value).reshape(-1).tolist()]


@_traceable
def split(ary: Any, indices_or_sections: Any, axis: int = 0) -> list[Tracer]:
    """Split into equal sections (an int, which must divide the axis) or at the given indices
    along ``axis``; a list of arrays."""
    t, ax, ios = _split_args(ary, indices_or_sections, axis, "split")
    if isinstance(ios, (int, np.integer)) and not isinstance(ios, bool):
        n = int(ios)
        d = t.shape[ax]
        if n <= 0:
            raise ShapeError(f"split: the number of sections must be positive; got {n}")
        if d % n:
            raise ShapeError(f"split: array split does not result in an equal division: axis "
                             f"{ax} of length {d} into {n} sections (array_split allows unequal "
                             "ones)")
        return _split_at(t, ax, [k * (d // n) for k in range(1, n)])
    return _split_at(t, ax, _indices(ios, "split"))


@_traceable
def array_split(ary: Any, indices_or_sections: Any, axis: int = 0) -> list[Tracer]:
    """Like :func:`split`, but a number of sections need not divide the axis: the first
    ``length % sections`` pieces get one element more."""
    t, ax, ios = _split_args(ary, indices_or_sections, axis, "array_split")
    if isinstance(ios, (int, np.integer)) and not isinstance(ios, bool):
        n = int(ios)
        if n <= 0:
            raise ShapeError(f"array_split: the number of sections must be positive; got {n}")
        each, extra = divmod(t.shape[ax], n)
        sizes = [each + 1] * extra + [each] * (n - extra)
        bounds = list(np.cumsum(sizes[:-1]).tolist()) if n > 1 else []
        return _split_at(t, ax, bounds)
    return _split_at(t, ax, _indices(ios, "array_split"))


@_traceable
def unstack(x: Any, axis: int = 0) -> tuple[Tracer, ...]:
    """The slices of ``x`` along ``axis``, as a tuple of arrays with that axis removed."""
    t = _tracer(x)
    if t.ndim == 0:
        raise ShapeError(f"unstack: {_describe(t)} is 0-d; there is no axis to unstack")
    ax = _norm_axis(axis, t.ndim, "unstack's axis")
    return tuple(squeeze(_slice_axis(t, ax, i, i + 1), ax) for i in range(t.shape[ax]))


# --- reordering -----------------------------------------------------------------------------------


@_traceable
def flip(m: Any, axis: Any = None) -> Tracer:
    """Reverse the order of elements along ``axis`` (all axes when None)."""
    t = _tracer(m)
    axes = _norm_axes(axis, t.ndim)
    starts = [0] * t.ndim
    steps = [1] * t.ndim
    for k in axes:
        if t.shape[k] > 1:
            starts[k], steps[k] = t.shape[k] - 1, -1
    return _slice(t, starts, steps, t.shape)


def _int_list(value: Any, what: str) -> list[int]:
    if isinstance(value, (tuple, list)):
        return [_static_int(v, what) for v in value]
    return [_static_int(value, what)]


@_traceable
def roll(a: Any, shift: Any, axis: Any = None) -> Tracer:
    """Shift elements along ``axis`` by ``shift`` places, those that fall off the end coming
    back at the start (``axis=None``: over the flattened array, then reshaped). ``shift`` and
    ``axis`` may be sequences of equal length (or one of them a scalar); shifts of one axis add
    up."""
    t = _tracer(a)
    shifts = _int_list(shift, "roll's shift")
    if axis is None:
        flat = roll(ravel(t), builtins.sum(shifts), 0)
        return reshape(flat, t.shape)
    axes = [_norm_axis(x, t.ndim, "roll's axis") for x in _int_list(axis, "roll's axis")]
    if len(shifts) == 1:
        shifts = shifts * len(axes)
    elif len(axes) == 1:
        axes = axes * len(shifts)
    if len(shifts) != len(axes):
        raise ShapeError(f"roll: shift {shift!r} and axis {axis!r} must have the same length")
    total: dict[int, int] = {}
    for s, k in zip(shifts, axes):
        total[k] = total.get(k, 0) + s
    index: dict[int, Tracer] = {}
    for k, s in sorted(total.items()):
        d = t.shape[k]
        if d == 0 or s % d == 0:
            continue
        s %= d
        i = _iota((d,), 0, "uint32")
        # out[i] = t[i - s], wrapped into the axis: one select instead of a modulo
        index[k] = where(less(i, s), add(i, d - s), subtract(i, s))
    return _take_axes(t, index) if index else t


@_traceable
def tile(A: Any, reps: Any) -> Tracer:  # noqa: N803
    """``A`` repeated ``reps[k]`` times along each axis k (``reps`` an int or a sequence; the
    shorter of ``A``'s shape and ``reps`` is padded with leading ones)."""
    t = _tracer(A)
    r = _int_list(reps, "tile's reps")
    if any(x < 0 for x in r):
        raise ShapeError(f"tile: reps {reps!r} has a negative entry; the numbers of repetitions "
                         "must be non-negative")
    nd = builtins.max(len(r), t.ndim)
    r = [1] * (nd - len(r)) + r
    shape = (1,) * (nd - t.ndim) + t.shape
    # (d0, d1) -> (1, d0, 1, d1) broadcast to (r0, d0, r1, d1), merged to (r0 * d0, r1 * d1)
    inter = tuple(x for d in shape for x in (1, d))
    wide = tuple(x for rk, d in zip(r, shape) for x in (rk, d))
    out = broadcast_to(reshape(t, inter), wide)
    return reshape(out, tuple(rk * d for rk, d in zip(r, shape)))


@_traceable
def repeat(a: Any, repeats: Any, axis: Any = None) -> Tracer:
    """Repeat each element ``repeats`` times along ``axis`` (``axis=None``: of the flattened
    array). ``repeats`` is an int, or a sequence of static ints, one per element along the axis
    (the result's length depends on it, so it cannot be a traced value)."""
    t = _tracer(a)
    if axis is None:
        t = ravel(t)
        axis = 0
    if t.ndim == 0:
        t = reshape(t, (1,))
    ax = _norm_axis(axis, t.ndim, "repeat's axis")
    if isinstance(repeats, Tracer) or is_device_array(repeats):
        raise TraceError("repeat: repeats must be static (an int or a sequence of Python ints): "
                         "the result's shape depends on it")
    counts = [_static_count(x, "repeat's repeats")
              for x in np.asarray(repeats).reshape(-1).tolist()]
    d = t.shape[ax]
    if len(counts) == 1:
        n = counts[0]
        shape = list(t.shape)
        shape[ax] = d * n
        wide = t.shape[:ax + 1] + (n,) + t.shape[ax + 1:]
        return reshape(broadcast_to(expand_dims(t, ax + 1), wide), tuple(shape))
    if len(counts) != d:
        raise ShapeError(f"repeat: repeats has {len(counts)} entries; axis {ax} of "
                         f"{_describe(t)} (shape {t.shape}) has {d} elements")
    # which source element each result element reads: a table known on the host
    table = np.repeat(np.arange(d, dtype=np.uint32), counts)
    if table.size == 0:
        return _slice_axis(t, ax, 0, 0)
    return _take_axes(t, {ax: _tracer(table)})


# --- padding --------------------------------------------------------------------------------------

PAD_MODES = ("constant", "edge", "reflect", "symmetric", "wrap")


def _pairs(value: Any, nd: int, what: str, integer: bool) -> list[tuple[Any, Any]]:
    """numpy's forms of a per-axis (before, after) argument: a scalar, (v,), (before, after), or
    one pair per axis."""
    if isinstance(value, Tracer) or is_device_array(value):
        raise TraceError(f"pad: {what} must be static (Python numbers)")
    arr = np.asarray(value)
    if integer and arr.dtype.kind not in "iu":
        raise TraceError(f"pad: {what} must be integers; got {value!r}")
    try:
        pairs = np.broadcast_to(arr, (nd, 2)) if arr.ndim <= 2 else None
    except ValueError:
        pairs = None
    if pairs is None:
        raise ShapeError(f"pad: {what} {value!r} does not fit an array of {nd} dimensions; give "
                         "one number, a (before, after) pair, or one pair per axis")
    return [(lo.item(), hi.item()) for lo, hi in pairs]


def _constant_of(value: Any, dt: str) -> Any:
    """A constant converted to ``dt`` as numpy's pad does (a cast)."""
    if dt == "bool":
        return bool(value)
    return np.asarray(value).astype(dtypes.NUMPY_STORAGE[dt]).item()


def _edge_index(j: Tracer, d: int) -> Tracer:
    return minimum(maximum(j, 0), d - 1)


def _mirror_index(j: Tracer, d: int, mode: str, lo: int, hi: int) -> Tracer:
    """Index into an axis of length ``d`` for offsets ``j`` (coordinate minus ``lo``; from -lo to
    d - 1 + hi) in mode reflect, symmetric or wrap. Within one period a couple of selects do it;
    wider pads use a table computed on the host (no integer modulo needed on the device)."""
    period = {"reflect": 2 * (d - 1), "symmetric": 2 * d, "wrap": d}[mode]
    reach = d - 1 if mode == "reflect" else d
    if lo <= reach and hi <= reach:
        if mode == "reflect":
            m = _abs(j)
            return where(greater(m, d - 1), subtract(period, m), m)
        if mode == "symmetric":
            m = where(less(j, 0), subtract(-1, j), j)
            return where(greater(m, d - 1), subtract(period - 1, m), m)
        return where(less(j, 0), add(j, d), where(greater(j, d - 1), subtract(j, d), j))
    off = np.arange(-lo, d + hi, dtype=np.int64) % period
    if mode == "reflect":
        table = np.where(off >= d, period - off, off)
    elif mode == "symmetric":
        table = np.where(off >= d, period - 1 - off, off)
    else:
        table = off
    return _tracer(table.astype(np.uint32))


@_traceable
def pad(array: Any, pad_width: Any, mode: str = "constant", constant_values: Any = 0) -> Tracer:
    """Pad with ``pad_width`` elements before and after each axis (numpy's forms: an int, a
    ``(before, after)`` pair, or one pair per axis). Modes: ``"constant"`` (``constant_values``:
    a scalar, a traced scalar, or numpy's per-axis pairs), ``"edge"`` (the edge value),
    ``"reflect"`` (mirrored, the edge not repeated), ``"symmetric"`` (mirrored, the edge
    repeated), ``"wrap"`` (the other end's values). Wider pads than the axis repeat the
    pattern, as numpy does."""
    t = _tracer(array)
    nd = t.ndim
    if not isinstance(mode, str) or mode not in PAD_MODES:
        raise ValueError(f"pad: mode {mode!r} is not supported; supported modes: "
                         f"{', '.join(PAD_MODES)}")
    widths = [(int(lo), int(hi)) for lo, hi in _pairs(pad_width, nd, "pad_width", True)]
    if any(lo < 0 or hi < 0 for lo, hi in widths):
        raise ShapeError(f"pad: pad_width {pad_width!r} has a negative entry")
    dt = t.var.dtype
    if mode == "constant":
        if isinstance(constant_values, Tracer) or is_device_array(constant_values):
            c = _tracer(constant_values)
            if c.ndim:
                raise ShapeError(f"pad: a traced constant_values must be a scalar; got shape "
                                 f"{c.shape}")
            inside = _pad(broadcast_to(_tracer(True), t.shape), widths, False)
            return t.builder.bind(Op.WHERE, [inside, _pad(t, widths), astype(c, dt)])
        values = _pairs(constant_values, nd, "constant_values", False)
        if len({v for pair in values for v in pair}) == 1:
            return _pad(t, widths, _constant_of(values[0][0], dt))
        out = t
        for k, ((lo, hi), (vlo, vhi)) in enumerate(zip(widths, values)):
            # axis by axis, as numpy: the corners take the later axes' values
            for w, v in (((lo, 0), vlo), ((0, hi), vhi)):
                ws = [(0, 0)] * nd
                ws[k] = w
                out = _pad(out, ws, _constant_of(v, dt))
        return out
    index: dict[int, Tracer] = {}
    for k, (lo, hi) in enumerate(widths):
        d = t.shape[k]
        if lo == 0 and hi == 0:
            continue
        if d == 0:
            raise ShapeError(f"pad: cannot extend the empty axis {k} of {_describe(t)} (shape "
                             f"{t.shape}) in mode {mode!r}; only 'constant' pads an empty axis")
        j = subtract(_iota((lo + d + hi,), 0), lo)
        if mode == "edge" or (d == 1 and mode == "reflect"):
            index[k] = _edge_index(j, d)
        else:
            index[k] = _mirror_index(j, d, mode, lo, hi)
    return _take_axes(t, index)
