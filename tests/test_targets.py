"""Kernels generated for the other target run correctly here too: on lavapipe the default target
is "cpu" (a thread per row), so this runs the GPU strategies (a workgroup per row, rows cached in
registers, several elements per thread) on random data against numpy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional

import numpy as np
import pytest
from helpers import forced_target

import fusec
import fusec.numpy as fnp
from fusec import nn


@pytest.fixture(params=["gpu", "cpu"])
def target(request: pytest.FixtureRequest) -> Iterator[str]:
    with forced_target(request.param):
        yield request.param


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# row lengths: shorter than a workgroup, not a multiple of 256, exactly 32 per thread, a partial
# last block, beyond the register cache (long rows); on the GPU target short rows share a
# workgroup (8 of 64 or 300, 4 of 1000), with row counts that leave the last workgroup part-full
@pytest.mark.parametrize("shape", [(3, 5), (37, 300), (16, 8192), (5, 8193), (2, 1000),
                                   (3, 20000), (2049, 64), (2053, 300), (4099, 1000)])
def test_row_kernels(target: str, shape: tuple[int, int], rng: np.random.Generator) -> None:
    x = rng.standard_normal(shape).astype(np.float32)
    g = rng.standard_normal(shape[-1]).astype(np.float32)
    x64 = x.astype(np.float64)
    sm = fusec.gpu_jit(lambda a: nn.softmax(a))
    np.testing.assert_allclose(np.asarray(sm(x)), _softmax(x64, -1), rtol=1e-5, atol=1e-7)
    ln = fusec.gpu_jit(lambda a, w: nn.layer_norm(a, w, w))
    mu = x64.mean(-1, keepdims=True)
    ref = (x64 - mu) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5) * g + g
    np.testing.assert_allclose(np.asarray(ln(x, g)), ref, rtol=1e-4, atol=1e-4)
    stats = fusec.gpu_jit(lambda a: (a.sum(axis=-1), a.max(axis=-1), a - a.mean(axis=-1,
                                                                                keepdims=True)))
    s, m, c = stats(x)
    np.testing.assert_allclose(np.asarray(s), x64.sum(-1), rtol=1e-5, atol=1e-3)
    np.testing.assert_array_equal(np.asarray(m), x.max(-1))
    np.testing.assert_allclose(np.asarray(c), x64 - mu, rtol=1e-5, atol=1e-4)


# few rows longer than the register cache (a decode step's argmax over a vocabulary): a
# workgroup's strided loop over each on the GPU target; lengths that leave the last step
# part-full, a prime, rows cut into chunks first; NaN, +-inf and ties where the first index wins
@pytest.mark.parametrize("shape", [(1, 49152), (3, 20011), (1, 16411), (2, 300001)])
def test_few_long_rows(target: str, shape: tuple[int, int], rng: np.random.Generator) -> None:
    x = rng.standard_normal(shape).astype(np.float32)
    r = shape[1]
    x[0, rng.integers(r, size=3)] = np.inf  # ties between infinities: the first wins
    x[0, rng.integers(r, size=3)] = -np.inf
    if shape[0] > 1:
        x[1, rng.integers(r)] = np.nan  # propagates (argmax: the first NaN)
        x[-1, rng.integers(r, size=2)] = x[-1].max() + 1.0  # a tie of the largest finite value
    f = fusec.gpu_jit(lambda a: (fnp.argmax(a, axis=-1), fnp.argmin(a, axis=-1),
                                 a.sum(axis=-1), a.max(axis=-1)))
    am, an, s, m = (np.asarray(v) for v in f(x))
    np.testing.assert_array_equal(am, np.argmax(x, axis=-1))
    np.testing.assert_array_equal(an, np.argmin(x, axis=-1))
    finite = np.isfinite(x).all(-1)
    x64 = np.where(np.isinf(x), 0.0, x).astype(np.float64)
    np.testing.assert_allclose(s[finite], x64.sum(-1)[finite], rtol=1e-5, atol=1e-4 * np.sqrt(r))
    np.testing.assert_array_equal(np.isnan(s), np.isnan(x.sum(-1)))
    np.testing.assert_array_equal(m, x.max(-1))
    assert any(kc.kind == "reduce" for kc in f.lower(x).kernels)  # WGSL ran, not numpy


# column reductions (over leading axes): on the GPU target split along the columns into partial
# kernels: up to 128 columns a workgroup per chunk of rows, read as one run ("flat"), more columns
# a thread per (chunk, column) ("columns"); too few elements to split: None. Column counts that
# do not divide a workgroup (3, 7, 20, 35), 128 and 129 (either side of the flat layout's limit),
# prime row counts, chunks that do not divide the rows, a 3-D array. On the CPU target long
# columns are split like long rows.
@pytest.mark.parametrize("shape, gpu_layout", [
    ((70001, 4), "flat"), ((1031, 16), "flat"), ((997, 300), "columns"),
    ((4099, 2049), "columns"), ((129, 7, 5), None), ((65537, 20), "flat"), ((70001, 2), "flat"),
    ((1031, 3), None), ((10007, 3), "flat"), ((30011, 7), "flat"), ((20011, 128), "flat"),
    ((2053, 129), "columns"), ((4001, 5, 7), "flat")])
def test_column_reductions(target: str, shape: tuple[int, ...], gpu_layout: Optional[str],
                           rng: np.random.Generator) -> None:
    x = rng.standard_normal(shape).astype(np.float32)
    k = rng.integers(-1000, 1000, size=shape).astype(np.int32)
    w = rng.standard_normal(shape[1:]).astype(np.float32)  # broadcast along the rows
    x64 = x.astype(np.float64)
    f = fusec.gpu_jit(lambda a, b, c: (a.sum(axis=0), a.max(axis=0),
                                       fnp.sqrt((a * a).mean(axis=0)), b.min(axis=0),
                                       b.sum(axis=0), (a * c + 1.0).sum(axis=0)))
    s, m, rms, kmin, ksum, ws = (np.asarray(v) for v in f(x, k, w))
    np.testing.assert_allclose(s, x64.sum(0), rtol=1e-5, atol=2e-6 * shape[0])
    np.testing.assert_allclose(ws, (x64 * w + 1.0).sum(0), rtol=1e-5, atol=4e-6 * shape[0])
    np.testing.assert_array_equal(m, x.max(0))
    np.testing.assert_allclose(rms, np.sqrt((x64 * x64).mean(0)), rtol=1e-5)
    np.testing.assert_array_equal(kmin, k.min(0))
    np.testing.assert_array_equal(ksum, k.sum(0, dtype=np.int64).astype(np.int32))
    kernels = f.lower(x, k, w).kernels
    marks = {"flat": "read as one run of elements", "columns": "thread w reduces chunk",
             "rows": "workgroup w reduces chunk"}
    used = {name for name, text in marks.items()
            if any(kc.kind == "reduce" and text in kc.wgsl for kc in kernels)}
    if target == "gpu":
        assert used == ({gpu_layout} if gpu_layout else set())
    else:
        assert used == (({"rows"} if shape[1:] == (2,) else {"columns"}) if shape[0] >= 65536
                        else set())


@pytest.mark.parametrize("n", [1, 1000, 262144 + 7])
def test_elementwise_kernels(target: str, n: int, rng: np.random.Generator) -> None:
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    f = fusec.gpu_jit(lambda a, b: fnp.tanh(a * b + 0.5) - b)
    ref = np.tanh(x.astype(np.float64) * y + 0.5) - y
    np.testing.assert_allclose(np.asarray(f(x, y)), ref, rtol=2e-5, atol=1e-6)


def test_vec4_elementwise_kernels(target: str, rng: np.random.Generator) -> None:
    # 512 x 512 = 2**18 elements: large enough for vec4 loads and stores on the GPU target.
    # a + a.T reads one vectorised buffer at the thread's own elements and, transposed, elsewhere.
    a = rng.standard_normal((512, 512)).astype(np.float32)
    b = rng.standard_normal(512).astype(np.float32)
    f = fusec.gpu_jit(lambda x, y: (fnp.tanh(x * y) + x.T, x > y))
    u, v = f(a, b)
    a64 = a.astype(np.float64)
    np.testing.assert_allclose(np.asarray(u), np.tanh(a64 * b) + a64.T, rtol=2e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(v), a > b)
    if target == "gpu":
        assert "array<vec4<f32>>" in f.lower(a, b).kernels[0].wgsl
    # donated in place through a vec4 binding
    g = fusec.gpu_jit(lambda x, y: x * 2.0 + y, donate_argnums=(0,))
    xd = fusec.device_put(a)
    out = g(xd, a)
    np.testing.assert_allclose(np.asarray(out), a64 * 2 + a64, rtol=1e-6)


@pytest.mark.parametrize("mkn", [(1, 5, 3), (64, 64, 64), (100, 37, 130), (33, 200, 65)])
def test_matmul_kernels(target: str, mkn: tuple[int, int, int], rng: np.random.Generator) -> None:
    # the GPU target uses the register-blocked template from 32x32 outputs on; odd sizes pad
    m, k, n = mkn
    a = rng.standard_normal((2, m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = rng.standard_normal(n).astype(np.float32)
    f = fusec.gpu_jit(lambda x, y, z: nn.relu(x @ y + z) + x.sum(axis=-1, keepdims=True))
    want = np.maximum(a.astype(np.float64) @ b + c, 0) + a.astype(np.float64).sum(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(f(a, b, c)), want, rtol=1e-4, atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize("block", [(128, 128, 16, 8, 8), (64, 128, 16, 4, 8), (64, 192, 16, 4, 12),
                                   (64, 64, 8, 8, 4), (128, 64, 16, 16, 4), (64, 64, 16, 16, 4),
                                   (128, 64, 8, 8, 4), (16, 256, 32, 4, 16), (64, 64, 8, 0, 4)])
@pytest.mark.usefixtures("gpu_target")
def test_matmul_block_configurations(block: tuple[int, ...], rng: np.random.Generator,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Every valid register-blocked configuration (16 x BM / TM threads: 64, 128 or 256)
    computes the product; an invalid one (tiles that its threads cannot load in whole rounds) is
    refused, never run."""
    from fusec import codegen

    monkeypatch.setattr(codegen, "MATMUL_BLOCK", block)
    a = rng.standard_normal((150, 70)).astype(np.float32)
    b = rng.standard_normal((70, 200)).astype(np.float32)
    f = fusec.gpu_jit(lambda x, y: x @ y)
    # 256 threads cannot load 8 x 64 in whole rounds; a 16-row A tile is too narrow for the
    # swizzle; no thread block of 0 rows
    if block in ((128, 64, 8, 8, 4), (16, 256, 32, 4, 16), (64, 64, 8, 0, 4)):
        with pytest.raises(ValueError, match="does not fit"):
            f.lower(a, b)
        return
    np.testing.assert_allclose(np.asarray(f(a, b)), a.astype(np.float64) @ b, rtol=1e-4,
                               atol=1e-4 * np.sqrt(70))


