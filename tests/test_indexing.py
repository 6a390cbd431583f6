"""Indexing: ``x[idx]`` on traced values and fusec.Arrays, ``.at[]`` updates, ``take``,
``take_along_axis``, ``diagonal`` and ``fusec.lax``'s dynamic slices, against numpy on the real
adapter.

Indexing moves values without arithmetic, so every result must equal numpy's bit for bit (the
inputs hold distinct values, so an element taken from the wrong place shows). Where fusec follows
JAX instead of numpy (index arrays out of range are clamped; take fills), the reference is
numpy's indexing on indices clamped or masked the same way, written out here.

The ``.at[]`` updates of index arrays, steps other than 1 and -1 and concrete masks go through
the scatter primitive; updates of unit-step boxes, traced masks and ``.get()`` need no scatter.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from helpers import Delta, forced_target, requires_wgpu, spy_sizes
from hypothesis import given, settings
from hypothesis import strategies as st

import fusec
import fusec.numpy as fnp
from fusec import lax, nn
from fusec.errors import DTypeError, IndexingError, ShapeError, TraceError


def distinct(shape: tuple[int, ...], rng: np.random.Generator,
             dtype: Any = np.float32) -> np.ndarray:
    """Distinct values in random order, so that a wrong element cannot match by accident."""
    n = int(np.prod(shape, dtype=np.int64))
    return (rng.permutation(n) - n // 3).astype(dtype).reshape(shape)


def jit_index(idx: Any) -> Any:
    return fusec.gpu_jit(lambda x: x[idx])


def check(got: Any, want: np.ndarray) -> None:
    g = np.asarray(got)
    assert g.shape == want.shape, (g.shape, want.shape)
    assert g.dtype == want.dtype, (g.dtype, want.dtype)
    np.testing.assert_array_equal(g, want)


def clamped(i: Any, d: int) -> np.ndarray:
    """An index array as a gather reads it (JAX's default): negative counts from the end once,
    then clamped into [0, d-1]."""
    a = np.asarray(i, dtype=np.int64)
    return np.clip(np.where(a < 0, a + d, a), 0, d - 1)


# --- basic indexing -------------------------------------------------------------------------------

S = slice
BASIC = [
    ((7,), 3),
    ((7,), -1),
    ((7,), -7),
    ((1,), 0),
    ((257,), S(None, None, -1)),
    ((257,), S(3, 250, 7)),
    ((257,), S(-5, None)),
    ((257,), S(None, None, -31)),
    ((31, 3), S(40, None)),  # empty
    ((31, 3), (S(20, 2, -3), 1)),
    ((31, 3), (S(2, 20), S(None, None, -1))),
    ((3, 7, 31), (Ellipsis, 2)),
    ((3, 7, 31), (1, Ellipsis)),
    ((3, 7, 31), (None, 1, None, S(None, None, 2), Ellipsis, None)),
    ((3, 7, 31), (Ellipsis, None)),
    ((3, 7, 31), ()),
    ((3, 7, 31), (-1, -2, -3)),
    ((3, 7, 31), (S(None), 0, S(-3, -40, -4))),
    ((3, 1, 7), (S(None, None, -1), 0, S(6, 2, -2))),
    ((5, 7), (S(3, 3), S(None))),  # empty in the middle
    ((), ()),
    ((), None),
    ((), Ellipsis),
]


@pytest.mark.parametrize("shape,idx", BASIC, ids=[f"{s}-{i}" for s, i in BASIC])
def test_basic_indexing_matches_numpy(shape, idx, rng):
    x = distinct(shape, rng)
    check(jit_index(idx)(x), x[idx])


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.bool_])
def test_indexing_keeps_the_dtype(dtype, rng):
    x = distinct((7, 5), rng, np.int64)
    x = (x > 3) if dtype is np.bool_ else x.astype(dtype)
    check(jit_index((S(None, None, -2), [4, 0, 0]))(x), x[::-2, [4, 0, 0]])
    check(jit_index(3)(x), x[3])


def test_basic_indexing_is_a_slice_fused_with_its_neighbours(rng):
    x = distinct((31, 7), rng)
    f = fusec.gpu_jit(lambda x: (x * 2)[::-3, 1:6:2] + x[1:, :3][:11:-1][::2][0])
    lowered = f.lower(x)
    assert len(lowered.kernels) == 1
    assert "gather" not in lowered.as_text("ir")
    check(f(x), (x * 2)[::-3, 1:6:2] + x[1:, :3][:11:-1][::2][0])


# --- advanced indexing ----------------------------------------------------------------------------

ADVANCED = [
    ((7,), [3, 0, 0, 6, -1, -7]),  # duplicates, negative
    ((7,), np.array([[1, 2], [3, -4]], dtype=np.int64)),
    ((7,), np.array([5, 1], dtype=np.uint32)),
    ((7,), []),
    ((31, 3), [30, 0, 30]),
    ((31, 3), (S(None, None, -2), [2, 0])),
    ((3, 7, 31), (0, S(None), [1, 2])),  # int + array separated: broadcast dims first
    ((3, 7, 31), (S(None), 0, [1, 2])),  # together: they stay in place
    ((3, 7, 31), (S(None), [0, 1], Ellipsis, [1, 2])),  # separated by ... (of no axes)
    ((3, 7, 31), ([0, 1], None, [1, 2])),  # separated by None
    ((3, 7, 31), ([[0], [2]], S(1, 6, 2), [[1, 3, 30]])),  # broadcast, separated
    ((3, 7, 31), (Ellipsis, [[6], [0]], [29, 3])),  # broadcast, together
    ((3, 7, 31), (np.int32(2), [-1], S(None, None, -5))),
    ((3, 7, 31), ([2, 0, 1], [6, 6, 0], [0, 30, 15])),
    ((3, 7, 31), (None, S(1, 3), None, [4, 4, 2], None)),
    ((3, 7, 31), np.array(1)),  # a 0-d array is an integer
    ((1, 257), (S(None), np.arange(256, -1, -3))),
]


@pytest.mark.parametrize("shape,idx", ADVANCED, ids=[f"{s}-{i}" for s, i in
                                                      enumerate(ADVANCED)])
def test_advanced_indexing_matches_numpy(shape, idx, rng):
    x = distinct(shape, rng)
    check(jit_index(idx)(x), x[idx])


MASKS = [
    ((7,), lambda x: x > 0),
    ((31, 3), lambda x: x[:, 0] > 0),  # 1-d mask over axis 0
    ((3, 7, 5), lambda x: (x > 0)[0]),  # 2-d mask over the last two axes, after ...
    ((3, 7, 5), lambda x: x < 0),  # a mask over every axis
    ((3, 7, 5), lambda x: x > 1000),  # nothing selected
]


@pytest.mark.parametrize("case", range(len(MASKS)))
def test_concrete_bool_mask_selects_like_numpy(case, rng):
    shape, make = MASKS[case]
    x = distinct(shape, rng)
    mask = make(x)
    idx = (Ellipsis, mask) if case == 2 else mask
    check(jit_index(idx)(x), x[idx])
    # as a list of bools too, and mixed with an int array
    if case == 1:
        check(jit_index((mask.tolist(), [2]))(x), x[mask.tolist(), [2]])


def test_traced_index_arrays(rng):
    x = distinct((31, 7, 3), rng)
    i = rng.integers(-31, 31, size=(5, 1)).astype(np.int32)
    j = rng.integers(0, 7, size=(4,)).astype(np.uint32)
    k = rng.integers(-3, 3, size=(2,)).astype(np.int32)

    @fusec.gpu_jit
    def f(x, i, j, k):
        return x[i, 1:, k], x[:, j, k[0]], x[i[:, 0]], x[i, j[:, None, None], k]

    for got, want in zip(f(x, i, j, k), (x[i, 1:, k], x[:, j, k[0]], x[i[:, 0]],
                                         x[i, j[:, None, None], k])):
        check(got, want)


def test_out_of_range_index_arrays_clamp(rng):
    """JAX's rule for gathers (numpy would raise): an entry counts from the end once if negative,
    then is clamped into the axis."""
    x = distinct((7, 31), rng)
    i = np.array([-100, -8, -7, -1, 0, 6, 7, 1000, 2**31 - 1, -(2**31)], dtype=np.int32)
    j = np.array([40, 31, -32, 3], dtype=np.int64)
    f = fusec.gpu_jit(lambda x, i: x[i])
    check(f(x, i), x[clamped(i, 7)])
    check(jit_index((S(None), j))(x), x[:, clamped(j, 31)])
    u = np.array([0, 7, 2**32 - 1], dtype=np.uint32)
    check(f(x, u), x[np.minimum(u.astype(np.int64), 6)])
    check(jit_index((i[:4, None], S(None, None, -1), [0, 50]))(np.stack([x] * 2, -1)),
          np.stack([x] * 2, -1)[clamped(i[:4], 7)[:, None], ::-1, [0, 1]])


def test_big_gather_over_more_than_65535_workgroups(rng):
    """4099 * 4099 = 16801801 > 65535 * 256 results: the grid spreads over two dimensions."""
    x = distinct((5, 7), rng)
    i = rng.integers(-5, 5, size=4099).astype(np.int32)
    j = rng.integers(0, 7, size=4099).astype(np.int32)
    f = fusec.gpu_jit(lambda x, i, j: x[i[:, None], j])
    t0 = time.perf_counter()
    out = np.asarray(f(x, i, j))  # trace, compile, run, read back: about 2 s on lavapipe
    elapsed = time.perf_counter() - t0
    assert out.shape == (4099, 4099) and out.dtype == np.float32
    assert np.array_equal(out, x[i[:, None], j])  # (assert_array_equal takes 1.5 s more here)
    assert elapsed < 30, f"{elapsed:.1f} s for a 16.8M-element gather"


# --- fusec.Array: eager, on the device ------------------------------------------------------------


def test_indexing_a_device_array_stays_on_the_device(rng, monkeypatch):
    x = distinct((31, 7, 3), rng)
    xd = fusec.device_put(x)
    reads = spy_sizes(monkeypatch, "read", lambda buf, n: n, "needs a wgpu adapter")
    cases = [(S(2, 20, 3), -1), (Ellipsis, [2, 0, 2]), (x[:, 0, 0] > 0,),
             (None, 5, S(None, None, -2)),
             (np.array([1, 30], dtype=np.int64), S(1, 2), fusec.device_put(np.int32([0, 2])))]
    results = [xd[idx] for idx in cases]
    for y in results:
        assert isinstance(y, fusec.Array)
        assert y._host is None  # nothing was read back
    assert reads == []
    for y, idx in zip(results, cases):
        want_idx = tuple(np.asarray(i) if isinstance(i, fusec.Array) else i for i in idx)
        check(y, x[want_idx])


def test_device_array_indexing_reuses_its_compilation(rng):
    x = fusec.device_put(distinct((7, 5), rng))
    x[1:3, [0, 1]].block_until_ready()
    with Delta() as d:
        y = x[1:3, [4, 2]]  # other index values, same signature
    assert d.traces == 0
    check(y, np.asarray(x)[1:3, [4, 2]])


# --- errors ---------------------------------------------------------------------------------------


def test_too_many_indices_says_how_many_axes():
    with pytest.raises(IndexingError, match="3 axes") as e:
        jit_index((0, 0, 0, 0))(np.zeros((2, 3, 4), np.float32))
    assert isinstance(e.value, IndexError) and isinstance(e.value, fusec.FusecError)
    with pytest.raises(IndexingError, match="1 axes"):
        fusec.device_put(np.zeros(3, np.float32))[[0], 1]


def test_static_int_out_of_range_names_axis_index_and_size():
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(IndexingError, match=r"index 3 is out of bounds for axis 1 with size 3"):
        jit_index((0, 3))(x)
    with pytest.raises(IndexingError, match=r"index -5 is out of bounds for axis 2 with size 4"):
        jit_index((Ellipsis, -5))(x)
    with pytest.raises(IndexError):  # mixed with index arrays too
        jit_index(([0, 1], 7))(x)


@pytest.mark.parametrize("idx,words", [
    (1.0, ["1.0", "float", "integers"]),
    ("a", ["'a'", "str"]),
    (np.array([0.0, 1.0]), ["float64", "integer or bool"]),
    ((0, [1.5]), ["float64", "integer or bool"]),
    (True, ["bool", "None"]),
    (S(0, 1.5), ["slice", "1.5", "integers or None"]),
    (S("a", None), ["slice", "'a'"]),
])
def test_wrong_index_types_are_refused(idx, words):
    with pytest.raises(DTypeError) as e:
        jit_index(idx)(np.zeros((3, 4), np.float32))
    for w in words:
        assert w in str(e.value)


def test_float_traced_index_is_refused():
    f = fusec.gpu_jit(lambda x, i: x[i])
    with pytest.raises(DTypeError, match="float32.*integer or bool"):
        f(np.zeros(3, np.float32), np.zeros(2, np.float32))


def test_traced_slice_bound_points_to_dynamic_slice():
    f = fusec.gpu_jit(lambda x, i: x[i:i + 2])
    with pytest.raises(TraceError, match="dynamic_slice"):
        f(np.zeros(5, np.float32), np.int32(1))


def test_traced_bool_mask_explains_the_alternatives():
    f = fusec.gpu_jit(lambda x: x[x > 0])
    with pytest.raises(TraceError) as e:
        f(np.zeros(5, np.float32))
    msg = str(e.value)
    assert "shape" in msg and "fnp.where(mask, x, other)" in msg and "x.at[mask].set" in msg


def test_other_index_errors():
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(IndexingError, match="one ellipsis"):
        jit_index((Ellipsis, 0, Ellipsis))(x)
    with pytest.raises(IndexingError, match=r"\(4,\).*\(3,\)"):
        jit_index(np.ones(4, bool))(x)
    with pytest.raises(IndexingError, match="do not broadcast"):
        jit_index(([0, 1], [0, 1, 2]))(x)
    with pytest.raises(ShapeError, match="step cannot be zero"):
        jit_index(S(None, None, 0))(x)


# --- .at[] ----------------------------------------------------------------------------------------


def test_at_get_is_indexing(rng):
    x = distinct((7, 31), rng)
    idx = (S(None, None, -2), [3, -1, 30])
    check(fusec.gpu_jit(lambda x: x.at[idx].get())(x), x[idx])
    i = np.array([0, 7, -8, 6], dtype=np.int32)
    got = np.asarray(fusec.gpu_jit(lambda x, i: x.at[i, 1:3].get(mode="fill"))(x, i))
    want = np.where(((i >= -7) & (i < 7))[:, None], x[clamped(i, 7), 1:3], np.nan)
    check(got, want.astype(np.float32))
    xi = distinct((7,), rng, np.int32)
    check(fusec.gpu_jit(lambda x: x.at[[0, 9]].get(mode="fill", fill_value=-5))(xi),
          np.array([xi[0], -5], np.int32))


WINDOWS = [
    (2, "scalar"),
    (-1, "row"),
    ((S(1, 5), S(None, None, -1)), "box"),
    ((Ellipsis, 0), "col"),
    ((S(None), None, S(2, 3)), "scalar"),
    ((S(10, 3), 0), "scalar"),  # empty selection: unchanged
    ((S(5, 0, -1), S(2, 30)), "box"),
    ((S(3, 4, 5), S(None, None, -1)), "box"),  # one element along a slice of step 5
]


@pytest.mark.parametrize("how", ["set", "add", "multiply", "mul", "min", "max", "divide", "power"])
@pytest.mark.parametrize("case", range(len(WINDOWS)))
def test_at_updates_of_a_box_are_one_elementwise_kernel(how, case, rng):
    idx, kind = WINDOWS[case]
    x = rng.uniform(0.5, 2.0, size=(7, 31)).astype(np.float32)
    sel = x[idx].shape
    v: Any = {"scalar": np.float32(1.5), "row": rng.uniform(0.5, 2, size=sel[-1:]),
              "box": rng.uniform(0.5, 2, size=sel), "col": rng.uniform(0.5, 2, size=sel)}[kind]
    v = np.asarray(v, np.float32)
    f = fusec.gpu_jit(lambda x, v: getattr(x.at[idx], how)(v))
    assert len(f.lower(x, v).kernels) == (1 if x[idx].size else 0)
    want = x.astype(np.float64)
    ops = {"set": lambda a, b: b, "add": np.add, "multiply": np.multiply, "mul": np.multiply,
           "min": np.minimum, "max": np.maximum, "divide": np.divide, "power": np.power}
    want[idx] = ops[how](want[idx], v.astype(np.float64))
    # WGSL's division is correct to 2.5 ULP, a GPU's pow to a few more (the op table's tolerances)
    rtol = {"power": 5e-6, "divide": 1e-6}.get(how, 1e-7)
    np.testing.assert_allclose(np.asarray(f(x, v)), want, rtol=rtol)


def test_at_set_of_ints_bools_and_a_0d_array(rng):
    x = distinct((5, 3), rng, np.int32)
    want = x.copy()
    want[1:3, 2] = -9
    check(fusec.gpu_jit(lambda x: x.at[1:3, 2].set(-9))(x), want)
    b = x > 0
    check(fusec.gpu_jit(lambda b: b.at[::-1, 1].get())(b), b[::-1, 1])
    want = b.copy()
    want[-2] = True
    check(fusec.gpu_jit(lambda b: b.at[-2].set(True))(b), want)
    s = np.float32(3.0)
    check(fusec.gpu_jit(lambda s: s.at[()].add(2.0))(s), np.float32(5.0))


def test_at_with_a_traced_mask_is_a_where(rng):
    x = distinct((7, 31), rng)
    v = distinct((31,), rng)

    @fusec.gpu_jit
    def f(x, v):
        m = x > 0
        return x.at[m].set(0.0), x.at[m].add(v), x.at[x[:, 0] < 0].max(v), x.at[m].multiply(2)

    lowered = f.lower(x, v)
    assert "scatter" not in lowered.as_text("ir")
    s, a, mx, mul = f(x, v)
    check(s, np.where(x > 0, 0, x).astype(np.float32))
    check(a, np.where(x > 0, x + v, x).astype(np.float32))
    check(mx, np.where((x[:, 0] < 0)[:, None], np.maximum(x, v), x).astype(np.float32))
    check(mul, np.where(x > 0, 2 * x, x).astype(np.float32))


def test_at_errors():
    x = np.zeros((7, 5), np.float32)
    with pytest.raises(ShapeError, match=r"\(4,\).*\(2, 5\)"):
        fusec.gpu_jit(lambda x: x.at[1:3].set(np.ones(4, np.float32)))(x)
    with pytest.raises(ShapeError, match=r"\(3,\).*\(7, 5\)"):
        fusec.gpu_jit(lambda x: x.at[x > 0].set(np.ones(3, np.float32)))(x)
    with pytest.raises(TraceError, match="fnp.where"):
        fusec.gpu_jit(lambda x: x.at[x > 0].get())(x)
    with pytest.raises(DTypeError, match="2.5"):
        fusec.gpu_jit(lambda x: x.at[0].set(2.5))(x.astype(np.int32))
    with pytest.raises(IndexingError, match="axis 0 with size 7"):
        fusec.gpu_jit(lambda x: x.at[7].set(1.0))(x)


def test_at_on_a_device_array_stays_on_the_device(rng, monkeypatch):
    x = distinct((7, 5), rng)
    xd = fusec.device_put(x)
    reads = spy_sizes(monkeypatch, "read", lambda buf, n: n, "needs a wgpu adapter")
    y = xd.at[2:4, ::-1].add(np.float32(1.0))
    z = xd.at[xd > 0].set(-1.0)
    w = xd.at[1, [0, 4]].get()
    assert all(isinstance(a, fusec.Array) and a._host is None for a in (y, z, w))
    assert reads == []
    want = x.copy()
    want[2:4, ::-1] += 1
    check(y, want)
    check(z, np.where(x > 0, -1, x).astype(np.float32))
    check(w, x[1, [0, 4]])


def test_at_add_with_repeated_indices_accumulates(rng):
    x = distinct((7, 3), rng)
    i = np.array([0, 6, 0, -1, 2, 0], np.int32)
    v = distinct((6, 3), rng)
    got = fusec.gpu_jit(lambda x, i, v: x.at[i].add(v))(x, i, v)
    want = x.astype(np.float64)
    np.add.at(want, i, v)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


@pytest.mark.parametrize("how,ref", [("min", np.minimum), ("max", np.maximum),
                                     ("multiply", np.multiply)])
def test_at_min_max_multiply_with_index_arrays(how, ref, rng):
    x = rng.uniform(0.5, 2, size=(31,)).astype(np.float32)
    i = rng.integers(-31, 31, size=40).astype(np.int32)
    v = rng.uniform(0.5, 2, size=40).astype(np.float32)
    got = fusec.gpu_jit(lambda x, i, v: getattr(x.at[i], how)(v))(x, i, v)
    want = x.astype(np.float64)
    ref.at(want, i, v)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)


def test_at_set_with_steps_arrays_and_masks(rng):
    x = distinct((7, 31), rng)
    v = distinct((4, 15), rng)
    f = fusec.gpu_jit(lambda x, v: x.at[::2, 1::2].set(v))
    want = x.copy()
    want[::2, 1::2] = v
    check(f(x, v), want)
    mask = x > 0
    want = x.copy()
    want[mask] = np.arange(mask.sum())
    check(fusec.gpu_jit(lambda x, v: x.at[mask].set(v))(x, np.arange(mask.sum(), dtype=np.float32)),
          want)
    want = x.copy()
    want[[0, 5], 3:6] = v[:2, :3]
    check(fusec.gpu_jit(lambda x, v: x.at[[0, 5], 3:6].set(v))(x, v[:2, :3]), want)


def test_at_drops_out_of_range_updates(rng):
    x = distinct((7,), rng)
    i = np.array([1, 7, -8, 100, -1], np.int32)
    got = fusec.gpu_jit(lambda x, i: x.at[i].add(10.0))(x, i)
    want = x.copy()
    want[[1, -1]] += 10
    check(got, want)


@pytest.mark.parametrize("idx", [(S(None), [0, 2, 0]), ([1, 1, -7], S(None, None, -2)),
                                 (-1, [3, 1, 3]), ([[0], [6]], None, [1, 2]),
                                 (Ellipsis, np.array([[4, 4]], np.int64))],
                         ids=["slice-array", "array-step", "int-array", "separated", "ellipsis"])
def test_at_add_with_mixed_indices_matches_numpy_add_at(idx, rng):
    x = distinct((7, 5), rng)
    v = distinct(x[idx].shape, rng)
    got = fusec.gpu_jit(lambda x, v: x.at[idx].add(v))(x, v)
    want = x.astype(np.float64)
    np.add.at(want, idx, v)
    check(got, want.astype(np.float32))


def test_at_divide_power_and_clip_mode(rng):
    x = rng.uniform(0.5, 2, size=(7,)).astype(np.float32)
    i = np.array([0, 0, 3], np.int32)
    v = np.array([2.0, 4.0, 0.5], np.float32)
    factor = np.ones(7)
    np.multiply.at(factor, i, v.astype(np.float64))
    f = fusec.gpu_jit(lambda x, i, v: (x.at[i].divide(v), x.at[i].power(v)))
    d, p = f(x, i, v)
    np.testing.assert_allclose(np.asarray(d), x / factor, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(p), x.astype(np.float64) ** factor, rtol=2e-5)
    want = x.copy()
    want[[0, 6, 2]] = v  # -9 counts from the end once (-2), then clamps to 0; 100 clamps to 6
    g = fusec.gpu_jit(lambda x, v: x.at[np.array([-9, 100, 2])].set(v, mode="clip"))
    check(g(x, v), want)


@requires_wgpu
def test_at_with_index_arrays_on_a_device_array(rng):
    x = distinct((7, 5), rng)
    y = fusec.device_put(x).at[np.array([1, 1, 4]), 2:].add(np.float32(10))
    assert isinstance(y, fusec.Array) and y._host is None
    want = x.copy()
    want[1, 2:] += 20
    want[4, 2:] += 10
    check(y, want)


@requires_wgpu
def test_at_with_a_concrete_or_device_mask_and_one_value_is_a_where(rng):
    x = distinct((7, 31), rng)
    mask = x[:, 0] > 0
    f = fusec.gpu_jit(lambda x: x.at[mask].set(-1.0))
    assert "scatter" not in f.lower(x).as_text("ir")
    want = x.copy()
    want[mask] = -1
    check(f(x), want)
    xd = fusec.device_put(x)
    y = xd.at[xd < 0].multiply(np.float32(3))
    assert y._host is None
    check(y, np.where(x < 0, 3 * x, x).astype(np.float32))


# --- take, take_along_axis, diagonal --------------------------------------------------------------

FILL = {np.float32: np.nan, np.int32: -(2**31), np.uint32: 2**32 - 1, np.bool_: True}


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint32, np.bool_])
def test_take_fills_out_of_range(dtype, rng):
    x = distinct((7, 5), rng, np.int64)
    x = (x > 0) if dtype is np.bool_ else x.astype(dtype)
    i = np.array([[0, -1, 6], [7, -7, -8]], dtype=np.int32)
    got = fusec.gpu_jit(lambda x, i: fnp.take(x, i, axis=0))(x, i)
    ok = (i >= -7) & (i < 7)
    want = np.where(ok[:, :, None], x[clamped(i, 7)], FILL[dtype]).astype(dtype)
    check(got, want)


def test_take_modes_axes_and_scalars(rng):
    x = distinct((3, 31, 2), rng)
    i = np.array([0, 30, -1, 31, -32, 100], dtype=np.int32)
    check(fnp.take(x, i, axis=1, mode="clip"), np.take(x, i, axis=1, mode="clip"))
    check(fnp.take(x, i, axis=-2, mode="fill", fill_value=7.0),
          np.where(((i >= -31) & (i < 31))[None, :, None], np.take(x, clamped(i, 31), axis=1),
                   np.float32(7)))
    check(fnp.take(x, [5, 0, 185], axis=None), np.take(x, [5, 0, 185]))
    check(fnp.take(x, 2, axis=0), x[2])
    check(fusec.device_put(x).take(np.int64(4), axis=1), x[:, 4])
    y = fusec.gpu_jit(lambda x, i: x.take(i, axis=2))(x, np.array([[1], [0]], np.uint32))
    check(y, np.take(x, [[1], [0]], axis=2))


def test_take_wrap():
    x = np.arange(7, dtype=np.float32)
    i = np.array([0, 7, -1, -15, 2**31 - 1], np.int32)
    check(fnp.take(x, i, mode="wrap"), np.take(x, i, mode="wrap"))


def test_take_kernel_count_acceptance(rng):
    """The issue's acceptance line: an embedding lookup plus positions plus relu is one kernel."""
    vocab, seq, d = 257, 31, 7
    table = rng.standard_normal((vocab, d)).astype(np.float32)
    pos = rng.standard_normal((64, d)).astype(np.float32)
    ids = rng.integers(0, vocab, size=seq).astype(np.int32)
    f = fusec.gpu_jit(lambda table, ids, pos: nn.relu(fnp.take(table, ids, axis=0) + pos[:seq]))
    assert len(f.lower(table, ids, pos).kernels) == 1
    check(f(table, ids, pos), np.maximum(table[ids] + pos[:seq], 0))


def test_take_along_axis(rng):
    x = distinct((5, 31), rng)
    order = np.argsort(x, axis=1).astype(np.int32)
    check(fnp.take_along_axis(x, order, axis=1), np.take_along_axis(x, order, axis=1))
    i0 = rng.integers(-7, 7, size=(4, 31)).astype(np.int32)  # "fill" outside [-5, 5)
    want = np.where((i0 >= -5) & (i0 < 5), np.take_along_axis(x, clamped(i0, 5), axis=0), np.nan)
    check(fnp.take_along_axis(x, i0, axis=0), want.astype(np.float32))
    # the other axes broadcast, as in JAX: indices (1, 3) against (5, 31)
    i = np.array([[0, 30, -1]], dtype=np.int32)
    check(fnp.take_along_axis(x, i, axis=-1), x[:, [0, 30, -1]])
    check(fnp.take_along_axis(x[:1], np.array([[2], [3]], np.int64), axis=1),
          x[:1, [2, 3]].T)
    flat = np.array([0, 154, -1, 155], np.int32)
    check(fnp.take_along_axis(x, flat, axis=None, mode="clip"), x.ravel()[[0, 154, 0, 154]])
    with pytest.raises(ShapeError, match="as many axes"):
        fnp.take_along_axis(x, np.zeros(3, np.int32), axis=1)


@pytest.mark.parametrize("shape,offset,a1,a2", [((7, 5), 0, 0, 1), ((7, 5), 2, 0, 1),
                                                ((7, 5), -3, 0, 1), ((3, 4, 5), 1, 2, 0),
                                                ((3, 4, 5), -1, -1, 1), ((4, 4), 9, 0, 1)])
def test_diagonal(shape, offset, a1, a2, rng):
    x = distinct(shape, rng)
    got = fusec.gpu_jit(lambda x: fnp.diagonal(x, offset, a1, a2))(x)
    check(got, np.diagonal(x, offset, a1, a2))


# --- fusec.lax ------------------------------------------------------------------------------------


def _fit(s: int, d: int, n: int) -> int:
    s = s + d if s < 0 else s
    return min(max(s, 0), d - n)


def test_dynamic_slice_clamps_traced_starts(rng):
    x = distinct((7, 31, 3), rng)
    f = fusec.gpu_jit(lambda x, i, j: lax.dynamic_slice(x, (i, j, 1), (3, 5, 2)))
    for i, j in [(0, 0), (4, 26), (6, 30), (-1, -5), (-100, 100), (2, -40)]:
        a, b = _fit(i, 7, 3), _fit(j, 31, 5)
        check(f(x, np.int32(i), np.int32(j)), x[a:a + 3, b:b + 5, 1:3])
    starts = np.array([5, -2, 0], np.int32)
    g = fusec.gpu_jit(lambda x, s: lax.dynamic_slice(x, s, (2, 1, 3)))
    check(g(x, starts), x[5:7, 29:30, :])
    check(lax.dynamic_slice(x, np.array([1, 2, 3]), [1, 1, 1]), x[1:2, 2:3, 2:3])
    check(lax.dynamic_slice(x, (-1, 0, 0), (1, 31, 3), allow_negative_indices=False), x[:1])
    check(lax.dynamic_slice_in_dim(x, np.int32(-3), 2, axis=1), x[:, 28:30])
    check(lax.dynamic_index_in_dim(x, np.int32(9), axis=0), x[6:7])
    check(lax.dynamic_index_in_dim(x, -1, axis=2, keepdims=False), x[..., 2])
    check(lax.dynamic_slice(x, (np.uint32(5), 0, 0), (4, 1, 1)), x[3:7, :1, :1])


@requires_wgpu
def test_dynamic_update_slice_is_one_kernel(rng):
    x = distinct((7, 31), rng)
    u = distinct((3, 4), rng) * 100
    f = fusec.gpu_jit(lambda x, u, i, j: lax.dynamic_update_slice(x, u * 2, (i, j)) + 1)
    assert len(f.lower(x, u, np.int32(0), np.int32(0)).kernels) == 1
    for i, j in [(0, 0), (4, 27), (6, 30), (-2, -1), (-50, 3)]:
        a, b = _fit(i, 7, 3), _fit(j, 31, 4)
        want = x.copy()
        want[a:a + 3, b:b + 4] = u * 2
        check(f(x, u, np.int32(i), np.int32(j)), want + 1)
    col = distinct((7, 1), rng)
    want = x.copy()
    want[:, 5:6] = col
    check(lax.dynamic_update_slice_in_dim(x, col, np.int32(5), axis=1), want)
    xd = fusec.device_put(x)
    y = lax.dynamic_update_slice(xd, u[:1, :2], (np.int32(3), 9))
    assert isinstance(y, fusec.Array) and y._host is None
    want = x.copy()
    want[3, 9:11] = u[0, :2]
    check(y, want)


def _threads(f: Any, *args: Any) -> int:
    """Threads the single kernel of ``f``'s plan for ``args`` launches (workgroups of 256)."""
    kernels = f.lower(*args).kernels
    assert len(kernels) == 1, [k.name for k in kernels]
    return int(np.prod(kernels[0].grid)) * 256


@requires_wgpu
@pytest.mark.parametrize("target", ["gpu", "cpu"])
def test_dynamic_update_slice_into_a_donated_buffer_runs_over_its_window(rng, target):
    """An update written in place into a donated buffer is computed over its window alone (a
    decode step's cache update: one position, not the whole cache); the rest of the buffer keeps
    its values, whatever the start (clamped, negative, at either end). On both targets' code (a
    GPU's binds large buffers as vec4s)."""
    with forced_target(target):
        _window_updates(rng)


def _window_updates(rng: np.random.Generator) -> None:
    # 65568 elements in rows of 16: the whole-buffer kernel would bind them as vec4s
    x = distinct((3, 2, 683, 16), rng)
    u = distinct((3, 2, 1, 16), rng) * 1000
    w = distinct((3, 2, 1, 16), rng) * 10000

    def step(a: Any, b: Any, u: Any, w: Any, p: Any) -> Any:
        # the update is computed (fused into the kernel); two buffers share the start
        return (lax.dynamic_update_slice(a, u * 2.0 - 1.0, (0, 0, p, 0)),
                lax.dynamic_update_slice(b, w + u, (0, 0, p, 0)))

    f = fusec.gpu_jit(step, donate_argnums=(0, 1))
    p0 = np.int32(0)
    assert _threads(f, x, x, u, w, p0) == 256  # 96 elements, not 65568
    for p in [0, 5, 682, -1, -700, 800]:
        a, b = fusec.device_put(x), fusec.device_put(x + 0.5)
        ya, yb = f(a, b, u, w, np.int32(p))
        s = _fit(p, 683, 1)
        want_a, want_b = x.copy(), x + 0.5
        want_a[:, :, s:s + 1] = u * 2.0 - 1.0
        want_b[:, :, s:s + 1] = w + u
        check(ya, want_a)
        check(yb, want_b)

    # windows along several axes, static (x.at[...].set) and traced starts mixed
    y = distinct((5, 300, 7), rng)
    v = distinct((2, 3, 7), rng) * 10
    g = fusec.gpu_jit(lambda y, v, i: lax.dynamic_update_slice(y, v, (i, 250, 0)),
                      donate_argnums=0)
    assert _threads(g, y, v, np.int32(0)) == 256
    for i in [0, 3, 4, -2]:
        want = y.copy()
        want[_fit(i, 5, 2):_fit(i, 5, 2) + 2, 250:253] = v
        check(g(fusec.device_put(y), v, np.int32(i)), want)
    h = fusec.gpu_jit(lambda y, v: y.at[1:3, 7:10].set(v + 1.0), donate_argnums=0)
    assert _threads(h, y, v) == 256
    want = y.copy()
    want[1:3, 7:10] = v + 1.0
    check(h(fusec.device_put(y), v), want)

    # not donated: the output is a buffer of its own, written whole; the input is unchanged
    k = fusec.gpu_jit(lambda y, v, i: lax.dynamic_update_slice(y, v, (i, 250, 0)))
    assert _threads(k, y, v, np.int32(0)) >= y.size
    yd = fusec.device_put(y)
    want = y.copy()
    want[1:3, 250:253] = v
    check(k(yd, v, np.int32(1)), want)
    check(yd, y)
    # a donated buffer changed by a test that is no window: every element
    m = fusec.gpu_jit(lambda y, v: fnp.where(y > 0, y, v[:1, :1]), donate_argnums=0)
    assert _threads(m, y, v) >= y.size // 4  # (vectorised: 4 elements a thread)
    check(m(fusec.device_put(y), v), np.where(y > 0, y, v[:1, :1]))


def test_lax_errors():
    x = np.zeros((7, 5), np.float32)
    with pytest.raises(ShapeError, match="slice size 8 on axis 0"):
        lax.dynamic_slice(x, (0, 0), (8, 1))
    with pytest.raises(ShapeError, match="1 start indices for an array of 2 axes"):
        lax.dynamic_slice(x, (0,), (1, 1))
    with pytest.raises(DTypeError, match="float32"):
        lax.dynamic_slice(x, (np.float32(1), 0), (1, 1))
    with pytest.raises(DTypeError, match="int32.*float32"):
        lax.dynamic_update_slice(x, np.zeros((1, 1), np.int32), (0, 0))
    with pytest.raises(ShapeError, match="as many axes"):
        lax.dynamic_update_slice(x, np.zeros(3, np.float32), (0, 0))


# --- property test: random index expressions -----------------------------------------------------


@st.composite
def index_expressions(draw: Any) -> tuple[tuple[int, ...], tuple[Any, ...]]:
    """A shape and an in-range index expression over it: per axis an int, a slice (any step,
    bounds past the ends), an index array (shapes broadcasting to one block), a mask or the whole
    axis; then Nones anywhere and maybe an ellipsis for a run of whole axes."""
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=0, max_size=4)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    block = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    kinds = [draw(st.sampled_from(["int", "slice", "array", "full", "mask"])) for _ in shape]
    if kinds.count("mask") + kinds.count("array") > 1:  # a mask's length must not meet a block
        kinds = ["array" if k == "mask" else k for k in kinds]
    entries: list[Any] = []
    for d, kind in zip(shape, kinds):
        if kind == "int":
            entries.append(draw(st.integers(-d, d - 1)))
        elif kind == "slice":
            bound = st.none() | st.integers(-d - 2, d + 2)
            step = st.none() | st.sampled_from([-3, -2, -1, 1, 2, 3])
            entries.append(slice(draw(bound), draw(bound), draw(step)))
        elif kind == "array":
            keep = draw(st.integers(0, len(block)))
            sub = tuple(n if draw(st.booleans()) else 1 for n in block[len(block) - keep:])
            arr = rng.integers(-d, d, size=sub)
            entries.append(arr.tolist() if draw(st.booleans()) and sub else arr.astype(np.int32))
        elif kind == "mask":
            entries.append(rng.random(d) < 0.5)
        else:
            entries.append(slice(None))
    # drop trailing whole axes, or replace a run of whole axes (maybe empty) with ...
    def whole(e: Any) -> bool:
        return isinstance(e, slice) and e == slice(None)

    if draw(st.booleans()):
        start = draw(st.sampled_from([k for k, e in enumerate(entries) if whole(e)]
                                     + [len(entries)]))
        end = start
        while end < len(entries) and whole(entries[end]) and draw(st.booleans()):
            end += 1
        entries[start:end] = [Ellipsis]
    elif draw(st.booleans()):
        while entries and whole(entries[-1]):
            entries.pop()
    for _ in range(draw(st.integers(0, 2))):
        entries.insert(draw(st.integers(0, len(entries))), None)
    return shape, tuple(entries)


@settings(max_examples=60, deadline=None)
@given(index_expressions())
def test_random_index_expressions_match_numpy(case):
    shape, idx = case
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) * 2 - 7
    want = x[idx]
    got = np.asarray(jit_index(idx)(x))
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
