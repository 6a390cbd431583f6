"""Cumulative sums, products, maxima and minima along an axis (fusec.numpy.scans, the
``cumulative`` primitive, its lowering into ``scan_reduce``/``scan`` stages and their kernels).

Conventions
-----------
* Results run on the wgpu device. Kernels are generated for the adapter's target ("cpu" on
  lavapipe: a thread walks each chunk) and, where a test takes the ``gpu_target`` fixture, for
  GPUs (workgroups scan tiles; vec4 loads where rows are contiguous and a multiple of 4 long).
* Float sums and products are checked against float64 numpy with the bound float32 rounding
  gives whatever the order of the operations: position k along the axis combines k + 1 values
  in k operations, each off by at most u = 2^-24 relatively, so |error| <= k u sum(|x|) for a
  sum and k u |product| for a product (to first order; we allow (k + 1) u and 1% more).
* Long rows are also checked exactly: integer-valued float32 data sums exactly in any order
  below 2^24, and the GPU must match the interpreter of the lowered program bit for bit (the
  stages' references follow the kernels' order of operations).
* Integers wrap around as numpy's int32/uint32 (numpy's int64 results reduced modulo 2^32);
  max and min are exact; NaN propagates as in numpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import forced_target, requires_wgpu

import fusec
import fusec.numpy as fnp
from fusec.errors import DTypeError, ShapeError, TraceError
from fusec.interpret import evaluate
from fusec.ir import Op
from fusec.kernels import scan as scan_kernels
from fusec.numpy.scans import cumulative

U = 2.0 ** -24
S = fusec.ShapeDtype
FUNCS = {"sum": fnp.cumsum, "prod": fnp.cumprod, "max": fnp.cummax, "min": fnp.cummin}


def jit(fn: Any) -> Any:
    return fusec.gpu_jit(fn)


def run(fn: Any, *args: Any) -> Any:
    out = jit(fn)(*args)
    if isinstance(out, tuple):
        return tuple(np.asarray(o) for o in out)
    return np.asarray(out)


def reference(x: np.ndarray, reduce: str, axis: Any, reverse: bool = False) -> np.ndarray:
    """numpy's result in float64 (floats) or int64 (integers, reduced to 32 bits by the
    caller); axis None flattens."""
    if axis is None:
        x, axis = x.reshape(-1), 0
    wide = x.astype(np.float64) if x.dtype == np.float32 else (
        x.astype(np.int64) if x.dtype != np.bool_ else x)
    if reverse:
        wide = np.flip(wide, axis)
    fn = {"sum": np.cumsum, "prod": np.cumprod, "max": np.maximum.accumulate,
          "min": np.minimum.accumulate}[reduce]
    out = fn(wide, axis=axis) if wide.ndim else fn(wide.reshape(1), axis=0)
    return np.flip(out, axis) if reverse else out


def positions(shape: tuple[int, ...], axis: Any) -> np.ndarray:
    """Each element's position k along the scanned axis (of the flattened array for None)."""
    if axis is None:
        return np.arange(int(np.prod(shape)))
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return np.broadcast_to(np.arange(shape[axis]).reshape(view), shape)


def assert_float_scan(got: np.ndarray, x: np.ndarray, reduce: str, axis: Any,
                      reverse: bool = False) -> None:
    want = reference(x, reduce, axis, reverse)
    assert got.dtype == np.float32 and got.shape == want.shape, (got.dtype, got.shape)
    if reduce in ("max", "min"):
        np.testing.assert_array_equal(got, want.astype(np.float32))
        return
    k = positions(x.shape, axis if axis is None else axis % x.ndim)
    if reverse:
        k = np.flip(k, axis)
    if reduce == "sum":
        scale = reference(np.abs(x), "sum", axis, reverse)
    else:
        scale = np.abs(want)
    bound = 1.01 * (k.reshape(want.shape) + 1) * U * scale
    err = np.abs(got.astype(np.float64) - want)
    bad = ~(err <= bound)
    assert not bad.any(), (f"{bad.sum()} of {bad.size} off: worst {err.max():.3g}, "
                           f"got {got.ravel()[:6]}, want {want.ravel()[:6]}")


