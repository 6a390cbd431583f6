"""fusec.lax control flow (fori_loop, while_loop, scan, cond, switch) against Python/numpy loops,
on the wgpu adapter (lavapipe here): results, the IR's shape (one loop equation whatever the trip
count, in-place carries), nesting, closures, the data-dependent stop, and the errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import Delta, requires_wgpu

import fusec
import fusec.numpy as fnp
from fusec import lax
from fusec.control_flow import UNROLL_MAX
from fusec.ir import Op, Program
from fusec.jit import interpret_traced

F32 = np.float32


def _loops(prog: Program) -> list:
    return [e for e in prog.eqns if e.op is Op.LOOP]


def _close(got: object, want: np.ndarray, rtol: float = 2e-5, atol: float = 1e-5) -> None:
    np.testing.assert_allclose(np.asarray(got), want, rtol=rtol, atol=atol)


# --- fori_loop ------------------------------------------------------------------------------------


@pytest.mark.parametrize("trips", [0, 1, 3, 5, 37])
@pytest.mark.parametrize("n", [1, 13])
def test_fori_loop_matches_python(rng: np.random.Generator, trips: int, n: int) -> None:
    x = rng.standard_normal(n).astype(F32)
    w = rng.standard_normal(n).astype(F32) * F32(0.3)

    @fusec.gpu_jit
    def f(x, w):
        return lax.fori_loop(2, 2 + trips, lambda i, c: fnp.tanh(c * w + i * 0.01), x)

    want = x.astype(np.float64)
    for i in range(2, 2 + trips):
        want = np.tanh(want * w + i * 0.01)
    _close(f(x, w), want)
    traced = f.trace(x, w).ir
    # up to UNROLL_MAX iterations are unrolled, more are one loop equation
    assert len(_loops(traced)) == (1 if trips > UNROLL_MAX else 0)


def test_fori_loop_pytree_carry_int_and_float(rng: np.random.Generator) -> None:
    a = rng.integers(-1000, 1000, size=7).astype(np.int32)
    b = rng.standard_normal((3, 5)).astype(F32)
    flags = rng.random(7) < 0.5

    @fusec.gpu_jit
    def f(a, b, flags):
        def body(i, c):
            return {"a": c["a"] * 3 + i, "pair": (c["pair"][0] * 0.5 + 1.0,
                                                  fnp.logical_not(c["pair"][1]))}
        return lax.fori_loop(0, 11, body, {"a": a, "pair": (b, flags)})

    out = f(a, b, flags)
    wa, wb, wf = a.astype(np.int64), b.astype(np.float64), flags.copy()
    for i in range(11):
        wa = (wa * 3 + i + 2**31) % 2**32 - 2**31  # int32 wraps around
        wb = wb * 0.5 + 1.0
        wf = ~wf
    np.testing.assert_array_equal(np.asarray(out["a"]), wa.astype(np.int32))
    _close(out["pair"][0], wb)
    np.testing.assert_array_equal(np.asarray(out["pair"][1]), wf)


def test_long_loop_ir_does_not_grow_and_compiles_fast() -> None:
    x = np.linspace(-1, 1, 31).astype(F32)

    def make(trips: int) -> fusec.JitFunction:
        return fusec.gpu_jit(lambda x: lax.fori_loop(0, trips, lambda i, c: c * 0.999 + 1e-3, x))

    short, long = make(10), make(1000)
    t0 = time.perf_counter()
    low_long = long.lower(x)
    elapsed = time.perf_counter() - t0
    low_short = short.lower(x)
    assert elapsed < 2.0
    assert str(low_long.ir).replace("trips=1000", "trips=10") == str(low_short.ir)
    assert len(low_long.kernels) == len(low_short.kernels)
    want = x.astype(np.float64)
    for _ in range(1000):
        want = want * 0.999 + 1e-3
    _close(long(x), want, rtol=1e-4)


def test_fori_loop_unroll_argument(rng: np.random.Generator) -> None:
    x = rng.standard_normal(4).astype(F32)
    f = fusec.gpu_jit(lambda x: lax.fori_loop(0, 11, lambda i, c: c * 0.9 + i, x, unroll=3))
    want = x.astype(np.float64)
    for i in range(11):
        want = want * 0.9 + i
    _close(f(x), want, rtol=1e-5)
    (loop,) = _loops(f.trace(x).ir)
    assert loop.params["trips"] == 3  # 3 steps per iteration, 2 left over after the loop


def test_scatter_carry_is_updated_in_place(rng: np.random.Generator) -> None:
    v = rng.standard_normal(3).astype(F32)

    @fusec.gpu_jit
    def fill(v):
        buf = fnp.zeros((50, 3))
        return lax.fori_loop(0, 50, lambda i, b: b.at[i].set(v * i), buf)

    want = np.arange(50)[:, None] * v.astype(np.float64)
    _close(fill(v), want)
    (loop,) = _loops(fill.lower(v).ir)
    assert loop.params["inplace"] == ((1, 1),)
    assert loop.params["slots"][1] == "=1"  # the result is the (copied) initial buffer
    # the body's scatter writes into its carry's buffer; no kernel copies the whole buffer
    body = loop.params["body"]
    assert [k.params["kind"] for k in body.eqns if k.op is Op.KERNEL].count("scatter") == 1
    assert not any(k.params["kind"] == "elementwise" and k.outs[0].shape == (50, 3)
                   for k in body.eqns if k.op is Op.KERNEL)


def test_fori_loop_with_traced_bounds(rng: np.random.Generator) -> None:
    x = rng.standard_normal(5).astype(F32)
    f = fusec.gpu_jit(lambda lo, hi, x: lax.fori_loop(lo, hi, lambda i, c: c + i, x))
    for lo, hi in ((3, 9), (4, 4), (7, 2)):
        _close(f(np.int32(lo), np.int32(hi), x), x + sum(range(lo, hi)))


def test_carries_swapped_unchanged_and_literal() -> None:
    """Results that are another carry's input, the carry itself, or a literal get buffers of
    their own (passes/loops.py)."""
    a = np.arange(4, dtype=F32)
    b = -np.arange(4, dtype=F32)

    @fusec.gpu_jit
    def f(a, b):
        return lax.fori_loop(0, 7, lambda i, c: (c[1], c[0], c[2], 5.0, c[4] + 1.0),
                             (a, b, a, 0.0, a))

    out = f(a, b)
    _close(out[0], b)  # 7 swaps
    _close(out[1], a)
    _close(out[2], a)
    _close(out[3], np.float32(5.0))
    _close(out[4], a + 7)


def test_two_in_place_loops_on_one_initial_value() -> None:
    @fusec.gpu_jit
    def f(x):
        buf = fnp.zeros((9,), "int32")
        p = lax.fori_loop(0, 9, lambda i, b: b.at[i].set(i), buf)
        q = lax.fori_loop(0, 9, lambda i, b: b.at[i].add(x), buf)
        return p, q, buf

    p, q, buf = f(np.int32(4))
    np.testing.assert_array_equal(np.asarray(p), np.arange(9))
    np.testing.assert_array_equal(np.asarray(q), np.full(9, 4))
    np.testing.assert_array_equal(np.asarray(buf), np.zeros(9))


# --- scan -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [3, 17])
@pytest.mark.parametrize("reverse", [False, True])
def test_scan_matches_python(rng: np.random.Generator, length: int, reverse: bool) -> None:
    xs = {"a": rng.standard_normal((length, 5)).astype(F32),
          "b": rng.integers(0, 9, size=length).astype(np.int32)}
    c0 = (rng.standard_normal(5).astype(F32), np.int32(1))

    def f(c, x):
        h, k = c
        h = fnp.tanh(h * 0.7 + x["a"])
        k = k * 2 + x["b"]
        return (h, k), {"h": h, "s": h.sum() + k}

    g = fusec.gpu_jit(lambda c0, xs: lax.scan(f, c0, xs, reverse=reverse))
    (h, k), ys = g(c0, xs)
    wh, wk = c0[0].astype(np.float64), int(c0[1])
    yh = np.zeros((length, 5))
    ys_s = np.zeros(length)
    for t in (reversed(range(length)) if reverse else range(length)):
        wh = np.tanh(wh * 0.7 + xs["a"][t])
        wk = (wk * 2 + int(xs["b"][t]) + 2**31) % 2**32 - 2**31
        yh[t] = wh
        ys_s[t] = wh.sum() + wk
    _close(h, wh)
    assert int(np.asarray(k)) == wk
    _close(ys["h"], yh)
    _close(ys["s"], ys_s, rtol=1e-4, atol=1e-3)


def test_scan_without_xs_and_with_unroll(rng: np.random.Generator) -> None:
    c0 = rng.standard_normal(2).astype(F32)

    def f(c, x):
        assert x is None
        return c * 0.5 + 1.0, None

    g = fusec.gpu_jit(lambda c0: lax.scan(f, c0, None, length=10))
    c, ys = g(c0)
    want = c0.astype(np.float64)
    for _ in range(10):
        want = want * 0.5 + 1.0
    _close(c, want)
    assert ys is None

    xs = np.arange(10, dtype=F32)
    h = fusec.gpu_jit(lambda xs: lax.scan(lambda c, x: (c + x, c * x), 0.0, xs, unroll=4))
    c, ys = h(xs)
    carries = np.concatenate([[0.0], np.cumsum(xs)[:-1]])
    _close(c, xs.sum())
    _close(ys, carries * xs)
    (loop,) = _loops(h.trace(xs).ir)
    assert loop.params["trips"] == 2  # 2 x 4 steps in the loop, 2 unrolled after it


def test_scan_ys_are_written_in_place(rng: np.random.Generator) -> None:
    xs = rng.standard_normal((40, 6)).astype(F32)
    g = fusec.gpu_jit(lambda xs: lax.scan(lambda c, x: (c + x, c), fnp.zeros(6), xs))
    (loop,) = _loops(g.lower(xs).ir)
    assert loop.params["inplace"]  # ys: one buffer for the whole loop
    c, ys = g(xs)
    _close(ys, np.concatenate([np.zeros((1, 6)), np.cumsum(xs, 0)[:-1]]), rtol=1e-5, atol=1e-5)


def test_scan_errors() -> None:
    with pytest.raises(fusec.ShapeError, match=r"xs\[0\] has 5.*xs\[1\] has 4"):
        lax.scan(lambda c, x: (c, x), 0.0, (np.zeros(5, F32), np.zeros(4, F32)))
    with pytest.raises(fusec.ShapeError, match="length=6.*leading length 5"):
        lax.scan(lambda c, x: (c, x), 0.0, np.zeros(5, F32), length=6)
    with pytest.raises(fusec.ShapeError, match="give length"):
        lax.scan(lambda c, x: (c, x), 0.0)
    with pytest.raises(fusec.CarryError, match="pair"):
        lax.scan(lambda c, x: c, 0.0, np.zeros(5, F32))


# --- while_loop -----------------------------------------------------------------------------------


def _collatz_steps(n: int) -> int:
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def test_while_loop_data_dependent_stop() -> None:
    @fusec.gpu_jit
    def collatz(n):
        def body(s):
            k, m = s
            return k + 1, fnp.where(m % 2 == 0, m // 2, 3 * m + 1)
        return lax.while_loop(lambda s: s[1] != 1, body, (0, n))

    for n in (1, 2, 27, 97, 871):
        steps, m = collatz(np.int32(n))
        assert int(np.asarray(steps)) == _collatz_steps(n)
        assert int(np.asarray(m)) == 1
    # the host reads one flag per chunk of iterations, not one per iteration
    with Delta() as d:
        np.asarray(collatz(np.int32(871))[0])  # 178 iterations
    assert d.readbacks <= 8


def test_while_loop_vector_carry_and_zero_iterations(rng: np.random.Generator) -> None:
    x = rng.random(9).astype(F32) + F32(0.5)

    @fusec.gpu_jit
    def halve_until(x, limit):
        return lax.while_loop(lambda c: fnp.max(c) > limit, lambda c: c * 0.5, x)

    for limit in (0.01, 2.0):  # 2.0: the condition is false at once
        want = x.copy()
        while want.max() > limit:
            want = want * F32(0.5)
        _close(halve_until(x, F32(limit)), want)


def test_while_loop_inside_fori_loop() -> None:
    @fusec.gpu_jit
    def f(x):
        def outer(i, c):
            return lax.while_loop(lambda v: v < 10.0 * (i + 1), lambda v: v + 3.0, c)
        return lax.fori_loop(0, 6, outer, x)

    want = 0.0
    for i in range(6):
        while want < 10.0 * (i + 1):
            want += 3.0
    _close(f(np.float32(0.0)), np.float32(want))


def test_while_loop_inside_scan_and_cond_inside_fori() -> None:
    xs = np.array([1, 5, 3, 10, 2, 20, 7], F32)
    f = fusec.gpu_jit(lambda xs: lax.scan(
        lambda c, r: (lax.while_loop(lambda v: v < r, lambda v: v + 1.5, c), c), 0.0, xs))
    c, ys = f(xs)
    want_c, want_ys = 0.0, []
    for r in xs:
        want_ys.append(want_c)
        while want_c < r:
            want_c += 1.5
    _close(c, np.float32(want_c))
    _close(ys, np.array(want_ys))
    x = np.arange(5, dtype=F32)
    g = fusec.gpu_jit(lambda x: lax.fori_loop(
        0, 10, lambda i, c: lax.cond(i % 2 == 0, lambda a: a + 1, lambda a: a * 2, c), x))
    want = x.astype(np.float64)
    for i in range(10):
        want = want + 1 if i % 2 == 0 else want * 2
    _close(g(x), want)


def test_loops_unfused_donated_empty_and_partly_used() -> None:
    x = np.arange(5, dtype=F32)
    f = fusec.gpu_jit(lambda x: lax.scan(lambda c, r: (c + r, c * r), 0.0, x), fuse=False)
    c, ys = f(x)
    _close(c, np.float32(10))
    _close(ys, np.array([0, 0, 2, 9, 24], F32))
    d = fusec.gpu_jit(lambda x, w: lax.fori_loop(0, 9, lambda i, c: c * w, x) + x,
                      donate_argnums=(0, 1))
    xd = fusec.device_put(x)
    _close(d(xd, fusec.device_put(F32(2))), x * 513)
    assert xd.is_deleted
    e = fusec.gpu_jit(lambda e, x: lax.fori_loop(0, 9, lambda i, c: (c[0] * 2, c[1] + 1), (e, x)))
    empty, y = e(np.zeros((0, 3), F32), x)
    assert np.asarray(empty).shape == (0, 3)
    _close(y, x + 9)
    p = fusec.gpu_jit(lambda x: lax.fori_loop(0, 9, lambda i, c: (c[0] + 1, c[1] * 2), (x, x))[1])
    _close(p(x), x * 512)
    unused = fusec.gpu_jit(lambda x: (lax.fori_loop(0, 9, lambda i, c: c * 2, x), x + 1)[1])
    assert not _loops(unused.lower(x).ir)  # dead loops go


# --- nesting, closures, the interpreter -----------------------------------------------------------


def test_nested_loops_with_closures(rng: np.random.Generator) -> None:
    x = rng.standard_normal(6).astype(F32)
    w = rng.standard_normal(6).astype(F32) * F32(0.5)
    const = rng.standard_normal(6).astype(F32) * F32(0.1)  # a numpy array captured by the body

    @fusec.gpu_jit
    def f(x, w, s):
        scale = s * 2.0  # a value of the enclosing trace, used inside both bodies

        def outer(i, c):
            ys = lax.scan(lambda h, k: (h * w + k * scale, h.sum()), c, fnp.arange(5.0))[1]
            inner = lax.fori_loop(0, 7, lambda j, d: d * 0.5 + const + j, c)
            return inner + ys.mean() * 0.01
        return lax.fori_loop(0, 5, outer, x)

    s = F32(0.3)
    want = x.astype(np.float64)
    for _ in range(5):
        h = want.copy()
        sums = []
        for k in range(5):
            sums.append(h.sum())
            h = h * w + k * 2 * s
        inner = want.copy()
        for j in range(7):
            inner = inner * 0.5 + const + j
        want = inner + np.mean(sums) * 0.01
    _close(f(x, w, s), want, rtol=1e-4, atol=1e-4)
    traced = f.trace(x, w, s)
    (outer_loop,) = _loops(traced.ir)
    assert len(_loops(outer_loop.params["body"])) == 2
    # the interpreter (the CPU fallback) runs the traced loops to the same values
    _close(interpret_traced(traced, [x, w, s])[0], want, rtol=1e-4, atol=1e-4)


def test_repeated_call_neither_traces_nor_compiles() -> None:
    f = fusec.gpu_jit(lambda x: lax.fori_loop(0, 20, lambda i, c: c + i, x))
    x = fusec.device_put(np.zeros(3, F32))
    f(x).block_until_ready()
    with Delta() as d:
        for _ in range(3):
            y = f(x)
    assert (d.traces, d.pipelines_compiled) == (0, 0)
    _close(y, np.full(3, 190.0))


def test_eager_outside_jit() -> None:
    out = lax.fori_loop(0, 10, lambda i, c: c + i, fusec.device_put(np.float32(1)))
    assert isinstance(out, fusec.Array)
    _close(out, np.float32(46))
    c, ys = lax.scan(lambda c, x: (c + x, c), 0.0, np.arange(6, dtype=F32))
    _close(ys, np.array([0, 0, 1, 3, 6, 10], F32))
    _close(lax.cond(fusec.device_put(np.bool_(False)), lambda: 1.0, lambda: 2.0), np.float32(2))


def test_cpu_backend_runs_loops() -> None:
    """FUSEC_BACKEND=cpu: the numpy interpreter runs the lowered loops (a fresh process)."""
    code = (
        "import json, numpy as np, fusec, fusec.numpy as fnp; from fusec import lax\n"
        "f = fusec.gpu_jit(lambda x: lax.fori_loop(0, 30, lambda i, c: c * 0.5 + i, x))\n"
        "g = fusec.gpu_jit(lambda xs: lax.scan(lambda c, x: (c + x, c), 0.0, xs))\n"
        "w = fusec.gpu_jit(lambda n: lax.while_loop(lambda s: s[1] < n, "
        "lambda s: (s[0] * 2, s[1] + 1), (1, 0)))\n"
        "print(json.dumps([float(np.asarray(f(np.float32(1)))), "
        "np.asarray(g(np.arange(9, dtype=np.float32))[1]).tolist(), "
        "int(np.asarray(w(np.int32(12))[0]))]))\n")
    env = {**os.environ, "FUSEC_BACKEND": "cpu", "FUSEC_VERIFY": "1"}
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    fori, ys, w = json.loads(out.strip().splitlines()[-1])
    want = 1.0
    for i in range(30):
        want = want * 0.5 + i
    assert fori == pytest.approx(want, rel=1e-5)
    assert ys == [0, 0, 1, 3, 6, 10, 15, 21, 28]
    assert w == 4096


# --- cond / switch --------------------------------------------------------------------------------


def test_cond_selects_and_does_not_leak_nan(rng: np.random.Generator) -> None:
    x = rng.random(7).astype(F32) + F32(0.1)

    @fusec.gpu_jit
    def f(p, x):
        return lax.cond(p, lambda a: {"v": fnp.log(a), "n": 1},
                        lambda a: {"v": fnp.log(-a), "n": 2}, x)  # NaN on the untaken side

    out = f(True, x)
    _close(out["v"], np.log(x))
    assert int(np.asarray(out["n"])) == 1
    out = f(np.bool_(False), x)
    assert np.isnan(np.asarray(out["v"])).all()
    for p in (np.int32(3), np.int32(0)):  # integer predicates: non-zero is true
        assert int(np.asarray(f(p, x)["n"])) == (1 if p else 2)
    # a Python bool inside the trace: only the chosen branch is emitted
    g = fusec.gpu_jit(lambda x: lax.cond(True, lambda a: a + 1, lambda a: fnp.exp(a), x))
    assert all(e.op is not Op.EXP for e in g.trace(x).ir.eqns)
    _close(g(x), x + 1)


@pytest.mark.parametrize("index", [-3, 0, 1, 2, 3, 100])
def test_switch_clamps_index(rng: np.random.Generator, index: int) -> None:
    x = rng.standard_normal(5).astype(F32)
    branches = [lambda a: a + 1, lambda a: a * 3, lambda a: -a]
    f = fusec.gpu_jit(lambda i, x: lax.switch(i, branches, x))
    ref = [x + 1, x * 3, -x][min(max(index, 0), 2)]
    _close(f(np.int32(index), x), ref)
    if index >= 0:
        _close(f(np.uint32(index), x), ref)
    _close(lax.switch(index, branches, x), ref)  # a static index, eagerly


# --- errors ---------------------------------------------------------------------------------------


def test_carry_shape_dtype_and_structure_errors() -> None:
    x = np.zeros(3, F32)
    with pytest.raises(fusec.CarryError,
                       match=r"init_val\['w'\] from f32\[3\] to f32\[1,3\]"):
        lax.fori_loop(0, 9, lambda i, c: {"w": c["w"][None], "b": c["b"]}, {"w": x, "b": x})
    with pytest.raises(fusec.CarryError, match=r"init_val\[1\] from i32\[\] to f32\[\]"):
        lax.fori_loop(0, 9, lambda i, c: (c[0], c[1] * 0.5), (x, 1))
    with pytest.raises(fusec.CarryError, match="structured as"):
        lax.fori_loop(0, 9, lambda i, c: (c, c), x)
    with pytest.raises(fusec.CarryError, match=r"init\[0\] from f32\[3\] to f32\[\]"):
        lax.scan(lambda c, y: ((c[0].sum(),), y), (x,), x)
    with pytest.raises(fusec.CarryError, match=r"init_val from f32\[3\] to f32\[2\]"):
        lax.while_loop(lambda c: c.sum() > 0, lambda c: c[:2], x)
    with pytest.raises(fusec.CarryError, match="boolean scalar"):
        lax.while_loop(lambda c: c, lambda c: c, x)


def test_bound_pred_and_branch_errors() -> None:
    x = np.zeros(3, F32)
    with pytest.raises(fusec.DTypeError, match="upper is the float"):
        lax.fori_loop(0, 2.5, lambda i, c: c, x)
    with pytest.raises(fusec.ShapeError, match="upper must be a scalar"):
        fusec.gpu_jit(lambda n, x: lax.fori_loop(0, n, lambda i, c: c, x))(
            np.zeros(2, np.int32), x)
    with pytest.raises(fusec.DTypeError, match="lower has dtype float32"):
        fusec.gpu_jit(lambda n, x: lax.fori_loop(n, 3, lambda i, c: c, x))(np.float32(1), x)
    with pytest.raises(fusec.ShapeError, match="pred must be a scalar"):
        lax.cond(np.array([True, False]), lambda a: a, lambda a: a, x)
    with pytest.raises(fusec.DTypeError, match="pred has dtype float32"):
        lax.cond(fusec.device_put(np.float32(1)), lambda a: a, lambda a: a, x)
    with pytest.raises(fusec.CarryError,
                       match=r"at output true_fun returns f32\[3\] and false_fun f32\[1\]"):
        lax.cond(fusec.device_put(np.bool_(True)), lambda a: a, lambda a: a[:1], x)
    with pytest.raises(fusec.CarryError, match=r"branches\[0\] and branches\[2\].*structure"):
        lax.switch(fusec.device_put(np.int32(0)), [lambda a: a, lambda a: a, lambda a: (a, a)],
                   x)
    with pytest.raises(fusec.DTypeError, match="index has dtype float32"):
        lax.switch(fusec.device_put(np.float32(0)), [lambda a: a], x)


# --- the persistent cache and the structural hash -------------------------------------------------


@requires_wgpu
def test_loop_body_is_part_of_the_hash_and_survives_the_disk_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def make(k: float) -> fusec.JitFunction:
        return fusec.gpu_jit(lambda xs: lax.scan(lambda c, x: (c * k + x, c), 0.0, xs))

    xs = np.arange(12, dtype=F32)
    a, b = make(0.5).trace(xs).ir, make(0.25).trace(xs).ir
    assert "0.25:f32" in str(b) and a.hash() != b.hash()  # bodies differ in one literal
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "cache"))
    first = make(0.5)
    want = np.asarray(first(xs)[1])
    second = make(0.5)  # a new function object: its lowering comes from the disk
    with Delta() as d:
        got = np.asarray(second(xs)[1])
    assert d.disk_hits == 1 and d.lowerings == 0
    np.testing.assert_array_equal(got, want)
    carries = [0.0]
    for x in xs[:-1]:
        carries.append(carries[-1] * 0.5 + x)
    _close(got, np.array(carries))


# --- autodiff through loops -----------------------------------------------------------------------


def _fd(fn, a: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """Central differences of a float64 numpy function."""
    a = np.asarray(a, np.float64)
    out = np.zeros(a.shape)
    for j in np.ndindex(a.shape):
        hi, lo = a.copy(), a.copy()
        hi[j] += eps
        lo[j] -= eps
        out[j] = (fn(hi) - fn(lo)) / (2 * eps)
    return out


def test_grad_through_fori_loop(rng: np.random.Generator) -> None:
    x = rng.standard_normal(6).astype(F32)
    w = (rng.standard_normal(6) * 0.5).astype(F32)

    def loss(x, w):
        c = lax.fori_loop(0, 9, lambda i, c: fnp.tanh(c * w + 0.1 * i), x)
        return (c * c).sum()

    def ref(x, w):
        c = x
        for i in range(9):
            c = np.tanh(c * w + 0.1 * i)
        return (c * c).sum()

    gx, gw = fusec.gpu_jit(fusec.grad(loss, argnums=(0, 1)))(x, w)
    _close(gx, _fd(lambda a: ref(a, w.astype(np.float64)), x), rtol=1e-3, atol=1e-5)
    _close(gw, _fd(lambda a: ref(x.astype(np.float64), a), w), rtol=1e-3, atol=1e-5)


def test_grad_through_scan_accumulates_xs_rows_in_place(rng: np.random.Generator) -> None:
    xs = rng.standard_normal((23, 3)).astype(F32)
    c0 = rng.standard_normal(3).astype(F32)
    w = rng.uniform(-0.9, 0.9, 3).astype(F32)  # |w| < 1: float32 rounding is not amplified

    def loss(xs, c0, w):
        c, ys = lax.scan(lambda c, x: (fnp.sin(c) * w + x, c * x), c0, xs, reverse=True)
        return ys.sum() + (c * c).sum()

    def ref(xs, c0, w):
        c, tot = c0, 0.0
        for t in reversed(range(len(xs))):
            tot += (c * xs[t]).sum()
            c = np.sin(c) * w + xs[t]
        return tot + (c * c).sum()

    g = fusec.gpu_jit(fusec.grad(loss, argnums=(0, 1, 2)))
    gxs, gc0, gw = g(xs, c0, w)
    x64, c64, w64 = (a.astype(np.float64) for a in (xs, c0, w))
    _close(gxs, _fd(lambda a: ref(a, c64, w64), xs), rtol=1e-3, atol=1e-4)
    _close(gc0, _fd(lambda a: ref(x64, a, w64), c0), rtol=1e-3, atol=1e-4)
    _close(gw, _fd(lambda a: ref(x64, c64, a), w), rtol=1e-3, atol=1e-4)
    # the reverse loop adds each step's row of d/dxs into its accumulator in place, and reads
    # the ys' cotangent row by row: no pass over all of xs or ys per iteration
    loops = _loops(g.trace(xs, c0, w).ir)
    reverse = loops[-1]
    assert any(e.op is Op.SCATTER and e.params.get("into_operand")
               for e in reverse.params["body"].eqns)
    assert all(v.shape != (23, 23, 3) for e in loops for v in e.outs)  # ys are never stacked


def test_grad_through_in_place_buffer_and_nested_loops(rng: np.random.Generator) -> None:
    buf0 = rng.standard_normal((3, 4)).astype(F32)
    v = rng.standard_normal(4).astype(F32)

    def loss(buf0, v):
        def step(i, b):
            inner = lax.fori_loop(0, 5, lambda j, u: u * 0.9 + v * 0.1, b[(i + 1) % 3])
            return b.at[i % 3].set(inner * 0.5 + v * i)
        b = lax.fori_loop(0, 7, step, buf0)
        return (b * b).sum()

    def ref(buf0, v):
        b = buf0.copy()
        for i in range(7):
            u = b[(i + 1) % 3]
            for _ in range(5):
                u = u * 0.9 + v * 0.1
            b[i % 3] = u * 0.5 + v * i
        return (b * b).sum()

    gb, gv = fusec.gpu_jit(fusec.grad(loss, argnums=(0, 1)))(buf0, v)
    b64, v64 = buf0.astype(np.float64), v.astype(np.float64)
    _close(gb, _fd(lambda a: ref(a, v64), buf0), rtol=1e-3, atol=1e-4)
    _close(gv, _fd(lambda a: ref(b64, a), v), rtol=1e-3, atol=1e-4)


def test_jvp_through_fori_and_while_and_no_grad_of_while() -> None:
    def f(x):
        return lax.while_loop(lambda s: s[0] < 6, lambda s: (s[0] + 1, fnp.sin(s[1]) * 1.5),
                              (0, x))[1]

    def ref(x):
        for _ in range(6):
            x = np.sin(x) * 1.5
        return x

    jf = fusec.gpu_jit(lambda x, dx: fusec.jvp(f, (x,), (dx,)))
    p, t = jf(np.float32(0.7), np.float32(2.0))
    _close(p, np.float32(ref(0.7)))
    _close(t, np.float32(2.0 * _fd(ref, np.array(0.7))), rtol=1e-4)
    g = fusec.gpu_jit(lambda x, dx: fusec.jvp(
        lambda x: lax.fori_loop(0, 8, lambda i, c: c * c * 0.5 + 0.1, x), (x,), (dx,)))
    p, t = g(np.float32(0.9), np.float32(1.0))

    def ref2(x):
        for _ in range(8):
            x = x * x * 0.5 + 0.1
        return x

    _close(t, np.float32(_fd(ref2, np.array(0.9))), rtol=1e-4)
    with pytest.raises(fusec.TraceError, match="while_loop is not supported"):
        fusec.grad(lambda x: lax.while_loop(lambda s: s < 5.0, lambda s: s * 2.0, x))(F32(1))


# --- vmap of loops --------------------------------------------------------------------------------


def test_vmap_of_loops_matches_a_loop_per_example(rng: np.random.Generator) -> None:
    xs = rng.standard_normal((4, 5)).astype(F32)
    w = (rng.standard_normal(5) * 0.5).astype(F32)
    f = lambda x: lax.fori_loop(0, 9, lambda i, c: fnp.tanh(c * w + 0.1 * i), x)  # noqa: E731
    # a carry that starts unbatched and becomes batched through a batched invariant
    g = lambda v: lax.fori_loop(0, 9, lambda i, c: c * v + 1.0, fnp.zeros(5))  # noqa: E731
    s = lambda r: lax.scan(lambda c, x: (c + x, c * x), 0.0, r)  # noqa: E731
    for fn in (f, g):
        got = np.asarray(fusec.gpu_jit(fusec.vmap(fn))(xs))
        np.testing.assert_array_equal(got, np.stack([np.asarray(fusec.gpu_jit(fn)(x))
                                                     for x in xs]))
    c, ys = fusec.gpu_jit(fusec.vmap(s))(xs)
    for k in range(4):
        _close(c[k], xs[k].sum())
        _close(ys[k], np.concatenate([[0.0], np.cumsum(xs[k])[:-1]]) * xs[k])
    (loop,) = _loops(fusec.gpu_jit(fusec.vmap(s)).trace(xs).ir)
    assert loop.params["inplace"]  # the batched ys are still written in place


def test_vmap_of_while_loop_stops_each_example_at_its_own_stop() -> None:
    w = lambda n: lax.while_loop(lambda s: s[0] < n, lambda s: (s[0] + 1, s[1] * 2), (0, 1))  # noqa: E731
    k, p = fusec.gpu_jit(fusec.vmap(w))(np.array([0, 3, 10, 5], np.int32))
    np.testing.assert_array_equal(np.asarray(k), [0, 3, 10, 5])
    np.testing.assert_array_equal(np.asarray(p), [1, 8, 1024, 32])


def test_grad_with_unroll_int_carry_and_second_order() -> None:
    x = np.array([0.3, -0.2, 0.5], F32)

    def loss(x):  # 3 steps per loop iteration, 2 more after it; an int carry beside the float
        k, c = lax.fori_loop(0, 11, lambda i, s: (s[0] + 1, fnp.sin(s[1]) + 0.1 * s[0]),
                             (0, x), unroll=3)
        return (c ** 2).sum()

    def ref(x):
        k, c = 0, x
        for _ in range(11):
            k, c = k + 1, np.sin(c) + 0.1 * k
        return (c ** 2).sum()

    _close(fusec.gpu_jit(fusec.grad(loss))(x), _fd(ref, x), rtol=1e-4)

    def l2(x):
        return (lax.fori_loop(0, 6, lambda i, c: c * 0.5 + fnp.sin(c), x) ** 2).sum()

    def r2(x):
        for _ in range(6):
            x = x * 0.5 + np.sin(x)
        return (x ** 2).sum()

    hess_diag_sum = fusec.gpu_jit(fusec.grad(lambda x: fusec.grad(l2)(x).sum()))(x)
    _close(hess_diag_sum, _fd(lambda a: _fd(r2, a).sum(), x, 1e-3), rtol=1e-3, atol=1e-3)


# --- the counter rides in another kernel ----------------------------------------------------------


@pytest.mark.parametrize("target,n", [("cpu", 70001), ("gpu", 70001), ("gpu", 70004)])
def test_loop_counter_is_a_side_output_of_the_body_kernel(target: str, n: int) -> None:
    """In a loop body, the counter's increment (a 0-d result) is written by the first thread of
    the body's elementwise kernel: one dispatch per iteration, on both code-generation targets
    (on "gpu" a carry this large takes several elements per thread; 70004 would be read and
    written as vec4s, were it not for the 0-d output)."""
    from helpers import forced_target

    x = np.linspace(-1, 1, n).astype(F32)
    with forced_target(target):
        f = fusec.gpu_jit(lambda x: lax.fori_loop(0, 9, lambda i, c: c * 0.5 + i, x))
        (loop,) = _loops(f.lower(x).ir)
        (kernel,) = [e for e in loop.params["body"].eqns if e.op is Op.KERNEL]
        assert [o.shape for o in kernel.outs] == [(n,), ()]
        want = x.astype(np.float64)
        for i in range(9):
            want = want * 0.5 + i
        _close(f(x), want)
        w = fusec.gpu_jit(lambda x: lax.while_loop(lambda s: s[0] < 7,
                                                   lambda s: (s[0] + 1, s[1] * 0.5), (0, x)))
        (loop,) = _loops(w.lower(x).ir)
        assert len([e for e in loop.params["body"].eqns if e.op is Op.KERNEL]) == 1
        k, y = w(x)
        assert int(np.asarray(k)) == 7
        _close(y, x * 0.5 ** 7)


def test_custom_vjp_inside_branches_and_loops() -> None:
    """A custom_vjp function called in a cond branch, an unrolled loop or a loop body keeps its
    own backward function: the inlined markers get keys of the trace they land in."""
    @fusec.custom_vjp
    def clip_grad(x):
        return x * 1.0

    clip_grad.defvjp(lambda x: (x * 1.0, None), lambda r, g: (fnp.clip(g, -0.1, 0.1),))
    x = np.array([1.0, 2.0], F32)
    fs = [lambda x: lax.cond(x.sum() > 0, lambda a: clip_grad(a) * 3.0, lambda a: a, x).sum(),
          lambda x: lax.fori_loop(0, 3, lambda i, c: clip_grad(c) * 2.0, x).sum(),
          lambda x: lax.fori_loop(0, 9, lambda i, c: clip_grad(c) * 2.0, x).sum()]
    for f in fs:
        _close(fusec.gpu_jit(fusec.grad(f))(x), np.full(2, 0.1))
    _close(fusec.gpu_jit(fusec.vmap(fusec.grad(fs[2])))(np.stack([x, -x])), np.full((2, 2), 0.1))


@requires_wgpu
def test_while_chunk_max_setting() -> None:
    f = fusec.gpu_jit(lambda n: lax.while_loop(lambda s: s[0] < n, lambda s: (s[0] + 1, s[1] * 3),
                                               (0, 1)))
    # 5 rounds up to 6: chunks 2, 4, 6, 6, 6; 0: the default, 64: chunks 2, 4, 8, 16
    for cap, reads in ((2, 10), (5, 5), (0, 4)):
        fusec.config.set("while_chunk_max", cap or None)
        try:
            with Delta() as d:
                k, p = f(np.int32(20))
                np.asarray(p)
        finally:
            fusec.config.set("while_chunk_max", None)
        assert int(np.asarray(k)) == 20
        assert int(np.asarray(p)) == (3 ** 20 + 2 ** 31) % 2 ** 32 - 2 ** 31  # int32 wraps
        assert d.readbacks == reads + 1  # the flag reads, then the result
