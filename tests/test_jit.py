"""gpu_jit: signature caching, weak scalars, pytrees, static arguments, nested jit, constants,
device-resident arrays, outputs, AOT (lower/compile/warmup)."""

from __future__ import annotations

import gc
import warnings
from typing import Any

import numpy as np
import pytest
from helpers import Delta, spy_sizes

import fusec
import fusec.numpy as fnp
from fusec import nn

S = fusec.ShapeDtype
RNG = np.random.default_rng(7)

requires_gpu = pytest.mark.skipif(
    fusec.default_device().is_cpu_fallback,
    reason="needs a wgpu adapter (FUSEC_BACKEND=cpu runs the numpy interpreter)")


def rand(*shape: int) -> np.ndarray:
    return RNG.uniform(-1, 1, shape).astype(np.float32)


def check(out: Any, want: np.ndarray, rtol: float = 1e-5) -> None:
    assert isinstance(out, fusec.Array), type(out)
    got = np.asarray(out)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-6)


@pytest.fixture
def uploads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of every host-to-device upload while the test runs."""
    return spy_sizes(monkeypatch, "upload", lambda data, *_: int(np.asarray(data).nbytes),
                     "needs a wgpu adapter: the numpy fallback uploads nothing")


# --- caching --------------------------------------------------------------------------------------


def test_second_call_with_same_signature_traces_and_compiles_nothing():
    f = fusec.gpu_jit(lambda x, y: fnp.tanh(x) * y + 0.5)
    x, y = rand(13, 17), rand(17)
    with Delta() as first:
        f(x, y)
    assert first.traces == 1 and first.misses == 1 and first.hits == 0
    with Delta() as second:
        out = f(rand(13, 17), rand(17))  # new values, same signature
    assert second.traces == 0
    assert second.lowerings == 0
    assert second.pipelines_compiled == 0
    assert second.misses == 0
    assert second.hits == 1
    assert np.asarray(out).shape == (13, 17)


def test_repeated_calls_return_fresh_correct_results():
    f = fusec.gpu_jit(lambda x: x * 2.0 + 1.0)
    a, b = rand(50), rand(50)
    ra, rb = f(a), f(b)
    check(ra, a * 2 + 1)
    check(rb, b * 2 + 1)  # the second call did not overwrite the first result
    check(ra, a * 2 + 1)


@pytest.mark.parametrize("other", [
    pytest.param(lambda: (rand(4, 6),), id="shape"),
    pytest.param(lambda: (rand(4, 5)[None],), id="rank"),
    pytest.param(lambda: (np.ones((4, 5), np.int32),), id="dtype"),
    pytest.param(lambda: ((rand(4, 5),),), id="structure"),
])
def test_new_signature_retraces(other):
    f = fusec.gpu_jit(lambda x: fnp.sum(x, axis=-1) if not isinstance(x, tuple) else x[0])
    f(rand(4, 5))
    with Delta() as d:
        f(*other())
    assert d.traces == 1 and d.misses == 1
    with Delta() as again:
        f(*other())
    assert again.traces == 0 and again.hits == 1


def test_new_static_value_retraces():
    f = fusec.gpu_jit(lambda x, axis: x.sum(axis=axis), static_argnames=("axis",))
    x = rand(4, 5)
    check(f(x, axis=0), x.sum(axis=0))
    with Delta() as d:
        check(f(x, axis=1), x.sum(axis=1))
    assert d.traces == 1
    with Delta() as d2:
        check(f(x, 1), x.sum(axis=1))  # the same value passed positionally
    assert d2.traces == 0 and d2.hits == 1


def test_python_scalars_are_weak_and_do_not_retrace():
    f = fusec.gpu_jit(lambda x, s: x * s + s)
    x = rand(3, 4)
    check(f(x, 2.0), x * 2 + 2)
    with Delta() as d:
        out = f(x, 3.0)
    assert d.traces == 0 and d.pipelines_compiled == 0 and d.hits == 1
    check(out, x * 3 + 3)  # the new value is used, not the traced one
    check(f(x, -0.5), x * -0.5 - 0.5)


def test_weak_scalars_take_the_array_dtype():
    fi = fusec.gpu_jit(lambda i, s: i * s)
    i = np.arange(6, dtype=np.int32)
    out = fi(i, 3)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(out), i * 3)
    fu = fusec.gpu_jit(lambda u, s: u + s)
    u = np.arange(6, dtype=np.uint32)
    assert fu(u, 7).dtype == np.uint32
    np.testing.assert_array_equal(np.asarray(fu(u, 7)), u + 7)
    # an int array meeting a Python float becomes float32 (numpy 2 with 32-bit types)
    check(fi(i, 0.5), i.astype(np.float32) * np.float32(0.5))


def test_int_scalars_do_not_retrace_either():
    f = fusec.gpu_jit(lambda x, n: x + n)
    x = np.arange(5, dtype=np.int32)
    np.testing.assert_array_equal(np.asarray(f(x, 1)), x + 1)
    with Delta() as d:
        np.testing.assert_array_equal(np.asarray(f(x, 100)), x + 100)
    assert d.traces == 0


def test_only_scalars():
    f = fusec.gpu_jit(lambda a, b: a * b + 1.0)
    out = f(2.0, 4.0)
    assert out.shape == () and out.dtype == np.float32
    assert float(np.asarray(out)) == 9.0


def test_numpy_scalar_argument():
    f = fusec.gpu_jit(lambda x, s: x * s)
    x = rand(4)
    check(f(x, np.float32(1.5)), x * np.float32(1.5))


# --- pytrees --------------------------------------------------------------------------------------


def test_pytrees_in_and_out():
    def f(params, batch):
        w, (b, scale) = params["w"], params["rest"]
        h = batch["x"] @ w + b
        return {"h": h * scale, "extra": [h.sum(axis=0), None, (batch["x"] * 2.0,)]}

    params = {"w": rand(4, 3), "rest": (rand(3), 0.5)}
    batch = {"x": rand(5, 4)}
    out = fusec.gpu_jit(f)(params, batch)
    assert set(out) == {"h", "extra"}
    assert isinstance(out["extra"], list) and len(out["extra"]) == 3
    assert out["extra"][1] is None
    assert isinstance(out["extra"][2], tuple) and len(out["extra"][2]) == 1
    h = batch["x"] @ params["w"] + params["rest"][0]
    check(out["h"], h * np.float32(0.5))
    check(out["extra"][0], h.sum(axis=0), rtol=1e-4)
    check(out["extra"][2][0], batch["x"] * 2)


def test_list_and_tuple_outputs_keep_their_type():
    f = fusec.gpu_jit(lambda xs: [xs[0] + xs[1], (xs[1],)])
    a, b = rand(3), rand(3)
    out = f([a, b])
    assert isinstance(out, list) and isinstance(out[1], tuple)
    check(out[0], a + b)
    check(out[1][0], b)


def test_none_leaves_in_arguments():
    f = fusec.gpu_jit(lambda x, bias: x * 2.0 if bias is None else x * 2.0 + bias)
    x = rand(4)
    check(f(x, None), x * 2)
    check(f(x, x), x * 3)


def test_pytree_structure_is_part_of_the_signature():
    f = fusec.gpu_jit(lambda d: d["a"] + d.get("b", 0.0))
    x = rand(3)
    check(f({"a": x}), x)
    check(f({"a": x, "b": x}), x + x)


def test_device_array_pytrees_take_the_quick_signature():
    # dicts, lists and tuples of device Arrays skip the full signature on cached calls: the
    # results, the cache hits and the retraces must be those of the full path
    f = fusec.gpu_jit(lambda p, xs: p["w"] @ xs[0] + p["b"] * xs[1][0])
    w, b, x, y = rand(3, 4), rand(3), rand(4), rand(3)
    p = {"w": fusec.device_put(w), "b": fusec.device_put(b)}
    xs = [fusec.device_put(x), (fusec.device_put(y),)]
    want = w @ x + b * y
    check(f(p, xs), want, rtol=1e-4)
    with Delta() as d:
        check(f(p, xs), want, rtol=1e-4)
        # the same keys inserted in another order: the same leaves, the same executable
        check(f({"b": p["b"], "w": p["w"]}, xs), want, rtol=1e-4)
    assert d.traces == 0 and d.hits == 2
    assert [k[0] for k in f._fast] == ["tree"]  # (cached under the quick key)
    with Delta() as d:
        check(f(p, (xs[0], xs[1])), want, rtol=1e-4)  # a tuple, not a list: a new signature
        w2, x2 = rand(3, 5), rand(5)
        p2 = {"w": fusec.device_put(w2), "b": p["b"]}  # another shape
        check(f(p2, [fusec.device_put(x2), xs[1]]), w2 @ x2 + b * y, rtol=1e-4)
        # one more key: another structure
        check(f({**p, "unused": p["b"]}, xs), want, rtol=1e-4)
        # a numpy leaf: the same signature as device Arrays, uploaded by the call
        check(f({"w": w, "b": p["b"]}, xs), want, rtol=1e-4)
    assert d.traces == 3 and d.hits == 1
    # numpy leaves and numpy scalars take the quick key too, and each call uses its own values
    g = fusec.gpu_jit(lambda p, s: p["w"] @ p["x"] * s)
    with Delta() as d:
        for i in range(3):
            xi = rand(4)
            check(g({"w": p["w"], "x": xi}, np.float32(i + 0.5)), (w @ xi) * (i + 0.5),
                  rtol=1e-4)
    assert d.traces == 1 and d.hits == 2
    assert [k[0] for k in g._fast] == ["tree"]
    # float64 data takes the full path, which narrows it to float32: the same signature
    with Delta() as d, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the narrowing's warning, shown once per process)
        check(g({"w": p["w"], "x": x.astype(np.float64)}, np.float32(2)), (w @ x) * 2, rtol=1e-4)
    assert d.traces == 0


class _Scaled:
    """A registered pytree node for the quick-signature test: a matrix and a static factor."""

    def __init__(self, m: Any, factor: float) -> None:
        self.m, self.factor = m, factor


fusec.tree_util.register_pytree_node(_Scaled, lambda s: ((s.m,), s.factor),
                                     lambda factor, kids: _Scaled(kids[0], factor))


def test_quick_signature_with_registered_nodes_and_static_keywords() -> None:
    # a model's step: registered nodes (quantized weights), numpy inputs made per call, static
    # settings by keyword; the aux data and the static values are part of the key
    f = fusec.gpu_jit(lambda p, x, n: p.m @ x * p.factor + n, static_argnames=("n",))
    w, x = rand(3, 4), rand(4)
    p = _Scaled(fusec.device_put(w), 2.0)
    check(f(p, x, n=1.0), w @ x * 2 + 1, rtol=1e-4)
    with Delta() as d:
        for i in range(3):
            xi = rand(4)
            check(f(p, xi, n=1.0), w @ xi * 2 + 1, rtol=1e-4)
    assert d.traces == 0 and d.hits == 3
    assert len(f._fast) == 1 and next(iter(f._fast))[0] == "tree"
    with Delta() as d:
        check(f(_Scaled(p.m, 3.0), x, n=1.0), w @ x * 3 + 1, rtol=1e-4)  # other aux data
        check(f(p, x, n=5.0), w @ x * 2 + 5, rtol=1e-4)  # another static value
        check(f(p, x, 1.0), w @ x * 2 + 1, rtol=1e-4)  # static by position: the full path
    assert d.traces == 2


def test_function_returning_none_and_empty_tuple():
    out = fusec.gpu_jit(lambda x: (x + 1.0, None, ()))(rand(2))
    assert out[1] is None and out[2] == ()


# --- kwargs and defaults --------------------------------------------------------------------------


def test_kwargs_and_default_args():
    def f(x, y=None, scale=2.0):
        return x * scale if y is None else x * scale + y

    g = fusec.gpu_jit(f)
    x, y = rand(6), rand(6)
    check(g(x), x * 2)
    check(g(x, y=y), x * 2 + y)
    check(g(x, scale=3.0), x * 3)
    check(g(x, y, 4.0), x * 4 + y)
    check(g(y=y, x=x), x * 2 + y)


def test_keyword_and_positional_calls_share_the_executable():
    g = fusec.gpu_jit(lambda x, y: x - y)
    x, y = rand(6), rand(6)
    g(x, y)
    with Delta() as d:
        check(g(y=y, x=x), x - y)
    assert d.traces == 0 and d.hits == 1


def test_unpassed_default_args_keep_their_python_values():
    # As in JAX: a default the caller does not pass is not an argument to trace. nn.softmax has
    # axis=-1; jitting it directly must work.
    x = rand(3, 8)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    check(fusec.gpu_jit(nn.softmax)(x), e / e.sum(axis=-1, keepdims=True))


def test_wrong_call_arguments_raise_type_error():
    g = fusec.gpu_jit(lambda x, y: x + y)
    with pytest.raises(TypeError):
        g(rand(2))


# --- static arguments -----------------------------------------------------------------------------


def test_static_argnames_axis():
    f = fusec.gpu_jit(lambda x, axis: fnp.max(x, axis=axis), static_argnames=("axis",))
    x = rand(3, 4, 5)
    check(f(x, axis=0), x.max(axis=0))
    check(f(x, axis=(1, 2)), x.max(axis=(1, 2)))
    check(f(x, axis=-1), x.max(axis=-1))


def test_static_argnums():
    def f(x, n, mode):
        y = x
        for _ in range(n):  # Python control flow on static values is fine
            y = y * 2.0
        return y + 1.0 if mode == "plus" else y - 1.0

    g = fusec.gpu_jit(f, static_argnums=(1, 2))
    x = rand(5)
    check(g(x, 3, "plus"), x * 8 + 1)
    check(g(x, 2, "minus"), x * 4 - 1)
    with Delta() as d:
        check(g(x, 3, "plus"), x * 8 + 1)
    assert d.traces == 0


def test_static_argnames_given_as_a_string_and_argnums_as_an_int():
    f = fusec.gpu_jit(lambda x, k: x * k, static_argnames="k")
    check(f(np.ones(3, np.float32), k=4), np.full(3, 4, np.float32))
    g = fusec.gpu_jit(lambda x, k: x * k, static_argnums=1)
    check(g(np.ones(3, np.float32), 5), np.full(3, 5, np.float32))


def test_unhashable_static_argument_names_the_argument():
    f = fusec.gpu_jit(lambda x, axes: x.sum(axis=axes), static_argnames=("axes",))
    with pytest.raises(fusec.StaticArgumentError, match="'axes'") as info:
        f(rand(3, 4), [0, 1])
    assert "hashable" in str(info.value)
    check(f(np.ones((3, 4), np.float32), (1,)), np.full(3, 4, np.float32))


def test_static_argnames_that_do_not_exist_raise_at_decoration():
    with pytest.raises(fusec.StaticArgumentError, match="'nope'"):
        fusec.gpu_jit(lambda x: x, static_argnames=("nope",))
    with pytest.raises(fusec.StaticArgumentError, match="static_argnums"):
        fusec.gpu_jit(lambda x: x, static_argnums=(3,))

    with pytest.raises(fusec.StaticArgumentError):
        @fusec.gpu_jit(static_argnames=("axis",))
        def f(x, axes):
            return x


# --- nested jit, closures, constants --------------------------------------------------------------


def test_nested_jit_inlines():
    inner = fusec.gpu_jit(lambda a: fnp.exp(a) * 2.0)
    outer = fusec.gpu_jit(lambda a: inner(a) + 1.0)
    x = rand(4, 4)
    lowered = outer.lower(x)
    assert len(lowered.kernels) == 1  # one fused kernel: the inner function was inlined
    with Delta() as d:
        out = outer(x)
    assert d.traces == 1  # the outer function only
    check(out, np.exp(x) * 2 + 1)
    assert inner._cache == {}  # inner was never compiled on its own


def test_closures_capture_numpy_arrays_as_constants():
    w = rand(4, 3)
    b = np.arange(3, dtype=np.float32)
    f = fusec.gpu_jit(lambda x: x @ w + b + w.sum())
    x = rand(5, 4)
    check(f(x), x @ w + b + w.sum(), rtol=1e-4)
    with Delta() as d:
        check(f(x * 2), (x * 2) @ w + b + w.sum(), rtol=1e-4)
    assert d.traces == 0


def test_captured_constants_are_uploaded_once(uploads):
    table = rand(64)
    f = fusec.gpu_jit(lambda x: x * table)
    x = rand(64)
    f(x)
    first = len(uploads)
    f(x)
    assert len(uploads) - first == 1  # only x: the constant stays on the device


def test_captured_constants_with_device_arguments_and_an_unused_one(uploads):
    # the cached call's lean path with constants (a model's captured tables): Array arguments,
    # one of them unused, then host arguments; the constant uploaded once, results exact
    table = rand(3, 64)
    f = fusec.gpu_jit(lambda p, x: x * table[1] + p["b"])
    host = {"b": rand(64), "unused": rand(5)}
    params = {k: fusec.device_put(v) for k, v in host.items()}
    for i in range(3):
        x = rand(64) + i
        xd = fusec.device_put(x)
        before = len(uploads)
        check(f(params, xd), x * table[1] + host["b"])
        assert len(uploads) - before == (1 if i == 0 else 0)  # the constant, on the first call
    check(f(host, x), x * table[1] + host["b"])
    # an unused argument is passed over: one used up by a donation elsewhere, or host data
    # (not uploaded), does not matter
    gone = fusec.device_put(rand(5))
    fusec.gpu_jit(lambda a: a * 2.0, donate_argnums=(0,))(gone)
    check(f({"b": params["b"], "unused": gone}, xd), x * table[1] + host["b"])
    before = len(uploads)
    check(f({"b": params["b"], "unused": rand(5)}, xd), x * table[1] + host["b"])
    assert len(uploads) == before


def test_fusec_numpy_outside_jit_runs_eagerly():
    x = rand(5)
    check(fnp.exp(x), np.exp(x))
    check(fnp.add(fusec.device_put(x), 1.0), x + 1)


# --- device-resident arrays -----------------------------------------------------------------------


def test_device_put_arrays_are_not_re_uploaded(uploads):
    x = rand(32, 8)
    d = fusec.device_put(x)
    assert isinstance(d, fusec.Array) and d.shape == (32, 8) and d.dtype == np.float32
    assert len(uploads) == 1
    f = fusec.gpu_jit(lambda a, b: a * b + a)
    for _ in range(3):
        check(f(d, d), x * x + x)
    assert len(uploads) == 1  # no upload in any call
    y = rand(32, 8)
    check(f(d, y), x * y + x)
    assert len(uploads) == 2  # only the numpy argument


def test_outputs_feed_back_without_copies(uploads):
    f = fusec.gpu_jit(lambda a: a * 2.0)
    out = f(fusec.device_put(np.ones(10, np.float32)))
    for _ in range(3):
        out = f(out)
    assert len(uploads) == 1
    check(out, np.full(10, 16.0, np.float32))


def test_output_arrays():
    x = rand(3, 4)
    out = fusec.gpu_jit(lambda a: a * 3.0)(x)
    assert isinstance(out, fusec.Array)
    assert out.shape == (3, 4) and out.dtype == np.float32
    assert out.block_until_ready() is out
    np.testing.assert_allclose(out.numpy(), x * 3, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out), x * 3, rtol=1e-6)
    n = out.numpy()
    n[0, 0] = 123.0  # numpy() is a copy: the array is unchanged
    assert np.asarray(out)[0, 0] != 123.0


def test_returning_an_input_unchanged():
    x = rand(5)
    out = fusec.gpu_jit(lambda a, b: (a, b * 2.0))(x, x)
    check(out[0], x)
    check(out[1], x * 2)
    d = fusec.device_put(x)
    same = fusec.gpu_jit(lambda a: a)(d)
    check(same, x)


def test_the_same_value_returned_twice_and_aliases_of_inputs():
    def f(a):
        y = a * 2.0
        return y, y, a.reshape(3, 2), a

    x = rand(2, 3)
    y1, y2, r, same = fusec.gpu_jit(f)(x)
    check(y1, x * 2)
    check(y2, x * 2)
    check(r, x.reshape(3, 2))
    check(same, x)


def test_non_contiguous_numpy_arguments():
    x = rand(4, 6)
    f = fusec.gpu_jit(lambda a: a + 1.0)
    check(f(x.T), x.T + 1)
    check(f(x[:, ::2]), x[:, ::2] + 1)
    check(f(np.asfortranarray(x)), x + 1)


def test_bool_arguments():
    f = fusec.gpu_jit(lambda a, m, flag: fnp.where(fnp.multiply(m, flag), a, 0.0))
    x = rand(5)
    m = np.array([True, False, True, True, False])
    check(f(x, m, True), np.where(m, x, 0).astype(np.float32))
    check(f(x, m, False), np.zeros(5, np.float32))


def test_returning_python_constants():
    f = fusec.gpu_jit(lambda a: (3.0, 2, True, a + 1.0))
    c_float, c_int, c_bool, y = f(rand(2))
    for c in (c_float, c_int, c_bool):
        assert isinstance(c, fusec.Array) and c.shape == ()
    assert np.asarray(c_float) == 3.0 and np.asarray(c_float).dtype == np.float32
    assert np.asarray(c_int) == 2 and np.asarray(c_int).dtype == np.int32
    assert bool(np.asarray(c_bool)) is True
    assert y.shape == (2,)


def test_zero_size_arrays():
    z = np.zeros((0, 3), np.float32)
    out = fusec.gpu_jit(lambda a: a * 2.0 + 1.0)(z)
    assert out.shape == (0, 3) and np.asarray(out).shape == (0, 3)
    s = fusec.gpu_jit(lambda a: a.sum(axis=0))(z)
    check(s, np.zeros(3, np.float32))
    m = fusec.gpu_jit(lambda a: a.max(axis=1))(z)  # reducing the non-empty axis
    assert np.asarray(m).shape == (0,)
    mm = fusec.gpu_jit(lambda a, b: a @ b)(z, rand(3, 4))
    assert np.asarray(mm).shape == (0, 4)


# --- AOT: lower, compile, warmup ------------------------------------------------------------------


def test_compiled_runs_its_signature_and_rejects_others():
    f = fusec.gpu_jit(lambda x, scale: x * scale)
    x = rand(2, 3)
    compiled = f.lower(x, np.float32(2.0)).compile()
    assert isinstance(compiled, fusec.Compiled)
    check(compiled(x, np.float32(2.0)), x * 2)
    with pytest.raises(fusec.SignatureError, match="'x'") as info:
        compiled(rand(2, 4), np.float32(2.0))
    assert "(2, 3)" in str(info.value) or "[2,3]" in str(info.value)
    with pytest.raises(fusec.SignatureError, match="'x'"):
        compiled(np.ones((2, 3), np.int32), np.float32(2.0))
    with pytest.raises(fusec.SignatureError):
        compiled((x,), np.float32(2.0))


def test_compiled_from_shapedtype():
    f = fusec.gpu_jit(lambda a, b: a - b)
    compiled = f.lower(S((4,)), S((4,))).compile()
    a, b = rand(4), rand(4)
    with Delta() as d:
        check(compiled(a, b), a - b)
    assert d.traces == 0 and d.pipelines_compiled == 0


@requires_gpu
def test_warmup_then_first_call_compiles_nothing():
    f = fusec.gpu_jit(lambda x, b: fnp.sin(x) * 4.0 + b)
    with Delta() as w:
        compiled = f.warmup(S((29, 3)), S((3,)))
    assert w.traces == 1 and w.pipelines_compiled == 1
    assert isinstance(compiled, fusec.Compiled)
    x, b = rand(29, 3), rand(3)
    with Delta() as d:
        out = f(x, b)
    assert d.traces == 0 and d.lowerings == 0 and d.pipelines_compiled == 0 and d.hits == 1
    check(out, np.sin(x) * 4 + b)


def test_warmup_with_device_arrays_and_scalars():
    f = fusec.gpu_jit(lambda x, w, s: (x @ w) * s)
    w = fusec.device_put(rand(6, 2))
    f.warmup(S((5, 6)), w, 1.0)
    x = rand(5, 6)
    with Delta() as d:
        out = f(x, w, 3.0)
    assert d.traces == 0 and d.pipelines_compiled == 0
    check(out, (x @ np.asarray(w)) * 3, rtol=1e-4)


def test_trace_and_lower_do_not_compile_or_run():
    f = fusec.gpu_jit(lambda x: fnp.cos(x) + 7.0)
    with Delta() as d:
        traced = f.trace(S((11,)))
        lowered = f.lower(S((11,)))
    assert d.pipelines_compiled == 0 and d.hits == 0 and d.misses == 0
    assert traced.ir is traced.program
    assert lowered.kernels and lowered.ir is not None
    cost = lowered.cost_analysis()
    assert cost["kernels"] == 1 and cost["bytes accessed"] == 11 * 4 * 2 and cost["flops"] > 0


def test_clear_cache_forgets_compiled_signatures():
    f = fusec.gpu_jit(lambda x: x - 3.0)
    x = rand(3)
    f(x)
    fusec.clear_cache()
    with Delta() as d:
        check(f(x), x - 3)
    assert d.traces == 1 and d.misses == 1


def test_device_put_keeps_zero_dim_shape():
    a = fusec.device_put(np.float32(2.5))
    assert a.shape == ()
    f = fusec.gpu_jit(lambda x: -x)
    out = f(a)
    assert out.shape == () and np.asarray(out).shape == ()
    assert float(np.asarray(out)) == -2.5


def test_donating_an_array_that_shares_its_buffer_leaves_the_other_intact() -> None:
    # an output returned twice (cse merges the equal zeros) and an eager reshape both give two
    # Arrays over one buffer: donating one must not overwrite the other
    @fusec.gpu_jit
    def two(x):  # type: ignore[no-untyped-def]
        return fnp.zeros_like(x), fnp.zeros_like(x)

    @fusec.gpu_jit(donate_argnums=(0,))
    def inc(a):  # type: ignore[no-untyped-def]
        return a + 1.0

    a, b = two(np.ones(5, np.float32))
    a2 = inc(a)
    np.testing.assert_array_equal(np.asarray(b), np.zeros(5))
    np.testing.assert_array_equal(np.asarray(a2), np.ones(5))
    assert a.is_deleted and not b.is_deleted
    x = fusec.device_put(np.arange(6, dtype=np.float32))
    y = x.reshape(2, 3)
    z = inc(x)
    np.testing.assert_array_equal(np.asarray(y), np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(np.asarray(z), np.arange(6) + 1)


def test_the_pool_never_hands_out_a_released_buffer() -> None:
    # the garbage collector may pool a DeviceBuffer's wgpu buffer and then release that buffer
    # (finalisers of a reference cycle run in any order): the pool must skip it
    from fusec.runtime import get_runtime

    rt = get_runtime()
    assert rt is not None
    size = rt._size_class(3 * 1024 * 1024 + 1)
    dead = rt.device.create_buffer(size=size, usage=rt.wgpu.BufferUsage.STORAGE
                                   | rt.wgpu.BufferUsage.COPY_SRC | rt.wgpu.BufferUsage.COPY_DST)
    rt._free.setdefault(size, []).append(dead)
    rt._free_bytes += size
    dead._release()
    got = rt.buffer_of_class(size)
    assert got.raw is not dead and got.raw._internal is not None
    x = np.arange(size // 4, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(fusec.gpu_jit(lambda a: a + 1)(x)), x + 1)


def test_a_donated_array_passed_twice_is_refused_and_others_are_used_up() -> None:
    """The same device array as a donated argument and as another argument is a clear error
    naming the argument; among many leaves, each donated array that is not returned is used up
    and the others stay readable."""
    f = fusec.gpu_jit(lambda a, b: a * 2.0 + b, donate_argnums=(0,))
    x = fusec.device_put(np.arange(5, dtype=np.float32))
    with pytest.raises(fusec.FusecError, match="argument 'a' is donated but the same array"):
        f(x, x)
    g = fusec.gpu_jit(lambda cache, w: ([c + w for c in cache], w.sum()),
                      donate_argnames=("cache",))
    cache = [fusec.device_put(np.full(3, i, np.float32)) for i in range(6)]
    w = fusec.device_put(np.array([1.0, 2.0, 3.0], np.float32))
    twice = fusec.device_put(np.ones(3, np.float32))
    with pytest.raises(fusec.FusecError, match=r"argument 'cache\[0\]' is donated but the same"):
        g([twice, cache[1], twice], w)  # one array at two donated places
    np.testing.assert_array_equal(np.asarray(twice), [1.0, 1.0, 1.0])  # refused: not used up
    new, s = g(cache, w)
    np.testing.assert_array_equal(np.asarray(new[5]), [6.0, 7.0, 8.0])
    assert float(np.asarray(s)) == 6.0
    np.testing.assert_array_equal(np.asarray(w), [1.0, 2.0, 3.0])
    with pytest.raises(fusec.FusecError, match="donated"):
        np.asarray(cache[0])


def test_a_full_pool_destroys_its_oldest_buffers_not_the_newest() -> None:
    """Buffers released to a full pool push out the longest-pooled ones: a workload that keeps
    taking and releasing buffers of its own sizes finds them pooled, however many buffers of
    earlier work filled the pool (else each call would create and destroy its buffers, and every
    destroy drops the executables' cached bind groups; bench/pool_churn.py)."""
    from fusec.runtime import get_runtime

    rt = get_runtime()
    assert rt is not None
    rt.flush()
    saved = rt.pool_limit
    size = rt._size_class(1 << 20)
    try:
        bufs = [rt.buffer_of_class(size) for _ in range(5)]
        raws = [b.raw for b in bufs]
        rt.pool_limit = 3 * size  # room for three: buffers pooled before these go first
        while bufs:  # released in order: the first two go once the pool is full
            bufs.pop(0)
            gc.collect()
        pooled = rt._free.get(size, [])
        assert all(any(p is r for p in pooled) for r in raws[2:])
        assert not any(p is r for p in pooled for r in raws[:2])
        # a new workload's first call finds the pool full of other sizes; its later calls
        # reuse its buffers and destroy nothing
        f = fusec.gpu_jit(lambda a: a * 2.0)
        x = fusec.device_put(np.arange(size // 2, dtype=np.float32))  # twice the size
        rt.flush()
        rt.pool_limit = rt._free_bytes
        np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(x) * 2.0)
        rt.flush()
        before = rt.destroyed
        for _ in range(4):
            np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(x) * 2.0)
        rt.flush()
        assert rt.destroyed == before
    finally:
        rt.pool_limit = saved


def test_the_quick_signature_takes_the_leaves_in_pytree_order():
    # jit._quick_leaves (the cached call's signature without paths) against the full flatten:
    # the same leaves in the same order through nested dicts, lists, tuples and registered nodes;
    # keys that tell shapes, dtypes, structure and host data apart; None for what it leaves to
    # the full path
    from fusec import quant
    from fusec.jit import _quick_leaves
    from fusec.tree import flatten_with_paths

    rng = np.random.default_rng(3)
    dev = [fusec.device_put(rand(3, 4)), fusec.device_put(rand(5)), fusec.device_put(rand(2))]
    q = quant.QuantizedMatrix("q8_0", (2, 32), fusec.device_put(
        rng.integers(0, 2**32, (2, 9), dtype=np.uint32)))
    tree = {"b": [dev[0], (dev[1], {"z": q, "a": dev[2]})], "a": dev[2]}
    args = (tree, [dev[1]], dev[0])
    got = _quick_leaves(args, {})
    assert got is not None
    leaves, key, all_arrays = got
    want = [x for i, a in enumerate(args) for _, x in flatten_with_paths(a, f"a{i}")[0]]
    assert len(leaves) == len(want) == 7 and all(x is y for x, y in zip(leaves, want))
    assert all_arrays
    assert _quick_leaves(args, {})[1] == key  # the same key for the same structure

    def key_of(*a: Any) -> Any:
        out = _quick_leaves(a, {})
        assert out is not None
        return out[1]

    assert key_of([dev[0], dev[1]]) != key_of((dev[0], dev[1]))  # list against tuple
    assert key_of({"x": dev[0]}) != key_of({"y": dev[0]})
    assert key_of(dev[1]) != key_of(dev[2])  # shapes
    assert key_of(fusec.device_put(rand(5).astype(np.int32))) != key_of(dev[1])  # dtypes
    # host data: numpy arrays and scalars are leaves (not all Arrays), of their own keys
    host = _quick_leaves(({"w": rand(5)}, np.int32(3)), {})
    assert host is not None and not host[2] and len(host[0]) == 2
    assert host[1] != key_of({"w": dev[1]}, np.int32(3))
    # left to the full path: Python scalars, None, strings, unsupported dtypes
    for odd in (1.5, None, "s", rand(2).astype(np.complex64)):
        assert _quick_leaves(([dev[0], odd],), {}) is None


def _no_cycles_cases() -> dict[str, Any]:
    rng = np.random.default_rng(11)
    a = fusec.device_put(rng.standard_normal((5, 3)).astype(np.float32))
    b = fusec.device_put(rng.standard_normal((3,)).astype(np.float32))
    f1 = fusec.gpu_jit(lambda p, x: (p["w"] * x[0] + p["b"]).sum())
    f2 = fusec.gpu_jit(lambda x, s: x * s)
    f3 = fusec.gpu_jit(lambda x, n: x * n, static_argnums=(1,))
    f5 = fusec.gpu_jit(lambda x, y=None: x if y is None else x + y)
    f4 = fusec.gpu_jit(lambda x, y: (x + 1, y * 2), donate_argnums=(0,))
    state = {"x": fusec.device_put(np.ones((5, 3), np.float32))}

    def donated() -> Any:
        state["x"], out = f4(state["x"], a)
        return out

    return {"Arrays in a dict and a list": lambda: f1({"w": a, "b": b}, [b]),
            "a Python scalar": lambda: f2(a, 2.0),
            "a numpy scalar": lambda: f2(a, np.float32(3.0)),
            "a static argument": lambda: f3(a, 3),
            "None": lambda: f5(a, None),
            "a donated argument": donated}


@pytest.mark.parametrize("case", list(_no_cycles_cases()))
def test_a_cached_call_leaves_no_reference_cycles(case: str) -> None:
    """A cached call creates no reference cycles: its arguments' Arrays are freed, and their
    buffers pooled, as soon as the caller drops them, not at the garbage collector's next pass.
    (The quick signature's two nested walkers referred to each other through their closures: a
    cycle per call holding every leaf, so a decode loop's token buffer never came back to the
    pool in time, and each step made a new buffer and a new bind group.)"""
    call = _no_cycles_cases()[case]

    def ready(out: Any) -> None:
        for leaf in fusec.tree_util.tree_leaves(out):
            leaf.block_until_ready()

    for _ in range(3):
        ready(call())
    gc.collect()
    gc.disable()
    try:
        for _ in range(5):
            ready(call())
        found = gc.collect()
    finally:
        gc.enable()
    assert found == 0, f"{found} objects in reference cycles after 5 calls"


def test_a_loop_feeding_its_output_back_reuses_its_buffers() -> None:
    """A step that takes the previous step's output (a decode loop's token) gets its output
    buffer back from the pool each time, with the gc disabled: no new buffer after warm-up."""
    from fusec.runtime import get_runtime

    rt = get_runtime()
    assert rt is not None
    step = fusec.gpu_jit(lambda s, x: {"t": s["t"] * 0.5 + x})
    x = fusec.device_put(np.arange(7, dtype=np.float32))
    s = {"t": fusec.device_put(np.ones(7, np.float32))}
    for _ in range(3):
        s = step(s, x)
    np.asarray(s["t"])
    made = []
    orig = rt._buffer_of_class

    def counting(size: int) -> Any:
        had = len(rt._free.get(size, []))
        made.append(had == 0)
        return orig(size)

    gc.disable()
    try:
        rt._buffer_of_class = counting  # type: ignore[method-assign]
        for _ in range(10):
            s = step(s, x)
            np.asarray(s["t"])
    finally:
        rt._buffer_of_class = orig  # type: ignore[method-assign]
        gc.enable()
    assert made and not any(made), f"{sum(made)} of {len(made)} buffers created anew"
    np.testing.assert_allclose(np.asarray(s["t"]),
                               0.5 ** 13 + np.arange(7) * (1 - 0.5 ** 13) / 0.5, rtol=1e-5)
