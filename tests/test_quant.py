"""Quantized weights (fusec.quant): GGUF's q4_1 and q8_0 layouts, their dequantisation, and
products whose dequantisation runs in the product's kernel (fusec.passes.quant,
fusec.kernels.quant). Against float64 numpy on the dequantised matrix, on odd sizes, both
targets' kernels, NaN in x, views of x, the interpreter, and the errors users meet."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from helpers import forced_target, subgroup_level

import fusec
import fusec.numpy as fnp
from fusec import quant
from fusec.errors import DTypeError, ShapeError
from fusec.interpret import evaluate
from fusec.ir import Op
from fusec.kernels import quant as quant_kernels
from fusec.passes import Options, run_pipeline

REPO = Path(__file__).resolve().parent.parent
FORMATS = ("q4_1", "q8_0")
GGUF_TYPE = {"q4_1": gguf.GGMLQuantizationType.Q4_1, "q8_0": gguf.GGMLQuantizationType.Q8_0}


def _dot_error(x: np.ndarray, wd: np.ndarray) -> np.ndarray:
    """Bound on float32's error in x @ wd.T against float64: gamma_(k+2) * (|x| @ |wd|.T), k
    products summed, each weight dequantised in float32 (two more roundings)."""
    k = x.shape[-1] + 2
    u = 2.0 ** -24
    return k * u / (1 - k * u) * (np.abs(x).astype(np.float64) @ np.abs(wd).T)


def _weights(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """Rows of different scales (so that the f16 scales differ), some blocks constant."""
    w = rng.standard_normal((n, k)) * rng.uniform(0.05, 4.0, (n, 1))
    if n > 2:
        w[1, :32] = 0.0  # d = 0
        w[2, :32] = -1.25  # max == min
    return w.astype(np.float32)


def _kinds(lowered: Any) -> list[tuple[str, str]]:
    return [(k.kind, k.name) for k in lowered.kernels]


def _qmatmuls(lowered: Any) -> int:
    return sum(1 for kind, name in _kinds(lowered) if kind == "quant" and "qmatmul" in name)


def _check_product(got: np.ndarray, x: np.ndarray, w: np.ndarray) -> None:
    """float32 accumulation of K products against float64: K roundings of |x||w| at most."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    ref = x64 @ w64.T
    bound = np.abs(x64) @ np.abs(w64).T * (x.shape[-1] * 2.0 ** -23) + 1e-30
    err = np.abs(got.astype(np.float64) - ref)
    assert (err <= bound).all(), f"max error {err.max()} over bound {bound[err > bound].min()}"


# --- layout: GGUF bytes, quantize, reference dequantisation ---------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_gguf_bytes_round_trip_against_gguf(fmt: str, rng: np.random.Generator) -> None:
    w = _weights(rng, 13, 96)
    raw = gguf.quants.quantize(w, GGUF_TYPE[fmt])  # uint8 (13, 3 * bytes per block)
    q = quant.from_gguf(raw, fmt, w.shape)
    assert q.data.dtype == np.uint32 and q.data.shape == (13, 3 * quant.WORDS[fmt])
    want = gguf.quants.dequantize(raw, GGUF_TYPE[fmt])
    np.testing.assert_array_equal(quant.dequantize_numpy(q), want)
    # our quantizer rounds as the reference one: the same words
    np.testing.assert_array_equal(quant.quantize(w, fmt).data, q.data)
    # raw bytes flattened (any shape with the right count) give the same matrix
    np.testing.assert_array_equal(quant.from_gguf(raw.reshape(-1), fmt, w.shape).data, q.data)


@pytest.mark.parametrize("fmt", FORMATS)
def test_layout_by_hand(fmt: str) -> None:
    """One block built byte by byte as the GGUF layout says."""
    d, m = np.float16(0.5), np.float16(-3.0)
    if fmt == "q4_1":
        q = np.arange(32) % 16
        nib = (q[:16] | (q[16:] << 4)).astype(np.uint8)
        raw = np.concatenate([np.array([d]).view(np.uint8), np.array([m]).view(np.uint8), nib])
        want = 0.5 * q - 3.0
        words0 = int(np.array([d]).view(np.uint16)[0]) | int(np.array([m]).view(np.uint16)[0]) << 16
    else:
        q = np.arange(-16, 16, dtype=np.int8) * 4 + 3
        raw = np.concatenate([np.array([d]).view(np.uint8), q.view(np.uint8)])
        want = 0.5 * q.astype(np.float64)
        words0 = int(np.array([d]).view(np.uint16)[0])
    qm = quant.from_gguf(raw[None, :], fmt, (1, 32))
    assert int(qm.data[0, 0]) == words0
    assert int(qm.data[0, 1]) == int.from_bytes(raw[4:8].tobytes() if fmt == "q4_1"
                                                else raw[2:6].tobytes(), "little")
    np.testing.assert_array_equal(quant.dequantize_numpy(qm), want.astype(np.float32)[None])


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_error_is_within_half_a_step(fmt: str, rng: np.random.Generator) -> None:
    w = _weights(rng, 9, 64)
    back = quant.dequantize_numpy(quant.quantize(w, fmt)).astype(np.float64)
    blocks = w.reshape(9, 2, 32).astype(np.float64)
    if fmt == "q4_1":
        step = (blocks.max(-1) - blocks.min(-1)) / 15
    else:
        step = np.abs(blocks).max(-1) / 127
    # half a step, plus the f16 roundings of the scale (and the minimum)
    tol = step[..., None] * 0.5 + np.abs(blocks).max(-1, keepdims=True) * 2e-3 + 1e-6
    assert (np.abs(back.reshape(9, 2, 32) - blocks) <= tol).all()


