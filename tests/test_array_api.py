"""The Array API names of fusec.numpy (fusec.numpy.array_api): version, dtype objects, asarray,
the data type functions, the standard's aliases, and a piece of code written against the standard
run with ``xp = fusec.numpy`` (eagerly and inside gpu_jit) and with ``xp = numpy`` (numpy 2's main
namespace follows the standard)."""

from __future__ import annotations

import builtins
import itertools
import math
from typing import Any

import numpy as np
import pytest

import fusec
import fusec.numpy as fnp
from fusec.errors import DTypeError, ShapeError, TraceError

pytestmark = pytest.mark.filterwarnings("ignore:fusec.*has been traced:RuntimeWarning")

DTYPES = [fnp.bool, fnp.int32, fnp.uint32, fnp.float32]


# --- the namespace --------------------------------------------------------------------------------


def test_version_dtypes_and_constants():
    assert fnp.__array_api_version__ == "2023.12"
    assert fnp.bool is not builtins.bool and np.dtype(fnp.bool) == np.dtype(np.bool_)
    assert (fnp.float32, fnp.int32, fnp.uint32) == (np.float32, np.int32, np.uint32)
    assert not hasattr(fnp, "float64") and not hasattr(fnp, "complex64")  # deliberately absent
    for name in ("bool", "float32", "asarray", "result_type", "can_cast", "isdtype", "finfo",
                 "iinfo", "pow", "permute_dims", "concat", "matrix_transpose", "vecdot",
                 "__array_api_version__", "__array_namespace_info__", "e", "pi", "newaxis"):
        assert name in fnp.__all__, name
    assert (fnp.e, fnp.pi) == (math.e, math.pi)
    assert fnp.inf == math.inf and math.isnan(fnp.nan) and fnp.newaxis is None
    x = fnp.asarray([1.5, 2.0])
    assert x.dtype == fnp.float32 and fnp.asarray([True]).dtype == fnp.bool
    assert fnp.asarray([1, 2]).dtype == fnp.int32


def test_namespace_info():
    info = fnp.__array_namespace_info__()
    d = info.default_dtypes()
    assert d["real floating"] == fnp.float32 and d["integral"] == fnp.int32
    assert d["indexing"] == fnp.int32 and d["complex floating"] is None
    assert set(info.dtypes()) == {"float32", "float16", "int32", "uint32", "bool"}
    assert set(info.dtypes(kind="integral")) == {"int32", "uint32"}
    assert set(info.dtypes(kind=("bool", "real floating"))) == {"bool", "float32", "float16"}
    assert info.devices() == [info.default_device()]
    assert info.capabilities()["data-dependent shapes"] is False


# --- asarray --------------------------------------------------------------------------------------

HOST = [
    ([1.5, -2.0, 3.25], None, np.float32),
    ([[1, 2], [3, -4]], None, np.int32),
    ([True, False], None, np.bool_),
    (np.arange(7, dtype=np.int64) - 3, None, np.int32),
    (np.linspace(0, 1, 33), None, np.float32),  # float64 -> float32
    (np.arange(5, dtype=np.uint64), None, np.uint32),
    (np.arange(4, dtype=np.int8), None, np.int32),
    (np.float16(2.5), None, np.float16),
    (3.5, None, np.float32),
    (7, None, np.int32),
    ([1.9, -1.9], np.int32, np.int32),  # a cast: toward zero
    ([0, 2, -1], bool, np.bool_),
    ([1, 2], "float32", np.float32),
    (np.array([[2**32 - 1]], np.uint32), None, np.uint32),
]


@pytest.mark.parametrize("obj, dtype, want", HOST, ids=[str(i) for i in range(len(HOST))])
def test_asarray_of_host_data(obj, dtype, want):
    ref = np.asarray(obj, dtype=dtype).astype(want)
    eager = fnp.asarray(obj, dtype=dtype)
    assert isinstance(eager, fusec.Array)
    jitted = fusec.gpu_jit(lambda: fnp.asarray(obj, dtype=dtype))()
    for got in (eager, jitted):
        assert got.dtype == np.dtype(want) and got.shape == ref.shape
        np.testing.assert_array_equal(np.asarray(got), ref)


