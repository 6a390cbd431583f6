"""Numeric tests: every op of fusec.numpy and fusec.nn against numpy, on the real wgpu device.

Conventions
-----------
* Float results are float32 computed on the GPU; the reference is numpy computed in **float64** from
  the same float32 inputs (for transcendental ops the float64 result is, for our purposes, exact).
  The tolerance of each elementwise op is the op table's ``tol`` = (rtol, atol)
  (``fusec.ops.ELEMENTWISE[op].tol``), which comes from WGSL's accuracy rules: e.g. exp is
  3 + 2|x| ULP, log 3 ULP (2^-21 absolute near 1), division 2.5 ULP, add/mul correctly rounded
  (0.5 ULP = 2^-24 relative), sin/cos 2^-11 absolute on [-pi, pi] (adapters do far better).
  Ops with tolerance (0, 0) (neg, abs, max, min, comparisons, where) must be bit-exact.
* Integer and bool results must match numpy exactly, including wrap-around (int32 overflow, uint32
  negation). Result dtypes follow numpy restricted to 32 bits: int64 -> int32, uint64 -> uint32,
  float64 -> float32 (float16 stays float16: tests/test_float16.py); Python scalars are weak.
* Reductions: a float32 sum of n terms, in any order, is off by at most (depth of the summation
  tree) * 2^-24 * sum(|x_i|); random rounding makes it grow like sqrt(n) * 2^-24 in practice. We
  hold sums to 1e-5 * max(1, log2(n)) * sum(|x_i|), which is > 4 sigma of that random walk for every
  n used here and still far below the effect of a dropped or doubled element.
* Matmul: each output is a K-term dot product accumulated in float32, so its error is held to
  1e-6 * sqrt(K) * (|A| @ |B|) (about 16 sigma of the sqrt(K) random walk, with the condition
  number taken into account through |A| @ |B|).
Every random input comes from the ``rng`` fixture (fresh seed per test, printed on failure).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fusec
import fusec.numpy as fnp
from fusec import nn
from fusec.ir import COMPARISON, Op
from fusec.ops import ELEMENTWISE

U32 = 2.0 ** -24  # float32 unit roundoff
I32_MIN, I32_MAX = -(2**31), 2**31 - 1


# --- helpers --------------------------------------------------------------------------------------


def jit(fn: Callable[..., Any], **options: Any) -> Any:
    return fusec.gpu_jit(**options)(fn) if options else fusec.gpu_jit(fn)


def run(fn: Callable[..., Any], *args: Any, **options: Any) -> np.ndarray:
    """jit ``fn``, call it, check the result is a device Array, and read it back."""
    out = jit(fn, **options)(*args)
    assert isinstance(out, fusec.Array), type(out)
    return np.asarray(out)


def np32(dt: Any) -> np.dtype:
    """numpy's result dtype restricted to fusec's 32-bit types."""
    dt = np.dtype(dt)
    return {np.dtype(np.int64): np.dtype(np.int32), np.dtype(np.uint64): np.dtype(np.uint32),
            np.dtype(np.float64): np.dtype(np.float32)}.get(dt, dt)


def f64(*xs: Any) -> list[np.ndarray]:
    return [np.asarray(x, dtype=np.float64) for x in xs]


def assert_close(got: np.ndarray, want: Any, rtol: float, atol: float,
                 dtype: Any = np.float32) -> None:
    want = np.asarray(want)
    assert got.dtype == np.dtype(dtype), f"dtype {got.dtype}, expected {np.dtype(dtype)}"
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    if rtol == 0 and atol == 0:
        np.testing.assert_array_equal(got, want.astype(got.dtype))
    else:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                                   atol=atol)


def assert_exact(got: np.ndarray, want: Any) -> None:
    want = np.asarray(want)
    assert got.dtype == want.dtype, f"dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    np.testing.assert_array_equal(got, want)


def assert_sum_close(got: np.ndarray, want: np.ndarray, abs_sum: np.ndarray, n: int) -> None:
    """Summation-error check (see the module docstring); ``abs_sum`` is sum(|x_i|) per output."""
    assert got.dtype == np.float32, got.dtype
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    bound = 1e-5 * max(1.0, math.log2(max(n, 1))) * abs_sum + 1e-30
    err = np.abs(got.astype(np.float64) - want)
    bad = ~(err <= bound)
    assert not bad.any(), (f"{bad.sum()} of {bad.size} outputs off: worst error {err.max():.3g} "
                           f"vs bound {bound.flat[int(np.argmax(err - bound))]:.3g}\n"
                           f"got  {got.ravel()[:8]}\nwant {want.ravel()[:8]}")


def randf(rng: np.random.Generator, shape: Any, lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    return rng.uniform(lo, hi, shape).astype(np.float32)


def randi32(rng: np.random.Generator, shape: Any, lo: int = I32_MIN, hi: int = I32_MAX
            ) -> np.ndarray:
    return rng.integers(lo, hi, shape, endpoint=True, dtype=np.int64).astype(np.int32)


def randu32(rng: np.random.Generator, shape: Any, lo: int = 0, hi: int = 2**32 - 1) -> np.ndarray:
    return rng.integers(lo, hi, shape, endpoint=True, dtype=np.int64).astype(np.uint32)


def rand_dtype(rng: np.random.Generator, shape: Any, dtype: str, small: bool = False
               ) -> np.ndarray:
    if dtype == "float32":
        return randf(rng, shape, -4, 4)
    if dtype == "int32":
        return randi32(rng, shape, -50, 50) if small else randi32(rng, shape)
    if dtype == "uint32":
        return randu32(rng, shape, 0, 100) if small else randu32(rng, shape)
    return rng.random(shape) < 0.5


# --- the elementwise op table ---------------------------------------------------------------------

Gen = Callable[[np.random.Generator, Any], np.ndarray]


def uniform(lo: float, hi: float) -> Gen:
    return lambda rng, shape: randf(rng, shape, lo, hi)


def log_uniform(lo: float, hi: float) -> Gen:
    """Positive values spread over decades (for log, sqrt, pow bases)."""
    return lambda rng, shape: np.exp(rng.uniform(math.log(lo), math.log(hi), shape)).astype(
        np.float32)


def away_from_zero(lo: float, hi: float) -> Gen:
    def g(rng: np.random.Generator, shape: Any) -> np.ndarray:
        sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
        return (sign * rng.uniform(lo, hi, shape)).astype(np.float32)

    return g


def discrete(rng: np.random.Generator, shape: Any) -> np.ndarray:
    """Values from a small set, so that ties (x == y) are frequent: comparisons, max, min."""
    return (rng.integers(-4, 5, shape) * 0.5).astype(np.float32)


def boolean(rng: np.random.Generator, shape: Any) -> np.ndarray:
    return rng.random(shape) < 0.5


def np_erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


# (fusec.numpy function, float64 reference, valid-domain generator per operand)
TABLE: dict[Op, tuple[Callable[..., Any], Callable[..., Any], tuple[Gen, ...]]] = {
    Op.NEG: (fnp.negative, np.negative, (uniform(-10, 10),)),
    Op.ABS: (fnp.abs, np.abs, (uniform(-10, 10),)),
    Op.EXP: (fnp.exp, np.exp, (uniform(-10, 10),)),
    Op.LOG: (fnp.log, np.log, (log_uniform(1e-3, 1e3),)),
    Op.SQRT: (fnp.sqrt, np.sqrt, (log_uniform(1e-3, 1e3),)),
    Op.RSQRT: (fnp.rsqrt, lambda x: 1.0 / np.sqrt(x), (log_uniform(1e-3, 1e3),)),
    Op.TANH: (fnp.tanh, np.tanh, (uniform(-8, 8),)),
    # an identity for the values (its zero derivative is tested with autodiff)
    Op.STOP_GRADIENT: (fusec.lax.stop_gradient, lambda x: x, (uniform(-4, 4),)),
    # WGSL bounds sin/cos only on [-pi, pi]
    Op.SIN: (fnp.sin, np.sin, (uniform(-math.pi, math.pi),)),
    Op.COS: (fnp.cos, np.cos, (uniform(-math.pi, math.pi),)),
    Op.ERF: (fnp.erf, np_erf, (uniform(-4, 4),)),
    Op.ADD: (fnp.add, np.add, (uniform(-10, 10), uniform(-10, 10))),
    Op.SUB: (fnp.subtract, np.subtract, (uniform(-10, 10), uniform(-10, 10))),
    Op.MUL: (fnp.multiply, np.multiply, (uniform(-10, 10), uniform(-10, 10))),
    Op.DIV: (fnp.divide, np.divide, (uniform(-10, 10), away_from_zero(0.1, 10))),
    Op.POW: (fnp.power, np.power, (log_uniform(0.1, 10), uniform(-3, 3))),
    Op.MAX: (fnp.maximum, np.maximum, (discrete, discrete)),
    Op.MIN: (fnp.minimum, np.minimum, (discrete, discrete)),
    Op.GT: (fnp.greater, np.greater, (discrete, discrete)),
    Op.GE: (fnp.greater_equal, np.greater_equal, (discrete, discrete)),
    Op.LT: (fnp.less, np.less, (discrete, discrete)),
    Op.LE: (fnp.less_equal, np.less_equal, (discrete, discrete)),
    Op.EQ: (fnp.equal, np.equal, (discrete, discrete)),
    Op.NE: (fnp.not_equal, np.not_equal, (discrete, discrete)),
    Op.WHERE: (fnp.where, np.where, (boolean, uniform(-10, 10), uniform(-10, 10))),
}

UNARY_OPS = [op for op in TABLE if len(TABLE[op][2]) == 1]
BINARY_OPS = [op for op in TABLE if len(TABLE[op][2]) == 2]

UNARY_SHAPES = [(), (1,), (7,), (257,), (1009,), (3, 5), (2, 3, 19)]
BINARY_SHAPES = [
    ((), ()),
    ((1,), (13,)),
    ((257,), (257,)),
    ((1009,), ()),
    ((5, 1, 3), (4, 1)),
    ((3, 1), (1, 17)),
    ((2, 3, 1, 5), (3, 7, 1)),
]
WHERE_SHAPES = [
    ((), (), ()),
    ((7,), (7,), (7,)),
    ((5, 1, 3), (4, 1), (1,)),
    ((4, 1), (), (1, 6)),
    ((), (2, 3), (3,)),
]


def test_every_table_op_is_covered() -> None:
    """Adding a row to fusec.ops.ELEMENTWISE without a numeric test here (or, for the rows it
    lists, in test_elementwise_ext) fails."""
    from test_elementwise_ext import ROW_OPS

    assert set(ELEMENTWISE) == set(TABLE) | ROW_OPS, set(ELEMENTWISE) ^ (set(TABLE) | ROW_OPS)


def _check_elementwise(op: Op, got: np.ndarray, args: list[np.ndarray]) -> None:
    _, ref, _ = TABLE[op]
    want = ref(*f64(*args)) if op is not Op.WHERE else ref(args[0], *f64(*args[1:]))
    if op in COMPARISON:
        assert_exact(got, np.asarray(want))
    else:
        assert_close(got, want, *ELEMENTWISE[op].tol)


@pytest.mark.parametrize("shape", UNARY_SHAPES, ids=str)
@pytest.mark.parametrize("op", UNARY_OPS, ids=lambda o: o.value)
def test_unary_float32(op: Op, shape: tuple[int, ...], rng: np.random.Generator) -> None:
    fn, _, (gen,) = TABLE[op]
    x = gen(rng, shape)
    _check_elementwise(op, run(lambda a: fn(a), x), [x])


@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=str)
@pytest.mark.parametrize("op", BINARY_OPS, ids=lambda o: o.value)
def test_binary_float32(op: Op, shapes: tuple[Any, Any], rng: np.random.Generator) -> None:
    fn, _, gens = TABLE[op]
    args = [g(rng, s) for g, s in zip(gens, shapes)]
    _check_elementwise(op, run(lambda a, b: fn(a, b), *args), args)


@pytest.mark.parametrize("shapes", WHERE_SHAPES, ids=str)
def test_where_float32(shapes: tuple[Any, Any, Any], rng: np.random.Generator) -> None:
    fn, _, gens = TABLE[Op.WHERE]
    args = [g(rng, s) for g, s in zip(gens, shapes)]
    _check_elementwise(Op.WHERE, run(lambda c, a, b: fn(c, a, b), *args), args)


@pytest.mark.parametrize("op", BINARY_OPS, ids=lambda o: o.value)
@pytest.mark.parametrize("scalar_first", [False, True], ids=["x_op_s", "s_op_x"])
def test_binary_with_python_scalar(op: Op, scalar_first: bool, rng: np.random.Generator) -> None:
    """Python scalars are weak: float32 op 1.5 stays float32."""
    fn, ref, gens = TABLE[op]
    x = gens[0 if not scalar_first else 1](rng, (33,))
    s = {Op.POW: 1.5, Op.DIV: -2.5}.get(op, 0.5)
    if op is Op.POW and scalar_first:
        s = 2.5  # positive base
    if op is Op.DIV and not scalar_first:
        x = uniform(-10, 10)(rng, (33,))
    elif op is Op.DIV:
        x = away_from_zero(0.1, 10)(rng, (33,))
    f = (lambda a: fn(s, a)) if scalar_first else (lambda a: fn(a, s))
    got = run(f, x)
    want = ref(s, x.astype(np.float64)) if scalar_first else ref(x.astype(np.float64), s)
    if op in COMPARISON:
        assert_exact(got, np.asarray(want))
    else:
        assert_close(got, want, *ELEMENTWISE[op].tol)


def test_operators_inside_jit(rng: np.random.Generator) -> None:
    """The Python operators on traced values, all in one fused function."""
    x = randf(rng, (6, 5), 0.5, 2.0)
    y = randf(rng, (5,), 0.5, 2.0)

    def f(a, b):  # type: ignore[no-untyped-def]
        return (a + b, a - b, a * b, a / b, a ** b, -a, abs(-a), a > b, a >= b, a < b, a <= b,
                a == b, a != b, 2.0 - a, 3.0 / a, 2.0 ** a, +a)

    outs = jit(f)(x, y)
    xd, yd = f64(x, y)
    wants = [xd + yd, xd - yd, xd * yd, xd / yd, xd ** yd, -xd, np.abs(xd), xd > yd, xd >= yd,
             xd < yd, xd <= yd, xd == yd, xd != yd, 2.0 - xd, 3.0 / xd, 2.0 ** xd, xd]
    ops = [Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.POW, Op.NEG, Op.ABS, Op.GT, Op.GE, Op.LT, Op.LE,
           Op.EQ, Op.NE, Op.SUB, Op.DIV, Op.POW, Op.NEG]
    assert len(outs) == len(wants)
    for got, want, op in zip(outs, wants, ops):
        got = np.asarray(got)
        if op in COMPARISON:
            assert_exact(got, want)
        else:
            assert_close(got, want, *ELEMENTWISE[op].tol)


def test_tanh_saturates(rng: np.random.Generator) -> None:
    x = np.array([-100.0, -20.0, -15.5, -9.0, 0.0, 9.0, 15.5, 20.0, 100.0], np.float32)
    assert_close(run(fnp.tanh, x), np.tanh(x.astype(np.float64)), *ELEMENTWISE[Op.TANH].tol)


def test_tanh_keeps_relative_accuracy_near_zero(rng: np.random.Generator) -> None:
    """tanh(x) ~ x for tiny x: relative, not only absolute, accuracy (lavapipe's builtin gave
    ~3e-8 for tanh(1e-30)); both branches of fusec_tanh and the switch at 0.25; inf and NaN."""
    mags = np.concatenate([np.logspace(-30, 1.3, 4001), rng.uniform(0.2, 0.3, 1001)])
    x = np.concatenate([mags, -mags]).astype(np.float32)
    got = np.asarray(run(fnp.tanh, x)).astype(np.float64)
    want = np.tanh(x.astype(np.float64))
    assert np.max(np.abs(got - want) / np.abs(want)) < 2e-6
    special = np.asarray(run(fnp.tanh, np.array([np.inf, -np.inf, np.nan, 0.0], np.float32)))
    np.testing.assert_array_equal(special[:2], [1.0, -1.0])
    assert np.isnan(special[2]) and special[3] == 0.0


# --- power ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 16, -1, -2, -3])
def test_power_python_int_exponent(n: int, rng: np.random.Generator) -> None:
    """x ** n for a Python int multiplies exactly (n - 1 roundings, one more for 1/x^n);
    negative bases included."""
    x = away_from_zero(0.5, 2.0)(rng, (37,))
    got = run(lambda a: a ** n, x)
    assert_close(got, x.astype(np.float64) ** n, rtol=(abs(n) + 2) * U32, atol=0.0)


@pytest.mark.parametrize("exponent", [0.5, 2.0, -1.5, 17, -20])
def test_power_python_scalar_exponent_positive_base(exponent: float,
                                                    rng: np.random.Generator) -> None:
    x = log_uniform(0.5, 2.0)(rng, (29,))
    got = run(lambda a: fnp.power(a, exponent), x)
    assert_close(got, np.power(x.astype(np.float64), exponent), *ELEMENTWISE[Op.POW].tol)


@pytest.mark.parametrize("shapes", [((41,), (41,)), ((5, 1), (1, 7))], ids=str)
def test_power_negative_base_integer_exponent(shapes: Any, rng: np.random.Generator) -> None:
    """numpy defines negative ** integer-valued float; WGSL pow does not (fusec must handle it)."""
    base = away_from_zero(0.2, 4.0)(rng, shapes[0])
    expo = rng.integers(-4, 5, shapes[1]).astype(np.float32)
    got = run(fnp.power, base, expo)
    assert_close(got, np.power(*f64(base, expo)), *ELEMENTWISE[Op.POW].tol)


def test_power_special_values() -> None:
    base = np.array([0.0, 0.0, 0.0, -2.0, -2.0, 2.0, -0.5, 1.0, -1.0, 4.0], np.float32)
    expo = np.array([0.0, 2.0, 0.5, 3.0, 2.0, 0.5, -2.0, 1e6, 1e6 + 1, -0.5], np.float32)
    got = run(fnp.power, base, expo)
    assert_close(got, np.power(*f64(base, expo)), *ELEMENTWISE[Op.POW].tol)
    # negative ** non-integer is nan in numpy
    got = run(fnp.power, np.array([-2.0, -0.5], np.float32), np.array([0.5, 1.5], np.float32))
    assert np.isnan(got).all(), got


def test_rpow_scalar_base(rng: np.random.Generator) -> None:
    x = randf(rng, (19,), -3, 3)
    assert_close(run(lambda a: 2.0 ** a, x), 2.0 ** x.astype(np.float64),
                 *ELEMENTWISE[Op.POW].tol)


# --- integer and bool dtypes ----------------------------------------------------------------------

INT_BINARY = [
    ("add", fnp.add, np.add),
    ("subtract", fnp.subtract, np.subtract),
    ("multiply", fnp.multiply, np.multiply),
    ("maximum", fnp.maximum, np.maximum),
    ("minimum", fnp.minimum, np.minimum),
    ("greater", fnp.greater, np.greater),
    ("greater_equal", fnp.greater_equal, np.greater_equal),
    ("less", fnp.less, np.less),
    ("less_equal", fnp.less_equal, np.less_equal),
    ("equal", fnp.equal, np.equal),
    ("not_equal", fnp.not_equal, np.not_equal),
]


@pytest.mark.parametrize("small", [False, True], ids=["full_range", "small_values"])
@pytest.mark.parametrize("dtype", ["int32", "uint32"])
@pytest.mark.parametrize("name,fn,ref", INT_BINARY, ids=[c[0] for c in INT_BINARY])
def test_int_binary_exact(name: str, fn: Any, ref: Any, dtype: str, small: bool,
                          rng: np.random.Generator) -> None:
    """Full-range values overflow: results wrap around modulo 2**32, as numpy's do."""
    x = rand_dtype(rng, (5, 1, 3), dtype, small)
    y = rand_dtype(rng, (4, 1), dtype, small)
    with np.errstate(over="ignore"):
        want = ref(x, y)
    assert_exact(run(fn, x, y), want)


