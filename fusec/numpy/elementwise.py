"""Elementwise functions: arithmetic, comparisons, transcendental functions, rounding,
remainders, predicates, logical and bitwise operations, casts."""

from __future__ import annotations

import builtins
import math
from typing import Any, Union

import numpy as np

from .. import dtypes
from ..errors import DTypeError, TraceError
from ..ir import Lit, Op
from ..ops import ELEMENTWISE
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
    # rounding and sign
    "floor",
    "ceil",
    "trunc",
    "round",
    "sign",
    "signbit",
    "copysign",
    # division and remainders
    "remainder",
    "mod",
    "floor_divide",
    "fmod",
    "divmod",
    # logarithms, exponentials, trigonometric and hyperbolic functions
    "log1p",
    "expm1",
    "log2",
    "log10",
    "logaddexp",
    "tan",
    "sinh",
    "cosh",
    "arcsin",
    "arccos",
    "arctan",
    "arcsinh",
    "arccosh",
    "arctanh",
    "asin",
    "acos",
    "atan",
    "asinh",
    "acosh",
    "atanh",
    "arctan2",
    "atan2",
    "hypot",
    "square",
    "reciprocal",
    "positive",
    # predicates
    "isnan",
    "isinf",
    "isfinite",
    "nan_to_num",
    # logical and bitwise
    "logical_and",
    "logical_or",
    "logical_xor",
    "logical_not",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "invert",
    "bitwise_not",
    "bitwise_invert",
    "left_shift",
    "right_shift",
    "bitwise_left_shift",
    "bitwise_right_shift",
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
    """Elementwise maximum; NaN in either operand gives NaN, as in numpy and JAX."""
    return _elementwise(Op.MAX, x1, x2)


@_traceable
def minimum(x1: Any, x2: Any) -> Tracer:
    """Elementwise minimum; NaN in either operand gives NaN, as in numpy and JAX."""
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
    """Elementwise ``x1 != x2`` (True where either is NaN, as in numpy)."""
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
    """Limit values to ``[a_min, a_max]`` (either may be None); NaN stays NaN, as in numpy."""
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


# --- operand helpers of the functions below ----------------------------------------------------


def _weak(ops: list[Any]) -> bool:
    return builtins.all(_dtype_of(o)[1] for o in ops)


def _integral(op: Op, name: str, *xs: Any) -> Tracer:
    """``op`` on the promoted operands; bools, which numpy computes as small integers, as int32
    (where the op's row refuses bools); floats refused where the op is integer-only
    (``op``'s row has no float WGSL: the bitwise ops), naming ``name``."""
    ops = [_lift(x) for x in xs]
    dt = _result_dtype(ops)
    if dtypes.is_float(dt) and op in _INTEGER_ONLY:
        raise DTypeError(f"{name} is defined only for integer and bool operands (int32, uint32, "
                         f"bool), as in numpy; got {dt}. Cast with astype first")
    if dt == "bool" and not ELEMENTWISE[op].bool_ok:
        dt = "int32"  # numpy gives int8
    return _builder_of().bind(op, [_as(o, dt) for o in ops], weak=_weak(ops))


_INTEGER_ONLY = frozenset({Op.AND, Op.OR, Op.XOR, Op.NOT, Op.SHL, Op.SHR})


def _predicate(op: Op, x: Any) -> Tracer:
    o = _lift(x)
    return _builder_of().bind(op, [_as(o, _dtype_of(o)[0])])


def _floats(*xs: Any) -> list[Any]:
    """The operands in their common float dtype (integers and bools as float32); Python scalars
    stay Python floats (weak)."""
    ops = [_lift(x) for x in xs]
    dt = _result_dtype(ops)
    if not dtypes.is_float(dt):
        dt = "float32"
    return [_as(o, dt) if isinstance(o, Tracer) else float(o) for o in ops]


def _as_bool(x: Any) -> Union[Tracer, Lit]:
    return _as(_lift(x), "bool")


# --- rounding and sign ----------------------------------------------------------------------------


@_traceable
def floor(x: Any) -> Tracer:
    """Elementwise floor: the largest whole number not above ``x``. Integers and bools come back
    unchanged (as in numpy 2 and JAX)."""
    t = _tracer(x)
    return _elementwise(Op.FLOOR, t) if dtypes.is_float(t.var.dtype) else t


@_traceable
def ceil(x: Any) -> Tracer:
    """Elementwise ceiling: the smallest whole number not below ``x``. Integers and bools come
    back unchanged."""
    t = _tracer(x)
    return _elementwise(Op.CEIL, t) if dtypes.is_float(t.var.dtype) else t


