"""sort, argsort, top_k and searchsorted: against numpy's stable sort, bit for bit, on the device.

A stable sort has one right answer, so every check is exact: indices equal, values equal bit for
bit (NaN payloads and the sign of zero included). Inputs have many ties (stability), NaN, +-inf
and -0.0 (numpy's order: NaN last, -0.0 equal to 0.0). ``descending`` follows JAX: ``sort`` gives
the ascending sort reversed, ``argsort`` the stable descending order (ties in input order).

Compile time on the software adapter dominates this module's run time, so the shapes that need
new kernels are few and chosen to cover the paths: whole rows in workgroup memory, blocks plus
merges (software adapters), and radix passes (GPUs; run here with small blocks on the forced
"gpu" target, whose kernels lavapipe compiles slowly at full size).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import requires_wgpu, subgroup_level

import fusec
import fusec.kernels.sort as ksort
import fusec.numpy as fnp
from fusec.errors import FusecError, ShapeError, TraceError
from fusec.interpret import evaluate
from fusec.ir import KERNEL_KIND, Op
from fusec.numpy.sorting import top_k
from fusec.ops import sort_keys
from fusec.runtime import Runtime, get_runtime

DTYPES = ["float32", "int32", "uint32", "bool"]


# --- references and inputs ------------------------------------------------------------------------


def ref_argsort(x: np.ndarray, axis: int = -1, descending: bool = False) -> np.ndarray:
    """numpy's stable argsort; descending as JAX: stable on the reversed array, mapped back."""
    if not descending:
        return np.argsort(x, axis=axis, kind="stable").astype(np.int32)
    n = x.shape[axis]
    rev = np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
    return (n - 1 - rev).astype(np.int32)


def ref_sort(x: np.ndarray, axis: int = -1, descending: bool = False) -> np.ndarray:
    out = np.take_along_axis(x, np.argsort(x, axis=axis, kind="stable"), axis)
    return np.flip(out, axis) if descending else out


def assert_bits(got: Any, want: np.ndarray) -> None:
    """Equal shape, dtype and bits (NaN payloads and signed zeros included)."""
    got = np.ascontiguousarray(np.asarray(got))
    want = np.ascontiguousarray(want)
    assert got.dtype == want.dtype, f"dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    if got.dtype == np.bool_:
        np.testing.assert_array_equal(got, want)
    else:
        bad = got.view(np.uint32) != want.view(np.uint32)
        assert not bad.any(), (f"{bad.sum()} of {bad.size} differ; first at "
                               f"{np.argwhere(bad)[0]}: got {got[bad][:5]}, want {want[bad][:5]}")


def sample(rng: np.random.Generator, shape: Any, dtype: str) -> np.ndarray:
    """Values with many ties; floats with NaN (two payloads, both signs), +-inf, -0.0 and 0.0."""
    if dtype == "bool":
        return rng.random(shape) < 0.4
    if dtype == "int32":
        return rng.integers(-6, 6, shape).astype(np.int32) * np.int32(300_000_000)
    if dtype == "uint32":
        return (rng.integers(0, 9, shape) * 500_000_000).astype(np.uint32)
    x = (rng.integers(-8, 8, shape) * 0.75).astype(np.float32)
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, -1e-40],
                        dtype=np.float32)
    specials[1] = np.uint32(0x7FC00123).view(np.float32)  # a NaN with a payload
    mask = rng.random(shape) < 0.25
    x[mask] = rng.choice(specials, int(mask.sum()))
    return x


def use_radix(monkeypatch: pytest.MonkeyPatch, block: int = 128, per: int = 2) -> None:
    """The GPU lowering (radix passes) with small blocks (``per`` elements a thread), so that
    short rows take several blocks and lavapipe compiles the kernels quickly; rows of more than
    64 elements take it (with the fixture gpu_target)."""
    monkeypatch.setattr(ksort, "RADIX_BLOCKS", (block,))
    monkeypatch.setattr(ksort, "RADIX_PER_THREAD", per)
    monkeypatch.setattr(ksort, "LOCAL_MAX", 64)


def sorts(axis: Any = -1) -> Any:
    """One jitted function: sort and argsort, ascending and descending."""
    return fusec.gpu_jit(lambda x: (fnp.sort(x, axis=axis), fnp.argsort(x, axis=axis),
                                    fnp.sort(x, axis=axis, descending=True),
                                    fnp.argsort(x, axis=axis, descending=True)))