def test_int32_overflow_edges() -> None:
    x = np.array([I32_MAX, I32_MIN, I32_MAX, I32_MIN, 65536, -65536, 46341], np.int32)
    y = np.array([1, -1, I32_MAX, I32_MIN, 65536, 65536, 46341], np.int32)
    with np.errstate(over="ignore"):
        wants = [x + y, x - y, x * y, -x, np.abs(x), -y]
    outs = jit(lambda a, b: (a + b, a - b, a * b, -a, abs(a), fnp.negative(b)))(x, y)
    for got, want in zip(outs, wants):
        assert_exact(np.asarray(got), want)


def test_uint32_negation_and_wraparound(rng: np.random.Generator) -> None:
    x = np.concatenate([np.array([0, 1, 2**31, 2**32 - 1], np.uint32), randu32(rng, (20,))])
    y = randu32(rng, (24,))
    with np.errstate(over="ignore"):
        wants = [-x, x - y, x + y, x * y, np.abs(x)]
    outs = jit(lambda a, b: (-a, a - b, a + b, a * b, fnp.abs(a)))(x, y)
    for got, want in zip(outs, wants):
        assert_exact(np.asarray(got), want)


@pytest.mark.parametrize("dtype", ["int32", "uint32"])
def test_int_unary_and_where_and_clip(dtype: str, rng: np.random.Generator) -> None:
    x = rand_dtype(rng, (3, 7), dtype)
    y = rand_dtype(rng, (7,), dtype)
    c = rng.random((3, 1)) < 0.5
    lo, hi = (-1000, 1000) if dtype == "int32" else (1000, 2**31)
    outs = jit(lambda a, b, cond: (fnp.abs(a), fnp.where(cond, a, b), fnp.clip(a, lo, hi),
                                   fnp.maximum(a, 7), fnp.where(cond, a, 3)))(x, y, c)
    wants = [np.abs(x), np.where(c, x, y), np.clip(x, lo, hi).astype(x.dtype),
             np.maximum(x, np.asarray(7, x.dtype)), np.where(c, x, np.asarray(3, x.dtype))]
    for got, want in zip(outs, wants):
        assert_exact(np.asarray(got), want)