def test_asarray_refuses_what_does_not_fit():
    with pytest.raises(DTypeError, match="do not fit in int32"):
        fnp.asarray(np.array([2**40, 1]))
    with pytest.raises(DTypeError, match="do not fit in uint32"):
        fnp.asarray([-1, 2], dtype=fnp.uint32)
    with pytest.raises(DTypeError, match="complex128 has no fusec counterpart"):
        fnp.asarray([1 + 2j])
    with pytest.warns(UserWarning, match="becomes float32"):  # JAX's default with x64 off
        fusec.dtypes._warned.discard(("float64", "float32"))  # (shown once per process)
        assert fnp.asarray([1.5], dtype=np.float64).dtype == np.float32
    with pytest.raises(ValueError, match="one device"):
        fnp.asarray([1.0], device="gpu:3")


def test_asarray_copy_semantics(rng):
    a = fusec.device_put(rng.standard_normal((2, 7)).astype(np.float32))
    assert fnp.asarray(a) is a and fnp.asarray(a, copy=False) is a
    c = fnp.asarray(a, copy=True)
    assert c is not a
    np.testing.assert_array_equal(np.asarray(c), np.asarray(a))
    i = fnp.asarray(a, dtype=fnp.int32)
    np.testing.assert_array_equal(np.asarray(i), np.asarray(a).astype(np.int32))
    with pytest.raises(ValueError, match="copy=False.*needs a copy"):
        fnp.asarray(a, dtype=fnp.int32, copy=False)
    with pytest.raises(ValueError, match="copy=False.*host data must be copied"):
        fnp.asarray(np.zeros(3, np.float32), copy=False)


def test_asarray_inside_jit(rng):
    x = rng.integers(-9, 9, size=(7,)).astype(np.int32)
    y = rng.standard_normal(7).astype(np.float32)
    captured = fusec.device_put(y)

    @fusec.gpu_jit
    def f(x, y):
        same = fnp.asarray(x)
        stacked = fnp.asarray([x, x * 2])  # a list of traced values stacks
        weak_int = x * fnp.asarray(3)  # Python scalars stay weak, as in JAX: int32 result
        weak_float = x * fnp.asarray(0.5)  # a float scalar makes it float32
        const = fnp.asarray([[1, 2, 3, 4, 5, 6, 7]], dtype=fnp.float32) + y
        return same, stacked, weak_int, weak_float, const, fnp.asarray(captured) * 2

    refs = [x, np.stack([x, x * 2]), x * 3, (x * 0.5).astype(np.float32),
            np.arange(1, 8, dtype=np.float32)[None] + y, y * 2]
    for got, ref in zip(f(x, y), refs, strict=True):
        assert got.dtype == ref.dtype and got.shape == ref.shape
        np.testing.assert_array_equal(np.asarray(got), ref)


# --- data type functions --------------------------------------------------------------------------


def test_finfo_and_iinfo():
    fi = fnp.finfo(fnp.float32)
    assert (fi.eps, fi.max, fi.min, fi.tiny) == (np.finfo(np.float32).eps, np.finfo(np.float32).max,
                                                  np.finfo(np.float32).min,
                                                  np.finfo(np.float32).tiny)
    assert fnp.finfo(fnp.asarray([1.0])).bits == 32
    for dt in (fnp.int32, fnp.uint32):
        ii = fnp.iinfo(dt)
        assert (ii.min, ii.max, ii.bits) == (np.iinfo(dt).min, np.iinfo(dt).max, 32)
    assert fnp.iinfo(np.zeros(2, np.int64)).max == 2**31 - 1  # int64 data becomes int32
    with pytest.raises(DTypeError, match="finfo: int32 is not a floating dtype"):
        fnp.finfo(fnp.int32)
    with pytest.raises(DTypeError, match="iinfo: bool is not an integer dtype"):
        fnp.iinfo(fnp.bool)


# JAX's promotion with 64-bit types off
PROMOTE = {
    ("bool", "int32"): "int32", ("bool", "uint32"): "uint32", ("bool", "float32"): "float32",
    ("int32", "uint32"): "int32", ("int32", "float32"): "float32",
    ("uint32", "float32"): "float32",
}


