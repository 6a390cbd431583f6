"""The scatter primitive (``fusec.numpy.scatter.scatter``, behind ``x.at[idx].set/add/...``):
numeric tests on the device against numpy's ``ufunc.at``, the lowering and its kernels, and the
errors. References are written here from numpy alone (not from fusec.ops)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import Delta, requires_wgpu
from hypothesis import given, settings
from hypothesis import strategies as st

import fusec
from fusec import codegen
from fusec.errors import DTypeError, ShapeError, TraceError
from fusec.interpret import evaluate
from fusec.ir import Op
from fusec.jit import interpret_traced
from fusec.numpy.scatter import MODES, scatter
from fusec.passes import Options, run_pipeline
from fusec.trace import current_builder

DTYPES = ("float32", "int32", "uint32", "bool")
UFUNC = {"add": np.add, "multiply": np.multiply, "min": np.minimum, "max": np.maximum}
EPS32 = 2.0 ** -24  # unit roundoff of float32


# --- references -----------------------------------------------------------------------------------


def _targets(shape: tuple[int, ...], indices: list[np.ndarray], s: tuple[int, ...]
             ) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """Per-axis coordinates of each update (flattened over S) and which of them are kept: a
    negative index counts from the end once; what is still outside its axis is dropped."""
    coords, keep = [], np.ones(int(np.prod(s, dtype=np.int64)), dtype=bool)
    for i, d in zip(indices, shape):
        k = np.broadcast_to(i, s).reshape(-1).astype(np.int64)
        if i.dtype.kind == "i":
            k = np.where(k < 0, k + d, k)
        keep &= (0 <= k) & (k < d)
        coords.append(k)
    return tuple(coords), keep


def reference(x: np.ndarray, indices: list[np.ndarray], u: np.ndarray, mode: str
              ) -> np.ndarray:
    """numpy: ``ufunc.at`` on a copy (assignment for "set": numpy's last duplicate wins)."""
    s = np.broadcast_shapes(u.shape, *(i.shape for i in indices))
    coords, keep = _targets(x.shape, indices, s)
    out = x.copy()
    uu = np.broadcast_to(u.astype(x.dtype), s).reshape(-1)[keep]
    kept = tuple(c[keep] for c in coords)
    with np.errstate(all="ignore"):
        if mode == "set":
            out[kept] = uu
        else:
            UFUNC[mode].at(out, kept, uu)
    return out


def counts(x: np.ndarray, indices: list[np.ndarray], u: np.ndarray) -> np.ndarray:
    """How many kept updates land on each element of ``x``."""
    s = np.broadcast_shapes(u.shape, *(i.shape for i in indices))
    coords, keep = _targets(x.shape, indices, s)
    n = np.zeros(x.shape, dtype=np.int64)
    np.add.at(n, tuple(c[keep] for c in coords), 1)
    return n


def check_set(got: np.ndarray, x: np.ndarray, indices: list[np.ndarray], u: np.ndarray) -> None:
    """"set" with duplicates: each updated element holds one of its candidate updates (any of
    them), every other element the operand's value."""
    s = np.broadcast_shapes(u.shape, *(i.shape for i in indices))
    coords, keep = _targets(x.shape, indices, s)
    uu = np.broadcast_to(u.astype(x.dtype), s).reshape(-1)[keep]
    flat = np.ravel_multi_index(tuple(c[keep] for c in coords), x.shape) if x.ndim else (
        np.zeros(len(uu), dtype=np.int64))
    cands: dict[int, set[bytes]] = {}
    for f, v in zip(flat.tolist(), uu):
        cands.setdefault(f, set()).add(np.asarray(v).tobytes())
    g, xf = got.reshape(-1), x.reshape(-1)
    for f in range(x.size):
        if f in cands:
            assert g[f].tobytes() in cands[f], f"element {f}: {g[f]} is none of its updates"
        else:
            assert g[f].tobytes() == xf[f].tobytes(), f"element {f} changed without an update"


def check(got: np.ndarray, x: np.ndarray, indices: list[np.ndarray], u: np.ndarray,
          mode: str) -> None:
    """The device's result against numpy. Exact but for float32 add and multiply, whose
    duplicates the GPU combines in another order: for the k updates of an element, the
    float64 result is held to (k + 1) * 2^-24 times the sum of magnitudes involved (the
    standard bound on a float32 sum or product of k + 1 terms)."""
    got = np.asarray(got)
    assert got.shape == x.shape and got.dtype == x.dtype
    if mode == "set":
        check_set(got, x, indices, u)
        return
    if x.dtype == np.float32 and mode in ("add", "multiply"):
        x64, u64 = x.astype(np.float64), u.astype(np.float32).astype(np.float64)
        want = reference(x64, indices, u64, mode)
        k = counts(x, indices, u)
        if mode == "add":
            size = reference(np.abs(x64), indices, np.abs(u64), "add")
        else:
            size = np.abs(want)
        tol = (k + 1) * EPS32 * size * 1.01 + 1e-37
        assert np.all(np.abs(got.astype(np.float64) - want) <= tol), (
            f"max error {np.max(np.abs(got - want))}, tolerance {np.min(tol)}..{np.max(tol)}")
        return
    np.testing.assert_array_equal(got, reference(x, indices, u, mode))


# --- random inputs --------------------------------------------------------------------------------


def values(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, mode: str
           ) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype == "float32":
        if mode == "multiply":  # magnitudes near 1: products of many duplicates stay finite
            mag = rng.uniform(0.5, 2.0, shape)
            return (mag * rng.choice([-1.0, 1.0], shape)).astype(np.float32)
        return (rng.standard_normal(shape) * 10).astype(np.float32)
    if dtype == "int32":
        return rng.integers(-2**31, 2**31, shape, dtype=np.int64).astype(np.int32)
    return rng.integers(0, 2**32, shape, dtype=np.int64).astype(np.uint32)


def index_array(rng: np.random.Generator, d: int, shape: tuple[int, ...], dtype: str = "int32"
                ) -> np.ndarray:
    """Indices into an axis of ``d``: mostly in range (negative ones too), some outside it on
    both sides, drawn from few values so that duplicates are many."""
    if dtype == "uint32":
        pool = np.array([0, d - 1, d, d + 5, 2**32 - 1] + list(range(min(d, 5))), dtype=np.int64)
    else:
        pool = np.array([-d - 3, -d, -1, d, d + 2, 2**31 - 1, -2**31] + list(range(-d, d)),
                        dtype=np.int64)
        pool = np.concatenate([pool, np.arange(-d, d)])  # in range more often than not
    return rng.choice(pool, shape).astype(dtype)


# (operand shape, index arrays' shapes, updates' shape): odd sizes, broadcasting, 1 to 3 axes
CASES = [
    ((1,), [(7,)], (7,)),
    ((7,), [(1000,)], (1000,)),
    ((33,), [(33,)], ()),
    ((1000,), [(257,)], (257,)),
    ((7, 33), [(33,), (33,)], (33,)),
    ((33, 7), [(5, 1), (1, 9)], (5, 9)),
    ((3, 5, 7), [(41,), (41,), (41,)], (41,)),
    ((3, 1, 7), [(2, 33), (1,), (33,)], (2, 33)),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_modes_dtypes_shapes(rng: np.random.Generator, mode: str, dtype: str) -> None:
    f = fusec.gpu_jit(lambda x, idx, u: scatter(x, idx, u, mode))
    for shape, ishapes, ushape in CASES:
        x = values(rng, shape, dtype, mode)
        idx = [index_array(rng, d, s) for d, s in zip(shape, ishapes)]
        u = values(rng, ushape, dtype, mode)
        check(f(x, tuple(idx), u), x, idx, u, mode)


@pytest.mark.parametrize("mode", ["set", "add", "max"])
def test_uint32_indices(rng: np.random.Generator, mode: str) -> None:
    x = values(rng, (9, 4), "int32", mode)
    idx = [index_array(rng, 9, (300,), "uint32"), index_array(rng, 4, (300,), "uint32")]
    u = values(rng, (300,), "int32", mode)
    check(fusec.gpu_jit(lambda x, i, u: scatter(x, i, u, mode))(x, tuple(idx), u), x, idx, u,
          mode)


@pytest.mark.parametrize("mode", ["min", "max"])
def test_nan_propagates_like_numpy(rng: np.random.Generator, mode: str) -> None:
    """np.minimum.at / np.maximum.at: a NaN update or operand element makes the element NaN,
    whichever order the duplicates come in (WGSL's min/max would drop it)."""
    x = (rng.standard_normal(50) * 10).astype(np.float32)
    x[[3, 17]] = np.nan
    i = rng.integers(0, 50, 2000).astype(np.int32)
    u = (rng.standard_normal(2000) * 10).astype(np.float32)
    u[rng.random(2000) < 0.01] = np.nan
    u[rng.random(2000) < 0.01] = np.inf if mode == "max" else -np.inf
    got = np.asarray(fusec.gpu_jit(lambda x, i, u: scatter(x, (i,), u, mode))(x, i, u))
    want = reference(x, [i], u, mode)
    assert np.isnan(want).sum() > 2
    np.testing.assert_array_equal(got, want)  # NaN where numpy has NaN


def test_python_scalars_literal_indices_and_eager() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)

    @fusec.gpu_jit
    def f(x):
        a = scatter(x, (2, -1), 100.0, "set")  # x[2, 3] = 100
        b = scatter(a, (-4, 0), 7.0, "add")  # -4 is out of a 3-row axis: dropped
        c = scatter(b, (2**31 - 1, 0), 7.0, "add")  # the largest int32: dropped
        return scatter(c, (0, np.int32(1)), 3, "multiply")

    want = x.copy()
    want[2, 3] = 100
    want[0, 1] *= 3
    np.testing.assert_array_equal(np.asarray(f(x)), want)
    # outside gpu_jit it runs eagerly on the device
    i = np.array([0, 0, 5, -6, 1], dtype=np.int32)
    got = scatter(fusec.device_put(np.zeros(6, np.int32)), (i,), np.int32(2), "add")
    assert isinstance(got, fusec.Array)
    np.testing.assert_array_equal(np.asarray(got), [6, 2, 0, 0, 0, 2])


def test_updates_cast_to_the_operand_dtype(rng: np.random.Generator) -> None:
    x = rng.integers(-50, 50, 10).astype(np.int32)
    i = np.array([1, 4, 4, 9], dtype=np.int32)
    u = np.array([2.7, -3.9, 1.2, 8.5], dtype=np.float32)
    got = np.asarray(fusec.gpu_jit(lambda x, i, u: scatter(x, (i,), u, "add"))(x, i, u))
    np.testing.assert_array_equal(got, reference(x, [i], u.astype(np.int32), "add"))
    b = rng.random(10) < 0.5
    got_b = np.asarray(fusec.gpu_jit(lambda b, i, u: scatter(b, (i,), u, "set"))(b, i, u))
    want_b = b.copy()
    want_b[i] = u != 0
    np.testing.assert_array_equal(got_b, want_b)


def test_empty_updates_and_scalar_operand() -> None:
    x = np.arange(5, dtype=np.float32)
    i0 = np.zeros(0, dtype=np.int32)
    f = fusec.gpu_jit(lambda x, i: scatter(x, (i,), 1.0, "add"))
    np.testing.assert_array_equal(np.asarray(f(x, i0)), x)
    s = fusec.gpu_jit(lambda s, u: scatter(s, (), u, "max"))
    np.testing.assert_array_equal(np.asarray(s(np.float32(2.5), np.float32([1, 7, 3]))), 7.0)


# --- buffers: in place, zero-filled, donated ------------------------------------------------------


def test_add_then_elementwise_is_two_kernels(rng: np.random.Generator) -> None:
    """The acceptance line: x.at[idx].add(v) followed by elementwise work is 2 kernels (the
    scatter into a zero-filled buffer, then one kernel adding it to x and the rest)."""
    f = fusec.gpu_jit(lambda x, i, v: fusec.numpy.exp(scatter(x, (i,), v, "add")) * 2.0 + x)
    x = rng.standard_normal(300).astype(np.float32)
    i = rng.integers(-300, 300, 1000).astype(np.int32)
    v = (rng.standard_normal(1000) * 0.1).astype(np.float32)
    lowered = f.lower(x, i, v)
    assert len(lowered.kernels) <= 2
    got = np.asarray(f(x, i, v))
    want = np.exp(reference(x.astype(np.float64), [i], v.astype(np.float64), "add")) * 2 + x
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_operand_argument_is_not_modified(rng: np.random.Generator, mode: str) -> None:
    x = rng.standard_normal((6, 5)).astype(np.float32)
    xd = fusec.device_put(x)
    i, j = rng.integers(-6, 6, 40).astype(np.int32), rng.integers(-5, 5, 40).astype(np.int32)
    u = values(rng, (40,), "float32", mode)
    f = fusec.gpu_jit(lambda x, i, j, u: scatter(x, (i, j), u, mode))
    for _ in range(2):
        check(f(xd, i, j, u), x, [i, j], u, mode)
        np.testing.assert_array_equal(np.asarray(xd), x)


@pytest.mark.parametrize("mode", ["add", "max", "set"])
def test_repeated_calls_start_afresh(rng: np.random.Generator, mode: str) -> None:
    """The accumulation buffer is cleared every call, and the in-place target recopied."""
    f = fusec.gpu_jit(lambda x, i, u: scatter(x, (i,), u, mode))
    x = rng.integers(-100, 100, 17).astype(np.int32)
    i = rng.integers(-17, 17, 200).astype(np.int32)
    u1, u2 = values(rng, (200,), "int32", mode), values(rng, (200,), "int32", mode)
    with_u1 = np.asarray(f(x, i, u1))
    check(with_u1, x, [i], u1, mode)
    again = np.asarray(f(x, i, u1))
    if mode == "set":
        # which of several updates of one element wins may change from call to call (as in
        # JAX): the second call holds one of the candidates too (an H100 picked others)
        check(again, x, [i], u1, mode)
    else:
        np.testing.assert_array_equal(again, with_u1)
    check(f(x, i, u2), x, [i], u2, mode)


@pytest.mark.parametrize("mode", ["add", "multiply"])
def test_result_and_operand_both_returned(rng: np.random.Generator, mode: str) -> None:
    x = rng.standard_normal(20).astype(np.float32)
    i = rng.integers(0, 20, 50).astype(np.int32)
    u = values(rng, (50,), "float32", mode)

    @fusec.gpu_jit
    def f(x, i, u):
        y = x * 2.0
        return scatter(y, (i,), u, mode), y, x

    out, y, same = f(x, i, u)
    check(out, x * 2, [i], u, mode)
    np.testing.assert_array_equal(np.asarray(y), x * 2)
    np.testing.assert_array_equal(np.asarray(same), x)


def test_donated_operand(rng: np.random.Generator) -> None:
    x = rng.standard_normal(64).astype(np.float32)
    i = rng.integers(-64, 64, 100).astype(np.int32)
    u = rng.standard_normal(100).astype(np.float32)
    f = fusec.gpu_jit(lambda x, i, u: scatter(x, (i,), u, "max"), donate_argnums=(0,))
    check(f(fusec.device_put(x), i, u), x, [i], u, "max")


def test_more_than_65535_workgroups() -> None:
    """4097 x 4097 updates (16.8M threads, more than 65535 workgroups of 256): the grid spreads
    over y, and every update is applied exactly once (the counts come out exact)."""
    n = 4097
    a = (np.arange(n) % 61).astype(np.int32)
    f = fusec.gpu_jit(lambda x, a, b: scatter(x, (a, b), 1, "add"))
    x = np.full((61, 61), 5, dtype=np.int32)
    lowered = f.lower(x, a.reshape(n, 1), a.reshape(1, n))
    assert any(k.grid[1] > 1 for k in lowered.kernels if k.kind == "scatter")
    got = np.asarray(f(x, a.reshape(n, 1), a.reshape(1, n)))
    c = np.bincount(a)
    np.testing.assert_array_equal(got, 5 + np.outer(c, c))


def _iota(shape: tuple[int, ...], axis: int) -> Any:
    """An iota index array, as ``x.at[:, 1::2]`` builds one for a sliced axis."""
    b = current_builder()
    assert b is not None
    return b.bind(Op.IOTA, [], {"shape": shape, "axis": axis, "dtype": "int32"})


def test_index_and_update_cones_fuse_into_the_scatter(rng: np.random.Generator) -> None:
    """Iota index arrays, index arithmetic and broadcast updates are computed inside the
    scatter kernel, not written to memory first: x.at[i, 1::2].add(v) then elementwise work is
    still 2 kernels, and a scalar update is never materialised."""

    @fusec.gpu_jit
    def add(x, i, v):
        j = _iota((1, 5), 1) * 2 + 1  # columns 1, 3, 5, 7, 9
        return fusec.numpy.exp(scatter(x, (i.reshape(-1, 1), j), v, "add")) * 2.0

    x = rng.standard_normal((30, 10)).astype(np.float32)
    i = rng.integers(-35, 35, 6).astype(np.int32)
    v = rng.standard_normal(5).astype(np.float32)  # broadcast along the rows
    lowered = add.lower(x, i, v)
    assert len(lowered.kernels) == 2
    j = np.arange(1, 10, 2, dtype=np.int32).reshape(1, 5)
    want = reference(x.astype(np.float64), [i.reshape(-1, 1), j], v.astype(np.float64), "add")
    np.testing.assert_allclose(np.asarray(add(x, i, v)), np.exp(want) * 2, rtol=1e-5)

    @fusec.gpu_jit
    def zero_rows(x, i):
        return scatter(x, (i.reshape(-1, 1), _iota((1, 10), 1)), 0.0, "set")

    lowered = zero_rows.lower(x, i)
    stage = next(e for e in lowered.ir.eqns if e.op is Op.KERNEL
                 and e.params["kind"] == "scatter")
    assert [v.shape for v in stage.inputs] == [(30, 10), (6,)]  # the copy and i: no iota buffer
    want = x.copy()
    keep = (i >= -30) & (i < 30)
    want[i[keep]] = 0
    np.testing.assert_array_equal(np.asarray(zero_rows(x, i)), want)


def test_updates_shared_with_other_kernels_and_chained(rng: np.random.Generator) -> None:
    """Updates computed by ops another output also needs, and updates that are another
    scatter's result."""

    @fusec.gpu_jit
    def f(x, w, i, j):
        u = fusec.numpy.exp(w) * 0.5
        y = scatter(x, (i,), u, "max")
        z = scatter(x, (j,), fusec.numpy.sin(y), "add")
        return y, z, u

    x = rng.standard_normal(40).astype(np.float32)
    w = rng.standard_normal(40).astype(np.float32)
    i, j = rng.integers(-40, 40, 40).astype(np.int32), rng.integers(0, 45, 40).astype(np.int32)
    y, z, u = f(x, w, i, j)
    u_want = np.exp(w) * np.float32(0.5)
    np.testing.assert_allclose(np.asarray(u), u_want, rtol=2e-5)
    y_want = reference(x, [i], np.asarray(u), "max")
    np.testing.assert_array_equal(np.asarray(y), y_want)
    z_want = reference(x.astype(np.float64), [j], np.sin(y_want.astype(np.float64)), "add")
    np.testing.assert_allclose(np.asarray(z), z_want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_gpu_target_kernels_run(gpu_target: None, rng: np.random.Generator, mode: str) -> None:
    """The code generated for real GPUs (another loop bound) runs right too."""
    x = values(rng, (7, 33), "float32", mode)
    idx = [index_array(rng, 7, (500, 1)), index_array(rng, 33, (500, 1))]
    u = values(rng, (1, 3), "float32", mode)
    got = fusec.gpu_jit(lambda x, idx, u: scatter(x, idx, u, mode))(x, tuple(idx), u)
    check(got, x, idx, u, mode)


@requires_wgpu
def test_persistent_cache_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     rng: np.random.Generator) -> None:
    """Lowered scatter programs (their in-place, zero-fill and buffer_inputs parameters) come
    back from the disk cache and run the same."""
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "cache"))
    x = rng.standard_normal((9, 4)).astype(np.float32)
    i = rng.integers(-9, 9, (50, 1)).astype(np.int32)
    u = rng.standard_normal((50, 4)).astype(np.float32)

    def fn(x, i, u):
        return scatter(x, (i, _iota((1, 4), 1)), u, "add"), scatter(x, (i, 3), u, "min")

    first = [np.asarray(a) for a in fusec.gpu_jit(fn)(x, i, u)]
    fusec.clear_cache()
    with Delta() as d:
        again = [np.asarray(a) for a in fusec.gpu_jit(fn)(x, i, u)]
    assert d.disk_hits == 1 and d.lowerings == 0
    np.testing.assert_array_equal(again[1], first[1])
    check(again[0], x, [i, np.arange(4, dtype=np.int32).reshape(1, 4)], u, "add")
    np.testing.assert_array_equal(first[1], reference(x, [i, np.int32(3)], u, "min"))


