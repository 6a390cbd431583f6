"""Compile-only tests on the generated WGSL: index arithmetic, bool storage, dispatch grids, the
matmul tile, determinism, and pipeline sharing between functions."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
from helpers import REPO, pythonpath

import fusec
import fusec.numpy as fnp
import fusec.passes
from fusec import codegen
from fusec.ir import Op
from fusec.ops import wgsl_literal

S = fusec.ShapeDtype
MAX_DIM = 65535

requires_gpu = pytest.mark.skipif(
    fusec.default_device().is_cpu_fallback,
    reason="needs a wgpu adapter (FUSEC_BACKEND=cpu runs the numpy interpreter)")


def code_of(wgsl: str) -> str:
    """The WGSL without comments (comments may contain '/' and words)."""
    return "\n".join(line.split("//", 1)[0] for line in wgsl.splitlines())


def main_body(wgsl: str) -> str:
    code = code_of(wgsl)
    return code[code.index("fn main"):]


def only_kernel(fn, *specs, **kw) -> codegen.KernelCode:
    lowered = fusec.gpu_jit(fn, **kw).lower(*specs)
    assert len(lowered.kernels) == 1, [k.name for k in lowered.kernels]
    return lowered.kernels[0]


# --- index arithmetic -----------------------------------------------------------------------------


def test_same_shape_inputs_are_indexed_by_gid_directly():
    k = only_kernel(lambda x, y, z: fnp.exp(x) * y + fnp.tanh(z) - x, S((33, 7)), S((33, 7)),
                    S((33, 7)))
    body = main_body(k.wgsl)
    for i in range(3):
        assert f"in{i}[gid]" in body
    assert body.count("in0[") == 1  # x is read once although used twice
    assert "%" not in body
    assert not re.search(r"/", body), body
    assert "out0[gid] = " in body
    assert "if (gid >= 231u)" in body  # sizes are baked into the kernel


def test_reshape_between_same_size_arrays_keeps_gid():
    k = only_kernel(lambda x, y: x.reshape(6, 4) + y, S((4, 6)), S((6, 4)))
    body = main_body(k.wgsl)
    assert "in0[gid]" in body and "in1[gid]" in body
    assert "%" not in body and "/" not in body


def test_trailing_broadcast_uses_modulo():
    k = only_kernel(lambda x, y: x * y, S((3, 5)), S((5,)))
    body = main_body(k.wgsl)
    assert "in0[gid]" in body
    assert "gid % 5u" in body
    assert "/" not in body


def test_leading_broadcast_uses_division():
    k = only_kernel(lambda x, c: x * c, S((3, 5)), S((3, 1)))
    body = main_body(k.wgsl)
    assert "in0[gid]" in body
    assert "gid / 5u" in body
    assert "in1[gid]" not in body


def test_outer_broadcast_indexes_both_operands():
    k = only_kernel(lambda x, y: x + y, S((64, 1)), S((1, 48)))
    body = main_body(k.wgsl)
    assert "gid / 48u" in body and "% 48u" in body
    assert "[gid]" not in body.replace("out0[gid]", "")


def test_scalar_operand_reads_element_zero():
    k = only_kernel(lambda x, s: x * s, S((10,)), S(()))
    assert "in1[0u]" in main_body(k.wgsl)


def test_transpose_rewrites_the_index():
    k = only_kernel(lambda x: x.T * 2.0, S((3, 5)))
    body = main_body(k.wgsl)
    assert "in0[gid]" not in body
    assert "%" in body and "/" in body


# --- bool storage ---------------------------------------------------------------------------------


def test_bool_outputs_are_stored_as_u32():
    k = only_kernel(lambda x, y: x > y, S((8,)), S((8,)))
    code = code_of(k.wgsl)
    assert re.search(r"var<storage, read_write> out0: array<u32>;", code)
    assert "select(0u, 1u, " in main_body(k.wgsl)
    assert "array<bool>" not in code


def test_bool_inputs_are_read_from_u32_words():
    k = only_kernel(lambda m, x, y: fnp.where(m, x, y), S((8,), "bool"), S((8,)), S((8,)))
    code = code_of(k.wgsl)
    assert "var<storage, read> in0: array<u32>;" in code
    assert "(in0[gid] != 0u)" in code
    assert "var<storage, read_write> out0: array<f32>;" in code


def test_bool_reduction_stores_u32():
    k = only_kernel(lambda m: fnp.max(m, axis=1), S((4, 9), "bool"))
    code = code_of(k.wgsl)
    assert "out0: array<u32>" in code
    assert "select(0u, 1u, " in code


def test_bool_results_round_trip_through_the_device():
    x = np.array([1.0, -1.0, 2.0, 0.0], np.float32)
    out = fusec.gpu_jit(lambda x: x > 0.5)(x)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(np.asarray(out), x > 0.5)


# --- dispatch grids -------------------------------------------------------------------------------


@pytest.mark.parametrize("groups", [1, 2, 255, 256, 65535, 65536, 65537, 2**17 + 1, 2**20,
                                    2**24 + 7, 65535 * 65535])
def test_grid_for_never_exceeds_the_limit(groups):
    grid = codegen.grid_for(groups)
    assert len(grid) == 3
    assert all(1 <= d <= MAX_DIM for d in grid), grid
    x, y, z = grid
    assert x * y * z >= groups
    assert x * y * z - groups < x * z  # no more than one partial row of workgroups


def test_grid_for_zero_groups_dispatches_nothing():
    assert codegen.grid_for(0)[0] == 0


def test_grid_for_more_groups_than_a_2d_grid_holds():
    # kernels number workgroups as wid.y * nwg.x + wid.x, so 65535**2 is the most a grid can hold
    groups = 65535 * 65535 + 1
    try:
        grid = codegen.grid_for(groups)
    except fusec.FusecError:
        return  # refusing is fine
    assert all(d <= MAX_DIM for d in grid), f"grid_for({groups}) = {grid}"


def _kernel_eqns(fn, *specs):
    """Kernel equations from the pass pipeline: no device size checks, nothing allocated."""
    traced = fusec.gpu_jit(fn).trace(*specs)
    prog = fusec.passes.run_pipeline(traced.ir, fusec.passes.Options(), check=True)
    return [e for e in prog.eqns if e.op is Op.KERNEL]


def test_large_elementwise_kernel_grid():
    n = 2**24 + 3
    (eqn,) = _kernel_eqns(lambda x: x * 2.0 + 1.0, S((n,)))
    k = codegen.generate(eqn, "cpu")  # one element per thread: more than 65535 workgroups
    gx, gy, gz = k.grid
    assert gx <= MAX_DIM and gy <= MAX_DIM and gz == 1
    assert gy > 1
    assert gx * gy * 256 >= n
    assert "@workgroup_size(256)" in k.wgsl
    assert "wid.y * nwg.x + wid.x" in k.wgsl  # the 2-D grid is folded back into one index
    assert f"if (gid >= {n}u)" in k.wgsl


def test_gpu_elementwise_kernels_do_four_elements_per_thread_and_fold_the_grid():
    n = 2**27 + 5  # 512 MiB: compile-only
    (eqn,) = _kernel_eqns(lambda x: x * 2.0 + 1.0, S((n,)))
    k = codegen.generate(eqn, "gpu")
    gx, gy, gz = k.grid
    assert gx <= MAX_DIM and gy <= MAX_DIM and gz == 1 and gy > 1
    assert gx * gy * 256 * 4 >= n
    assert "for (var k = 0u; k < 4u; k += 1u)" in k.wgsl
    small = codegen.generate(_kernel_eqns(lambda x: x * 2.0, S((1000,)))[0], "gpu")
    assert "for (var k" not in small.wgsl  # small arrays: one element per thread


def test_large_reduction_and_matmul_grids(monkeypatch: pytest.MonkeyPatch):
    # a reduction's launch depends on the target: on a GPU rows of 64 get 32 threads each (8 to a
    # workgroup), or a workgroup each when FUSEC_ROW_THREADS forces 256 threads; on a software
    # adapter a thread per row. All must respect the 65535-per-dimension limit and cover every row.
    lowered = fusec.gpu_jit(lambda x: x.sum(axis=1)).lower(S((70000, 64)))
    (eqn,) = [e for e in lowered.ir.eqns if e.op is Op.KERNEL]
    for threads, target, per_group in ((0, "gpu", 8), (256, "gpu", 1), (0, "cpu", 256)):
        monkeypatch.setattr(codegen, "ROW_THREADS", threads)
        k = codegen.generate(eqn, target)
        gx, gy, gz = k.grid
        assert gx <= MAX_DIM and gy <= MAX_DIM and gz == 1, (target, k.grid)
        assert gx * gy * per_group >= 70000
        assert (gy > 1) == (per_group == 1)  # 70000 workgroups: a second grid dimension
    # the 16x16 baseline (products with fewer than 32 columns) needs 5000 * 16 tiles here: a
    # second grid dimension
    (mm,) = _kernel_eqns(lambda a, b: a @ b, S((5000, 256, 16)), S((5000, 16, 16)))
    gx, gy, gz = codegen.generate(mm, "cpu").grid
    assert gx <= MAX_DIM and gy <= MAX_DIM and gz == 1 and gy > 1
    assert gx * gy >= 5000 * 16
    # register-blocked tiles (both targets): 128x128 on a GPU
    (mm,) = _kernel_eqns(lambda a, b: a @ b, S((300, 256, 16)), S((300, 16, 256)))
    for target in ("gpu", "cpu"):
        gx, gy, gz = codegen.generate(mm, target).grid
        assert gx <= MAX_DIM and gy <= MAX_DIM and gz == 1 and gx * gy >= 300 * 2 * 2


def test_large_grid_kernels_compile():
    # pipelines only: compile() builds them, nothing is allocated or run
    for fn, specs in [(lambda x: x * 2.0 + 1.0, [S((2**24 + 3,))]),
                      (lambda x: x.sum(axis=1), [S((70000, 64))]),
                      (lambda a, b: a @ b, [S((300, 256, 16)), S((300, 16, 256))])]:
        compiled = fusec.gpu_jit(fn).lower(*specs).compile()
        assert isinstance(compiled, fusec.Compiled)


# --- matmul ---------------------------------------------------------------------------------------


def test_matmul_kernel_uses_a_16x16_workgroup_tile():
    k = only_kernel(lambda a, b: a @ b, S((20, 30)), S((30, 17)))
    code = code_of(k.wgsl)
    assert k.kind == "matmul"
    assert "@workgroup_size(16, 16)" in code
    assert "var<workgroup> tile_a: array<array<f32, 16>, 16>;" in code
    assert "var<workgroup> tile_b: array<array<f32, 16>, 16>;" in code
    assert code.count("workgroupBarrier()") >= 2
    # M, N, K that are not multiples of 16 are guarded, not assumed
    assert "row < 20u" in code and "col < 17u" in code and "< 30u" in code
    assert k.grid == (2 * 2, 1, 1)


def test_transposed_matmul_operand_folds_into_the_tile_load():
    k = only_kernel(lambda a, b: a @ b.T, S((20, 4)), S((6, 4)))  # one kernel: no transpose pass
    assert k.kind == "matmul"
    assert "var<workgroup> tile_b" in k.wgsl


# --- literals -------------------------------------------------------------------------------------


def test_wgsl_literals():
    assert wgsl_literal(1.0, "float32") == "1.0f"
    assert wgsl_literal(0.1, "float32") == f"{float(np.float32(0.1))!r}f"
    # through a helper call, never a constant expression (Chrome's Tint rejects a non-finite one)
    assert wgsl_literal(float("inf"), "float32") == "fusec_f32_bits(0x7f800000u)"
    assert wgsl_literal(-(2**31), "int32") == "i32(-2147483647 - 1)"
    assert wgsl_literal(7, "uint32") == "7u"
    assert wgsl_literal(True, "bool") == "true"


def test_infinite_constants_compile():
    f = fusec.gpu_jit(lambda x: fnp.where(x > 0, x, -np.inf))
    k = f.lower(S((5,))).kernels[0]
    assert "fusec_f32_bits(0xff800000u)" in k.wgsl and "fn fusec_f32_bits" in k.wgsl
    x = np.array([1, -1, 2, -3, 0], np.float32)
    np.testing.assert_array_equal(np.asarray(f(x)), np.where(x > 0, x, -np.inf))


# --- determinism ----------------------------------------------------------------------------------


def block(x, w, b):
    h = x @ w + b
    return fnp.maximum(h, 0.0).sum(axis=0), fnp.exp(h - h.max(axis=1, keepdims=True))


BLOCK_SPECS = (S((9, 20)), S((20, 7)), S((7,)))


def test_wgsl_is_deterministic_within_a_process():
    a = fusec.gpu_jit(block).lower(*BLOCK_SPECS)
    b = fusec.gpu_jit(block).lower(*BLOCK_SPECS)
    assert a.as_text("wgsl") == b.as_text("wgsl")
    assert [k.key for k in a.kernels] == [k.key for k in b.kernels]
    assert [k.grid for k in a.kernels] == [k.grid for k in b.kernels]


_CHILD = textwrap.dedent("""
    import hashlib, fusec, fusec.numpy as fnp
    S = fusec.ShapeDtype
    def block(x, w, b):
        h = x @ w + b
        return fnp.maximum(h, 0.0).sum(axis=0), fnp.exp(h - h.max(axis=1, keepdims=True))
    low = fusec.gpu_jit(block).lower(S((9, 20)), S((20, 7)), S((7,)))
    print(hashlib.sha256(low.as_text("wgsl").encode()).hexdigest())
    print(" ".join(k.key for k in low.kernels))
