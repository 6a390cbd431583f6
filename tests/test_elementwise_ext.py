"""Numeric tests of the elementwise set beyond arithmetic: rounding, remainders, logarithms and
exponentials, trigonometric and hyperbolic functions, predicates, logical and bitwise operations,
shifts, and numpy's NaN semantics for maximum/minimum/clip/relu.

Conventions (as tests/test_numeric.py): float results are float32 computed on the GPU, compared
with numpy computed in float64 from the same float32 inputs, within the op table's ``tol``
(``fusec.ops.ELEMENTWISE[op].tol``, whose comments give the reasoning); functions that are
compositions of table ops carry their own tolerance below, with the reason. Integer and bool results
must match numpy exactly (numpy computing in the same 32-bit dtype). Every op runs inside
``@gpu_jit`` and eagerly (``fnp.op(numpy_array)``) on sizes 1, 7, 1000 and 65537 (on a GPU,
65537 elements take the several-elements-per-thread loop; 65536 the vec4 kernels, exercised by
``test_gpu_codegen_paths`` on any adapter).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import pytest

import fusec
import fusec.numpy as fnp
from fusec import nn
from fusec.errors import DTypeError, TraceError
from fusec.ir import Op
from fusec.ops import ELEMENTWISE

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
U32_MAX = 2**32 - 1
F32_MAX = float(np.finfo(np.float32).max)
SIZES = [1, 7, 1000, 65537]

Gen = Callable[[np.random.Generator, int], np.ndarray]


# --- input generators -----------------------------------------------------------------------------


def uniform(lo: float, hi: float) -> Gen:
    return lambda rng, n: rng.uniform(lo, hi, n).astype(np.float32)


def log_uniform(lo: float, hi: float, signed: bool = False) -> Gen:
    """Magnitudes spread over decades (tiny and huge values), random signs if ``signed``."""
    def g(rng: np.random.Generator, n: int) -> np.ndarray:
        v = np.exp(rng.uniform(math.log(lo), math.log(hi), n))
        if signed:
            v = v * np.where(rng.random(n) < 0.5, -1.0, 1.0)
        return v.astype(np.float32)

    return g


def one_minus(lo: float, hi: float, sign: float = 1.0) -> Gen:
    """sign * (1 - d), d log-uniform in [lo, hi]: values near the domain edges +-1."""
    return lambda rng, n: (sign * (1.0 - log_uniform(lo, hi)(rng, n))).astype(np.float32)


def one_plus(lo: float, hi: float) -> Gen:
    return lambda rng, n: (1.0 + log_uniform(lo, hi)(rng, n)).astype(np.float32)


def halves(lo: int, hi: int) -> Gen:
    """Multiples of 0.5: rounding ties."""
    return lambda rng, n: (rng.integers(lo, hi, n) * 0.5).astype(np.float32)


def with_specials(*values: float) -> Callable[[Gen], Gen]:
    def wrap(gen: Gen) -> Gen:
        def g(rng: np.random.Generator, n: int) -> np.ndarray:
            x = gen(rng, n)
            k = rng.random(n) < 0.1
            x[k] = rng.choice(np.asarray(values, np.float32), int(k.sum()))
            return x

        return g

    return wrap


def mix(*gens: Gen) -> Gen:
    """Each element drawn from one of ``gens``, chosen at random."""
    def g(rng: np.random.Generator, n: int) -> np.ndarray:
        cands = np.stack([gen(rng, n) for gen in gens])
        return cands[rng.integers(0, len(gens), n), np.arange(n)]

    return g


def away_from_zero(lo: float, hi: float) -> Gen:
    return log_uniform(lo, hi, signed=True)


ANY_FLOAT = with_specials(np.nan, np.inf, -np.inf, 0.0, -0.0)(mix(uniform(-10, 10),
                                                                  log_uniform(1e-30, 1e30, True)))


# --- the table ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    fn: Callable[..., Any]  # the fusec.numpy function
    ref: Callable[..., Any]  # numpy reference, run on float64 copies of the inputs
    gens: tuple[Gen, ...]  # random inputs, one generator per operand
    op: Optional[Op] = None  # the table row whose tol applies
    tol: Optional[tuple[float, float]] = None  # for compositions of rows: (rtol, atol)
    exact: bool = False  # bool/predicate results: equal

    def tolerance(self) -> tuple[float, float]:
        if self.tol is not None:
            return self.tol
        assert self.op is not None
        return ELEMENTWISE[self.op].tol


ROUNDING = mix(uniform(-100, 100), halves(-400, 400), log_uniform(1e-3, 1e9, True))
DIVIDEND = mix(uniform(-100, 100), log_uniform(1e-3, 1e30, True))
DIVISOR = mix(away_from_zero(0.1, 10), away_from_zero(1e-3, 1e3))

FLOAT_CASES: dict[str, Case] = {
    "floor": Case(fnp.floor, np.floor, (ROUNDING,), Op.FLOOR),
    "ceil": Case(fnp.ceil, np.ceil, (ROUNDING,), Op.CEIL),
    "trunc": Case(fnp.trunc, np.trunc, (ROUNDING,), Op.TRUNC),
    "round": Case(fnp.round, np.round, (ROUNDING,), Op.ROUND),
    "sign": Case(fnp.sign, np.sign, (mix(halves(-4, 5), uniform(-1, 1)),), Op.SIGN),
    "signbit": Case(fnp.signbit, np.signbit, (with_specials(0.0, -0.0)(uniform(-5, 5)),),
                    Op.SIGNBIT, exact=True),
    "copysign": Case(fnp.copysign, np.copysign, (uniform(-10, 10), uniform(-1, 1)), Op.COPYSIGN),
    "remainder": Case(fnp.remainder, np.remainder, (DIVIDEND, DIVISOR), Op.REM),
    "mod": Case(fnp.mod, np.mod, (DIVIDEND, DIVISOR), Op.REM),
    "fmod": Case(fnp.fmod, np.fmod, (DIVIDEND, DIVISOR), Op.FMOD),
    "floor_divide": Case(fnp.floor_divide, np.floor_divide, (DIVIDEND, DIVISOR), Op.FLOORDIV),
    "log1p": Case(fnp.log1p, np.log1p,
                  (mix(uniform(-1, 10), log_uniform(1e-30, 1e-2, True), log_uniform(1, 1e30)),),
                  Op.LOG1P),
    "expm1": Case(fnp.expm1, np.expm1, (mix(uniform(-10, 10), log_uniform(1e-30, 1, True)),),
                  Op.EXPM1),
    "log2": Case(fnp.log2, np.log2, (mix(log_uniform(1e-30, 1e30), uniform(0.5, 2)),), Op.LOG2),
    # log2 (its tol) times a rounded constant: one more rounding, 2^-24
    "log10": Case(fnp.log10, np.log10, (mix(log_uniform(1e-30, 1e30), uniform(0.5, 2)),),
                  tol=(ELEMENTWISE[Op.LOG2].tol[0] + 2**-24, 0.0)),
    # max + log1p(exp(-|d|)): the sum's rounding (0.5 ULP of the result) plus exp's and log1p's
    # errors on a term below ln 2; near a zero result only the absolute error is meaningful
    "logaddexp": Case(fnp.logaddexp, np.logaddexp, (uniform(-50, 50), uniform(-50, 50)),
                      tol=(1e-6, 3e-7)),
    "tan": Case(fnp.tan, np.tan, (uniform(-1.4, 1.4),), Op.TAN),
    "sinh": Case(fnp.sinh, np.sinh, (mix(uniform(-10, 10), uniform(-88, 88),
                                         log_uniform(1e-30, 1, True)),), Op.SINH),
    "cosh": Case(fnp.cosh, np.cosh, (mix(uniform(-10, 10), uniform(-88, 88)),), Op.COSH),
    "arcsin": Case(fnp.arcsin, np.arcsin, (mix(uniform(-1, 1), one_minus(1e-7, 0.1),
                                               one_minus(1e-7, 0.1, -1.0)),), Op.ASIN),
    "arccos": Case(fnp.arccos, np.arccos, (mix(uniform(-1, 1), one_minus(1e-7, 0.1),
                                               one_minus(1e-7, 0.1, -1.0)),), Op.ACOS),
    "arctan": Case(fnp.arctan, np.arctan, (mix(uniform(-5, 5), log_uniform(1e-20, 1e20, True)),),
                   Op.ATAN),
    "arcsinh": Case(fnp.arcsinh, np.arcsinh, (mix(uniform(-10, 10),
                                                  log_uniform(1e-20, 1e30, True)),), Op.ASINH),
    "arccosh": Case(fnp.arccosh, np.arccosh, (mix(one_plus(1e-7, 10), log_uniform(1, 1e30)),),
                    Op.ACOSH),
    "arctanh": Case(fnp.arctanh, np.arctanh, (mix(uniform(-1, 1), one_minus(1e-7, 0.1),
                                                  one_minus(1e-7, 0.1, -1.0),
                                                  log_uniform(1e-20, 1e-2, True)),), Op.ATANH),
    "arctan2": Case(fnp.arctan2, np.arctan2, (mix(uniform(-5, 5), log_uniform(1e-10, 1e10, True)),
                                              mix(uniform(-5, 5), log_uniform(1e-10, 1e10, True))),
                    Op.ATAN2),
    # hi sqrt(1 + r^2), r = lo / hi: the division (2.5 ULP in WGSL) halved by the sqrt, the square,
    # the sum, the sqrt and the product: under 6 ULP
    "hypot": Case(fnp.hypot, np.hypot, (mix(uniform(-5, 5), log_uniform(1e-30, 1e30, True)),
                                        mix(uniform(-5, 5), log_uniform(1e-30, 1e30, True))),
                  tol=(6 * 2**-24, 0.0)),
    "square": Case(fnp.square, np.square, (uniform(-100, 100),), Op.MUL),
    "reciprocal": Case(fnp.reciprocal, np.reciprocal, (away_from_zero(1e-3, 1e3),), Op.DIV),
    "positive": Case(fnp.positive, np.positive, (ANY_FLOAT,), tol=(0.0, 0.0)),
    "isnan": Case(fnp.isnan, np.isnan, (ANY_FLOAT,), Op.ISNAN, exact=True),
    "isinf": Case(fnp.isinf, np.isinf, (ANY_FLOAT,), Op.ISINF, exact=True),
    "isfinite": Case(fnp.isfinite, np.isfinite, (ANY_FLOAT,), Op.ISFINITE, exact=True),
    # the float32 extremes, not float64's
    "nan_to_num": Case(fnp.nan_to_num, lambda x: np.nan_to_num(x, posinf=F32_MAX,
                                                               neginf=-F32_MAX),
                       (ANY_FLOAT,), tol=(0.0, 0.0)),
    "logical_and": Case(fnp.logical_and, np.logical_and, (ANY_FLOAT, ANY_FLOAT), exact=True),
    "logical_or": Case(fnp.logical_or, np.logical_or, (ANY_FLOAT, ANY_FLOAT), exact=True),
    "logical_xor": Case(fnp.logical_xor, np.logical_xor, (ANY_FLOAT, ANY_FLOAT), exact=True),
    "logical_not": Case(fnp.logical_not, np.logical_not, (ANY_FLOAT,), exact=True),
}

# the Array-API spellings are the same functions
ALIASES = {"asin": "arcsin", "acos": "arccos", "atan": "arctan", "asinh": "arcsinh",
           "acosh": "arccosh", "atanh": "arctanh", "atan2": "arctan2", "mod": "remainder",
           "bitwise_not": "invert", "bitwise_invert": "invert",
           "bitwise_left_shift": "left_shift", "bitwise_right_shift": "right_shift"}

# every row this file tests (tests/test_numeric.py covers the others)
ROW_OPS = frozenset({Op.FLOOR, Op.CEIL, Op.TRUNC, Op.ROUND, Op.SIGN, Op.SIGNBIT, Op.COPYSIGN,
                     Op.REM, Op.FMOD, Op.FLOORDIV, Op.LOG1P, Op.EXPM1, Op.LOG2, Op.TAN, Op.SINH,
                     Op.COSH, Op.ASIN, Op.ACOS, Op.ATAN, Op.ATAN2, Op.ASINH, Op.ACOSH, Op.ATANH,
                     Op.ISNAN, Op.ISINF, Op.ISFINITE, Op.AND, Op.OR, Op.XOR, Op.NOT, Op.SHL,
                     Op.SHR})


def test_every_new_row_is_tested() -> None:
    float_rows = {c.op for c in FLOAT_CASES.values()}
    int_rows = {Op.AND, Op.OR, Op.XOR, Op.NOT, Op.SHL, Op.SHR}  # INT_CASES below
    assert ROW_OPS <= float_rows | int_rows
    assert ROW_OPS <= set(ELEMENTWISE)
    for alias, name in ALIASES.items():
        assert getattr(fnp, alias) is getattr(fnp, name), alias
        assert alias in fnp.__all__


def _f64(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) if x.dtype == np.float32 else x


def _reference(case: Case, args: list[np.ndarray]) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(case.ref(*[_f64(a) for a in args]))


def _check(case: Case, got: Any, want: np.ndarray) -> None:
    got = np.asarray(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    if case.exact:
        assert got.dtype == np.bool_, got.dtype
        np.testing.assert_array_equal(got, want)
        return
    assert got.dtype == np.float32, got.dtype
    rtol, atol = case.tolerance()
    g = got.astype(np.float64)
    # a float64 result beyond float32's range is inf in float32: compare with the float32 value;
    # one below float32's normal range may come out as 0 or subnormal (GPUs may flush subnormals)
    with np.errstate(over="ignore"):
        want32 = want.astype(np.float32)
    want = np.where(np.isinf(want32) & np.isfinite(want), want32, want)
    tiny = float(np.finfo(np.float32).tiny)
    want = np.where((np.abs(want) < tiny) & (np.abs(g) < tiny), g, want)
    np.testing.assert_allclose(g, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", sorted(FLOAT_CASES))
def test_float_op(name: str, size: int, rng: np.random.Generator) -> None:
    """Each op on random float32 inputs, in a jitted function and eagerly."""
    case = FLOAT_CASES[name]
    args = [g(rng, size) for g in case.gens]
    want = _reference(case, args)
    jitted = fusec.gpu_jit(lambda *a: case.fn(*a))
    _check(case, jitted(*args), want)
    _check(case, case.fn(*args), want)


# --- special values -------------------------------------------------------------------------------

SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.5, -2.5, 3.5, 3e38, -3e38,
           1e-30, -1e-30, 2e-38, 5.96e-8, 1.0000001, 0.99999994]
# per op: special values of its own (domain edges, overflow thresholds)
EDGES: dict[str, list[float]] = {
    "log1p": [-1.0, -0.99999994, -1.5, 0.41421357, -0.29289323, 1e30, 3.4e38],
    "expm1": [88.7, 88.8, -100.0, 0.49999997, -0.5],
    "log2": [-1.0, 2.0**-126, 2.0**100, 4.0, 0.125],
    "log10": [-1.0, 10.0, 1000.0, 1e-10, 1e30],
    "sinh": [88.0, 89.4, 89.5, -89.4, 9.0, -8.999999],
    "cosh": [88.0, 89.4, 89.5, -89.4, 9.0, -8.999999],
    "arcsin": [1.0000001, -1.0000001, 0.99999994, -0.99999994],
    "arccos": [1.0000001, -1.0000001, 0.99999994, -0.99999994],
    "arctan": [3.4e38, -3.4e38, 33554432.0, 33554436.0, 0.41421357, 0.41421354],
    "arcsinh": [3.4e38, -3.4e38, 4096.0, 4096.0005],
    "arccosh": [1.0, 0.99999994, 1.0000001, 4096.0, 4096.0005, 3.4e38],
    "arctanh": [1.0, -1.0, 1.0000001, -1.0000001, 0.99999994, -0.99999994],
    "tan": [1.5, -1.5, 1e-20],
    "floor": [8388607.5, -8388607.5, 16777217.0, 0.49999997],
    "round": [0.49999997, 1.5, -1.5, 8388607.5, 8388608.5, -0.4],
}
BINARY_SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.5, -3.0, 3e38, -3e38, 1e-30,
                  -7e-30, 1e30]


@pytest.mark.parametrize("name", sorted(n for n, c in FLOAT_CASES.items() if len(c.gens) == 1))
def test_unary_special_values(name: str) -> None:
    """nan, +-inf, +-0, huge and tiny values and the op's own edges, against numpy."""
    case = FLOAT_CASES[name]
    values = SPECIAL + EDGES.get(name, [])
    if name == "tan":  # WGSL bounds tan only where sin and cos are bounded: [-pi, pi]
        values = [v for v in values if not abs(v) > 4]
    x = np.array(values, np.float32)
    want = _reference(case, [x])
    _check(case, fusec.gpu_jit(case.fn)(x), want)
    _check(case, case.fn(x), want)


