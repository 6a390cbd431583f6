"""Operand handling shared by every fusec.numpy function: lifting arrays and scalars into the
trace, dtype promotion (JAX's rules with 64-bit types off), axis and shape arguments, and
:func:`_traceable`, which makes a function run eagerly on the device outside ``gpu_jit``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, Union

import numpy as np

from .. import dtypes
from ..errors import DTypeError, ShapeError, TraceError
from ..ir import Lit, Op
from ..ops import ELEMENTWISE
from ..trace import Tracer, current_builder, is_device_array, run_eager

F = TypeVar("F", bound=Callable[..., Any])
Operand = Union[Tracer, bool, int, float]


def _traceable(fn: F) -> F:
    """Run ``fn`` on tracers when tracing; otherwise compile it for these arguments and run it."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if current_builder() is None:
            return run_eager(fn, args, kwargs)
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
            return b.adopt(x)  # from an enclosing trace: captured; from a finished one: an error
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
    if is_device_array(x):
        return b.const(x)
    if isinstance(x, np.ndarray) or hasattr(x, "__array__"):
        return b.const(np.asarray(x))
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
            if dtypes.weak_wins(w, dt):
                dt = w
        return dt
    return functools.reduce(dtypes.promote, weak)


def _scalar_lit(value: Any, dt: str) -> Lit:
    if dt == "float32":
        return Lit(float(value), dt)
    if dt == "float16":  # rounded now (as JAX converts a weak scalar): the literal is exact
        with np.errstate(over="ignore"):  # (beyond 65504: inf, as the product would be)
            return Lit(float(np.float16(value)), dt)
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


def _describe(t: Tracer) -> str:
    name = t.builder.input_names.get(id(t.var))
    return f"argument '{name}'" if name else "an intermediate value"


def _stop_gradient(x: Any) -> Any:
    """``x`` with a zero derivative (fusec.lax.stop_gradient): a float tracer gets a marker
    equation that autodiff does not go through; anything else is returned as it is."""
    if isinstance(x, Tracer) and dtypes.is_float(x.var.dtype):
        return _builder_of().bind(Op.STOP_GRADIENT, [_lift(x)], weak=x.weak)
    return x