# --- the lowering and its kernels -----------------------------------------------------------------


def _specs(*arrays: np.ndarray) -> list[fusec.ShapeDtype]:
    return [fusec.ShapeDtype(a.shape, a.dtype) for a in arrays]


def test_lowering_stages_and_buffers() -> None:
    x = np.zeros((4, 5), np.float32)
    i = np.zeros(7, np.int32)
    u = np.zeros(7, np.float32)
    add = fusec.gpu_jit(lambda x, i, u: scatter(x, (i, i), u, "add")).lower(*_specs(x, i, u))
    kernels = [e for e in add.ir.eqns if e.op is Op.KERNEL]
    stage = next(e for e in kernels if e.params["kind"] == "scatter")
    assert stage.params["body"].eqns[0].op is Op.SCATTER_ADD
    assert stage.params["zero_init"] == (0,) and stage.params["slots"][0].startswith("z")
    assert len(stage.inputs) == 2  # the index array read once, for both axes
    into = fusec.gpu_jit(lambda x, i, u: scatter(x, (i, i), u, "min")).lower(*_specs(x, i, u))
    stage = next(e for e in into.ir.eqns if e.op is Op.KERNEL and e.params["kind"] == "scatter")
    assert stage.params["body"].eqns[0].op is Op.SCATTER_INTO
    assert stage.params["inplace"] == ((0, 0),) and stage.params["slots"] == ("=0",)
    assert "var<storage, read_write> out0: array<atomic<u32>>" in into.kernels[-1].wgsl


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_lowered_matches_traced_under_the_interpreter(rng: np.random.Generator, mode: str,
                                                     dtype: str) -> None:
    """Bit for bit for exact dtypes (and float min/max/set); float add within its bound."""
    jf = fusec.gpu_jit(lambda x, i, j, u: scatter(x, (i, j), u, mode))
    x = values(rng, (5, 6), dtype, mode)
    i, j = index_array(rng, 5, (30, 1)), index_array(rng, 6, (30,))
    u = values(rng, (30, 30), dtype, mode)
    traced = jf.trace(x, i, j, u)
    (want,) = interpret_traced(traced, [x, i, j, u])
    for fuse in (True, False):
        lowered = run_pipeline(traced.program, Options(fuse=fuse), check=True)
        (got,) = evaluate(lowered, [x, i, j, u])
        if dtype == "float32" and mode in ("add", "multiply"):
            check(got, x, [i, j], u, mode)
        else:
            np.testing.assert_array_equal(got, want)