# --- dequantize on the device ---------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_eager_and_jit(fmt: str, rng: np.random.Generator) -> None:
    words = rng.integers(0, 2 ** 32, size=(5, 3 * quant.WORDS[fmt]), dtype=np.uint64)
    words = words.astype(np.uint32)
    words[:, :: quant.WORDS[fmt]] &= np.uint32(0x3BFF3BFF)  # finite f16 scales (|d|, |m| < 1)
    if fmt == "q8_0":
        words[:, :: quant.WORDS[fmt]] &= np.uint32(0xFFFF)
    q = quant.QuantizedMatrix(fmt, (5, 96), words)
    want = quant.dequantize_numpy(q)
    assert np.isfinite(want).all() and len(np.unique(want)) > 50
    np.testing.assert_array_equal(np.asarray(quant.dequantize(q)), want)
    f = fusec.gpu_jit(lambda q: quant.dequantize(q) * 2.0)
    assert [k for k, _ in _kinds(f.lower(q))] == ["quant", "elementwise"]
    np.testing.assert_array_equal(np.asarray(f(q)), want * 2)
    # on the device already
    qd = fusec.tree_util.tree_map(fusec.device_put, q)
    assert isinstance(qd.data, fusec.Array)
    np.testing.assert_array_equal(np.asarray(quant.dequantize(qd)), want)


# --- products -------------------------------------------------------------------------------------

NK = [(n, k) for n in (1, 7, 192, 577) for k in (32, 96, 576)]


def _products(fmt: str, m: int, rng: np.random.Generator, nk: list[tuple[int, int]] = NK
              ) -> None:
    """Every (N, K) of ``nk`` with ``m`` rows of x in one jitted program: one qmatmul kernel
    each up to QMATMUL_M rows, a dequant and a matmul each beyond."""
    qs = [quant.quantize(_weights(rng, n, k), fmt) for n, k in nk]
    xs = [rng.standard_normal((m, k)).astype(np.float32) for _, k in nk]
    f = fusec.gpu_jit(lambda xs, qs: [quant.matmul(x, q) for x, q in zip(xs, qs)])
    kinds = _kinds(f.lower(xs, qs))
    if m <= quant_kernels.QMATMUL_M:
        assert [kind for kind, _ in kinds] == ["quant"] * len(nk), kinds
        assert _qmatmuls(f.lower(xs, qs)) == len(nk)
    else:  # a dequant and the float product: a matmul or, on GPUs, sums over K (split-k may
        # take two kernels)
        deq = [name for kind, name in kinds if kind == "quant"]
        rest = [kind for kind, _ in kinds if kind != "quant"]
        assert len(deq) == len(nk) and all(n.endswith("quant_dequant") for n in deq), kinds
        assert len(rest) >= len(nk) and set(rest) <= {"matmul", "reduce"}, kinds
    for got, x, q in zip(f(xs, qs), xs, qs):
        assert got.shape == (m, q.shape[0])
        _check_product(np.asarray(got), x, quant.dequantize_numpy(q))


# every N and K once (lavapipe compiles each kernel in a few tenths of a second)
SOME_NK = [(1, 32), (7, 96), (192, 576), (577, 96)]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m, nk", [(1, NK), (3, SOME_NK), (8, SOME_NK), (16, [(577, 576)]),
                                   (17, SOME_NK), (40, SOME_NK)])
def test_matmul_every_size(fmt: str, m: int, nk: list[tuple[int, int]],
                           rng: np.random.Generator) -> None:
    """Fused up to QMATMUL_M = 16 rows, dequant + matmul from 17 on."""
    _products(fmt, m, rng, nk)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m, nk", [
    (1, [(1, 32), (7, 96), (577, 576), (65, 1536)]),
    (5, [(192, 96), (33, 576), (9, 1056)]),
    (16, [(67, 96)]),
])
def test_matmul_gpu_target_kernels(fmt: str, m: int, nk: list[tuple[int, int]],
                                   rng: np.random.Generator) -> None:
    """The GPU target's kernel (teams of threads per weight row, a tree in workgroup memory) run
    here too: teams of 4 (K = 32), 8 (96) and 64 (576, 1056, 1536), all units of a thread's
    loads issued first (1 to 3; at K = 576 and 1056 some threads of a team have a unit more
    than others), partial last workgroups. (Few rows of x where K is long: lavapipe takes
    seconds to compile the unrolled kernels.)"""
    with forced_target("gpu"):
        _products(fmt, m, rng, nk)