""")


def test_wgsl_is_identical_in_another_process():
    import hashlib

    low = fusec.gpu_jit(block).lower(*BLOCK_SPECS)
    env = dict(os.environ, PYTHONPATH=pythonpath(), PYTHONHASHSEED="7",
               XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"))
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True,
                         timeout=120, cwd=str(REPO))
    assert out.returncode == 0, out.stderr
    digest, keys = out.stdout.splitlines()[:2]
    assert digest == hashlib.sha256(low.as_text("wgsl").encode()).hexdigest()
    assert keys.split() == [k.key for k in low.kernels]


def test_as_text_wgsl_holds_every_kernel():
    low = fusec.gpu_jit(block).lower(*BLOCK_SPECS)
    text = low.as_text("wgsl")
    assert len(low.kernels) >= 3
    for k in low.kernels:
        assert k.wgsl in text
        assert f"// kernel {k.name} ({k.kind})" in text
    assert text.count("fn main") == len(low.kernels)
    with pytest.raises(ValueError):
        low.as_text("ptx")


# --- pipeline sharing -----------------------------------------------------------------------------


@requires_gpu
def test_two_functions_with_the_same_kernel_share_its_pipeline():
    def first(x):
        return fnp.sin(x) * 3.0 - x

    def second(anything):
        return fnp.sin(anything) * 3.0 - anything

    x = np.linspace(-1, 1, 37 * 11, dtype=np.float32).reshape(37, 11)
    f1, f2 = fusec.gpu_jit(first), fusec.gpu_jit(second)
    assert [k.key for k in f1.lower(x).kernels] == [k.key for k in f2.lower(x).kernels]

    c0 = fusec.cache_info()
    r1 = f1(x)
    c1 = fusec.cache_info()
    r2 = f2(x)
    c2 = fusec.cache_info()
    d1, d2 = c1 - c0, c2 - c1
    assert d1.pipelines_compiled == 1 and d1.traces == 1
    assert d2.traces == 1  # a different function is traced...
    assert d2.pipelines_compiled == 0  # ...but its kernel's pipeline is reused
    assert d2.pipeline_hits == 1
    want = np.sin(x) * 3 - x
    np.testing.assert_allclose(np.asarray(r1), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(r2), want, rtol=1e-5, atol=1e-6)


def test_matmul_tile_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 128x128 tile from 96 such tiles on (batch included, whatever K; 128x192 where those
    share the columns out better: see test_targets), but 64x192 where
    there are fewer than 128 and at most 128 of those, and 64x64 tiles of 128 threads over a
    short K (up to 512 under 128 large tiles, up to 384 up to 512 of them, on GPUs); 128x64 for
    fewer (from 64), 64x64 for fewer still or a side under 128; the 16x16 baseline under 32 (or
    for a K too long for a software adapter's loop budget)."""
    monkeypatch.setattr(codegen, "MATMUL_BLOCK", None)
    large, medium, small = codegen.MATMUL_LARGE, codegen.MATMUL_MEDIUM, codegen.MATMUL_SMALL
    wide, thin = codegen.MATMUL_WIDE, codegen.MATMUL_THIN
    assert codegen.matmul_config(4096, 4096, "gpu", 4096) == large
    assert codegen.matmul_config(2048, 2048, "gpu", 2047) == large  # 256 tiles
    assert codegen.matmul_config(4096, 4096, "gpu", 1024) == large  # 1024 tiles, K 1024
    assert codegen.matmul_config(2048, 1024, "gpu", 2816) == large  # 128 tiles
    assert codegen.matmul_config(2048, 1024, "gpu", 128) == thin  # 128 tiles, short K
    assert codegen.matmul_config(2048, 1024, "cpu", 128) == large  # (GPUs only)
    assert codegen.matmul_config(4096, 1536, "gpu", 384) == thin  # 384 tiles, K 384
    assert codegen.matmul_config(4096, 1024, "gpu", 256) == thin  # 256 tiles, K 256
    assert codegen.matmul_config(2048, 2048, "gpu", 512) == large  # 256 tiles, K 512
    assert codegen.matmul_config(4096, 4096, "gpu", 128) == large  # 1024 tiles
    # batch counts: 2048 tiles, and 1408 of 128x192 leave no SM more columns (at 95%)
    assert codegen.matmul_config(2048, 2048, "gpu", 128, batch=8) == codegen.MATMUL_LARGE_WIDE
    assert codegen.matmul_config(2048, 2048, "gpu", 128, batch=4) == large
    assert codegen.matmul_config(1920, 1000, "gpu", 1024) == large  # 120 tiles; 30 x 6 wide
    assert codegen.matmul_config(3072, 512, "gpu", 1024) == large  # 96 tiles; 48 x 3 wide
    assert codegen.matmul_config(3072, 512, "gpu", 512) == thin  # ... K 512
    assert codegen.matmul_config(4096, 384, "gpu", 1536) == wide  # 96 tiles; 64 x 2 wide
    assert codegen.matmul_config(4096, 384, "gpu", 384) == thin  # ... K 384
    assert codegen.matmul_config(4096, 384, "cpu", 384) == wide
    assert codegen.matmul_config(128, 384, "gpu", 1536, batch=32) == wide  # batched
    assert codegen.matmul_config(128, 384, "gpu", 384, batch=32) == thin
    assert codegen.matmul_config(2048, 768, "gpu", 768) == wide  # 96 tiles; 32 x 4 wide
    assert codegen.matmul_config(1920, 768, "gpu", 1024) == medium  # 15 x 6 = 90 tiles
    assert codegen.matmul_config(1024, 1024, "gpu", 1024) == medium  # 64 tiles
    assert codegen.matmul_config(1024, 1024, "gpu", 4096) == medium  # 64 tiles, long K
    assert codegen.matmul_config(1000, 1000, "gpu", 1024) == medium  # 8 x 8 = 64 tiles
    assert codegen.matmul_config(896, 1000, "gpu", 1024) == small  # 7 x 8 = 56 tiles
    assert codegen.matmul_config(512, 512, "gpu", 4096) == small  # 16 tiles
    assert codegen.matmul_config(4096, 100, "gpu", 4096) == small
    # software adapters take the same tiles (5-12x faster there than the 16x16 baseline), unless
    # the loop over K would pass their loop budget
    assert codegen.matmul_config(4096, 4096, "cpu", 4096) == large
    assert codegen.matmul_config(4096, 4096, "cpu", 16 * codegen.LOOP_BUDGET + 16) is None
    assert codegen.matmul_config(31, 4096, "gpu", 4096) is None
    monkeypatch.setattr(codegen, "MATMUL_BLOCK", (64, 128, 16, 4, 8))
    assert codegen.matmul_config(4096, 4096, "gpu", 4096) == (64, 128, 16, 4, 8)


