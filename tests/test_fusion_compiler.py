"""Issue 3, "The fusion compiler": each acceptance line pinned by a test.

Every test names the acceptance line (or the scope item) it checks in its docstring:

* [A1] kernel counts for float32 (4096, 1024) unless stated (compile-only, through ShapeDtype);
* [A2] every fused program matches numpy (float64) and the unfused (``fuse=False``) run;
* [A3] memory planning: 6 sequential intermediates take pooled memory for at most 2 at a time;
  buffers persist across calls; donation;
* [S5] device limits: binding count and binding size;
* [S1] passes before/after on printed IR, and the pipeline order;
* [S6] inspection: ``FUSEC_DEBUG=5`` and ``lowered.as_text("ir")``.

The hypothesis acceptance line lives in test_hypothesis.py and the benchmark line in bench/.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any, Callable

import numpy as np
import pytest
from helpers import REPO, pythonpath

import fusec
import fusec.numpy as fnp
from fusec import interpret, nn
from fusec.ir import Eqn, Op, Program, Var
from fusec.passes import PIPELINE, cse, dce, simplify
from fusec.passes.fuse import ROW_MAX
from fusec.passes.split import CHUNK, SPLIT_MAX_OUTPUTS, SPLIT_MIN
from fusec.runtime import GpuExecutable, get_runtime

S = fusec.ShapeDtype

requires_gpu = pytest.mark.skipif(
    fusec.default_device().is_cpu_fallback,
    reason="needs a wgpu adapter (FUSEC_BACKEND=cpu runs the numpy interpreter)")


@pytest.fixture(params=["native", "gpu"])
def target(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a numeric test with the adapter's own kernel strategies ("native": "cpu" ones on
    lavapipe) and with the GPU strategies forced (what the H100/H200 runs: a workgroup per row,
    rows cached in registers, several elements per thread)."""
    fusec.config.set("target", None if request.param == "native" else request.param)
    try:
        yield request.param
    finally:
        fusec.config.set("target", None)


# --- helpers --------------------------------------------------------------------------------------


def kernel_eqns(prog: Program) -> list[Eqn]:
    return [e for e in prog.eqns if e.op is Op.KERNEL]


def body_ops(k: Eqn) -> set[str]:
    return {e.op.value for e in k.params["body"].eqns}


def bindings(k: Eqn) -> int:
    """Storage buffers one kernel binds: its body's inputs plus its outputs."""
    body: Program = k.params["body"]
    return len(body.inputs) + len(body.outputs)


def f32(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (scale * rng.uniform(-1.0, 1.0, shape)).astype(np.float32)


# float64 references
def ref_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def ref_log_softmax(x: np.ndarray) -> np.ndarray:
    s = x - x.max(axis=-1, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=-1, keepdims=True))


