"""The numpy interpreter as a backend (issue 18, item 5): which backend the default picks, and the
interpreter's fast paths (views instead of copies, writes into dead operands, one BLAS call for a
weight broadcast over a batch) keeping every result right.

The suite runs on wgpu (conftest sets FUSEC_BACKEND=gpu); what the default picks, and the
interpreter as the backend of whole programs, run in subprocesses with their own setting.
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
from helpers import REPO, pythonpath

import fusec
import fusec.numpy as fnp
from fusec import config, interpret, nn
from fusec.errors import FusecError
from fusec.interpret import _dead_operand, evaluate
from fusec.ir import Op
from fusec.passes import Options, run_pipeline
from fusec.runtime import CpuExecutable, _choose_adapter

F32 = np.float32


def _adapter_types() -> list[str]:
    import wgpu

    return [str(a.info["adapter_type"]) for a in wgpu.gpu.enumerate_adapters_sync()]


def _run(code: str, backend: str | None) -> dict[str, Any]:
    """``code`` in a fresh process with FUSEC_BACKEND=backend (None: unset); it prints one JSON
    line last, returned here, with whatever it warned."""
    env = {k: v for k, v in os.environ.items() if k != "FUSEC_BACKEND"}
    if backend is not None:
        env["FUSEC_BACKEND"] = backend
    env["PYTHONPATH"] = pythonpath()
    env.setdefault("XDG_RUNTIME_DIR", "/tmp")
    env["FUSEC_CACHE_DIR"] = "off"
    p = subprocess.run([sys.executable, "-W", "always", "-c", textwrap.dedent(code)], env=env,
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["stderr"] = p.stderr
    return dict(out)


# --- which backend --------------------------------------------------------------------------------


def test_the_default_takes_the_interpreter_only_where_every_adapter_is_software() -> None:
    got = _run("""
        import json, numpy as np, fusec, fusec.numpy as fnp
        dev = fusec.default_device()
        f = fusec.gpu_jit(lambda x: fnp.sort(x) * 2.0 + fnp.cumsum(x))
        x = np.random.default_rng(1).standard_normal(101).astype(np.float32)
        y = np.asarray(f(x))
        err = float(np.abs(y - (np.sort(x) * 2 + np.cumsum(x.astype(np.float64)))).max())
        before = fusec.cache_info().lowerings
        n_kernels = len(f.lower(x).kernels)
        print(json.dumps({"backend": dev.backend, "reason": dev.reason, "err": err,
                          "lowerings_of_the_call": before, "kernels": n_kernels,
                          "lowerings_after": fusec.cache_info().lowerings}))
    """, backend=None)
    types = _adapter_types()
    assert got["err"] < 1e-4
    assert "Warning" not in got["stderr"], got["stderr"]  # choosing numpy is not a fault
    if types and all(t == "CPU" for t in types):
        assert got["backend"] == "cpu"
        assert "software adapter" in got["reason"] and "FUSEC_BACKEND=gpu" in got["reason"]
        # the interpreter ran the traced program: the call lowered nothing; an explicit
        # .lower() still gives the GPU's kernels
        assert got["lowerings_of_the_call"] == 0
        assert got["kernels"] >= 2 and got["lowerings_after"] == 1
    else:
        assert got["backend"] != "cpu" and got["lowerings_of_the_call"] == 1


def test_the_suite_runs_on_wgpu_and_says_why_on_a_software_adapter() -> None:
    """conftest sets FUSEC_BACKEND=gpu (unless the environment chose): the tests run the WGSL,
    on lavapipe too."""
    if os.environ.get("FUSEC_BACKEND") != "gpu":
        pytest.skip(f"FUSEC_BACKEND={os.environ.get('FUSEC_BACKEND')} was set outside conftest")
    dev = fusec.default_device()
    assert dev.backend != "cpu" and not dev.is_cpu_fallback
    if dev.adapter_type == "CPU":
        assert "software adapter" in dev.reason and "FUSEC_BACKEND=gpu" in dev.reason
    else:
        assert dev.reason == ""


def test_backend_settings() -> None:
    try:
        config.set("backend", "cpu")
        assert _choose_adapter() == (None, "FUSEC_BACKEND=cpu")
        config.set("backend", "tpu")
        with pytest.raises(FusecError, match="FUSEC_BACKEND='tpu'.*auto, gpu, cpu"):
            _choose_adapter()
        config.set("backend", "gpu")
        adapter, _ = _choose_adapter()
        assert adapter is not None  # any adapter will do, software included
        config.set("backend", "auto")
        adapter, reason = _choose_adapter()
        software = adapter is None or adapter.info["adapter_type"] == "CPU"
        assert software == all(t == "CPU" for t in _adapter_types())
        assert (adapter is None) == software and ("software adapter" in reason) == software
    finally:
        config.set("backend", None)


# --- the interpreter's fast paths -----------------------------------------------------------------


def test_a_dead_operand_is_reused_and_a_live_one_is_not() -> None:
    fresh = [np.ones((3, 5), F32)]
    assert _dead_operand(fresh, (3, 5)) is fresh[0]
    view_of_fresh = [np.ones(15, F32).reshape(3, 5)]
    assert _dead_operand(view_of_fresh, (3, 5)) is view_of_fresh[0]
    held = np.ones((3, 5), F32)
    assert _dead_operand([held], (3, 5)) is None  # the caller still holds it
    base = np.ones(15, F32)
    assert _dead_operand([base.reshape(3, 5)], (3, 5)) is None  # another view of the buffer
    assert _dead_operand([np.ones(20, F32)[:15].reshape(3, 5)], (3, 5)) is None  # part of one
    assert _dead_operand([np.ones((3, 5), np.int32)], (3, 5)) is None  # not float32
    assert _dead_operand([np.ones((1, 5), F32)], (3, 5)) is None  # broadcast: another shape
    ro = np.ones((3, 5), F32)
    ro.flags.writeable = False
    assert _dead_operand([ro], (3, 5)) is None
    del ro
    x = np.ones((3, 5), F32)
    twice = [x, x]
    del x
    assert _dead_operand(twice, (3, 5)) is None  # both operands: not dead after either


def test_writes_into_dead_values_leave_live_views_inputs_and_outputs_alone(
        rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    def f(x, w):
        y = x * 2.0
        flat = y.reshape(-1)  # a view of y that outlives y's last use below
        z = fnp.exp(y - 1.0)  # y dies here: its buffer may be written...
        s = nn.gelu(z * 0.5, approximate="none") + z  # ...z's, once it is dead
        return s, flat * 3.0, x, x.T, y.sum()

    # (results of at least _REUSE_MIN elements look for a dead operand: smaller ones never)
    x = rng.standard_normal((70, 131)).astype(F32)
    w = rng.standard_normal(131).astype(F32)
    assert x.size >= interpret._REUSE_MIN
    x0 = x.copy()
    prog = fusec.gpu_jit(f).trace(x, w).ir
    args = [x.copy(), w]
    reused = []

    def spy(ins: Any, shape: Any) -> Any:
        buf = real(ins, shape)
        reused.append(buf is not None)
        return buf

    real = interpret._dead_operand
    monkeypatch.setattr(interpret, "_dead_operand", spy)
    s, flat3, xo, xt, total = evaluate(prog, args)
    assert any(reused)  # (the writes this test is about did happen)
    xd = x.astype(np.float64)
    zd = np.exp(2 * xd - 1)
    from scipy.special import erf

    want = 0.5 * (zd * 0.5) * (1 + erf(zd * 0.5 / np.sqrt(2))) + zd
    np.testing.assert_allclose(s, want, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(flat3, (2 * xd * 3).reshape(-1), rtol=1e-6)
    # a float32 sum of 9170 terms of either sign: its error is bounded relative to the sum of the
    # terms' magnitudes, not to the (possibly small) sum itself
    np.testing.assert_allclose(total, (2 * xd).sum(), rtol=1e-5,
                               atol=8 * np.finfo(F32).eps * np.abs(2 * xd).sum())
    np.testing.assert_array_equal(args[0], x0)  # the input was never written
    for out in (xo, xt):  # outputs viewing the input are copies of their own
        assert not np.shares_memory(out, args[0])
    np.testing.assert_array_equal(xo, x0)
    np.testing.assert_array_equal(xt, x0.T)


def test_nan_and_inf_propagate_through_in_place_writes() -> None:
    f = fusec.gpu_jit(lambda x: fnp.exp(x * 1.0 - 0.0) * 2.0 + 1.0)
    # (tiled past _REUSE_MIN elements: the results are written into dead operands)
    x = np.tile(np.array([0.0, np.nan, np.inf, -np.inf, 89.0, 1.0], F32), 700)
    assert x.size >= interpret._REUSE_MIN
    with np.errstate(all="ignore"):
        want = (np.exp(x.astype(np.float64)) * 2 + 1).astype(F32)  # exp(89) overflows float32
    (got,) = evaluate(f.trace(x).ir, [x])
    assert got.dtype == F32
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("batch,m,k,n", [(3, 5, 7, 11), (1, 1, 1, 1), (4, 37, 31, 2),
                                         (0, 3, 4, 5)])
def test_a_dense_layer_over_a_batch_is_one_matmul(batch: int, m: int, k: int, n: int,
                                                  rng: np.random.Generator) -> None:
    x = rng.standard_normal((batch, m, k)).astype(F32)
    w = rng.standard_normal((k, n)).astype(F32)
    b = rng.standard_normal(n).astype(F32)
    prog = fusec.gpu_jit(lambda x, w, b: x @ w + b).trace(x, w, b).ir
    assert any(e.op is Op.BROADCAST for e in prog.eqns)  # the weight, broadcast over the batch
    (got,) = evaluate(prog, [x, w, b])
    want = x.astype(np.float64) @ w + b
    assert got.shape == want.shape and got.dtype == F32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))


def test_empty_reductions_give_the_identity() -> None:
    """logsumexp of an empty axis is -inf, as on the GPU (its max reduces an empty axis, which
    numpy's max refuses)."""
    e = np.zeros((3, 0), F32)
    prog = fusec.gpu_jit(lambda x: (fnp.logsumexp(x, axis=1), x.sum(axis=1))).trace(e).ir
    lse, s = evaluate(prog, [e])
    np.testing.assert_array_equal(lse, np.full(3, -np.inf, F32))
    np.testing.assert_array_equal(s, np.zeros(3, F32))


def test_the_executable_runs_the_traced_program_not_the_lowered_one(
        rng: np.random.Generator) -> None:
    """numpy sorts, scans and scatters in one call each: the GPU's forms of them (radix passes,
    tiled scans) would only add work."""
    x = rng.standard_normal(5000).astype(F32)
    ids = rng.integers(0, 5000, 300).astype(np.int32)
    f = fusec.gpu_jit(lambda x, i: (fnp.sort(x), fnp.cumsum(x), x.at[i].add(1.0)))
    exe = CpuExecutable(f.trace(x, ids).ir)
    ops = {e.op for e in exe.prog.eqns}
    assert Op.SORT in ops and Op.KERNEL not in ops
    assert not ops & {Op.RADIX_HIST, Op.RADIX_SCATTER, Op.SORT_BLOCKS, Op.SCAN_REDUCE}
    srt, cs, sc = exe.run([x, ids])
    np.testing.assert_array_equal(np.asarray(srt), np.sort(x))
    np.testing.assert_allclose(np.asarray(cs), np.cumsum(x.astype(np.float64)), atol=1e-3)
    want = x.copy()
    np.add.at(want, ids, F32(1))
    np.testing.assert_array_equal(np.asarray(sc), want)
    with pytest.raises(ValueError):  # results are immutable, as read back from a device
        np.asarray(srt)[0] = 0


def test_a_donated_cache_takes_its_window_in_place_and_nothing_else_is_written(
        rng: np.random.Generator) -> None:
    """A donated input whose last use is its window's update (a decode step's cache) takes the
    window in place: the result is the input's own array, nothing copied. A donated input read
    after the update, an input not donated, and a user's own numpy array (writable or not) are
    never written; every result is np's."""
    from fusec import lax
    from fusec.runtime import Array

    shape = (1, 3, 257, 8)
    cache = rng.standard_normal(shape).astype(F32)
    cache[0, 1, 7, :] = np.nan  # specials stay where they are
    cache[0, 2, 9, 3] = -np.inf
    new = rng.standard_normal((1, 3, 1, 8)).astype(F32)
    at = np.int32(rng.integers(0, 257))

    def want(c: np.ndarray) -> np.ndarray:
        w = c.copy()
        w[:, :, at:at + 1, :] = new
        return w

    def ours(x: np.ndarray) -> Any:
        # an array this backend made: a call's result (read-only, owning its memory)
        made = CpuExecutable(fusec.gpu_jit(lambda v: v * 1.0).trace(x).ir).run(
            [Array(x.shape, "float32", host=x)])[0]
        assert not np.asarray(made).flags.writeable
        return made

    update = fusec.gpu_jit(lambda c, x, i: lax.dynamic_update_slice(c, x, (0, 0, i, 0)))
    prog = update.trace(cache, new, at).ir
    x_arr = Array(new.shape, "float32", host=new)
    at_arr = Array((), "int32", host=np.asarray(at))
    # donated, ours: in place
    c0 = ours(cache)
    out = CpuExecutable(prog, donated=(0,)).run([c0, x_arr, at_arr])[0]
    assert np.asarray(out) is np.asarray(c0), "the window was not written in place"
    np.testing.assert_array_equal(np.asarray(out), want(cache))
    assert not np.asarray(out).flags.writeable  # a result again: read-only
    # not donated: a fresh array, the input untouched
    c1 = ours(cache)
    out = CpuExecutable(prog).run([c1, x_arr, at_arr])[0]
    assert np.asarray(out) is not np.asarray(c1)
    np.testing.assert_array_equal(np.asarray(c1), cache)
    np.testing.assert_array_equal(np.asarray(out), want(cache))
    # a user's own arrays, donated: never written, writable or not
    for writable in (True, False):
        mine = cache.copy()
        mine.flags.writeable = writable
        out = CpuExecutable(prog, donated=(0,)).run(
            [Array(shape, "float32", host=mine), x_arr, at_arr])[0]
        np.testing.assert_array_equal(mine, cache)
        assert mine.flags.writeable == writable
        np.testing.assert_array_equal(np.asarray(out), want(cache))
    # donated, but read again after its update: the update's last use is not its own
    both = fusec.gpu_jit(lambda c, x, i: (lax.dynamic_update_slice(c, x, (0, 0, i, 0)),
                                          c * 2.0))
    c2 = ours(cache)
    upd, twice = CpuExecutable(both.trace(cache, new, at).ir, donated=(0,)).run(
        [c2, x_arr, at_arr])
    np.testing.assert_array_equal(np.asarray(upd), want(cache))
    np.testing.assert_array_equal(np.asarray(twice), cache * F32(2))


# --- the interpreter as the backend of whole programs ---------------------------------------------


def test_runtime_features_on_the_interpreter() -> None:
    """device_put, profile, warmup, loops, grad, random and while_loop with FUSEC_BACKEND=cpu."""
    got = _run("""
        import json, numpy as np, fusec, fusec.numpy as fnp
        from fusec import lax, nn
        out = {"backend": fusec.default_device().backend, "reason": fusec.default_device().reason}
        host = np.arange(6, dtype=np.float32)
        d = fusec.device_put(host)
        host[0] = 100.0  # the device copy must not change
        out["device_put"] = float(np.asarray(d)[0])
        f = fusec.gpu_jit(lambda x, w: nn.softmax(x @ w) @ w.T)
        x = np.ones((4, 6), np.float32); w = np.full((6, 3), 0.5, np.float32)
        c = f.warmup(fusec.ShapeDtype((4, 6)), fusec.ShapeDtype((6, 3)))
        out["warmup_lowerings"] = fusec.cache_info().lowerings
        with fusec.profile(print_report=False) as p:
            f(x, w); f(x, w)
        out["profile_rows"] = [[r[0], r[1]] for r in p.rows]
        out["profile_report"] = p.report().splitlines()[0]
        out["fori"] = float(np.asarray(fusec.gpu_jit(
            lambda x: lax.fori_loop(0, 30, lambda i, c: c * 0.5 + i, x))(np.float32(1))))
        out["while"] = int(np.asarray(fusec.gpu_jit(lambda n: lax.while_loop(
            lambda s: s[1] < n, lambda s: (s[0] * 2, s[1] + 1), (1, 0)))(np.int32(12))[0]))
        out["grad"] = np.asarray(fusec.grad(lambda v: (v * v).sum())(host)).tolist()
        k = fusec.random.key(3)
        out["normal_std"] = float(np.asarray(fusec.random.normal(k, (20000,))).std())
        print(json.dumps(out))
    """, backend="cpu")
    assert got["backend"] == "cpu" and got["reason"] == "FUSEC_BACKEND=cpu"
    assert got["device_put"] == 0.0
    assert got["warmup_lowerings"] == 0  # nothing to compile for numpy
    rows = dict((name, calls) for name, calls in got["profile_rows"])
    assert rows.get("matmul f32[4,3]") == 2 and rows.get("matmul f32[4,6]") == 2, rows
    assert "of numpy time" in got["profile_report"]
    want = 1.0
    for i in range(30):
        want = want * 0.5 + i
    assert got["fori"] == pytest.approx(want, rel=1e-5)
    assert got["while"] == 4096
    assert got["grad"] == [200.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert 0.97 < got["normal_std"] < 1.03


# --- quantized weights kept dequantised, windows taken per axis -----------------------------------


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_dequantised_weights_are_kept_while_their_words_live(fmt: str,
                                                             rng: np.random.Generator) -> None:
    """The interpreter dequantises read-only words once (a decode step spent 82% of its time
    dequantising again); writable words, a cache of 0 MiB, and words freed and replaced by
    others (even at the same address) are dequantised anew, and every product stays right."""
    from fusec import quant

    def words(seed: int) -> np.ndarray:
        q = quant.quantize(np.random.default_rng(seed).standard_normal((70, 96)).astype(F32), fmt)
        w = np.array(q.data, dtype=np.uint32)
        w.flags.writeable = False  # as fusec's arrays are
        return w

    x = rng.standard_normal((3, 96)).astype(F32)
    f = fusec.gpu_jit(lambda x, w: quant.matmul(x, quant.QuantizedMatrix(fmt, (70, 96), w)))
    for seed in range(4):  # each array freed before the next: ids and addresses may repeat
        w = words(seed)
        traced = f.trace(x, w).ir
        exe = CpuExecutable(traced)  # the traced program: dequant, then matmul
        assert Op.DEQUANT in {e.op for e in exe.prog.eqns}
        lowered = run_pipeline(traced, Options())  # a qmatmul kernel
        assert Op.QMATMUL in {b.op for e in lowered.eqns if e.op is Op.KERNEL
                              for b in e.params["body"].eqns}
        want = x.astype(np.float64) @ interpret.dequant_numpy(w, fmt, (70, 96)).T.astype(np.float64)
        for _ in range(2):
            np.testing.assert_allclose(np.asarray(exe.run([x, w])[0]), want, rtol=1e-4,
                                       atol=1e-4)
            np.testing.assert_allclose(np.asarray(evaluate(lowered, [x, w])[0]), want,
                                       rtol=1e-4, atol=1e-4)
        kept = interpret.dequantized(w, fmt, (70, 96))
        assert kept is interpret.dequantized(w, fmt, (70, 96)) and not kept.flags.writeable
        np.testing.assert_array_equal(kept, interpret.dequant_numpy(w, fmt, (70, 96)))
        del w, exe, kept
    live = words(9)
    writable = np.array(live)
    assert interpret.dequantized(writable, fmt, (70, 96)) is not interpret.dequantized(
        writable, fmt, (70, 96))
    writable[0, :] = 0  # changed between calls: seen
    np.testing.assert_array_equal(interpret.dequantized(writable, fmt, (70, 96)),
                                  interpret.dequant_numpy(writable, fmt, (70, 96)))
    config.set("dequant_cache_mb", 0)
    try:
        fresh = words(10)
        assert interpret.dequantized(fresh, fmt, (70, 96)) is not interpret.dequantized(
            fresh, fmt, (70, 96))
    finally:
        config.set("dequant_cache_mb", None)


def test_windows_are_taken_per_axis_as_numpy_indexes_them(rng: np.random.Generator) -> None:
    """gather over indices that each vary along their own axis (dynamic_slice and
    dynamic_update_slice's windows; negative and past-the-end indices clamped, axes broadcast
    by stride 0) takes the per-axis path and gives numpy's element-wise indexing; slices
    (negative steps too) are views equal to numpy's."""
    from fusec.ops import _take_per_axis, gather_indices, gather_numpy, slice_numpy

    x = rng.standard_normal((2, 5, 7, 3)).astype(F32)
    shape = (2, 4, 11, 3)
    idx = [np.arange(2).reshape(2, 1, 1, 1),
           np.array([-1, 0, 9, 2]).reshape(1, 4, 1, 1).astype(np.int32),
           np.broadcast_to(rng.integers(-9, 9, 11).reshape(1, 1, 11, 1), (2, 4, 11, 1)),
           np.arange(3, dtype=np.uint32).reshape(1, 1, 1, 3)]
    assert _take_per_axis(x, idx, shape) is not None
    full = tuple(gather_indices(np.broadcast_to(i, shape), d) for i, d in zip(idx, x.shape))
    np.testing.assert_array_equal(gather_numpy(x, idx, shape), x[full])
    # axes read whole: in order as given (int32 or uint32: a view, no copy), or in order only
    # once negative indices count from the end (a copy, equal to numpy's)
    whole = [np.arange(2).reshape(2, 1, 1, 1), np.arange(5, dtype=np.uint32).reshape(1, 5, 1, 1),
             np.arange(7, dtype=np.int32).reshape(1, 1, 7, 1), np.arange(3).reshape(1, 1, 1, 3)]
    got = gather_numpy(x, whole, x.shape)
    assert np.shares_memory(got, x)
    np.testing.assert_array_equal(got, x)
    wrapped = [*whole[:2], (np.arange(7) - 7).reshape(1, 1, 7, 1), whole[3]]
    got = gather_numpy(x, wrapped, x.shape)
    np.testing.assert_array_equal(got, x)
    # an index varying along another axis than its own: the general path, same answer
    mixed = [idx[0], np.arange(11).reshape(1, 1, 11, 1) % 5, idx[1].reshape(1, 1, 4, 1)[:, :, :1],
             idx[3]]
    assert _take_per_axis(x, mixed, shape) is None
    full = tuple(gather_indices(np.broadcast_to(i, shape), d) for i, d in zip(mixed, x.shape))
    np.testing.assert_array_equal(gather_numpy(x, mixed, shape), x[full])
    for starts, steps, out in [((1, 4, 6, 0), (1, -1, -2, 1), (1, 5, 4, 3)),
                               ((0, 0, 3, 2), (1, 2, 1, -1), (2, 3, 0, 3)),
                               ((1, 2, 0, 1), (1, 1, 3, 1), (1, 3, 3, 2))]:
        ref = x[np.ix_(*(np.arange(n) * st + s0 for s0, st, n in zip(starts, steps, out)))]
        got = slice_numpy(x, starts, steps, out)
        assert got.shape == out and (got.size == 0 or np.shares_memory(got, x))
        np.testing.assert_array_equal(got, ref)


def test_float32_elementwise_ops_go_through_their_ufunc_and_match_the_reference(
        rng: np.random.Generator) -> None:
    """A float32 elementwise op is its ufunc called directly (no dead operand looked for below
    _REUSE_MIN elements): each such op gives numpy_elementwise's bits on values holding NaN,
    inf, zeros of both signs and subnormals, broadcast operands give a broadcast result, a 0-d
    result stays 0-d, and a program dividing by zero or overflowing warns about nothing."""
    import warnings

    from fusec.errors import FusecError
    from fusec.ir import Eqn, Var
    from fusec.ops import infer_type, numpy_elementwise

    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -3.5, 88.7, 1e30], F32)
    checked = 0
    for shape in [(9,), (3, 9), (5000,)]:
        vals = [np.resize(special, shape) * F32(1), rng.standard_normal(shape).astype(F32)]
        for op, f in interpret._UFUNCS.items():
            n = f.nin
            try:  # (the ops whose float32 operands give a float32 result)
                out = infer_type(op, [(shape, "float32")] * n, {})
            except FusecError:
                continue
            if out[1] != "float32":
                continue
            args = [vals[k % 2] for k in range(n)]
            e = Eqn(op, (), (Var(shape, "float32"),), {})
            with np.errstate(all="ignore"):  # (as evaluate runs every op)
                try:
                    want = numpy_elementwise(op, args, {}, "float32")
                except TypeError:  # bitwise ops: never on floats (the trace casts)
                    continue
                got = interpret._eval_primitive(e, args)
            checked += 1
            assert got.dtype == F32 and got.shape == shape, op
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=op)
    assert checked >= 3 * 30
    e = Eqn(Op.ADD, (), (Var((4, 3), "float32"),), {})
    got = interpret._eval_primitive(e, [np.ones((1, 3), F32), np.full((1, 1), 1, F32)])
    assert got.shape == (4, 3) and got.strides[0] == 0 and (got == 2).all()
    e = Eqn(Op.MUL, (), (Var((), "float32"),), {})
    assert np.asarray(interpret._eval_primitive(e, [np.array(3, F32), np.array(2, F32)])) == 6
    f = fusec.gpu_jit(lambda x: (x / (x - x), fnp.exp(x * 100.0), fnp.log(x - x)))
    x = np.array([1.0, -2.0, 0.0], F32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q, big, lg = evaluate(f.trace(x).ir, [x])
    assert np.isinf(q[:2]).all() and np.isnan(q[2]) and np.isinf(big[0]) and (lg == -np.inf).all()


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_a_where_along_one_axis_puts_slabs_in_and_gives_np_where(
        dtype: str, rng: np.random.Generator) -> None:
    """where whose condition varies along one axis (a cache update's window; few or most
    positions chosen, none, all) copies one operand and puts the other's slabs in; the
    operands broadcast and hold NaN and inf; a condition varying along two axes takes
    np.where. The update's gather from a length-1 axis is a broadcast, not a copy."""
    from fusec.ir import Eqn, Var
    from fusec.ops import gather_numpy

    shape = (2, 3, 257, 5)

    def operand(s: tuple[int, ...]) -> np.ndarray:
        v = rng.standard_normal(s) * 100
        if dtype == "float32":
            v[..., 0] = np.nan
            v[..., 1] = -np.inf
        return np.broadcast_to(v.astype(dtype), shape)

    for axis in (1, 2):
        # scattered positions, then windows: one run of positions (a slice), of 1 and of 90
        for chosen in (0.0, 0.02, 0.5, 0.97, 1.0, (40, 41), (100, 190), (0, 90)):
            cshape = tuple(n if k == axis else 1 for k, n in enumerate(shape))
            if isinstance(chosen, tuple):
                pos = np.arange(shape[axis]).reshape(cshape)
                cond = np.broadcast_to((pos >= chosen[0]) & (pos < chosen[1]), shape)
            else:
                cond = np.broadcast_to(rng.random(cshape) < chosen, shape)
            a, b = operand(shape), operand((1, 3, 1, 5))
            e = Eqn(Op.WHERE, (), (Var(shape, dtype),), {})
            got = interpret._eval_primitive(e, [cond, a, b])
            assert interpret._where_along_one_axis([cond, a, b], shape, dtype) is not None
            np.testing.assert_array_equal(got, np.where(cond, a, b))
            assert got.dtype == np.dtype(dtype) and got.flags.writeable
    two = np.broadcast_to(rng.random((1, 3, 257, 1)) < 0.5, shape)
    assert interpret._where_along_one_axis([two, operand(shape), operand(shape)], shape,
                                           dtype) is None
    x = rng.standard_normal((1, 3, 1, 5)).astype(F32)
    idx = [np.zeros((1, 1, 1, 1), np.int32), np.arange(3).reshape(1, 3, 1, 1),
           (np.arange(257) - 40).reshape(1, 1, 257, 1), np.arange(5).reshape(1, 1, 1, 5)]
    got = gather_numpy(x, idx, shape)
    assert got.strides[2] == 0  # a broadcast along the window's axis
    full = tuple(np.broadcast_to(i.clip(0, d - 1), shape) for i, d in zip(idx, x.shape))
    np.testing.assert_array_equal(got, x[full])


@pytest.mark.parametrize("dtype, value", [("float32", -np.inf), ("float32", 2.5), ("int32", -7),
                                          ("uint32", 3), ("bool", 1.0), ("float16", 0.0)])
def test_pad_gives_np_pad(dtype: str, value: float, rng: np.random.Generator) -> None:
    """The interpreter's pad (a filled array with x put in, not np.pad) gives np.pad's result,
    for every dtype, on views and on axes padded on one side, both or neither."""
    from fusec.ir import Eqn, Var

    x = (rng.standard_normal((3, 1, 4)) * 10).astype(dtype)
    for widths in [((0, 0), (2, 1), (0, 3)), ((1, 0), (0, 0), (0, 0)), ((0, 0),) * 3]:
        view = x.transpose(2, 1, 0)
        shape = tuple(lo + d + hi for d, (lo, hi) in zip(view.shape, widths))
        e = Eqn(Op.PAD, (), (Var(shape, dtype),), {"widths": widths, "value": value})
        got = interpret._eval_primitive(e, [view])
        want = np.pad(view, widths, constant_values=np.asarray(value).astype(dtype))
        assert got.dtype == want.dtype and got.flags.writeable
        np.testing.assert_array_equal(got, want)


def test_a_run_gives_the_bits_of_the_general_path_and_never_hands_out_a_literal(
        rng: np.random.Generator) -> None:
    """evaluate's loop runs float32 elementwise ops straight through their ufuncs, and
    movement ops as numpy views, from a plan made once per program, with one read-only array
    per literal kept for every run. Each run
    must give the bits the general path gives (the loop with timings, op by op through
    _eval_primitive), and an output that is a literal, or a view of one, must come back as an
    array of the caller's own: writing into it changes neither a later run nor the plan."""
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -3.5, 88.7, 1e30], F32)

    def f(x, s):
        y = fnp.exp(x * 0.5) - 1.0  # (large enough to write into dead operands)
        z = y / (x - 2.0) + s * 3.0  # s: 0-d, so s * 3.0 gives a 0-d result
        # (reshapes, transposes and broadcasts: views made in the loop itself too)
        t = y.reshape(3, 2003).T + fnp.broadcast_to(z[:3], (2003, 3))
        return z, fnp.maximum(z, 0.25) * y, fnp.full((3,), 7.0), fnp.zeros(()) + 4.0, t

    x = np.concatenate([special, rng.standard_normal(6000).astype(F32)])
    s = np.array(1.5, F32)
    assert x.size >= interpret._REUSE_MIN
    prog = fusec.gpu_jit(f).trace(x, s).ir
    general = evaluate(prog, [x, s], timings=[])
    for _ in range(2):
        got = evaluate(prog, [x.copy(), s])
        for g, w in zip(got, general):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(np.asarray(g).view(np.uint32),
                                          np.asarray(w).view(np.uint32))
        sevens, four = got[2], got[3]
        assert sevens.flags.writeable and np.asarray(four).flags.writeable
        sevens[:] = -1.0  # the caller's own arrays
        np.asarray(four)[...] = -1.0
    again = evaluate(prog, [x, s])
    np.testing.assert_array_equal(again[2], [7.0, 7.0, 7.0])
    assert again[4].shape == (2003, 3) and again[4].flags.writeable
    assert float(again[3]) == 4.0
    with np.errstate(all="ignore"):
        xd = x.astype(np.float64)
        yd = np.exp(xd * 0.5) - 1.0
        zd = yd / (xd - 2.0) + 4.5
        # exp(x / 2) - 1 cancels near 0: float32's error is relative to exp(x / 2), not to y
        bound = 8 * np.finfo(F32).eps * (np.exp(xd * 0.5) / np.abs(xd - 2.0) + np.abs(zd))
    both_nan = np.isnan(again[0]) & np.isnan(zd)
    assert both_nan.sum() == np.isnan(zd).sum()
    with np.errstate(invalid="ignore"):
        err = np.abs(again[0].astype(np.float64) - zd)
    ok = both_nan | (err <= bound) | (again[0] == zd)  # (infinities equal)
    assert ok.all(), x[~ok]