def _scatter_wgsl(fn: Any, target: str, *arrays: np.ndarray) -> str:
    """The WGSL of ``fn``'s scatter kernel, generated for ``target`` whatever the adapter."""
    lowered = fusec.gpu_jit(fn).lower(*_specs(*arrays))
    stage = next(e for e in lowered.ir.eqns if e.op is Op.KERNEL
                 and e.params["kind"] == "scatter")
    return codegen.generate(stage, target).wgsl


def test_kernel_code() -> None:
    """WGSL: atomics on the output, the compare-exchange loop bounded under the software
    adapter's loop limit, NaN-propagating helpers only where used."""
    x = np.zeros((100,), np.float32)
    i = np.zeros(70000, np.int32)
    for mode, expect in [("add", "atomicCompareExchangeWeak"), ("set", "atomicStore"),
                         ("min", "fusec_min_f32(")]:
        wgsl = _scatter_wgsl(lambda x, i: scatter(x, (i,), 1.5, mode), "cpu", x, i)
        assert expect in wgsl
        assert ("fn fusec_min_f32" in wgsl) == (mode == "min")
        if mode != "set":
            assert f"t < {codegen.LOOP_BUDGET}u" in wgsl
    xi = np.zeros((100,), np.int32)
    for mode, fn in [("add", "atomicAdd"), ("min", "atomicMin"), ("max", "atomicMax")]:
        wgsl = _scatter_wgsl(lambda x, i: scatter(x, (i,), 3, mode), "cpu", xi, i)
        assert f"{fn}(&out0[at], 3i)" in wgsl and "array<atomic<i32>>" in wgsl
        assert "atomicCompareExchangeWeak" not in wgsl