@pytest.mark.parametrize("name", sorted(n for n, c in FLOAT_CASES.items() if len(c.gens) == 2))
def test_binary_special_values(name: str) -> None:
    """Every pair of special values (nan, +-inf, +-0, huge, tiny), against numpy."""
    case = FLOAT_CASES[name]
    s = np.array(BINARY_SPECIAL, np.float32)
    x, y = (a.ravel() for a in np.meshgrid(s, s))
    want = _reference(case, [x, y])
    _check(case, fusec.gpu_jit(case.fn)(x, y), want)


def test_specials_by_value() -> None:
    """The values numpy documents, spelled out (the comparison above reads them off numpy)."""
    inf, nan = np.inf, np.nan
    f = np.float32
    got = fusec.gpu_jit(lambda a: (fnp.log1p(a), fnp.arctanh(a), fnp.arccosh(a + 2.0),
                                   fnp.sign(a), fnp.expm1(a)))(np.array([-1.0, 1.0, -1.0, nan,
                                                                         -inf], f))
    assert np.asarray(got[0])[0] == -inf
    np.testing.assert_allclose(np.asarray(got[0])[1], math.log(2.0), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(got[1])[:2], [-inf, inf])
    assert np.asarray(got[2])[0] == 0.0  # acosh(1)
    assert np.isnan(np.asarray(got[3])[3])  # sign(nan)
    assert np.asarray(got[4])[4] == -1.0  # expm1(-inf)
    assert np.asarray(fnp.logaddexp(f(-inf), f(-inf))) == -inf
    assert np.asarray(fnp.logaddexp(f(inf), f(inf))) == inf
    assert np.asarray(fnp.hypot(f(3e38), f(3e38))) == inf  # overflows only where it must
    np.testing.assert_allclose(np.asarray(fnp.hypot(f(3e38), f(1e38))), math.hypot(3e38, 1e38),
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(fnp.hypot(f(3e-30), f(4e-30))), 5e-30, rtol=1e-6)
    assert np.asarray(fnp.hypot(f(inf), f(nan))) == inf
    # numpy: x // 0 = +-inf (nan for 0 // 0); 1 // inf = 0, -1 // inf = -1; inf // 1 = nan
    fd = np.asarray(fnp.floor_divide(np.array([1, -1, 0, 1, -1, inf], f),
                                     np.array([0, 0, 0, inf, inf, 1], f)))
    np.testing.assert_array_equal(fd, [inf, -inf, nan, 0, -1, nan])
    # remainder takes the divisor's sign; -1 % inf = inf, as numpy
    rem = np.asarray(fnp.remainder(np.array([5, -5, 5, -5, 1, -1, 5], f),
                                   np.array([3, 3, -3, -3, inf, inf, 0], f)))
    np.testing.assert_array_equal(rem, [2, 1, -1, -2, 1, inf, nan])
    # fmod and remainder are exact: 1e30 % 3 needs the full dividend (x - y trunc(x / y) is not)
    for a, b in [(1e30, 3.0), (3.4e38, 1.1754944e-38), (-1e20, 7.0), (16777217.0, 3.0)]:
        x, y = f(a), f(b)
        assert np.asarray(fnp.fmod(x, y)) == np.fmod(x, y), (a, b)
        assert np.asarray(fnp.remainder(x, y)) == np.remainder(x, y), (a, b)