@_traceable
def trunc(x: Any) -> Tracer:
    """Elementwise rounding toward zero. Integers and bools come back unchanged."""
    t = _tracer(x)
    return _elementwise(Op.TRUNC, t) if dtypes.is_float(t.var.dtype) else t


@_traceable
def round(x: Any, decimals: int = 0) -> Tracer:  # noqa: A001 - numpy's name
    """Round to ``decimals`` decimal places, halves to even, as numpy: floats as
    ``rint(x * 10**decimals) / 10**decimals`` in float32 (negative ``decimals``: divide, round,
    multiply); integers are unchanged for ``decimals >= 0`` and rounded to a multiple of
    ``10**-decimals`` (halves to even) otherwise; bools give float32."""
    if not isinstance(decimals, (int, np.integer)) or isinstance(decimals, (bool, np.bool_)):
        raise TraceError(f"round: decimals must be a Python int known at trace time; got "
                         f"{decimals!r}")
    d = int(decimals)
    t = _tracer(x)
    dt = t.var.dtype
    if dt == "bool":
        t = _as(t, "float32")  # type: ignore[assignment]
        dt = "float32"
    if dtypes.is_float(dt):
        if d == 0:
            return _elementwise(Op.ROUND, t)
        if d > 0:
            f = float(10.0 ** d)
            return divide(_elementwise(Op.ROUND, multiply(t, f)), f)
        f = float(10.0 ** -d)
        return multiply(_elementwise(Op.ROUND, divide(t, f)), f)
    if d >= 0:
        return t
    p = 10 ** -d
    if p > (2**31 - 1 if dt == "int32" else 2**32 - 1):
        return multiply(t, 0)  # every value of the dtype is nearer 0 than p / 2
    q = floor_divide(t, p)
    r = subtract(t, multiply(q, p))  # in [0, p)
    half = subtract(p, r)  # p - r > 0: no overflow, unlike 2 r
    up = logical_or(greater(r, half),
                    logical_and(equal(r, half), equal(bitwise_and(q, 1), 1)))
    return multiply(add(q, astype(up, dt)), p)


@_traceable
def sign(x: Any) -> Tracer:
    """Elementwise sign: -1, 0 or 1 in ``x``'s dtype; ``sign(nan)`` is nan and ``sign(-0.0)`` is
    0.0, as numpy. Bools are refused, as numpy does."""
    return _elementwise(Op.SIGN, x)


@_traceable
def signbit(x: Any) -> Tracer:
    """Elementwise: is the sign bit set? True for -0.0 and negative NaNs too (bool result)."""
    return _predicate(Op.SIGNBIT, x)


@_traceable
def copysign(x1: Any, x2: Any) -> Tracer:
    """``x1``'s magnitude with ``x2``'s sign bit (float32 result)."""
    return _elementwise(Op.COPYSIGN, x1, x2)


# --- division and remainders ----------------------------------------------------------------------


@_traceable
def remainder(x1: Any, x2: Any) -> Tracer:
    """numpy's remainder (Python's ``%``): the result has the divisor's sign; exact for floats.
    ``x % 0`` is 0 for integers and nan for floats, as numpy; bools compute as int32."""
    return _integral(Op.REM, "remainder", x1, x2)


mod = remainder


@_traceable
def floor_divide(x1: Any, x2: Any) -> Tracer:
    """numpy's floor division (Python's ``//``) in the operands' dtype: integers give 0 for a zero
    divisor and ``INT_MIN // -1`` wraps to INT_MIN, as numpy; floats divided by 0 give +-inf or
    nan, as numpy; bools compute as int32."""
    return _integral(Op.FLOORDIV, "floor_divide", x1, x2)


@_traceable
def fmod(x1: Any, x2: Any) -> Tracer:
    """C's fmod: the remainder with the dividend's sign; exact for floats. Integers give 0 for a
    zero divisor, as numpy; bools compute as int32."""
    return _integral(Op.FMOD, "fmod", x1, x2)


@_traceable
def divmod(x1: Any, x2: Any) -> tuple[Tracer, Tracer]:  # noqa: A001 - numpy's name
    """``(floor_divide(x1, x2), remainder(x1, x2))``."""
    return floor_divide(x1, x2), remainder(x1, x2)


# --- logarithms and exponentials ------------------------------------------------------------------


@_traceable
def log1p(x: Any) -> Tracer:
    """Elementwise ``log(1 + x)``, accurate for tiny ``x`` (relative error a few float32 ULP)."""
    return _elementwise(Op.LOG1P, x)


@_traceable
def expm1(x: Any) -> Tracer:
    """Elementwise ``exp(x) - 1``, accurate for tiny ``x``."""
    return _elementwise(Op.EXPM1, x)