def check_sorts(outs: Any, x: np.ndarray, axis: Any = -1) -> None:
    if axis is None:
        x, axis = x.ravel(), -1
    s, a, sd, ad = outs
    assert_bits(s, ref_sort(x, axis))
    assert_bits(a, ref_argsort(x, axis))
    assert_bits(sd, ref_sort(x, axis, descending=True))
    assert_bits(ad, ref_argsort(x, axis, descending=True))


# --- sort and argsort -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_sort_and_argsort_rows_every_dtype(rng: np.random.Generator, dtype: str) -> None:
    x = sample(rng, (3, 257), dtype)
    check_sorts(sorts()(x), x)


@pytest.mark.parametrize("shape,axis", [
    ((1,), -1), ((7,), None), ((1000,), 0), ((257, 3), 0), ((257, 3), -1), ((2, 5, 33), 0),
    ((2, 5, 33), 1), ((2, 5, 33), -1), ((2, 5, 33), None),
])
def test_sort_shapes_and_axes(rng: np.random.Generator, shape: tuple[int, ...],
                              axis: Any) -> None:
    x = sample(rng, shape, "float32")
    check_sorts(sorts(axis)(x), x, axis)


def test_argsort_is_stable_with_many_ties(rng: np.random.Generator) -> None:
    x = rng.integers(0, 3, 1000).astype(np.int32)
    got = np.asarray(fnp.argsort(x))
    assert_bits(got, np.argsort(x, kind="stable").astype(np.int32))
    # ties really are in input order: within each value, indices increase
    for v in range(3):
        run = got[x[got] == v]
        assert (np.diff(run) > 0).all()


def test_nan_infinities_and_signed_zeros_sort_as_numpy() -> None:
    nan2 = np.uint32(0xFFC00001).view(np.float32)  # a negative NaN with a payload
    x = np.array([np.nan, 1.0, -0.0, 0.0, -np.inf, np.inf, nan2, 1.0, 0.0, -0.0, -1.0],
                 dtype=np.float32)
    s, a, sd, ad = sorts()(x)
    assert_bits(a, np.array([4, 10, 2, 3, 8, 9, 1, 7, 5, 0, 6], dtype=np.int32))
    assert_bits(s, x[[4, 10, 2, 3, 8, 9, 1, 7, 5, 0, 6]])  # zeros keep their signs, in order
    # descending, as JAX: the ascending values reversed; indices of the stable descending sort
    assert_bits(sd, x[[6, 0, 5, 7, 1, 9, 8, 3, 2, 10, 4]])
    assert_bits(ad, np.array([0, 6, 5, 1, 7, 2, 3, 8, 9, 10, 4], dtype=np.int32))


@requires_wgpu
def test_long_rows_sort_in_blocks_and_merges(rng: np.random.Generator) -> None:
    """Rows longer than a workgroup holds (2^16 + 5): on a software adapter, sorted blocks and
    merge passes; the lowered program's interpretation gives the same bits."""
    x = sample(rng, (2, 2**16 + 5), "float32")
    f = fusec.gpu_jit(lambda x: (fnp.sort(x), fnp.argsort(x, descending=True)))
    s, ad = f(x)
    assert_bits(s, ref_sort(x))
    assert_bits(ad, ref_argsort(x, descending=True))
    lowered = f.lower(x)
    ops = [e.params["body"].eqns[0].op for e in lowered.ir.eqns if e.op is Op.KERNEL
           and e.params["kind"] == "sort"]
    if get_runtime().target == "cpu":  # lavapipe: the software adapters' lowering
        assert Op.SORT_MERGE in ops and Op.SORT_BLOCKS in ops
    si, adi = evaluate(lowered.ir, [x])
    assert_bits(si, np.asarray(s))
    assert_bits(adi, np.asarray(ad))


@pytest.mark.usefixtures("gpu_target")
@pytest.mark.parametrize("dtype,shape,block", [
    ("float32", (3, 1000), 128), ("bool", (3, 1000), 128), ("float32", (2, 3000), 1024)])
def test_radix_passes_sort_long_rows(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch,
                                     dtype: str, shape: tuple[int, int], block: int) -> None:
    """The GPU lowering: 4 radix passes (1 for bool) over rows of several blocks; three sorts
    (the ascending values serve both value sorts). Blocks of 128 take 64 threads (4 digits a
    thread in the offsets' scan), blocks of 1024 take 512 (more threads than digits)."""
    use_radix(monkeypatch, block)
    x = sample(rng, shape, dtype)
    f = sorts()
    check_sorts(f(x), x)
    lowered = f.lower(x)
    names = [k.name for k in lowered.kernels]
    assert sum("radix_scatter" in n for n in names) == (4 if dtype == "float32" else 1) * 3
    for got, want in zip(evaluate(lowered.ir, [x]), f(x)):
        assert_bits(got, np.asarray(want))