def test_tiny_arguments_keep_relative_accuracy() -> None:
    """log1p, expm1, sinh, asinh, atanh, asin, atan, tan of tiny x are x to within a few ULP
    (formulas through log(1 + x) or exp(x) - 1 lose all of it)."""
    x = np.concatenate([np.logspace(-30, -3, 200), -np.logspace(-30, -3, 200)]).astype(np.float32)
    xd = x.astype(np.float64)
    fns = [(fnp.log1p, np.log1p), (fnp.expm1, np.expm1), (fnp.sinh, np.sinh),
           (fnp.arcsinh, np.arcsinh), (fnp.arctanh, np.arctanh), (fnp.arcsin, np.arcsin),
           (fnp.arctan, np.arctan), (fnp.tan, np.tan)]
    outs = fusec.gpu_jit(lambda a: tuple(f(a) for f, _ in fns))(x)
    for (f, ref), got in zip(fns, outs):
        rel = np.abs(np.asarray(got).astype(np.float64) - ref(xd)) / np.abs(ref(xd))
        assert rel.max() < 1e-6, (f.__name__, rel.max())


# --- rounding -------------------------------------------------------------------------------------


def test_round_half_to_even_and_decimals(rng: np.random.Generator) -> None:
    """numpy's round: halves to even; decimals as float32 multiply, rint, divide."""
    ties = np.arange(-10, 11, dtype=np.float32) + np.float32(0.5)
    np.testing.assert_array_equal(np.asarray(fnp.round(ties)), np.round(ties))
    x = rng.uniform(-1000, 1000, 1009).astype(np.float32)
    for d in [1, 2, 3, -1, -2]:
        # numpy's float32 computation, one WGSL division (2.5 ULP) apart
        np.testing.assert_allclose(np.asarray(fnp.round(x, d)), np.round(x, d), rtol=3e-7,
                                   atol=0, err_msg=f"decimals={d}")
        got = np.asarray(fusec.gpu_jit(lambda a, d=d: a.round(d))(x))  # the method
        np.testing.assert_allclose(got, np.round(x, d), rtol=3e-7, atol=0)