# --- workgroup memory ---------------------------------------------------------------------------

WEBGPU_MIN_WORKGROUP_STORAGE = 16384  # bytes every WebGPU device offers


def _wgsl_type_bytes(ty: str) -> int:
    ty = ty.strip()
    m = re.fullmatch(r"array<(.+),\s*(\d+)>", ty)
    if m:
        return _wgsl_type_bytes(m.group(1)) * int(m.group(2))
    m = re.fullmatch(r"vec(\d)<(\w+)>", ty)
    if m:
        return int(m.group(1)) * _wgsl_type_bytes(m.group(2))
    assert ty in ("f32", "i32", "u32"), ty
    return 4


def workgroup_bytes(wgsl: str) -> int:
    decls = re.findall(r"var<workgroup>\s+\w+\s*:\s*(.+?);", code_of(wgsl))
    return sum(_wgsl_type_bytes(d) for d in decls)


def test_workgroup_bytes_parser() -> None:
    assert workgroup_bytes("var<workgroup> t: array<vec4<f32>, 1024>;") == 16384
    assert workgroup_bytes("var<workgroup> a: array<array<f32, 16>, 16>;\n"
                           "var<workgroup> b: array<u32, 8>; // c") == 1024 + 32


@pytest.mark.parametrize("block", [None, (128, 128, 16, 8, 8), (128, 64, 16, 8, 4),
                                   (64, 64, 32, 4, 4), (64, 128, 16, 4, 8), (128, 128, 8, 8, 8),
                                   (64, 192, 16, 4, 12), (64, 64, 8, 8, 4)])
