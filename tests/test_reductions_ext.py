"""Reductions beyond sum/max/min/mean, NaN semantics of every reduction, argmax/argmin fusion,
and einsum: against numpy, on the real wgpu device.

Tolerances (float32 results against float64 references computed from the same float32 inputs):

* sums and means: 1e-5 * max(1, log2 n) * sum(|x|) (see test_numeric's module docstring);
* products: each multiplication rounds by at most 2^-24 relative, so the relative error is a
  random walk of n such steps; 1e-5 * max(1, log2 n) relative is over 6 sigma of it for every n
  here and far below a dropped or doubled factor (inputs are exp(+-0.02)-sized, so that nothing
  overflows);
* var/std: two passes, so the squared deviations are computed from exact-ish differences and
  the error is that of their sum (relative, as for sums) plus the square of the mean's error;
* logsumexp: log of a sum (absolute error ~ the sum's relative error) plus exp's 2e-5 relative;
* max, min, argmax, argmin, all, any, count_nonzero and integer results: exact.

NaN: every reduction and comparison-based op is run on rows holding NaN at the start, the
middle and the end, rows of NaN only, rows of +-inf and mixtures, in every reduction strategy
(the "cpu" target's thread-per-row and workgroup kernels, the "gpu" target's register-cached row
kernels, split reductions' partial kernels of each layout); NaN, inf and -inf must come out where
numpy puts them.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers import forced_target, subgroup_level

import fusec
import fusec.numpy as fnp
from fusec import codegen, nn
from fusec.errors import ShapeError, TraceError
from fusec.ir import Op
from fusec.passes import run_pipeline

U = 2.0 ** -24


# --- helpers --------------------------------------------------------------------------------------


def _log2(n: int) -> float:
    return max(1.0, math.log2(max(n, 1)))


def _lse64(x: np.ndarray, axis: Any, keepdims: bool = False) -> np.ndarray:
    """logsumexp in float64, shifted by the maximum where it is finite (scipy's semantics)."""
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        m = np.max(x, axis=axis, keepdims=True)
        shift = np.where(np.isfinite(m), m, 0.0)
        out = np.log(np.sum(np.exp(x - shift), axis=axis, keepdims=True)) + shift
    if not keepdims:
        out = np.squeeze(out, axis=axis) if axis is not None else out.reshape(())
    return out


def assert_same(got: Any, want: Any, rtol: float = 0.0, atol: Any = 0.0,
                dtype: Any = None, what: str = "") -> None:
    """``got`` matches ``want``: dtype, shape, NaN and +-inf at the same places, finite values
    within ``atol + rtol * |want|`` (``atol`` may be an array)."""
    got = np.asarray(got)
    want = np.asarray(want)
    if dtype is not None:
        assert got.dtype == np.dtype(dtype), f"{what}: dtype {got.dtype}, expected {dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    if got.dtype.kind != "f":
        np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=what)
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"{what}: NaN positions")
    np.testing.assert_array_equal(np.isposinf(g), np.isposinf(w), err_msg=f"{what}: +inf")
    np.testing.assert_array_equal(np.isneginf(g), np.isneginf(w), err_msg=f"{what}: -inf")
    fin = np.isfinite(w)
    with np.errstate(all="ignore"):  # inf - inf where both are inf: not compared (``fin``)
        bound = np.broadcast_to(np.asarray(atol, dtype=np.float64), w.shape) + rtol * np.abs(w)
        err = np.abs(g - w)
    bad = fin & ~(err <= bound)
    assert not bad.any(), (f"{what}: {int(bad.sum())} value(s) off, worst {err[bad].max()} "
                           f"(bound {bound[bad].min()}); got {g[bad][:5]}, want {w[bad][:5]}")


def _np_axis(axis: Any) -> Any:
    return tuple(axis) if isinstance(axis, list) else axis


# --- every reduction, every dtype, many shapes and axes -------------------------------------------

CASES = [  # (shape, dtypes, axes to reduce over; "k" marks a keepdims run)
    ((1,), "float32 bool", [None, 0]),
    ((7,), "float32 int32", [None, -1, "k0"]),
    ((1000,), "uint32", [0]),
    ((3, 257), "float32 int32 bool", [None, 0, -1, "k1"]),
    ((257, 3), "float32 uint32", [0, -1, "kNone"]),
    ((3, 5, 7), "float32 int32 uint32 bool", [(0, 2), 1, "k(0, 2)", None]),
    ((2, 16385), "float32", [-1]),
    ((2**20 + 3,), "float32 int32", [None]),
]
RUNS = [(shape, dt, specs) for shape, dts, specs in CASES for dt in dts.split()]