def test_gpu_target_bound() -> None:
    """On GPUs the loop bound is the number of updates (plus slack): enough in any case."""
    x = np.zeros((10,), np.float32)
    i = np.zeros(70000, np.int32)
    wgsl = _scatter_wgsl(lambda x, i: scatter(x, (i,), 1.5, "multiply"), "gpu", x, i)
    assert "t < 70016u" in wgsl


# --- errors ---------------------------------------------------------------------------------------


def test_errors() -> None:
    x = np.zeros((4, 5), np.float32)
    i = np.zeros(3, np.int32)
    with pytest.raises(ShapeError, match=r"updates of shape \(4,\).*\(3,\)"):
        fusec.gpu_jit(lambda x, i: scatter(x, (i, i), np.ones(4, np.float32), "set"))(x, i)
    with pytest.raises(DTypeError, match=r"indices\[1\].*float32"):
        fusec.gpu_jit(lambda x, i: scatter(x, (i, i.astype("float32")), 1.0, "add"))(x, i)
    with pytest.raises(DTypeError, match=r"indices\[0\]"):
        fusec.gpu_jit(lambda x, i: scatter(x, (1.5, i), 1.0, "add"))(x, i)
    with pytest.raises(ShapeError, match=r"indices has 1 index arrays.*\(4, 5\)"):
        fusec.gpu_jit(lambda x, i: scatter(x, (i,), 1.0, "add"))(x, i)
    with pytest.raises(TraceError, match=r"mode must be one of.*'sub'"):
        fusec.gpu_jit(lambda x, i: scatter(x, (i, i), 1.0, "sub"))(x, i)
    with pytest.raises(ShapeError, match=r"index arrays' shapes"):
        fusec.gpu_jit(lambda x, i: scatter(x, (i, np.zeros(2, np.int32)), 1.0, "add"))(x, i)