def assert_int_scan(got: np.ndarray, x: np.ndarray, reduce: str, axis: Any,
                    dtype: str) -> None:
    want = reference(x, reduce, axis)
    assert got.dtype == np.dtype(dtype), (got.dtype, dtype)
    np.testing.assert_array_equal(got, want.astype(dtype))


def all_four(x: Any, axis: Any) -> tuple[Any, ...]:
    return (fnp.cumsum(x, axis=axis), fnp.cumprod(x, axis=axis), fnp.cummax(x, axis=axis),
            fnp.cummin(x, axis=axis))


# --- numpy semantics over shapes, axes and dtypes -------------------------------------------------

FLOAT_CASES = [((1,), None), ((7,), 0), ((1000,), -1), ((3, 257), 1), ((3, 257), 0),
               ((257, 3), 0), ((257, 3), -1), ((2, 5, 33), 0), ((2, 5, 33), 1),
               ((2, 5, 33), -1), ((2, 5, 33), None)]


@pytest.mark.parametrize("shape,axis", FLOAT_CASES)
def test_float32(shape: tuple[int, ...], axis: Any, rng: np.random.Generator) -> None:
    x = rng.standard_normal(shape).astype(np.float32)
    # products of values near 1 (either sign) stay far from overflow and underflow
    p = (np.exp(rng.normal(0, 0.1, shape)) * rng.choice([-1, 1], shape)).astype(np.float32)
    got = run(lambda a, b: (fnp.cumsum(a, axis=axis), fnp.cummax(a, axis=axis),
                            fnp.cumprod(b, axis=axis), fnp.cummin(a, axis=axis)), x, p)
    assert_float_scan(got[0], x, "sum", axis)
    assert_float_scan(got[1], x, "max", axis)
    assert_float_scan(got[2], p, "prod", axis)
    assert_float_scan(got[3], x, "min", axis)


INT_CASES = [((1000,), None), ((3, 257), 1), ((257, 3), 0), ((2, 5, 33), 1)]


@pytest.mark.parametrize("dtype", ["int32", "uint32"])
@pytest.mark.parametrize("shape,axis", INT_CASES)
def test_integers_wrap_around_as_numpy(dtype: str, shape: tuple[int, ...], axis: Any,
                                       rng: np.random.Generator) -> None:
    info = np.iinfo(dtype)
    # the full range: sums and products overflow and must wrap around
    x = rng.integers(info.min, info.max, shape, endpoint=True, dtype=np.int64).astype(dtype)
    got = run(lambda a: all_four(a, axis), x)
    for g, reduce in zip(got, ("sum", "prod", "max", "min")):
        assert_int_scan(g, x, reduce, axis, dtype)


@pytest.mark.parametrize("shape,axis", INT_CASES[1:])
def test_bool(shape: tuple[int, ...], axis: Any, rng: np.random.Generator) -> None:
    x = rng.random(shape) < 0.7
    got = run(lambda a: all_four(a, axis), x)
    # numpy: sums and products of bool count in int (int64, here int32); max and min stay bool
    assert_int_scan(got[0], x, "sum", axis, "int32")
    assert_int_scan(got[1], x, "prod", axis, "int32")
    np.testing.assert_array_equal(got[2], np.logical_or.accumulate(x, axis=axis))
    np.testing.assert_array_equal(got[3], np.logical_and.accumulate(x, axis=axis))
    assert got[2].dtype == np.bool_ and got[3].dtype == np.bool_


