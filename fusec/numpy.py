"""numpy-like functions, usable inside ``@gpu_jit`` (they trace) and outside it (they run eagerly on
the device, one cached kernel per op signature, like ``jax.numpy``).

Results follow numpy's broadcasting and result shapes; dtypes follow numpy restricted to 32-bit
types (see :mod:`fusec.dtypes`): integer division and transcendental functions of integers give
float32, sums of int32 stay int32.
"""

from __future__ import annotations

import builtins
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, Union

import numpy as np

from . import dtypes
from .errors import DTypeError, ShapeError, TraceError
from .ir import Lit, Op
from .ops import ELEMENTWISE, broadcast_shapes
from .trace import Tracer, current_builder

F = TypeVar("F", bound=Callable[..., Any])
Operand = Union[Tracer, bool, int, float]

__all__ = [
    "add", "subtract", "multiply", "divide", "negative", "abs", "exp", "log", "sqrt", "power",
    "maximum", "minimum", "where", "greater", "greater_equal", "less", "less_equal", "equal",
    "not_equal", "tanh", "sin", "cos", "clip", "sum", "max", "min", "mean", "matmul", "dot",
    "transpose", "reshape", "broadcast_to", "expand_dims", "squeeze", "astype", "zeros_like",
    "ones_like", "full", "erf", "rsqrt",
]