@pytest.mark.usefixtures("gpu_target")
@pytest.mark.parametrize("dtype", ["int32", "uint32"])
def test_radix_stage_references_compose_to_a_stable_sort(
        rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    """The interpreter runs the radix stages' numpy references: together they must give the
    stable sort (no GPU compile: the kernels are those of the tests above)."""
    use_radix(monkeypatch)
    x = rng.integers(0, 2**31 - 1, (2, 700)).astype(dtype)
    x[:, ::3] = x[:, :1]  # ties
    f = fusec.gpu_jit(lambda x: (fnp.sort(x), fnp.argsort(x, descending=True)))
    s, ad = evaluate(f.lower(x).ir, [x])
    assert_bits(s, ref_sort(x))
    assert_bits(ad, ref_argsort(x, descending=True))


def test_sort_keys_order_like_numpy(rng: np.random.Generator) -> None:
    x = sample(rng, 2000, "float32")
    k = sort_keys(x)
    order = np.argsort(k, kind="stable")
    assert_bits(order, np.argsort(x, kind="stable"))
    assert (sort_keys(x, descending=True) == ~k).all()


def test_sort_of_an_empty_axis_and_of_one_element() -> None:
    assert_bits(fnp.sort(np.zeros((3, 0), np.float32)), np.zeros((3, 0), np.float32))
    assert_bits(fnp.argsort(np.array([5], np.int32)), np.array([0], np.int32))


def test_sort_methods_and_kind_keyword(rng: np.random.Generator) -> None:
    x = sample(rng, (4, 9), "int32")
    f = fusec.gpu_jit(lambda x: (x.sort(axis=0), x.argsort(), fnp.sort(x, kind="quicksort")))
    s, a, q = f(x)
    assert_bits(s, ref_sort(x, 0))
    assert_bits(a, ref_argsort(x))
    assert_bits(q, ref_sort(x))


# --- top_k ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 5, 37])
def test_top_k_matches_a_stable_descending_sort(rng: np.random.Generator, k: int) -> None:
    x = sample(rng, (4, 37), "float32")
    values, indices = fusec.gpu_jit(lambda x: top_k(x, k))(x)
    # largest first, equal values in index order, NaN counted largest
    want = np.argsort(~sort_keys(x), axis=-1, kind="stable")[:, :k].astype(np.int32)
    assert_bits(indices, want)
    assert_bits(values, np.take_along_axis(x, want, -1))


# --- searchsorted ---------------------------------------------------------------------------------


@pytest.mark.parametrize("side", ["left", "right"])
def test_searchsorted_duplicates_and_nan(rng: np.random.Generator, side: str) -> None:
    a = np.sort(rng.integers(-5, 5, 300).astype(np.float32))
    a[-7:] = np.nan  # sorted as numpy sorts: NaN last
    v = np.concatenate([rng.integers(-7, 7, 50).astype(np.float32) * 0.5,
                        np.array([np.nan, -0.0, 0.0, np.inf, -np.inf], np.float32)])
    a[100:110] = -0.0  # -0.0 and 0.0 compare equal
    a = np.sort(a)
    got = fusec.gpu_jit(lambda a, v: fnp.searchsorted(a, v, side=side))(a, v)
    assert_bits(got, np.searchsorted(a, v, side=side).astype(np.int32))


def test_searchsorted_promotes_scalars_and_uses_sorter(rng: np.random.Generator) -> None:
    a = rng.integers(0, 20, 41).astype(np.int32)
    order = np.argsort(a, kind="stable").astype(np.int32)
    v = rng.integers(-2, 22, (3, 4)).astype(np.int32)
    f = fusec.gpu_jit(lambda a, v, s: (fnp.searchsorted(a, v, sorter=s),
                                       fnp.searchsorted(fnp.sort(a), 7.5),
                                       fnp.searchsorted(a, v, side="right", sorter=s)))
    g, h, r = f(a, v, order)
    assert_bits(g, np.searchsorted(a, v, sorter=order).astype(np.int32))
    assert_bits(h, np.asarray(np.searchsorted(np.sort(a), 7.5), np.int32))
    assert_bits(r, np.searchsorted(a, v, side="right", sorter=order).astype(np.int32))


# --- errors ---------------------------------------------------------------------------------------


def test_sort_along_a_missing_axis_names_it() -> None:
    x = np.zeros((3, 4), np.float32)
    for fn in (fnp.sort, fnp.argsort):
        with pytest.raises(ShapeError, match="axis 2 is out of bounds.*2 dimensions"):
            fn(x, axis=2)
        with pytest.raises(ShapeError, match="axis -3"):
            fn(x, axis=-3)
    with pytest.raises(ShapeError, match="sort: axis 1 is out of bounds"):
        fusec.gpu_jit(lambda x: fnp.sort(x, axis=1))(x[0])
    with pytest.raises(ShapeError, match="axis -1 is out of bounds.*0 dimensions"):
        fnp.sort(np.float32(1.0))
    with pytest.raises(TraceError, match="axis must be an int"):
        fnp.sort(x, axis=1.5)


def test_top_k_and_searchsorted_errors() -> None:
    x = np.zeros((2, 5), np.float32)
    with pytest.raises(ShapeError, match="k=6 must be between 0 and the last axis' length 5"):
        top_k(x, 6)
    with pytest.raises(ShapeError, match="k=-1"):
        top_k(x, -1)
    with pytest.raises(ShapeError, match="0-d"):
        top_k(np.float32(3.0), 1)
    with pytest.raises(ShapeError, match="a must be 1-D; got an array of shape \\(2, 5\\)"):
        fnp.searchsorted(x, 1.0)
    with pytest.raises(FusecError, match="side must be 'left' or 'right'"):
        fnp.searchsorted(x[0], 1.0, side="middle")
    with pytest.raises(ShapeError, match="sorter must have a's shape"):
        fnp.searchsorted(x[0], 1.0, sorter=np.arange(4, dtype=np.int32))


# --- the lowering ---------------------------------------------------------------------------------


def test_sort_ops_are_kernels_of_their_own_kind() -> None:
    for op in (Op.ARGSORT, Op.SORT, Op.RADIX_HIST, Op.RADIX_SCAN, Op.RADIX_SCATTER,
               Op.SORT_BLOCKS, Op.SORT_MERGE, Op.SEARCHSORTED):
        assert KERNEL_KIND[op] == "sort"


@requires_wgpu
@pytest.mark.usefixtures("gpu_target")
def test_gpu_lowering_of_a_long_row_is_four_radix_passes(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """Compile-only: 2^20 float32 on a GPU with 48 KiB of workgroup memory (an H100): 4 passes
    of (histogram, scan, scatter) over blocks of 8192 moving the keys alone, the last writing the
    values (no gather), then the zeros' and NaNs' count and fixup. An argsort moves (key, index)
    pairs and needs no fixup; an int32 sort none either."""
    monkeypatch.setattr(Runtime, "max_workgroup_storage", property(lambda self: 49152))
    f = fusec.gpu_jit(lambda x: fnp.sort(x))
    lowered = f.lower(fusec.ShapeDtype((1 << 20,), "float32"))
    names = [k.name.split("_", 1)[1] for k in lowered.kernels]
    assert names == (["sort_radix_hist", "sort_radix_scan", "sort_radix_scatter"] * 4
                     + ["sort_sort_specials", "sort_sort_fixup"])
    scatter = lowered.kernels[2].wgsl
    assert "var<workgroup> sh: array<u32, 8448>" in scatter  # 8192 keys, padded
    assert "@workgroup_size(512)" in scatter
    assert lowered.kernels[2].grid == (128, 1, 1)
    assert "sort_key(" in scatter and "sort_key(" not in lowered.kernels[5].wgsl
    # keys alone: no payload array; the last pass turns keys back into values
    assert "var i: array" not in scatter and "sort_value(" in lowered.kernels[11].wgsl
    assert "sort_value(" not in lowered.kernels[8].wgsl
    state = [e.outs[0] for e in lowered.ir.eqns if e.op is Op.KERNEL][2]
    assert state.shape == (1, 1, 1 << 20)  # one plane: the keys
    args = fusec.gpu_jit(lambda x: fnp.argsort(x)).lower(fusec.ShapeDtype((1 << 20,), "float32"))
    assert len(args.kernels) == 12 and "var i: array" in args.kernels[2].wgsl
    ints = f.lower(fusec.ShapeDtype((1 << 20,), "int32"))
    assert len(ints.kernels) == 12 and "sort_value(" in ints.kernels[11].wgsl


@pytest.mark.usefixtures("gpu_target")
def test_radix_sort_in_a_compiled_loop_body(
        rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sort in a compiled loop's body: its radix passes replay each iteration. (No float
    arithmetic in the body: GPUs may flush the samples' subnormals.)"""
    use_radix(monkeypatch)
    x = sample(rng, (2, 1000), "float32")

    def body(i: Any, acc: Any) -> Any:
        return fnp.sort(acc, axis=-1)[:, ::-1]

    f = fusec.gpu_jit(lambda v: fusec.lax.fori_loop(0, 5, body, v))
    want = x
    for _ in range(5):
        want = ref_sort(want)[:, ::-1]  # (ties of -0.0 and 0.0 swap order each time)
    assert_bits(f(x), want)
    loop = next(e for e in f.lower(x).ir.eqns if e.op is Op.LOOP)
    inner = [e.params["name"] for e in loop.params["body"].eqns if e.op is Op.KERNEL]
    assert any("radix_scan" in n for n in inner), inner


@pytest.mark.usefixtures("gpu_target")
def test_float_sort_of_keys_restores_zeros_and_nans_in_input_order(
        rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """A float sort moves keys alone, which make every zero +0.0 and every NaN one NaN; the fixup
    puts back each zero's sign and each NaN's payload, in input order, across blocks (of 128):
    rows of only zeros, of only NaNs, of zeros and NaNs spread over every block, of none, and of
    values whose keys share the top byte of the zeros' key (subnormals) or the NaNs' (inf and
    values above 1.7e38), which make the count run but find nothing."""
    use_radix(monkeypatch, 128)
    n = 1031  # 9 blocks, the last partly filled
    x = rng.standard_normal((6, n)).astype(np.float32)
    x[0] = np.where(rng.random(n) < 0.5, -0.0, 0.0)
    x[1] = rng.choice(np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0x7FC0ABCD],
                               np.uint32), n).view(np.float32)
    spread = rng.random(n)
    x[2] = np.where(spread < 0.2, -0.0, x[2])
    x[2] = np.where((spread > 0.5) & (spread < 0.6), np.uint32(0xFFC00001).view(np.float32), x[2])
    x[2] = np.where(spread > 0.97, 0.0, x[2])
    x[4] = np.where(spread < 0.3, np.float32(1e-40), x[4])
    x[4] = np.where(spread > 0.8, np.float32(3e38), x[4])
    x[4] = np.where(spread > 0.9, np.float32(np.inf), x[4])
    x[5, :3] = [np.nan, -0.0, 0.0]
    x[5, -3:] = [-0.0, np.uint32(0x7FC00055).view(np.float32), 0.0]
    f = fusec.gpu_jit(lambda v: fnp.sort(v))
    got = f(x)
    assert_bits(got, ref_sort(x))
    assert "sort_fixup" in f.lower(x).kernels[-1].name
    assert_bits(evaluate(f.lower(x).ir, [x])[0], ref_sort(x))  # the stages' numpy references


@pytest.mark.usefixtures("gpu_target")
@pytest.mark.parametrize("descending", [False, True])
def test_fixup_with_several_elements_per_thread(
        rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, descending: bool) -> None:
    """Blocks of 2048 (the fixup's 256 threads take 8 neighbouring elements each, loaded at
    once, and scan once per block): a row of normal values with two zeros in one block, as the
    bench's 2^24 sort has (its run found within the keys of its top byte), a row with zeros and
    NaNs in every block (several in one thread's elements, -0.0 and 0.0 in turn), one whose
    keys share the zeros' and NaNs' top bytes (subnormals, inf, 3e38) beside a zero and a NaN,
    and one of only specials; ascending and descending."""
    use_radix(monkeypatch, 2048, 8)
    n = 2 * 2048 + 1999  # 3 blocks, the last partly filled
    x = rng.standard_normal((4, n)).astype(np.float32)
    x[0, [2100, 3000]] = [-0.0, 0.0]
    spread = rng.random(n)
    x[1] = np.where(spread < 0.15, np.where(rng.random(n) < 0.5, -0.0, 0.0), x[1])
    x[1] = np.where(spread > 0.9, np.uint32(0x7FC0ABCD).view(np.float32), x[1])
    x[1, 40:48] = [0.0, -0.0, np.nan, -0.0, 0.0, np.nan, 1.0, -0.0]
    x[2] = np.where(spread < 0.3, np.float32(-1e-40), x[2])
    x[2] = np.where(spread > 0.7, np.float32(3e38), x[2])
    x[2] = np.where(spread > 0.8, np.float32(np.inf), x[2])
    x[2, [5, 4100]] = [np.uint32(0xFFC00042).view(np.float32), -0.0]
    x[3] = rng.choice(np.array([0x80000000, 0, 0x7FC00000, 0xFFC00001], np.uint32),
                      n).view(np.float32)
    f = fusec.gpu_jit(lambda v: fnp.sort(v, descending=descending))
    (fixup,) = [k for k in f.lower(x).kernels if "sort_fixup" in k.name]
    assert "var w: array<u32, 8>" in fixup.wgsl
    assert_bits(f(x), ref_sort(x, descending=descending))


@pytest.mark.usefixtures("gpu_target")
@pytest.mark.parametrize("mode", ["ballots", "one-word ballots", "subgroups too small",
                                  "scans only", "none"])
def test_radix_scatter_with_and_without_subgroup_operations(
        rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Where the device has subgroup operations (lavapipe does: subgroups of 8 threads) a
    scatter ranks its keys by the whole 8-bit digit within subgroups (ballots) and the scans go
    through subgroups; with one-word ballots where the device's subgroups have at most 32
    lanes (level 3; lavapipe's 8 do). A kernel whose subgroups turn out smaller than it was
    built for takes the 4-bit passes instead, as does a device with the builtins but no
    subgroupBarrier ("scans only"), and one with neither scans through workgroup memory. All
    give numpy's stable sort bit for bit. Rows of 9001 take 71 blocks of 128: the offsets'
    scan runs as a workgroup per digit (more than 64 blocks), 16 threads."""
    use_radix(monkeypatch)
    rt = get_runtime()
    assert rt is not None
    if "subgroup" in rt.adapter.features:
        assert rt.subgroups  # the device was opened with the feature
    if mode == "subgroups too small":  # built for subgroups of 64 or more
        monkeypatch.setattr(ksort, "WLMS_SUBGROUP_MIN", (64,))
    level = {"one-word ballots": 3, "scans only": 1, "none": 0}.get(mode, 2)
    subgroup_level(monkeypatch, level, need=min(level, 2))
    x = sample(rng, (3, 9001), "float32")
    f = sorts()
    check_sorts(f(x), x)
    kernels = f.lower(x).kernels
    for name in ("radix_scatter", "radix_scan"):
        wgsl = [k.wgsl for k in kernels if name in k.name]
        assert wgsl and all(("subgroupInclusiveAdd" in w) == (level > 0) for w in wgsl), (
            name, [k.name for k in kernels])
    scatter = next(k.wgsl for k in kernels if "radix_scatter" in k.name)
    assert ("subgroupBallot" in scatter) == (level >= 2)
    assert ("subgroupBallot(true).x" in scatter) == (level == 3 and bool(ksort.NARROW_BALLOT))
    if level >= 2:
        assert ("sz >= 64u" in scatter) == (mode == "subgroups too small")


@pytest.mark.usefixtures("gpu_target")
def test_radix_sort_over_more_than_65535_workgroups(rng: np.random.Generator,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """33001 rows of 2 blocks: 66002 workgroups per stage, a two-dimensional grid whose spare
    workgroups must write nothing. bool: one radix pass."""
    use_radix(monkeypatch)
    x = sample(rng, (33001, 131), "bool")
    f = fusec.gpu_jit(lambda v: fnp.sort(v))
    assert_bits(f(x), ref_sort(x))
    hist = f.lower(x).kernels[0]
    assert "radix_hist" in hist.name and hist.grid[1] > 1


@pytest.mark.usefixtures("gpu_target")
def test_radix_scatter_of_workgroups_smaller_than_a_subgroup(
        rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 8 keys take workgroups of 4 threads, fewer than a subgroup holds on lavapipe
    (8) or a GPU: the kernel must rank them by its 4-bit passes, not within subgroups (whose
    missing lanes would leave keys out)."""
    use_radix(monkeypatch, 8)
    x = sample(rng, (3, 101), "float32")
    f = sorts()
    check_sorts(f(x), x)
    scatter = next(k.wgsl for k in f.lower(x).kernels if "radix_scatter" in k.name)
    rt = get_runtime()
    assert rt is not None
    assert "@workgroup_size(4)" in scatter
    assert ("subgroupBallot" in scatter) == (rt.subgroups >= 2)