# --- hypothesis -----------------------------------------------------------------------------------


@st.composite
def scatter_cases(draw: st.DrawFn) -> tuple[str, str, np.ndarray, list[np.ndarray], np.ndarray]:
    mode = draw(st.sampled_from(MODES))
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
    n = draw(st.integers(1, 300))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    x = values(rng, shape, dtype, mode)
    idx = [index_array(rng, d, (n,)) for d in shape]
    u = values(rng, (n,), dtype, mode)
    return mode, dtype, x, idx, u


@settings(max_examples=25, deadline=None)
@given(scatter_cases())
def test_hypothesis_random_scatters(case: tuple[str, str, np.ndarray, list[np.ndarray],
                                                np.ndarray]) -> None:
    mode, _, x, idx, u = case
    got = fusec.gpu_jit(lambda x, idx, u: scatter(x, idx, u, mode))(x, tuple(idx), u)
    check(got, x, idx, u, mode)


@pytest.mark.parametrize("mode", ["add", "max"])
def test_updates_computed_with_helper_functions_in_the_scatter_kernel(
        rng: np.random.Generator, mode: str) -> None:
    """Updates the scatter kernel computes itself (a tanh: WGSL's helper fusec_tanh) bring the
    helper functions they call into the kernel; the scatter kernel once compiled without them."""
    import fusec.numpy as fnp

    x = rng.standard_normal(9).astype(np.float32)
    i = rng.integers(-9, 9, 40).astype(np.int32)
    v = rng.standard_normal(40).astype(np.float32)
    f = fusec.gpu_jit(lambda x, i, v: scatter(x, (i,), fnp.tanh(v), mode))
    assert "fn fusec_tanh" in f.lower(x, i, v).as_text("wgsl")
    # the updates as fusec's own tanh computes them (this test is about the scatter)
    check(f(x, i, v), x, [i], np.asarray(fnp.tanh(v)), mode)