def _traceable(fn: F) -> F:
    """Run ``fn`` on tracers when tracing; otherwise compile it for these arguments and run it."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if current_builder() is None:
            from .jit import eager_call

            return eager_call(fn, args, kwargs)
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


# --- operand handling -----------------------------------------------------------------------------


def _is_scalar(x: Any) -> bool:
    return isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating)) and not isinstance(
        x, np.ndarray)


def _lift(x: Any) -> Operand:
    """A Tracer, or a Python scalar (kept weak); concrete arrays become captured constants."""
    if isinstance(x, Tracer):
        b = current_builder()
        if b is not None and x.builder is not b:
            raise TraceError("a traced value from a finished trace was used; return values from "
                             "jitted functions instead of keeping tracers")
        return x
    if _is_scalar(x):
        if isinstance(x, np.generic):
            if x.dtype.name in dtypes.SUPPORTED:  # numpy scalars are strongly typed, as in numpy
                b = current_builder()
                assert b is not None
                return b.const(np.asarray(x))
            return x.item()  # type: ignore[no-any-return]
        return x  # type: ignore[no-any-return]
    b = current_builder()
    assert b is not None
    from .runtime import Array

    if isinstance(x, (np.ndarray, Array)) or hasattr(x, "__array__"):
        return b.const(x if isinstance(x, Array) else np.asarray(x))
    raise TraceError(f"expected an array or a scalar, got {type(x).__name__}")


def _dtype_of(x: Operand) -> tuple[str, bool]:
    if isinstance(x, Tracer):
        return x.var.dtype, x.weak
    return dtypes.weak_dtype(x), True


def _result_dtype(xs: Sequence[Operand]) -> str:
    strong = [d for d, w in map(_dtype_of, xs) if not w]
    weak = [d for d, w in map(_dtype_of, xs) if w]
    if strong:
        dt = functools.reduce(dtypes.promote, strong)
        for w in weak:
            if dtypes._ORDER[w] > dtypes._ORDER[dt]:
                dt = w
        return dt
    return functools.reduce(dtypes.promote, weak)


def _scalar_lit(value: Any, dt: str) -> Lit:
    if dt == "float32":
        return Lit(float(value), dt)
    if dt == "bool":
        return Lit(bool(value), dt)
    v = int(value)
    if isinstance(value, float) and not float(value).is_integer():
        raise DTypeError(f"Python float {value!r} cannot be used as {dt} without losing its value")
    lo, hi = (-(2**31), 2**31 - 1) if dt == "int32" else (0, 2**32 - 1)
    if not lo <= v <= hi:
        raise DTypeError(f"Python int {value!r} does not fit in {dt} (range {lo}..{hi})")
    return Lit(v, dt)


def _as(x: Operand, dt: str) -> Union[Tracer, Lit]:
    if isinstance(x, Tracer):
        if x.var.dtype == dt:
            return x
        return x.builder.bind(Op.CAST, [x], {"dtype": dt}, weak=x.weak)
    return _scalar_lit(x, dt)


def _tracer(x: Any) -> Tracer:
    """Like _lift, but a scalar becomes a 0-d traced value."""
    v = _lift(x)
    if isinstance(v, Tracer):
        return v
    b = current_builder()
    assert b is not None
    dt = dtypes.weak_dtype(v)
    return b.bind(Op.BROADCAST, [_scalar_lit(v, dt)], {"shape": ()}, weak=True)


def _builder_of(*xs: Any) -> Any:
    b = current_builder()
    assert b is not None
    return b


def _elementwise(op: Op, *xs: Any) -> Tracer:
    ops = [_lift(x) for x in xs]
    info = ELEMENTWISE[op]
    dt = _result_dtype(ops)
    if info.float_only and not dtypes.is_float(dt):
        dt = "float32"
    if dt == "bool" and not info.bool_ok:
        raise DTypeError(f"{op.value} is not defined for bool operands (numpy refuses it too); "
                         "use logical operations or cast with astype")
    weak = all(_dtype_of(o)[1] for o in ops)
    return _builder_of().bind(op, [_as(o, dt) for o in ops], weak=weak)


def _compare(op: Op, x: Any, y: Any) -> Tracer:
    a, b = _lift(x), _lift(y)
    dt = _result_dtype([a, b])
    return _builder_of().bind(op, [_as(a, dt), _as(b, dt)])


# --- elementwise ----------------------------------------------------------------------------------


@_traceable
def add(x1: Any, x2: Any) -> Tracer:
    """Elementwise ``x1 + x2`` (bool + bool is logical or, as in numpy)."""
    return _elementwise(Op.ADD, x1, x2)


@_traceable
def subtract(x1: Any, x2: Any) -> Tracer:
    """Elementwise ``x1 - x2``."""
    return _elementwise(Op.SUB, x1, x2)


@_traceable
def multiply(x1: Any, x2: Any) -> Tracer:
    """Elementwise ``x1 * x2``."""
    return _elementwise(Op.MUL, x1, x2)


@_traceable
def divide(x1: Any, x2: Any) -> Tracer:
    """True division; integers divide as float32."""
    return _elementwise(Op.DIV, x1, x2)


@_traceable
def negative(x: Any) -> Tracer:
    """Elementwise ``-x`` (wraps around for uint32, as numpy)."""
    return _elementwise(Op.NEG, x)


@_traceable
def abs(x: Any) -> Tracer:  # noqa: A001 - numpy's name
    """Elementwise absolute value."""
    return _elementwise(Op.ABS, x)


@_traceable
def exp(x: Any) -> Tracer:
    """Elementwise e**x."""
    return _elementwise(Op.EXP, x)


@_traceable
def log(x: Any) -> Tracer:
    """Elementwise natural logarithm."""
    return _elementwise(Op.LOG, x)


@_traceable
def sqrt(x: Any) -> Tracer:
    """Elementwise square root."""
    return _elementwise(Op.SQRT, x)


@_traceable
def rsqrt(x: Any) -> Tracer:
    """Elementwise ``1 / sqrt(x)``."""
    return _elementwise(Op.RSQRT, x)


@_traceable
def tanh(x: Any) -> Tracer:
    """Elementwise hyperbolic tangent."""
    return _elementwise(Op.TANH, x)


@_traceable
def sin(x: Any) -> Tracer:
    """Elementwise sine."""
    return _elementwise(Op.SIN, x)


@_traceable
def cos(x: Any) -> Tracer:
    """Elementwise cosine."""
    return _elementwise(Op.COS, x)


@_traceable
def erf(x: Any) -> Tracer:
    """Elementwise error function (absolute error below 1e-6 in float32)."""
    return _elementwise(Op.ERF, x)


@_traceable
def maximum(x1: Any, x2: Any) -> Tracer:
    """Elementwise maximum."""
    return _elementwise(Op.MAX, x1, x2)


@_traceable
def minimum(x1: Any, x2: Any) -> Tracer:
    """Elementwise minimum."""
    return _elementwise(Op.MIN, x1, x2)


@_traceable
def power(x1: Any, x2: Any) -> Tracer:
    """Elementwise ``x1 ** x2``. A Python int exponent multiplies exactly, as numpy does."""
    base = _lift(x1)
    if isinstance(x2, (int, np.integer)) and not isinstance(x2, (bool, np.bool_)) and (
            builtins.abs(int(x2)) <= 16):
        n = int(x2)
        t = _tracer(base)
        if n < 0 and not dtypes.is_float(t.var.dtype):
            raise DTypeError("integers to negative integer powers are not allowed (as in numpy); "
                             "cast the base to float32 first")
        if t.var.dtype == "bool":
            t = _as(t, "int32")  # type: ignore[assignment]
        return t.builder.bind(Op.IPOW, [t], {"n": n}, weak=t.weak)
    exponent = _lift(x2)
    dt = _result_dtype([base, exponent])
    if dt == "bool":  # numpy gives a small integer type; int32 here
        base = _as(base, "int32") if isinstance(base, Tracer) else int(base)  # type: ignore
        exponent = _as(exponent, "int32") if isinstance(exponent, Tracer) else int(exponent)  # type: ignore
    return _elementwise(Op.POW, base, exponent)


@_traceable
def greater(x1: Any, x2: Any) -> Tracer:
    """Elementwise ``x1 > x2`` (bool result)."""
    return _compare(Op.GT, x1, x2)


@_traceable
def greater_equal(x1: Any, x2: Any) -> Tracer:
    """Elementwise ``x1 >= x2``."""
    return _compare(Op.GE, x1, x2)


@_traceable
def less(x1: Any, x2: Any) -> Tracer:
    """Elementwise ``x1 < x2``."""
    return _compare(Op.LT, x1, x2)


@_traceable
def less_equal(x1: Any, x2: Any) -> Tracer:
    """Elementwise ``x1 <= x2``."""
    return _compare(Op.LE, x1, x2)


@_traceable
def equal(x1: Any, x2: Any) -> Tracer:
    """Elementwise ``x1 == x2``."""
    return _compare(Op.EQ, x1, x2)


@_traceable
def not_equal(x1: Any, x2: Any) -> Tracer:
    """Elementwise ``x1 != x2``."""
    return _compare(Op.NE, x1, x2)


@_traceable
def where(condition: Any, x: Any, y: Any) -> Tracer:
    """Elementwise choice: ``x`` where ``condition`` is true, else ``y`` (numpy's 3-argument
    form)."""
    c = _lift(condition)
    c_t: Union[Tracer, Lit] = _as(c, "bool") if isinstance(c, Tracer) else Lit(bool(c), "bool")
    a, b = _lift(x), _lift(y)
    dt = _result_dtype([a, b])
    weak = _dtype_of(a)[1] and _dtype_of(b)[1]
    return _builder_of().bind(Op.WHERE, [c_t, _as(a, dt), _as(b, dt)], weak=weak)


@_traceable
def clip(a: Any, a_min: Any = None, a_max: Any = None) -> Tracer:
    """Limit values to ``[a_min, a_max]`` (either may be None)."""
    out = _tracer(a)
    if a_min is not None:
        out = maximum(out, a_min)
    if a_max is not None:
        out = minimum(out, a_max)
    return out


@_traceable
def astype(x: Any, dtype: Any) -> Tracer:
    """Convert to ``dtype`` as numpy's ``astype`` does (float to int truncates toward zero)."""
    t = _tracer(x)
    dt = dtypes.canonicalize(dtype, "astype")
    if t.var.dtype == dt:
        return t
    return t.builder.bind(Op.CAST, [t], {"dtype": dt})


# --- shapes ---------------------------------------------------------------------------------------


def _norm_axis(axis: int, ndim: int, what: str = "axis") -> int:
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TraceError(f"{what} must be an int or a tuple of ints; got {axis!r}. Axes must be "
                         "known at trace time: pass them as static arguments")
    a = int(axis)
    if not -ndim <= a < ndim:
        raise ShapeError(f"{what} {a} is out of bounds for an array of {ndim} dimensions")
    return a % ndim if ndim else 0


def _norm_axes(axis: Any, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (tuple, list)):
        axes = tuple(_norm_axis(a, ndim) for a in axis)
        if len(set(axes)) != len(axes):
            raise ShapeError(f"repeated axis in {tuple(axis)}")
        return tuple(sorted(axes))
    return (_norm_axis(axis, ndim),)


def _shape_arg(shape: Any, what: str) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    try:
        return tuple(int(d) for d in shape)
    except TypeError as exc:
        raise TraceError(
            f"{what} must be a tuple of ints known at trace time; got {shape!r}"
        ) from exc


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


# --- matmul ---------------------------------------------------------------------------------------


def _describe(t: Tracer) -> str:
    name = t.builder.input_names.get(id(t.var))
    return f"argument '{name}'" if name else "an intermediate value"


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
