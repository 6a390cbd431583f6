"""Elementwise functions: arithmetic, comparisons, transcendental functions, casts."""

from __future__ import annotations

import builtins
from typing import Any, Union

import numpy as np

from .. import dtypes
from ..errors import DTypeError
from ..ir import Lit, Op
from ..trace import Tracer
from ._base import (
    _as,
    _builder_of,
    _compare,
    _dtype_of,
    _elementwise,
    _lift,
    _result_dtype,
    _traceable,
    _tracer,
)

__all__ = [
    "add",
    "subtract",
    "multiply",
    "divide",
    "negative",
    "abs",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "tanh",
    "sin",
    "cos",
    "erf",
    "maximum",
    "minimum",
    "power",
    "greater",
    "greater_equal",
    "less",
    "less_equal",
    "equal",
    "not_equal",
    "where",
    "clip",
    "astype",
]



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