def _data(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype == "float32":
        x = rng.standard_normal(shape).astype(np.float32) * 3
        x[rng.random(shape) < 0.2] = 0.0  # zeros for all/any/count_nonzero
        return x
    if dtype == "int32":
        return rng.integers(-1000, 1000, shape, dtype=np.int32)
    if dtype == "uint32":
        return rng.integers(0, 2000, shape, dtype=np.uint32)
    return rng.random(shape) < 0.5


def _prod_data(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Inputs whose products neither overflow nor are all zero."""
    if dtype == "float32":
        x = np.exp(rng.uniform(-0.02, 0.02, shape)) * rng.choice([-1.0, 1.0], shape)
        return x.astype(np.float32)
    if dtype == "int32":  # odd factors: the product wraps around without becoming 0
        return rng.choice(np.array([-3, -1, 1, 3, 5], dtype=np.int32), shape)
    if dtype == "uint32":
        return rng.choice(np.array([1, 3, 5, 7], dtype=np.uint32), shape)
    return rng.random(shape) < 0.98


def _parse(spec: Any) -> tuple[Any, bool]:
    if isinstance(spec, str) and spec.startswith("k"):
        return eval(spec[1:]), True  # noqa: S307 - the test's own literals
    return spec, False


FNS = ["sum", "prod", "max", "min", "mean", "var", "std", "all", "any", "count_nonzero",
       "logsumexp", "argmax", "argmin"]


def _reference(name: str, x: np.ndarray, axis: Any, keepdims: bool) -> tuple[Any, Any, Any]:
    """(want, rtol, atol) for ``name`` over ``axis`` in float64 (exact for integers)."""
    n = x.size if axis is None else math.prod(
        x.shape[a] for a in ((axis,) if isinstance(axis, int) else axis))
    kw = {"axis": axis, "keepdims": keepdims}
    isfloat = x.dtype == np.float32
    x64 = x.astype(np.float64)
    if name in ("sum", "prod"):
        if not isfloat:
            dt = np.int32 if x.dtype == np.bool_ else x.dtype
            want = getattr(np, name)(x.astype(dt), dtype=dt, **kw)
            return want, 0.0, 0.0
        if name == "sum":
            return np.sum(x64, **kw), 0.0, 1e-5 * _log2(n) * np.sum(np.abs(x64), **kw)
        return np.prod(x64, **kw), 1e-5 * _log2(n), 0.0
    if name in ("max", "min", "all", "any", "count_nonzero"):
        want = getattr(np, name)(x, **kw)
        return (want.astype(np.int32) if name == "count_nonzero" else want), 0.0, 0.0
    if name in ("argmax", "argmin"):
        want = getattr(np, name)(x, axis=axis, keepdims=keepdims)
        return want.astype(np.int32), 0.0, 0.0
    if name == "mean":
        return np.mean(x64, **kw), 0.0, 1e-5 * _log2(n) * np.mean(np.abs(x64), **kw)
    if name in ("var", "std"):
        return getattr(np, name)(x64, **kw), 3e-5 * _log2(n), 1e-30
    assert name == "logsumexp"
    want = _lse64(x, axis, keepdims)
    return want, 1e-6, 3e-5 * _log2(n)


RESULT_DTYPE = {"mean": "float32", "var": "float32", "std": "float32", "logsumexp": "float32",
                "all": "bool", "any": "bool", "count_nonzero": "int32", "argmax": "int32",
                "argmin": "int32"}


@pytest.mark.parametrize("shape,dtype,specs", RUNS, ids=[f"{r[0]}-{r[1]}" for r in RUNS])
def test_reductions_match_numpy(rng: np.random.Generator, shape: tuple[int, ...], dtype: str,
                                specs: list[Any]) -> None:
    """Every reduction over every axis spec of the case, in one jitted function per case (the
    reductions over the same rows then share kernels, as user code would have them). Every
    dtype meets shapes of 1, 2 and 3 axes, tuple axes and keepdims."""
    x = _data(rng, shape, dtype)
    xp = _prod_data(rng, shape, dtype)
    runs = []
    for spec in specs:
        axis, keep = _parse(spec)
        for name in FNS:
            if name in ("argmax", "argmin") and isinstance(axis, tuple):
                continue
            runs.append((name, axis, keep))

    def f(x: Any, xp: Any) -> Any:
        return tuple(getattr(fnp, name)(xp if name == "prod" else x, axis=axis, keepdims=keep)
                     for name, axis, keep in runs)

    outs = fusec.gpu_jit(f)(x, xp)
    for (name, axis, keep), got in zip(runs, outs):
        want, rtol, atol = _reference(name, xp if name == "prod" else x, axis, keep)
        dt = RESULT_DTYPE.get(name) or ("int32" if dtype == "bool" and name in ("sum", "prod")
                                        else dtype)
        assert_same(got, np.asarray(want), rtol, atol, dtype=dt,
                    what=f"{name}(axis={axis}, keepdims={keep}) of {dtype}{shape}")


@pytest.mark.parametrize("dtype", ["int32", "uint32", "bool"])
def test_integer_reductions_on_the_gpu_target(rng: np.random.Generator, dtype: str) -> None:
    """The "gpu" target's kernels (rows cached in registers, columns split into partial
    kernels that read runs of rows) with integer and bool data, along rows and columns."""
    x = _data(rng, (70, 300), dtype)
    xp = _prod_data(rng, (70, 300), dtype)
    runs = [(name, axis) for axis in (-1, 0) for name in FNS]

    def f(a: Any, b: Any) -> Any:
        return tuple(getattr(fnp, name)(b if name == "prod" else a, axis=axis)
                     for name, axis in runs)

    with forced_target("gpu"):
        outs = fusec.gpu_jit(f)(x, xp)
    for (name, axis), got in zip(runs, outs):
        want, rtol, atol = _reference(name, xp if name == "prod" else x, axis, False)
        assert_same(got, np.asarray(want), rtol, atol, what=f"{name}(axis={axis}) of {dtype}")


def test_integer_sums_and_products_wrap(rng: np.random.Generator) -> None:
    """int32/uint32 sums and products wrap around modulo 2^32, as numpy's in the same dtype."""
    xi = rng.integers(-(2**31), 2**31, (5, 301), dtype=np.int64).astype(np.int32)
    xu = rng.integers(0, 2**32, (5, 301), dtype=np.int64).astype(np.uint32)

    @fusec.gpu_jit
    def f(a: Any, b: Any) -> Any:
        return fnp.sum(a, axis=1), fnp.prod(a, axis=1), fnp.sum(b, axis=0), fnp.prod(b)

    s, p, su, pu = f(xi, xu)
    assert_same(s, np.sum(xi, axis=1, dtype=np.int32), dtype="int32")
    assert_same(p, np.prod(xi, axis=1, dtype=np.int32), dtype="int32")
    assert_same(su, np.sum(xu, axis=0, dtype=np.uint32), dtype="uint32")
    assert_same(pu, np.prod(xu, dtype=np.uint32), dtype="uint32")


def test_prod_of_bool_and_empty() -> None:
    """bool products are int32 (numpy gives an integer); an empty axis gives 1 (all: True, any:
    False, sum: 0, count_nonzero: 0)."""
    b = np.array([[True, True, False], [True, True, True]])
    got = fnp.prod(b, axis=1)
    assert_same(got, np.array([0, 1]), dtype="int32")
    e = np.zeros((3, 0), np.float32)

    @fusec.gpu_jit
    def f(x: Any) -> Any:
        return (fnp.prod(x, axis=1), fnp.all(x, axis=1), fnp.any(x, axis=1),
                fnp.sum(x, axis=1), fnp.count_nonzero(x, axis=1), fnp.logsumexp(x, axis=1))

    p, al, an, s, c, lse = f(e)
    assert_same(p, np.ones(3, np.float32), dtype="float32")
    assert_same(al, np.ones(3, bool), dtype="bool")
    assert_same(an, np.zeros(3, bool), dtype="bool")
    assert_same(s, np.zeros(3, np.float32), dtype="float32")
    assert_same(c, np.zeros(3, np.int32), dtype="int32")
    assert_same(lse, np.full(3, -np.inf), dtype="float32")


def test_methods_and_eager_calls(rng: np.random.Generator) -> None:
    """x.prod(), x.all(), x.argmax(), x.std() on traced values; fnp functions outside jit."""
    x = rng.standard_normal((4, 9)).astype(np.float32)

    @fusec.gpu_jit
    def f(a: Any) -> Any:
        return a.argmax(axis=1), a.argmin(), (a > 0).all(axis=0), (a > 0).any(), a.std(axis=1)

    am, ami, al, an, sd = f(x)
    assert_same(am, np.argmax(x, axis=1).astype(np.int32), dtype="int32")
    assert_same(ami, np.int32(np.argmin(x)), dtype="int32")
    assert_same(al, np.all(x > 0, axis=0), dtype="bool")
    assert_same(an, np.any(x > 0), dtype="bool")
    assert_same(sd, np.std(x.astype(np.float64), axis=1), 1e-5, 0.0, dtype="float32")
    assert_same(fnp.argmax(x, axis=0), np.argmax(x, axis=0).astype(np.int32), dtype="int32")
    assert_same(fnp.count_nonzero(x > 0.5), np.int32(np.count_nonzero(x > 0.5)), dtype="int32")


def test_argmax_first_occurrence_and_keepdims() -> None:
    """Ties give the first index; -0.0 equals 0.0 (numpy compares values); keepdims shapes."""
    x = np.array([[1, 5, 5, 2], [0, 0, 0, 0], [-0.0, 0.0, -1, 0.0], [3, -2, -2, 3]], np.float32)

    @fusec.gpu_jit
    def f(a: Any) -> Any:
        return (fnp.argmax(a, axis=1), fnp.argmin(a, axis=1), fnp.argmax(a, axis=0, keepdims=True),
                fnp.argmin(a, keepdims=True), fnp.argmax(a.astype(bool), axis=1))

    am, ami, am0, amk, ab = f(x)
    assert_same(am, np.argmax(x, axis=1).astype(np.int32))
    assert_same(ami, np.argmin(x, axis=1).astype(np.int32))
    assert_same(am0, np.argmax(x, axis=0, keepdims=True).astype(np.int32))
    assert_same(amk, np.argmin(x, keepdims=True).astype(np.int32))
    assert_same(ab, np.argmax(x.astype(bool), axis=1).astype(np.int32))


def test_var_ddof_correction_and_accuracy(rng: np.random.Generator) -> None:
    """ddof and correction (the Array API's name) divide by n - ddof; n - ddof <= 0 gives inf or
    NaN as numpy; values with a large common offset keep their variance (two passes)."""
    x = (1e4 + rng.standard_normal((6, 1001))).astype(np.float32)
    x[5] = 0.0  # constant row: variance 0, and 0/0 with ddof >= n
    x64 = x.astype(np.float64)

    @fusec.gpu_jit
    def f(a: Any) -> Any:
        return (fnp.var(a, axis=1), fnp.var(a, axis=1, ddof=1), fnp.std(a, axis=1, correction=1),
                fnp.var(a, axis=1, ddof=1001),
                fnp.var(a, axis=1, ddof=1002.0))

    v, v1, s1, vn, vover = f(x)
    # rtol: the sum of squared deviations as a float32 sum; atol: the square of the mean's error
    # (1e-5 * log2 n * 1e4 at most) against variances of about 1
    assert_same(v, np.var(x64, axis=1), 1e-4, 1e-5, dtype="float32")
    assert_same(v1, np.var(x64, axis=1, ddof=1), 1e-4, 1e-5, dtype="float32")
    assert_same(s1, np.std(x64, axis=1, ddof=1), 1e-4, 1e-5, dtype="float32")
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want_n = np.var(x64, axis=1, ddof=1001)
        want_over = np.var(x64, axis=1, ddof=1002)
    assert_same(vn, want_n, 0, 0, dtype="float32")  # inf where the sum > 0, NaN for row 5
    assert_same(vover, want_over, 0, 0, dtype="float32")
    with pytest.raises(TraceError, match="ddof or correction"):
        fnp.var(x, ddof=1, correction=1)


# --- NaN and inf in every strategy ----------------------------------------------------------------


def _unit_values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """+-exp(u), |u| <= 0.02: products of 2^20 of them stay far inside float32's range (the
    log of the product is a random walk of about 12 at the end, 88 is the limit), where a
    float64 reference of standard normals would not underflow as float32 does."""
    signs = rng.choice(np.array([-1.0, 1.0]), shape)
    return (signs * np.exp(rng.uniform(-0.02, 0.02, shape))).astype(np.float32)


def _nan_rows(rng: np.random.Generator, length: int, copies: int) -> np.ndarray:
    """Rows: plain, NaN first / middle / last, NaN only, -inf only, +inf only, +-inf, +inf and
    NaN, -inf among values, ties at the maximum; then ``copies`` times over with fresh values."""
    blocks = []
    for _ in range(copies):
        base = _unit_values(rng, (11, length))
        mid = length // 2
        base[1, 0] = np.nan
        base[2, mid] = np.nan
        base[3, -1] = np.nan
        base[4, :] = np.nan
        base[5, :] = -np.inf
        base[6, :] = np.inf
        base[7, 0], base[7, -1] = np.inf, -np.inf
        base[8, mid], base[8, 0] = np.inf, np.nan
        base[8, -1] = np.nan
        base[9, mid] = -np.inf
        base[10, :] = 1.0
        base[10, mid] = 2.0
        blocks.append(base)
    return np.concatenate(blocks)


NAN_FNS: dict[str, Callable[..., Any]] = {
    "max": np.max, "min": np.min, "sum": np.sum, "prod": np.prod, "mean": np.mean,
    "var": np.var, "std": np.std, "all": np.all, "any": np.any,
    "count_nonzero": np.count_nonzero, "argmax": np.argmax, "argmin": np.argmin,
    "nanmax": np.nanmax, "nanmin": np.nanmin, "nansum": np.nansum, "nanmean": np.nanmean,
    "logsumexp": _lse64,
}


def _check_nan_case(x: np.ndarray, axis: Any, what: str) -> None:
    names = list(NAN_FNS)

    def f(a: Any) -> Any:
        return tuple(getattr(fnp, n)(a, axis=axis) for n in names)

    outs = fusec.gpu_jit(f)(x)
    n = x.size if axis is None else x.shape[axis]
    x64 = x.astype(np.float64)
    for name, got in zip(names, outs):
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = np.asarray(NAN_FNS[name](x64 if name not in ("argmax", "argmin") else x,
                                            axis=axis))
        # finite results only where all values are finite: the plain rows; the tolerance of a
        # float32 sum (or product, mean, var) of n terms of size ~1
        tol = 1e-5 * _log2(n) * (n if name in ("sum", "nansum") else 1)
        if name in ("argmax", "argmin", "count_nonzero"):
            want = want.astype(np.int32)
        assert_same(got, want, 1e-5 * _log2(n), tol, what=f"{name} {what}")


@pytest.mark.parametrize("target", ["cpu", "gpu"])
@pytest.mark.parametrize("length,copies", [(7, 1), (300, 6), (16385, 1)])
def test_nan_rows(rng: np.random.Generator, target: str, length: int, copies: int) -> None:
    """Rows of each kind (see _nan_rows) reduced along the row and, transposed, along columns:
    11 rows give the "cpu" target's workgroup kernels, 66 its thread-per-row kernels; the "gpu"
    target keeps rows of 300 in registers and splits columns (partial kernels)."""
    x = _nan_rows(rng, length, copies)
    with forced_target(target):
        _check_nan_case(x, -1, f"of rows of {length} ({target})")
        if length < 16385:
            _check_nan_case(np.ascontiguousarray(x.T), 0, f"of columns of {length} ({target})")


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_nan_split_rows(rng: np.random.Generator, target: str) -> None:
    """Rows of 2^18 + 3 take the split path (partial kernels over chunks of each row, then a
    small reduction of the chunks' results): a NaN at the start, middle or end of a row, or two
    of them (argmax must return the first), must reach its row's result; +inf and -inf too."""
    x = _unit_values(rng, (6, 2**18 + 3))
    n = x.shape[1]
    x[1, 0] = np.nan
    x[2, n // 2 + 1] = np.nan
    x[3, n - 1] = np.nan
    x[4, 70_001], x[4, 200_003] = np.nan, np.nan
    x[5, 1234], x[5, 99_999] = np.inf, -np.inf
    with forced_target(target):
        _check_nan_case(x, -1, f"of rows of 2^18+3 ({target})")


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_nan_long_1d(rng: np.random.Generator, target: str) -> None:
    """A whole 1-D array of 2^20 + 3 reduced to one value (split): a NaN in the middle reaches
    it (WGSL's min dropped NaN: fnp.min of such an array gave a number)."""
    x = _unit_values(rng, (2**20 + 3,))
    x[524_289] = np.nan
    x[1000] = np.inf
    with forced_target(target):
        _check_nan_case(x, None, f"of 2^20+3 elements ({target})")


def test_each_function_alone_with_nan(rng: np.random.Generator) -> None:
    """Each function jitted on its own (its own kernels, as a user calling only argmax gets),
    on the "gpu" target's register-cached row kernels."""
    x = _nan_rows(rng, 300, 1)
    x64 = x.astype(np.float64)
    with forced_target("gpu"):
        for name, ref in NAN_FNS.items():
            got = fusec.gpu_jit(lambda a, fn=getattr(fnp, name): fn(a, axis=1))(x)
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                want = np.asarray(ref(x if name in ("argmax", "argmin") else x64, axis=1))
            if name in ("argmax", "argmin", "count_nonzero"):
                want = want.astype(np.int32)
            assert_same(got, want, 1e-5 * _log2(300), 1e-5 * _log2(300) * 300, what=name)


@pytest.mark.parametrize("target", ["cpu", "gpu"])
@pytest.mark.parametrize("shape,axis", [((11, 300), 1), ((11, 7), 1), ((11, 20001), 1),
                                        ((300, 11), 0), ((2200, 40), 1)])
def test_argmax_pairs_every_strategy(rng: np.random.Generator, target: str,
                                     shape: tuple[int, int], axis: int) -> None:
    """argmax and argmin jitted alone take one pass of (value, index) pairs (codegen's
    _first_index): the first NaN, else the first of tied extremes, in every strategy (register-
    cached rows, rows too long for registers, columns, a thread per row for 2200 short rows, the
    "cpu" target's kernels). Float32 rows of each NaN / inf kind and rows of few distinct values
    (many ties); int32 rows at INT_MIN and INT_MAX; uint32 rows at 0 and 2^32-1."""
    length = shape[axis]
    rows = _nan_rows(rng, length, 1)
    other = shape[1 - axis]
    reps = -(-other // rows.shape[0])
    floats = np.concatenate([rows] * reps)[:other]
    floats[-3:] = rng.integers(-2, 3, (3, length)).astype(np.float32)  # ties everywhere
    ints = rng.integers(-3, 4, (other, length)).astype(np.int32)
    ints[0], ints[1] = np.iinfo(np.int32).min, np.iinfo(np.int32).max
    ints[2, length // 2] = np.iinfo(np.int32).min
    uints = rng.integers(0, 4, (other, length)).astype(np.uint32)
    uints[0], uints[1] = 0, np.iinfo(np.uint32).max
    for x in (floats, ints, uints):
        if axis == 0:
            x = np.ascontiguousarray(x.T)
        for name in ("argmax", "argmin"):
            fn = getattr(fnp, name)
            with forced_target(target):
                f = fusec.gpu_jit(lambda a, fn=fn: fn(a, axis=axis))
                text = f.lower(x).as_text("wgsl")
                got = f(x)
            ty = {"float32": "f32", "int32": "i32", "uint32": "u32"}[x.dtype.name]
            helper = f"fusec_{name}_{ty}("
            assert helper in text, f"{name} of {x.dtype} {x.shape} did not take the pair pass"
            want = getattr(np, name)(x, axis=axis).astype(np.int32)
            assert_same(got, want, 0, 0, what=f"{name} {x.dtype} {x.shape} axis {axis} ({target})")


def test_argmax_pairs_off_gives_two_passes() -> None:
    """With FIRST_INDEX off the kernel is the two reductions again (so the test above compares
    the pair pass, not the old kernel), with the same results."""
    x = np.array([[1.0, 3.0, 3.0, np.nan, 2.0], [-np.inf] * 5], dtype=np.float32)
    saved = codegen.FIRST_INDEX
    try:
        codegen.FIRST_INDEX = 0
        with forced_target("gpu"):
            f = fusec.gpu_jit(lambda a: fnp.argmax(a, axis=1))
            text = f.lower(x).as_text("wgsl")
            got = f(x)
    finally:
        codegen.FIRST_INDEX = saved
    assert "fusec_argmax_f32(" not in text and "fusec_min_i32(" in text
    assert_same(got, np.array([3, 0], dtype=np.int32), 0, 0)


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_softmax_nan_and_inf_rows(rng: np.random.Generator, target: str) -> None:
    """softmax and log_softmax (max, then sum of exp, fused): a row with a NaN is NaN, as numpy's
    formula gives; a row of -inf is NaN (-inf - -inf); one +inf gives NaN too (inf - inf)."""
    x = _nan_rows(rng, 300, 1)
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        e = np.exp(x64 - np.max(x64, axis=-1, keepdims=True))
        want = e / np.sum(e, axis=-1, keepdims=True)
        shifted = x64 - np.max(x64, axis=-1, keepdims=True)
        want_log = shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
    with forced_target(target):
        got = fusec.gpu_jit(lambda a: (nn.softmax(a), nn.log_softmax(a)))(x)
    assert_same(got[0], want, 1e-5, 1e-7, dtype="float32", what="softmax")
    assert_same(got[1], want_log, 1e-5, 1e-5, dtype="float32", what="log_softmax")


# --- fusion: argmax and friends read their rows once ----------------------------------------------


def _kernels(fn: Callable[..., Any], shape: tuple[int, ...], target: str) -> list[Any]:
    """The kernel equations ``fn`` compiles to for a float32 argument of ``shape`` (the pass
    pipeline and code generation only: no buffer is made, so shapes past the adapter's binding
    limit can be checked)."""
    with forced_target(target):
        traced = fusec.gpu_jit(fn).trace(fusec.ShapeDtype(shape, "float32"))
    prog = run_pipeline(traced.program, traced.options)
    kernels = [e for e in prog.eqns if e.op is Op.KERNEL]
    for e in kernels:  # every kernel's WGSL can be generated
        assert "fn main" in codegen.generate(e, target).wgsl
    return kernels


@pytest.mark.parametrize("target", ["cpu", "gpu"])
@pytest.mark.parametrize("name", ["argmax", "argmin", "var", "logsumexp", "nanmax"])
def test_row_reductions_are_one_kernel(target: str, name: str) -> None:
    """Over the rows of 8192 x 8192 (the issue's benchmark) each of these is one kernel with
    one input and one value per row out (compile only). On GPUs it loads each element once:
    a workgroup's 256 threads hold the row in registers, 32 elements each, and the second
    reduction reads those."""
    fn = getattr(fnp, name)
    kernels = _kernels(lambda a: fn(a, axis=-1), (8192, 8192), target)
    assert len(kernels) == 1, [k.params["name"] for k in kernels]
    (k,) = kernels
    assert [v.shape for v in k.inputs] == [(8192, 8192)]
    assert [v.shape for v in k.outs] == [(8192,)]
    if target == "gpu":
        assert codegen.generate(k, target).wgsl.count("in0[") == 8192 // 256


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_argmax_1d_split(target: str) -> None:
    """A full 1-D argmax of 2^24 elements is split (partial maxima, the maximum, partial first
    indices, the first index): a few kernels, not one per element block."""
    kernels = _kernels(lambda a: fnp.argmax(a), (2**24,), target)
    assert 2 <= len(kernels) <= 4, [k.params["name"] for k in kernels]


def test_max_kernel_propagates_nan_in_wgsl() -> None:
    """The float max/min combines go through the NaN-propagating helpers in every template."""
    with forced_target("gpu"):
        lo = fusec.gpu_jit(lambda a: (fnp.max(a), fnp.min(a, axis=0))).lower(
            fusec.ShapeDtype((1024, 300), "float32"))
    text = lo.as_text("wgsl")
    assert "fusec_max_f32(" in text and "fusec_min_f32(" in text
    assert "max(acc" not in text and "min(acc" not in text


def test_no_let_shadows_a_type() -> None:
    """argmax's cached row kernel has over 32 index lets; none may be named i32 (it would
    shadow the type that iota's cast calls)."""
    with forced_target("gpu"):
        lo = fusec.gpu_jit(lambda a: fnp.argmax(a, axis=1)).lower(
            fusec.ShapeDtype((11, 3000), "float32"))
    text = lo.as_text("wgsl")
    assert "i32(" in text and max(int(n) for n in re.findall(r"let i(\d+) ", text)) > 32
    assert "let i32 " not in text


# --- errors ---------------------------------------------------------------------------------------


def test_errors_name_the_axis() -> None:
    x = np.zeros((3, 0), np.float32)
    with pytest.raises(ShapeError, match="axis 1"):
        fnp.argmax(x, axis=1)
    with pytest.raises(ShapeError, match="empty array"):
        fnp.argmin(x)
    with pytest.raises(ShapeError, match="axis 1"):
        fnp.max(x, axis=1)
    with pytest.raises(ShapeError, match="axis 1"):
        fnp.nanmin(x, axis=-1)
    y = np.ones((3, 4), np.float32)
    with pytest.raises(ShapeError, match="axis 2"):
        fnp.argmax(y, axis=2)
    with pytest.raises(ShapeError, match="axis -3"):
        fnp.var(y, axis=-3)
    with pytest.raises(TraceError, match="axis must be an int or None"):
        fnp.argmax(y, axis=(0, 1))
    assert_same(fnp.argmax(x, axis=0), np.zeros(0, np.int32), dtype="int32")


# --- einsum ---------------------------------------------------------------------------------------

EINSUMS = [
    ("ij,jk->ik", [(5, 7), (7, 3)]),
    ("ij,jk", [(4, 6), (6, 9)]),
    ("bij,bjk->bik", [(3, 4, 5), (3, 5, 2)]),
    ("...ij,...jk->...ik", [(2, 3, 4, 5), (3, 5, 6)]),
    ("...ij,...jk", [(2, 1, 4, 5), (3, 5, 6)]),
    ("i,j->ij", [(5,), (7,)]),
    ("i,i", [(33,), (33,)]),
    ("i,i->i", [(33,), (33,)]),
    ("ij->ji", [(5, 7)]),
    ("ij->", [(9, 13)]),
    ("ij->j", [(9, 13)]),
    ("ii->i", [(6, 6)]),
    ("ii", [(6, 6)]),
    ("iij->ji", [(4, 4, 3)]),
    ("ij,ij->ij", [(1, 3), (2, 3)]),
    ("ij,jk", [(2, 1), (3, 4)]),
    ("ijk,jl,lk->i", [(2, 3, 4), (3, 5), (5, 4)]),
    ("abc,cd,de->ae", [(2, 3, 4), (4, 5), (5, 6)]),
    ("Ba,aB", [(2, 3), (3, 2)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 8), (2, 3, 7, 8)]),
    ("i...->...", [(2, 3)]),
    ("...i,...i", [(2, 3), (5, 1, 3)]),
    ("ij,kl->ijkl", [(2, 3), (4, 5)]),
    ("i,ij,j->", [(4,), (4, 5), (5,)]),
    ("a b, b c -> a c", [(3, 4), (4, 2)]),
]


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_einsum_matches_numpy(rng: np.random.Generator, dtype: str) -> None:
    """All subscripts above in one jitted function. Float tolerance: each output is a sum of
    products, held to 1e-5 times the same sum of |products| (a float32 dot product of K terms
    errs by about sqrt(K) * 2^-24 of it; K <= 60 here); integers exactly."""
    ops = []
    for _, shapes in EINSUMS:
        if dtype == "float32":
            ops.append([rng.standard_normal(s).astype(np.float32) for s in shapes])
        else:
            ops.append([rng.integers(-20, 20, s, dtype=np.int32) for s in shapes])

    @fusec.gpu_jit
    def f(operands: Any) -> Any:
        return tuple(fnp.einsum(sub, *o) for (sub, _), o in zip(EINSUMS, operands))

    outs = f(ops)
    for (sub, _), o, got in zip(EINSUMS, ops, outs):
        want = np.einsum(sub, *[a.astype(np.float64) for a in o])
        if dtype == "int32":
            assert_same(got, want, dtype="int32", what=sub)
        else:
            bound = np.einsum(sub, *[np.abs(a.astype(np.float64)) for a in o])
            assert_same(got, want, 0.0, 1e-5 * bound + 1e-30, dtype="float32", what=sub)


def test_einsum_bool_eager_and_mixed_dtypes(rng: np.random.Generator) -> None:
    """bool operands give bool (numpy: logical and/or); outside jit einsum runs eagerly; int32
    with float32 promotes to float32."""
    a = rng.random((4, 5)) < 0.3
    b = rng.random((5, 3)) < 0.3
    assert_same(fnp.einsum("ij,jk->ik", a, b), np.einsum("ij,jk->ik", a, b), dtype="bool")
    assert_same(fnp.einsum("ij->", a), np.einsum("ij->", a), dtype="bool")
    c = rng.integers(-5, 5, (4, 5), dtype=np.int32)
    d = rng.standard_normal((5,)).astype(np.float32)
    want = np.einsum("ij,j->i", c.astype(np.float64), d.astype(np.float64))
    assert_same(fnp.einsum("ij,j->i", c, d), want, 1e-5, 1e-5, dtype="float32")


@pytest.mark.parametrize("sub,shapes,match", [
    ("ij,jk->ik", [(2, 3)], "name 2 operand"),
    ("ij->ik", [(2, 3)], "'k' is in no operand"),
    ("ij->ii", [(2, 3)], "repeat a letter"),
    ("ij,jk->ik", [(2, 3), (4, 5)], "subscript 'j' has length 3"),
    ("ijk->i", [(2, 3)], "has 2 dimension"),
    ("i1->i", [(2, 3)], "holds '1'"),
    ("...ij->ij", [(2, 3, 4)], "no '...'"),
    ("ii->i", [(2, 3)], "subscript 'i' has length 2"),
    ("ii->i", [(1, 3)], "different lengths"),
    ("i->i->i", [(2,)], "more than one '->'"),
    ("......i->i", [(2,)], "more than one ellipsis"),
])
def test_einsum_errors(sub: str, shapes: list[tuple[int, ...]], match: str) -> None:
    with pytest.raises(ShapeError, match=match):
        fnp.einsum(sub, *[np.ones(s, np.float32) for s in shapes])


def test_int32_column_max_and_min_of_a_negation() -> None:
    # the H100's Vulkan compiler got 1373 of these 4096 maxima wrong when the reduction loop used
    # WGSL's signed max on a negated value (found by hypothesis); the combine compares unsigned keys
    rng = np.random.default_rng(0)
    x = rng.integers(-3, 4, (4, 64, 64)).astype(np.int32)
    f = fusec.gpu_jit(lambda a: (fnp.max(-a, axis=0), fnp.min(-a, axis=0), fnp.max(0 - a, axis=1)))
    hi, lo, hi1 = f(x)
    np.testing.assert_array_equal(np.asarray(hi), (-x).max(0))
    np.testing.assert_array_equal(np.asarray(lo), (-x).min(0))
    np.testing.assert_array_equal(np.asarray(hi1), (-x).max(1))
    ext = np.array([[-2**31, 2**31 - 1, 0, -1]], np.int32).repeat(3, 0)
    np.testing.assert_array_equal(np.asarray(fusec.gpu_jit(lambda a: fnp.max(a, axis=0))(ext)),
                                  ext.max(0))
    np.testing.assert_array_equal(np.asarray(fusec.gpu_jit(lambda a: fnp.min(a, axis=0))(ext)),
                                  ext.min(0))


@pytest.mark.parametrize("level", [2, 0])
@pytest.mark.parametrize("length", [1, 7, 384, 1000, 4099])
def test_row_combine_by_subgroup_shuffles_or_a_tree(rng: np.random.Generator,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    level: int, length: int) -> None:
    """Row kernels on the "gpu" target combine a row's threads (32 to 256 of them, by the row's
    length) by subgroup shuffles where the device has subgroup operations, else by a tree in
    workgroup memory (lavapipe's subgroups are 8 threads, so there a row's subgroups also meet
    in workgroup memory). Float sums, maxima and minima with NaN and infinities, integer sums
    and maxima, bool any: the same as numpy either way, and a layer norm's rows too."""
    subgroup_level(monkeypatch, level, need=min(level, 1))
    rows = 37
    x = (rng.standard_normal((rows, length)) * 3 + 1).astype(np.float32)
    x[1, length // 2] = np.nan
    x[2, 0] = np.inf
    x[3, -1] = -np.inf
    xi = rng.integers(-1000, 1000, (rows, length)).astype(np.int32)
    xu = rng.integers(0, 2**32 - 1, (rows, length), dtype=np.uint32)
    xb = rng.random((rows, length)) < 0.5 / length
    g = rng.standard_normal(length).astype(np.float32)

    def f(x: Any, xi: Any, xu: Any, xb: Any, g: Any) -> Any:
        return (fnp.sum(x, axis=-1), fnp.max(x, axis=-1), fnp.min(x, axis=-1),
                fnp.sum(xi, axis=-1), fnp.max(xu, axis=-1), fnp.any(xb, axis=-1),
                nn.layer_norm(x[4:], g, g, eps=1e-5))

    jf = fusec.gpu_jit(f)
    with forced_target("gpu"):
        outs = [np.asarray(o) for o in jf(x, xi, xu, xb, g)]
        kernels = jf.lower(x, xi, xu, xb, g).kernels
    xd = x.astype(np.float64)
    scale = np.nansum(np.abs(np.where(np.isinf(xd), 0, xd)), axis=-1)
    np.testing.assert_allclose(outs[0], xd.sum(-1), rtol=1e-5,
                               atol=1e-5 * max(1, math.log2(length)) * scale.max())
    np.testing.assert_array_equal(outs[1], x.max(-1))
    np.testing.assert_array_equal(outs[2], x.min(-1))
    np.testing.assert_array_equal(outs[3], xi.sum(-1, dtype=np.int32))
    np.testing.assert_array_equal(outs[4], xu.max(-1))
    np.testing.assert_array_equal(outs[5], xb.any(-1))
    y = xd[4:]
    mu = y.mean(-1, keepdims=True)
    want = (y - mu) / np.sqrt(((y - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + g
    np.testing.assert_allclose(outs[6], want, rtol=1e-4, atol=1e-4 * max(1, length ** 0.5))
    reduces = [k for k in kernels if k.kind == "reduce"]
    assert reduces
    for k in reduces:
        assert ("subgroupShuffleXor" in k.wgsl) == (level > 0), k.name