@_traceable
def log2(x: Any) -> Tracer:
    """Elementwise base-2 logarithm (exact for powers of 2)."""
    return _elementwise(Op.LOG2, x)


@_traceable
def log10(x: Any) -> Tracer:
    """Elementwise base-10 logarithm, ``log2(x) * log10(2)``."""
    return multiply(log2(x), math.log10(2.0))


@_traceable
def logaddexp(x1: Any, x2: Any) -> Tracer:
    """``log(exp(x1) + exp(x2))`` without overflow: ``max + log1p(exp(-|x1 - x2|))``;
    ``logaddexp(-inf, -inf)`` is -inf and NaN propagates, as numpy."""
    a, b = _floats(x1, x2)
    stable = add(maximum(a, b), log1p(exp(negative(abs(subtract(a, b))))))
    # equal operands (infinities among them, where a - b is nan): a + log(2)
    return where(equal(a, b), add(a, math.log(2.0)), stable)


# --- trigonometric and hyperbolic functions -------------------------------------------------------


@_traceable
def tan(x: Any) -> Tracer:
    """Elementwise tangent."""
    return _elementwise(Op.TAN, x)


@_traceable
def sinh(x: Any) -> Tracer:
    """Elementwise hyperbolic sine (accurate near 0, finite up to where float32 overflows)."""
    return _elementwise(Op.SINH, x)


@_traceable
def cosh(x: Any) -> Tracer:
    """Elementwise hyperbolic cosine."""
    return _elementwise(Op.COSH, x)


@_traceable
def arcsin(x: Any) -> Tracer:
    """Elementwise inverse sine, in [-pi/2, pi/2]; nan outside [-1, 1]. Also named ``asin``."""
    return _elementwise(Op.ASIN, x)


@_traceable
def arccos(x: Any) -> Tracer:
    """Elementwise inverse cosine, in [0, pi]; nan outside [-1, 1]. Also named ``acos``."""
    return _elementwise(Op.ACOS, x)


@_traceable
def arctan(x: Any) -> Tracer:
    """Elementwise inverse tangent, in [-pi/2, pi/2]. Also named ``atan``."""
    return _elementwise(Op.ATAN, x)


@_traceable
def arcsinh(x: Any) -> Tracer:
    """Elementwise inverse hyperbolic sine. Also named ``asinh``."""
    return _elementwise(Op.ASINH, x)


@_traceable
def arccosh(x: Any) -> Tracer:
    """Elementwise inverse hyperbolic cosine; nan below 1. Also named ``acosh``."""
    return _elementwise(Op.ACOSH, x)


@_traceable
def arctanh(x: Any) -> Tracer:
    """Elementwise inverse hyperbolic tangent; +-inf at +-1, nan outside [-1, 1]. Also named
    ``atanh``."""
    return _elementwise(Op.ATANH, x)


@_traceable
def arctan2(x1: Any, x2: Any) -> Tracer:
    """The angle of the point ``(x2, x1)``, in [-pi, pi], with numpy's quadrants for signed zeros
    and infinities. Also named ``atan2``."""
    return _elementwise(Op.ATAN2, x1, x2)


asin = arcsin
acos = arccos
atan = arctan
asinh = arcsinh
acosh = arccosh
atanh = arctanh
atan2 = arctan2


@_traceable
def hypot(x1: Any, x2: Any) -> Tracer:
    """``sqrt(x1**2 + x2**2)`` without overflow or underflow in the squares: ``hi * sqrt(1 + r^2)``
    with ``r = lo / hi``; inf if either is infinite (even with a nan), as numpy."""
    a, b = _floats(x1, x2)
    ax, ay = abs(a), abs(b)
    hi, lo = maximum(ax, ay), minimum(ax, ay)
    # both scaled by 1/16 (exactly) above 1, so that the divisor stays below 2^126, where WGSL
    # bounds division's error
    r = where(greater(hi, 1.0), divide(multiply(lo, 0.0625), multiply(hi, 0.0625)),
              divide(lo, hi))
    h = multiply(hi, sqrt(add(1.0, multiply(r, r))))
    h = where(equal(hi, 0.0), 0.0, h)  # 0 / 0 above
    return where(logical_or(isinf(ax), isinf(ay)), math.inf, h)


@_traceable
def square(x: Any) -> Tracer:
    """Elementwise ``x * x``; bools give int32 (numpy: a small integer type)."""
    t = _tracer(x)
    if t.var.dtype == "bool":
        t = _as(t, "int32")  # type: ignore[assignment]
    return multiply(t, t)


@_traceable
def reciprocal(x: Any) -> Tracer:
    """Elementwise ``1 / x`` as float32 (integers too, as in JAX; numpy's integer reciprocal
    truncates)."""
    return divide(1.0, x)