def test_result_type_of_dtypes_and_arrays():
    for a, b in itertools.product(DTYPES, DTYPES):
        na, nb = np.dtype(a).name, np.dtype(b).name
        want = na if na == nb else PROMOTE.get((na, nb)) or PROMOTE[(nb, na)]
        assert fnp.result_type(a, b) == np.dtype(want), (na, nb)
        arr = fnp.asarray(np.zeros(2, a))
        assert fnp.result_type(arr, b) == np.dtype(want)
        assert fnp.result_type(np.zeros(1, a), np.zeros(1, b), a) == np.dtype(want)
    # where numpy's own rules stay within 32 bits they agree
    for a, b in (("float32", "float32"), ("bool", "int32"), ("uint32", "bool")):
        assert fnp.result_type(a, b) == np.result_type(a, b)
    assert fnp.result_type(fnp.int32, fnp.uint32, fnp.float32) == fnp.float32
    # Python scalars are weak
    assert fnp.result_type(fnp.int32, 1.0) == fnp.float32
    assert fnp.result_type(fnp.uint32, 1) == fnp.uint32
    assert fnp.result_type(fnp.bool, 1) == fnp.int32
    assert fnp.result_type(fnp.float32, 1) == fnp.float32
    assert fnp.result_type(1, 2.0) == fnp.float32 and fnp.result_type(True) == fnp.bool
    with pytest.raises(ValueError, match="at least one"):
        fnp.result_type()
    with pytest.raises(DTypeError):
        fnp.result_type(fnp.int32, np.complex64)

    # traced values, weak ones included
    @fusec.gpu_jit(static_argnames=("want",))
    def traced(x, s, want):
        assert fnp.result_type(x, s) == want and fnp.result_type(x, s, 2.5) == fnp.float32
        return x

    traced(np.zeros(2, np.int32), 3, want=np.dtype(np.int32))


def test_can_cast_is_numpys_safe_casting():
    for a, b in itertools.product(DTYPES, DTYPES):
        assert fnp.can_cast(a, b) == np.can_cast(a, b), (a, b)
    assert not fnp.can_cast(fnp.int32, fnp.float32)  # float32 cannot hold every int32
    assert fnp.can_cast(fnp.asarray([True]), fnp.float32)
    assert not fnp.can_cast(np.zeros(2, np.float32), fnp.int32)


KINDS = ["bool", "signed integer", "unsigned integer", "integral", "real floating",
         "complex floating", "numeric", ("bool", "integral"), ("complex floating",),
         np.int32, np.dtype(np.float32)]


def test_isdtype_matches_numpy():
    for dt, kind in itertools.product(DTYPES + [np.float64], KINDS):
        assert fnp.isdtype(dt, kind) == np.isdtype(np.dtype(dt), kind), (dt, kind)
    assert fnp.isdtype(fnp.asarray([1]).dtype, "integral")
    with pytest.raises(ValueError, match="unknown kind 'float'"):
        fnp.isdtype(fnp.float32, "float")
    with pytest.raises(DTypeError, match="expected a dtype, got an array; pass x.dtype"):
        fnp.isdtype(fnp.asarray([1.0]), "real floating")


# --- the standard's names of numpy functions ------------------------------------------------------