@pytest.mark.parametrize("level", [2, 0])
def test_team_sums_by_subgroup_shuffles_or_a_tree(level: int, rng: np.random.Generator,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the device has subgroup operations a team's sums meet by shuffles within each
    subgroup, then across its subgroups after one barrier; without them, in a tree in workgroup
    memory. lavapipe's subgroups have 8 threads: teams of 4 (K = 32) lie inside one, of 8 (K =
    96) fill one, of 64 (K = 576) span 8. With a normalisation folded into the product (its sums
    of squares meet the same way) and 5 rows of x; NaN in x propagates. Against float64."""
    from fusec import nn

    subgroup_level(monkeypatch, level, need=min(level, 1))
    nk = [(9, 32), (13, 96), (70, 576)]
    qs = [quant.quantize(_weights(rng, n, k), "q4_1") for n, k in nk]
    xs = [rng.standard_normal((5, k)).astype(np.float32) for _, k in nk]
    xs[2][3, 100] = np.nan
    with forced_target("gpu"):
        f = fusec.gpu_jit(lambda xs, qs: [quant.matmul(x, q) for x, q in zip(xs, qs)]
                          + [quant.matmul(nn.rms_norm(xs[2], None), qs[2])])
        kernels = f.lower(xs, qs).kernels
        assert [k.kind for k in kernels] == ["quant"] * 4
        for k in kernels:
            assert ("subgroupShuffleXor" in k.wgsl) == (level > 0), k.name
            assert k.wgsl.count("workgroupBarrier") == (1 if level else 1 + len(
                [ln for ln in k.wgsl.splitlines() if ln.strip().startswith("if (t < ")]))
        got = [np.asarray(g) for g in f(xs, qs)]
    for g, x, q in zip(got[:3], xs, qs):
        w = quant.dequantize_numpy(q)
        ok = np.isfinite(x).all(axis=1)
        assert np.isnan(g[~ok]).all()
        _check_product(g[ok], x[ok], w)
    x64 = xs[2].astype(np.float64)
    normed = x64 / np.sqrt(np.mean(x64 * x64, axis=1, keepdims=True) + 1e-6)
    w64 = quant.dequantize_numpy(qs[2]).astype(np.float64)
    ok = np.isfinite(xs[2]).all(axis=1)
    assert np.isnan(got[3][~ok]).all()
    # K roundings of the products and sums, and a few of the factor 1 / sqrt(mean square + eps)
    bound = np.abs(normed[ok]) @ np.abs(w64).T * ((576 + 16) * 2.0 ** -23)
    assert (np.abs(got[3][ok] - normed[ok] @ w64.T) <= bound).all()


def test_batched_x_one_dimensional_x_and_the_matrix_on_the_left(rng: np.random.Generator) -> None:
    """quant.matmul over leading axes, ``x @ dequantize(q).T`` written out with batch axes (the
    weight broadcast), a 1-D x, and ``dequantize(q) @ v``: each one qmatmul kernel while the rows
    are few; 18 rows are not."""
    q = quant.quantize(_weights(rng, 37, 64), "q4_1")
    w = quant.dequantize_numpy(q)
    x3 = rng.standard_normal((2, 3, 64)).astype(np.float32)
    x18 = rng.standard_normal((2, 9, 64)).astype(np.float32)
    v = rng.standard_normal(64).astype(np.float32)
    vm = rng.standard_normal((64, 3)).astype(np.float32)
    cases = [
        ("matmul 3-d", lambda x, q: quant.matmul(x, q), x3, 1),
        ("@ 3-d", lambda x, q: x @ quant.dequantize(q).T, x3, 1),
        ("@ 3-d, 18 rows", lambda x, q: x @ quant.dequantize(q).T, x18, 0),
        ("matmul 1-d", lambda x, q: quant.matmul(x, q), v, 1),
        ("w @ v", lambda x, q: quant.dequantize(q) @ x, v, 1),
        ("w @ V", lambda x, q: quant.dequantize(q) @ x, vm, 1),
        ("matmul 3-d, 18 rows", lambda x, q: quant.matmul(x, q), x18, 0),
    ]
    for what, fn, x, fused in cases:
        f = fusec.gpu_jit(fn)
        assert _qmatmuls(f.lower(x, q)) == fused, (what, _kinds(f.lower(x, q)))
        got = np.asarray(f(x, q))
        if what.startswith("w @"):
            assert got.shape == (37,) + x.shape[1:], what
            _check_product(got.T.reshape(-1, 37), x.T.reshape(-1, 64), w)
        else:
            assert got.shape == x.shape[:-1] + (37,), what
            _check_product(got.reshape(-1, 37), x.reshape(-1, 64), w)


def test_views_of_x_are_read_in_place(rng: np.random.Generator) -> None:
    """A transposed, sliced or reshaped x: still one kernel (no copy of x), right values."""
    q = quant.quantize(_weights(rng, 41, 96), "q8_0")
    w = quant.dequantize_numpy(q)
    xt = rng.standard_normal((96, 5)).astype(np.float32)
    h = rng.standard_normal((7, 2, 96)).astype(np.float32)
    for what, fn, arg, x in [
        ("transpose", lambda a, q: quant.matmul(a.T, q), xt, xt.T),
        ("slice", lambda a, q: quant.matmul(a[2:6:2, 1], q), h, h[2:6:2, 1]),
        ("reshape", lambda a, q: quant.matmul(a.reshape(-1, 96)[:3], q), h, h.reshape(-1, 96)[:3]),
        ("last rows", lambda a, q: quant.matmul(a[-1], q), h, h[-1]),
    ]:
        f = fusec.gpu_jit(fn)
        kinds = _kinds(f.lower(arg, q))
        assert [k for k, _ in kinds] == ["quant"], (what, kinds)
        _check_product(np.asarray(f(arg, q)), np.ascontiguousarray(x), w)


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_nan_and_inf_in_x_propagate(target: str, rng: np.random.Generator) -> None:
    q = quant.quantize(_weights(rng, 9, 64), "q4_1")  # row 1: a block of exact zeros
    w = quant.dequantize_numpy(q).astype(np.float64)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    x[0, 5] = np.nan
    x[2, 3] = np.inf
    x[3, 40] = -np.inf
    with np.errstate(invalid="ignore"):
        ref = x.astype(np.float64) @ w.T
    with forced_target(target):
        got = np.asarray(fusec.gpu_jit(lambda x, q: quant.matmul(x, q))(x, q))
    assert np.isnan(got[0]).all() and np.isnan(got[2, 1])  # inf * 0 in the zero block
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
    np.testing.assert_array_equal(np.sign(got[np.isinf(ref)]), np.sign(ref[np.isinf(ref)]))
    fin = np.isfinite(ref)
    np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-5, atol=1e-4)


def test_unfused_plan_keeps_dequant_and_matmul(rng: np.random.Generator) -> None:
    q = quant.quantize(_weights(rng, 19, 32), "q8_0")
    x = rng.standard_normal((2, 32)).astype(np.float32)
    f = fusec.gpu_jit(lambda x, q: quant.matmul(x, q), fuse=False)
    assert sorted(k for k, _ in _kinds(f.lower(x, q))) == ["matmul", "quant"]
    assert _qmatmuls(f.lower(x, q)) == 0
    _check_product(np.asarray(f(x, q)), x, quant.dequantize_numpy(q))


def test_dequant_also_used_elsewhere_stays(rng: np.random.Generator) -> None:
    q = quant.quantize(_weights(rng, 11, 64), "q4_1")
    x = rng.standard_normal((1, 64)).astype(np.float32)
    f = fusec.gpu_jit(lambda x, q: (quant.matmul(x, q), quant.dequantize(q).sum()))
    names = sorted(name.split("_", 1)[1] for _, name in _kinds(f.lower(x, q)))
    assert "quant_qmatmul" in names and "quant_dequant" in names
    y, s = f(x, q)
    w = quant.dequantize_numpy(q)
    _check_product(np.asarray(y), x, w)
    np.testing.assert_allclose(float(np.asarray(s)), w.astype(np.float64).sum(), rtol=1e-5,
                               atol=1e-4)


def test_pass_output_and_cost(rng: np.random.Generator) -> None:
    """The rewritten program holds qmatmul (its numpy reference gives the product) and no
    dequant; the cost counts 2 M N K flops."""
    q = quant.quantize(_weights(rng, 23, 96), "q4_1")
    x = rng.standard_normal((3, 96)).astype(np.float32)
    f = fusec.gpu_jit(lambda x, q: quant.matmul(x, q))
    traced = f.trace(x, q)
    prog = run_pipeline(traced.ir, Options(), check=True)
    bodies = [e.params["body"] for e in prog.eqns if e.op is Op.KERNEL]
    ops = [be.op for b in bodies for be in b.eqns]
    assert Op.QMATMUL in ops and Op.DEQUANT not in ops and Op.MATMUL not in ops
    qm = next(be for b in bodies for be in b.eqns if be.op is Op.QMATMUL)
    assert (qm.params["fmt"], qm.params["n"], qm.params["k"]) == ("q4_1", 23, 96)
    (got,) = evaluate(prog, [x, np.asarray(q.data)])
    _check_product(np.asarray(got), x, quant.dequantize_numpy(q))
    cost = f.lower(x, q).cost_analysis()
    assert cost["flops"] == 2 * 3 * 23 * 96 and cost["kernels"] == 1
    # the traced program's printed IR names the ops
    assert "dequant fmt=q4_1 shape=(23,96)" in str(traced.ir)


def test_generated_code(rng: np.random.Generator) -> None:
    """x bound as vec4s, f16 scales by unpack2x16float; the GPU target reduces in workgroup
    memory, the CPU target has no barrier."""
    q = quant.quantize(_weights(rng, 5, 576), "q4_1")
    x = rng.standard_normal((2, 576)).astype(np.float32)
    for target in ("gpu", "cpu"):
        with forced_target(target):
            (k,) = fusec.gpu_jit(lambda x, q: quant.matmul(x, q)).lower(x, q).kernels
        assert "array<vec4<f32>>" in k.wgsl and "unpack2x16float" in k.wgsl
        assert ("workgroupBarrier" in k.wgsl) == (target == "gpu")
        assert ("64 threads per weight" in k.wgsl) == (target == "gpu")


def test_grad_through_the_product(rng: np.random.Generator) -> None:
    """d/dx of a quantized product is the matmul's own rule (g @ dequantize(q))."""
    q = quant.quantize(_weights(rng, 13, 64), "q8_0")
    w = quant.dequantize_numpy(q).astype(np.float64)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    g = fusec.gpu_jit(fusec.grad(lambda x, q: (quant.matmul(x, q) ** 2).sum()))(x, q)
    want = 2 * (x.astype(np.float64) @ w.T) @ w
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-4, atol=1e-4)


