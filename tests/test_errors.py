"""Bad inputs raise fusec errors whose messages say what is wrong, where, and what to do."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import fusec
import fusec.numpy as fnp

S = fusec.ShapeDtype

requires_gpu = pytest.mark.skipif(
    fusec.default_device().is_cpu_fallback,
    reason="needs a wgpu adapter (FUSEC_BACKEND=cpu runs the numpy interpreter)")


def f32(*shape: int) -> np.ndarray:
    return np.ones(shape, np.float32)


def raises(exc: type[BaseException], fn: Any, *args: Any, **kwargs: Any) -> str:
    """Call fn, require exc (and FusecError), return the message."""
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, fusec.FusecError), type(info.value)
    return str(info.value)


def has(msg: str, *words: str) -> None:
    for w in words:
        assert w in msg, f"{w!r} not in message: {msg}"


# --- shapes ---------------------------------------------------------------------------------------


def test_matmul_shape_mismatch_names_both_arguments_and_dims():
    @fusec.gpu_jit
    def f(activations, weights):
        return activations @ weights

    msg = raises(fusec.ShapeError, f, f32(3, 4), f32(5, 6))
    has(msg, "matmul", "'activations'", "'weights'", "(3, 4)", "(5, 6)")
    assert re.search(r"\b4\b", msg) and re.search(r"\b5\b", msg)
    # the same at lower() time, with abstract arguments
    msg = raises(fusec.ShapeError, f.lower, S((3, 4)), S((5, 6)))
    has(msg, "'activations'", "'weights'")


def test_matmul_vector_mismatch():
    msg = raises(fusec.ShapeError, fusec.gpu_jit(lambda v, m: v @ m), f32(3), f32(4, 2))
    has(msg, "'v'", "'m'", "(3,)", "(4, 2)")


def test_matmul_batch_dims_that_do_not_broadcast():
    msg = raises(fusec.ShapeError, fusec.gpu_jit(lambda a, b: a @ b), f32(2, 3, 4), f32(5, 4, 6))
    has(msg, "batch", "(2, 3, 4)", "(5, 4, 6)")


def test_non_broadcastable_add():
    msg = raises(fusec.ShapeError, fusec.gpu_jit(lambda x, y: x + y), f32(3, 4), f32(5))
    has(msg, "(3, 4)", "(5,)", "broadcast")


def test_reshape_to_an_incompatible_size():
    msg = raises(fusec.ShapeError, fusec.gpu_jit(lambda x: x.reshape(4, 4)), f32(3, 5))
    has(msg, "reshape", "(3, 5)", "(4, 4)")
    msg = raises(fusec.ShapeError, fusec.gpu_jit(lambda x: x.reshape(-1, 4)), f32(3, 5))
    has(msg, "reshape", "(3, 5)")


@pytest.mark.parametrize("perm", [(0, 0), (1,), (0, 2), (0, 1, 2)])
def test_transpose_with_a_bad_perm(perm):
    msg = raises(fusec.ShapeError, fusec.gpu_jit(lambda x: fnp.transpose(x, perm)), f32(3, 5))
    has(msg, "transpose")
    assert "permutation" in msg or "out of bounds" in msg


@pytest.mark.parametrize("fn", [
    lambda x: x.sum(axis=2),
    lambda x: x.max(axis=-3),
    lambda x: fnp.mean(x, axis=(0, 5)),
    lambda x: fnp.squeeze(x, axis=4),
    lambda x: fnp.expand_dims(x, 4),
], ids=["sum", "max", "mean", "squeeze", "expand_dims"])
def test_axis_out_of_range(fn):
    msg = raises(fusec.ShapeError, fusec.gpu_jit(fn), f32(3, 5))
    has(msg, "axis", "out of bounds", "dimensions")


def test_repeated_axis():
    msg = raises(fusec.ShapeError, fusec.gpu_jit(lambda x: x.sum(axis=(1, -1))), f32(3, 5))
    has(msg, "repeated axis")


def test_squeeze_of_a_non_unit_axis():
    msg = raises(fusec.ShapeError, fusec.gpu_jit(lambda x: fnp.squeeze(x, axis=0)), f32(3, 5))
    has(msg, "squeeze", "axis 0", "3")


def test_broadcast_to_a_smaller_shape():
    msg = raises(fusec.ShapeError, fusec.gpu_jit(lambda x: fnp.broadcast_to(x, (5,))), f32(3, 5))
    has(msg, "broadcast", "(3, 5)", "(5,)")


@pytest.mark.parametrize("red", ["max", "min"])
def test_max_over_a_zero_size_axis(red):
    msg = raises(fusec.ShapeError, fusec.gpu_jit(lambda x: getattr(x, red)(axis=0)), f32(0, 5))
    has(msg, red, "zero-size", "identity")


# --- dtypes ---------------------------------------------------------------------------------------


@pytest.fixture
def strict_dtypes():
    """FUSEC_STRICT_DTYPES=1: 64-, 16- and 8-bit dtypes are refused instead of converted."""
    fusec.config.set("strict_dtypes", 1)
    yield
    fusec.config.set("strict_dtypes", None)


@pytest.mark.parametrize("dtype", ["float64", "int64", "complex64", "complex128", "int8",
                                   "uint64"])
def test_unsupported_array_dtypes_name_the_argument(dtype, strict_dtypes):
    @fusec.gpu_jit
    def f(inputs):
        return inputs * 2

    msg = raises(fusec.DTypeError, f, np.ones(3, dtype=dtype))
    has(msg, "'inputs'", dtype, "float32", "int32", "uint32", "bool")


def test_python_complex_scalar():
    msg = raises(fusec.DTypeError, fusec.gpu_jit(lambda x, z: x * z), f32(3), 1 + 2j)
    has(msg, "'z'", "complex", "float32")


def test_complex_arrays_are_refused_without_the_strict_setting():
    msg = raises(fusec.DTypeError, fusec.gpu_jit(lambda x: x * 2), np.ones(3, np.complex64))
    has(msg, "complex64", "float32")


def test_unsupported_dtype_deep_in_a_pytree_names_its_path(strict_dtypes):
    f = fusec.gpu_jit(lambda params: params["layers"][1] * 2.0)
    msg = raises(fusec.DTypeError, f, {"layers": [f32(2), np.ones(2, np.float64)]})
    has(msg, "params['layers'][1]", "float64")


def test_unsupported_dtype_in_a_closure_constant(strict_dtypes):
    table = np.ones(4, np.float64)
    msg = raises(fusec.DTypeError, fusec.gpu_jit(lambda x: x * table), f32(4))
    has(msg, "float64", "float32")


def test_unsupported_dtypes_elsewhere(strict_dtypes):
    has(raises(fusec.DTypeError, S, (3,), "float64"), "float64")
    has(raises(fusec.DTypeError, fusec.gpu_jit(lambda x: x.astype("int64")), f32(3)), "int64")
    has(raises(fusec.DTypeError, fusec.device_put, np.ones(3, np.float64)), "float64")


def test_uint32_plus_a_negative_python_int():
    msg = raises(fusec.DTypeError, fusec.gpu_jit(lambda x: x + (-1)), np.ones(3, np.uint32))
    has(msg, "-1", "uint32")


def test_int32_plus_an_out_of_range_python_int():
    msg = raises(fusec.DTypeError, fusec.gpu_jit(lambda x: x + 2**40), np.ones(3, np.int32))
    has(msg, str(2**40), "int32")


def test_bool_arithmetic_numpy_refuses():
    msg = raises(fusec.DTypeError, fusec.gpu_jit(lambda m: m - m), np.ones(3, bool))
    has(msg, "bool")


def test_matmul_of_bools():
    msg = raises(fusec.DTypeError, fusec.gpu_jit(lambda a: a @ a), np.ones((2, 2), bool))
    has(msg, "matmul", "bool")


# --- Python control flow and conversions on traced values ----------------------------------------


def test_python_if_on_a_traced_value():
    @fusec.gpu_jit
    def relu_by_hand(x):
        if x > 0:
            return x
        return -x

    msg = raises(fusec.TracerBoolConversionError, relu_by_hand, f32(3))
    has(msg, "if", "traced value", "relu_by_hand", "where", "static_argnames")


def test_python_while_on_a_traced_value():
    @fusec.gpu_jit
    def halve(x):
        while x.sum() > 1.0:
            x = x / 2.0
        return x

    msg = raises(fusec.TracerBoolConversionError, halve, f32(3))
    has(msg, "while", "traced value", "halve")


@pytest.mark.parametrize("conv,word", [(float, "float()"), (bool, "bool()"), (int, "int()")])
def test_python_conversions_of_a_traced_value(conv, word):
    msg = raises(fusec.TracerBoolConversionError, fusec.gpu_jit(lambda x: conv(x.sum())), f32(3))
    has(msg, word, "traced value")


def test_traced_value_as_python_index():
    msg = raises(fusec.TraceError, fusec.gpu_jit(lambda x: [1.0, 2.0][x.sum()]),
                 np.ones(1, np.int32))
    has(msg, "traced value")


def test_numpy_asarray_on_a_traced_value():
    msg = raises(fusec.TraceError, fusec.gpu_jit(lambda x: np.asarray(x)), f32(3))
    has(msg, "numpy array", "fusec.numpy")


def test_numpy_function_on_a_traced_value():
    msg = raises(fusec.TraceError, fusec.gpu_jit(lambda x: np.sin(x)), f32(3))
    has(msg, "fusec.numpy")


def test_errors_are_also_the_matching_builtin_exceptions():
    # code that catches TypeError/ValueError, as it would for numpy, still works
    with pytest.raises(TypeError):
        fusec.gpu_jit(lambda x: bool(x))(f32(1))
    with pytest.raises(ValueError):
        fusec.gpu_jit(lambda x, y: x + y)(f32(3), f32(4))
    with pytest.raises(TypeError):
        fusec.gpu_jit(lambda x: x)(np.ones(2, np.complex64))


# --- arguments ------------------------------------------------------------------------------------


def test_unhashable_static_argument():
    f = fusec.gpu_jit(lambda x, shape: x.reshape(shape), static_argnames=("shape",))
    msg = raises(fusec.StaticArgumentError, f, f32(6), [2, 3])
    has(msg, "'shape'", "hashable", "list", "tuple")


def test_unhashable_static_argument_by_position():
    f = fusec.gpu_jit(lambda x, table: x * len(table), static_argnums=(1,))
    msg = raises(fusec.StaticArgumentError, f, f32(3), {"a": 1})
    has(msg, "'table'", "hashable")


def test_string_passed_as_a_dynamic_argument():
    f = fusec.gpu_jit(lambda x, mode: x * 2 if mode == "double" else x)
    msg = raises(fusec.TraceError, f, f32(3), "double")
    has(msg, "'mode'", "str", "static_argnames=('mode',)")


def test_unsupported_object_in_a_pytree_argument():
    f = fusec.gpu_jit(lambda cfg: cfg["x"] * 2.0)
    msg = raises(fusec.TraceError, f, {"x": f32(2), "name": "layer1"})
    has(msg, "cfg['name']", "str")


def test_shapedtype_passed_to_a_real_call():
    f = fusec.gpu_jit(lambda x, y: x + y)
    msg = raises(fusec.TraceError, f, f32(3), S((3,)))
    has(msg, "'y'", "ShapeDtype", "lower", "warmup")


def test_returning_something_that_is_not_an_array():
    f = fusec.gpu_jit(lambda x: {"y": x * 2.0, "name": "out"})
    msg = raises(fusec.TraceError, f, f32(3))
    has(msg, "str", "['name']")


def test_leaked_tracer_used_in_another_trace():
    leaked = []

    @fusec.gpu_jit
    def keep(x):
        y = x * 2.0
        leaked.append(y)
        return y

    keep(f32(3))

    @fusec.gpu_jit
    def use(x):
        return x + leaked[0]

    msg = raises(fusec.TraceError, use, f32(3))
    has(msg, "trace")


def test_static_argnums_out_of_range():
    msg = raises(fusec.StaticArgumentError, fusec.gpu_jit, lambda x: x, static_argnums=(2,))
    has(msg, "static_argnums", "1 positional")


def test_static_argnames_that_do_not_exist():
    def f(x, axis):
        return x

    msg = raises(fusec.StaticArgumentError, fusec.gpu_jit, f, static_argnames=("axes",))
    has(msg, "'axes'", "x, axis")


# --- device limits --------------------------------------------------------------------------------


def _max_elements() -> int:
    limits = fusec.default_device().limits
    return int(limits["max-storage-buffer-binding-size"]) // 4


@requires_gpu
def test_argument_above_the_binding_size_names_the_argument():
    n = _max_elements() + 1  # lower() allocates nothing, so this costs no memory

    @fusec.gpu_jit
    def f(small, huge):
        return huge * 2.0 + small.sum()

    with pytest.raises(fusec.DeviceLimitError) as info:
        f.lower(S((4,)), S((n,)))
    msg = str(info.value)
    has(msg, "'huge'", str(n * 4), str(_max_elements() * 4))
    assert "'small'" not in msg


@requires_gpu
def test_argument_exactly_at_the_binding_size_is_accepted():
    n = _max_elements()
    lowered = fusec.gpu_jit(lambda x: x.sum()).lower(S((n,)))
    assert len(lowered.kernels) >= 1


@requires_gpu
def test_intermediate_above_the_binding_size():
    n = _max_elements()
    f = fusec.gpu_jit(lambda x: (x, fnp.broadcast_to(x, (2, n)) * 2.0))
    msg = raises(fusec.DeviceLimitError, f.lower, S((n,)))
    has(msg, f"(2, {n})", str(2 * n * 4))


def test_oversized_intermediate_that_is_never_materialised_is_fine():
    # (2**13, 2**13) float32 is 256 MiB, but fused into the reduction it never exists in memory
    n = 2**13
    lowered = fusec.gpu_jit(lambda a, b: (fnp.reshape(a, (n, 1)) * b).sum(axis=0)).lower(
        S((n,)), S((n,)))
    # one kernel, or on the GPU target two (the column reduction is split in chunks of rows)
    assert 1 <= len(lowered.kernels) <= 2
    assert all(v.shape != (n, n) for v in lowered.ir.vars())


@requires_gpu
def test_device_put_above_the_binding_size():
    n = _max_elements() + 1
    big = np.broadcast_to(np.float32(0), (n,))
    msg = raises(fusec.DeviceLimitError, fusec.device_put, big)
    has(msg, str(n * 4))


def test_python_int_argument_outside_int32_names_the_argument():
    # a dynamic Python int is a weak int32 scalar; one that does not fit must be refused clearly
    # (today numpy's bare OverflowError escapes at upload time, naming nothing)
    f = fusec.gpu_jit(lambda x, offset: x + offset)
    msg = raises(fusec.FusecError, f, np.ones(3, np.int32), 2**40)
    has(msg, "'offset'", str(2**40), "int32")


def test_integer_setting_that_is_not_an_integer_names_its_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the tuning constants read from the environment (FUSEC_PROBS_IN_PRODUCT, FUSEC_ROW_THREADS,
    # FUSEC_POOL_BYTES, ...): a clear error, not int()'s ValueError; unset or empty: the default
    from fusec.config import env_int

    monkeypatch.setenv("FUSEC_PROBS_IN_PRODUCT", "lots")
    with pytest.raises(fusec.FusecError, match=r"FUSEC_PROBS_IN_PRODUCT must be an integer; "
                                               r"got 'lots'"):
        env_int("FUSEC_PROBS_IN_PRODUCT", 256)
    monkeypatch.setenv("FUSEC_PROBS_IN_PRODUCT", " ")
    assert env_int("FUSEC_PROBS_IN_PRODUCT", 256) == 256
    monkeypatch.setenv("FUSEC_PROBS_IN_PRODUCT", "128")
    assert env_int("FUSEC_PROBS_IN_PRODUCT", 256) == 128
    monkeypatch.delenv("FUSEC_PROBS_IN_PRODUCT")
    assert env_int("FUSEC_PROBS_IN_PRODUCT", 256) == 256