def test_aliases_match_numpy(rng):
    x = rng.standard_normal((2, 7, 33)).astype(np.float32)
    v = rng.standard_normal((7, 1)).astype(np.float32)
    w = rng.standard_normal((1, 33)).astype(np.float32)
    i = rng.integers(-5, 5, size=(7, 1)).astype(np.int32)

    def f(x, v, w, i):
        return (fnp.pow(x, 2.0), fnp.pow(i, 3), fnp.permute_dims(x, (2, 0, 1)),
                fnp.concat([x, x], axis=-1), fnp.concat([v, w.T], axis=None),
                fnp.matrix_transpose(x), fnp.vecdot(x, w), fnp.vecdot(x, v, axis=-2),
                fnp.vecdot(x, x, axis=0), fnp.vecdot(i, i, axis=0))

    refs = (np.pow(x, 2.0), np.pow(i, 3), np.permute_dims(x, (2, 0, 1)),
            np.concat([x, x], axis=-1), np.concat([v, w.T], axis=None),
            np.matrix_transpose(x), np.vecdot(x, w), np.vecdot(x, v, axis=-2),
            np.vecdot(x, x, axis=0), np.vecdot(i, i, axis=0))
    for got, ref in zip(fusec.gpu_jit(f)(x, v, w, i), refs, strict=True):
        ref = np.asarray(ref)
        assert got.dtype == ref.dtype and got.shape == ref.shape
        # vecdot: a float32 sum of <= 33 products
        tol = 1e-5 * np.sqrt(33) * np.max(np.abs(ref), initial=1.0)
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-6, atol=tol)
    np.testing.assert_allclose(np.asarray(fnp.vecdot(x, w)), np.vecdot(x, w), rtol=1e-5,
                               atol=1e-4)


def test_alias_errors():
    with pytest.raises(ShapeError, match=r"vecdot: x1 has shape \(2, 3\) and x2 has shape "
                                         r"\(1,\); along axis -1 they must have the same length"):
        fnp.vecdot(np.zeros((2, 3), np.float32), np.zeros(1, np.float32))
    with pytest.raises(ShapeError, match=r"matrix_transpose: x has shape \(3,\)"):
        fnp.matrix_transpose(np.zeros(3, np.float32))
    with pytest.raises(ShapeError, match="permute_dims: axes is required"):
        fnp.permute_dims(np.zeros((2, 3), np.float32), None)
    with pytest.raises(TraceError, match="asarray: a traced value was used outside"):
        leaked = []
        fusec.gpu_jit(lambda x: leaked.append(x) or x)(np.zeros(2, np.float32))
        fnp.asarray(leaked[0])


# --- code written against the standard ------------------------------------------------------------


def api_code(xp: Any, a: Any, b: Any) -> tuple[Any, ...]:
    """A small computation that uses only the Array API standard's names."""
    x = xp.asarray(a)
    y = xp.asarray(b, dtype=xp.float32)
    assert xp.result_type(x, y) == xp.float32
    assert xp.isdtype(x.dtype, "real floating") and not xp.isdtype(x.dtype, "integral")
    both = xp.concat([x, y], axis=1)  # (7, 5)
    t = xp.permute_dims(both, (1, 0))  # (5, 7)
    scale = 2.0 if xp.isdtype(t.dtype, ("real floating", "complex floating")) else 1.0
    pair = xp.stack([t * scale, xp.flip(t, axis=1) - 1.0], axis=0)  # (2, 5, 7)
    positive = xp.where(pair > 0, pair, xp.zeros_like(pair))
    weights = xp.asarray([1.0, 2.0, 3.0, 4.0, 5.0], dtype=xp.float32)
    scores = xp.vecdot(xp.matrix_transpose(positive), weights)  # (2, 7)
    flags = xp.astype(xp.asarray(b) > 0, xp.int32)
    grid = xp.reshape(xp.tile(xp.eye(3, dtype=xp.float32), (1, 2)), (3, 2, 3))
    mask = xp.astype(xp.tril(xp.ones((4, 4), dtype=xp.float32)), xp.bool)
    bound = xp.asarray(xp.finfo(xp.float32).max, dtype=xp.float32)
    parts = xp.unstack(xp.roll(xp.reshape(xp.arange(12, dtype=xp.int32), (3, 4)), 1, axis=1))
    return (scores, flags, grid, mask, xp.pow(bound / 2, 1.0), *parts)


def test_array_api_code_runs_like_numpy(rng):
    a = rng.standard_normal((7, 2)).astype(np.float32)
    b = rng.integers(-5, 6, size=(7, 3)).astype(np.int32)
    want = api_code(np, a, b)
    eager = api_code(fnp, a, b)
    jitted = fusec.gpu_jit(lambda a, b: api_code(fnp, a, b))(a, b)
    for got in (eager, jitted):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            w = np.asarray(w)
            assert isinstance(g, fusec.Array)
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5,
                                       atol=1e-5 * float(np.max(np.abs(w), initial=1.0)))
