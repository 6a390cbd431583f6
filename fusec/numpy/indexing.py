"""Indexing traced values and device arrays: basic and advanced indexing (gathers), ``take``,
``take_along_axis``, and the ``.at[]`` updates.

``x[idx]`` follows numpy's rules for which elements are selected and for the result's shape:
integers, slices of any step, ``...``, ``None`` (np.newaxis), integer arrays (numpy arrays,
lists, traced or device int32/uint32 arrays) and concrete boolean masks, in any mix. Two
differences, both JAX's:

* An index *array* entry outside its axis is clamped into it (after a negative entry has counted
  from the end once); numpy would raise. Static Python ints out of range still raise
  :class:`IndexingError`, as in numpy.
* A boolean mask must be concrete (a numpy array, a list, a fusec.Array, whose values are read):
  the result's shape depends on how many entries are true. A *traced* mask cannot select, but
  ``fnp.where(mask, x, other)`` and ``x.at[mask].set(v)`` work with one.

Everything becomes one ``gather`` (or a ``slice`` for basic indexing) that is computed inside the
kernel that reads it, so indexing fuses with the elementwise work around it. Outside ``gpu_jit``,
indexing a :class:`fusec.Array` runs on the device and the result stays there.

``x.at[idx]`` gives JAX's functional updates: ``.get() .set(v) .add(v) .multiply(v) .min(v)
.max(v) .divide(v) .power(v)``. An update of a basic-indexing selection of unit steps (``x.at[i]``,
``x.at[2:5, :]``) and one through a traced boolean mask are elementwise ``where``s; others go
through the scatter primitive (:mod:`fusec.numpy.scatter`), which drops out-of-range indices.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np

from .. import dtypes
from ..errors import DTypeError, IndexingError, ShapeError, TraceError
from ..ir import Lit, Op
from ..ops import broadcast_shapes
from ..trace import Builder, Tracer, current_builder, is_device_array, run_eager
from ._base import (
    _compare,
    _elementwise,
    _lift,
    _norm_axis,
    _scalar_lit,
    _traceable,
    _tracer,
)
from .scatter import scatter

__all__ = ["take", "take_along_axis", "diagonal"]


_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_UINT32_MAX = 2**32 - 1

_TRACED_MASK_ADVICE = (
    "a traced boolean mask cannot select elements inside @gpu_jit: the result's shape would depend "
    "on how many of its values are true, which is only known when the GPU runs. Keep the shape "
    "instead: fnp.where(mask, x, other) chooses elementwise, and x.at[mask].set(v) (or .add, "
    ".multiply, ...) updates where the mask is true. A mask known before the call can be passed "
    "as a numpy array (or as a static argument)."
)


# --- index expressions, step 1: classify and expand (concrete; no trace needed) ------------------


@dataclass(frozen=True)
class _Slice:
    """A slice as a hashable value (Python 3.11's slices are not hashable), so an index can be a
    static argument of the cached eager call."""

    start: Optional[int]
    stop: Optional[int]
    step: Optional[int]

    def to_slice(self) -> slice:
        return slice(self.start, self.stop, self.step)


# An entry of an expanded index: ("none",) | ("ellipsis", n_axes) | ("int", k) |
# ("slice", slice) | ("array", integer array: np.ndarray (int32/uint32), Tracer or fusec.Array)
Entry = tuple[Any, ...]


def _where(pos: int, n: int) -> str:
    return "the index" if n == 1 else f"index entry {pos}"


def _int_array(value: Any, what: str) -> np.ndarray:
    """A concrete integer index array as int32 (uint32 kept). Entries beyond int32 are clipped
    into its range, which selects the same element: indices are clamped into the axis anyway."""
    arr = np.asarray(value)
    if arr.dtype == np.uint32 or arr.dtype == np.int32:
        return arr
    if arr.dtype.kind in "iu":
        return np.clip(arr, _INT32_MIN, _INT32_MAX).astype(np.int32)
    raise DTypeError(f"{what} has dtype {arr.dtype}; an index array must have an integer or bool "
                     "dtype")


def _concrete(item: Any) -> np.ndarray:
    """A list (or other array-like) index as a numpy array; an empty list is an empty int32
    array, as numpy treats it."""
    if isinstance(item, (list, tuple)) and len(item) == 0:
        return np.zeros((0,), np.int32)
    try:
        arr = np.asarray(item)
    except ValueError as exc:  # ragged lists
        raise DTypeError(f"cannot use {item!r} as an index array: {exc}") from None
    return arr


def _check_bound(b: Any, what: str) -> Optional[int]:
    if b is None:
        return None
    if isinstance(b, Tracer) or is_device_array(b):
        raise TraceError(
            f"{what} is a traced or device value; slice bounds must be Python ints known at trace "
            "time (they fix the result's shape). For a start known only at run time use "
            "fusec.lax.dynamic_slice(x, starts, sizes), or index with an array: "
            "x[start + fnp.arange(n)].")
    try:
        return operator.index(b)
    except TypeError:
        raise DTypeError(f"{what} is {b!r} ({type(b).__name__}); slice bounds must be integers or "
                         "None") from None


def _check_slice(s: Union[slice, _Slice], where: str) -> _Slice:
    start = _check_bound(s.start, f"{where}: the slice's start")
    stop = _check_bound(s.stop, f"{where}: the slice's stop")
    step = _check_bound(s.step, f"{where}: the slice's step")
    if step == 0:
        raise ShapeError(f"{where}: slice step cannot be zero")
    return _Slice(start, stop, step)


def _classify(item: Any, pos: int, n: int) -> Entry:
    """One entry of an index tuple; masks stay whole ("mask", np bool array) for _expand."""
    where = _where(pos, n)
    if item is None:
        return ("none",)
    if item is Ellipsis:
        return ("ellipsis", 0)
    if isinstance(item, (bool, np.bool_)):
        raise DTypeError(f"{where} is the bool {item!r}; a scalar bool index is not supported (use "
                         "None, np.newaxis, to insert an axis)")
    if isinstance(item, (int, np.integer)):
        return ("int", int(item))
    if isinstance(item, (slice, _Slice)):
        return ("slice", _check_slice(item, where))
    if isinstance(item, Tracer) or is_device_array(item):
        dt = np.dtype(item.dtype).name
        if dt == "bool":
            if isinstance(item, Tracer):
                raise TraceError(f"{where}: {_TRACED_MASK_ADVICE}")
            item = np.asarray(item)  # a device mask is concrete: its values are read back
        elif dt in dtypes.INTS:
            return ("array", item)
        else:
            raise DTypeError(f"{where} is an array of dtype {dt}; an index array must have an "
                             "integer or bool dtype")
    if isinstance(item, (list, tuple, np.ndarray)) or hasattr(item, "__array__"):
        arr = _concrete(item)
        if arr.dtype == np.bool_:
            if arr.ndim == 0:
                raise DTypeError(f"{where} is a 0-d bool array; a scalar bool index is not "
                                 "supported (use None, np.newaxis, to insert an axis)")
            return ("mask", arr)
        arr = _int_array(arr, where)
        if arr.ndim == 0:
            return ("int", int(arr))
        return ("array", arr)
    raise DTypeError(
        f"{where} is {item!r} ({type(item).__name__}); valid indices are integers, slices, "
        "... (Ellipsis), None (np.newaxis), and integer or bool arrays")


def _consumes(e: Entry) -> int:
    if e[0] in ("int", "slice", "array"):
        return 1
    if e[0] == "mask":
        return int(e[1].ndim)
    return 0


def _expand(shape: tuple[int, ...], idx: Any) -> list[Entry]:
    """Check an index expression against ``shape`` and expand it: static ints are made
    non-negative, the ellipsis learns how many axes it stands for, and each boolean mask becomes
    the integer arrays of its true positions (one per axis it covers, as numpy does)."""
    items = idx if isinstance(idx, tuple) else (idx,)
    classified = [_classify(item, k, len(items)) for k, item in enumerate(items)]
    nd = len(shape)
    n_ellipsis = sum(1 for e in classified if e[0] == "ellipsis")
    if n_ellipsis > 1:
        raise IndexingError(f"an index can have only one ellipsis ('...'); got {n_ellipsis}")
    used = sum(_consumes(e) for e in classified)
    if used > nd:
        raise IndexingError(f"too many indices: the array has {nd} axes (shape {shape}) but "
                            f"{used} were indexed")
    out: list[Entry] = []
    axis = 0
    for k, e in enumerate(classified):
        kind = e[0]
        if kind == "ellipsis":
            out.append(("ellipsis", nd - used))
            axis += nd - used
        elif kind == "int":
            d = shape[axis]
            if not -d <= e[1] < d:
                raise IndexingError(f"index {e[1]} is out of bounds for axis {axis} with size {d} "
                                    f"(shape {shape})")
            out.append(("int", e[1] % d))
            axis += 1
        elif kind == "mask":
            m = e[1]
            if m.shape != shape[axis:axis + m.ndim]:
                raise IndexingError(
                    f"{_where(k, len(classified))}: the boolean mask of shape {m.shape} does not "
                    f"match the axes {axis}..{axis + m.ndim - 1} it covers (shape "
                    f"{shape[axis:axis + m.ndim]} of {shape})")
            out.extend(("array", nz.astype(np.int32)) for nz in np.nonzero(m))
            axis += m.ndim
        else:
            out.append(e)
            axis += _consumes(e)
    return out


def _eager_index(shape: tuple[int, ...], idx: Any) -> tuple[Any, ...]:
    """An index expression ready to be an argument of a cached eager call: checked and expanded
    on the host, slices made hashable, masks turned into integer arrays."""
    rebuilt: list[Any] = []
    for e in _expand(shape, idx):
        kind = e[0]
        rebuilt.append(None if kind == "none" else Ellipsis if kind == "ellipsis" else e[1])
    return tuple(rebuilt)


# --- step 2: lay the selection out (inside a trace) -----------------------------------------------


@dataclass
class _Axis:
    """How one axis of the indexed array is selected."""

    kind: str  # "slice" | "int" | "array"
    start: int = 0  # slice: out[.., o at pos, ..] reads start + o * step; int: the index
    step: int = 1
    n: int = 1
    pos: int = 0  # slice: the result axis it becomes
    index: Optional[Tracer] = None  # array: the index array, shaped to broadcast to the result


@dataclass
class _Selection:
    axes: list[_Axis]  # one per axis of the indexed array
    shape: tuple[int, ...]  # the selection's shape: numpy's result shape for x[idx]
    advanced: bool  # any index arrays (then ints count as advanced indices too, as in numpy)


def _index_tracer(value: Any, what: str) -> Tracer:
    """An integer index array inside the trace (int32 or uint32)."""
    if isinstance(value, Tracer) or is_device_array(value):
        t = _tracer(value)
        if t.var.dtype not in dtypes.INTS:
            raise DTypeError(f"{what} has dtype {t.var.dtype}; expected an integer array (int32 "
                             "or uint32)")
        return t
    if isinstance(value, (bool, np.bool_)):
        raise DTypeError(f"{what} is the bool {value!r}; expected integers")
    if isinstance(value, (int, np.integer)):
        v = min(max(int(value), _INT32_MIN), _INT32_MAX)
        b = current_builder()
        assert b is not None
        return b.bind(Op.BROADCAST, [Lit(v, "int32")], {"shape": ()})
    arr = _concrete(value)
    if arr.dtype == np.bool_:
        raise DTypeError(f"{what} is a bool array; expected integers")
    return _tracer(_int_array(arr, what))


def _iota(b: Builder, rank: int, pos: int, n: int) -> Tracer:
    """0, 1, ..., n-1 along axis ``pos`` of an array of ``rank`` axes, 1 long on the others."""
    shape = [1] * rank
    shape[pos] = n
    return b.bind(Op.IOTA, [], {"shape": tuple(shape), "axis": pos, "dtype": "int32"})


def _reshape(t: Tracer, shape: tuple[int, ...]) -> Tracer:
    if t.shape == shape:
        return t
    return t.builder.bind(Op.RESHAPE, [t], {"shape": shape}, weak=t.weak)


def _layout(t: Tracer, entries: list[Entry]) -> _Selection:
    """Where each axis of ``t`` goes in the result, with numpy's rule for the advanced indices:
    their broadcast shape takes the place of the first of them when they stand together in the
    index, and goes first in the result when a slice, None or ... separates them."""
    nd = t.ndim
    arrays = {k: _index_tracer(e[1], _where(k, len(entries)))
              for k, e in enumerate(entries) if e[0] == "array"}
    advanced = bool(arrays)
    adv_at = [k for k, e in enumerate(entries) if e[0] in ("array", "int")] if advanced else []
    together = adv_at == list(range(adv_at[0], adv_at[-1] + 1)) if adv_at else True
    try:
        bshape = broadcast_shapes(*(a.shape for a in arrays.values()))
    except ShapeError:
        raise IndexingError("the index arrays of shapes "
                            f"{', '.join(str(a.shape) for a in arrays.values())} do not broadcast "
                            "to one shape (numpy's rule for advanced indices)") from None
    # the result's axes: an int (a slice's or None's length) or "B" for the broadcast block
    dims: list[Union[int, str]] = []
    slots: list[tuple[_Axis, int]] = []  # (slice axis, its slot in dims)
    axes: list[_Axis] = []
    placed = False
    if advanced and not together:
        dims.append("B")
        placed = True

    def add_slice(s: slice, d: int) -> None:
        start, stop, step = s.indices(d)
        n = len(range(start, stop, step))
        a = _Axis("slice", start=start if n else 0, step=step, n=n)
        axes.append(a)
        slots.append((a, len(dims)))
        dims.append(n)

    for k, e in enumerate(entries):
        kind = e[0]
        if kind == "none":
            dims.append(1)
        elif kind == "ellipsis":
            for _ in range(e[1]):
                add_slice(slice(None), t.shape[len(axes)])
        elif kind == "slice":
            s = e[1].to_slice() if isinstance(e[1], _Slice) else e[1]
            add_slice(s, t.shape[len(axes)])
        else:
            if advanced and not placed:
                dims.append("B")
                placed = True
            if kind == "int":
                axes.append(_Axis("int", start=int(e[1])))
            else:
                axes.append(_Axis("array", index=arrays[k]))
    while len(axes) < nd:
        add_slice(slice(None), t.shape[len(axes)])
    # final positions: the block "B" stands for len(bshape) axes
    out_pos: list[int] = []
    p = 0
    for d in dims:
        out_pos.append(p)
        p += len(bshape) if d == "B" else 1
    shape: list[int] = []
    for d in dims:
        shape.extend(bshape if d == "B" else (int(d),))
    for a, slot in slots:
        a.pos = out_pos[slot]
    if advanced:
        bstart = out_pos[dims.index("B")]
        rank = len(shape)
        for a in axes:
            if a.kind == "array":
                assert a.index is not None
                lead = len(bshape) - a.index.ndim
                a.index = _reshape(a.index, (1,) * (bstart + lead) + a.index.shape
                                   + (1,) * (rank - bstart - len(bshape)))
    return _Selection(axes, tuple(shape), advanced)


def _slice(t: Tracer, starts: Sequence[int], steps: Sequence[int],
           shape: Sequence[int]) -> Tracer:
    if tuple(shape) == t.shape and all(s == 0 for s in starts) and all(s == 1 for s in steps):
        return t
    return t.builder.bind(Op.SLICE, [t], {"starts": tuple(starts), "steps": tuple(steps),
                                          "shape": tuple(shape)}, weak=t.weak)


def _and(a: Optional[Tracer], b: Tracer) -> Tracer:
    return b if a is None else _elementwise(Op.MUL, a, b)  # bool * bool is logical and


def _in_range(i: Tracer, d: int) -> Tracer:
    """Is the index ``i`` inside an axis of length ``d`` once a negative one counts from the
    end: -d <= i < d."""
    below = _compare(Op.LT, i, d)
    if i.var.dtype == "uint32":
        return below
    return _and(_compare(Op.GE, i, -d), below)


def _fill_lit(dt: str, fill_value: Any) -> Lit:
    """JAX's fill for out-of-range reads: NaN, the most negative int32, the largest uint32, True
    (or ``fill_value``, which must fit the dtype)."""
    if fill_value is None:
        fill_value = {"float32": float("nan"), "float16": float("nan"), "int32": _INT32_MIN,
                      "uint32": _UINT32_MAX, "bool": True}[dt]
    return _scalar_lit(fill_value, dt)


def _gather(t: Tracer, sel: _Selection, fill: bool = False, fill_value: Any = None) -> Tracer:
    """``t[selection]``: a slice (and reshape) for basic indexing, else a gather; with ``fill``,
    elements whose index array entry is out of range read the fill value instead of a clamped
    element."""
    b = t.builder
    if not sel.advanced:
        starts = [a.start for a in sel.axes]
        steps = [a.step for a in sel.axes]
        out = _slice(t, starts, steps, [a.n for a in sel.axes])
        return _reshape(out, sel.shape)
    # slice first, so that sliced axes are gathered with plain coordinates
    sliced = _slice(t, [a.start if a.kind != "array" else 0 for a in sel.axes],
                    [a.step if a.kind == "slice" else 1 for a in sel.axes],
                    [1 if a.kind == "int" else a.n if a.kind == "slice" else d
                     for a, d in zip(sel.axes, t.shape)])
    rank = len(sel.shape)
    index: list[Union[Tracer, Lit]] = []
    valid: Optional[Tracer] = None
    for a, d in zip(sel.axes, t.shape):
        if a.kind == "array":
            assert a.index is not None
            index.append(a.index)
            if fill:
                valid = _and(valid, _in_range(a.index, d))
        elif a.kind == "slice" and a.n != 1:
            index.append(_iota(b, rank, a.pos, a.n))
        else:  # an axis of length 1 after the slice: the gather reads coordinate 0
            index.append(Lit(0, "int32"))
    out = b.bind(Op.GATHER, [sliced, *index], weak=t.weak)
    if out.shape != sel.shape:
        out = b.bind(Op.BROADCAST, [out], {"shape": sel.shape}, weak=t.weak)
    if valid is not None:
        out = b.bind(Op.WHERE, [valid, out, _fill_lit(t.var.dtype, fill_value)], weak=t.weak)
    return out


# --- x[idx] ---------------------------------------------------------------------------------------


def _getitem_traced(x: Any, idx: Any) -> Tracer:
    t = _tracer(x)
    return _gather(t, _layout(t, _expand(t.shape, idx)))


def _getitem(self: Any, idx: Any) -> Any:
    """``x[idx]`` with numpy's indexing rules (see the module's docstring for JAX's two
    differences: index arrays clamp, boolean masks must be concrete)."""
    if current_builder() is None:
        return run_eager(_getitem_traced, (self, _eager_index(tuple(self.shape), idx)), {})
    return _getitem_traced(self, idx)


# --- .at[idx] -------------------------------------------------------------------------------------

_COMBINE: dict[str, Callable[[Tracer, Tracer], Tracer]] = {
    "set": lambda old, new: new,
    "add": lambda old, new: _elementwise(Op.ADD, old, new),
    "multiply": lambda old, new: _elementwise(Op.MUL, old, new),
    "min": lambda old, new: _elementwise(Op.MIN, old, new),
    "max": lambda old, new: _elementwise(Op.MAX, old, new),
    "divide": lambda old, new: _elementwise(Op.DIV, old, new),
    "power": lambda old, new: _elementwise(Op.POW, old, new),
}
_GET_MODES = (None, "clip", "promise_in_bounds", "fill", "drop")
_SET_MODES = (None, "drop", "fill", "promise_in_bounds", "clip")


def _as_dtype(value: Any, dt: str, what: str) -> Tracer:
    """``value`` as a traced value of dtype ``dt`` (JAX casts an update to the array's dtype)."""
    v = _lift(value)
    b = current_builder()
    assert b is not None
    if isinstance(v, Tracer):
        if v.var.dtype == dt:
            return v
        return b.bind(Op.CAST, [v], {"dtype": dt})
    try:
        lit = _scalar_lit(v, dt)
    except DTypeError as exc:
        raise DTypeError(f"{what}: {exc}") from None
    return b.bind(Op.BROADCAST, [lit], {"shape": ()})


def _window_update(t: Tracer, starts: Sequence[Union[int, Tracer]], steps: Sequence[int],
                   sizes: Sequence[int], v: Tracer, combine: Callable[[Tracer, Tracer], Tracer]
                   ) -> Tracer:
    """``t`` with ``combine(t, v)`` inside a window and ``t`` outside it, elementwise: axis j of
    the window covers ``starts[j] + o * steps[j]`` for o < sizes[j] (steps are 1 or -1); ``v``
    has one axis per axis of ``t``, of length sizes[j] (or 1: broadcast). Each output element
    reads ``v`` at its coordinate in the window (a gather), so the whole update is one fused
    kernel and needs no scatter."""
    b = t.builder
    nd = t.ndim
    if nd == 0:
        return combine(t, _reshape(v, ()))
    inside: Optional[Tracer] = None
    coords: list[Union[Tracer, Lit]] = []
    for j in range(nd):
        d, s0, st, n = t.shape[j], starts[j], steps[j], sizes[j]
        c = _iota(b, nd, j, d)
        if isinstance(s0, int) and s0 == 0 and st == 1 and n == d:
            coords.append(c)  # the whole axis
            continue
        w = _elementwise(Op.SUB, c, s0) if st == 1 else _elementwise(Op.SUB, s0, c)
        inside = _and(inside, _and(_compare(Op.GE, w, 0), _compare(Op.LT, w, n)))
        coords.append(w)
    if v.size == 1:
        g = _reshape(v, ())
    else:
        g = b.bind(Op.GATHER, [v, *coords])  # outside the window: clamped, then not chosen
    new = combine(t, g)
    if new.shape != t.shape:
        new = b.bind(Op.BROADCAST, [new], {"shape": t.shape})
    if inside is None:
        return new
    return b.bind(Op.WHERE, [inside, new, t])


def _scatter_indices(t: Tracer, sel: _Selection, mode: Optional[str]) -> list[Tracer]:
    """One int32 index array per axis of ``t``, each broadcasting to the selection's shape."""
    b = t.builder
    rank = len(sel.shape)
    out: list[Tracer] = []
    for a, d in zip(sel.axes, t.shape):
        if a.kind == "slice":
            i = _iota(b, rank, a.pos, a.n)
            if a.step != 1:
                i = _elementwise(Op.MUL, i, a.step)
            if a.start != 0:
                i = _elementwise(Op.ADD, i, a.start)
        elif a.kind == "int":
            i = b.bind(Op.BROADCAST, [Lit(a.start, "int32")], {"shape": (1,) * rank})
        else:
            assert a.index is not None
            i = a.index
            if i.var.dtype == "uint32":  # entries past int32's range are out of range anyway
                i = b.bind(Op.CAST, [_elementwise(Op.MIN, i, _INT32_MAX)], {"dtype": "int32"})
            if mode == "clip":  # clamp as a gather reads: negative counts from the end once
                i = _elementwise(Op.ADD, i, b.bind(
                    Op.WHERE, [_compare(Op.LT, i, 0), Lit(d, "int32"), Lit(0, "int32")]))
                i = _elementwise(Op.MIN, _elementwise(Op.MAX, i, 0), d - 1)
        out.append(i)
    return out


def _mask_update(idx: Any, values: Any) -> Any:
    """The mask of ``x.at[mask]`` when the update is an elementwise where: a traced or device bool
    mask alone in the index (the update broadcasts against the whole array), or a concrete one
    with a single update value (where numpy's rule gives the same). None otherwise."""
    items = idx if isinstance(idx, tuple) else (idx,)
    if len(items) != 1:
        return None
    m = items[0]
    if isinstance(m, Tracer) or is_device_array(m):
        return m if np.dtype(m.dtype) == np.bool_ else None
    if isinstance(m, (list, np.ndarray)):
        arr = _concrete(m)
        if arr.dtype == np.bool_ and arr.ndim > 0 and np.size(values) == 1:
            return arr
    return None


def _update_traced(x: Any, idx: Any, values: Any, how: str, mode: Optional[str],
                   fill_value: Any) -> Tracer:
    t = _tracer(x)
    b = t.builder
    dt = t.var.dtype
    if how == "get":
        if mode not in _GET_MODES:
            raise ShapeError(f".at[].get: mode must be one of {_GET_MODES}; got {mode!r}")
        return _gather(t, _layout(t, _expand(t.shape, idx)), fill=mode in ("fill", "drop"),
                       fill_value=fill_value)
    if mode not in _SET_MODES:
        raise ShapeError(f".at[].{how}: mode must be one of {_SET_MODES}; got {mode!r}")
    if how == "divide" and not dtypes.is_float(dt):
        raise DTypeError(f".at[].divide on an array of dtype {dt}: the quotient would not keep the "
                         "dtype; divide float32 or float16 arrays (astype first)")
    v = _as_dtype(values, dt, f".at[].{how}'s update")
    combine = _COMBINE[how]
    mask_value = _mask_update(idx, values)
    if mask_value is not None:
        # elementwise: out = where(mask, combine(x, v), x); the mask covers the leading axes
        mask = _tracer(mask_value)
        if mask.shape != t.shape[:mask.ndim]:
            raise IndexingError(f".at[mask]: the mask has shape {mask.shape}, which is not the "
                                f"leading axes of the array's shape {t.shape}")
        try:
            ok = broadcast_shapes(v.shape, t.shape) == t.shape
        except ShapeError:
            ok = False
        if not ok:
            raise ShapeError(f".at[mask].{how}: the update of shape {v.shape} does not broadcast "
                             f"to the array's shape {t.shape} (with a traced or device mask the "
                             "update broadcasts against the whole array)")
        m = _reshape(mask, mask.shape + (1,) * (t.ndim - mask.ndim))
        new = combine(t, v)
        if new.shape != t.shape:
            new = b.bind(Op.BROADCAST, [new], {"shape": t.shape})
        return b.bind(Op.WHERE, [m, new, t])
    sel = _layout(t, _expand(t.shape, idx))
    shape = sel.shape
    try:
        ok = broadcast_shapes(v.shape, shape) == shape
    except ShapeError:
        ok = False
    if not ok:
        raise ShapeError(f".at[].{how}: the update of shape {v.shape} does not broadcast to the "
                         f"shape {shape} of the selection x[idx]")
    if not sel.advanced and all(a.kind == "int" or abs(a.step) == 1 or a.n <= 1
                                for a in sel.axes):
        # a box of unit steps: an elementwise where, no scatter
        if any(a.n == 0 for a in sel.axes):
            return t
        vb = v if v.shape == shape else b.bind(Op.BROADCAST, [v], {"shape": shape})
        vw = _reshape(vb, tuple(a.n for a in sel.axes))
        # (an axis selecting one element is a window of step 1 whatever the slice's step)
        return _window_update(t, [a.start for a in sel.axes],
                              [a.step if a.n > 1 else 1 for a in sel.axes],
                              [a.n for a in sel.axes], vw, combine)
    index = tuple(_scatter_indices(t, sel, mode))
    vb = v if v.shape == shape else b.bind(Op.BROADCAST, [v], {"shape": shape})
    if how in ("divide", "power"):
        # JAX's composition: every selected element is combined with the product of its updates
        ones = b.bind(Op.BROADCAST, [_scalar_lit(1, dt)], {"shape": t.shape})
        factor = scatter(ones, index, vb, "multiply")
        return combine(t, factor)
    return scatter(t, index, vb, how)


def _dispatch(x: Any, idx: Any, values: Any, how: str, mode: Optional[str],
              fill_value: Any = None) -> Any:
    if current_builder() is None:
        if how == "get" or _mask_update(idx, values) is None:
            idx = _eager_index(tuple(x.shape), idx)
        return run_eager(_update_traced, (x, idx, values, how, mode, fill_value), {})
    return _update_traced(x, idx, values, how, mode, fill_value)


class _IndexUpdateRef:
    """``x.at[idx]``: functional updates of the elements ``x[idx]`` selects (JAX's names). Each
    method returns a new array; ``x`` is unchanged. The ``mode`` of the updates says what happens
    to index array entries out of range: dropped (None, "drop", "fill"), or clamped ("clip").
    ``indices_are_sorted`` and ``unique_indices`` are accepted for JAX compatibility and
    ignored."""

    __slots__ = ("_x", "_idx")

    def __init__(self, x: Any, idx: Any) -> None:
        self._x = x
        self._idx = idx

    def __repr__(self) -> str:
        return f"_IndexUpdateRef({self._x!r}, {self._idx!r})"

    def get(self, *, mode: Optional[str] = None, fill_value: Any = None,
            indices_are_sorted: bool = False, unique_indices: bool = False) -> Any:
        """``x[idx]``; with ``mode="fill"`` out-of-range index array entries read
        ``fill_value`` (default NaN / INT32_MIN / UINT32_MAX / True) instead of being clamped."""
        return _dispatch(self._x, self._idx, None, "get", mode, fill_value)

    def set(self, values: Any, *, mode: Optional[str] = None, indices_are_sorted: bool = False,
            unique_indices: bool = False) -> Any:
        """``x`` with ``x[idx] = values`` (with repeated indices, one of the updates wins)."""
        return _dispatch(self._x, self._idx, values, "set", mode)

    def add(self, values: Any, *, mode: Optional[str] = None, indices_are_sorted: bool = False,
            unique_indices: bool = False) -> Any:
        """``x`` with ``x[idx] += values``; repeated indices accumulate."""
        return _dispatch(self._x, self._idx, values, "add", mode)

    def multiply(self, values: Any, *, mode: Optional[str] = None,
                 indices_are_sorted: bool = False, unique_indices: bool = False) -> Any:
        """``x`` with ``x[idx] *= values``; repeated indices accumulate."""
        return _dispatch(self._x, self._idx, values, "multiply", mode)

    mul = multiply

    def divide(self, values: Any, *, mode: Optional[str] = None,
               indices_are_sorted: bool = False, unique_indices: bool = False) -> Any:
        """``x`` with ``x[idx] /= values`` (float32 arrays); repeated indices divide by the
        product of their updates."""
        return _dispatch(self._x, self._idx, values, "divide", mode)

    def power(self, values: Any, *, mode: Optional[str] = None,
              indices_are_sorted: bool = False, unique_indices: bool = False) -> Any:
        """``x`` with ``x[idx] **= values``; repeated indices raise to the product of their
        updates."""
        return _dispatch(self._x, self._idx, values, "power", mode)

    def min(self, values: Any, *, mode: Optional[str] = None, indices_are_sorted: bool = False,
            unique_indices: bool = False) -> Any:
        """``x`` with ``x[idx] = minimum(x[idx], values)``."""
        return _dispatch(self._x, self._idx, values, "min", mode)

    def max(self, values: Any, *, mode: Optional[str] = None, indices_are_sorted: bool = False,
            unique_indices: bool = False) -> Any:
        """``x`` with ``x[idx] = maximum(x[idx], values)``."""
        return _dispatch(self._x, self._idx, values, "max", mode)


class _IndexUpdateHelper:
    """The object ``x.at`` returns; index it: ``x.at[idx].set(v)``."""

    __slots__ = ("_x",)

    def __init__(self, x: Any) -> None:
        self._x = x

    def __getitem__(self, idx: Any) -> _IndexUpdateRef:
        return _IndexUpdateRef(self._x, idx)

    def __repr__(self) -> str:
        return f"_IndexUpdateHelper({self._x!r})"


# --- take, take_along_axis, diagonal --------------------------------------------------------------

_TAKE_MODES = (None, "fill", "clip", "wrap", "promise_in_bounds")


def _index_mode(i: Tracer, d: int, mode: Optional[str], what: str
                ) -> tuple[Tracer, Optional[Tracer]]:
    """Apply ``mode`` to an index array into an axis of length ``d``: the indices to gather with,
    and for "fill" which of them are in range."""
    if mode not in _TAKE_MODES:
        raise ShapeError(f"{what}: mode must be one of 'fill', 'clip', 'wrap', "
                         f"'promise_in_bounds' (or None, meaning 'fill'); got {mode!r}")
    if mode in (None, "fill"):
        return i, _in_range(i, d)
    if mode == "clip":  # numpy's clip: negative indices become 0, no counting from the end
        return (i if i.var.dtype == "uint32" else _elementwise(Op.MAX, i, 0)), None
    if mode == "wrap":
        return _elementwise(Op.REM, i, d), None
    return i, None


def _host_indices(value: Any, what: str) -> Any:
    """Concrete integer indices (lists, numpy arrays of any integer dtype) as int32 numpy arrays
    before an eager call sees them (it would refuse int64); other values unchanged."""
    if isinstance(value, (list, tuple, np.ndarray)):
        arr = _concrete(value)
        if arr.dtype == np.bool_:
            raise DTypeError(f"{what} is a bool array; expected integers")
        return _int_array(arr, what)
    return value


def take(a: Any, indices: Any, axis: Any = None, mode: Optional[str] = None,
         fill_value: Any = None) -> Any:
    """Elements of ``a`` at ``indices`` along ``axis`` (the flattened array when None); the
    result has shape ``a.shape[:axis] + indices.shape + a.shape[axis+1:]``.

    ``mode`` (JAX's): "fill" (the default): negative indices count from the end and indices
    outside [-n, n) give ``fill_value`` (default NaN for float32, the most negative int32, the
    largest uint32, True for bool); "clip": indices are clamped into [0, n-1] (so -1 gives
    element 0, as numpy's clip); "wrap": taken modulo n; "promise_in_bounds": as x[indices]."""
    return _take(a, _host_indices(indices, "take's indices"), axis, mode, fill_value)


@_traceable
def _take(a: Any, indices: Any, axis: Any, mode: Optional[str], fill_value: Any) -> Tracer:
    t = _tracer(a)
    if axis is None:
        t = _reshape(t, (t.size,))
        ax = 0
    else:
        ax = _norm_axis(axis, t.ndim, "take's axis")
    i = _index_tracer(indices, "take's indices")
    d = t.shape[ax]
    i, valid = _index_mode(i, d, mode, "take")
    b = t.builder
    rank = t.ndim - 1 + i.ndim
    placed = _reshape(i, (1,) * ax + i.shape + (1,) * (t.ndim - ax - 1))
    index: list[Union[Tracer, Lit]] = []
    for k, dk in enumerate(t.shape):
        if k == ax:
            index.append(placed)
        elif dk == 1:
            index.append(Lit(0, "int32"))
        else:
            index.append(_iota(b, rank, k if k < ax else k - 1 + i.ndim, dk))
    out = b.bind(Op.GATHER, [t, *index], weak=t.weak)
    shape = t.shape[:ax] + i.shape + t.shape[ax + 1:]
    if out.shape != shape:
        out = b.bind(Op.BROADCAST, [out], {"shape": shape}, weak=t.weak)
    if valid is not None:
        valid = _reshape(valid, placed.shape)
        out = b.bind(Op.WHERE, [valid, out, _fill_lit(t.var.dtype, fill_value)], weak=t.weak)
    return out


def take_along_axis(arr: Any, indices: Any, axis: Any, mode: Optional[str] = None,
                    fill_value: Any = None) -> Any:
    """``out[..., j, ...] = arr[..., indices[..., j, ...], ...]`` along ``axis`` (numpy's
    take_along_axis; the flattened array when ``axis`` is None). ``indices`` has as many axes as
    ``arr``; the other axes of the two broadcast against each other, as in JAX. ``mode`` and
    ``fill_value`` as in :func:`take` ("fill" by default)."""
    return _take_along_axis(arr, _host_indices(indices, "take_along_axis's indices"), axis, mode,
                            fill_value)


@_traceable
def _take_along_axis(arr: Any, indices: Any, axis: Any, mode: Optional[str],
                     fill_value: Any) -> Tracer:
    t = _tracer(arr)
    i = _index_tracer(indices, "take_along_axis's indices")
    if axis is None:
        t = _reshape(t, (t.size,))
        if i.ndim != 1:
            raise ShapeError(f"take_along_axis with axis=None needs 1-d indices; got shape "
                             f"{i.shape}")
        ax = 0
    else:
        ax = _norm_axis(axis, t.ndim, "take_along_axis's axis")
    if i.ndim != t.ndim:
        raise ShapeError(f"take_along_axis: indices (shape {i.shape}) must have as many axes as "
                         f"the array (shape {t.shape})")
    rest = tuple(1 if k == ax else d for k, d in enumerate(t.shape))
    try:
        shape = broadcast_shapes(rest, i.shape)
    except ShapeError:
        raise ShapeError(f"take_along_axis: indices of shape {i.shape} do not broadcast with the "
                         f"array's shape {t.shape} outside axis {ax}") from None
    i, valid = _index_mode(i, t.shape[ax], mode, "take_along_axis")
    b = t.builder
    index: list[Union[Tracer, Lit]] = []
    for k, dk in enumerate(t.shape):
        if k == ax:
            index.append(i)
        elif dk == 1:
            index.append(Lit(0, "int32"))
        else:
            index.append(_iota(b, t.ndim, k, dk))
    out = b.bind(Op.GATHER, [t, *index], weak=t.weak)
    if out.shape != shape:
        out = b.bind(Op.BROADCAST, [out], {"shape": shape}, weak=t.weak)
    if valid is not None:
        out = b.bind(Op.WHERE, [valid, out, _fill_lit(t.var.dtype, fill_value)], weak=t.weak)
    return out


@_traceable
def diagonal(a: Any, offset: int = 0, axis1: int = 0, axis2: int = 1) -> Tracer:
    """The diagonal of ``a`` over ``axis1`` and ``axis2`` (numpy's): those two axes are removed
    and one axis of the diagonal's elements ``a[..., i, i + offset, ...]`` is appended."""
    t = _tracer(a)
    if t.ndim < 2:
        raise ShapeError(f"diagonal needs an array of at least 2 axes; got shape {t.shape}")
    a1 = _norm_axis(axis1, t.ndim, "diagonal's axis1")
    a2 = _norm_axis(axis2, t.ndim, "diagonal's axis2")
    if a1 == a2:
        raise ShapeError(f"diagonal: axis1 and axis2 must differ; both are {a1}")
    off = operator.index(offset)
    d1, d2 = t.shape[a1], t.shape[a2]
    n = max(0, min(d1 + min(off, 0), d2 - max(off, 0)))
    kept = [k for k in range(t.ndim) if k not in (a1, a2)]
    shape = tuple(t.shape[k] for k in kept) + (n,)
    rank = len(shape)
    b = t.builder
    index: list[Union[Tracer, Lit]] = []
    for k, dk in enumerate(t.shape):
        if k in (a1, a2):
            start = max(-off, 0) if k == a1 else max(off, 0)
            i = _iota(b, rank, rank - 1, n)
            index.append(_elementwise(Op.ADD, i, start) if start else i)
        elif dk == 1:
            index.append(Lit(0, "int32"))
        else:
            index.append(_iota(b, rank, kept.index(k), dk))
    if n == 0 or 0 in shape:
        return b.bind(Op.BROADCAST, [_scalar_lit(0, t.var.dtype)], {"shape": shape})
    out = b.bind(Op.GATHER, [t, *index], weak=t.weak)
    if out.shape != shape:
        out = b.bind(Op.BROADCAST, [out], {"shape": shape}, weak=t.weak)
    return out


# attributes attach_operators gives Tracer and fusec.Array (__getitem__, at)
ATTACH: dict[str, Any] = {
    "__getitem__": _getitem,
    "at": property(lambda self: _IndexUpdateHelper(self)),
}