@pytest.mark.parametrize("dtype", ["int32", "uint32"])
def test_round_integers(dtype: str, rng: np.random.Generator) -> None:
    """Integers: unchanged for decimals >= 0; to a multiple of 10**-decimals, halves to even."""
    lo, hi = (-(2**31) + 10**9, 2**31 - 10**9) if dtype == "int32" else (0, 2**32 - 10**9)
    x = rng.integers(lo, hi, 1001).astype(dtype)
    ties = np.array([5, 15, 25, 35, 150, 250], dtype)
    x = np.concatenate([x, ties, (-ties.astype(np.int64)).astype(dtype) if dtype == "int32"
                        else ties])
    for d in [0, 2, -1, -2, -5, -9, -10]:
        got = np.asarray(fnp.round(x, d))
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, np.round(x, d), err_msg=f"decimals={d}")
    b = np.array([True, False])
    assert np.asarray(fnp.round(b)).dtype == np.float32  # numpy: a float type


def test_round_decimals_must_be_static() -> None:
    with pytest.raises(TraceError, match="decimals"):
        fnp.round(np.ones(3, np.float32), 1.5)


# --- integers -------------------------------------------------------------------------------------

INT_EDGES = {
    "int32": [I32_MIN, I32_MIN + 1, -100, -7, -3, -2, -1, 0, 1, 2, 3, 7, 31, 32, 33, 40, 100,
              I32_MAX],
    "uint32": [0, 1, 2, 3, 7, 31, 32, 33, 40, 100, 2**31, 2**31 + 1, U32_MAX],
}