def test_int32_wraps_at_the_boundary() -> None:
    x = np.array([2**31 - 2, 1, 1, 1, -5, 2**30, 2**30, 2**30], dtype=np.int32)
    got = run(lambda a: (fnp.cumsum(a), fnp.cumprod(a)), x)
    np.testing.assert_array_equal(got[0], np.cumsum(x.astype(np.int64)).astype(np.int32))
    np.testing.assert_array_equal(got[1], np.cumprod(x.astype(np.int64)).astype(np.int32))
    assert got[0][1] == 2**31 - 1 and got[0][2] == -(2**31)  # past the largest int32


def test_dtype_argument_and_result_dtypes(rng: np.random.Generator) -> None:
    i = rng.integers(-100, 100, 50).astype(np.int32)
    b = rng.random(50) < 0.5
    u = rng.integers(0, 100, 50).astype(np.uint32)
    got = run(lambda i, b, u: (fnp.cumsum(i, dtype=np.float32), fnp.cumsum(b, dtype=bool),
                               fnp.cumprod(b, dtype="bool"), fnp.cumsum(u), fnp.cumsum(b),
                               fnp.cumsum(u, dtype="int32")), i, b, u)
    assert [g.dtype.name for g in got] == ["float32", "bool", "bool", "uint32", "int32",
                                           "int32"]
    np.testing.assert_array_equal(got[0], np.cumsum(i).astype(np.float32))  # exact: small ints
    np.testing.assert_array_equal(got[1], np.cumsum(b, dtype=bool))
    np.testing.assert_array_equal(got[2], np.cumprod(b, dtype=bool))
    np.testing.assert_array_equal(got[3], np.cumsum(u).astype(np.uint32))
    np.testing.assert_array_equal(got[4], np.cumsum(b))
    np.testing.assert_array_equal(got[5], np.cumsum(u.astype(np.int64)).astype(np.int32))


def test_zero_d_and_empty_arrays(rng: np.random.Generator) -> None:
    got = run(lambda a: (fnp.cumsum(a), fnp.cumprod(a, axis=0)), np.float32(3.5))
    np.testing.assert_array_equal(got[0], [3.5])
    np.testing.assert_array_equal(got[1], [3.5])
    for shape, axis in [((0, 3), 1), ((4, 0), 1), ((0,), None)]:
        e = np.zeros(shape, np.float32)
        out = run(lambda a: fnp.cumsum(a, axis=axis), e)
        assert out.shape == np.cumsum(e, axis=axis).shape and out.dtype == np.float32


def test_methods_and_eager_calls(rng: np.random.Generator) -> None:
    x = rng.standard_normal((4, 6)).astype(np.float32)
    got = run(lambda a: (a.cumsum(axis=1), a.cumprod(0)), x)
    assert_float_scan(got[0], x, "sum", 1)
    assert_float_scan(got[1], x, "prod", 0)
    eager = fnp.cummax(x, axis=1)  # outside gpu_jit: compiled and run on the device
    assert isinstance(eager, fusec.Array)
    np.testing.assert_array_equal(np.asarray(eager), np.maximum.accumulate(x, axis=1))


def test_in_a_larger_program(rng: np.random.Generator) -> None:
    # the scan reads its operand from a buffer: an elementwise producer is a kernel of its own,
    # and what reads the scan's result fuses as usual
    x = rng.integers(-8, 9, (6, 300)).astype(np.float32)
    f = jit(lambda a: fnp.cumsum(a * 2.0 + 1.0, axis=1) - fnp.cummax(a, axis=0) * 0.5)
    assert len(f.lower(x).kernels) == 4  # a * 2 + 1, the two scans, the difference
    want = np.cumsum(x * 2 + 1, axis=1) - np.maximum.accumulate(x, axis=0) * 0.5
    np.testing.assert_array_equal(np.asarray(f(x)), want)  # exact: small integers and halves


# --- the Array API functions ----------------------------------------------------------------------