@pytest.mark.parametrize("mode", ["auto", "staged"])
@pytest.mark.parametrize("storage", [WEBGPU_MIN_WORKGROUP_STORAGE, None])
@pytest.mark.usefixtures("gpu_target")
def test_kernels_fit_the_workgroup_storage(block: tuple[int, ...] | None, mode: str,
                                           storage: int | None,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kernel's workgroup arrays fit the device's workgroup memory: 16 KiB, the least a
    WebGPU device offers (lavapipe and the H100 offer more, so running there would not show an
    overflow: the limit is lowered here), and this device's own. Matmul tiles of every
    configuration, staged or not, row kernels, partial reductions, few-row and few-column
    products."""
    from fusec.runtime import Runtime, get_runtime

    rt = get_runtime()
    assert rt is not None
    if storage is None:
        storage = rt.max_workgroup_storage
    else:
        monkeypatch.setattr(Runtime, "max_workgroup_storage", property(lambda self: storage))
    monkeypatch.setattr(codegen, "MATMUL_BLOCK", block)
    monkeypatch.setattr(codegen, "MATMUL_EPILOGUE", mode)
    from fusec import nn

    programs = [
        (lambda a, b, c: nn.gelu(a @ b + c), [S((300, 4096)), S((4096, 300)), S((300,))]),
        (lambda a, b: a @ b, [S((8, 4096)), S((4096, 4096))]),
        (lambda a, b: a @ b, [S((4096, 256)), S((256, 12))]),
        (lambda a, b: a @ b, [S((20, 70)), S((70, 30))]),
        (lambda x: nn.softmax(x), [S((64, 16384))]),
        (lambda x: (x.sum(axis=0), x.sum()), [S((100003, 7))]),
    ]
    for fn, specs in programs:
        for k in fusec.gpu_jit(fn).lower(*specs).kernels:
            assert 0 <= workgroup_bytes(k.wgsl) <= storage, (k.name, workgroup_bytes(k.wgsl))


@pytest.mark.parametrize("storage,bk,padded", [(16384, 8, False), (32768, 16, False),
                                               (49152, 16, True)])
def test_large_tile_stays_pipelined_on_small_devices(storage: int, bk: int, padded: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The default 128x128 tile keeps two sets of tiles on every device: 16 deep where two such
    sets fit (padded where that fits too), 8 deep on a device with the WebGPU minimum of 16 KiB."""
    monkeypatch.setattr(codegen, "MATMUL_BLOCK", None)
    (eqn,) = _kernel_eqns(lambda a, b: a @ b, S((2048, 1024)), S((1024, 1024)))
    k = codegen.generate(eqn, "gpu", storage)
    body = main_body(k.wgsl)
    assert "let cur = " in body and f"k0 += {bk}u" in body
    assert ("& 7u)" in body) == (not padded)
    assert workgroup_bytes(k.wgsl) == 2 * 16 * bk * (128 // 4 + padded + 128 // 4) <= storage


@pytest.mark.parametrize("storage", [16384, 32768])
@pytest.mark.parametrize("block", [(128, 128, 16, 8, 8), (128, 64, 16, 8, 4), (64, 64, 32, 4, 4),
                                   (128, 128, 8, 8, 8), (64, 192, 16, 4, 12), (64, 64, 8, 8, 4)])
def test_a_tile_padded_where_it_fits_else_swizzled(block: tuple[int, int, int, int, int],
                                                   storage: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The register-blocked A tile avoids bank conflicts by padding its rows when the tiles still
    fit the device's workgroup memory, by an XOR swizzle otherwise; both compute the product. The
    128x128 and 64x192 tiles keep two sets of tiles (pipelined) where two swizzled sets fit."""
    monkeypatch.setattr(codegen, "MATMUL_BLOCK", block)
    bm, bn, bk = block[:3]
    pipelined = bm * bn >= 128 * 128 or (bm, bn) == (64, 192) or block == codegen.MATMUL_THIN
    sets = 2 if pipelined and 2 * 16 * bk * (bm + bn) // 4 <= storage else 1
    padded_bytes = sets * 16 * bk * (bm // 4 + 1 + bn // 4)
    (eqn,) = _kernel_eqns(lambda a, b: a @ b, S((300, 200)), S((200, 300)))
    k = codegen.generate(eqn, "gpu", storage)
    padded = padded_bytes <= storage
    assert ("& 7u)" in main_body(k.wgsl)) == (not padded)
    assert ("let cur = " in main_body(k.wgsl)) == (sets == 2)
    assert workgroup_bytes(k.wgsl) == (padded_bytes if padded else padded_bytes - sets * 16 * bk)


@pytest.mark.usefixtures("gpu_target")
def test_bare_products_of_whole_tiles_store_without_the_bounds_test(
        rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bare product whose rows and columns are whole tiles stores its block unconditionally
    (NVIDIA's compiler builds a faster kernel so); a product with an epilogue, or with an edge
    tile, keeps the bounds test. All of them compute the product (through wgpu)."""
    monkeypatch.setattr(codegen, "MATMUL_BLOCK", (128, 128, 16, 8, 8))
    a = rng.standard_normal((256, 48)).astype(np.float32)
    b = rng.standard_normal((48, 384)).astype(np.float32)
    c = rng.standard_normal(384).astype(np.float32)
    ad, bd = a.astype(np.float64), b.astype(np.float64)
    cases = [(lambda x, y: x @ y, (a, b), ad @ bd, False),
             (lambda x, y, z: x @ y + z, (a, b, c), ad @ bd + c, True),
             (lambda x, y: x @ y, (a[:250], b), ad[:250] @ bd, True),
             (lambda x, y: x @ y, (a, b[:, :383]), ad @ bd[:, :383], True)]
    for fn, args, want, guarded in cases:
        f = fusec.gpu_jit(fn)
        (k,) = f.lower(*args).kernels
        epilogue = k.wgsl[k.wgsl.rindex("workgroupBarrier();"):]
        assert ("if (r" in epilogue) == guarded, epilogue[:400]
        np.testing.assert_allclose(np.asarray(f(*args)), want, rtol=1e-5, atol=1e-4 * 48)


@pytest.mark.usefixtures("cpu_target")
def test_cpu_target_kernels_stay_within_the_software_loop_limit() -> None:
    """Software adapters end an invocation's loops after 65535 iterations in all: on the "cpu"
    target, loops that would pass codegen.LOOP_BUDGET take several elements (or K steps) per
    iteration; the "gpu" target keeps one."""
    assert codegen.LOOP_BUDGET < codegen.SOFTWARE_LOOP_LIMIT
    assert codegen.loop_copies("cpu", 1, 65000) == 1
    assert codegen.loop_copies("cpu", 1, 65001) == 2
    assert codegen.loop_copies("cpu", 5, 22000) == 2  # 5 passes: 55000 iterations
    assert codegen.loop_copies("cpu", 5, 22000, fixed=10001) == 4
    assert codegen.loop_copies("gpu", 5, 10 ** 6) == 1
    f32 = fusec.ShapeDtype
    stats = only_kernel(lambda a: (a.sum(axis=0), (a * a).sum(axis=0), a.max(axis=0)),
                        f32((22000, 300), "float32"))
    # three passes over the column of 22000 (66000 iterations): two elements per iteration
    assert "for (var r0 = 0u; r0 < 22000u; r0 += 2u)" in stats.wgsl
    short = only_kernel(lambda a: (a.sum(axis=0), (a * a).sum(axis=0)),
                        f32((22000, 300), "float32"))
    assert "for (var r = 0u; r < 22000u; r += 1u)" in short.wgsl  # 44000: one
    mm = only_kernel(lambda p, q: p @ q, f32((1, (1 << 21) + 3), "float32"),
                     f32(((1 << 21) + 3, 2), "float32"))
    assert "// 4 steps of K per loop iteration" in mm.wgsl  # 131073 steps of 16
    assert "for (var kk" not in mm.wgsl  # the tile's 16 products written out


def test_reshape_strides_of_views() -> None:
    """A reshape of a strided view keeps it a view where it regroups contiguous runs of axes;
    merging axes that are not contiguous with each other needs a copy (None)."""
    from fusec.codegen import _reshape_strides

    assert _reshape_strides((4, 6), (6, 1), (2, 2, 6)) == [12, 6, 1]
    assert _reshape_strides((4, 6), (6, 1), (4, 2, 3)) == [6, 3, 1]
    assert _reshape_strides((6, 4), (1, 6), (3, 2, 4)) == [2, 1, 6]  # a transposed view, split
    assert _reshape_strides((6, 4), (1, 6), (24,)) is None  # merged across the transpose
    assert _reshape_strides((2, 3, 4), (4, 8, 1), (6, 4)) is None
    # axes of size 1 get stride 0 (their one coordinate is 0)
    assert _reshape_strides((2, 3, 4), (12, 4, 1), (1, 6, 1, 4)) == [0, 4, 0, 1]
    assert _reshape_strides((1, 5), (5, 1), (5, 1)) == [1, 0]


@pytest.mark.parametrize("form", ["b_through_a", "both_from_x"])
def test_matmul_whose_operands_read_one_input(form: str) -> None:
    # B read as vec4s from the input A also reads (as scalars) once made a WGSL type error (found
    # by tests/test_hypothesis.py): such a B is read as scalars too
    rng = np.random.default_rng(3)
    x = rng.integers(-3, 4, 64).astype(np.float32)

    def f(x0: Any) -> Any:
        a = fnp.reshape(-(-x0), (32, 2))
        b = fnp.reshape(a, (2, 32)) if form == "b_through_a" else fnp.reshape(x0, (2, 32))
        return a @ b

    got = np.asarray(fusec.gpu_jit(f)(x))
    np.testing.assert_array_equal(got, x.reshape(32, 2) @ x.reshape(2, 32))
