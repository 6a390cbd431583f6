"""Dtype defaults as JAX gives them with 64-bit types off: float64 (numpy's default) and int64
inputs become float32 and int32 at the boundary with a one-time warning; FUSEC_STRICT_DTYPES=1
makes them an error; Python scalars stay weakly typed."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import numpy as np
import pytest

import fusec
import fusec.numpy as fnp
from fusec import dtypes


@pytest.fixture(autouse=True)
def fresh_warnings() -> Iterator[None]:
    dtypes._warned.clear()  # "once per process": start each test from none shown
    yield
    dtypes._warned.clear()


def _caught(fn: object, *args: object) -> tuple[object, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        out = fn(*args)  # type: ignore[operator]
    return out, [w for w in got if "fusec computes in 32-bit types" in str(w.message)]


def test_float64_in_float32_out_one_warning(rng: np.random.Generator) -> None:
    f = fusec.gpu_jit(lambda x, y: x * 2.5 + y)
    x, y = rng.standard_normal(37), rng.standard_normal(37)  # numpy's default: float64
    out, caught = _caught(f, x, y)
    assert out.dtype == np.float32
    np.testing.assert_allclose(np.asarray(out), x * 2.5 + y, rtol=1e-6, atol=1e-6)
    assert len(caught) == 1, [str(w.message) for w in caught]
    msg = str(caught[0].message)
    assert "'x'" in msg and "float64" in msg and "float32" in msg and "FUSEC_STRICT_DTYPES" in msg
    assert caught[0].filename == __file__  # points at the caller, not inside fusec
    # a second call, and other float64 arguments: no new warning
    out2, again = _caught(f, rng.standard_normal(37), y)
    assert again == [] and out2.dtype == np.float32


def test_int64_becomes_int32_and_keeps_integer_semantics() -> None:
    f = fusec.gpu_jit(lambda i: i * 3 + 1)
    out, caught = _caught(f, np.arange(-5, 6))  # int64
    assert out.dtype == np.int32 and len(caught) == 1 and "int64" in str(caught[0].message)
    np.testing.assert_array_equal(np.asarray(out), np.arange(-5, 6) * 3 + 1)


@pytest.mark.parametrize("src, dst", [("longdouble", "float32"), ("int8", "int32"),
                                      ("int16", "int32"), ("uint8", "uint32"),
                                      ("uint16", "uint32"), ("uint64", "uint32")])
def test_narrow_dtypes_widen_or_narrow_to_their_32_bit_kind(src: str, dst: str) -> None:
    x = (np.arange(7) % 5).astype(src)
    out, caught = _caught(fusec.gpu_jit(lambda x: x + x), x)
    assert out.dtype == np.dtype(dst) and len(caught) == 1
    np.testing.assert_array_equal(np.asarray(out), (x.astype(dst) * 2))


def test_float16_is_kept_without_a_warning() -> None:
    x = (np.arange(7) % 5).astype(np.float16)
    out, caught = _caught(fusec.gpu_jit(lambda x: x + x), x)
    assert out.dtype == np.float16 and caught == []
    np.testing.assert_array_equal(np.asarray(out), x * 2)


def test_the_other_entry_points_convert_too(rng: np.random.Generator) -> None:
    table = rng.standard_normal(4)  # a float64 closure constant
    out, _ = _caught(fusec.gpu_jit(lambda x: x * table), np.ones(4, np.float32))
    assert out.dtype == np.float32
    np.testing.assert_allclose(np.asarray(out), table, rtol=1e-6)
    dev, _ = _caught(fusec.device_put, np.arange(3.0))
    assert dev.dtype == np.float32
    assert fusec.ShapeDtype((3,), "float64").dtype == "float32"
    cast, _ = _caught(fusec.gpu_jit(lambda x: x.astype("int64")), np.full(3, 2.7, np.float32))
    assert cast.dtype == np.int32 and list(np.asarray(cast)) == [2, 2, 2]
    eager, _ = _caught(fnp.exp, np.zeros(3))
    assert eager.dtype == np.float32


def test_strict_setting_raises_the_old_error() -> None:
    fusec.config.set("strict_dtypes", 1)
    try:
        with pytest.raises(fusec.DTypeError, match=r"'x'.*float64.*FUSEC_STRICT_DTYPES"):
            fusec.gpu_jit(lambda x: x + 1)(np.ones(3))
    finally:
        fusec.config.set("strict_dtypes", None)


def test_python_scalars_stay_weakly_typed() -> None:
    f32 = fusec.gpu_jit(lambda x: x * 2.5 + 1)(np.ones(3, np.float32))
    i32 = fusec.gpu_jit(lambda x: x * 2 + 1)(np.ones(3, np.int32))
    u32 = fusec.gpu_jit(lambda x: x + 7)(np.ones(3, np.uint32))
    promoted = fusec.gpu_jit(lambda x: x * 0.5)(np.full(3, 3, np.int32))
    assert (f32.dtype, i32.dtype, u32.dtype, promoted.dtype) == (
        np.float32, np.int32, np.uint32, np.float32)
    assert list(np.asarray(promoted)) == [1.5, 1.5, 1.5]


def test_complex_is_refused_whatever_the_setting() -> None:
    with pytest.raises(fusec.DTypeError, match="complex128"):
        fusec.gpu_jit(lambda x: x + 1)(np.ones(3, np.complex128))