def test_in_a_loop_body(rng: np.random.Generator) -> None:
    """A decode-like loop: the product in its body is one qmatmul kernel."""
    # a contraction (spectral norm ~0.6), so that roundings do not grow over the steps
    q = quant.quantize((rng.standard_normal((64, 64)) * 0.3 / 8).astype(np.float32), "q4_1")
    w = quant.dequantize_numpy(q).astype(np.float64)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    f = fusec.gpu_jit(lambda x, q: fusec.lax.fori_loop(
        0, 40, lambda i, h: fnp.tanh(quant.matmul(h, q) + x), x))
    lowered = f.lower(x, q)
    assert any(e.op is Op.LOOP for e in lowered.ir.eqns)
    assert _qmatmuls(lowered) == 1
    want = x.astype(np.float64)
    for _ in range(40):
        want = np.tanh(want @ w.T + x)
    np.testing.assert_allclose(np.asarray(f(x, q)), want, rtol=1e-4, atol=1e-5)


def test_eager_calls(rng: np.random.Generator) -> None:
    q = quant.quantize(_weights(rng, 7, 32), "q8_0")
    x = rng.standard_normal((3, 32)).astype(np.float32)
    y = quant.matmul(x, q)
    assert isinstance(y, fusec.Array)
    _check_product(np.asarray(y), x, quant.dequantize_numpy(q))


def test_more_than_65535_workgroups(monkeypatch: pytest.MonkeyPatch,
                                    rng: np.random.Generator) -> None:
    """A workgroup per weight row (CPU_ROWS = 1): 70001 rows take a 2-D grid."""
    monkeypatch.setattr(quant_kernels, "CPU_ROWS", 1)
    q = quant.quantize(_weights(rng, 70001, 32), "q4_1")
    x = rng.standard_normal((1, 32)).astype(np.float32)
    with forced_target("cpu"):
        f = fusec.gpu_jit(lambda x, q: quant.matmul(x, q))
        (k,) = f.lower(x, q).kernels
        assert k.grid == (65535, 2, 1)
        got = np.asarray(f(x, q))
    _check_product(got, x, quant.dequantize_numpy(q))