def int_inputs(dtype: str, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of edge values, then random values: full-range and small, zeros included."""
    e = np.array(INT_EDGES[dtype], np.int64).astype(dtype)
    x, y = (a.ravel() for a in np.meshgrid(e, e))
    info = np.iinfo(dtype)
    big = rng.integers(info.min, info.max, (2, n), endpoint=True, dtype=np.int64).astype(dtype)
    lo = -50 if dtype == "int32" else 0
    small = rng.integers(lo, 50, (2, n)).astype(dtype)
    return np.concatenate([x, big[0], small[0]]), np.concatenate([y, big[1], small[1]])


INT_CASES = {
    "remainder": (fnp.remainder, np.remainder),
    "floor_divide": (fnp.floor_divide, np.floor_divide),
    "fmod": (fnp.fmod, np.fmod),
    "bitwise_and": (fnp.bitwise_and, np.bitwise_and),
    "bitwise_or": (fnp.bitwise_or, np.bitwise_or),
    "bitwise_xor": (fnp.bitwise_xor, np.bitwise_xor),
    "left_shift": (fnp.left_shift, np.left_shift),
    "right_shift": (fnp.right_shift, np.right_shift),
    "maximum": (fnp.maximum, np.maximum),
    "minimum": (fnp.minimum, np.minimum),
}


def _numpy_ints(ref: Callable[..., Any], *args: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy warns on x // 0 and INT_MIN // -1
        return np.asarray(ref(*args))


@pytest.mark.parametrize("dtype", ["int32", "uint32"])
@pytest.mark.parametrize("name", sorted(INT_CASES))
def test_integer_binary_exact(name: str, dtype: str, rng: np.random.Generator) -> None:
    """numpy's results exactly: zero divisors give 0, INT_MIN // -1 wraps, shifts by 32 or more
    or by negative amounts shift everything out; in a jitted function and eagerly."""
    fn, ref = INT_CASES[name]
    x, y = int_inputs(dtype, rng, 997)
    want = _numpy_ints(ref, x, y)
    assert want.dtype == np.dtype(dtype)
    for got in (fusec.gpu_jit(fn)(x, y), fn(x, y)):
        got = np.asarray(got)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_integer_division_by_value() -> None:
    """The cases spelled out: numpy's values for zero divisors, INT_MIN and negative operands."""
    i = np.int32
    x = np.array([7, -7, 7, -7, I32_MIN, I32_MIN, 5, -5, 0], i)
    y = np.array([2, 2, -2, -2, -1, 1, 0, 0, 0], i)
    q, r = fusec.gpu_jit(fnp.divmod)(x, y)
    np.testing.assert_array_equal(np.asarray(q), [3, -4, -4, 3, I32_MIN, I32_MIN, 0, 0, 0])
    np.testing.assert_array_equal(np.asarray(r), [1, 1, -1, -1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(np.asarray(fnp.fmod(x, y)), [1, -1, 1, -1, 0, 0, 0, 0, 0])
    s = np.array([0, 31, 32, 40, -1], i)
    ones = np.ones(5, i)
    np.testing.assert_array_equal(np.asarray(fnp.left_shift(ones, s)), [1, I32_MIN, 0, 0, 0])
    np.testing.assert_array_equal(np.asarray(fnp.right_shift(np.full(5, -8, i), s)),
                                  [-8, -1, -1, -1, -1])
    np.testing.assert_array_equal(np.asarray(fnp.right_shift(np.full(5, 8, i), s)),
                                  [8, 0, 0, 0, 0])


@pytest.mark.parametrize("dtype", ["int32", "uint32", "bool"])
def test_integer_unary_exact(dtype: str, rng: np.random.Generator) -> None:
    """invert, predicates and rounding on integers and bools, as numpy (floor/ceil/trunc keep the
    dtype, as in numpy 2 and JAX)."""
    if dtype == "bool":
        x = rng.random(101) < 0.5
    else:
        x, _ = int_inputs(dtype, rng, 101)
    fns = {"invert": (fnp.invert, np.invert), "isnan": (fnp.isnan, np.isnan),
           "isinf": (fnp.isinf, np.isinf), "isfinite": (fnp.isfinite, np.isfinite),
           "signbit": (fnp.signbit, np.signbit), "floor": (fnp.floor, np.floor),
           "ceil": (fnp.ceil, np.ceil), "trunc": (fnp.trunc, np.trunc),
           "logical_not": (fnp.logical_not, np.logical_not),
           "nan_to_num": (fnp.nan_to_num, np.nan_to_num)}
    if dtype != "bool":
        fns["sign"] = (fnp.sign, np.sign)
        fns["positive"] = (fnp.positive, np.positive)
        fns["square"] = (fnp.square, np.square)
    outs = fusec.gpu_jit(lambda a: tuple(f(a) for f, _ in fns.values()))(x)
    for (name, (f, ref)), got in zip(fns.items(), outs):
        want = _numpy_ints(ref, x)
        got = np.asarray(got)
        assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_bool_operands() -> None:
    """Bitwise ops on bools are logical; arithmetic numpy does on small ints runs as int32."""
    b = np.array([True, True, False, False])
    c = np.array([True, False, True, False])
    outs = fusec.gpu_jit(lambda p, q: (p & q, p | q, p ^ q, ~p, fnp.bitwise_not(p),
                                       fnp.logical_xor(p, q), fnp.remainder(p, q),
                                       fnp.floor_divide(p, q), fnp.left_shift(p, q),
                                       fnp.square(p)))(b, c)
    wants = [b & c, b | c, b ^ c, ~b, ~b, b ^ c, np.array([0, 0, 0, 0]), np.array([1, 0, 0, 0]),
             np.array([2, 1, 0, 0]), np.array([1, 1, 0, 0])]
    dts = [np.bool_] * 6 + [np.int32] * 4
    for got, want, dt in zip(outs, wants, dts):
        got = np.asarray(got)
        assert got.dtype == dt
        np.testing.assert_array_equal(got, want)


# --- dtypes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["log1p", "expm1", "log2", "log10", "tan", "sinh", "cosh",
                                  "arcsin", "arctan", "arcsinh", "arccosh", "arctanh", "hypot",
                                  "arctan2", "copysign", "logaddexp", "reciprocal"])
def test_float_only_ops_on_integers_give_float32(name: str) -> None:
    """As numpy (float64 there) and JAX: integers and bools are computed as float32."""
    case = FLOAT_CASES[name]
    x = np.array([1, 2, 3], np.int32)
    args = [x] * len(case.gens)
    got = np.asarray(fusec.gpu_jit(case.fn)(*args))
    assert got.dtype == np.float32
    _check(case, got, _reference(case, [a.astype(np.float32) for a in args]))
    assert np.asarray(case.fn(*[a.astype(np.uint32) for a in args])).dtype == np.float32
    assert np.asarray(case.fn(*[a > 1 for a in args])).dtype == np.float32


def test_predicates_and_logical_ops_give_bool(rng: np.random.Generator) -> None:
    x = rng.uniform(-2, 2, 11).astype(np.float32)
    i = rng.integers(-3, 3, 11).astype(np.int32)
    for got in (fnp.isnan(x), fnp.isinf(i), fnp.isfinite(x), fnp.signbit(i),
                fnp.logical_and(x, i), fnp.logical_or(i, 0), fnp.logical_not(x),
                fnp.logical_xor(x, 1.5)):
        assert np.asarray(got).dtype == np.bool_
    np.testing.assert_array_equal(np.asarray(fnp.logical_and(x, i)), np.logical_and(x, i))


def _with_float_scalar(fn: Callable[..., Any]) -> Callable[[Any], Any]:
    return lambda a: fn(a, 1.5)


def test_errors_name_the_operation() -> None:
    x = np.ones(4, np.float32)
    i = np.ones(4, np.int32)
    for name in ["bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift"]:
        fn = getattr(fnp, name)
        with pytest.raises(DTypeError, match=f"{name}.*float32"):
            fn(x, i)
        with pytest.raises(DTypeError, match=name):
            fusec.gpu_jit(_with_float_scalar(fn))(i)
    with pytest.raises(DTypeError, match="invert.*float32"):
        fnp.invert(x)
    with pytest.raises(DTypeError, match="invert.*float32"):
        fusec.gpu_jit(lambda a: ~a)(x)
    with pytest.raises(DTypeError, match="bitwise_and"):
        fusec.gpu_jit(lambda a: a & 1)(x)
    b = np.array([True, False])
    with pytest.raises(DTypeError, match="sign.*bool"):
        fnp.sign(b)
    with pytest.raises(DTypeError, match="positive.*bool"):
        fnp.positive(b)


# --- operators ------------------------------------------------------------------------------------


def test_integer_operators(rng: np.random.Generator) -> None:
    """%, //, &, |, ^, ~, <<, >> and their reflected forms on traced int32 values; Python ints
    are weak (``x << 3`` stays int32)."""
    x = rng.integers(-1000, 1000, 37).astype(np.int32)
    y = rng.integers(-20, 20, 37).astype(np.int32)  # zeros included
    s = rng.integers(-2, 40, 37).astype(np.int32)

    def f(a, b, n):  # type: ignore[no-untyped-def]
        return (a % b, a // b, a & b, a | b, a ^ b, ~a, a << n, a >> n, 2 % b, 7 // b, 5 & a,
                5 | a, 5 ^ a, 1 << n, -8 >> n, a << 3, a >> 2, a % 7, a // -3)

    outs = fusec.gpu_jit(f)(x, y, s)
    wants = _numpy_ints(lambda a, b, n: f(a, b, n), x, y, s)
    for k, (got, want) in enumerate(zip(outs, wants)):
        got = np.asarray(got)
        assert got.dtype == np.int32, (k, got.dtype)
        np.testing.assert_array_equal(got, want, err_msg=f"output {k}")


def test_float_operators(rng: np.random.Generator) -> None:
    """% and // on float32 (and reflected): Python floats and ints are weak."""
    x = rng.uniform(-50, 50, 41).astype(np.float32)
    y = away_from_zero(0.5, 20)(rng, 41)
    outs = fusec.gpu_jit(lambda a, b: (a % b, a // b, a // 2, a % 2.5, 2 % b, 7.5 // b))(x, y)
    xd, yd = x.astype(np.float64), y.astype(np.float64)
    wants = [xd % yd, xd // yd, xd // 2, xd % 2.5, 2 % yd, 7.5 // yd]
    tols = [ELEMENTWISE[Op.REM].tol, ELEMENTWISE[Op.FLOORDIV].tol] * 3
    for got, want, tol in zip(outs, wants, tols):
        got = np.asarray(got)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=tol[0], atol=tol[1])


def test_bool_and_uint_operators(rng: np.random.Generator) -> None:
    b = rng.random(13) < 0.5
    c = rng.random(13) < 0.5
    u = rng.integers(0, 2**32, 13, dtype=np.int64).astype(np.uint32)
    outs = fusec.gpu_jit(lambda p, q, v: (~p, p & q, p | q, p ^ q, p & True, v << 3, v >> 31,
                                          v % 10, v // 7, ~v))(b, c, u)
    wants = [~b, b & c, b | c, b ^ c, b & True, u << np.uint32(3), u >> np.uint32(31),
             u % np.uint32(10), u // np.uint32(7), ~u]
    for got, want in zip(outs, wants):
        got = np.asarray(got)
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        np.testing.assert_array_equal(got, want)


def test_operators_on_device_arrays(rng: np.random.Generator) -> None:
    """fusec.Array gets the same operators (run eagerly)."""
    x = rng.integers(-100, 100, 9).astype(np.int32)
    a = fusec.device_put(x)
    np.testing.assert_array_equal(np.asarray(a % 7), x % 7)
    np.testing.assert_array_equal(np.asarray(3 % a), _numpy_ints(np.remainder, 3, x))
    np.testing.assert_array_equal(np.asarray(a // 4), x // 4)
    np.testing.assert_array_equal(np.asarray(a << 2), x << 2)
    np.testing.assert_array_equal(np.asarray(a >> 1), x >> 1)
    np.testing.assert_array_equal(np.asarray(~a), ~x)
    np.testing.assert_array_equal(np.asarray(a & 6), x & 6)
    np.testing.assert_array_equal(np.asarray(6 | a), 6 | x)
    np.testing.assert_array_equal(np.asarray(a ^ a), np.zeros_like(x))


# --- NaN propagation ------------------------------------------------------------------------------


def _nan_pairs(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    x = rng.uniform(-3, 3, 64).astype(np.float32)
    y = rng.uniform(-3, 3, 64).astype(np.float32)
    x[::4] = np.nan  # NaN in the first operand, the second, both, neither
    y[1::4] = np.nan
    y[2::8] = np.nan
    x[2::8] = np.nan
    x[3::8] = np.inf
    y[7::8] = -np.inf
    return x, y


def test_maximum_minimum_propagate_nan(rng: np.random.Generator) -> None:
    """numpy and JAX return NaN where either operand is NaN (WGSL's max/min would return the
    number)."""
    x, y = _nan_pairs(rng)
    outs = fusec.gpu_jit(lambda a, b: (fnp.maximum(a, b), fnp.minimum(a, b), fnp.maximum(b, a),
                                       fnp.minimum(b, a), fnp.maximum(a, 0.0),
                                       fnp.minimum(1.0, a)))(x, y)
    wants = [np.maximum(x, y), np.minimum(x, y), np.maximum(y, x), np.minimum(y, x),
             np.maximum(x, np.float32(0)), np.minimum(np.float32(1), x)]
    for got, want in zip(outs, wants):
        np.testing.assert_array_equal(np.asarray(got), want)  # NaN positions included
    assert np.isnan(np.asarray(fnp.maximum(np.float32(np.nan), np.float32(0.0))))
    assert np.isnan(np.asarray(fnp.minimum(np.float32(0.0), np.float32(np.nan))))


def test_clip_and_relu_propagate_nan(rng: np.random.Generator) -> None:
    x, y = _nan_pairs(rng)
    outs = fusec.gpu_jit(lambda a, b: (fnp.clip(a, -1.0, 1.0), nn.relu(a), fnp.clip(a, b, 2.0),
                                       fnp.clip(a, None, b)))(x, y)
    wants = [np.clip(x, -1, 1), np.maximum(x, 0), np.minimum(np.maximum(x, y), 2),
             np.minimum(x, y)]
    for got, want in zip(outs, wants):
        np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(nn.relu(x)), np.maximum(x, 0))  # eagerly
    assert np.isnan(np.asarray(fnp.clip(np.float32(np.nan), 0.0, 1.0)))


def test_not_equal_and_truth_of_nan() -> None:
    """NaN != anything is True and NaN is truthy, as in numpy (naga's ordered != said False)."""
    nan, inf = np.nan, np.inf
    x = np.array([nan, nan, 1.0, 0.0, -0.0, inf, -inf], np.float32)
    y = np.array([1.0, nan, nan, 0.0, 0.0, inf, 2.0], np.float32)

    def f(a, b):  # type: ignore[no-untyped-def]
        return (a != b, fnp.not_equal(a, 1.0), a.astype(bool), fnp.logical_and(a, b),
                fnp.logical_not(a), fnp.where(a, 1, 0), a == b)

    outs = fusec.gpu_jit(f)(x, y)
    wants = [x != y, x != 1.0, x.astype(bool), np.logical_and(x, y), np.logical_not(x),
             np.where(x, 1, 0).astype(np.int32), x == y]
    for got, want in zip(outs, wants):
        got = np.asarray(got)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_integer_max_min_unchanged(rng: np.random.Generator) -> None:
    x = rng.integers(I32_MIN, I32_MAX, 50, dtype=np.int64).astype(np.int32)
    got = fusec.gpu_jit(lambda a: (fnp.maximum(a, -a), nn.relu(a), fnp.clip(a, -5, 5)))(x)
    with np.errstate(over="ignore"):
        wants = [np.maximum(x, -x), np.maximum(x, 0), np.clip(x, -5, 5)]
    for g, w in zip(got, wants):
        np.testing.assert_array_equal(np.asarray(g), w)


# --- fusion and code generation -------------------------------------------------------------------


def _chain(x: Any, y: Any) -> Any:
    a = fnp.log1p(fnp.abs(x)) + fnp.expm1(fnp.minimum(x, 1.0)) * fnp.sinh(y)
    b = fnp.arctan2(y, fnp.abs(a) + 0.5) + fnp.hypot(x, y) - fnp.floor(x) + fnp.remainder(x, 1.5)
    c = fnp.where(fnp.isnan(b), 0.0, b) + fnp.logaddexp(x, y) + fnp.round(x)
    return fnp.arcsinh(c) + fnp.arctanh(fnp.tanh(y) * 0.5) + fnp.log2(fnp.cosh(x))


def _chain_ref(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    a = np.log1p(np.abs(x)) + np.expm1(np.minimum(x, 1.0)) * np.sinh(y)
    b = np.arctan2(y, np.abs(a) + 0.5) + np.hypot(x, y) - np.floor(x) + np.remainder(x, 1.5)
    c = np.where(np.isnan(b), 0.0, b) + np.logaddexp(x, y) + np.round(x)
    return np.arcsinh(c) + np.arctanh(np.tanh(y) * 0.5) + np.log2(np.cosh(x))


def _chain_inputs(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.uniform(-3, 3, n).astype(np.float32), rng.uniform(-2, 2, n).astype(np.float32)


def _check_chain(got: Any, x: np.ndarray, y: np.ndarray) -> None:
    """Rounding (floor, round) and remainder act on the inputs, exact in both precisions; the rest
    is continuous with slopes of a few units at most: 20 ops of errors <= 2e-6 each (sinh, cosh and
    expm1 within 1e-6 on these small arguments, as measured), summed with a margin."""
    want = _chain_ref(x.astype(np.float64), y.astype(np.float64))
    got = np.asarray(got)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-5, atol=2e-5)


def test_new_ops_fuse_into_one_kernel(rng: np.random.Generator) -> None:
    x, y = _chain_inputs(rng, 1000)
    f = fusec.gpu_jit(_chain)
    assert len(f.lower(x, y).kernels) == 1
    _check_chain(f(x, y), x, y)


@pytest.mark.parametrize("n", [65536, 65537])
def test_gpu_codegen_paths(n: int, gpu_target: None, rng: np.random.Generator) -> None:
    """The "gpu" target's vec4 kernels (65536) and several-elements-per-thread loop (65537), run
    here on whatever adapter there is."""
    x, y = _chain_inputs(rng, n)
    f = fusec.gpu_jit(_chain)
    (kernel,) = f.lower(x, y).kernels
    assert ("vec4<f32>" in kernel.wgsl) == (n % 4 == 0)
    _check_chain(f(x, y), x, y)
    i = rng.integers(I32_MIN, I32_MAX, n, dtype=np.int64).astype(np.int32)
    s = rng.integers(-5, 40, n).astype(np.int32)
    got = fusec.gpu_jit(lambda a, b: (a // b) ^ (a << b) ^ (a % b) ^ (a >> b))(i, s)
    want = _numpy_ints(lambda a, b: (a // b) ^ (a << b) ^ (a % b) ^ (a >> b), i, s)
    np.testing.assert_array_equal(np.asarray(got), want)


def test_helpers_only_where_used() -> None:
    """A kernel carries the WGSL helpers its ops call (and theirs), no others; generated code is
    the same each time."""
    x = np.ones(16, np.float32)
    k1 = fusec.gpu_jit(fnp.arcsinh).lower(x).kernels[0].wgsl
    assert "fn fusec_asinh(" in k1 and "fn fusec_log1p(" in k1 and "fn fusec_log1p_core(" in k1
    assert "fn fusec_log2(" in k1 and "fn fusec_isnan(" in k1
    assert "fn fusec_fmod(" not in k1 and "fn fusec_atan2(" not in k1
    k2 = fusec.gpu_jit(lambda a: fnp.maximum(a, 0.0)).lower(x).kernels[0].wgsl
    assert "fn fusec_isnan(" in k2 and "fn fusec_log1p(" not in k2
    assert fusec.gpu_jit(fnp.arcsinh).lower(x).kernels[0].wgsl == k1


def test_interpreter_matches(rng: np.random.Generator) -> None:
    """The numpy interpreter (the CPU fallback and the oracle) computes the rows' references."""
    from fusec.interpret import evaluate

    x, y = _chain_inputs(rng, 101)
    traced = fusec.gpu_jit(_chain).trace(x, y)
    consts = [np.asarray(c) for c in traced.const_values]
    (got,) = evaluate(traced.program, [x, y, *consts])
    _check_chain(got, x, y)


def test_division_by_a_literal_zero_and_a_negative_zero() -> None:
    """naga folded ``x / 0.0f`` to 0 on lavapipe; numpy gives +-inf, and nan for 0 / 0 and nan.
    Eager calls with 0.0 and then -0.0 must not share a kernel (the two compare equal)."""
    x = np.array([1.0, -2.5, 0.0, np.nan, np.inf], np.float32)
    with np.errstate(all="ignore"):
        want_pos, want_neg = x / np.float32(0.0), x / np.float32(-0.0)
    both = fusec.gpu_jit(lambda x: (x / 0.0, x / -0.0, fnp.divide(x, 0.0)))(x)
    for got, want in zip(both, (want_pos, want_neg, want_pos)):
        np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(fnp.divide(x, 0.0)), want_pos)
    np.testing.assert_array_equal(np.asarray(fnp.divide(x, -0.0)), want_neg)
