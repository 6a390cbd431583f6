"""float16: a storage dtype, computed in float32 (where the adapter has ``shader-f16``).

Kernels load f16 elements as f32, compute in f32 and round to f16 where they store a value (or at
an explicit cast), so every result below is the float64 reference of the same float16 inputs up
to one rounding to float16 (relative 2^-11, the float16 unit roundoff, plus float32's own error
where it accumulates): tolerances are built from those. Sums and matmuls accumulate in float32:
the reductions of long rows below would be off by percents had they accumulated in float16.
The interpreter (FUSEC_BACKEND=cpu) rounds after every elementwise op, as numpy does, and
accumulates sums and matmuls in float32 too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
from helpers import REPO, forced_target, pythonpath, requires_wgpu

import fusec
import fusec.numpy as fnp
from fusec import nn
from fusec.errors import DTypeError
from fusec.interpret import evaluate
from fusec.runtime import F16_FEATURE, check_float16, get_runtime

F16 = np.float16
U16 = 2.0 ** -11  # float16 unit roundoff: one rounding to float16
U32 = 2.0 ** -24
TINY = 2.0 ** -25  # half the smallest float16 subnormal: rounding near zero
# under FUSEC_BACKEND=cpu the interpreter rounds after every elementwise op, as numpy does: a
# chain of k ops is k roundings there, one on the GPU
INTERPRETED = fusec.default_device().is_cpu_fallback


def chain(k: int) -> float:
    """Roundings to float16 of a fused chain of ``k`` elementwise ops."""
    return float(k) if INTERPRETED else 1.0


def h(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=F16)


def assert_f16(got: Any, want: Any, roundings: float = 1.0, extra: Any = 0.0) -> None:
    """``got`` is a float16 result within ``roundings`` float16 roundings (plus ``extra``, an
    absolute bound per element) of the float64 reference ``want``; NaN and inf where it has them.
    """
    got = np.asarray(got)
    assert got.dtype == F16, got.dtype
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    g = got.astype(np.float64)
    # beyond float16's range the result is an infinity: from 65520 up (rounding to nearest),
    # give or take the error allowed below that
    big = np.isfinite(want) & (np.abs(want) > 65504.0)
    near = big & (np.abs(want) < 65520.0 * (1 + roundings * U16))
    far = big & ~near
    assert np.all(np.isinf(g[far]) & (np.sign(g[far]) == np.sign(want[far])))
    assert np.all((np.abs(g[near]) >= 65504.0) & (np.sign(g[near]) == np.sign(want[near])))
    special = ~np.isfinite(want) | big
    np.testing.assert_array_equal(g[special & ~big], want[special & ~big])
    fin = ~special
    bound = roundings * U16 * np.abs(want[fin]) + TINY + np.broadcast_to(extra, want.shape)[fin]
    err = np.abs(g[fin] - want[fin])
    assert np.all(err <= bound), (f"max error {np.max(err - bound)} over the bound at "
                                  f"{np.argmax(err - bound)}")


def f64(*xs: np.ndarray) -> list[np.ndarray]:
    return [np.asarray(x, dtype=np.float64) for x in xs]


# --- dtypes and promotion -------------------------------------------------------------------------


def test_float16_is_a_dtype_of_its_own() -> None:
    assert fnp.float16 is np.float16
    x = fnp.asarray([1.5, -2.25, 7.0], dtype=fnp.float16)
    assert x.dtype == F16 and np.asarray(x).tolist() == [1.5, -2.25, 7.0]
    assert fnp.asarray(h([3.0])).dtype == F16  # float16 inputs stay float16
    y = fnp.asarray(np.array([1, 2, 2049], np.int32)).astype(np.float16)
    assert y.dtype == F16 and np.asarray(y).tolist() == [1.0, 2.0, 2048.0]  # 2049: ties to even
    assert fnp.finfo(fnp.float16).max == 65504.0
    assert fusec.ShapeDtype((3,), np.float16).dtype == "float16"


@pytest.mark.parametrize("other, scalar, want", [
    (np.float32, None, np.float32),  # float16 with float32: float32
    (np.int32, None, F16), (np.uint32, None, F16), (np.bool_, None, F16),  # with ints: float16
    (None, 2.0, F16), (None, 3, F16), (None, True, F16),  # Python scalars are weak
])
def test_promotion_as_jax(other: Any, scalar: Any, want: Any) -> None:
    x = h([1.0, 2.0, 3.0])
    f = fusec.gpu_jit(lambda a, b: a * b)
    b = np.array([2, 1, 0]).astype(other) if other is not None else scalar
    got = f(x, b)
    assert got.dtype == want, (other, scalar, got.dtype)
    ref = x.astype(np.float64) * np.asarray(b, np.float64)
    assert_f16(np.asarray(got).astype(F16), ref)
    assert fnp.result_type(x, other or scalar) == want


def test_weak_scalar_is_rounded_to_float16() -> None:
    # 0.1 as a float16 literal is 0.0999755859375: the product is that literal times x, rounded
    x = h([1.0, 3.0, 1000.0])
    got = np.asarray(fusec.gpu_jit(lambda a: a * 0.1)(x))
    assert got.dtype == F16
    np.testing.assert_array_equal(got, (x.astype(np.float64) * float(F16(0.1))).astype(F16))


def test_strict_dtypes_keeps_float16_and_still_refuses_float64() -> None:
    fusec.config.set("strict_dtypes", 1)
    try:
        out = fusec.gpu_jit(lambda a: a + 1)(h([1.0, 2.0]))
        assert out.dtype == F16
        with pytest.raises(DTypeError, match="float64"):
            fusec.gpu_jit(lambda a: a + 1)(np.ones(2))
    finally:
        fusec.config.set("strict_dtypes", None)


# --- elementwise ----------------------------------------------------------------------------------


def _with_specials(x: np.ndarray) -> np.ndarray:
    x = x.copy()
    x[:4] = [np.nan, np.inf, -np.inf, 0.0]
    return x


@pytest.mark.parametrize("n", [7, 1023, 4097])
def test_elementwise_ops_round_once(n: int, rng: np.random.Generator) -> None:
    x = _with_specials(h(rng.standard_normal(n) * 4))
    y = h(rng.uniform(0.5, 3.0, n) * rng.choice([-1, 1], n))
    fns = {
        "add": (lambda a, b: a + b, lambda a, b: a + b),
        "sub": (lambda a, b: a - b, lambda a, b: a - b),
        "mul": (lambda a, b: a * b, lambda a, b: a * b),
        "div": (lambda a, b: a / b, lambda a, b: a / b),
        "exp": (lambda a, b: fnp.exp(a), lambda a, b: np.exp(a)),
        "tanh": (lambda a, b: fnp.tanh(a), lambda a, b: np.tanh(a)),
        "sqrt|": (lambda a, b: fnp.sqrt(fnp.abs(a)), lambda a, b: np.sqrt(np.abs(a))),
        "max": (lambda a, b: fnp.maximum(a, b), lambda a, b: np.maximum(a, b)),
        "neg": (lambda a, b: -a, lambda a, b: -a),
    }
    f = fusec.gpu_jit(lambda a, b: tuple(fn(a, b) for fn, _ in fns.values()))
    outs = f(x, y)
    x64, y64 = f64(x, y)
    with np.errstate(all="ignore"):
        for (name, (_, ref)), got in zip(fns.items(), outs):
            # exp and tanh: float32's own few ULP on top of the rounding to float16
            assert_f16(got, ref(x64, y64), roundings=1.05)
    # NaN propagates from x's first element into every op; x / 0 and overflow give inf
    assert all(np.isnan(np.asarray(o)[0]) for o in outs)


def test_a_fused_chain_rounds_once(rng: np.random.Generator) -> None:
    x = h(rng.standard_normal(1000))
    got = fusec.gpu_jit(lambda a: fnp.exp(a * 0.5) * a - a / 3.0)(x)
    x64 = x.astype(np.float64)
    c = float(F16(0.5)), float(F16(3.0))
    # computed in float32 from the (float16-rounded) literals, rounded once at the store
    assert_f16(got, np.exp(x64 * c[0]) * x64 - x64 / c[1], roundings=chain(5),
               extra=1e-6 * (np.exp(x64) + 1) * np.abs(x64) + chain(5) * U16 * np.abs(x64))


def test_overflow_to_infinity_past_65504() -> None:
    x = h([65504.0, 30000.0, -40000.0, 1.0, 10.0, 60000.0, 11.5])
    f = fusec.gpu_jit(lambda a: (a * 2, a + 0, fnp.exp(a), a + 5.0))
    dbl, same, ex, plus = (np.asarray(o) for o in f(x))
    np.testing.assert_array_equal(dbl, [np.inf, 60000.0, -np.inf, 2.0, 20.0, np.inf, 23.0])
    np.testing.assert_array_equal(same, x)
    # exp(11.5) = 98715: past float16's range although float32 holds it
    assert np.all(ex[[0, 1, 5, 6]] == np.inf) and ex[2] == 0
    assert ex[4] == F16(np.exp(10.0)) and ex[3] == F16(np.e)
    # 65504 + 5 = 65509 rounds back to 65504 (below 65520, where rounding reaches infinity)
    assert plus[0] == 65504.0
    big = np.array([65519.0, 65520.0, -65520.0, 1e6, 65504.0, 3e-8], np.float32)
    cast = np.asarray(fusec.gpu_jit(lambda a: a.astype(np.float16))(big))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(cast, big.astype(F16))
    assert cast.tolist()[:4] == [65504.0, np.inf, -np.inf, np.inf]


def test_comparisons_and_where(rng: np.random.Generator) -> None:
    x = _with_specials(h(rng.standard_normal(301)))
    y = h(rng.standard_normal(301))
    z = rng.standard_normal(301).astype(np.float32)
    f = fusec.gpu_jit(lambda a, b, c: (a < b, a == b, a != b, a >= c, fnp.where(a > b, a, b),
                                       fnp.where(a > 0, a, -1.5), fnp.isnan(a), fnp.isinf(a)))
    lt, eq, ne, ge, w, w2, isn, isi = (np.asarray(o) for o in f(x, y, z))
    np.testing.assert_array_equal(lt, x < y)
    np.testing.assert_array_equal(eq, x == y)
    np.testing.assert_array_equal(ne, x != y)  # NaN != anything
    np.testing.assert_array_equal(ge, x.astype(np.float32) >= z)  # compared in float32
    assert w.dtype == F16 and w2.dtype == F16
    np.testing.assert_array_equal(w, np.where(x > y, x, y))
    np.testing.assert_array_equal(w2, np.where(x > 0, x, F16(-1.5)))
    np.testing.assert_array_equal(isn, np.isnan(x))
    np.testing.assert_array_equal(isi, np.isinf(x))


# --- casts ----------------------------------------------------------------------------------------


def test_casts_to_and_from_every_dtype(rng: np.random.Generator) -> None:
    x = _with_specials(h(rng.standard_normal(257) * 300))
    x[4] = -0.0
    fin = np.isfinite(x)
    xf = np.where(fin, x, 0).astype(F16)
    f = fusec.gpu_jit(lambda a, b: (a.astype(np.float32), b.astype(np.int32),
                                    fnp.abs(b).astype(np.uint32), a.astype(bool)))
    to32, to_i, to_u, to_b = (np.asarray(o) for o in f(x, xf))
    np.testing.assert_array_equal(to32, x.astype(np.float32))  # exact
    np.testing.assert_array_equal(to_i, xf.astype(np.int32))  # toward zero
    np.testing.assert_array_equal(to_u, np.abs(xf).astype(np.uint32))
    np.testing.assert_array_equal(to_b, x.astype(bool))  # NaN is true, -0.0 false
    ints = np.array([0, -7, 2049, 4097, 65504, 65519, 65520, 2**31 - 1, -(2**31)], np.int32)
    uints = np.array([0, 1, 2049, 70000, 2**32 - 1], np.uint32)
    b = np.array([True, False, True])
    g = fusec.gpu_jit(lambda i, u, t, w: (i.astype(np.float16), u.astype(np.float16),
                                          t.astype(np.float16), w.astype(np.float16)))
    wide = rng.standard_normal(1000).astype(np.float32) * 1000
    fi, fu, fb, fw = (np.asarray(o) for o in g(ints, uints, b, wide))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(fi, ints.astype(F16))  # 65520 and beyond: inf
        np.testing.assert_array_equal(fu, uints.astype(F16))
        np.testing.assert_array_equal(fw, wide.astype(F16))  # rounded to nearest, ties to even
    np.testing.assert_array_equal(fb, b.astype(F16))
    assert all(o.dtype == F16 for o in (fi, fu, fb, fw))


def test_a_cast_inside_a_kernel_rounds(rng: np.random.Generator) -> None:
    x = rng.standard_normal(513).astype(np.float32)
    # the float16 value in the middle of a float32 computation: f32(f16(v))
    f = fusec.gpu_jit(lambda a: (lambda r: (r, r + a))(
        (a * 3.0).astype(np.float16).astype(np.float32)))
    assert len(f.lower(x).kernels) == 1  # the cast and its use in one kernel
    r, s = (np.asarray(v) for v in f(x))
    assert r.dtype == s.dtype == np.float32
    want = (x * 3).astype(F16).astype(np.float32)
    # WGSL leaves the rounding of a conversion to f16 to the device (lavapipe rounds to
    # nearest-even as numpy does; the H100 mostly does not): a float16 value within one float16
    # step of the product, used as such by the rest of the kernel
    np.testing.assert_array_equal(r.astype(F16).astype(np.float32), r)
    ulp = np.spacing(np.abs(x * 3).astype(F16)).astype(np.float32)
    assert np.all(np.abs(r - x * 3) <= ulp), np.max(np.abs(r - x * 3) / ulp)
    np.testing.assert_array_equal(s, r + x)
    if "llvmpipe" in fusec.default_device().adapter:
        np.testing.assert_array_equal(r, want)
    got = r - x * 3
    assert np.any(got != 0)  # the rounding did happen


# --- reductions -----------------------------------------------------------------------------------


def _sum_bound(x64: np.ndarray, want: np.ndarray, axis: Any) -> np.ndarray:
    """One rounding to float16 of the result plus float32 accumulation (1e-6 per log2 n of the
    sum of magnitudes): far below what float16 accumulation would lose (see the module)."""
    n = x64.size if axis is None else x64.shape[axis]
    acc = 1e-6 * max(1.0, np.log2(n)) * np.abs(x64).sum(axis=axis)
    return np.asarray(U16 * np.abs(want) + acc)


@pytest.mark.parametrize("target, shape, axis", [
    ("cpu", (10007,), None), ("cpu", (3, 10007), 1), ("cpu", (10007, 3), 0),
    ("cpu", (70001,), None), ("cpu", (1,), None),
    # the GPU strategies: rows cached in registers (f16 arrays), split columns, split rows
    ("gpu", (5, 1000), 1), ("gpu", (10007, 3), 0), ("gpu", (70001,), None)])
def test_sums_of_long_rows_accumulate_in_float32(target: str, shape: tuple[int, ...], axis: Any,
                                                 rng: np.random.Generator) -> None:
    with forced_target(target):
        _check_reductions(shape, axis, rng)


def _check_reductions(shape: tuple[int, ...], axis: Any, rng: np.random.Generator) -> None:
    # mostly positive values: the sum grows to thousands, where float16's spacing is 2 or more
    x = h(rng.random(shape) * 1.5 - 0.25)
    f = fusec.gpu_jit(lambda a: (a.sum(axis=axis), a.mean(axis=axis), a.max(axis=axis),
                                 fnp.argmax(a, axis=axis), a.min(axis=axis)))
    s, m, mx, am, mn = f(x)
    x64 = x.astype(np.float64)
    want = x64.sum(axis=axis)
    n = x.size if axis is None else x.shape[axis]
    assert np.asarray(s).dtype == F16 and np.asarray(m).dtype == F16
    err = np.abs(np.asarray(s, np.float64) - want)
    assert np.all(err <= _sum_bound(x64, want, axis) + TINY), (err, want)
    mean = want / n
    assert np.all(np.abs(np.asarray(m, np.float64) - mean) <= U16 * np.abs(mean)
                  + _sum_bound(x64, want, axis) / n + TINY)
    np.testing.assert_array_equal(np.asarray(mx), x.max(axis=axis))
    np.testing.assert_array_equal(np.asarray(mn), x.min(axis=axis))
    np.testing.assert_array_equal(np.asarray(am), np.argmax(x, axis=axis))


def test_reductions_propagate_nan_and_inf(rng: np.random.Generator) -> None:
    x = h(rng.standard_normal((4, 33)))
    x[1, 5] = np.nan
    x[2, 7] = np.inf
    x[3, :] = 40000.0  # the sum passes 65504: inf, though every element is finite
    s, mx, am = (np.asarray(o) for o in fusec.gpu_jit(
        lambda a: (a.sum(axis=1), a.max(axis=1), fnp.argmax(a, axis=1)))(x))
    assert np.isnan(s[1]) and s[2] == np.inf and s[3] == np.inf
    assert np.isnan(mx[1]) and mx[2] == np.inf and mx[3] == 40000.0
    np.testing.assert_array_equal(am, np.argmax(x, axis=1))


def test_cumsum_accumulates_in_float32(rng: np.random.Generator) -> None:
    x = h(rng.random((3, 1023)))
    got = fusec.gpu_jit(lambda a: fnp.cumsum(a, axis=1))(x)
    x64 = x.astype(np.float64)
    want = np.cumsum(x64, axis=1)
    assert_f16(got, want, extra=1e-6 * 10 * want)


# --- matmul ---------------------------------------------------------------------------------------


def _mm_check(got: Any, a: np.ndarray, b: np.ndarray, dtype: Any) -> None:
    a64, b64 = f64(a, b)
    want = a64 @ b64
    acc = 1e-6 * np.sqrt(a.shape[-1]) * (np.abs(a64) @ np.abs(b64))
    got = np.asarray(got)
    assert got.dtype == dtype
    if dtype == F16:
        assert_f16(got, want, extra=acc)
    else:
        assert np.all(np.abs(got - want) <= acc + 1e-30)


@pytest.mark.parametrize("target", ["cpu", "gpu"])
@pytest.mark.parametrize("m, k, n", [(1, 7, 1), (37, 129, 65), (64, 256, 128), (5, 1023, 7)])
def test_matmul_float16(m: int, k: int, n: int, target: str, rng: np.random.Generator) -> None:
    a, b = h(rng.standard_normal((m, k))), h(rng.standard_normal((k, n)))
    b32 = rng.standard_normal((k, n)).astype(np.float32)
    f = fusec.gpu_jit(lambda x, y, z: (x @ y, x @ z, (x @ y) * 2.0 + 1.0))
    with forced_target(target):
        p16, p32, epi = f(a, b, b32)
    _mm_check(p16, a, b, F16)
    _mm_check(p32, a, b32, np.float32)  # float16 @ float32 promotes to float32
    a64, b64 = f64(a, b)
    # x @ y is a float16 array: a matmul kernel's epilogue takes its float32 sum as it is, but
    # where the product is lowered as a reduction (the gpu target's plan for 1 x 7 x 1) the sum
    # is cast to float16 first, an explicit cast that rounds. So the epilogue's input may carry
    # one float16 rounding of the product (which * 2.0 doubles) beside the result's own
    assert_f16(epi, (a64 @ b64) * 2 + 1, roundings=chain(2),
               extra=2e-6 * np.sqrt(k) * (np.abs(a64) @ np.abs(b64))
               + 2 * U16 * np.abs(a64 @ b64))


# GPU strategies on lavapipe (the "gpu" target): the few-row and few-column templates, a product
# split along K (its chunks in float32), a small product computed as a sum, B read as vec4<f16>
@pytest.mark.parametrize("m, k, n", [(4, 300, 260), (1100, 64, 3), (40, 2051, 40),
                                     (8, 4096, 8), (64, 256, 128)])
def test_matmul_float16_gpu_templates(m: int, k: int, n: int, rng: np.random.Generator,
                                      gpu_target: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from fusec import codegen

    monkeypatch.setattr(codegen, "GEMV_MIN_KN", 0)  # (the few-row template for (4, 300, 260))
    a, b = h(rng.standard_normal((m, k))), h(rng.standard_normal((k, n)))
    f = fusec.gpu_jit(lambda x, y: x @ y)
    _mm_check(f(a, b), a, b, F16)
    if (m, k, n) == (40, 2051, 40):  # split along K (padded): the partial products are float32
        ir = str(f.lower(a, b).ir)
        assert "matmul" in ir and "f32[4,40,40]" in ir, ir


@requires_wgpu
def test_large_float16_matmul_compiles(gpu_target: None) -> None:
    # the pipelined 128x128 tile with B read as vec4<f16> (compiled, not run: lavapipe is slow)
    a = fusec.ShapeDtype((1024, 1024), np.float16)
    lowered = fusec.gpu_jit(lambda x, y: x @ y).lower(a, a)
    src = lowered.as_text("wgsl")
    assert "array<vec4<f16>>" in src and "vec4<f32>(in1[" in src
    lowered.compile()


@requires_wgpu
def test_gpu_target_vec4_elementwise(rng: np.random.Generator, gpu_target: None) -> None:
    n = (1 << 16) + 4  # large enough for vec4 loads and stores (vec4<f16>: 8 bytes)
    x, y = h(rng.standard_normal(n)), h(rng.standard_normal(n))
    f = fusec.gpu_jit(lambda a, b: a * b + a)
    assert "vec4<f16>" in f.lower(x, y).as_text("wgsl")
    x64, y64 = f64(x, y)
    assert_f16(f(x, y), x64 * y64 + x64, roundings=chain(2),
               extra=(chain(2) - 1) * U16 * np.abs(x64 * y64))


# --- nn -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target, shape", [("cpu", (7, 300)), ("cpu", (2, 10007)),
                                           ("gpu", (7, 300)), ("gpu", (3, 20000))])
def test_normalisations_compute_in_float32(target: str, shape: tuple[int, int],
                                           rng: np.random.Generator) -> None:
    with forced_target(target):
        _check_normalisations(shape, rng)


def _check_normalisations(shape: tuple[int, int], rng: np.random.Generator) -> None:
    x = h(rng.standard_normal(shape) * 3)
    w = h(rng.standard_normal(shape[-1]))
    f = fusec.gpu_jit(lambda a, g: (nn.softmax(a), nn.rms_norm(a, g), nn.layer_norm(a, g, g),
                                    nn.log_softmax(a)))
    sm, rms, ln, lsm = f(x, w)
    x64, w64 = f64(x, w)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    want_sm = e / e.sum(-1, keepdims=True)
    want_rms = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * w64
    mu = x64.mean(-1, keepdims=True)
    want_ln = (x64 - mu) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5) * w64 + w64
    want_lsm = x64 - x64.max(-1, keepdims=True) - np.log(e.sum(-1, keepdims=True))
    assert_f16(sm, want_sm, roundings=1.01)
    assert_f16(rms, want_rms, roundings=1.01, extra=1e-5 * np.abs(w64))
    assert_f16(ln, want_ln, roundings=1.01, extra=1e-4 * np.abs(w64))
    assert_f16(lsm, want_lsm, roundings=1.01, extra=1e-5)


# --- odd sizes, transfers, donation ---------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 7, 1023, 4097])
def test_odd_sizes_round_trip_and_compute(n: int, rng: np.random.Generator) -> None:
    x = _with_specials(h(rng.standard_normal(n + 4)))[4 - min(n, 4):][:n]
    bits = x.view(np.uint16)
    dev = fusec.device_put(x)
    assert dev.dtype == F16 and dev.nbytes == 2 * n
    np.testing.assert_array_equal(np.asarray(dev).view(np.uint16), bits)  # every bit back
    y = fusec.gpu_jit(lambda a: a * 2.0 - 1.0)(dev)
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        assert_f16(y, x64 * 2 - 1)
    # a float16 output next to a float32 one (buffers of 2 and 4 bytes an element)
    s, c = fusec.gpu_jit(lambda a: (a[::-1], a.astype(np.float32)))(dev)
    # every bit through a kernel too, but a NaN's payload, which GPUs may make their own
    nan = np.isnan(x[::-1])
    got = np.asarray(s)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], bits[::-1][~nan])
    np.testing.assert_array_equal(np.asarray(c), x.astype(np.float32))


def test_a_donated_float16_input(rng: np.random.Generator) -> None:
    x = h(rng.standard_normal(7))
    dev = fusec.device_put(x)
    f = fusec.gpu_jit(lambda a: a * 3.0 + 1.0, donate_argnums=0)
    y = f(dev)
    assert dev.is_deleted and y.dtype == F16
    assert_f16(y, x.astype(np.float64) * 3 + 1, roundings=chain(2),
               extra=(chain(2) - 1) * 3 * U16 * np.abs(x.astype(np.float64)))
    y_host = np.asarray(y)
    z = f(y)  # the output donated in turn
    assert y.is_deleted
    assert_f16(z, y_host.astype(np.float64) * 3 + 1, roundings=chain(2),
               extra=(chain(2) - 1) * 3 * U16 * np.abs(y_host.astype(np.float64)))


# --- creation, indexing, sorting, random ----------------------------------------------------------


def test_creation_ops() -> None:
    f = fusec.gpu_jit(lambda: (fnp.zeros((3, 5), np.float16), fnp.ones(7, np.float16),
                               fnp.full((2,), 0.1, np.float16), fnp.arange(4099, dtype=np.float16),
                               fnp.linspace(0, 1, 11, dtype=np.float16),
                               fnp.eye(3, dtype=np.float16)))
    z, o, fl, ar, ls, ey = (np.asarray(v) for v in f())
    assert all(v.dtype == F16 for v in (z, o, fl, ar, ls, ey))
    assert not z.any() and (o == 1).all() and (fl == F16(0.1)).all()
    np.testing.assert_array_equal(ar, np.arange(4099, dtype=F16))  # rounds past 2048
    np.testing.assert_array_equal(ls, np.linspace(0, 1, 11).astype(F16))
    np.testing.assert_array_equal(ey, np.eye(3, dtype=F16))


def test_indexing_concatenate_and_sorting(rng: np.random.Generator) -> None:
    x = h(rng.standard_normal((9, 130)))
    x[2, :3] = [np.nan, -0.0, 0.0]
    ids = np.array([3, 0, 8, 3, -1], np.int32)
    f = fusec.gpu_jit(lambda a, i: (fnp.take(a, i, axis=0), a[1:7:2, ::-3],
                                    fnp.concatenate([a, a[:2] * 2.0]), fnp.sort(a, axis=1),
                                    fnp.argsort(a, axis=1), a.at[i].add(1.5)))
    tk, sl, cc, so, ao, sc = (np.asarray(v) for v in f(x, ids))
    np.testing.assert_array_equal(tk, x[ids])
    np.testing.assert_array_equal(sl, x[1:7:2, ::-3])
    np.testing.assert_array_equal(cc, np.concatenate([x, x[:2] * F16(2)]))
    np.testing.assert_array_equal(so, np.sort(x, axis=1))
    np.testing.assert_array_equal(ao, np.argsort(x, axis=1, kind="stable"))
    want = x.astype(np.float64)
    np.add.at(want, ids, 1.5)
    assert sc.dtype == F16
    assert_f16(sc, want)
    assert all(v.dtype == F16 for v in (tk, sl, cc, so))


def test_random_float16() -> None:
    k = fusec.random.key(7)
    f = fusec.gpu_jit(lambda key: (fusec.random.normal(key, (4001,), dtype=np.float16),
                                   fusec.random.uniform(key, (4001,), dtype=np.float16),
                                   fusec.random.normal(key, (4001,))))
    n16, u16, n32 = (np.asarray(v) for v in f(k))
    assert n16.dtype == F16 and u16.dtype == F16
    np.testing.assert_array_equal(n16, n32.astype(F16))  # the same draws, rounded
    assert abs(n16.astype(np.float64).mean()) < 0.1 and abs(n16.astype(np.float64).std() - 1) < 0.1
    assert u16.min() >= 0 and u16.max() < 1


# --- transforms and control flow ------------------------------------------------------------------


def test_grad_of_float16_gives_float16_cotangents(rng: np.random.Generator) -> None:
    x, w = h(rng.standard_normal((5, 7))), h(rng.standard_normal((7, 3)))

    def loss(a: Any, b: Any) -> Any:
        return fnp.sum(nn.softmax(a @ b) * fnp.tanh(a @ b))

    gx, gw = fusec.gpu_jit(fusec.grad(loss, argnums=(0, 1)))(x, w)
    rx, rw = fusec.gpu_jit(fusec.grad(loss, argnums=(0, 1)))(x.astype(np.float32),
                                                              w.astype(np.float32))
    assert gx.dtype == F16 and gw.dtype == F16
    for g, r in ((gx, rx), (gw, rw)):
        r = np.asarray(r, np.float64)
        # the float32 gradient, off by the roundings of the float16 intermediates
        assert np.all(np.abs(np.asarray(g, np.float64) - r) <= 1e-2 * np.abs(r).max())
    # through a cast: the gradient of a float32 computation of a float16 input is float16
    g = fusec.gpu_jit(fusec.grad(lambda a: fnp.sum(a.astype(np.float32) ** 2)))(x)
    assert g.dtype == F16
    assert_f16(g, 2 * x.astype(np.float64))


def test_vmap_and_loop_carries(rng: np.random.Generator) -> None:
    x = h(rng.standard_normal((6, 7)))
    w = h(rng.standard_normal((7, 3)))
    v = fusec.gpu_jit(fusec.vmap(lambda r: fnp.tanh(r @ w)))(x)
    x64, w64 = f64(x, w)
    assert_f16(v, np.tanh(x64 @ w64), extra=1e-5 * np.sqrt(7) * (np.abs(x64) @ np.abs(w64)))

    def loop(c: Any, xs: Any) -> Any:
        return fusec.lax.fori_loop(0, 6, lambda i, c: c * 0.5 + xs[i], c)

    fl = np.asarray(fusec.gpu_jit(loop)(h(np.ones(7)), x))
    ref = np.ones(7, F16)
    for i in range(6):  # each iteration's carry is stored (rounded) in a float16 buffer
        ref = (ref.astype(np.float32) * 0.5 + x[i].astype(np.float32)).astype(F16)
    assert fl.dtype == F16
    np.testing.assert_array_equal(fl, ref)

    def step(c: Any, r: Any) -> tuple[Any, Any]:
        c = c + r
        return c, c * 2.0

    last, ys = fusec.gpu_jit(lambda xs: fusec.lax.scan(step, fnp.zeros(7, np.float16), xs))(x)
    assert last.dtype == F16 and ys.dtype == F16
    c, want = np.zeros(7, F16), []
    for r in x:  # the carry is rounded to float16 as each iteration stores it
        c = (c.astype(np.float32) + r.astype(np.float32)).astype(F16)
        want.append(c * F16(2))
    np.testing.assert_array_equal(np.asarray(ys), np.array(want))
    np.testing.assert_array_equal(np.asarray(last), c)


# --- inspection and the device feature ------------------------------------------------------------


@requires_wgpu
def test_wgsl_enables_f16_only_where_it_stores_it() -> None:
    f = fusec.gpu_jit(lambda a: a * 2.0)
    src = f.lower(h(np.ones(5))).as_text("wgsl")
    assert "enable f16;" in src and "array<f16>" in src and "fusec_f16(" in src
    assert src.index("enable f16;") < src.index("@group")
    assert "enable f16;" not in f.lower(np.ones(5, np.float32)).as_text("wgsl")


@requires_wgpu
def test_no_shader_f16_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    f = fusec.gpu_jit(lambda a: a.astype(np.float32) + 1)
    prog = f.trace(h(np.ones(3))).ir
    check_float16(prog, (F16_FEATURE,), "some adapter")  # has it: fine
    check_float16(fusec.gpu_jit(lambda a: a + 1).trace(np.ones(3, np.float32)).ir, (), "x")
    with pytest.raises(DTypeError) as info:
        check_float16(prog, ("timestamp-query",), "Fake Adapter 9000", "f")
    msg = str(info.value)
    for word in ("float16", "Fake Adapter 9000", F16_FEATURE, "astype(np.float32)",
                 "FUSEC_BACKEND=cpu"):
        assert word in msg, msg
    # through the jit: an adapter without the feature refuses the program when it compiles it
    rt = get_runtime()
    assert rt is not None
    monkeypatch.setattr(rt.info, "features",
                        tuple(x for x in rt.info.features if x != F16_FEATURE))
    with pytest.raises(DTypeError, match="lacks the WebGPU feature 'shader-f16'"):
        fusec.gpu_jit(lambda a: a * 3)(h(np.ones(3)))
    assert np.asarray(fusec.gpu_jit(lambda a: a * 3)(np.ones(3, np.float32))).tolist() == [3] * 3


# --- the interpreter ------------------------------------------------------------------------------


def test_interpreter_accumulates_in_float32(rng: np.random.Generator) -> None:
    x = h(rng.random((2, 10007)))
    a, b = h(rng.standard_normal((33, 1023))), h(rng.standard_normal((1023, 9)))
    prog = fusec.gpu_jit(lambda v, p, q: (v.sum(axis=1), p @ q, fnp.cumsum(v, axis=1),
                                          nn.softmax(v))).trace(x, a, b).ir
    s, mm, cs, sm = evaluate(prog, [x, a, b])
    x64 = x.astype(np.float64)
    want = x64.sum(axis=1)
    assert s.dtype == F16 and np.all(np.abs(s - want) <= _sum_bound(x64, want, 1))
    _mm_check(mm, a, b, F16)
    cwant = np.cumsum(x64, axis=1)
    assert_f16(cs, cwant, extra=1e-6 * 14 * cwant)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    assert_f16(sm, e / e.sum(-1, keepdims=True), roundings=1.01)


def test_interpreter_backend_in_a_process() -> None:
    code = textwrap.dedent("""
        import json
        import numpy as np
        import fusec, fusec.numpy as fnp
        x = (np.arange(10007) % 7 * 0.25 + 0.125).astype(np.float16)
        f = fusec.gpu_jit(lambda a: (a.sum(), a * 2.0, a.astype(np.float32), fnp.argsort(a)))
        s, d, c, o = f(x)
        print(json.dumps({"backend": fusec.default_device().backend,
                          "dtypes": [str(np.asarray(v).dtype) for v in (s, d, c, o)],
                          "sum": float(np.asarray(s)), "want": float(x.astype(np.float64).sum()),
                          "doubled": bool((np.asarray(d) == x * np.float16(2)).all()),
                          "sorted": bool((x[np.asarray(o)] == np.sort(x)).all())}))
    """)
    env = {**os.environ, "FUSEC_BACKEND": "cpu", "FUSEC_CACHE_DIR": "off",
           "PYTHONPATH": pythonpath()}
    p = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["backend"] == "cpu"
    assert out["dtypes"] == ["float16", "float16", "float32", "int32"]
    assert abs(out["sum"] - out["want"]) <= U16 * out["want"]  # float16 accumulation: far off
    assert out["doubled"] and out["sorted"]