@_traceable
def positive(x: Any) -> Tracer:
    """Elementwise ``+x``: ``x`` itself. Bools are refused, as numpy does."""
    t = _tracer(x)
    if t.var.dtype == "bool":
        raise DTypeError("positive is not defined for bool operands (numpy refuses it too); cast "
                         "with astype first")
    return t


# --- predicates -----------------------------------------------------------------------------------


@_traceable
def isnan(x: Any) -> Tracer:
    """Elementwise: is ``x`` NaN? (bool; always False for integers and bools)"""
    return _predicate(Op.ISNAN, x)


@_traceable
def isinf(x: Any) -> Tracer:
    """Elementwise: is ``x`` +inf or -inf? (bool; always False for integers and bools)"""
    return _predicate(Op.ISINF, x)


@_traceable
def isfinite(x: Any) -> Tracer:
    """Elementwise: is ``x`` neither infinite nor NaN? (bool; always True for integers and
    bools)"""
    return _predicate(Op.ISFINITE, x)


@_traceable
def nan_to_num(x: Any, copy: bool = True, nan: float = 0.0, posinf: Any = None,
               neginf: Any = None) -> Tracer:
    """Replace NaN by ``nan``, +inf by ``posinf`` and -inf by ``neginf`` (by default the largest
    and the most negative value of x's float dtype), as numpy; integers and bools come back
    unchanged. ``copy`` is accepted for numpy's signature (results are always new values)."""
    t = _tracer(x)
    if not dtypes.is_float(t.var.dtype):
        return t
    big = float(np.finfo(np.dtype(t.var.dtype)).max)
    pos = big if posinf is None else posinf
    neg = -big if neginf is None else neginf
    return where(isnan(t), nan, where(isinf(t), where(signbit(t), neg, pos), t))


# --- logical and bitwise --------------------------------------------------------------------------


@_traceable
def logical_and(x1: Any, x2: Any) -> Tracer:
    """Elementwise logical and of the operands' truth values (bool result, any dtype)."""
    return _builder_of().bind(Op.AND, [_as_bool(x1), _as_bool(x2)])


@_traceable
def logical_or(x1: Any, x2: Any) -> Tracer:
    """Elementwise logical or of the operands' truth values (bool result, any dtype)."""
    return _builder_of().bind(Op.OR, [_as_bool(x1), _as_bool(x2)])


@_traceable
def logical_xor(x1: Any, x2: Any) -> Tracer:
    """Elementwise logical exclusive or of the operands' truth values (bool result)."""
    return _builder_of().bind(Op.XOR, [_as_bool(x1), _as_bool(x2)])


@_traceable
def logical_not(x: Any) -> Tracer:
    """Elementwise logical not of the truth value (bool result, any dtype)."""
    return _builder_of().bind(Op.NOT, [_as_bool(x)])


@_traceable
def bitwise_and(x1: Any, x2: Any) -> Tracer:
    """Elementwise ``x1 & x2`` of integers (logical and of bools); floats are refused."""
    return _integral(Op.AND, "bitwise_and", x1, x2)


@_traceable
def bitwise_or(x1: Any, x2: Any) -> Tracer:
    """Elementwise ``x1 | x2`` of integers (logical or of bools); floats are refused."""
    return _integral(Op.OR, "bitwise_or", x1, x2)


@_traceable
def bitwise_xor(x1: Any, x2: Any) -> Tracer:
    """Elementwise ``x1 ^ x2`` of integers (logical xor of bools); floats are refused."""
    return _integral(Op.XOR, "bitwise_xor", x1, x2)


@_traceable
def invert(x: Any) -> Tracer:
    """Elementwise ``~x``: bitwise not of integers, logical not of bools; floats are refused.
    Also named ``bitwise_not`` and ``bitwise_invert``."""
    return _integral(Op.NOT, "invert", x)


bitwise_not = invert
bitwise_invert = invert


@_traceable
def left_shift(x1: Any, x2: Any) -> Tracer:
    """Elementwise ``x1 << x2`` of integers, as numpy: a shift by 32 or more, or by a negative
    amount, gives 0; bools compute as int32; floats are refused. Also named
    ``bitwise_left_shift``."""
    return _integral(Op.SHL, "left_shift", x1, x2)


@_traceable
def right_shift(x1: Any, x2: Any) -> Tracer:
    """Elementwise ``x1 >> x2`` of integers (arithmetic for int32, logical for uint32), as numpy:
    a shift by 32 or more, or by a negative amount, gives 0, or -1 for negative int32 values;
    bools compute as int32; floats are refused. Also named ``bitwise_right_shift``."""
    return _integral(Op.SHR, "right_shift", x1, x2)


bitwise_left_shift = left_shift
bitwise_right_shift = right_shift