@pytest.mark.parametrize("op", ["add", "subtract", "multiply", "where"])
def test_int32_with_uint32_gives_int32(op: str, rng: np.random.Generator) -> None:
    """numpy gives int64; restricted to 32 bits that is int32, wrapping modulo 2**32."""
    x = randi32(rng, (31,))
    y = randu32(rng, (31,))
    c = rng.random(31) < 0.5
    fns = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b,
           "multiply": lambda a, b: a * b, "where": lambda a, b: fnp.where(c, a, b)}
    refs = {**fns, "where": lambda a, b: np.where(c, a, b)}
    want = refs[op](x.astype(np.int64), y.astype(np.int64))
    with np.errstate(over="ignore"):
        want = np.asarray(want).astype(np.int32)
    assert_exact(run(fns[op], x, y), want)


@pytest.mark.parametrize("name,fn,ref", INT_BINARY[3:], ids=[c[0] for c in INT_BINARY[3:]])
def test_int32_with_uint32_order_ops(name: str, fn: Any, ref: Any,
                                     rng: np.random.Generator) -> None:
    """Comparisons and max/min of int32 with uint32, on values both types hold (below 2**31)."""
    x = randi32(rng, (29,), -1000, 1000)
    y = randu32(rng, (29,), 0, 2000)
    y[:5] = np.abs(x[:5])
    want = ref(x.astype(np.int64), y.astype(np.int64))
    assert_exact(run(fn, x, y), np.asarray(want).astype(np32(np.asarray(want).dtype)))


def test_bool_logic(rng: np.random.Generator) -> None:
    """bool + is or, * is and; max is or, min is and; comparisons and where on bools."""
    a = rng.random((6, 7)) < 0.5
    b = rng.random((7,)) < 0.5
    outs = jit(lambda p, q: (p + q, p * q, fnp.maximum(p, q), fnp.minimum(p, q), p == q,
                             p != q, p > q, p <= q, fnp.where(p, q, False), abs(p)))(a, b)
    wants = [a | b, a & b, np.maximum(a, b), np.minimum(a, b), a == b, a != b, a > b, a <= b,
             np.where(a, b, False), np.abs(a)]
    for got, want in zip(outs, wants):
        assert_exact(np.asarray(got), want)


@pytest.mark.parametrize("fn", [fnp.negative, lambda a: a - a], ids=["negative", "subtract"])
def test_bool_arithmetic_refused(fn: Any) -> None:
    """numpy refuses -bool and bool - bool (TypeError); fusec says so too."""
    with pytest.raises(TypeError):
        jit(fn)(np.array([True, False]))


@pytest.mark.parametrize("dtype", ["int32", "uint32", "bool"])
@pytest.mark.parametrize("op", [Op.EXP, Op.SQRT, Op.LOG, Op.SIN, Op.TANH])
def test_transcendental_of_integers_is_float32(op: Op, dtype: str,
                                               rng: np.random.Generator) -> None:
    fn, ref, _ = TABLE[op]
    x = rng.integers(1, 10, (13,)).astype(dtype) if dtype != "bool" else (rng.random(13) < 0.5)
    if op is Op.LOG and dtype == "bool":
        x = np.ones(13, bool)
    assert_close(run(fn, x), ref(x.astype(np.float64)), *ELEMENTWISE[op].tol)


def test_int_power_python_int_exponent(rng: np.random.Generator) -> None:
    """int ** Python int multiplies exactly, wrapping like numpy."""
    x = randi32(rng, (40,))
    with np.errstate(over="ignore"):
        assert_exact(run(lambda a: a ** 3, x), x ** 3)
        assert_exact(run(lambda a: a ** 2, x.astype(np.uint32)), x.astype(np.uint32) ** 2)
        assert_exact(run(lambda a: a ** 0, x), x ** 0)


def test_int_power_int_array_exponent(rng: np.random.Generator) -> None:
    """int ** int array: numpy is exact; fusec documents exactness while the result is below
    2**24 (it computes in float32), so small powers like 5 ** 2 must come out exact."""
    base = rng.integers(-5, 6, (5, 1)).astype(np.int32)
    expo = rng.integers(0, 7, (1, 6)).astype(np.int32)
    base[:, 0] = [-5, -3, 2, 5, 0]
    expo[0, :] = [0, 1, 2, 3, 5, 6]
    assert_exact(run(fnp.power, base, expo), np.power(base, expo))


def test_int_power_array_exponent_wraps(rng: np.random.Generator) -> None:
    """int32 and uint32 ** int array over full-range bases and exponents up to 40 wrap modulo
    2**32 as numpy's do; negative int32 exponents give 0, or +-1 for bases 1 and -1."""
    base = randi32(rng, (7, 1))
    base[:3, 0] = [1, -1, 0]
    expo = rng.integers(0, 41, (1, 9)).astype(np.int32)
    neg = expo.copy()
    neg[0, :4] = [-1, -2, -7, -8]
    with np.errstate(over="ignore"):
        assert_exact(run(fnp.power, base, expo), np.power(base, expo))
        ub, ue = base.astype(np.uint32), expo.astype(np.uint32)
        assert_exact(run(fnp.power, ub, ue), np.power(ub, ue))
        special = np.where(base == 1, 1, np.where(base == -1, np.where(neg % 2 == 0, 1, -1), 0))
        want = np.where(neg < 0, special, np.power(base, np.maximum(neg, 0)))
        assert_exact(run(fnp.power, base, neg), want.astype(np.int32))


@pytest.mark.parametrize("src,dst", [
    (s, d) for s in ("float32", "int32", "uint32", "bool")
    for d in ("float32", "int32", "uint32", "bool") if s != d])
def test_astype(src: str, dst: str, rng: np.random.Generator) -> None:
    """Conversions on values that are representable in both types (numpy is undefined outside)."""
    n = 50
    if src == "float32":
        hi = 2e9 if dst != "bool" else 10.0
        lo = 0.0 if dst == "uint32" else -hi
        x = rng.uniform(lo, hi, n).astype(np.float32)
        x[:6] = [0.0, 0.5, 0.999, 1.5, 2.0, 1e-3]
        if dst != "uint32":
            x[6:10] = [-0.5, -0.999, -1.5, -2.0]  # truncation toward zero
    elif src == "int32":
        x = randi32(rng, n, -(2**24), 2**24) if dst == "float32" else randi32(rng, n)
        x[:3] = [0, 1, -1]
    elif src == "uint32":
        x = randu32(rng, n, 0, 2**24) if dst == "float32" else randu32(rng, n)
        x[:2] = [0, 1]
    else:
        x = rng.random(n) < 0.5
    assert_exact(run(lambda a: fnp.astype(a, dst), x), x.astype(dst))
    assert_exact(run(lambda a: a.astype(dst), x), x.astype(dst))


def test_astype_large_ints_to_float32(rng: np.random.Generator) -> None:
    """Above 2**24 the conversion rounds: within half an ULP (numpy rounds to nearest)."""
    x = randi32(rng, 64)
    got = run(lambda a: a.astype("float32"), x)
    assert_close(got, x.astype(np.float64), rtol=U32, atol=0.0)
    y = randu32(rng, 64)
    assert_close(run(lambda a: a.astype(np.float32), y), y.astype(np.float64), rtol=U32, atol=0.0)


DTYPES = ["float32", "int32", "uint32", "bool"]
DTYPE_OPS = [
    ("add", fnp.add, np.add), ("multiply", fnp.multiply, np.multiply),
    ("subtract", fnp.subtract, np.subtract), ("divide", fnp.divide, np.divide),
    ("maximum", fnp.maximum, np.maximum), ("less", fnp.less, np.less),
    ("where", lambda a, b: fnp.where(a > b, a, b), lambda a, b: np.where(a > b, a, b)),
]