def test_cumulative_sum_and_prod(rng: np.random.Generator) -> None:
    x = rng.integers(-5, 6, (3, 9)).astype(np.int32)
    v = rng.integers(-5, 6, 11).astype(np.float32)
    got = run(lambda x, v: (fnp.cumulative_sum(x, axis=1, include_initial=True),
                            fnp.cumulative_prod(x, axis=0, include_initial=True),
                            fnp.cumulative_sum(v), fnp.cumulative_prod(v, include_initial=True),
                            fnp.cumulative_sum(x, axis=-1, dtype=np.float32)), x, v)
    for g, w in zip(got, [np.cumulative_sum(x, axis=1, include_initial=True),
                          np.cumulative_prod(x, axis=0, include_initial=True),
                          np.cumulative_sum(v), np.cumulative_prod(v, include_initial=True),
                          np.cumulative_sum(x, axis=-1, dtype=np.float32)]):
        assert g.shape == w.shape, (g.shape, w.shape)
        np.testing.assert_array_equal(g, w.astype(g.dtype))
    assert [g.dtype.name for g in got] == ["int32", "int32", "float32", "float32", "float32"]


def test_errors() -> None:
    x = np.ones((3, 4), np.float32)
    with pytest.raises(ShapeError, match=r"cumsum: axis 2 is out of bounds"):
        jit(lambda a: fnp.cumsum(a, axis=2))(x)
    with pytest.raises(ShapeError, match=r"cummax: axis -3 is out of bounds"):
        jit(lambda a: fnp.cummax(a, axis=-3))(x)
    with pytest.raises(ShapeError, match=r"cumulative_sum: axis is required .* 2 dimensions"):
        jit(lambda a: fnp.cumulative_sum(a))(x)
    with pytest.raises(TraceError, match=r"cumprod: axis must be an int or None"):
        jit(lambda a: fnp.cumprod(a, axis=(0, 1)))(x)
    with pytest.raises(DTypeError, match=r"cumsum's dtype"):
        jit(lambda a: fnp.cumsum(a, dtype=np.complex64))(x)