def ref_layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def ref_rms_norm(x: np.ndarray, g: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * g


def ref_gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def ref_center(x: np.ndarray) -> np.ndarray:
    return x - x.mean(axis=-1, keepdims=True)


def ref_mlp(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray,
            b2: np.ndarray) -> np.ndarray:
    return np.maximum(x @ w1 + b1, 0.0) @ w2 + b2


# --- the programs of the kernel-count acceptance line ---------------------------------------------


class Case:
    """A program of [A1]: its function, its float64 reference, its argument shapes (in terms of
    rows ``m``, row length ``n`` and, for matmuls, output width ``h``/``o``) and kernel count."""

    def __init__(self, fn: Callable[..., Any], ref: Callable[..., np.ndarray],
                 shapes: Callable[[int, int], list[tuple[int, ...]]], kernels: int,
                 big: tuple[int, int] = (4096, 1024)) -> None:
        self.fn, self.ref, self.shapes, self.kernels, self.big = fn, ref, shapes, kernels, big


def _row(m: int, n: int) -> list[tuple[int, ...]]:
    return [(m, n)]


CASES: dict[str, Case] = {
    "softmax": Case(lambda x: nn.softmax(x, axis=-1), ref_softmax, _row, 1),
    "log_softmax": Case(lambda x: nn.log_softmax(x, axis=-1), ref_log_softmax, _row, 1),
    "layer_norm": Case(lambda x, g, b: nn.layer_norm(x, g, b), ref_layer_norm,
                       lambda m, n: [(m, n), (n,), (n,)], 1),
    "rms_norm": Case(lambda x, g: nn.rms_norm(x, g), ref_rms_norm, lambda m, n: [(m, n), (n,)], 1),
    "center": Case(lambda x: x - fnp.mean(x, axis=-1, keepdims=True), ref_center, _row, 1),
    # x (m, n) @ w (n, n) + b: the kernel-count line uses x (512, 1024), w (1024, 1024)
    "gelu_linear": Case(lambda x, w, b: nn.gelu(x @ w + b),
                        lambda x, w, b: ref_gelu(x @ w + b),
                        lambda m, n: [(m, n), (n, n + 5), (n + 5,)], 1, big=(512, 1024)),
    "mlp": Case(lambda x, w1, b1, w2, b2: nn.relu(x @ w1 + b1) @ w2 + b2, ref_mlp,
                lambda m, n: [(m, n), (n, n + 3), (n + 3,), (n + 3, n - 1), (n - 1,)], 2),
}


def _big_specs(case: Case) -> list[Any]:
    m, n = case.big
    # the counted shapes: square weights as in the issue (w (1024, 1024))
    shapes = case.shapes(m, n)
    if len(shapes) > 1 and len(shapes[1]) == 2:
        shapes = [(m, n)] + [tuple(n for _ in s) for s in shapes[1:]]
    return [S(s) for s in shapes]


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_counts_at_4096x1024(name: str) -> None:
    """[A1] Kernel counts for float32 (4096, 1024): softmax, log_softmax, layer_norm, rms_norm,
    "x minus its row mean" 1 each; gelu(x @ w + b) with x (512, 1024), w (1024, 1024) 1; the MLP
    relu(x@w1+b1)@w2+b2 2."""
    case = CASES[name]
    specs = _big_specs(case)
    if name == "gelu_linear":
        assert [s.shape for s in specs] == [(512, 1024), (1024, 1024), (1024,)]
    else:
        assert specs[0].shape == (4096, 1024)
    lowered = fusec.gpu_jit(case.fn).lower(*specs)
    assert len(lowered.kernels) == case.kernels, lowered.as_text("ir")
    assert len(kernel_eqns(lowered.ir)) == case.kernels
    if case.kernels == 1:
        # one kernel and nothing between kernels: no intermediate buffer at all
        assert lowered.memory_analysis().intermediate_bytes == 0


def test_gelu_linear_is_one_matmul_kernel_with_the_gelu_in_its_epilogue() -> None:
    """[A1] nn.gelu(x @ w + b), x (512, 1024), w (1024, 1024): one kernel; its WGSL holds the
    epilogue's gelu (x / (1 + exp(-2u)): nn.gelu's form of the tanh approximation), and there is
    no intermediate buffer (memory_analysis)."""
    lowered = fusec.gpu_jit(lambda x, w, b: nn.gelu(x @ w + b)).lower(
        S((512, 1024)), S((1024, 1024)), S((1024,)))
    (k,) = kernel_eqns(lowered.ir)
    assert k.params["kind"] == "matmul"
    assert {"matmul", "add", "exp", "div"} <= body_ops(k)
    (code,) = lowered.kernels
    assert code.kind == "matmul"
    assert re.search(r"\bexp\(", code.wgsl), code.wgsl
    mem = lowered.memory_analysis()
    assert mem.intermediate_bytes == 0 and mem.intermediate_bytes_unplanned == 0
    assert mem.output_bytes == 512 * 1024 * 4


def test_mlp_is_two_matmul_kernels_with_fused_epilogues() -> None:
    """[A1] The MLP relu(x@w1+b1)@w2+b2 at (4096, 1024): 2 kernels, both matmuls (bias and relu
    in the first one's epilogue, the second bias in the second's)."""
    lowered = fusec.gpu_jit(CASES["mlp"].fn).lower(*_big_specs(CASES["mlp"]))
    ks = kernel_eqns(lowered.ir)
    assert [k.params["kind"] for k in ks] == ["matmul", "matmul"]
    assert {"matmul", "add", "max"} <= body_ops(ks[0])
    assert {"matmul", "add"} <= body_ops(ks[1])
    # the only intermediate is the hidden activation, which the second matmul reads
    assert lowered.memory_analysis().intermediate_bytes == 4096 * 1024 * 4


def _assert_multi_stage(prog: Program) -> None:
    """A reduce_partial kernel followed by a reduce kernel, all on the GPU: every top-level
    equation is a kernel and the output is the last kernel's result."""
    assert all(e.op is Op.KERNEL for e in prog.eqns), prog
    ks = kernel_eqns(prog)
    assert len(ks) == 2, prog
    assert "reduce_partial" in body_ops(ks[0]) and "exp" in body_ops(ks[0])
    assert body_ops(ks[1]) & {"sum"} and "reduce_partial" not in body_ops(ks[1])
    assert ks[1].inputs[0] is ks[0].outs[0]  # the second stage reads the partial sums
    (out,) = prog.outputs
    assert isinstance(out, Var) and out is ks[1].outs[0]


def test_exp_sum_of_2_pow_24_is_a_multi_stage_gpu_reduction() -> None:
    """[A1] fnp.exp(x).sum() over all elements of a 2^24 array: a multi-stage GPU reduction with
    no CPU step (reduce_partial kernel, then a reduce kernel that computes the output)."""
    lowered = fusec.gpu_jit(lambda x: fnp.exp(x).sum()).lower(S((2**24,)))
    _assert_multi_stage(lowered.ir)
    assert [k.kind for k in lowered.kernels] == ["reduce", "reduce"]


@requires_gpu
def test_multi_stage_reduction_runs_on_the_gpu_and_matches_numpy(
        rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, target: str) -> None:
    """[A1]/[A2] fnp.exp(x).sum() run for real at 2^18 + 3 elements (long enough to split, and not
    a multiple of the chunk): the same two-stage plan, executed by GpuExecutable with the numpy
    interpreter disabled, equal to numpy float64 and to the fuse=False run."""
    n = 2**18 + 3
    assert n >= SPLIT_MIN and n % CHUNK != 0 and SPLIT_MAX_OUTPUTS >= 1
    x = f32(rng, n)
    f = fusec.gpu_jit(lambda a: fnp.exp(a).sum())
    compiled = f.warmup(x)
    _assert_multi_stage(compiled.ir)
    assert isinstance(compiled.executable, GpuExecutable)

    def no_cpu(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the numpy interpreter ran during a GPU call")

    monkeypatch.setattr(interpret, "evaluate", no_cpu)
    out = f(x)
    # the result is a device buffer written by the last kernel, not a host value
    assert out._host is None and out._buffer is not None
    monkeypatch.undo()
    want = np.exp(x.astype(np.float64)).sum()
    got = float(np.asarray(out))
    assert got == pytest.approx(want, rel=1e-5)
    unfused = float(np.asarray(fusec.gpu_jit(lambda a: fnp.exp(a).sum(), fuse=False)(x)))
    assert got == pytest.approx(unfused, rel=1e-5)


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layer_norm", "rms_norm", "center"])
def test_rows_up_to_row_max_are_one_kernel_longer_rows_two(name: str) -> None:
    """[A1] Row-wise reductions broadcast back over the row are one kernel for rows up to
    fusec.passes.fuse.ROW_MAX elements; longer rows fall back to a two-kernel plan."""
    case = CASES[name]
    one = fusec.gpu_jit(case.fn).lower(*[S(s) for s in case.shapes(3, ROW_MAX)])
    assert len(one.kernels) == 1, one.as_text("ir")
    two = fusec.gpu_jit(case.fn).lower(*[S(s) for s in case.shapes(3, ROW_MAX + 1)])
    assert len(two.kernels) == 2, two.as_text("ir")
    # statistics first (a reduce kernel), then the elementwise pass over the row
    assert [k.kind for k in two.kernels] == ["reduce", "elementwise"]
    assert 0 < two.memory_analysis().intermediate_bytes <= 2 * 3 * 4


# --- [A2] fused programs match numpy and the unfused run ------------------------------------------


def _run_case(case: Case, m: int, n: int, rng: np.random.Generator) -> None:
    shapes = case.shapes(m, n)
    args = []
    for i, s in enumerate(shapes):
        # weights scaled by 1/sqrt(fan-in) keep matmul outputs O(1); norm weights and biases O(1)
        scale = 1.0 / math.sqrt(s[0]) if i > 0 and len(s) == 2 else (3.0 if i == 0 else 1.0)
        args.append(f32(rng, *s, scale=scale))
    fused = fusec.gpu_jit(case.fn)
    unfused = fusec.gpu_jit(case.fn, fuse=False)
    n_fused = len(fused.lower(*args).kernels)
    n_unfused = len(unfused.lower(*args).kernels)
    if n <= ROW_MAX:
        assert n_fused == case.kernels
    assert n_unfused > n_fused  # the comparison is between two different plans
    got = np.asarray(fused(*args))
    base = np.asarray(unfused(*args))
    want = case.ref(*[a.astype(np.float64) for a in args])
    assert got.shape == base.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(got, base, rtol=1e-4, atol=2e-5)


ROW_SHAPES = [(64, 1000), (7, 333), (5, 1), (3, 4097)]


@requires_gpu
@pytest.mark.parametrize("shape", ROW_SHAPES, ids=[f"{m}x{n}" for m, n in ROW_SHAPES])
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layer_norm", "rms_norm", "center"])
def test_fused_rows_match_numpy_and_unfused(name: str, shape: tuple[int, int],
                                            rng: np.random.Generator, target: str) -> None:
    """[A2] Every fused row program (softmax, log_softmax, layer_norm, rms_norm, x minus its row
    mean) matches numpy (float64) and the fuse=False run, at (64, 1000) and odd row lengths."""
    _run_case(CASES[name], *shape, rng)


MM_SHAPES = [(64, 200), (33, 77), (1, 5)]


@requires_gpu
@pytest.mark.parametrize("shape", MM_SHAPES, ids=[f"{m}x{n}" for m, n in MM_SHAPES])
@pytest.mark.parametrize("name", ["gelu_linear", "mlp"])
def test_fused_matmul_epilogues_match_numpy_and_unfused(
        name: str, shape: tuple[int, int], rng: np.random.Generator, target: str) -> None:
    """[A2] gelu(x @ w + b) and the MLP relu(x@w1+b1)@w2+b2, fused into matmul epilogues, match
    numpy (float64) and the fuse=False run; odd sizes included."""
    _run_case(CASES[name], *shape, rng)


@requires_gpu
@pytest.mark.parametrize("name", ["softmax", "layer_norm", "center"])
def test_long_rows_two_kernel_plan_matches_numpy_and_unfused(
        name: str, rng: np.random.Generator, target: str) -> None:
    """[A1]/[A2] Rows longer than ROW_MAX (softmax over (4, 20000)) take the two-kernel plan and
    still match numpy and the fuse=False run."""
    case = CASES[name]
    assert 20000 > ROW_MAX
    lowered = fusec.gpu_jit(case.fn).lower(*[S(s) for s in case.shapes(4, 20000)])
    assert len(lowered.kernels) == 2
    _run_case(case, 4, 20000, rng)


# --- [A3] memory planning -------------------------------------------------------------------------

N = 64
ONE = N * N * 4  # bytes of one (64, 64) float32 intermediate


def tanh_chain(x, w1, w2, w3, w4, w5, w6, w7):
    """Seven matmuls: each result (tanh'ed in the epilogue) is the next matmul's operand, which
    is always materialised, so the 6 intermediates cannot fuse."""
    h = x
    for w in (w1, w2, w3, w4, w5, w6, w7):
        h = fnp.tanh(h @ w)
    return h


def tanh_chain_np(x, *ws):
    h = x
    for w in ws:
        h = np.tanh(h @ w)
    return h


def softmax_chain(x, w1, w2, w3, w4):
    """Matmuls alternating with column softmaxes (a reduction stops the matmul epilogue): mm,
    sm, mm, sm, mm, sm are the 6 intermediates, the fourth matmul the output. (Along columns:
    a row softmax into a matmul is attention, one kernel: tests/test_attention.py.)"""
    h = x
    for w in (w1, w2, w3):
        h = nn.softmax(h @ w, axis=0)
    return h @ w4


def softmax_chain_np(x, w1, w2, w3, w4):
    h = x
    for w in (w1, w2, w3):
        h = ref_softmax((h @ w).T).T
    return h @ w4


CHAINS = {"tanh_chain": (tanh_chain, tanh_chain_np, 8),
          "softmax_chain": (softmax_chain, softmax_chain_np, 5)}


@pytest.mark.parametrize("name", list(CHAINS))
def test_six_sequential_intermediates_take_memory_for_two(name: str) -> None:
    """[A3] A program with 6 sequential intermediates that cannot fuse (alternating matmuls)
    allocates intermediate memory for at most 2 of them at a time (memory_analysis shows it);
    the kernels' slots show the reuse."""
    fn, _, n_args = CHAINS[name]
    lowered = fusec.gpu_jit(fn).lower(*[S((N, N))] * n_args)
    ks = kernel_eqns(lowered.ir)
    assert len(ks) == 7, lowered.as_text("ir")
    mem = lowered.memory_analysis()
    assert mem.intermediate_bytes_unplanned == 6 * ONE
    assert mem.intermediate_bytes <= 2 * ONE
    assert mem.output_bytes == ONE
    slots = [s for k in ks for s in k.params["slots"]]
    pooled = [s for s in slots if s.startswith("p")]
    assert len(pooled) == 6 and len(set(pooled)) <= 2, slots
    assert slots[-1] == "new"  # the output escapes to the caller: a fresh buffer
    # liveness: a kernel never writes the pooled buffer it reads
    slot_of = {id(o): s for k in ks for o, s in zip(k.outs, k.params["slots"])}
    for k in ks:
        read = {slot_of[id(a)] for a in k.inputs if id(a) in slot_of}
        assert not read & set(k.params["slots"]), lowered.as_text("ir")


@requires_gpu
@pytest.mark.parametrize("name", list(CHAINS))
def test_pooled_buffers_persist_across_calls_and_results_stay_correct(
        name: str, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """[A3] Buffers persist across calls of the same executable (no allocation per call but the
    output's), and the results are correct on both calls."""
    fn, ref, n_args = CHAINS[name]
    ws = [fusec.device_put(f32(rng, N, N, scale=2.0 / math.sqrt(N))) for _ in range(n_args - 1)]
    xs = [fusec.device_put(f32(rng, N, N)) for _ in range(2)]
    f = fusec.gpu_jit(fn)
    compiled = f.warmup(xs[0], *ws)
    rt = get_runtime()
    assert rt is not None
    allocations: list[int] = []
    real = rt.buffer_of_class  # every device buffer comes from here (pool or new)

    def counting(size: int) -> Any:
        allocations.append(size)
        return real(size)

    monkeypatch.setattr(rt, "buffer_of_class", counting)
    first = f(xs[0], *ws)
    pool = dict(compiled.executable.pool)
    assert len(pool) <= 2
    assert len(allocations) == len(pool) + 1  # the pooled intermediates, then the output
    allocations.clear()
    second = f(xs[1], *ws)
    assert allocations == [rt._size_class(ONE)]  # only the output: pooled buffers are reused
    assert {k: id(v) for k, v in compiled.executable.pool.items()} == {
        k: id(v) for k, v in pool.items()}
    wd = [np.asarray(w, dtype=np.float64) for w in ws]
    for x, out in zip(xs, (first, second)):
        want = ref(np.asarray(x, dtype=np.float64), *wd)
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-4, atol=1e-5)
    assert not np.allclose(np.asarray(first), np.asarray(second))


@requires_gpu
def test_donated_input_buffer_holds_the_output(rng: np.random.Generator) -> None:
    """[A3] donate_argnums lets an output reuse a donated input's buffer: an elementwise update
    writes in place (the lowered kernel is ``inplace``, memory_analysis reports donated reuse, and
    the output Array owns the donated input's buffer)."""
    f = fusec.gpu_jit(lambda x, y: x * 2.0 + y, donate_argnums=(0,))
    xh, yh = f32(rng, 1000), f32(rng, 1000)
    x = fusec.device_put(xh)
    lowered = f.lower(x, yh)
    (k,) = kernel_eqns(lowered.ir)
    assert k.params["slots"] == ("in0",)
    assert k.params["inplace"] == ((0, 0),)
    mem = lowered.memory_analysis()
    assert mem.donated_bytes_reused == 1000 * 4 and mem.output_bytes == 0
    buf = x._buffer
    assert buf is not None
    out = f(x, yh)
    assert out._buffer is buf
    np.testing.assert_allclose(np.asarray(out), xh * 2.0 + yh, rtol=1e-6)
    # without donation the output is a fresh buffer and the input survives
    g = fusec.gpu_jit(lambda x, y: x * 2.0 + y)
    x2 = fusec.device_put(xh)
    assert g.lower(x2, yh).memory_analysis().donated_bytes_reused == 0
    assert g(x2, yh)._buffer is not x2._buffer
    np.testing.assert_array_equal(np.asarray(x2), xh)


@requires_gpu
def test_using_a_donated_array_afterwards_raises(rng: np.random.Generator) -> None:
    """[A3] Using a donated array afterwards raises a clear error (FusecError naming donation)."""
    f = fusec.gpu_jit(lambda x: fnp.exp(x) - 1.0, donate_argnums=(0,))
    x = fusec.device_put(f32(rng, 64))
    out = f(x)
    assert x.is_deleted
    with pytest.raises(fusec.FusecError, match="donated"):
        np.asarray(x)
    with pytest.raises(fusec.FusecError, match="donated"):
        f(x)
    with pytest.raises(fusec.FusecError, match="donated"):
        fusec.gpu_jit(lambda a: a + 1.0)(x)
    assert np.asarray(out).shape == (64,)  # the output is fine


@requires_gpu
def test_same_array_donated_and_not_donated_is_refused(rng: np.random.Generator) -> None:
    """[A3] Passing the same array as a donated and a non-donated argument raises a clear error
    naming the argument, and leaves the array usable."""
    f = fusec.gpu_jit(lambda x, y: x + y, donate_argnums=(0,))
    zh = f32(rng, 16)
    z = fusec.device_put(zh)
    with pytest.raises(fusec.FusecError, match=r"'x' is donated.*also passed"):
        f(z, z)
    assert not z.is_deleted
    np.testing.assert_array_equal(np.asarray(z), zh)


# --- [S5] device limits ---------------------------------------------------------------------------


def sum12(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11):
    return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11


@requires_gpu
def test_binding_limit_of_8_splits_a_twelve_input_sum(rng: np.random.Generator,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """[S5] With FUSEC_MAX_STORAGE_BUFFERS=8, a sum of 12 different inputs lowers to kernels that
    each bind at most 8 storage buffers (fusion splits the group rather than failing), and the
    result matches numpy."""
    args = [f32(rng, 37, 11) for _ in range(12)]
    unlimited = fusec.gpu_jit(sum12).lower(*args)
    monkeypatch.setenv("FUSEC_MAX_STORAGE_BUFFERS", "8")
    rt = get_runtime()
    assert rt is not None and rt.max_bindings == 8
    f = fusec.gpu_jit(sum12)
    lowered = f.lower(*args)
    ks = kernel_eqns(lowered.ir)
    assert len(ks) >= 2, lowered.as_text("ir")
    assert all(bindings(k) <= 8 for k in ks), [bindings(k) for k in ks]
    for k, code in zip(ks, lowered.kernels):
        assert code.n_inputs + code.n_outputs == bindings(k)
        assert code.wgsl.count("@binding(") == bindings(k)
    # every input is read by some kernel
    read = {id(a) for k in ks for a in k.inputs}
    assert all(id(v) in read for v in lowered.ir.inputs)
    if rt.info.limits.get("max-storage-buffers-per-shader-stage", 0) >= 13:
        assert len(unlimited.kernels) == 1  # the device's real limit lets it be one kernel
    want = np.sum([a.astype(np.float64) for a in args], axis=0)
    np.testing.assert_allclose(np.asarray(f(*args)), want, rtol=1e-5, atol=1e-5)


def scaled_norms(x, g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10):
    """A row kernel (layer_norm, then a softmax of it) with 11 side inputs in its epilogue."""
    y = nn.layer_norm(x)
    for g in (g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10):
        y = y * g
    return y, nn.softmax(y * g0, axis=-1).sum(axis=-1)


@requires_gpu
def test_binding_limit_of_8_splits_reduction_kernels_too(rng: np.random.Generator,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         target: str) -> None:
    """[S5] The binding limit also splits a fused reduction kernel (a layer_norm and softmax
    whose epilogue reads 11 weight vectors): every kernel binds <= 8 buffers and the results
    match numpy."""
    monkeypatch.setenv("FUSEC_MAX_STORAGE_BUFFERS", "8")
    x = f32(rng, 9, 300, scale=3.0)
    gs = [(1.0 + 0.5 * f32(rng, 300)) for _ in range(11)]
    f = fusec.gpu_jit(scaled_norms)
    ks = kernel_eqns(f.lower(x, *gs).ir)
    assert len(ks) >= 2 and all(bindings(k) <= 8 for k in ks), [bindings(k) for k in ks]
    y, s = f(x, *gs)
    want_y = ref_layer_norm(x.astype(np.float64), np.ones(300), np.zeros(300))
    for g in gs:
        want_y = want_y * g
    np.testing.assert_allclose(np.asarray(y), want_y, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(s), ref_softmax(want_y * gs[0]).sum(axis=-1),
                               rtol=1e-5)


@requires_gpu
def test_array_above_the_max_binding_size_raises_at_lower_time() -> None:
    """[S5] An array larger than the device's max storage buffer binding size raises a clear
    DeviceLimitError at lower time, never a wrong answer."""
    limit = int(fusec.default_device().limits["max-storage-buffer-binding-size"])
    n = 1024
    rows = limit // (4 * n) + 1  # (rows, n) float32 is just over the limit
    assert rows * n * 4 > limit
    f = fusec.gpu_jit(lambda x: nn.softmax(x, axis=-1))
    with pytest.raises(fusec.DeviceLimitError) as info:
        f.lower(S((rows, n)))
    msg = str(info.value)
    assert "'x'" in msg and str(limit) in msg and str(rows * n * 4) in msg
    assert len(f.lower(S((rows - 1, n))).kernels) == 1  # just under the limit lowers fine


# --- [S1] passes: before/after on printed IR ------------------------------------------------------


def _ir(fn: Callable[..., Any], *specs: Any) -> Program:
    return fusec.gpu_jit(fn).trace(*specs).ir


def _text(s: str) -> str:
    return textwrap.dedent(s).strip("\n")


X4 = S((4,))

SIMPLIFY_CASES = {
    "x*1": (lambda x: fnp.exp(x * 1.0), """
        { lambda a:f32[4] .
            b:f32[4] = exp a
          in (b) }"""),
    "1*x": (lambda x: fnp.exp(1.0 * x), """
        { lambda a:f32[4] .
            b:f32[4] = exp a
          in (b) }"""),
    "x+0": (lambda x: fnp.exp(x + 0.0), """
        { lambda a:f32[4] .
            b:f32[4] = exp a
          in (b) }"""),
    "0+x": (lambda x: fnp.exp(0.0 + x), """
        { lambda a:f32[4] .
            b:f32[4] = exp a
          in (b) }"""),
    "x-0": (lambda x: fnp.exp(x - 0.0), """
        { lambda a:f32[4] .
            b:f32[4] = exp a
          in (b) }"""),
    "x/1": (lambda x: fnp.exp(x / 1.0), """
        { lambda a:f32[4] .
            b:f32[4] = exp a
          in (b) }"""),
    # -(-x): the outer neg becomes x; the inner one is now dead and left for dce
    "-(-x)": (lambda x: fnp.exp(-(-x)), """
        { lambda a:f32[4] .
            b:f32[4] = neg a
            c:f32[4] = exp a
          in (c) }"""),
    "fold": (lambda x: x * (fnp.sqrt(4.0) + fnp.multiply(2.0, 3.0)), """
        { lambda a:f32[4] .
            b:f32[4] = mul a 8.0:f32
          in (b) }"""),
    "fold_unary": (lambda x: x + fnp.maximum(fnp.negative(1.0), fnp.exp(0.0)), """
        { lambda a:f32[4] .
            b:f32[4] = add a 1.0:f32
          in (b) }"""),
    # not identities: x * 2, x + 1, x * 0 (NaN * 0 is NaN) stay
    "kept": (lambda x: (x * 2.0 + 1.0) * 0.0, """
        { lambda a:f32[4] .
            b:f32[4] = mul a 2.0:f32
            c:f32[4] = add b 1.0:f32
            d:f32[4] = mul c 0.0:f32
          in (d) }"""),
}

SIMPLIFY_BEFORE = {
    "x*1": """
        { lambda a:f32[4] .
            b:f32[4] = mul a 1.0:f32
            c:f32[4] = exp b
          in (c) }""",
    "-(-x)": """
        { lambda a:f32[4] .
            b:f32[4] = neg a
            c:f32[4] = neg b
            d:f32[4] = exp c
          in (d) }""",
    "fold": """
        { lambda a:f32[4] .
            b:f32[] = sqrt 4.0:f32
            c:f32[] = mul 2.0:f32 3.0:f32
            d:f32[] = add b c
            e:f32[4] = mul a d
          in (e) }""",
}


@pytest.mark.parametrize("name", list(SIMPLIFY_CASES))
def test_simplify_before_after(name: str) -> None:
    """[S1] Algebraic simplification and constant folding, before/after on printed IR: x*1, 1*x,
    x+0, 0+x, x-0, x/1, -(-x) become x; literal-only arithmetic is computed at compile time."""
    fn, after = SIMPLIFY_CASES[name]
    prog = _ir(fn, X4)
    if name in SIMPLIFY_BEFORE:
        assert str(prog) == _text(SIMPLIFY_BEFORE[name])
    before = str(prog)
    assert str(simplify(prog)) == _text(after)
    assert str(prog) == before  # a pure function: its input is untouched


def test_simplify_keeps_rewrites_that_would_change_shape() -> None:
    """[S1] An identity applies only when the result has x's shape: a (1,) + zeros (4,) add
    broadcasts and stays."""
    prog = _ir(lambda x, z: x * 1.0 + z, S((1,)), S((4,)))
    assert str(simplify(prog)) == _text("""
        { lambda a:f32[1] b:f32[4] .
            c:f32[4] = add a b
          in (c) }""")


def test_simplify_then_dce_removes_the_double_negation_entirely() -> None:
    """[S1] -(-x) after simplify and dce: no neg left at all."""
    prog = dce(simplify(_ir(lambda x: fnp.exp(-(-x)) * 1.0, X4)))
    assert str(prog) == _text("""
        { lambda a:f32[4] .
            b:f32[4] = exp a
          in (b) }""")


def test_cse_before_after() -> None:
    """[S1] Common-subexpression elimination: the same subexpression written twice is computed
    once (before/after on printed IR)."""
    prog = _ir(lambda x, y: fnp.exp(x * y) + fnp.exp(x * y), X4, X4)
    assert str(prog) == _text("""
        { lambda a:f32[4] b:f32[4] .
            c:f32[4] = mul a b
            d:f32[4] = exp c
            e:f32[4] = mul a b
            f:f32[4] = exp e
            g:f32[4] = add d f
          in (g) }""")
    assert str(cse(prog)) == _text("""
        { lambda a:f32[4] b:f32[4] .
            c:f32[4] = mul a b
            d:f32[4] = exp c
            e:f32[4] = add d d
          in (e) }""")


def test_cse_distinguishes_params_and_operands() -> None:
    """[S1] CSE merges only equal op, params and operands: sums over different axes, or of
    different arrays, stay; a repeated one is shared, outputs included."""
    prog = _ir(lambda x, y: (x.sum(axis=0), x.sum(axis=1), x.sum(axis=0), y.sum(axis=0)),
               S((3, 4)), S((3, 4)))
    assert str(cse(prog)) == _text("""
        { lambda a:f32[3,4] b:f32[3,4] .
            c:f32[4] = sum axes=(0,) a
            d:f32[3] = sum axes=(1,) a
            e:f32[4] = sum axes=(0,) b
          in (c, d, c, e) }""")


def test_cse_shares_work_inside_the_fused_kernel() -> None:
    """[S1] After the whole pipeline, the subexpression written twice appears once in the kernel
    body."""
    lowered = fusec.gpu_jit(lambda x, y: fnp.exp(x * y) + fnp.exp(x * y)).lower(X4, X4)
    (k,) = kernel_eqns(lowered.ir)
    ops = [e.op.value for e in k.params["body"].eqns]
    assert ops.count("exp") == 1 and ops.count("mul") == 1


def test_pipeline_order() -> None:
    """[S1] fusec.passes.PIPELINE lists simplify, cse, dce, the float16 widening, the merge of
    products sharing an operand, the attention and quantized-product rewrites, the fold of a
    normalisation into a quantized product, the lowerings
    of the primitives computed by kernels of their own kind (scatter, scan, sort),
    split_reductions, split_k, prepare_loops (loop bodies lowered on their own), fuse,
    plan_memory, and the fold of a cache update into the attention kernel after it, in that
    order."""
    assert [name for name, _ in PIPELINE] == [
        "simplify", "cse", "dce", "widen_float16", "merge_products", "attention", "quant",
        "fold_rms_norm", "lower_scatter",
        "lower_scan", "lower_sort", "split_reductions", "split_k", "prepare_loops", "fuse",
        "plan_memory", "fold_cache_update"]


# --- [S6] inspection ------------------------------------------------------------------------------

PASS_NAMES = [name for name, _ in PIPELINE]


def _pass_headers(text: str) -> list[str]:
    return re.findall(r"IR after (\w+):", text)


def test_debug_5_prints_the_ir_after_every_pass(capsys: pytest.CaptureFixture[str]) -> None:
    """[S6] FUSEC_DEBUG=5 (here fusec.config.set("debug", 5)) prints the IR after every pass: one
    "IR after <pass>" block per pass, in pipeline order, each followed by its program."""
    capsys.readouterr()
    fusec.config.set("debug", 5)
    try:
        fusec.gpu_jit(lambda x: nn.softmax(x * 1.0, axis=-1)).lower(S((8, 16)))
    finally:
        fusec.config.set("debug", None)
    err = capsys.readouterr().err
    assert _pass_headers(err) == PASS_NAMES, err
    blocks = re.split(r"fusec: IR after \w+:\n", err)[1:]
    for name, block in zip(PASS_NAMES, blocks):
        assert block.startswith("{ lambda a:f32[8,16] ."), (name, block)
    # the mul by 1 is gone from the first block on; kernels appear from fuse on
    assert "mul" not in blocks[0].split(" in ")[0]
    n_before_fuse = PASS_NAMES.index("fuse")
    after = len(PASS_NAMES) - n_before_fuse
    assert [("= kernel" in b) for b in blocks] == [False] * n_before_fuse + [True] * after
    memory = PASS_NAMES.index("plan_memory")
    assert "slots=" in blocks[memory] and "slots=" not in blocks[memory - 1]
    # below level 5, no per-pass IR
    fusec.config.set("debug", 4)
    try:
        fusec.gpu_jit(lambda x: x + 1.0).lower(S((8,)))
    finally:
        fusec.config.set("debug", None)
    assert _pass_headers(capsys.readouterr().err) == []




def test_fusec_debug_environment_variable_in_a_subprocess() -> None:
    """[S6] The environment variable itself: FUSEC_DEBUG=5 in a fresh process prints one
    "IR after <pass>" block per pass on stderr."""
    code = textwrap.dedent("""
        import fusec
        from fusec import nn
        fusec.gpu_jit(lambda x, g, b: nn.layer_norm(x, g, b)).lower(
            fusec.ShapeDtype((4, 8)), fusec.ShapeDtype((8,)), fusec.ShapeDtype((8,)))
    """)
    env = {**os.environ, "FUSEC_DEBUG": "5", "PYTHONPATH": pythonpath(),
           "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp")}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert _pass_headers(p.stderr) == PASS_NAMES, p.stderr
    assert "1 kernel(s)" in p.stderr  # level 1 is included


def _kernels_from_text(text: str) -> dict[str, list[str]]:
    """Parse as_text("ir"): each top-level kernel line with the ops of its nested body."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        top = re.match(r"^ {4}\S.* = kernel .*\bname=(\w+)", line)
        if top:
            current = found.setdefault(top.group(1), [])
            continue
        nested = re.match(r"^ {12}\S.* = (\w+)", line)
        if nested and current is not None:
            current.append(nested.group(1))
    return found


def test_as_text_ir_shows_which_ops_went_into_which_kernel() -> None:
    """[S6] lowered.as_text("ir") shows which ops went into which kernel: one kernel line per
    kernel, each with its nested body of ops."""
    def f(x, w1, b1, w2, g):
        h = nn.relu(x @ w1 + b1) @ w2
        return nn.rms_norm(h, g)

    lowered = fusec.gpu_jit(f).lower(S((8, 16)), S((16, 32)), S((32,)), S((32, 12)), S((12,)))
    text = lowered.as_text("ir")
    assert text == str(lowered.ir)
    ks = _kernels_from_text(text)
    assert list(ks) == [k.name for k in lowered.kernels]
    assert len(ks) == len(kernel_eqns(lowered.ir)) >= 2
    first, *rest = ks.values()
    assert {"matmul", "add", "max"} <= set(first)
    assert any("matmul" in ops for ops in rest)
    norm = next(ops for ops in rest if "sum" in ops)
    assert {"mul", "sum", "rsqrt"} <= set(norm)
    # every primitive of the program is in exactly one kernel body (nothing at the top level)
    assert all(e.op is Op.KERNEL for e in lowered.ir.eqns)
    assert sum(len(ops) for ops in ks.values()) == sum(
        len(k.params["body"].eqns) for k in kernel_eqns(lowered.ir))


def test_matmul_group_whose_first_root_is_elementwise() -> None:
    """A matmul kernel that took in an elementwise group placed before the product (here exp(a),
    the operand of two products and an output's factor) lists that group's root first; a later
    merge asked codegen for the matmul shape of that root (ValueError: found by autodiff's
    random programs, whose jvp and vjp of one function trace such shapes)."""
    rng = np.random.default_rng(5)
    a, b, c, d, e = (rng.standard_normal((4, 4)).astype(np.float32) for _ in range(5))

    def f(a, b, c, d, e):
        j = fnp.exp(a)
        return (b @ c) * j, e @ j + d @ (d * j)

    got = fusec.gpu_jit(f)(a, b, c, d, e)
    j = np.exp(a.astype(np.float64))
    np.testing.assert_allclose(np.asarray(got[0]), (b @ c) * j, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got[1]), e @ j + d @ (d * j), rtol=1e-5, atol=1e-5)


def test_a_kernel_never_reads_a_reshape_alias_of_its_own_output() -> None:
    # found by hypothesis: merging h's elementwise work into the sum's kernel made that kernel
    # read f, a reshape (kept outside kernels) of its own output d: a cycle between kernels
    def program(x0):  # type: ignore[no-untyped-def]
        v1 = fnp.sum(x0 > x0, axis=None)
        v2 = fnp.reshape(v1, (1,))
        v3 = fnp.reshape(v2, ())
        return -v3 + v1, v2, v3

    x = np.array([0.5, -1.0, 2.0], np.float32)
    h, e, f = fusec.gpu_jit(program)(x)
    assert int(np.asarray(h)) == 0 and np.asarray(e).tolist() == [0] and int(np.asarray(f)) == 0

    def program2(x):  # type: ignore[no-untyped-def]
        d = fnp.sum(x)
        f = fnp.reshape(fnp.reshape(d, (1,)), ())
        return f * 2.0 + d, f

    h2, f2 = fusec.gpu_jit(program2)(x)
    np.testing.assert_allclose(np.asarray(h2), 3 * x.sum(), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(f2), x.sum(), rtol=1e-6)