@pytest.mark.parametrize("name,fn,ref", DTYPE_OPS, ids=[c[0] for c in DTYPE_OPS])
@pytest.mark.parametrize("da", DTYPES)
@pytest.mark.parametrize("db", DTYPES)
def test_result_dtype_rules(name: str, fn: Any, ref: Any, da: str, db: str,
                            rng: np.random.Generator) -> None:
    """Result dtypes (and values) are numpy's, restricted to 32-bit types."""
    x = rng.integers(0, 6, 11).astype(da)
    y = rng.integers(1, 6, 11).astype(db)  # no zero divisors (bool: all True)
    try:
        want = ref(x, y)
    except TypeError:  # numpy refuses (bool - bool): fusec must refuse too
        with pytest.raises(TypeError):
            jit(fn)(x, y)
        return
    got = run(fn, x, y)
    assert got.dtype == np32(want.dtype), f"{da} {name} {db}: {got.dtype} vs {np32(want.dtype)}"
    if got.dtype == np.float32:
        assert_close(got, want, rtol=1e-6, atol=0.0)
    else:
        assert_exact(got, want.astype(got.dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scalar", [2, 1.5, True], ids=["int", "float", "bool"])
def test_python_scalars_are_weak(dtype: str, scalar: Any, rng: np.random.Generator) -> None:
    x = rng.integers(0, 6, 9).astype(dtype)
    for fn in (lambda a: a + scalar, lambda a: scalar * a, lambda a: fnp.maximum(a, scalar)):
        want = fn(x)
        got = run(fn, x)
        assert got.dtype == np32(want.dtype), (dtype, scalar, got.dtype, want.dtype)
        assert_close(got, want, 1e-7, 0.0, dtype=np32(want.dtype))


def test_numpy_scalars_are_strong(rng: np.random.Generator) -> None:
    """numpy scalars (unlike Python scalars) carry their dtype (NEP 50): uint32 + np.int32(1) is
    int64 in numpy, int32 restricted to 32 bits; the same whether the scalar is captured by the
    function or passed to it."""
    x = rng.integers(0, 100, 7).astype(np.uint32)
    s = np.int32(1)
    want = (x + s).astype(np32((x + s).dtype))
    assert_exact(run(lambda a, t: a + t, x, s), want)
    assert_exact(run(lambda a: a + s, x), want)


def test_jit_python_scalar_and_0d_arguments(rng: np.random.Generator) -> None:
    x0 = np.asarray(rng.uniform(1, 2), np.float32)  # 0-d array
    x1 = randf(rng, (7,))
    f = jit(lambda a, b, s: (a * b + s, a + s, fnp.exp(a)))
    r1, r2, r3 = f(x0, x1, 2.5)
    assert_close(np.asarray(r1), x0.astype(np.float64) * x1 + 2.5, 2e-7, 0.0)
    assert_close(np.asarray(r2), np.float64(x0) + 2.5, 1e-7, 0.0)
    assert_close(np.asarray(r3), np.exp(np.float64(x0)), *ELEMENTWISE[Op.EXP].tol)
    i0 = np.asarray(7, np.int32)
    assert_exact(run(lambda a, s: a * s - 1, i0, 3), np.asarray(20, np.int32))
    assert_exact(run(lambda s: fnp.full((2, 3), 0, "int32") + s, np.int32(4)),
                 np.full((2, 3), 4, np.int32))


def test_size_zero_arrays() -> None:
    x = np.zeros((0, 3), np.float32)
    got = run(lambda a: fnp.exp(a) + 1.0, x)
    assert got.shape == (0, 3) and got.dtype == np.float32
    assert_exact(run(lambda a: a.sum(axis=0), x), np.zeros(3, np.float32))


# --- reductions -----------------------------------------------------------------------------------

REDUCE_CASES = [
    ((1,), None), ((7,), 0), ((1009,), None), ((1009,), -1),
    ((3, 5), None), ((3, 5), 0), ((3, 5), 1), ((3, 5), -2), ((3, 5), (0, 1)),
    ((2, 3, 4), 0), ((2, 3, 4), (1,)), ((2, 3, 4), (0, 2)), ((2, 3, 4), (-1, -2)),
    ((2, 3, 4), (0, 1)), ((1, 5), 0), ((5, 1), 1), ((4, 6, 5, 3), (1, 2)), ((), None),
    ((5, 1, 7), 1), ((4, 6, 5, 3), (1, 3)), ((4, 6, 5, 3), (0, 2, 3)),
    ((3, 4099), -1),  # long rows
    ((2500, 3), 1),  # many short rows
    ((2500, 3), 0),
    ((3000, 70), 1),  # many long-ish rows
    ((70, 3000), 0),  # a strided leading-axis reduction with many outputs
]


def _n_reduced(shape: tuple[int, ...], axis: Any) -> int:
    axes = range(len(shape)) if axis is None else (axis if isinstance(axis, tuple) else (axis,))
    return math.prod(shape[a] for a in axes)


@pytest.mark.parametrize("keepdims", [False, True], ids=["", "keepdims"])
@pytest.mark.parametrize("shape,axis", REDUCE_CASES, ids=[f"{s}-{a}" for s, a in REDUCE_CASES])
def test_reductions_float32(shape: Any, axis: Any, keepdims: bool,
                            rng: np.random.Generator) -> None:
    x = randf(rng, shape, -1, 1)
    xd = x.astype(np.float64)
    outs = jit(lambda a: (fnp.sum(a, axis=axis, keepdims=keepdims),
                          fnp.max(a, axis=axis, keepdims=keepdims),
                          a.min(axis=axis, keepdims=keepdims),
                          fnp.mean(a, axis=axis, keepdims=keepdims)))(x)
    s, mx, mn, mean = (np.asarray(o) for o in outs)
    n = _n_reduced(shape, axis)
    abs_sum = np.abs(xd).sum(axis=axis, keepdims=keepdims)
    assert_sum_close(s, xd.sum(axis=axis, keepdims=keepdims), abs_sum, n)
    assert_exact(mx, x.max(axis=axis, keepdims=keepdims))
    assert_exact(mn, x.min(axis=axis, keepdims=keepdims))
    # the mean adds one division (2.5 ULP) to the sum's error
    assert_sum_close(mean, xd.mean(axis=axis, keepdims=keepdims), abs_sum / n + 0.0, n)


@pytest.mark.parametrize("shape,axis", [((1009,), None), ((3, 5), 1), ((2, 3, 4), (0, 2)),
                                        ((2500, 3), 1), ((70, 300), 0), ((3, 4099), -1)],
                         ids=str)
@pytest.mark.parametrize("dtype", ["int32", "uint32"])
def test_reductions_int_exact(dtype: str, shape: Any, axis: Any,
                              rng: np.random.Generator) -> None:
    """Integer sums are exact modulo 2**32 (numpy sums in 64 bits; restricted to 32 bits that
    wraps); max/min exact."""
    x = rand_dtype(rng, shape, dtype)
    outs = jit(lambda a: (fnp.sum(a, axis=axis), fnp.max(a, axis=axis),
                          fnp.min(a, axis=axis, keepdims=True), a.mean(axis=axis)))(x)
    s, mx, mn, mean = (np.asarray(o) for o in outs)
    assert_exact(s, np.sum(x, axis=axis).astype(np32(np.sum(x).dtype)))
    assert s.dtype == np.dtype(dtype)
    assert_exact(mx, np.max(x, axis=axis))
    assert_exact(mn, np.min(x, axis=axis, keepdims=True))
    n = _n_reduced(shape, axis)
    # mean of ints is float32: each int rounds to float32 (one ULP), then a float32 sum
    xd = x.astype(np.float64)
    assert_sum_close(mean, xd.mean(axis=axis), np.abs(xd).sum(axis=axis) / n * 2, n)


@pytest.mark.parametrize("shape,axis", [((1009,), None), ((6, 9), 0), ((2, 3, 4), (0, 2))],
                         ids=str)
@pytest.mark.parametrize("name", ["sum", "max", "min"])
def test_reductions_bool(name: str, shape: Any, axis: Any, rng: np.random.Generator) -> None:
    """sum of bools counts (int32); max is any, min is all (bool)."""
    x = rng.random(shape) < 0.5
    fn = {"sum": fnp.sum, "max": fnp.max, "min": fnp.min}[name]
    want = {"sum": lambda a: np.sum(a, axis=axis).astype(np.int32),
            "max": lambda a: np.max(a, axis=axis), "min": lambda a: np.min(a, axis=axis)}[name]
    assert_exact(run(lambda a: fn(a, axis=axis), x), want(x))


def test_reduction_of_fused_movement_prologue(rng: np.random.Generator) -> None:
    """Reductions over transposed / broadcast / computed inputs."""
    x = randf(rng, (5, 7))
    y = randf(rng, (7,))
    outs = jit(lambda a, b: ((a.T * 2.0).sum(axis=1), fnp.sum(fnp.broadcast_to(b, (4, 7)), 0),
                             fnp.max(fnp.exp(a) + b, axis=0), (a * a).mean(),
                             fnp.sum(fnp.expand_dims(a.T, 0) + fnp.expand_dims(b, 1),
                                     axis=(0, 2))))(x, y)
    xd, yd = f64(x, y)
    s1, s2, m, mean, s3 = (np.asarray(o) for o in outs)
    assert_sum_close(s1, (xd.T * 2).sum(1), np.abs(xd.T * 2).sum(1), 5)
    assert_sum_close(s2, np.broadcast_to(yd, (4, 7)).sum(0), 4 * np.abs(yd), 4)
    assert_close(m, np.max(np.exp(xd) + yd, axis=0), rtol=2e-5, atol=1e-6)
    assert_sum_close(mean, (xd * xd).mean(), (xd * xd).mean(), 35)
    ref = (xd.T[None] + yd[:, None]).sum(axis=(0, 2))
    assert_sum_close(s3, ref, np.abs(xd.T[None] + yd[:, None]).sum(axis=(0, 2)), 5)


# --- matmul ---------------------------------------------------------------------------------------

MKN = [(1, 1, 1), (1, 3, 17), (3, 16, 1), (16, 16, 16), (17, 31, 33), (33, 17, 16),
       (100, 33, 31), (31, 100, 3), (1, 100, 100), (100, 1, 17), (16, 17, 100), (7, 33, 100)]


def assert_matmul_close(got: np.ndarray, a: np.ndarray, b: np.ndarray, k: int) -> None:
    ad, bd = f64(a, b)
    want = np.matmul(ad, bd)
    scale = np.matmul(np.abs(ad), np.abs(bd))
    assert got.dtype == np.float32, got.dtype
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    err = np.abs(got - want)
    bound = 1e-6 * math.sqrt(k) * scale + 1e-30
    assert (err <= bound).all(), f"worst error {err.max():.3g} (bound {bound.max():.3g})"


@pytest.mark.parametrize("m,k,n", MKN, ids=[f"{m}x{k}x{n}" for m, k, n in MKN])
def test_matmul_2d(m: int, k: int, n: int, rng: np.random.Generator) -> None:
    a, b = randf(rng, (m, k)), randf(rng, (k, n))
    assert_matmul_close(run(lambda x, y: x @ y, a, b), a, b, k)


@pytest.mark.parametrize("sa,sb", [
    ((17,), (17, 5)), ((33, 17), (17,)), ((31,), (31,)), ((1,), (1, 3)),
    ((4, 5, 6), (6, 3)), ((6,), (2, 6, 3)), ((2, 1, 5, 7), (3, 7, 4)), ((3, 17, 20), (3, 20, 18)),
    ((5, 7), (2, 3, 7, 1)), ((2, 3, 7), (7,)),
], ids=str)
def test_matmul_numpy_shapes(sa: Any, sb: Any, rng: np.random.Generator) -> None:
    """1-D operands and broadcast batch dimensions follow numpy."""
    a, b = randf(rng, sa), randf(rng, sb)
    got = run(fnp.matmul, a, b)
    assert_matmul_close(got, a, b, sa[-1])


@pytest.mark.parametrize("dtype", ["int32", "uint32"])
def test_matmul_int_exact(dtype: str, rng: np.random.Generator) -> None:
    """Integer matmul is exact; with full-range values it wraps modulo 2**32 like numpy's."""
    for sa, sb, full in [((17, 33), (33, 5), False), ((3, 4, 20), (20, 6), True)]:
        a = rand_dtype(rng, sa, dtype, small=not full)
        b = rand_dtype(rng, sb, dtype, small=not full)
        want = np.matmul(a.astype(np.int64), b.astype(np.int64)).astype(dtype)
        assert_exact(run(lambda x, y: x @ y, a, b), want)


@pytest.mark.parametrize("sa,sb", [((7,), (7,)), ((5, 7), (7,)), ((7,), (7, 4)), ((5, 7), (7, 4)),
                                   ((2, 3, 4), (5, 4, 6)), ((3, 4), (2, 4, 5)),
                                   ((2, 3, 4), (4,))], ids=str)
def test_dot(sa: Any, sb: Any, rng: np.random.Generator) -> None:
    a, b = randf(rng, sa), randf(rng, sb)
    got = run(fnp.dot, a, b)
    ad, bd = f64(a, b)
    want, scale = np.dot(ad, bd), np.dot(np.abs(ad), np.abs(bd))
    assert got.dtype == np.float32 and got.shape == want.shape, (got.shape, want.shape)
    assert (np.abs(got - want) <= 1e-6 * math.sqrt(sa[-1]) * scale + 1e-30).all()


def test_dot_int32_and_scalar(rng: np.random.Generator) -> None:
    a = randi32(rng, (2, 3, 4), -100, 100)
    b = randi32(rng, (5, 4, 6), -100, 100)
    assert_exact(run(fnp.dot, a, b), np.dot(a, b).astype(np.int32))
    x = randf(rng, (6,))
    assert_close(run(lambda v: fnp.dot(v, 2.0), x), x.astype(np.float64) * 2.0, 1e-7, 0.0)


def test_matmul_mixed_dtypes(rng: np.random.Generator) -> None:
    """int32 @ float32 is float32, int32 @ uint32 is int32 (numpy's rules restricted to 32 bits)."""
    ai = randi32(rng, (5, 6), -20, 20)
    bf = randf(rng, (6, 3))
    bu = randu32(rng, (6, 3), 0, 20)
    got = run(lambda p, q: p @ q, ai, bf)
    assert_matmul_close(got, ai.astype(np.float32), bf, 6)
    assert_exact(run(lambda p, q: p @ q, ai, bu), (ai.astype(np.int64) @ bu).astype(np.int32))


def test_matmul_with_fused_prologue_and_epilogue(rng: np.random.Generator) -> None:
    x = randf(rng, (20, 17))
    w = randf(rng, (20, 33))
    b = randf(rng, (33,))
    got = run(lambda p, q, r: fnp.exp(p.T * 0.5) @ (q + 1.0) + r, x, w, b)
    xd, wd, bd = f64(x, w, b)
    lhs = np.exp(xd.T * 0.5)
    want = lhs @ (wd + 1.0) + bd
    scale = np.abs(lhs) @ np.abs(wd + 1.0) + np.abs(bd)
    # exp adds its table tolerance to each product
    assert (np.abs(got - want) <= (1e-6 * math.sqrt(20) + 2e-5) * scale).all()


# --- movement ops ---------------------------------------------------------------------------------

MOVEMENT_CASES: list[tuple[str, Callable[..., Any], Callable[..., Any], tuple[Any, ...]]] = [
    ("transpose_default", fnp.transpose, np.transpose, ((3, 4, 5),)),
    ("transpose_perm", lambda a: fnp.transpose(a, (1, 0, 2)),
     lambda a: np.transpose(a, (1, 0, 2)), ((3, 4, 5),)),
    ("transpose_neg_perm", lambda a: fnp.transpose(a, (-1, 0, 1)),
     lambda a: np.transpose(a, (-1, 0, 1)), ((3, 4, 5),)),
    ("T", lambda a: a.T, lambda a: a.T, ((7, 3),)),
    ("transpose_method", lambda a: a.transpose(2, 0, 1), lambda a: a.transpose(2, 0, 1),
     ((2, 3, 5),)),
    ("transpose_4d", lambda a: fnp.transpose(a, (3, 1, 0, 2)),
     lambda a: np.transpose(a, (3, 1, 0, 2)), ((2, 3, 4, 5),)),
    ("reshape_minus1", lambda a: fnp.reshape(a, (-1, 5)), lambda a: a.reshape(-1, 5),
     ((3, 4, 5),)),
    ("reshape_method", lambda a: a.reshape(4, -1) * 2.0, lambda a: a.reshape(4, -1) * 2.0,
     ((3, 4, 5),)),
    ("reshape_to_scalar", lambda a: fnp.reshape(a, ()) + 1.0, lambda a: a.reshape(()) + 1.0,
     ((1, 1),)),
    ("broadcast_to", lambda a: fnp.broadcast_to(a, (2, 3, 4, 5)),
     lambda a: np.broadcast_to(a, (2, 3, 4, 5)), ((4, 1),)),
    ("broadcast_scalar", lambda a: fnp.broadcast_to(a, (3, 2)),
     lambda a: np.broadcast_to(a, (3, 2)), ((),)),
    ("expand_dims_0", lambda a: fnp.expand_dims(a, 0) + 0.5,
     lambda a: np.expand_dims(a, 0) + 0.5, ((3, 4),)),
    ("expand_dims_neg", lambda a: fnp.expand_dims(a, -1) - 1.0,
     lambda a: np.expand_dims(a, -1) - 1.0, ((3, 4),)),
    ("expand_dims_tuple", lambda a: fnp.expand_dims(a, (0, 2)) + 1.0,
     lambda a: np.expand_dims(a, (0, 2)) + 1.0, ((3, 4),)),
    ("squeeze_all", lambda a: fnp.squeeze(a) + 1.0, lambda a: np.squeeze(a) + 1.0,
     ((1, 3, 1, 4),)),
    ("squeeze_axis", lambda a: fnp.squeeze(a, axis=2) + 1.0,
     lambda a: np.squeeze(a, axis=2) + 1.0, ((1, 3, 1, 4),)),
    ("compose_T_mul_reshape", lambda a, b: (a.T * b).reshape(-1, 3),
     lambda a, b: (a.T * b).reshape(-1, 3), ((4, 6), (4,))),
    ("compose_reshape_T", lambda a: fnp.reshape(a, (6, 4)).T + a.reshape(4, 6),
     lambda a: a.reshape(6, 4).T + a.reshape(4, 6), ((2, 3, 4),)),
    ("compose_broadcast_transpose",
     lambda a: fnp.transpose(fnp.broadcast_to(a, (3, 4, 5)), (2, 0, 1)) * 3.0,
     lambda a: np.transpose(np.broadcast_to(a, (3, 4, 5)), (2, 0, 1)) * 3.0, ((4, 1),)),
    ("compose_T_T", lambda a: a.T.reshape(-1).reshape(5, 3).T - a.reshape(3, 5),
     lambda a: a.T.reshape(-1).reshape(5, 3).T - a.reshape(3, 5), ((3, 5),)),
    ("transpose_of_elementwise", lambda a, b: fnp.transpose(a + b, (1, 2, 0)),
     lambda a, b: np.transpose(a + b, (1, 2, 0)), ((2, 1, 5), (3, 1))),
]


@pytest.mark.parametrize("name,fn,ref,shapes", MOVEMENT_CASES,
                         ids=[c[0] for c in MOVEMENT_CASES])
def test_movement(name: str, fn: Any, ref: Any, shapes: Any, rng: np.random.Generator) -> None:
    """Movement ops move no data arithmetic: results are bit-exact (float32 reference)."""
    args = [randf(rng, s, -4, 4) for s in shapes]
    want = np.asarray(ref(*args))
    assert_exact(run(fn, *args), want.astype(np.float32))


def test_movement_int_and_bool(rng: np.random.Generator) -> None:
    x = randi32(rng, (3, 4, 5))
    c = rng.random((4, 1)) < 0.5
    outs = jit(lambda a, b: (a.T, fnp.reshape(a, (5, -1)), fnp.broadcast_to(b, (2, 4, 3)),
                             fnp.transpose(b), fnp.squeeze(fnp.expand_dims(a, 1), 1)))(x, c)
    wants = [x.T, x.reshape(5, -1), np.broadcast_to(c, (2, 4, 3)), c.T, x]
    for got, want in zip(outs, wants):
        assert_exact(np.asarray(got), want)


def test_fill_functions(rng: np.random.Generator) -> None:
    x = randf(rng, (3, 5))
    xi = randi32(rng, (4,))
    outs = jit(lambda a, b: (fnp.zeros_like(a), fnp.ones_like(a), fnp.zeros_like(b),
                             fnp.ones_like(b, dtype="float32"), fnp.full((2, 3), 2.5),
                             fnp.full((7,), 7, dtype="int32"), fnp.full((3,), True),
                             fnp.full((2, 2), 3, dtype=np.uint32), fnp.ones_like(a) * a,
                             fnp.full((4,), -1.5, dtype="float32"), fnp.full((), 2.5),
                             fnp.zeros_like(a, dtype=bool)))(x, xi)
    wants = [np.zeros_like(x), np.ones_like(x), np.zeros_like(xi), np.ones_like(xi, np.float32),
             np.full((2, 3), 2.5, np.float32), np.full((7,), 7, np.int32), np.full((3,), True),
             np.full((2, 2), 3, np.uint32), x, np.full((4,), -1.5, np.float32),
             np.full((), 2.5, np.float32), np.zeros_like(x, dtype=bool)]
    for got, want in zip(outs, wants):
        assert_exact(np.asarray(got), want)


def test_zero_dim_bool_results(rng: np.random.Generator) -> None:
    """0-d bool outputs (a comparison of scalars, full((), True), any/all of a vector)."""
    x = np.float32(rng.uniform(-1, 1))
    assert_exact(run(lambda a, b: a > b, x, np.float32(0.0)), np.asarray(x > 0))
    assert_exact(run(lambda a: fnp.full((), True) == (a == a), x), np.asarray(True))
    v = rng.random(9) < 0.5
    assert_exact(run(lambda a: fnp.sum(a) > 3, v), np.asarray(v.sum() > 3))


@pytest.mark.parametrize("lo,hi", [(-0.5, 0.5), (None, 0.0), (0.0, None), (0.25, 0.25)], ids=str)
def test_clip(lo: Any, hi: Any, rng: np.random.Generator) -> None:
    x = randf(rng, (257,))
    assert_exact(run(lambda a: fnp.clip(a, lo, hi), x), np.clip(x, lo, hi).astype(np.float32))


def test_clip_array_bounds(rng: np.random.Generator) -> None:
    x = randf(rng, (5, 6), -2, 2)
    lo = randf(rng, (6,), -1, 0)
    hi = randf(rng, (5, 1), 0, 1)
    assert_exact(run(fnp.clip, x, lo, hi), np.clip(x, lo, hi))


def test_where_broadcasting_mixed(rng: np.random.Generator) -> None:
    c = rng.random((4, 1)) < 0.5
    x = randf(rng, (1, 5))
    got = run(lambda cond, a: fnp.where(cond, a, 0.0), c, x)
    assert_exact(got, np.where(c, x, np.float32(0.0)))
    got = run(lambda a: fnp.where(a > 0, a, -a), x)
    assert_exact(got, np.abs(x))
    xi = randi32(rng, (3,), -5, 5)
    assert_exact(run(lambda cond, a: fnp.where(cond, a, 1), c, xi),
                 np.where(c, xi, np.int32(1)))


# --- nn -------------------------------------------------------------------------------------------


def _tol(op: Op) -> tuple[float, float]:
    return ELEMENTWISE[op].tol


def ref_sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def ref_gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def ref_gelu_tanh_exact(x: np.ndarray) -> np.ndarray:
    """ref_gelu_tanh without its cancellation for negative x (1 + tanh(u) is 0 in float64 below
    x = -6 or so): the same function, 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u))."""
    return x / (1.0 + np.exp(-2.0 * math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def ref_gelu_erf(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np_erf(x / math.sqrt(2.0)))


EXP_R, EXP_A = _tol(Op.EXP)
TANH_R, TANH_A = _tol(Op.TANH)
ERF_R, ERF_A = _tol(Op.ERF)
XMAX = 6.0  # activations are tested on [-6, 6]

# (fn, float64 reference, (rtol, atol)); tolerances are built from the op table's: a composite
# inherits the error of its transcendental part (scaled by how the rest of the formula uses it)
# plus a few float32 roundings.
ACTIVATIONS: list[tuple[str, Callable[..., Any], Callable[..., Any], tuple[float, float]]] = [
    ("relu", nn.relu, lambda x: np.maximum(x, 0.0), (0.0, 0.0)),
    ("sigmoid", nn.sigmoid, ref_sigmoid, (EXP_R + 4 * U32, EXP_A)),
    ("tanh", nn.tanh, np.tanh, (TANH_R, TANH_A)),
    ("silu", nn.silu, lambda x: x * ref_sigmoid(x), (EXP_R + 5 * U32, EXP_A * XMAX)),
    ("swish", nn.swish, lambda x: x * ref_sigmoid(x), (EXP_R + 5 * U32, EXP_A * XMAX)),
    # 0.5 x (1 + tanh(z)): an absolute error e in tanh gives 0.5 |x| e
    ("gelu_tanh", nn.gelu, ref_gelu_tanh, (4 * U32, 0.5 * XMAX * (TANH_R + TANH_A))),
    ("gelu_tanh_explicit", lambda x: nn.gelu(x, approximate="tanh"), ref_gelu_tanh,
     (4 * U32, 0.5 * XMAX * (TANH_R + TANH_A))),
    ("gelu_erf", lambda x: nn.gelu(x, approximate="none"), ref_gelu_erf,
     (4 * U32, 0.5 * XMAX * (ERF_R + ERF_A))),
    ("leaky_relu", nn.leaky_relu, lambda x: np.where(x >= 0, x, 0.01 * x), (2 * U32, 0.0)),
    ("leaky_relu_0.2", lambda x: nn.leaky_relu(x, negative_slope=0.2),
     lambda x: np.where(x >= 0, x, 0.2 * x), (2 * U32, 0.0)),
    # alpha (e^x - 1): absolute error of e^x (<= 1 for x <= 0) survives the subtraction
    ("elu", nn.elu, lambda x: np.where(x > 0, x, np.expm1(x)), (EXP_R, EXP_R + EXP_A)),
    ("elu_alpha", lambda x: nn.elu(x, alpha=0.5), lambda x: np.where(x > 0, x, 0.5 * np.expm1(x)),
     (EXP_R, EXP_R + EXP_A)),
]


@pytest.mark.parametrize("shape", [(1,), (7,), (4, 33), (1009,)], ids=str)
@pytest.mark.parametrize("name,fn,ref,tol", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_activations(name: str, fn: Any, ref: Any, tol: tuple[float, float], shape: Any,
                     rng: np.random.Generator) -> None:
    x = randf(rng, shape, -XMAX, XMAX)
    x.flat[0] = 0.0
    assert_close(run(lambda a: fn(a), x), ref(x.astype(np.float64)), *tol)


SATURATING = [
    ("relu", nn.relu, lambda x: np.maximum(x, 0.0)),
    ("sigmoid", nn.sigmoid, ref_sigmoid),
    ("silu", nn.silu, lambda x: x * ref_sigmoid(x)),
    ("tanh", nn.tanh, np.tanh),
    ("gelu_tanh", nn.gelu, ref_gelu_tanh),
    ("gelu_erf", lambda x: nn.gelu(x, approximate="none"), ref_gelu_erf),
    ("elu", nn.elu, lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0)))),
    ("leaky_relu", nn.leaky_relu, lambda x: np.where(x >= 0, x, 0.01 * x)),
]


@pytest.mark.parametrize("name,fn,ref", SATURATING, ids=[c[0] for c in SATURATING])
def test_activations_saturate(name: str, fn: Any, ref: Any) -> None:
    """Far from 0 activations reach their limits cleanly: no inf - inf or 0 * inf NaNs."""
    x = np.array([-1000.0, -100.0, -30.0, -15.0, -8.0, 8.0, 15.0, 30.0, 100.0, 1000.0],
                 np.float32)
    with np.errstate(over="ignore", under="ignore"):
        want = ref(x.astype(np.float64))
    got = run(lambda a: fn(a), x)
    assert np.isfinite(got).all(), got
    # relative error of the transcendental part, absolute error relative to the input's size
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_softmax_large_and_equal_inputs() -> None:
    x = np.array([[1000.0, 1000.0, -1000.0, 0.0], [5.0, 5.0, 5.0, 5.0], [-1e4, 0.0, 1e4, 1e4]],
                 np.float32)
    sm, lsm = jit(lambda a: (nn.softmax(a), nn.log_softmax(a)))(x)
    xd = x.astype(np.float64)
    np.testing.assert_allclose(np.asarray(sm), ref_softmax(xd, -1), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(lsm), ref_log_softmax(xd, -1), rtol=1e-6, atol=1e-6)
    ln, rms = jit(lambda a: (nn.layer_norm(a), nn.rms_norm(a * 0.0)))(x)
    assert_close(np.asarray(ln)[1], np.zeros(4), 0.0, 0.0)  # constant row: exactly 0
    assert_close(np.asarray(rms), np.zeros((3, 4)), 0.0, 0.0)


def ref_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def ref_log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    s = x - x.max(axis=axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


def ref_layer_norm(x: np.ndarray, w: Any, b: Any, axis: int, eps: float) -> np.ndarray:
    mu = x.mean(axis=axis, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axis, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


def ref_rms_norm(x: np.ndarray, w: Any, axis: int, eps: float) -> np.ndarray:
    y = x / np.sqrt((x * x).mean(axis=axis, keepdims=True) + eps)
    return y * w if w is not None else y


NORM_CASES = [((7,), -1), ((4, 33), -1), ((4, 33), 0), ((3, 5, 17), 1), ((3, 5, 17), -1),
              ((2, 300), 1)]


@pytest.mark.parametrize("shape,axis", NORM_CASES, ids=str)
def test_softmax_and_log_softmax(shape: Any, axis: int, rng: np.random.Generator) -> None:
    x = randf(rng, shape, -5, 5)
    n = shape[axis]
    sm, lsm = jit(lambda a: (nn.softmax(a, axis=axis), nn.log_softmax(a, axis=axis)))(x)
    xd = x.astype(np.float64)
    # exp of the shifted values (<= 10 in magnitude: 23 ULP, inside the exp tolerance), the
    # float32 row sum (1e-5 log2 n relative, all terms positive) and one division
    srt = 2 * EXP_R + 1e-5 * max(1.0, math.log2(n))
    assert_close(np.asarray(sm), ref_softmax(xd, axis), srt, EXP_A)
    # log of the sum: log's own tolerance on a value <= log(n), plus the sum's relative error
    log_r, log_a = _tol(Op.LOG)
    assert_close(np.asarray(lsm), ref_log_softmax(xd, axis), 4 * U32,
                 log_r * math.log(n + 1) + log_a + srt + 10 * U32)
    if axis in (-1, len(shape) - 1):  # default axis
        assert_close(run(lambda a: nn.softmax(a), x), ref_softmax(xd, -1), srt, EXP_A)


@pytest.mark.parametrize("affine", ["none", "weight", "weight_bias", "bias"])
@pytest.mark.parametrize("shape,axis", NORM_CASES, ids=str)
def test_layer_norm(shape: Any, axis: int, affine: str, rng: np.random.Generator) -> None:
    x = randf(rng, shape, -2, 3)
    n = shape[axis]
    wshape = tuple(shape[axis] if k == axis % len(shape) else 1
                   for k in range(len(shape)))[axis % len(shape):]
    w = randf(rng, wshape, 0.5, 1.5) if "weight" in affine else None
    b = randf(rng, wshape, -1, 1) if "bias" in affine else None
    xd = x.astype(np.float64)
    want = ref_layer_norm(xd, None if w is None else w.astype(np.float64),
                          None if b is None else b.astype(np.float64), axis, 1e-5)
    if affine == "none":
        got = run(lambda a: nn.layer_norm(a, axis=axis), x)
    elif affine == "bias":
        got = run(lambda a, c: nn.layer_norm(a, bias=c, axis=axis), x, b)
    elif affine == "weight":
        got = run(lambda a, v: nn.layer_norm(a, v, axis=axis), x, w)
    else:
        got = run(lambda a, v, c: nn.layer_norm(a, v, c, axis=axis), x, w, b)
    # mean and variance carry the float32 sum error (1e-5 log2 n relative to sum |x|); the
    # normalised value is O(1) (x spans [-2, 3], its deviation is O(1)), so that error appears as
    # both a relative and an absolute error, times a small factor for the mean's error entering
    # the variance and |w| <= 1.5
    t = 4e-5 * max(1.0, math.log2(n)) + _tol(Op.RSQRT)[0]
    assert_close(got, want, t, t)


@pytest.mark.parametrize("eps", [1e-6, 1e-2])
@pytest.mark.parametrize("with_weight", [False, True], ids=["", "weight"])
@pytest.mark.parametrize("shape,axis", NORM_CASES, ids=str)
def test_rms_norm(shape: Any, axis: int, with_weight: bool, eps: float,
                  rng: np.random.Generator) -> None:
    x = randf(rng, shape, -2, 3)
    n = shape[axis]
    wshape = tuple(shape[axis] if k == axis % len(shape) else 1
                   for k in range(len(shape)))[axis % len(shape):]
    w = randf(rng, wshape, 0.5, 1.5) if with_weight else None
    if with_weight:
        got = run(lambda a, v: nn.rms_norm(a, v, axis=axis, eps=eps), x, w)
    else:
        got = run(lambda a: nn.rms_norm(a, axis=axis, eps=eps), x)
    want = ref_rms_norm(x.astype(np.float64), None if w is None else w.astype(np.float64), axis,
                        eps)
    # a sum of squares (all positive: 1e-5 log2 n relative), rsqrt, two multiplications
    t = 1e-5 * max(1.0, math.log2(n)) + _tol(Op.RSQRT)[0] + 4 * U32
    assert_close(got, want, t, 1e-6)


def test_gelu_keeps_its_relative_accuracy_for_negative_inputs(rng: np.random.Generator) -> None:
    """gelu(x) for x from -9 to -0.5 is small (down to 1e-28) but within exp's relative error (the
    op table's) and a few roundings of the float64 formula: nn.gelu's x / (1 + exp(-2u)) does
    not subtract, where 0.5 x (1 + tanh(u)) cancels (10% off near -9 in float32). Also inside a
    matmul's epilogue, at 1031 columns (not a multiple of 4)."""
    x = np.concatenate([np.linspace(-9.0, -0.5, 4001), rng.uniform(-9.0, -0.5, 999)])
    x = x.astype(np.float32)
    want = ref_gelu_tanh_exact(x.astype(np.float64))
    got = np.asarray(jit(nn.gelu)(x)).astype(np.float64)
    rel = np.abs(got - want) / np.abs(want)
    assert rel.max() <= EXP_R + 8 * U32, (rel.max(), x[np.argmax(rel)])
    a = randf(rng, (7, 13), -1, 1)
    w = randf(rng, (13, 1031), -1, 1)
    h = (a.astype(np.float64) @ w.astype(np.float64)) * 3 - 4  # mostly negative
    hw = np.asarray(jit(lambda a, w: nn.gelu(a @ w * 3.0 - 4.0))(a, w)).astype(np.float64)
    # the product's own rounding (K = 13) passes through gelu's slope, as in any epilogue
    slope = np.abs(np.gradient(ref_gelu_tanh(np.linspace(-10, 0, 100001)), 1e-4)).max()
    err = np.abs(hw - ref_gelu_tanh_exact(h))
    assert (err <= (EXP_R + 8 * U32) * np.abs(ref_gelu_tanh_exact(h))
            + slope * 3 * 13 * 4 * U32 * (np.abs(a) @ np.abs(w)) + 1e-30).all(), err.max()


def test_jit_of_functions_with_default_arguments(rng: np.random.Generator) -> None:
    """A parameter the caller did not pass keeps its Python default; it is not turned into a
    traced array (jax.jit(jax.nn.softmax)(x) works the same way). nn functions can be jitted
    directly."""
    x = randf(rng, (4, 9), -3, 3)
    xd = x.astype(np.float64)
    assert_close(np.asarray(jit(nn.softmax)(x)), ref_softmax(xd, -1), 5e-5, 1e-6)
    assert_close(np.asarray(jit(nn.gelu)(x)), ref_gelu_tanh(xd), 4 * U32, 1e-4)

    def row_sum(a, axis=-1):  # type: ignore[no-untyped-def]
        return fnp.sum(a, axis=axis)

    assert_sum_close(np.asarray(jit(row_sum)(x)), xd.sum(-1), np.abs(xd).sum(-1), 9)


def test_nn_block_fused(rng: np.random.Generator) -> None:
    """DESIGN.md's example: gelu(x @ w + b), then a layer_norm and a softmax, all in one jit."""
    x = randf(rng, (9, 20))
    w = randf(rng, (20, 17))
    b = randf(rng, (17,))
    out = jit(lambda p, q, r: nn.softmax(nn.layer_norm(nn.gelu(p @ q + r)), axis=-1))(x, w, b)
    xd, wd, bd = f64(x, w, b)
    want = ref_softmax(ref_layer_norm(ref_gelu_tanh(xd @ wd + bd), None, None, -1, 1e-5), -1)
    assert_close(np.asarray(out), want, 2e-4, 1e-5)


# --- whole programs: several outputs, aliases, fusion on and off ---------------------------------


def test_multiple_outputs_shapes_and_aliases(rng: np.random.Generator) -> None:
    """Outputs of different shapes from shared inputs, an output that is an input, a reshape of an
    input, a value returned twice, a Python scalar, and a value both returned and reduced."""
    x = randf(rng, (3, 1))
    y = randf(rng, (1, 4))

    def f(a, b):  # type: ignore[no-untyped-def]
        e = fnp.exp(a * b)
        return {"small": a * 2.0, "big": a * b, "same": a, "flat": fnp.reshape(b, (4,)),
                "e": e, "e_sum": e.sum(axis=1), "twice": (e, e), "lit": 2.5}

    out = jit(f)(x, y)
    xd, yd = f64(x, y)
    ed = np.exp(xd * yd)
    assert_close(np.asarray(out["small"]), xd * 2, 0.0, 0.0)
    assert_close(np.asarray(out["big"]), xd * yd, *_tol(Op.MUL))
    assert_exact(np.asarray(out["same"]), x)
    assert_exact(np.asarray(out["flat"]), y.reshape(4))
    assert_close(np.asarray(out["e"]), ed, *_tol(Op.EXP))
    assert_close(np.asarray(out["twice"][0]), ed, *_tol(Op.EXP))
    assert_close(np.asarray(out["twice"][1]), ed, *_tol(Op.EXP))
    assert_close(np.asarray(out["e_sum"]), ed.sum(1), EXP_R + 1e-5 * 2, EXP_A)
    assert float(np.asarray(out["lit"])) == 2.5


def test_results_survive_later_calls(rng: np.random.Generator) -> None:
    """Each call's outputs are its own: reading the first result after later calls (readback is
    lazy) gives the first call's values, also for multi-kernel functions with intermediates."""
    f = jit(lambda a: (nn.softmax(a * 2.0, axis=-1), (a @ a.T).sum(axis=0)))
    xs = [randf(rng, (5, 8)) for _ in range(3)]
    results = [f(x) for x in xs]
    for x, (sm, mm) in zip(xs, results):
        xd = x.astype(np.float64)
        assert_close(np.asarray(sm), ref_softmax(xd * 2, -1), 5e-5, 1e-6)
        assert_sum_close(np.asarray(mm), (xd @ xd.T).sum(0), (np.abs(xd) @ np.abs(xd).T).sum(0),
                         40)


def test_many_inputs_with_a_small_binding_limit(monkeypatch: pytest.MonkeyPatch,
                                                rng: np.random.Generator) -> None:
    """A fused sum of 12 arrays must be split when a kernel may bind only 4 storage buffers."""
    xs = [randf(rng, (17,)) for _ in range(12)]

    def f(*a):  # type: ignore[no-untyped-def]
        acc = a[0]
        for t in a[1:]:
            acc = acc + t * 1.5
        return acc

    want = xs[0].astype(np.float64) + 1.5 * sum(x.astype(np.float64) for x in xs[1:])
    abs_sum = np.abs(xs[0]) + 1.5 * sum(np.abs(x.astype(np.float64)) for x in xs[1:])
    for limit in ("4", "32"):
        monkeypatch.setenv("FUSEC_MAX_STORAGE_BUFFERS", limit)
        got = np.asarray(jit(f)(*xs))
        assert_sum_close(got, want, abs_sum, 24)


COMPOSITES = [
    ("chain", lambda a, b: fnp.tanh(fnp.exp(-a * a) * b + 1.0) / (1.0 + fnp.abs(b)),
     lambda a, b: np.tanh(np.exp(-a * a) * b + 1.0) / (1.0 + np.abs(b)), 5e-5),
    ("reduce_epilogue", lambda a, b: fnp.sum(a * b, axis=1) * 2.0 + fnp.max(b, axis=1),
     lambda a, b: (a * b).sum(1) * 2.0 + b.max(1), 1e-5),
    ("matmul_softmax", lambda a, b: nn.softmax(a @ b.T, axis=0),
     lambda a, b: ref_softmax(a @ b.T, 0), 1e-4),
    ("broadcast_where", lambda a, b: fnp.where(a > b.mean(), fnp.sqrt(fnp.abs(a)), b.T.sum()),
     lambda a, b: np.where(a > b.mean(), np.sqrt(np.abs(a)), b.T.sum()), 1e-5),
]


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("name,fn,ref,rtol", COMPOSITES, ids=[c[0] for c in COMPOSITES])
def test_composites_fused_and_unfused(name: str, fn: Any, ref: Any, rtol: float, fuse: bool,
                                      rng: np.random.Generator) -> None:
    a = randf(rng, (6, 9), -2, 2)
    b = randf(rng, (6, 9), -2, 2)
    got = run(fn, a, b, fuse=fuse)
    assert_close(got, ref(*f64(a, b)), rtol, 1e-5)


def test_where_with_non_bool_condition(rng: np.random.Generator) -> None:
    """numpy treats a non-bool condition as != 0."""
    c = rng.integers(-1, 2, (4, 5)).astype(np.float32)
    ci = rng.integers(-1, 2, (5,)).astype(np.int32)
    x = randf(rng, (4, 5))
    outs = jit(lambda cond, cond_i, a: (fnp.where(cond, a, -1.0), fnp.where(cond_i, a, 0.0)))(
        c, ci, x)
    assert_exact(np.asarray(outs[0]), np.where(c, x, np.float32(-1.0)))
    assert_exact(np.asarray(outs[1]), np.where(ci, x, np.float32(0.0)))


INTERPRETER_CASES = [
    ("elementwise", lambda a, b: fnp.exp(a) * b + 1.0, ((3, 5), (5,))),
    ("scalar_sum", lambda a, b: (a * b).sum(), ((3, 5), (5,))),
    ("scalar_out", lambda a, b: fnp.max(a) - fnp.min(b), ((7,), (3,))),
    ("dot_1d", lambda a, b: fnp.dot(a, b), ((9,), (9,))),
    ("reshape_0d", lambda a, b: fnp.reshape(a, ()) + b, ((1, 1), ())),
    ("softmax", lambda a, b: nn.softmax(a + b, axis=0), ((4, 6), (6,))),
]


@pytest.mark.parametrize("name,fn,shapes", INTERPRETER_CASES,
                         ids=[c[0] for c in INTERPRETER_CASES])
def test_interpreter_agrees_with_gpu(name: str, fn: Any, shapes: Any,
                                     rng: np.random.Generator) -> None:
    """The numpy interpreter of the IR is the oracle of the other test layers and the CPU
    fallback: on the traced program it must give the GPU's shapes, dtypes and values."""
    from fusec.jit import interpret_traced

    args = [randf(rng, s) for s in shapes]
    f = jit(fn)
    got_gpu = np.asarray(f(*args))
    (got_interp,) = interpret_traced(f.trace(*args), args)
    assert got_interp.shape == got_gpu.shape, (got_interp.shape, got_gpu.shape)
    assert got_interp.dtype == got_gpu.dtype, (got_interp.dtype, got_gpu.dtype)
    np.testing.assert_allclose(got_interp, got_gpu, rtol=1e-4, atol=1e-6)


# --- large grids (beyond 65535 workgroups per dimension) ------------------------------------------


def test_large_elementwise_grid(gpu_device: Any, rng: np.random.Generator) -> None:
    """2**24 + 3 float32 = 64 MiB: 65537 workgroups of 256, more than one grid dimension holds."""
    n = 2**24 + 3
    limit = gpu_device.limits.get("max-storage-buffer-binding-size", 1 << 27)
    assert 4 * n <= limit, "the large-grid test assumes a 128 MiB binding limit"
    x = rng.random(n, dtype=np.float32)
    got = run(lambda a: a * 2.0 + 1.0, x)
    want = x.astype(np.float64) * 2.0 + 1.0
    assert got.shape == (n,) and got.dtype == np.float32
    err = np.abs(got - want)
    assert (err <= 2 * U32 * want).all(), f"worst error {err.max()} at {int(err.argmax())}"
    # the tail past the first 65535 * 256 elements is where a clipped grid would leave zeros
    np.testing.assert_allclose(got[-1000:], want[-1000:], rtol=2 * U32)


@pytest.mark.parametrize("shape", [(70001, 3), (70001, 64)], ids=str)
def test_large_reduction_grid(shape: Any, rng: np.random.Generator) -> None:
    """More than 65535 outputs: short rows (a thread per output) and long rows (a workgroup per
    output: 70001 workgroups)."""
    x = randf(rng, shape)
    xd = x.astype(np.float64)
    s, mx = jit(lambda a: (a.sum(axis=-1), fnp.max(a, axis=1)))(x)
    assert_sum_close(np.asarray(s), xd.sum(-1), np.abs(xd).sum(-1), shape[1])
    assert_exact(np.asarray(mx), x.max(1))


def test_large_reduction_leading_axis(rng: np.random.Generator) -> None:
    x = randf(rng, (3, 70001))
    xd = x.astype(np.float64)
    got = run(lambda a: a.sum(axis=0), x)
    assert_sum_close(got, xd.sum(0), np.abs(xd).sum(0), 3)


def test_large_batched_matmul_grid(rng: np.random.Generator) -> None:
    """70000 independent (2, 3) @ (3, 2) products: 70000 tiles."""
    a = randf(rng, (70000, 2, 3))
    b = randf(rng, (70000, 3, 2))
    got = run(lambda p, q: p @ q, a, b)
    assert_matmul_close(got, a, b, 3)


# --- eager use outside jit ------------------------------------------------------------------------


def test_eager_fnp_on_numpy(rng: np.random.Generator) -> None:
    x = randf(rng, (5, 7), 0.5, 2)
    y = randf(rng, (7,), 0.5, 2)
    xd, yd = f64(x, y)
    r = fnp.add(x, y)
    assert isinstance(r, fusec.Array)
    assert_close(np.asarray(r), xd + yd, *_tol(Op.ADD))
    assert_close(np.asarray(fnp.exp(x)), np.exp(xd), *_tol(Op.EXP))
    assert_close(np.asarray(fnp.log(x)), np.log(xd), *_tol(Op.LOG))
    assert_close(np.asarray(fnp.power(x, 3)), xd ** 3, 5 * U32, 0.0)
    s = fnp.sum(x, axis=1)
    assert_sum_close(np.asarray(s), xd.sum(1), np.abs(xd).sum(1), 7)
    assert_matmul_close(np.asarray(fnp.matmul(x, x.T)), x, x.T, 7)
    assert_exact(np.asarray(fnp.transpose(x)), x.T)
    assert_exact(np.asarray(fnp.reshape(x, (7, 5))), x.reshape(7, 5))
    assert_exact(np.asarray(fnp.where(x > 1, x, 0.0)), np.where(x > 1, x, np.float32(0)))
    assert_close(np.asarray(nn.softmax(x)), ref_softmax(xd, -1), 5e-5, 1e-6)


def test_eager_on_device_arrays(rng: np.random.Generator) -> None:
    x = randf(rng, (4, 6), 0.5, 2)
    y = randf(rng, (6, 3), 0.5, 2)
    a, b = fusec.device_put(x), fusec.device_put(y)
    xd, yd = f64(x, y)
    c = a @ b
    assert isinstance(c, fusec.Array) and c.shape == (4, 3) and c.dtype == np.float32
    assert_matmul_close(np.asarray(c), x, y, 6)
    assert_close(np.asarray(a + a), xd + xd, *_tol(Op.ADD))
    assert_close(np.asarray(a * 2.0 - 1.0), xd * 2.0 - 1.0, 2 * U32, 0.0)
    assert_close(np.asarray(a / a), np.ones_like(xd), *_tol(Op.DIV))
    assert_close(np.asarray(-a), -xd, 0.0, 0.0)
    assert_close(np.asarray(a ** 2), xd ** 2, 2 * U32, 0.0)
    assert_exact(np.asarray(a > 1.0), x > 1.0)
    assert_exact(np.asarray(a.T), x.T)
    assert_exact(np.asarray(a.reshape(3, 8)), x.reshape(3, 8))
    assert_exact(np.asarray(a.astype("int32")), x.astype(np.int32))
    total = a.sum()
    assert isinstance(total, fusec.Array) and total.shape == ()
    assert_sum_close(np.asarray(total), xd.sum(), np.abs(xd).sum(), x.size)
    assert_sum_close(np.asarray(a.mean(axis=0)), xd.mean(0), np.abs(xd).mean(0), 4)
    assert_exact(np.asarray(a.max(axis=1)), x.max(1))
    assert_exact(np.asarray(a.min()), x.min())
    assert_close(np.asarray(fnp.exp(a)), np.exp(xd), *_tol(Op.EXP))
    assert_close(np.asarray(nn.relu(a - 1.0)), np.maximum(xd - 1.0, 0), 1e-7, 0.0)
    # numpy array on the left: Array.__radd__ runs it on the device
    r = x + a
    assert isinstance(r, fusec.Array)
    assert_close(np.asarray(r), xd + xd, *_tol(Op.ADD))
    # results feed back into jitted functions without copies
    f = jit(lambda p, q: p @ q + 1.0)
    assert_matmul_close(np.asarray(f(a, b)) - 1.0, x, y, 6)


EAGER_SCALAR_CASES = [
    # (name, call with the first scalar, call with a scalar that compares equal, expected dtypes)
    ("add_1_then_1.0", lambda x: fnp.add(x, 1), lambda x: fnp.add(x, 1.0), ("int32", "float32")),
    ("multiply_True_then_1.0", lambda x: fnp.multiply(x, True), lambda x: fnp.multiply(x, 1.0),
     ("int32", "float32")),
    ("full_1_then_1.0", lambda x: fnp.full((3,), 1), lambda x: fnp.full((3,), 1.0),
     ("int32", "float32")),
    ("where_0_then_0.0", lambda x: fnp.where(x > 2, x, 0), lambda x: fnp.where(x > 2, x, 0.0),
     ("int32", "float32")),
]


@pytest.mark.parametrize("name,first,second,dts", EAGER_SCALAR_CASES,
                         ids=[c[0] for c in EAGER_SCALAR_CASES])
def test_eager_scalar_weak_types_not_confused(name: str, first: Any, second: Any,
                                              dts: tuple[str, str]) -> None:
    """Eager calls with Python scalars of different types (1, 1.0, True) must each follow numpy's
    weak-scalar rules, whatever was called before: the scalars compare (and hash) equal as Python
    values, but they are not the same argument."""
    x = np.arange(5, dtype=np.int32)
    r1 = np.asarray(first(x))
    r2 = np.asarray(second(x))
    assert (r1.dtype, r2.dtype) == tuple(np.dtype(d) for d in dts), (r1.dtype, r2.dtype)
    np.testing.assert_array_equal(r1, r2)


def test_long_loops_stay_correct(rng: np.random.Generator) -> None:
    """Mesa's software adapter ends a shader invocation's loops after 65535 iterations in all
    (every loop of the shader counting) and carries on with wrong results. On it (the "cpu"
    target) these all passed that limit and came out wrong: four passes over 22000-long columns
    in one kernel, 100 rows of 100000 (not split: more than 64 rows), 70001-long columns of 100,
    a product with K = 2^21 + 3 (131073 steps of 16), and int32 powers with an array exponent
    summed over 22000 rows (the power's own loop counting too). Now the long loops take several
    elements per iteration and long rows are split whatever their number; any target must get
    them right."""
    x = randf(rng, (22000, 300))
    xd = x.astype(np.float64)
    f = fusec.gpu_jit(lambda a: (a.sum(axis=0), (a * a).sum(axis=0), (a + 1.0).max(axis=0),
                                 a - a.mean(axis=0)))
    s, sq, mx, centred = (np.asarray(v) for v in f(x))
    assert_sum_close(s, xd.sum(0), np.abs(xd).sum(0), 22000)
    assert_sum_close(sq, (xd * xd).sum(0), (xd * xd).sum(0), 22000)
    np.testing.assert_array_equal(mx, (x + np.float32(1.0)).max(0))
    np.testing.assert_allclose(centred, xd - xd.mean(0), rtol=1e-5, atol=1e-4)
    if fusec.default_device().adapter_type == "CPU":  # several elements per loop iteration
        assert any("r0 +" in k.wgsl for k in f.lower(x).kernels)

    rows = randf(rng, (100, 100000))
    rs, rm = (np.asarray(v) for v in fusec.gpu_jit(lambda a: (a.sum(axis=1), a.max(axis=1)))(rows))
    rd = rows.astype(np.float64)
    assert_sum_close(rs, rd.sum(1), np.abs(rd).sum(1), 100000)
    np.testing.assert_array_equal(rm, rows.max(1))

    cols = randf(rng, (70001, 100))
    cd = cols.astype(np.float64)
    assert_sum_close(run(lambda a: a.sum(axis=0), cols), cd.sum(0), np.abs(cd).sum(0), 70001)

    k = (1 << 21) + 3
    a, b = randf(rng, (1, k)), randf(rng, (k, 2))
    assert_matmul_close(run(lambda p, q: p @ q, a, b), a, b, k)

    # integer powers with an array exponent inside a row loop (the power had a loop of its own)
    base = randi32(rng, (22000, 100), -3, 4)
    ex = randi32(rng, (22000, 100), 0, 30)
    assert_exact(run(lambda p, q: (p ** q).sum(axis=0), base, ex),
                 (base ** ex).sum(0, dtype=np.int32))