@pytest.mark.parametrize("mode", ["staged", "direct", "rows", "auto"])
@pytest.mark.parametrize("block", [(128, 128, 16, 8, 8), (64, 64, 16, 4, 4), (64, 128, 16, 4, 8),
                                   (128, 64, 16, 8, 4), (128, 128, 8, 8, 8), (64, 192, 16, 4, 12),
                                   (64, 64, 8, 8, 4)])
@pytest.mark.usefixtures("gpu_target")
def test_matmul_epilogue_stores(mode: str, block: tuple[int, ...], rng: np.random.Generator,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way of computing a register-blocked product's epilogue (staged through workgroup
    memory in rounds of rows; straight from the registers, every element at once or a row at a
    time in a loop, which "auto" takes on the GPU target) gives every element once: odd sizes
    with partial edge tiles, a batch, a bias, a row-broadcast operand and two outputs."""
    from fusec import codegen

    monkeypatch.setattr(codegen, "MATMUL_BLOCK", block)
    monkeypatch.setattr(codegen, "MATMUL_EPILOGUE", mode)
    a = rng.standard_normal((2, 131, 45)).astype(np.float32)
    b = rng.standard_normal((45, 257)).astype(np.float32)
    c = rng.standard_normal(257).astype(np.float32)
    r = rng.standard_normal((2, 131, 1)).astype(np.float32)
    f = fusec.gpu_jit(lambda x, y, z, s: (x @ y, nn.gelu(x @ y + z) * s))
    wgsl = f.lower(a, b, c, r).kernels[0].wgsl
    assert ("The epilogue, staged" in wgsl) == (mode == "staged")
    # (gelu's exp and division: "auto" takes the row loop on the GPU target)
    assert ("for (var i = 0u; i < nrows;" in wgsl) == (mode in ("rows", "auto"))
    p, g = f(a, b, c, r)
    p64 = a.astype(np.float64) @ b
    h = p64 + c
    want = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3))) * r
    np.testing.assert_allclose(np.asarray(p), p64, rtol=1e-4, atol=1e-4 * np.sqrt(45))
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-4, atol=2e-4 * np.sqrt(45))


@pytest.mark.parametrize("target", ["gpu", "cpu"])
def test_auto_epilogue_takes_the_row_loop_for_special_functions_on_gpus(
        target: str, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under FUSEC_MATMUL_EPILOGUE=auto a register-blocked product computes an epilogue with an op
    beyond plain arithmetic (an exponential, a division) a row of each thread's block at a time
    on the GPU target, and one of plain ops (bias, relu, a residual, a scale) as straight-line
    code; the cpu target always takes straight-line code. Every form gives the right values."""
    from fusec import codegen

    monkeypatch.setattr(codegen, "MATMUL_EPILOGUE", "auto")
    monkeypatch.setattr(codegen, "MATMUL_BLOCK", (64, 64, 16, 4, 4))
    a = rng.standard_normal((70, 33)).astype(np.float32)
    b = rng.standard_normal((33, 101)).astype(np.float32)
    c = rng.standard_normal(101).astype(np.float32)
    h = a.astype(np.float64) @ b + c
    cases = [(lambda x, y, z: nn.relu(x @ y + z) * 0.5 - x[:, :1],
              np.maximum(h, 0) * 0.5 - a[:, :1], False),
             (lambda x, y, z: fnp.exp(x @ y + z), np.exp(h), True),
             (lambda x, y, z: (x @ y + z) / (1.0 + (x @ y) ** 2), h / (1 + (h - c) ** 2), True)]
    with forced_target(target):
        for fn, want, special in cases:
            f = fusec.gpu_jit(fn)
            (kernel,) = f.lower(a, b, c).kernels
            assert ("i < nrows" in kernel.wgsl) == (special and target == "gpu")
            np.testing.assert_allclose(np.asarray(f(a, b, c)), want, rtol=2e-5,
                                       atol=2e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("mode", ["staged", "direct"])
@pytest.mark.parametrize("block", [(128, 128, 16, 8, 8), (64, 64, 32, 4, 4)])
@pytest.mark.usefixtures("gpu_target")
def test_matmul_swizzled_a_tile(mode: str, block: tuple[int, ...], rng: np.random.Generator,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """On a device with only 16 KiB of workgroup memory (the WebGPU minimum; lavapipe offers 32)
    the 128x128 and 64x64x32 tiles swizzle the A tile instead of padding it: products with
    partial edge tiles, a batch and an epilogue still come out right."""
    from fusec import codegen
    from fusec.runtime import Runtime

    monkeypatch.setattr(Runtime, "max_workgroup_storage", property(lambda self: 16384))
    monkeypatch.setattr(codegen, "MATMUL_BLOCK", block)
    monkeypatch.setattr(codegen, "MATMUL_EPILOGUE", mode)
    a = rng.standard_normal((2, 131, 45)).astype(np.float32)
    b = rng.standard_normal((45, 257)).astype(np.float32)
    c = rng.standard_normal(257).astype(np.float32)
    f = fusec.gpu_jit(lambda x, y, z: nn.relu(x @ y + z))
    assert "& 7u)" in f.lower(a, b, c).kernels[0].wgsl
    want = np.maximum(a.astype(np.float64) @ b + c, 0)
    np.testing.assert_allclose(np.asarray(f(a, b, c)), want, rtol=1e-4, atol=1e-4 * np.sqrt(45))


@pytest.mark.parametrize("storage", [16384, 32768])
@pytest.mark.parametrize("block", [(128, 128, 8, 8, 8), (128, 128, 16, 8, 8), (128, 64, 16, 8, 4),
                                   (64, 64, 32, 4, 4)])
@pytest.mark.usefixtures("gpu_target")
def test_matmul_pipelined_tiles_and_vec4_b(block: tuple[int, ...], storage: int,
                                           rng: np.random.Generator,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The 128x128 tile keeps two sets of tiles where two fit the device's workgroup memory, and
    every register-blocked tile reads B as vec4s where B is an input of its own with N a multiple
    of 4: batched and broadcast operands, partial edge tiles and a K that is no multiple of BK
    (the last step's prefetch reads nothing), with and without an epilogue, B cut into chunks of
    K by split_k (and padded with zero rows where the chunks do not divide K); B also read by the
    epilogue, or B the same buffer as A, keep scalar loads."""
    from fusec import codegen
    from fusec.runtime import Runtime

    monkeypatch.setattr(Runtime, "max_workgroup_storage", property(lambda self: storage))
    monkeypatch.setattr(codegen, "MATMUL_BLOCK", block)
    bm, bn, bk = block[:3]
    pipelined = bm * bn >= 128 * 128 and 2 * 16 * bk * (bm + bn) // 4 <= storage
    a = rng.standard_normal((2, 131, 45)).astype(np.float32)
    b = rng.standard_normal((2, 45, 260)).astype(np.float32)
    b2 = rng.standard_normal((45, 260)).astype(np.float32)
    c = rng.standard_normal(260).astype(np.float32)
    s, s2 = (rng.standard_normal((148, 148)).astype(np.float32) for _ in range(2))
    a64, b64, b264, s64, s264 = (x.astype(np.float64) for x in (a, b, b2, s, s2))
    # split along K (8 chunks): K = 4096 reshaped, K = 4100 also padded to 8 chunks of 513
    p, q = rng.standard_normal((64, 4100)).astype(np.float32), rng.standard_normal(
        (4100, 260)).astype(np.float32)
    p64, q64 = p.astype(np.float64), q.astype(np.float64)
    cases = [
        (lambda x, y: x @ y, (a, b), a64 @ b64, True),
        (lambda x, y, z: nn.relu(x @ y + z), (a, b2, c), np.maximum(a64 @ b264 + c, 0), True),
        (lambda x, y: x @ y, (a[0], b2), a64[0] @ b264, True),
        (lambda x, y: x @ y, (a, b[:, :, :45].copy()), a64 @ b64[:, :, :45], False),  # N = 45
        (lambda x: x @ x, (s,), s64 @ s64, False),
        (lambda x, y: x @ y + y, (s, s2), s64 @ s264 + s264, False),  # the epilogue reads y
        (lambda x, y: x @ y, (p[:, :4096].copy(), q[:4096].copy()), p64[:, :4096] @ q64[:4096],
         True),
        (lambda x, y: x @ y, (p, q), p64 @ q64, True),
    ]
    for fn, args, want, vec in cases:
        f = fusec.gpu_jit(fn)
        mm = next(k for k in f.lower(*args).kernels if k.kind == "matmul")
        assert ("let cur = " in mm.wgsl) == pipelined
        assert ("read> in1: array<vec4<f32>>" in mm.wgsl) == vec
        # the epilogue stores runs of 4 columns as vec4s where N is a multiple of 4
        assert ("out0: array<vec4<f32>>" in mm.wgsl) == (want.shape[-1] % 4 == 0)
        padded = args[0].shape[-1] == 4100
        # past the end of a padded B the pipelined tile skips the read, the others select zero;
        # the pipelined tile tests every vec4 read of B (measured faster, see _b_vec_index)
        assert ("b4 = select(" in mm.wgsl) == (padded and not pipelined)
        assert ("the loop faster" in mm.wgsl) == (vec and pipelined)
        scale = np.sqrt(args[0].shape[-1]) * max(1.0, float(np.abs(want).max()) / 50)
        np.testing.assert_allclose(np.asarray(f(*args)), want, rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.parametrize("storage", [16384, 32768])
@pytest.mark.parametrize("block", [(128, 128, 16, 8, 8), (128, 64, 16, 8, 4), (64, 64, 32, 4, 4)])
@pytest.mark.usefixtures("gpu_target")
def test_matmul_strided_b(block: tuple[int, ...], storage: int, rng: np.random.Generator,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    """B a strided view of an input: with K running contiguously (``x @ w.T``, attention's
    ``q @ k^T`` from one projection's heads, a transposed B broadcast along the batch) the B tile
    is loaded along K and stored swizzled; with rows of B's columns that start on vec4s
    (attention's ``p @ v``, v's heads) it is read as vec4s. A in which M runs contiguously
    (``x.T @ y``) is loaded a row per neighbouring thread. Every tile, both workgroup memory
    sizes, ragged edges and a K that is no multiple of BK, against float64 numpy."""
    from fusec import codegen
    from fusec.runtime import Runtime

    monkeypatch.setattr(Runtime, "max_workgroup_storage", property(lambda self: storage))
    monkeypatch.setattr(codegen, "MATMUL_BLOCK", block)
    s, h, dh = 97, 3, 36  # at least 32 columns: the register-blocked tiles

    def heads(x: fusec.Array, t: tuple[int, ...]) -> fusec.Array:
        return fnp.transpose(fnp.reshape(x, (s, h, dh)), t)

    def heads64(x: np.ndarray, t: tuple[int, ...]) -> np.ndarray:
        return x.astype(np.float64).reshape(s, h, dh).transpose(t)

    x = rng.standard_normal((131, 45)).astype(np.float32)
    w = rng.standard_normal((260, 45)).astype(np.float32)
    w2 = rng.standard_normal((133, 37)).astype(np.float32)
    x2 = rng.standard_normal((2, 70, 37)).astype(np.float32)
    q, k, v = (rng.standard_normal((s, h * dh)).astype(np.float32) for _ in range(3))
    p = rng.standard_normal((h, s, s)).astype(np.float32)
    xt = rng.standard_normal((45, 131)).astype(np.float32)
    x2t = rng.standard_normal((2, 37, 70)).astype(np.float32)
    y = rng.standard_normal((45, 260)).astype(np.float32)
    xt64, x2t64, y64 = (a.astype(np.float64) for a in (xt, x2t, y))
    x64, w64, w264, x264 = (a.astype(np.float64) for a in (x, w, w2, x2))
    cases = [  # function, arguments, float64 result, how B is read
        (lambda a, b: a @ b.T, (x, w), x64 @ w64.T, "cols"),
        (lambda a, b: nn.relu(a @ b.T), (x[:, :37].copy(), w2), np.maximum(x64[:, :37] @ w264.T, 0),
         "cols"),
        (lambda a, b: a @ fnp.transpose(b), (x2, w2), x264 @ w264.T, "cols"),
        (lambda a, b: heads(a, (1, 0, 2)) @ heads(b, (1, 2, 0)), (q, k),
         heads64(q, (1, 0, 2)) @ heads64(k, (1, 2, 0)), "cols"),
        (lambda a, b: a @ heads(b, (1, 0, 2)), (p, v), p.astype(np.float64) @ heads64(v, (1, 0, 2)),
         "vec4"),
        # A transposed (M runs contiguously): loaded a row per neighbouring thread
        (lambda a, b: a.T @ b, (xt, y), xt64.T @ y64, "vec4 rows"),
        (lambda a, b: a.T @ b.T, (xt, w), xt64.T @ w64.T, "cols rows"),
        (lambda a, b: fnp.transpose(a, (0, 2, 1)) @ b, (x2t, y[:37]), x2t64.transpose(0, 2, 1)
         @ y64[:37], "vec4 rows"),
    ]
    for fn, args, want, how in cases:
        f = fusec.gpu_jit(fn)
        mm = next(kk for kk in f.lower(*args).kernels if kk.kind == "matmul")
        assert ("B is read along K" in mm.wgsl) == ("cols" in how)
        assert ("read> in1: array<vec4<f32>>" in mm.wgsl) == ("vec4" in how)
        assert ("neighbouring threads\n            // read neighbouring rows" in mm.wgsl) == (
            "rows" in how)
        kd = args[0].shape[-2 if "rows" in how else -1]
        np.testing.assert_allclose(np.asarray(f(*args)), want, rtol=1e-4,
                                   atol=1e-4 * np.sqrt(kd) * max(1.0, float(np.abs(want).max())))


LARGE = (128, 128, 16, 8, 8)


@pytest.mark.parametrize("block,mode,k,fused", [
    (None, "auto", 2048, True), (LARGE, "auto", 45, True), (LARGE, "auto", 2048, True),
    (None, "separate", 45, False), (LARGE, "separate", 2048, False), (None, "staged", 2048, True),
    (LARGE, "direct", 2048, True)])
@pytest.mark.usefixtures("gpu_target")
def test_matmul_epilogue_kernel_of_its_own(block: tuple[int, ...] | None, mode: str, k: int,
                                           fused: bool, rng: np.random.Generator,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """On the GPU target an epilogue fuses into the product's kernel on every tile, computed from
    the registers (``auto``, ``direct``) or staged (``staged``); ``separate`` leaves it to an
    elementwise kernel of its own; the results are the same every way."""
    from fusec import codegen
    from fusec.passes import splitk

    monkeypatch.setattr(codegen, "MATMUL_EPILOGUE", mode)
    monkeypatch.setattr(codegen, "MATMUL_BLOCK", block)
    monkeypatch.setattr(splitk, "RB_GROUPS", 0)  # one product kernel, not split along K
    a = rng.standard_normal((37, k)).astype(np.float32)
    b = rng.standard_normal((k, 70)).astype(np.float32)
    c = rng.standard_normal(70).astype(np.float32)
    f = fusec.gpu_jit(lambda x, y, z: nn.relu(x @ y + z))
    kernels = f.lower(a, b, c).kernels
    assert len(kernels) == (1 if fused else 2)
    assert ("max(" in kernels[0].wgsl) == fused  # relu inside the matmul kernel, or not
    staged = "The epilogue, staged" in kernels[0].wgsl
    assert staged == (mode == "staged")
    want = np.maximum(a.astype(np.float64) @ b + c, 0)
    np.testing.assert_allclose(np.asarray(f(a, b, c)), want, rtol=1e-4,
                               atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize("case", [((2,), 7, 50, 300), ((), 16, 33, 256), ((), 1, 1000, 513),
                                  ((3,), 4, 300, 1000), ((), 8, 2048, 257)])
def test_few_row_matmuls(target: str, case: tuple[tuple[int, ...], int, int, int],
                         rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Products with at most 16 rows and at least 256 columns take the few-row (GEMV) template on
    the GPU target: batched, odd sizes, K tiles with a partial last one, split along K or not, with
    an epilogue and the bare product as a second output. (The template takes only a B of at
    least GEMV_MIN_KN elements, too large to run here: the limit is lifted.)"""
    from fusec import codegen

    monkeypatch.setattr(codegen, "GEMV_MIN_KN", 0)
    batch, m, k, n = case
    a = rng.standard_normal(batch + (m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = rng.standard_normal(n).astype(np.float32)
    f = fusec.gpu_jit(lambda x, y, z: (nn.relu(x @ y + z), x @ y))
    r, p = f(a, b, c)
    p64 = a.astype(np.float64) @ b
    tol = dict(rtol=1e-5, atol=1e-5 * np.sqrt(k))
    np.testing.assert_allclose(np.asarray(p), p64, **tol)
    np.testing.assert_allclose(np.asarray(r), np.maximum(p64 + c, 0), **tol)
    gemv = any("Few-row matmul" in kc.wgsl for kc in f.lower(a, b, c).kernels)
    assert gemv == (target == "gpu")


def test_few_row_matmul_nan_and_infinities(rng: np.random.Generator,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """NaN and infinities in either operand of a few-row product come out where numpy puts them
    (the template's zero padding of a partial K tile must not turn inf * 0 into NaN elsewhere)."""
    from fusec import codegen

    monkeypatch.setattr(codegen, "GEMV_MIN_KN", 0)
    m, k, n = 5, 253, 264
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    a[1, 7], a[3, 0] = np.inf, np.nan
    b[5, 2], b[9, 130], b[252, 263] = np.nan, -np.inf, np.inf
    f = fusec.gpu_jit(lambda x, y: x @ y)
    want = a.astype(np.float64) @ b.astype(np.float64)
    with forced_target("gpu"):
        got = np.asarray(f(a, b))
        kernels = f.lower(a, b).kernels
    assert any("Few-row matmul" in kc.wgsl for kc in kernels)
    assert np.isnan(want).any() and np.isinf(want).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))


def test_few_row_template_only_for_a_large_b() -> None:
    """A few-row product whose B is small runs faster on the 16x16 kernel (its few workgroups, one
    per 256 columns, leave the GPU idle): the MiniLM-L6 encoder's products at batch 1x16 take
    the 16x16 kernel, an LLM's vocabulary head or a 4096-wide layer the few-row one; a product
    split along K keeps the choice made for it whole."""
    from fusec import codegen

    for m, k, n, gemv in [(16, 384, 384, False), (16, 1536, 384, False), (16, 384, 1536, False),
                          (8, 4096, 4096, True), (1, 576, 49152, True), (16, 2048, 2048, True)]:
        assert codegen.use_gemv(m, n, "gpu", k) == gemv, (m, k, n)
    with forced_target("gpu"):
        for k, n, gemv in [(384, 384, False), (4096, 4096, True)]:
            lowered = fusec.gpu_jit(lambda x, y: x @ y).lower(
                fusec.ShapeDtype((8, k), np.float32), fusec.ShapeDtype((k, n), np.float32))
            # cut along K (a batch of partial products and their sum), the template chosen for
            # the whole product
            assert [kc.kind for kc in lowered.kernels] == ["matmul", "reduce"], lowered.kernels
            few_row = any("Few-row matmul" in kc.wgsl for kc in lowered.kernels)
            assert few_row == gemv, (k, n)
            if few_row:  # chunks of 128 of K: a tile of 128, not 256 with half of it zeros
                assert "kk0 < 128u" in lowered.kernels[0].wgsl


# (batch, M, K, N, kernels of the GPU target's plan with the few-column template, or 0 for none)
@pytest.mark.parametrize("case", [((), 1024, 4099, 3, 1), ((2,), 700, 1000, 9, 1),
                                  ((), 1031, 257, 12, 1), ((), 1500, 5, 1, 1),
                                  ((3, 2), 171, 300, 4, 1), ((), 1024, 64, 13, 0),
                                  ((), 1023, 64, 8, 0), ((), 1031, 2048, 8, 2)])
def test_few_column_matmuls(target: str, case: tuple[tuple[int, ...], int, int, int, int],
                            rng: np.random.Generator) -> None:
    """Products with at least 1024 rows (batch included) and at most 4 columns, or at most 12
    with K up to 1024, take the few-column template on the GPU target (8, 16 or 32 threads per
    row): batched, odd sizes, K shorter than a tile or ending in a partial one, a last workgroup
    with rows to spare, a transposed operand, with an epilogue and the bare product as a second
    output. 13 columns or 1023 rows do not take it; 8 columns with K = 2048 are first split
    along K, and the chunks take it (the epilogue then runs in the sum's kernel)."""
    batch, m, k, n, want_kernels = case
    a = rng.standard_normal(batch + (k, m)).astype(np.float32)  # used transposed
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = rng.standard_normal(n).astype(np.float32)
    perm = tuple(range(len(batch))) + (len(batch) + 1, len(batch))
    f = fusec.gpu_jit(lambda x, y, z: (nn.relu(fnp.transpose(x, perm) @ y + z),
                                       fnp.transpose(x, perm) @ y))
    r, p = f(a, b, c)
    p64 = np.swapaxes(a, -1, -2).astype(np.float64) @ b
    tol = dict(rtol=1e-5, atol=1e-5 * np.sqrt(k))
    np.testing.assert_allclose(np.asarray(p), p64, **tol)
    np.testing.assert_allclose(np.asarray(r), np.maximum(p64 + c, 0), **tol)
    kernels = f.lower(a, b, c).kernels
    fewcol = any("Few-column matmul" in kc.wgsl for kc in kernels)
    assert fewcol == (target == "gpu" and want_kernels > 0)
    if fewcol:
        assert len(kernels) == want_kernels


def _few_column_product(rng: np.random.Generator, batch: tuple[int, ...], m: int, k: int,
                        n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, float],
                                       list[Any]]:
    """relu(A @ B + c) and the bare A @ B as two outputs of one call, checked against float64
    with NaN and inf in A (a NaN row in both results); A, B, the float64 product, the
    tolerances and the call's kernels."""
    a = rng.standard_normal(batch + (m, k)).astype(np.float32)
    a[..., 3, 5] = np.nan
    a[..., m - 1, k - 1] = np.inf
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = rng.standard_normal(n).astype(np.float32)
    f = fusec.gpu_jit(lambda x, y, z: (nn.relu(x @ y + z), x @ y))
    r, p = f(a, b, c)
    with np.errstate(invalid="ignore"):
        p64 = a.astype(np.float64) @ b
    # A sum of K float32 products in one running total (the cpu target's kernel) rounds each
    # partial sum, which grows like sqrt(j): its error's spread grows like K u / sqrt(6), u =
    # 2^-24, about 2e-4 at K = 8192, and the largest of some 25,000 outputs reaches 5 of those.
    # So past K of about 4500 the bound is 2.5 K u, not 1e-5 sqrt(K) (seed 3237101252134586251
    # gave 9.74e-4 at K = 8192, the sequential float32 sum's own error to the last bit).
    tol = dict(rtol=1e-5, atol=max(1e-5 * np.sqrt(k), 2.5 * k * 2.0 ** -24))
    np.testing.assert_allclose(np.asarray(p), p64, **tol)
    np.testing.assert_allclose(np.asarray(r), np.maximum(p64 + c, 0), **tol)
    assert np.isnan(np.asarray(p)[..., 3, :]).all() and np.isnan(np.asarray(r)[..., 3, :]).all()
    return a, b, p64, tol, f.lower(a, b, c).kernels


# (batch, M, K, N, chunks of K: kernels of the GPU target's plan with the vec4 few-column
# template, or 0 where another template takes the product)
@pytest.mark.parametrize("case", [((), 1024, 4096, 8, 8), ((), 1031, 2052, 9, 1),
                                  ((), 1031, 4104, 12, 2), ((2,), 1030, 2048, 10, 1),
                                  ((2,), 700, 2048, 10, 0),
                                  ((), 1100, 8192, 5, 0), ((), 1024, 4096, 13, 0),
                                  ((), 1023, 4096, 8, 0)])
def test_few_column_vec4_matmuls(target: str, case: tuple[tuple[int, ...], int, int, int, int],
                                 rng: np.random.Generator) -> None:
    """Products with 8 to 12 columns, at least 1024 rows and a K of at least 2048 (times the
    batch), whose A is read as vec4s along K, take the few-column template over vec4 rows on
    the GPU target, cut along K into chunks of 512 or more where that gives more workgroups
    (whole vec4s per chunk: K = 4104 is cut in 2, not 8). Odd sizes: a last workgroup with rows
    to spare, a K ending in a partial tile (2052), columns not a multiple of 4, a batch; with
    an epilogue and the bare product as a second output, NaN and inf in A propagated to their
    rows. A transposed A (not vec4 rows) takes another template, still right."""
    from fusec.passes import splitk

    batch, m, k, n, chunks = case
    a, b, p64, tol, kernels = _few_column_product(rng, batch, m, k, n)
    vec_rows = [kc for kc in kernels if "vec4 rows of A" in kc.wgsl]
    assert bool(vec_rows) == (target == "gpu" and chunks > 0)
    if vec_rows:
        assert f"A[bt] ({m}x{k // chunks})" in vec_rows[0].wgsl
        assert splitk.chunks_for(m, k, n) == chunks or batch
        assert len(kernels) == (2 if chunks > 1 else 1)
    # the same product with A transposed in memory: not vec4 rows, another template
    at = np.ascontiguousarray(np.swapaxes(a, -1, -2))
    g = fusec.gpu_jit(lambda x, y: fnp.swapaxes(x, -1, -2) @ y)
    np.testing.assert_allclose(np.asarray(g(at, b)), p64, **tol)
    assert not any("vec4 rows of A" in kc.wgsl for kc in g.lower(at, b).kernels)


# (M, K, N, lanes, rows a thread of the whole-row template; 0 lanes where another template takes
# the product)
@pytest.mark.parametrize("case", [((4096, 4096, 8), 64, 8), ((2051, 2052, 12), 32, 4),
                                  ((4101, 4100, 12), 64, 8), ((2048, 8192, 12), 128, 4),
                                  ((2048, 2048, 9), 0, 0), ((4095, 2048, 8), 0, 0)])
def test_few_column_whole_row_matmuls(target: str, case: tuple[tuple[int, int, int], int, int],
                                      rng: np.random.Generator) -> None:
    """Products with 8 columns and at least 4096 rows, or 12 and at least 2048, and a K of at
    least 2048, whose A and B both read as vec4s, take the few-column template over whole rows
    on the GPU target: one kernel, K not cut into chunks, the epilogue in it. Odd sizes: rows
    not a multiple of a workgroup's (2051, 4101: the last workgroup has rows to spare), a K
    whose vec4s do not fill the lanes' last step (2052, 4100); NaN and inf in A propagated to
    their rows, with an epilogue and the bare product as a second output. 9 columns (B's rows
    not vec4s), or 8 with 4095 rows, take the chunked template; so does B transposed in memory
    (its rows not runs), still right. An A that the epilogue reads too is read as scalars by the
    same kernel."""
    from fusec import codegen

    (m, k, n), lanes, rows = case
    a, b, p64, tol, kernels = _few_column_product(rng, (), m, k, n)
    whole = [kc for kc in kernels if "over whole rows" in kc.wgsl]
    assert bool(whole) == (target == "gpu" and lanes > 0)
    if whole:
        assert codegen.rowk_plan(m, k) == (lanes, rows, max(codegen.ROWK_THREADS, lanes))
        assert f"A group of {lanes} threads owns {rows} rows" in whole[0].wgsl
        assert len(kernels) == 1
    # B transposed in memory: its rows are not runs of vec4s, so K is cut into chunks again
    bt = np.ascontiguousarray(b.T)
    g = fusec.gpu_jit(lambda x, y: x @ fnp.transpose(y))
    np.testing.assert_allclose(np.asarray(g(a, bt)), p64, **tol)
    assert not any("over whole rows" in kc.wgsl for kc in g.lower(a, bt).kernels)
    if (m, k) == (2051, 2052) and target == "gpu":
        # A also read by the epilogue: not bound as vec4s, read four scalars at a time by the
        # same kernel
        h = fusec.gpu_jit(lambda x, y: x @ y + x[:, :n])
        with np.errstate(invalid="ignore"):
            np.testing.assert_allclose(np.asarray(h(a, b)), p64 + a[:, :n], **tol)
        (kc,) = h.lower(a, b).kernels
        assert "over whole rows" in kc.wgsl and "vec4<f32>(in0[4u * (" in kc.wgsl


# several reductions of one long array: their first stages share one kernel (the array is read
# once), and so do their second stages. Over leading axes with few and with many columns, over
# trailing axes (long rows), and the whole array; float and int results from one kernel.
@pytest.mark.parametrize("shape, axis", [((70001, 4), 0), ((9001, 150), 0), ((3, 100003), 1),
                                         ((300007,), None), ((20, 70001, 3), 1)])
def test_partial_reductions_share_kernels(target: str, shape: tuple[int, ...],
                                          axis: Optional[int], rng: np.random.Generator) -> None:
    x = rng.standard_normal(shape).astype(np.float32)
    k = rng.integers(-5, 5, size=shape).astype(np.int32)
    f = fusec.gpu_jit(lambda a, b: (a.sum(axis=axis), a.max(axis=axis), (a * a).mean(axis=axis),
                                    (a > 0.5).sum(axis=axis), (a * b).min(axis=axis)))
    s, m, ms, npos, mn = (np.asarray(v) for v in f(x, k))
    x64 = x.astype(np.float64)
    n = x.size // s.size
    np.testing.assert_allclose(s, x64.sum(axis), rtol=1e-5, atol=4e-6 * n)
    np.testing.assert_array_equal(m, x.max(axis))
    np.testing.assert_allclose(ms, (x64 * x64).mean(axis), rtol=1e-5)
    np.testing.assert_array_equal(npos, (x > 0.5).sum(axis))
    np.testing.assert_array_equal(mn, (x * k.astype(np.float32)).min(axis))
    kernels = f.lower(x, k).kernels
    firsts = [kc for kc in kernels if "First stage of a multi-stage" in kc.wgsl]
    if target == "gpu" or n >= 65536:  # split (the CPU target leaves shorter columns whole)
        assert len(firsts) == 1 and firsts[0].n_outputs == 5, [kc.name for kc in kernels]
    assert len(kernels) == (2 if firsts else 1), [kc.name for kc in kernels]


# small products (at most 64 outputs, 16 columns, 2^20 multiply-adds, or one row or column): on
# the GPU target a product and a sum over K (split into chunks when long, whatever K), with the
# epilogue in the sum's kernel. Larger products with too few workgroups split K into chunks,
# the last one short (zeros pad it) where their number does not divide K: odd and prime K, one
# output, 64 outputs, 256 and 1320 outputs (the latter on the register-blocked template), int32
@pytest.mark.parametrize("mkn,plan", [
    ((1, 70001, 1), "sum"), ((8, 4097, 8), "sum"), ((1, 5, 1), "sum"), ((64, 33, 1), "sum"),
    ((4, 100003, 3), "padded"), ((8, 300007, 8), "padded"), ((1, 20011, 64), "padded"),
    ((16, 4099, 16), "padded"), ((33, 2049, 40), "padded"), ((2, 8192, 32), "split")])
def test_small_products(target: str, mkn: tuple[int, int, int], plan: str,
                        rng: np.random.Generator) -> None:
    m, k, n = mkn
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = rng.standard_normal(n).astype(np.float32)
    f = fusec.gpu_jit(lambda p, q, r: nn.relu(p @ q + r))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = np.maximum(a64 @ b64 + c, 0.0)
    scale = np.abs(a64) @ np.abs(b64) + np.abs(c)
    err = np.abs(np.asarray(f(a, b, c)) - want)
    assert (err <= 1e-6 * np.sqrt(k) * scale).all(), err.max()
    ai = rng.integers(-50, 50, (m, k)).astype(np.int32)
    bi = rng.integers(-50, 50, (k, n)).astype(np.int32)
    got = np.asarray(fusec.gpu_jit(lambda p, q: p @ q)(ai, bi))
    np.testing.assert_array_equal(got, (ai.astype(np.int64) @ bi).astype(np.int32))
    low = f.lower(a, b, c)
    kinds = [kc.kind for kc in low.kernels]
    if target == "cpu":  # products stay whole on the CPU target
        plan = "whole"
    want_kinds = {"sum": {"reduce"}, "whole": {"matmul"}}.get(plan, {"matmul", "reduce"})
    assert set(kinds) == want_kinds and len(kinds) <= 2, kinds
    assert ("pad" in low.as_text()) == (plan == "padded")


@pytest.mark.usefixtures("gpu_target")
def test_matmul_vec4_stores_and_their_exceptions(rng: np.random.Generator) -> None:
    """The register-blocked epilogue stores runs of 4 columns as vec4s where N is a multiple of
    4, and not where it is not; NaN and infinities stay in their rows and columns. A donated
    input the epilogue reads is not written in place by a matmul (only elementwise kernels are,
    see fusec.passes.memory), so its output is still stored as vec4s."""
    a = rng.standard_normal((131, 45)).astype(np.float32)
    b = rng.standard_normal((45, 260)).astype(np.float32)
    c = rng.standard_normal((131, 260)).astype(np.float32)
    a[3, 7], b[11, 5], c[100, 259] = np.nan, np.inf, -np.inf
    want = a.astype(np.float64) @ b.astype(np.float64) + c
    for donate, n, vec in [((), 260, True), ((), 258, False), ((2,), 260, True)]:
        f = fusec.gpu_jit(lambda x, y, z: nn.relu(x @ y + z), donate_argnums=donate)
        args = (a, b[:, :n].copy(), c[:, :n].copy())
        mm = next(k for k in f.lower(*args).kernels if k.kind == "matmul")
        assert ("out0: array<vec4<f32>>" in mm.wgsl) == vec
        got = np.asarray(f(*(fusec.device_put(v) for v in args)))
        np.testing.assert_allclose(got, np.maximum(want[:, :n], 0), rtol=1e-4, atol=1e-3)
        assert np.isnan(got[3]).all() and np.isposinf(got[:, 5]).sum() >= 1
    # a bare product on the 128x128 tile over K >= VEC_STORES_BARE_K keeps its 4-byte stores
    # (measured slower with vec4s at 4096^3); with a bias it stores vec4s
    from fusec import codegen
    sd = (fusec.ShapeDtype((4096, 4096), "float32"),) * 2
    assert codegen.matmul_config(4096, 4096, "gpu", 4096, 1) == codegen.MATMUL_LARGE
    bare = fusec.gpu_jit(lambda x, y: x @ y).lower(*sd).kernels
    biased = fusec.gpu_jit(lambda x, y, z: x @ y + z).lower(
        *sd, fusec.ShapeDtype((4096,), "float32")).kernels
    assert len(bare) == len(biased) == 1  # not split along K
    bare, biased = bare[0].wgsl, biased[0].wgsl
    assert "out0: array<f32>" in bare and "out0: array<vec4<f32>>" in biased


@pytest.mark.usefixtures("gpu_target")
def test_reshaped_operands_by_axis_groups(rng: np.random.Generator) -> None:
    """An operand reshaped by splitting or merging axes is indexed group by group (a head axis
    split out of a row's columns: no division by the whole row's strides), and one reshaped
    across groups (6x10 read as 4x15) through the group's own flat index: both against float64,
    at odd sizes, in a matmul's operands and in an attention-style head transpose."""
    b, s, h, e = 3, 7, 5, 6
    x = rng.standard_normal((b, h, s, e)).astype(np.float32)
    w = rng.standard_normal((h * e, 9)).astype(np.float32)
    y = rng.standard_normal((6, 10)).astype(np.float32)
    v = rng.standard_normal((15, 11)).astype(np.float32)
    x64, w64, y64, v64 = (t.astype(np.float64) for t in (x, w, y, v))
    f = fusec.gpu_jit(lambda x, w: fnp.transpose(x, (0, 2, 1, 3)).reshape(b, s, h * e) @ w)
    mm = next(k for k in f.lower(x, w).kernels if k.kind == "matmul")
    assert f"/ {e}u;" in mm.wgsl and f"/ {s * h * e}u" not in mm.wgsl
    np.testing.assert_allclose(np.asarray(f(x, w)),
                               x64.transpose(0, 2, 1, 3).reshape(b, s, h * e) @ w64,
                               rtol=1e-5, atol=1e-5)
    g = fusec.gpu_jit(lambda y, v: y.reshape(4, 15) @ v + y.reshape(15, 4).T.sum())
    np.testing.assert_allclose(np.asarray(g(y, v)), y64.reshape(4, 15) @ v64 + y64.sum(),
                               rtol=1e-5, atol=1e-4)


def test_128x192_tiles_where_no_sm_computes_more_columns() -> None:
    """On GPUs, products of 128x128 tiles take 128x192 tiles where those leave the busiest SM
    no more columns to compute: the shapes measured on the H200 (codegen.MATMUL_LARGE_WIDE).
    split_k counts them as 128x128 tiles: its cuts stay as they were."""
    from fusec import codegen
    from fusec.passes import splitk

    wide, large = codegen.MATMUL_LARGE_WIDE, codegen.MATMUL_LARGE
    for (batch, m, k, n), want in [((1, 2048, 1024, 2816), wide), ((1, 2048, 1024, 3072), wide),
                                   ((1, 2048, 2048, 2816), wide), ((1, 4096, 1024, 1536), wide),
                                   ((1, 4096, 1024, 2816), wide), ((1, 1024, 1024, 2816), wide),
                                   ((1, 3072, 1024, 2816), large), ((1, 8192, 1024, 2816), large),
                                   ((1, 2048, 1024, 2048), large), ((1, 2048, 1024, 1024), large),
                                   ((1, 4096, 4096, 4096), large), ((1, 4096, 4096, 1024), large),
                                   ((1, 4096, 128, 4096), large), ((8, 2048, 128, 2048), wide),
                                   ((8, 2048, 2048, 128), large)]:
        assert codegen.matmul_config(m, n, "gpu", k, batch) == want, (batch, m, k, n)
        assert codegen.matmul_config(m, n, "cpu", k, batch) != wide
    # 176 large tiles: whole (RB_WAVE); 4 chunks of 512 rows make 352 (RB_GROUPS)
    assert splitk.rb_chunks_for(1024, 4096, 2816) == 1
    assert splitk.rb_chunks_for(512, 4096, 2816) == 4
    # where two sets of 128x192 tiles do not fit (40 KiB), the large tile's kernel
    assert codegen._fit_storage(wide, 32768) == large
    assert codegen._fit_storage(wide, 16384) == (128, 128, 8, 8, 8)
    assert codegen._fit_storage(wide, 49152) == wide


def test_gate_projection_on_the_gpu_target(rng: np.random.Generator) -> None:
    """2048x1024 @ 1024x2816 with SwiGLU's product as the epilogue, the GPU target's plan: on a
    device that holds two sets of 128x192 tiles (the H100/H200) their pipelined kernel, else the
    128x128 one; against float64 numpy."""
    from fusec.runtime import get_runtime

    rt = get_runtime()
    assert rt is not None
    x = rng.standard_normal((2048, 1024)).astype(np.float32)
    wg = (rng.standard_normal((1024, 2816)) / 32).astype(np.float32)
    g = rng.standard_normal((2048, 2816)).astype(np.float32)
    x[5, 7] = np.nan
    with forced_target("gpu"):
        f = fusec.gpu_jit(lambda a, w, h: nn.silu(h) * (a @ w))
        got = np.asarray(f(x, wg, g))
        kernels = f.lower(x, wg, g).kernels
    with np.errstate(invalid="ignore"):
        want = (g / (1 + np.exp(-g.astype(np.float64)))) * (x.astype(np.float64) @ wg)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert np.isnan(got[5]).all() and not np.isnan(got[6]).any()
    tile = "128x192" if rt.max_workgroup_storage >= 40960 else "128x128"
    assert len(kernels) == 1 and f"computes a {tile} tile" in kernels[0].wgsl


# (batch, M, K, N): odd sizes (a partial tile in every direction, K not a multiple of 16), a
# batch, B read along K (transposed), N under one tile
@pytest.mark.parametrize("case", [((), 257, 77, 401), ((3,), 130, 64, 200), ((), 389, 1031, 385),
                                  ((2,), 129, 33, 100)])
def test_128x192_tiles(target: str, case: tuple[tuple[int, ...], int, int, int],
                       rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 128x192 tile (12 columns a thread) forced on every product: right with an epilogue
    and the bare product as a second output, B transposed, NaN and inf carried to their rows."""
    from fusec import codegen

    monkeypatch.setattr(codegen, "MATMUL_BLOCK", codegen.MATMUL_LARGE_WIDE)
    batch, m, k, n = case
    a = rng.standard_normal(batch + (m, k)).astype(np.float32)
    a[..., 3, 5] = np.nan
    a[..., m - 1, 0] = np.inf
    bt = rng.standard_normal((n, k)).astype(np.float32)  # used transposed
    c = rng.standard_normal(n).astype(np.float32)
    f = fusec.gpu_jit(lambda x, y, z: (nn.gelu(x @ y.T + z), x @ y.T))
    r, p = f(a, bt, c)
    with np.errstate(invalid="ignore"):
        p64 = a.astype(np.float64) @ bt.T.astype(np.float64)
    tol = dict(rtol=1e-5, atol=1e-5 * np.sqrt(k))
    np.testing.assert_allclose(np.asarray(p), p64, **tol)
    q = p64 + c
    with np.errstate(invalid="ignore"):
        gelu = 0.5 * q * (1 + np.tanh(np.sqrt(2 / np.pi) * (q + 0.044715 * q ** 3)))
    np.testing.assert_allclose(np.asarray(r), gelu, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    assert np.isnan(np.asarray(p)[..., 3, :]).all()
    assert any("computes a 128x192 tile" in kc.wgsl for kc in f.lower(a, bt, c).kernels)