def test_interpreter_backend(rng: np.random.Generator) -> None:
    """FUSEC_BACKEND=cpu: the traced program (dequant, matmul) on numpy."""
    code = textwrap.dedent("""
        import json, numpy as np, fusec
        from fusec import quant
        assert fusec.default_device().backend == "cpu"
        rng = np.random.default_rng(5)
        out = {}
        for fmt in ("q4_1", "q8_0"):
            w = rng.standard_normal((9, 64)).astype(np.float32)
            q = quant.quantize(w, fmt)
            x = rng.standard_normal((3, 64)).astype(np.float32)
            ref = x.astype(np.float64) @ quant.dequantize_numpy(q).astype(np.float64).T
            f = fusec.gpu_jit(lambda x, q: quant.matmul(x, q))
            out[fmt] = [float(np.abs(np.asarray(f(x, q)) - ref).max()),
                        bool((np.asarray(quant.dequantize(q)) == quant.dequantize_numpy(q)).all())]
        print(json.dumps(out))
    """)
    env = {**os.environ, "FUSEC_BACKEND": "cpu", "FUSEC_CACHE_DIR": "off",
           "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    import json

    out = json.loads(p.stdout.strip().splitlines()[-1])
    for fmt in FORMATS:
        err, same = out[fmt]
        assert err < 1e-4 and same, (fmt, out)


# --- errors ---------------------------------------------------------------------------------------


def test_errors_name_the_argument(rng: np.random.Generator) -> None:
    words = np.zeros((4, 5), dtype=np.uint32)
    with pytest.raises(quant.FormatError, match="unknown quantization format 'q5_0'"):
        quant.QuantizedMatrix("q5_0", (4, 32), words)
    with pytest.raises(ShapeError, match=r"K a positive multiple of 32"):
        quant.QuantizedMatrix("q4_1", (4, 33), words)
    with pytest.raises(DTypeError, match="data must hold uint32 words; got int32"):
        quant.QuantizedMatrix("q4_1", (4, 32), words.astype(np.int32))
    with pytest.raises(ShapeError, match=r"words of a \(4, 64\) matrix have shape \(4, 10\)"):
        quant.QuantizedMatrix("q4_1", (4, 64), words)
    with pytest.raises(DTypeError, match="data must be an array"):
        quant.QuantizedMatrix("q8_0", (4, 32), [1, 2])
    q = quant.quantize(_weights(rng, 4, 32), "q4_1")
    f = fusec.gpu_jit(lambda x, q: quant.matmul(x, q))
    with pytest.raises(ShapeError, match=r"x has shape \(2, 31\); its last dimension must be "
                                         r"the matrix's K = 32"):
        f(np.ones((2, 31), np.float32), q)
    with pytest.raises(DTypeError, match="x must be float32; got int32"):
        f(np.ones((2, 32), np.int32), q)
    with pytest.raises(TypeError, match="q must be a fusec.quant.QuantizedMatrix"):
        quant.matmul(np.ones((2, 32), np.float32), np.ones((4, 32), np.float32))
    with pytest.raises(ShapeError, match=r"has 40 bytes \(1 blocks of 20 bytes per row\); raw "
                                         r"has 20"):
        quant.from_gguf(np.zeros(20, np.uint8), "q4_1", (2, 32))
    with pytest.raises(DTypeError, match="raw must be the uint8 block bytes"):
        quant.from_gguf(np.zeros(20, np.int8), "q4_1", (1, 32))
    with pytest.raises(quant.FormatError, match="from_gguf: unknown"):
        quant.from_gguf(np.zeros(20, np.uint8), "Q4_1", (1, 32))
    with pytest.raises(ShapeError, match="NaN or infinity"):
        quant.quantize(np.full((1, 32), np.nan, np.float32), "q8_0")
    with pytest.raises(ShapeError, match="must be a matrix"):
        quant.quantize(np.ones(32, np.float32), "q8_0")
    with pytest.raises(TypeError, match="inside a jitted function use fusec.quant.dequantize"):
        fusec.gpu_jit(lambda q: quant.dequantize_numpy(q))(q)


def test_take_rows(rng: np.random.Generator) -> None:
    """An embedding lookup: only the rows asked for are dequantised (a gather of words, then a
    dequant of those rows)."""
    q = quant.quantize(_weights(rng, 300, 64), "q8_0")
    w = quant.dequantize_numpy(q)
    ids = np.array([[3, 0, 299], [-1, 17, 3]], dtype=np.int32)
    f = fusec.gpu_jit(lambda ids, q: quant.take(q, ids))
    got = np.asarray(f(ids, q))
    assert got.shape == (2, 3, 64)
    np.testing.assert_array_equal(got, w[ids])
    dq = [e for e in f.trace(ids, q).ir.eqns if e.op is Op.DEQUANT]
    assert len(dq) == 1 and dq[0].params["shape"] == (6, 64)
    np.testing.assert_array_equal(np.asarray(quant.take(q, 5)), w[5])
    assert np.asarray(quant.take(q, np.zeros(0, np.int32))).shape == (0, 64)


@pytest.mark.parametrize("target", ["gpu", "cpu"])
def test_trusted_and_checked_kernels_agree(target: str, rng: np.random.Generator) -> None:
    """Kernels compile as trusted modules (no bounds checks): with wgpu's checks back
    (FUSEC_SHADER_CHECKS) the results are the same, so no index strays (partial workgroups,
    clamped units, a view of x)."""
    q = quant.quantize(_weights(rng, 37, 96), "q4_1")
    x = rng.standard_normal((3, 96)).astype(np.float32)
    got = {}
    try:
        with forced_target(target):
            for on in (False, True):
                fusec.config.set("shader_checks", 1 if on else 0)
                f = fusec.gpu_jit(lambda x, q: (quant.matmul(x, q), quant.matmul(x[::-1], q),
                                                quant.dequantize(q)))
                got[on] = [np.asarray(v) for v in f(x, q)]
    finally:
        fusec.config.set("shader_checks", None)
    w = quant.dequantize_numpy(q)
    for a, b in zip(got[False], got[True]):
        np.testing.assert_array_equal(a, b)
    _check_product(got[False][0], x, w)
    _check_product(got[False][1], x[::-1], w)
    np.testing.assert_array_equal(got[False][2], w)


def test_user_guide_snippet_runs() -> None:
    """The first code block of the user guide's Quantized weights section runs and gives the
    product it says, in one qmatmul kernel."""
    import re

    text = (REPO / "docs" / "user-guide.md").read_text()
    section = text.split("\n## Quantized weights\n", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    ns: dict[str, Any] = {}
    exec(compile(block, "user-guide.md#quantized-weights", "exec"), ns)  # noqa: S102
    assert [k.name for k in ns["up"].lower(ns["x"], ns["q"]).kernels] == ["k0_quant_qmatmul"]
    _check_product(np.asarray(ns["y"]), ns["x"], ns["w_back"])
    assert np.abs(ns["w_back"] - ns["w"]).max() < 0.5  # within half a 4-bit step of N(0, 1)


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_elementwise_work_on_a_quantized_product_fuses_into_its_kernel(
        rng: np.random.Generator, target: str) -> None:
    """A residual add and an activation on a quantized product (x of leading axes, few rows) run
    in the product's kernel, which may also write the product itself; work that reads the
    product at other indices (a transpose) stays a kernel of its own. Against float64."""
    from fusec import nn

    w = _weights(rng, 97, 96)  # an odd number of weight rows: a partly filled workgroup
    q = quant.quantize(w, "q4_1")
    wd = quant.dequantize_numpy(q).astype(np.float64)
    x = rng.standard_normal((2, 3, 96)).astype(np.float32)
    r = rng.standard_normal((2, 3, 97)).astype(np.float32)
    p = x.astype(np.float64) @ wd.T
    # float32's error in the product (the elementwise work after it adds a few roundings of
    # values of its own size: rtol); silu's slope is at most 1.1, times 2
    err = _dot_error(x, wd)
    with forced_target(target):
        f = fusec.gpu_jit(lambda x, q, r: r + nn.silu(quant.matmul(x, q)) * 2.0)
        assert [k.kind for k in f.lower(x, q, r).kernels] == ["quant"]
        want = r + p / (1 + np.exp(-p)) * 2.0
        assert np.all(np.abs(np.asarray(f(x, q, r)) - want) <= 2.2 * err + 1e-6 * np.abs(want)
                      + 1e-6 * np.abs(r))
        g = fusec.gpu_jit(lambda x, q, r: (quant.matmul(x, q), r - quant.matmul(x, q)))
        assert [k.kind for k in g.lower(x, q, r).kernels] == ["quant"]
        a, b = g(x, q, r)
        assert np.all(np.abs(np.asarray(a) - p) <= err)
        assert np.all(np.abs(np.asarray(b) - (r - p)) <= err + 1e-6 * np.abs(r - p))
        x2 = x[0, :2]  # (2, 96): the product is (2, 97); its transpose is read below
        h = fusec.gpu_jit(lambda x, q: quant.matmul(x, q).T * 3.0)
        kinds = [k.kind for k in h.lower(x2, q).kernels]
        assert kinds.count("quant") == 1 and len(kinds) == 2
        want = (x2.astype(np.float64) @ wd.T).T * 3
        assert np.all(np.abs(np.asarray(h(x2, q)) - want)
                      <= 3 * _dot_error(x2, wd).T + 1e-6 * np.abs(want))


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_elementwise_x_computed_where_the_product_loads_it(rng: np.random.Generator,
                                                           target: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """With prologues on for x's 3 rows (fuse.PROLOGUE_ROWS; 1 by default), on GPUs SwiGLU's
    ``silu(gate) * up`` before a quantized down projection is computed by the product's kernel
    as it loads x: no elementwise kernel writes x. NaN and inf in x propagate; a
    normalisation's x (a reduction's epilogue) is not recomputed there; software adapters (a
    thread per weight row) keep x's kernel, and so does PROLOGUE_MAX = 0. Against float64."""
    import importlib

    from fusec import nn

    fuse_module = importlib.import_module("fusec.passes.fuse")
    monkeypatch.setattr(fuse_module, "PROLOGUE_ROWS", 3)

    w = _weights(rng, 97, 160)
    q = quant.quantize(w, "q4_1")
    wd = quant.dequantize_numpy(q).astype(np.float64)
    gu = rng.standard_normal((3, 320)).astype(np.float32)
    gu[1, 7] = np.nan  # row 1 of x has a NaN: its products are NaN
    gu[2, 165] = np.inf  # up = inf at column 5 of row 2: inf or NaN there

    def mlp(gu: Any, q: Any) -> Any:
        return quant.matmul(nn.silu(gu[:, :160]) * gu[:, 160:], q)

    g64 = gu.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        x64 = g64[:, :160] / (1 + np.exp(-g64[:, :160])) * g64[:, 160:]
        want = x64 @ wd.T
    with forced_target(target):
        f = fusec.gpu_jit(mlp)
        kinds = [k.kind for k in f.lower(gu, q).kernels]
        assert kinds == (["quant"] if target == "gpu" else ["elementwise", "quant"])
        got = np.asarray(f(gu, q))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        assert np.isnan(got[1]).all() and np.isfinite(want[0]).all()
        # row 0 is finite: float32's error in the product, plus silu's own roundings
        err = _dot_error(x64[:1].astype(np.float32), wd)[0]
        assert np.all(np.abs(got[0] - want[0]) <= 2 * err + 1e-6 * np.abs(want[0]))
        # a normalised x is not a prologue: its reduction's epilogue, or folded into the product
        # (test_rms_norm_folded_into_the_product)
        h = fusec.gpu_jit(lambda x, q: quant.matmul(nn.rms_norm(x, None), q))
        want_kinds = ["quant"] if target == "gpu" else ["reduce", "quant"]
        assert [k.kind for k in h.lower(gu[:, :160], q).kernels] == want_kinds
        monkeypatch.setattr(fuse_module, "PROLOGUE_MAX", 0)
        off = fusec.gpu_jit(mlp)
        assert [k.kind for k in off.lower(gu, q).kernels] == ["elementwise", "quant"]


def test_prologue_by_default_only_for_one_row(rng: np.random.Generator) -> None:
    """By default (fuse.PROLOGUE_ROWS = 1) a quantized product computes its x in a prologue on
    GPUs only where x has one row (a decode step at batch 1): each weight row's team recomputes
    every row of x, which cost more than the kernel it saves at batch 8 (H200). One row, x's
    leading axes included; against float64."""
    from fusec import nn

    w = _weights(rng, 97, 160)
    q = quant.quantize(w, "q4_1")
    wd = quant.dequantize_numpy(q).astype(np.float64)

    def mlp(gu: Any, q: Any) -> Any:
        return quant.matmul(nn.silu(gu[..., :160]) * gu[..., 160:], q)

    with forced_target("gpu"):
        f = fusec.gpu_jit(mlp)
        for shape, kinds in (((1, 320), ["quant"]), ((1, 1, 320), ["quant"]),
                             ((2, 320), ["elementwise", "quant"]),
                             ((2, 1, 320), ["elementwise", "quant"])):
            gu = rng.standard_normal(shape).astype(np.float32)
            assert [k.kind for k in f.lower(gu, q).kernels] == kinds, shape
            g64 = gu.astype(np.float64)
            x64 = g64[..., :160] / (1 + np.exp(-g64[..., :160])) * g64[..., 160:]
            err = _dot_error(x64.reshape(-1, 160).astype(np.float32), wd).reshape(
                *shape[:-1], 97)
            got = np.asarray(f(gu, q))
            assert np.all(np.abs(got - x64 @ wd.T) <= 2 * err + 1e-6 * np.abs(x64 @ wd.T))


@pytest.mark.parametrize("shape,fmt,weighted", [
    ((1, 160), "q4_1", True),       # a decode step at batch 1
    ((1, 1, 160), "q8_0", False),   # leading axes, no weight
    ((3, 5, 96), "q4_1", True),     # 15 rows
    ((16, 64), "q8_0", True),       # QMATMUL_M rows
])
def test_rms_norm_folded_into_the_product(rng: np.random.Generator, shape: tuple[int, ...],
                                          fmt: str, weighted: bool) -> None:
    """On GPUs a root-mean-square normalisation that only a quantized product reads is computed
    by the product's kernel (fusec.passes.quant.fold_rms_norm): one kernel, each row's
    (a * rsqrt(mean(a * a) + eps) * g) @ W as float64 computes it; a row with a NaN or an inf
    gives NaN (its sum of squares is NaN or inf, as in the normalisation itself)."""
    k = shape[-1]
    w = _weights(rng, 37, k)
    q = quant.quantize(w, fmt)
    wd = quant.dequantize_numpy(q).astype(np.float64)
    a = (rng.standard_normal(shape) * rng.uniform(0.1, 30.0, shape[:-1] + (1,))).astype(
        np.float32)
    g = rng.uniform(0.5, 1.5, k).astype(np.float32)
    rows = a.reshape(-1, k)
    if rows.shape[0] > 2:
        rows[1, 3] = np.nan
        rows[2, 0] = np.inf

    def f(a: Any, g: Any, q: Any) -> Any:
        from fusec import nn

        return quant.matmul(nn.rms_norm(a, g if weighted else None, eps=1e-5), q)

    a64 = a.astype(np.float64)
    with np.errstate(invalid="ignore"):
        xn = a64 / np.sqrt(np.mean(a64 * a64, axis=-1, keepdims=True) + 1e-5)
        xn = xn * g if weighted else xn
        want = xn @ wd.T
    with forced_target("gpu"):
        jf = fusec.gpu_jit(f)
        assert [kn.kind for kn in jf.lower(a, g, q).kernels] == ["quant"]
        got = np.asarray(jf(a, g, q))
    bad = ~np.isfinite(a64).all(axis=-1)
    assert np.isnan(got[bad]).all()
    # float32: the product's error, plus the normalisation's few roundings (relative ~1e-6)
    err = _dot_error(np.abs(xn[~bad]).astype(np.float32), wd)
    ok = ~bad
    assert np.all(np.abs(got[ok] - want[ok]) <= 2 * err + 4e-6 * np.abs(want[ok]))


def test_rms_norm_fold_only_where_it_is_the_products_alone(rng: np.random.Generator,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """The fold is made only where nothing else reads the normalised x or its parts (here the
    normalised x is also an output: the reduction's kernel stays), with the setting on
    (fusec.passes.quant.FOLD_RMS_NORM) and for GPUs; the results are the same every way."""
    import importlib

    from fusec import nn

    quant_pass = importlib.import_module("fusec.passes.quant")
    q = quant.quantize(_weights(rng, 29, 64), "q4_1")
    a = rng.standard_normal((2, 64)).astype(np.float32)
    g = rng.uniform(0.5, 1.5, 64).astype(np.float32)

    def both(a: Any, g: Any, q: Any) -> Any:
        h = nn.rms_norm(a, g, eps=1e-6)
        return quant.matmul(h, q), h

    def one(a: Any, g: Any, q: Any) -> Any:
        return quant.matmul(nn.rms_norm(a, g, eps=1e-6), q)

    want = np.asarray(fusec.gpu_jit(one, fuse=False)(a, g, q))
    with forced_target("gpu"):
        jb = fusec.gpu_jit(both)
        assert [kn.kind for kn in jb.lower(a, g, q).kernels] == ["reduce", "quant"]
        np.testing.assert_allclose(np.asarray(jb(a, g, q)[0]), want, rtol=1e-5, atol=1e-5)
        monkeypatch.setattr(quant_pass, "FOLD_RMS_NORM", 0)
        jo = fusec.gpu_jit(one)
        assert [kn.kind for kn in jo.lower(a, g, q).kernels] == ["reduce", "quant"]
        np.testing.assert_allclose(np.asarray(jo(a, g, q)), want, rtol=1e-5, atol=1e-5)
        monkeypatch.setattr(quant_pass, "FOLD_RMS_NORM", 1)
        jf = fusec.gpu_jit(one)
        assert [kn.kind for kn in jf.lower(a, g, q).kernels] == ["quant"]
        np.testing.assert_allclose(np.asarray(jf(a, g, q)), want, rtol=1e-5, atol=1e-5)
    with forced_target("cpu"):
        jc = fusec.gpu_jit(one)
        assert [kn.kind for kn in jc.lower(a, g, q).kernels] == ["reduce", "quant"]


@pytest.mark.parametrize("t,part_keys,case", [(200, 32, "masked part"), (70, 64, "plain"),
                                              (131, 48, "nan"), (97, 32, "masked row")])
@pytest.mark.parametrize("fold", [1, 0])
def test_attention_parts_combined_where_the_projection_loads_them(
        t: int, part_keys: int, case: str, fold: int, rng: np.random.Generator,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode step's attention over its keys in parts (2 KV heads of 3 query rows, 1 token),
    then the output projection over quantized weights: on GPUs the product computes the parts'
    combination where it loads x, and the combining kernel is gone (fuse.COMBINE_PROLOGUE; 0:
    the attention_combine kernel as before), up to COMBINE_MAX_PARTS parts (8 here; by default
    2, so the 7 parts of 200 keys keep their kernel). Against float64: finite outputs within
    float32's error, a part whose keys are all masked weighing nothing, and a NaN score, or a
    query row with every key masked (0 / 0), making every output NaN, as the written-out form
    does."""
    import importlib

    from fusec import nn
    from fusec.kernels import attention as attention_kernel

    fuse_module = importlib.import_module("fusec.passes.fuse")
    monkeypatch.setattr(fuse_module, "COMBINE_PROLOGUE", fold)
    monkeypatch.setattr(attention_kernel, "PART_KEYS", part_keys)
    default_max = fuse_module.COMBINE_MAX_PARTS
    d = 32
    q = rng.standard_normal((1, 2, 3, d)).astype(np.float32)
    k = rng.standard_normal((1, 2, t, d)).astype(np.float32)
    v = rng.standard_normal((1, 2, t, d)).astype(np.float32)
    bias = np.zeros((1, 1, 1, t), np.float32)
    bias[..., t - 3:] = -np.inf  # the cache's unused tail
    if case == "masked part":
        bias[..., 40:100] = -np.inf  # parts 2 and 3 of 32 keys wholly masked
    w = _weights(rng, 45, 2 * 3 * d)
    wq = quant.quantize(w, "q4_1")
    wd = quant.dequantize_numpy(wq).astype(np.float64)
    if case == "nan":
        bias[..., 17] = np.nan
    elif case == "masked row":
        bias = np.broadcast_to(bias, (1, 2, 3, t)).copy()
        bias[0, 1, 2, :] = -np.inf

    def block(q: Any, k: Any, v: Any, bias: Any, wq: Any) -> Any:
        s = (q @ fnp.swapaxes(k, -1, -2)) * (1.0 / np.sqrt(d)) + bias
        o = nn.softmax(s, axis=-1) @ v  # [1, 2, 3, d]
        return quant.matmul(fnp.reshape(o, (1, 1, 2 * 3 * d)), wq)

    s64 = q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64) / np.sqrt(d) + bias
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.exp(s64 - s64.max(-1, keepdims=True))
        x64 = ((p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)).reshape(1, 1, -1)
        want = x64 @ wd.T
    with forced_target("gpu"):
        parts = attention_kernel.key_parts(q.shape, k.shape[:-2] + (d, t), v.shape, "gpu")
        assert parts == {200: 7, 70: 2, 131: 3, 97: 4}[t]
        if fold and parts > default_max:
            lowered = fusec.gpu_jit(block).lower(q, k, v, bias, wq)
            assert "attention_combine" in lowered.kernels[1].name  # a kernel of its own
        monkeypatch.setattr(fuse_module, "COMBINE_MAX_PARTS", 8)
        f = fusec.gpu_jit(block)
        kernels = f.lower(q, k, v, bias, wq).kernels
        names = [kk.name for kk in kernels]
        assert len(names) == (2 if fold else 3), names
        assert ("attention_combine" in names[-1] and "qmatmul" in names[-1]) == bool(fold)
        got = np.asarray(f(q, k, v, bias, wq))
    assert got.shape == (1, 1, 45)
    if case in ("nan", "masked row"):
        assert np.isnan(got).all() and np.isnan(want).all()
        return
    # x's own roundings (softmax and the parts' combination, relative ~1e-6) and the product's
    err = _dot_error(x64[0].astype(np.float32), wd)[0] + 1e-5 * (np.abs(x64[0]) @ np.abs(wd).T)
    assert np.all(np.abs(got[0, 0] - want[0, 0]) <= err), np.abs(got[0, 0] - want[0, 0]).max()
