"""Array creation (fusec.numpy.creation, fusec.nn.one_hot) against numpy, eagerly and inside
gpu_jit.

Static-argument creation functions are run once per case eagerly (each returns a fusec.Array) and
all cases together in one jitted function (one compile), so the checks stay fast. Integer, bool
and exactly representable results must match numpy bit for bit; float ranges are computed in
float32 on the device as ``start + i * step`` against numpy's float64, which bounds the error by a
few float32 roundings of the largest magnitude involved (see ``_range_tol``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fusec
import fusec.numpy as fnp
from fusec import ShapeDtype as S
from fusec import nn
from fusec.errors import DTypeError, ShapeError, TraceError

U32 = 2.0 ** -24  # float32 unit roundoff

# eager calls compile once per signature, and these tests make many on purpose
pytestmark = pytest.mark.filterwarnings("ignore:fusec.*has been traced:RuntimeWarning")


def eager_and_jit(make: Callable[[Any], Any], cases: list[Any]) -> list[tuple[Any, Any]]:
    """(eager result, jitted result) of ``make(case)`` for every case; the jitted ones come from
    one function returning them all."""
    eager = []
    for c in cases:
        out = make(c)
        assert isinstance(out, fusec.Array), (c, type(out))
        eager.append(np.asarray(out))
    jitted = fusec.gpu_jit(lambda: tuple(make(c) for c in cases))()
    return list(zip(eager, (np.asarray(j) for j in jitted)))


def n_kernels(fn: Callable[..., Any], *specs: S) -> int:
    return len(fusec.gpu_jit(fn).lower(*specs).kernels)


# --- arange ---------------------------------------------------------------------------------------

ARANGE = [
    ((5,), {}),
    ((0,), {}),
    ((-3,), {}),
    ((1,), {}),
    ((2, 11, 3), {}),
    ((10, 0, -3), {}),
    ((-7, 26), {}),
    ((5, 5), {}),
    ((0.5, 3, 0.7), {}),
    ((-1.0, 1.0, 0.0625), {}),
    ((3, 0.0, -0.3), {}),
    ((1e4, 1e4 + 33, 1.0), {}),
    ((0, 7), {"dtype": np.float32}),
    ((10, 0, -3), {"dtype": np.uint32}),
    ((2**31 - 8, 2**31 - 1), {}),
    ((7.0,), {"dtype": np.int32}),
]


def _range_tol(values: np.ndarray) -> float:
    # start + i * step in float32: at most ~3 roundings of the largest magnitude
    return 4 * U32 * float(np.max(np.abs(values), initial=1.0))


def test_arange_matches_numpy_eagerly_and_in_jit():
    results = eager_and_jit(lambda c: fnp.arange(*c[0], **c[1]), ARANGE)
    for (args, kw), (eager, jitted) in zip(ARANGE, results):
        ref = np.arange(*args, dtype=kw.get("dtype"))
        all_int = not any(isinstance(a, float) for a in args)
        want_dt = np.dtype(kw.get("dtype") or (np.int32 if all_int else np.float32))
        for got in (eager, jitted):
            assert got.dtype == want_dt, (args, kw, got.dtype)
            assert got.shape == ref.shape, (args, kw)
            if got.dtype.kind == "f":
                np.testing.assert_allclose(got, ref, rtol=0, atol=_range_tol(ref))
            else:
                np.testing.assert_array_equal(got, ref.astype(got.dtype), err_msg=str(args))


def test_arange_fuses_into_its_consumer():
    # an iota is computed in the kernel that reads it: no buffer, no kernel of its own
    assert n_kernels(lambda x: x * fnp.arange(33, dtype=np.float32), S((7, 33))) == 1


def test_arange_errors():
    with pytest.raises(ShapeError, match="step must not be zero"):
        fnp.arange(0, 5, 0)
    with pytest.raises(DTypeError, match="bool"):
        fnp.arange(2, dtype=bool)
    with pytest.raises(DTypeError, match="does not fit in int32"):
        fnp.arange(2**31 - 2, 2**31 + 2)
    with pytest.raises(TraceError, match="arange's stop must be a Python number known at trace"):
        fusec.gpu_jit(lambda n: fnp.arange(0, n))(np.int32(3) * np.ones((), np.int32))


# --- linspace -------------------------------------------------------------------------------------

LINSPACE = [
    ((0, 1, 5), {}),
    ((-1, 1, 33), {}),
    ((2.5, -7, 7), {"endpoint": False}),
    ((3, 3, 4), {}),
    ((0.1, 0.7, 1), {}),
    ((0, 1, 0), {}),
    ((1e3, -1e-3, 2), {}),
    ((-5, 0, 4), {"dtype": np.int32}),
    ((0, 12, 4), {"dtype": np.int32}),
    ((-0.3, 1e2, 50), {}),
]


def test_linspace_matches_numpy_with_exact_endpoints():
    results = eager_and_jit(lambda c: fnp.linspace(*c[0], **c[1]), LINSPACE)
    for (args, kw), (eager, jitted) in zip(LINSPACE, results):
        ref = np.linspace(*args, **kw)
        for got in (eager, jitted):
            assert got.shape == ref.shape, (args, kw)
            if "dtype" in kw:
                assert got.dtype == np.int32
                np.testing.assert_array_equal(got, ref, err_msg=str(args))
                continue
            assert got.dtype == np.float32
            np.testing.assert_allclose(got, ref, rtol=0, atol=_range_tol(ref), err_msg=str(args))
            if got.size:
                assert got[0] == np.float32(args[0])  # exactly start
            if got.size > 1 and kw.get("endpoint", True):
                assert got[-1] == np.float32(args[1])  # exactly stop


def test_linspace_errors():
    with pytest.raises(ShapeError, match="linspace's num must be non-negative"):
        fnp.linspace(0, 1, -1)
    with pytest.raises(TraceError, match="linspace's num must be an int"):
        fnp.linspace(0, 1, 2.5)


# --- eye, identity, tri ---------------------------------------------------------------------------

MATRICES = [(1, None, 0, np.float32), (2, None, 0, np.float32), (7, 33, 3, np.float32),
            (33, 7, -2, np.int32), (7, 7, -10, np.float32), (3, 5, 0, np.uint32),
            (4, None, 1, np.bool_), (5, 0, 0, np.float32)]


@pytest.mark.parametrize("name", ["eye", "tri"])
def test_eye_and_tri_match_numpy(name):
    fn = getattr(fnp, name)
    results = eager_and_jit(lambda c: fn(c[0], c[1], k=c[2], dtype=c[3]), MATRICES)
    for (n, m, k, dt), (eager, jitted) in zip(MATRICES, results):
        ref = getattr(np, name)(n, m, k=k, dtype=dt)
        for got in (eager, jitted):
            assert got.dtype == np.dtype(dt)
            np.testing.assert_array_equal(got, ref, err_msg=f"{name}{(n, m, k, dt)}")


def test_identity():
    np.testing.assert_array_equal(np.asarray(fnp.identity(7)), np.identity(7, np.float32))
    got = fusec.gpu_jit(lambda: fnp.identity(3, dtype=np.int32))()
    assert got.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(got), np.identity(3, np.int32))


def test_eye_plus_an_array_is_one_kernel():
    assert n_kernels(lambda x: x + fnp.eye(7, 33, k=2), S((7, 33))) == 1


# --- tril, triu -----------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 1), (2, 7), (7, 7), (33, 2), (2, 7, 33), (3, 1, 2, 7)])
def test_tril_triu_match_numpy(rng, shape):
    base = rng.standard_normal(shape) * 9
    xs = [base.astype(dt) for dt in (np.float32, np.int32, np.bool_)]
    ks = (0, 1, -1, 5, -40)

    def all_of(*arrays):
        return tuple(f(a, k=k) for a in arrays for f in (fnp.tril, fnp.triu) for k in ks)

    jitted = fusec.gpu_jit(all_of)(*xs)
    refs = [f(a, k=k) for a in xs for f in (np.tril, np.triu) for k in ks]
    for got, ref in zip(jitted, refs, strict=True):
        assert got.dtype == ref.dtype
        np.testing.assert_array_equal(np.asarray(got), ref)
    # eagerly, with a negative k and the default
    np.testing.assert_array_equal(np.asarray(fnp.tril(xs[0])), np.tril(xs[0]))
    np.testing.assert_array_equal(np.asarray(fnp.triu(xs[1], -2)), np.triu(xs[1], -2))


def test_tril_keeps_nan_and_inf_where_kept(rng):
    x = rng.standard_normal((7, 7)).astype(np.float32)
    x[3, 1], x[1, 3], x[4, 4] = np.nan, np.inf, -np.inf
    np.testing.assert_array_equal(np.asarray(fnp.tril(x)), np.tril(x))  # nan==nan in this check
    np.testing.assert_array_equal(np.asarray(fnp.triu(x)), np.triu(x))


def test_tril_times_two_is_one_kernel():
    assert n_kernels(lambda x: fnp.tril(x) * 2, S((3, 7, 7))) == 1


def test_tril_needs_a_matrix():
    with pytest.raises(ShapeError, match="tril: argument 'v' has shape \\(7,\\); it needs at "
                                         "least 2 dimensions"):
        fusec.gpu_jit(lambda v: fnp.tril(v))(np.zeros(7, np.float32))
    with pytest.raises(TraceError, match="triu's k"):
        fusec.gpu_jit(lambda v, k: fnp.triu(v, k))(np.zeros((2, 2), np.float32),
                                                   np.ones((), np.int32))


# --- filled arrays --------------------------------------------------------------------------------

FILLED = [
    ("zeros", ((7, 2),), {}), ("zeros", ((),), {"dtype": np.int32}), ("zeros", (33,), {}),
    ("ones", ((1, 7),), {"dtype": np.uint32}), ("ones", ((0, 3),), {}),
    ("ones", ((2,),), {"dtype": bool}), ("empty", ((2, 7),), {}),
    ("full", ((7,), 2.5), {}), ("full", ((2, 2), 3), {}), ("full", ((2,), True), {}),
    ("full", ((3,), 2.7), {"dtype": np.int32}), ("full", ((3,), -2.7), {"dtype": np.int32}),
    ("full", ((2, 3), 7), {"dtype": np.float32}), ("full", ((1,), np.float32(1.5)), {}),
]


def test_filled_arrays_match_numpy():
    results = eager_and_jit(lambda c: getattr(fnp, c[0])(*c[1], **c[2]), FILLED)
    for (name, args, kw), (eager, jitted) in zip(FILLED, results):
        ref = getattr(np, name)(*args, **kw)
        if name == "empty":
            ref = np.zeros_like(ref)
        # JAX's dtypes with 64-bit types off: Python floats float32, ints int32
        want = np.dtype(kw["dtype"]) if "dtype" in kw else (
            np.dtype(np.int32) if ref.dtype == np.int64 else
            np.dtype(np.float32) if ref.dtype == np.float64 else ref.dtype)
        for got in (eager, jitted):
            assert got.dtype == want, (name, args, kw, got.dtype)
            np.testing.assert_array_equal(got, ref.astype(want), err_msg=f"{name}{args}")


def test_full_with_an_array_fill_value(rng):
    row = rng.standard_normal(7).astype(np.float32)
    got = fnp.full((2, 3, 7), row)
    np.testing.assert_array_equal(np.asarray(got), np.broadcast_to(row, (2, 3, 7)))
    got = fusec.gpu_jit(lambda r: fnp.full((33, 7), r, dtype=np.int32))(row)
    np.testing.assert_array_equal(np.asarray(got), np.broadcast_to(row.astype(np.int32), (33, 7)))


@pytest.mark.parametrize("shape", [(), (1,), (2, 7), (33, 1, 2)])
def test_like_functions(rng, shape):
    base = rng.standard_normal(shape) * 5
    arrays = [base.astype(dt) for dt in (np.float32, np.int32, np.uint32, np.bool_)]

    def likes(x):
        return (fnp.zeros_like(x), fnp.ones_like(x), fnp.full_like(x, 3), fnp.empty_like(x),
                fnp.zeros_like(x, dtype=np.float32), fnp.ones_like(x, shape=(2, 7)),
                fnp.full_like(x, 2.5, dtype=np.float32, shape=(7,)))

    def refs(a):
        return (np.zeros_like(a), np.ones_like(a), np.full_like(a, 3), np.zeros_like(a),
                np.zeros_like(a, dtype=np.float32), np.ones_like(a, shape=(2, 7)),
                np.full_like(a, 2.5, dtype=np.float32, shape=(7,)))

    jitted = fusec.gpu_jit(lambda *xs: [likes(x) for x in xs])(*arrays)
    for a, gots in zip(arrays, jitted, strict=True):
        for got, ref in zip(gots, refs(a), strict=True):
            assert got.dtype == ref.dtype and got.shape == ref.shape
            np.testing.assert_array_equal(np.asarray(got), ref)
    eager = fnp.full_like(arrays[1], 1)
    assert isinstance(eager, fusec.Array)
    np.testing.assert_array_equal(np.asarray(eager), np.full_like(arrays[1], 1))


def test_filled_array_errors():
    with pytest.raises(ShapeError, match="zeros|full's shape"):
        fnp.zeros((2, -1))
    with pytest.raises(DTypeError, match="complex64"):
        fnp.ones(3, dtype=np.complex64)
    fusec.config.set("strict_dtypes", 1)  # float64 is converted to float32 unless strict
    try:
        with pytest.raises(DTypeError, match="float64"):
            fnp.ones(3, dtype=np.float64)
    finally:
        fusec.config.set("strict_dtypes", None)
    with pytest.raises(DTypeError, match="does not fit in uint32"):
        fnp.full(3, -1, dtype=np.uint32)


# --- meshgrid -------------------------------------------------------------------------------------


@pytest.mark.parametrize("sizes", [(1,), (2, 7), (7, 1, 33), (2, 1, 7, 2)])
@pytest.mark.parametrize("indexing", ["xy", "ij"])
def test_meshgrid_matches_numpy(rng, sizes, indexing):
    xs = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    xs[-1] = (xs[-1] * 9).astype(np.int32)  # mixed dtypes stay per output
    refs = np.meshgrid(*xs, indexing=indexing)
    sparse_refs = np.meshgrid(*xs, indexing=indexing, sparse=True)
    jitted = fusec.gpu_jit(lambda *v: (fnp.meshgrid(*v, indexing=indexing),
                                       fnp.meshgrid(*v, indexing=indexing, sparse=True)))(*xs)
    eager = fnp.meshgrid(*xs, indexing=indexing)
    for outs, want in ((jitted[0], refs), (jitted[1], sparse_refs), (eager, refs)):
        assert len(outs) == len(want)
        for got, ref in zip(outs, want):
            assert got.dtype == ref.dtype and got.shape == ref.shape
            np.testing.assert_array_equal(np.asarray(got), ref)


def test_meshgrid_bad_indexing():
    with pytest.raises(ValueError, match="meshgrid's indexing must be 'xy' or 'ij'; got 'yx'"):
        fnp.meshgrid(np.zeros(2, np.float32), indexing="yx")


# --- one_hot --------------------------------------------------------------------------------------


def one_hot_ref(ids: np.ndarray, n: int, axis: int) -> np.ndarray:
    hit = np.asarray(ids)[..., None] == np.arange(n)
    return np.moveaxis(hit, -1, axis)


@pytest.mark.parametrize("shape", [(1,), (7,), (2, 33)])
@pytest.mark.parametrize("n", [1, 2, 7])
def test_one_hot_matches_reference(rng, shape, n):
    ids = rng.integers(-3, n + 3, size=shape).astype(np.int32)  # out of range both ways
    axes = (-1, 0, len(shape))

    def hots(i):
        return tuple(nn.one_hot(i, n, axis=a) for a in axes) + (
            nn.one_hot(i, n, dtype=np.int32), nn.one_hot(i, n, dtype=bool))

    got = fusec.gpu_jit(hots)(ids)
    refs = [one_hot_ref(ids, n, a).astype(np.float32) for a in axes] + [
        one_hot_ref(ids, n, -1).astype(np.int32), one_hot_ref(ids, n, -1)]
    for g, r in zip(got, refs):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_array_equal(np.asarray(g), r)
    # out-of-range and negative ids give all-zero rows
    rows = np.asarray(got[0]).reshape(-1, n)
    bad = (ids.reshape(-1) < 0) | (ids.reshape(-1) >= n)
    assert not rows[bad].any() and (rows[~bad].sum(axis=1) == 1).all()


def test_one_hot_of_uint32_and_float_ids_and_eagerly():
    ids = np.array([0, 3, 2**32 - 1, 1], np.uint32)  # a huge uint32 id must not wrap to -1
    np.testing.assert_array_equal(np.asarray(nn.one_hot(ids, 4)),
                                  one_hot_ref(ids, 4, -1).astype(np.float32))
    f = np.array([0.0, 1.5, 2.0, np.nan, -1.0], np.float32)
    np.testing.assert_array_equal(np.asarray(nn.one_hot(f, 3)),
                                  one_hot_ref(f, 3, -1).astype(np.float32))


def test_one_hot_errors():
    with pytest.raises(ShapeError, match="one_hot's axis 2 is out of bounds"):
        nn.one_hot(np.zeros(3, np.int32), 4, axis=2)
    with pytest.raises(ShapeError, match="num_classes must be non-negative"):
        nn.one_hot(np.zeros(3, np.int32), -1)