# --- NaN and inf ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [300, 70001])
def test_nan_and_inf_propagate(n: int, rng: np.random.Generator) -> None:
    # integer values: every finite sum is exact, so numpy's float32 results are the answer
    x = rng.integers(-8, 9, n).astype(np.float32)
    x[n // 3] = np.inf
    y = rng.integers(-8, 9, n).astype(np.float32)
    y[n // 2] = np.nan
    z = np.ones(n, np.float32)
    z[n // 5], z[n // 4] = np.inf, 0.0  # inf * 0: NaN from there on
    got = run(lambda x, y, z: (fnp.cumsum(x), fnp.cumsum(y), fnp.cummax(y), fnp.cummin(y),
                               fnp.cumprod(z), fnp.cummax(x)), x, y, z)
    with np.errstate(invalid="ignore"):
        want = [np.cumsum(x), np.cumsum(y), np.maximum.accumulate(y),
                np.minimum.accumulate(y), np.cumprod(z), np.maximum.accumulate(x)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert np.isnan(got[2][n // 2:]).all() and not np.isnan(got[2][:n // 2]).any()
    assert np.isinf(got[0][n // 3]) and np.isnan(got[4][n // 4:]).all()


# --- long rows: the three-stage path --------------------------------------------------------------

LONG = (1 << 20) + 3


def _long_row_checks(rng: np.random.Generator) -> None:
    x = rng.integers(-8, 9, LONG).astype(np.float32)  # exact in any order (|sums| < 2^24)
    f = jit(lambda a: (fnp.cumsum(a), fnp.cummax(a, reverse=True)))
    assert len(f.lower(x).kernels) == 6  # scan_reduce, scan of the chunks, scan; twice
    got = f(x)
    np.testing.assert_array_equal(np.asarray(got[0]), np.cumsum(x))
    np.testing.assert_array_equal(np.asarray(got[1]),
                                  np.flip(np.maximum.accumulate(np.flip(x))))
    r = rng.standard_normal(LONG).astype(np.float32)
    g = jit(lambda a: fnp.cumsum(a))
    out = np.asarray(g(r))
    assert_float_scan(out, r, "sum", 0)
    # bit for bit what the stages' references compute
    np.testing.assert_array_equal(out, evaluate(g.lower(r).ir, [r])[0])


@requires_wgpu
def test_long_row(rng: np.random.Generator) -> None:
    _long_row_checks(rng)


@requires_wgpu
def test_long_row_gpu_kernels(gpu_target: None, rng: np.random.Generator) -> None:
    _long_row_checks(rng)


@requires_wgpu
@pytest.mark.parametrize("shape,axis,reverse", [((1 << 18,), 0, False), ((1 << 18,), 0, True),
                                                ((5, 40000), 1, True), ((40000, 3), 0, False),
                                                ((3, 5000, 7), 1, True)])
@pytest.mark.parametrize("reduce", ["sum", "prod"])
def test_gpu_kernels_match_the_staged_reference(gpu_target: None, shape: tuple[int, ...],
                                                axis: int, reverse: bool, reduce: str,
                                                rng: np.random.Generator) -> None:
    """GPU kernels (vec4 loads for contiguous rows of a multiple of 4, strided rows walked by a
    thread), forwards and backwards, against the interpreter of the lowered program: equal bit
    for bit, and within float32's bound of float64 numpy."""
    if reduce == "sum":
        x = rng.standard_normal(shape).astype(np.float32)
    else:
        x = np.exp(rng.normal(0, 1e-3, shape)).astype(np.float32)
    f = jit(lambda a: cumulative(a, reduce, axis, reverse))
    lowered = f.lower(x)
    assert len(lowered.kernels) >= 3
    got = np.asarray(f(x))
    np.testing.assert_array_equal(got, evaluate(lowered.ir, [x])[0])
    assert_float_scan(got, x, reduce, axis, reverse)


@requires_wgpu
def test_gpu_tile_kernels_on_strided_rows(gpu_target: None, monkeypatch: pytest.MonkeyPatch,
                                          rng: np.random.Generator) -> None:
    # the plan keeps strided rows "serial" on GPUs (faster there); the tile kernels index them
    # too, neighbouring jobs on neighbouring columns
    monkeypatch.setattr(scan_kernels, "TILE_MAX_INNER", 8)
    for shape, axis, reverse, n_kernels in [((257, 3), 0, True, 1), ((7, 9000, 2), 1, False, 3)]:
        x = rng.standard_normal(shape).astype(np.float32)
        f = jit(lambda a: cumulative(a, "sum", axis, reverse))
        lowered = f.lower(x)
        assert len(lowered.kernels) == n_kernels
        assert all(e.params["body"].eqns[0].params["layout"] == "tile" for e in lowered.ir.eqns)
        got = np.asarray(f(x))
        np.testing.assert_array_equal(got, evaluate(lowered.ir, [x])[0])
        assert_float_scan(got, x, "sum", axis, reverse)


# --- plans, kernels and the IR --------------------------------------------------------------------


def test_short_rows_take_one_kernel() -> None:
    for target in ("cpu", "gpu"):
        with forced_target(target):
            for shape, axis in [((1000,), 0), ((3, 257), 1), ((257, 3), 0), ((2, 5, 33), 1),
                                ((4096, 4096), 1)]:
                lowered = jit(lambda a: fnp.cumsum(a, axis=axis)).lower(S(shape))
                assert len(lowered.kernels) == 1, (target, shape, axis)
                (k,) = [e for e in lowered.ir.eqns if e.op is Op.KERNEL]
                assert [e.op for e in k.params["body"].eqns] == [Op.SCAN]


def test_traced_and_lowered_ir() -> None:
    f = jit(lambda a: fnp.cumsum(a))
    traced = str(f.trace(S((LONG,))).ir)
    assert "cumulative axis=0 reduce=sum reverse=False" in traced
    with forced_target("gpu"):
        text = jit(lambda a: fnp.cumsum(a)).lower(S((1 << 24,))).as_text("ir")
    # 2^24 in chunks of 16384 (1024 of them): reduce, the chunks' scan, scan with carries
    assert "scan_reduce axis=0 chunk=16384 layout=tile reduce=sum reverse=False rounds=16" in text
    assert "f32[1024] = scan axis=0 chunk=1024 layout=tile" in text
    assert "f32[16777216] = scan axis=0 chunk=16384 layout=tile reduce=sum reverse=False " \
           "rounds=8 threads=256" in text


def test_interpreter_of_the_traced_program_is_numpy(rng: np.random.Generator) -> None:
    x = rng.standard_normal((5, 300)).astype(np.float32)
    traced = jit(lambda a: (fnp.cumsum(a, axis=1), fnp.cummin(a, axis=0, reverse=True))).trace(x)
    got = evaluate(traced.ir, [x])
    np.testing.assert_array_equal(got[0], np.cumsum(x, axis=1))  # float32, numpy's order
    np.testing.assert_array_equal(got[1], np.flip(np.minimum.accumulate(np.flip(x, 0), 0), 0))


def test_gpu_kernels_stream_vec4() -> None:
    with forced_target("gpu"):
        kernels = jit(lambda a: fnp.cumsum(a)).lower(S((1 << 24,))).kernels
    reduce, chunks, last = (k.wgsl for k in kernels)
    assert "var<storage, read> in0: array<vec4<f32>>" in reduce
    assert reduce.count("in0[") == 16  # a chunk of 16384 is 16 vec4 loads per thread
    assert "var<storage, read_write> out0: array<vec4<f32>>" in last
    assert "out0[" in last and last.count("in0[") == 8  # 8 rounds of a vec4 per tile
    assert "1023u - (wid.y * nwg.x + wid.x)" in last  # chunks last to first (see the plan)


@requires_wgpu
def test_cpu_kernels_stay_within_the_loop_budget() -> None:
    with forced_target("cpu"):
        for shape in [(1 << 24,), (70000,), (16384,)]:
            for k in jit(lambda a: fnp.cumsum(a)).lower(S(shape)).ir.eqns:
                (e,) = k.params["body"].eqns
                assert e.params["layout"] == "serial"
                assert int(e.params["chunk"]) <= fusec.codegen.LOOP_BUDGET
                assert "workgroupBarrier" not in fusec.codegen.generate(k, "cpu").wgsl


def test_grids_past_65535_workgroups(monkeypatch: pytest.MonkeyPatch,
                                     rng: np.random.Generator) -> None:
    """A real grid this large needs 2^30 elements; one-thread workgroups (and chunks of 4
    positions on GPUs, in a deep recursion of stages) give it with far fewer."""
    monkeypatch.setattr(scan_kernels, "WORKGROUP", 1)
    # "cpu" target, a thread per chunk: 70000 rows of 2 make 70000 one-thread workgroups
    pairs = rng.integers(-8, 9, (70000, 2)).astype(np.int32)
    f = jit(lambda a: fnp.cumsum(a, axis=1))
    (k,) = f.lower(pairs).kernels
    assert k.grid[1] > 1
    np.testing.assert_array_equal(np.asarray(f(pairs)), np.cumsum(pairs, axis=1))
    # GPU kernels: one thread, one round and 4 positions per chunk
    for name, value in [("TILE_THREADS", 1), ("TILE_ROUNDS", 1), ("SHORT", 4),
                        ("CHUNKS", (4,)), ("MANY_ROWS", 1 << 30)]:
        monkeypatch.setattr(scan_kernels, name, value)
    x = rng.integers(-8, 9, 270001).astype(np.float32)  # 67501 chunks
    with forced_target("gpu"):
        g = jit(lambda a: fnp.cumsum(a))
        kernels = g.lower(x).kernels
        assert kernels[0].grid[1] > 1 and kernels[-1].grid[1] > 1
        np.testing.assert_array_equal(np.asarray(g(x)), np.cumsum(x))
