"""Attention written out (softmax(q @ k^T * scale + bias) @ v) runs as one kernel of kind
"attention" (fusec.passes.attention, fusec.kernels.attention): against float64 numpy, on odd
sizes, with biases of every broadcast shape, NaN and infinities, split-head layouts read in
place, and the cases the rewrite must leave alone."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import pytest
from helpers import subgroup_level

import fusec
import fusec.numpy as fnp
from fusec import nn
from fusec.ir import Op
from fusec.kernels import attention as attention_kernel


def _reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
               bias: Optional[np.ndarray]) -> np.ndarray:
    s = np.matmul(q.astype(np.float64), np.swapaxes(k.astype(np.float64), -1, -2)) * scale
    with np.errstate(invalid="ignore", over="ignore"):
        if bias is not None:
            s = s + bias  # (inf + -inf is NaN, as in the kernel)
        e = np.exp(s - s.max(-1, keepdims=True))
        return np.matmul(e / e.sum(-1, keepdims=True), v.astype(np.float64))


def _attention(q: Any, k: Any, v: Any, bias: Any = None, scale: float = 1.0) -> Any:
    s = (q @ fnp.swapaxes(k, -1, -2)) * scale
    if bias is not None:
        s = s + bias
    return nn.softmax(s, axis=-1) @ v


def _kinds(f: Any, *args: Any) -> list[str]:
    return [k.kind for k in f.lower(*args).kernels]


def _data(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("batch,s,t,d,e", [
    ((), 1, 1, 1, 1),
    ((2, 3), 70, 67, 8, 8),       # rows past a workgroup, keys past a tile, both ragged
    ((5,), 13, 131, 31, 17),      # primes, values narrower than keys
    ((2,), 37, 41, 12, 20),       # vec4 rows and tiles (multiples of 4)
    ((1, 2), 64, 64, 32, 32),     # the widest head the kernel takes
    ((3,), 129, 3, 2, 7),
])
def test_matches_float64_and_is_one_kernel(batch: tuple[int, ...], s: int, t: int, d: int,
                                           e: int) -> None:
    rng = np.random.default_rng(s * 1000 + t)
    q, k, v = _data(rng, *batch, s, d), _data(rng, *batch, t, d), _data(rng, *batch, t, e)
    scale = 1.0 / np.sqrt(d)
    f = fusec.gpu_jit(lambda q, k, v: _attention(q, k, v, scale=scale))
    assert _kinds(f, q, k, v) == ["attention"]
    # head dims in whole vec4s: the output is stored a vec4 at a time
    vec = d % 4 == 0 and e % 4 == 0
    assert ("out0: array<vec4<f32>>" in f.lower(q, k, v).kernels[0].wgsl) == vec
    got = np.asarray(f(q, k, v))
    np.testing.assert_allclose(got, _reference(q, k, v, scale, None), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("bias_shape", [(37,), (1, 37), (2, 1, 1, 37), (2, 3, 11, 37),
                                        (3, 11, 1)])
def test_bias_of_every_broadcast_shape(bias_shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(len(bias_shape))
    q, k, v = _data(rng, 2, 3, 11, 16), _data(rng, 2, 3, 37, 16), _data(rng, 2, 3, 37, 16)
    bias = _data(rng, *bias_shape)
    f = fusec.gpu_jit(lambda q, k, v, b: _attention(q, k, v, b, scale=0.25))
    assert _kinds(f, q, k, v, bias) == ["attention"]
    np.testing.assert_allclose(np.asarray(f(q, k, v, bias)),
                               _reference(q, k, v, 0.25, bias), rtol=2e-5, atol=2e-6)


def test_split_heads_and_padding_mask_read_in_place() -> None:
    # the encoder's layout: [B, S, H * D] projections split into heads by reshape + transpose,
    # a mask of padded keys as a large negative bias; the heads are read where they are (no
    # transpose kernel), and the output's merge is the next kernel's business
    rng = np.random.default_rng(7)
    b, s, h, d = 3, 19, 4, 8
    x = _data(rng, b, s, h * d)
    wq, wk, wv = (_data(rng, h * d, h * d) * 0.3 for _ in range(3))
    mask = (np.arange(s)[None, :] < np.array([19, 5, 1])[:, None]).astype(np.float32)

    def heads(t: Any) -> Any:
        return fnp.transpose(fnp.reshape(t, (b, s, h, d)), (0, 2, 1, 3))

    def f(x: Any, wq: Any, wk: Any, wv: Any, mask: Any) -> Any:
        bias = fnp.reshape((1.0 - mask) * np.float32(-3.4028235e38), (b, 1, 1, s))
        return _attention(heads(x @ wq), heads(x @ wk), heads(x @ wv), bias, 1 / np.sqrt(d))

    jf = fusec.gpu_jit(f)
    kinds = _kinds(jf, x, wq, wk, wv, mask)
    assert kinds.count("attention") == 1 and "elementwise" not in kinds[kinds.index(
        "attention"):], kinds
    got = np.asarray(jf(x, wq, wk, wv, mask))
    x64 = x.astype(np.float64)
    split = [np.transpose((x64 @ w).reshape(b, s, h, d), (0, 2, 1, 3)) for w in (wq, wk, wv)]
    want = _reference(*split, 1 / np.sqrt(d), ((1.0 - mask) * -3.4028235e38).reshape(b, 1, 1, s))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_nan_and_infinities_come_out_as_the_written_out_softmax() -> None:
    rng = np.random.default_rng(3)
    q, k, v = _data(rng, 6, 5), _data(rng, 9, 5), _data(rng, 9, 4)
    bias = np.zeros((6, 9), np.float32)
    bias[0, 3] = np.nan     # a NaN score: its row is NaN
    bias[1, :4] = -np.inf   # masked keys weigh 0, the row is finite
    bias[2, :] = -np.inf    # every key masked: 0 / 0
    bias[3, 8] = np.inf     # a +inf score: inf - inf
    bias[4, 0] = -np.inf    # a masked first key before finite ones
    f = fusec.gpu_jit(lambda q, k, v, b: _attention(q, k, v, b, scale=0.5))
    assert _kinds(f, q, k, v, bias) == ["attention"]
    got = np.asarray(f(q, k, v, bias))
    want = _reference(q, k, v, 0.5, bias)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[[0, 2, 3]]).all() and np.isfinite(got[[1, 4, 5]]).all()
    np.testing.assert_allclose(got[[1, 4, 5]], want[[1, 4, 5]], rtol=2e-5, atol=2e-6)


def test_left_alone_where_the_scores_are_needed_or_heads_are_wide() -> None:
    rng = np.random.default_rng(4)
    q, k, v = _data(rng, 2, 10, 8), _data(rng, 2, 12, 8), _data(rng, 2, 12, 8)

    def with_probs(q: Any, k: Any, v: Any) -> Any:
        p = nn.softmax(q @ fnp.swapaxes(k, -1, -2), axis=-1)
        return p @ v, p  # the probabilities are returned: they must be in memory

    f = fusec.gpu_jit(with_probs)
    assert "attention" not in _kinds(f, q, k, v)
    o, p = f(q, k, v)
    np.testing.assert_allclose(np.asarray(o), _reference(q, k, v, 1.0, None), rtol=2e-5,
                               atol=2e-6)
    wide = attention_kernel.MAX_HEAD + 1
    # (more query rows than the few-rows kernel takes, which has no head dim limit of its own)
    qw, kw = _data(rng, attention_kernel.FEW_ROWS + 1, wide), _data(rng, 5, wide)
    g = fusec.gpu_jit(lambda q, k, v: _attention(q, k, v, scale=0.1))
    assert "attention" not in _kinds(g, qw, kw, v[0, :5])
    np.testing.assert_allclose(np.asarray(g(qw, kw, v[0, :5])),
                               _reference(qw, kw, v[0, :5], 0.1, None), rtol=2e-5, atol=2e-6)
    # the unfused plan keeps one kernel per op
    u = fusec.gpu_jit(lambda q, k, v: _attention(q, k, v), fuse=False)
    assert "attention" not in _kinds(u, q, k, v)


def test_gradient_through_written_out_attention() -> None:
    # autodiff runs before the rewrite: the backward needs the probabilities, so the forward
    # keeps them; the gradient is the written-out one's
    rng = np.random.default_rng(5)
    q, k, v = _data(rng, 7, 4), _data(rng, 6, 4), _data(rng, 6, 3)
    loss = fusec.gpu_jit(fusec.grad(lambda q: fnp.sum(_attention(q, k, v, scale=0.5) ** 2)))
    got = np.asarray(loss(q))
    eps = 1e-3
    num = np.zeros_like(q, dtype=np.float64)
    for i in np.ndindex(*q.shape):
        for sgn in (1, -1):
            qq = q.astype(np.float64).copy()
            qq[i] += sgn * eps
            num[i] += sgn * (_reference(qq, k, v, 0.5, None) ** 2).sum() / (2 * eps)
    np.testing.assert_allclose(got, num, rtol=1e-3, atol=1e-3)


def test_grid_of_more_than_65535_workgroups() -> None:
    rng = np.random.default_rng(6)
    n = 70001  # one row per batch entry: a workgroup each
    q, k, v = _data(rng, n, 1, 2), _data(rng, n, 3, 2), _data(rng, n, 3, 2)
    f = fusec.gpu_jit(lambda q, k, v: _attention(q, k, v, scale=0.7))
    assert _kinds(f, q, k, v) == ["attention"]
    np.testing.assert_allclose(np.asarray(f(q, k, v)), _reference(q, k, v, 0.7, None),
                               rtol=2e-5, atol=2e-6)


@pytest.mark.usefixtures("gpu_target")
@pytest.mark.parametrize("s,t", [(3, 70), (40, 37)])  # the few-rows kernel; a thread per row
def test_elementwise_queries_computed_in_the_kernel(s: int, t: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # with prologues on for these rows (fuse.PROLOGUE_QUERY_ROWS; 16 by default), on GPUs the
    # kernel computes a little elementwise work on its queries as it loads them (RoPE in a
    # decode step): no kernel of its own writes them. NaN in a query row propagates.
    import importlib

    monkeypatch.setattr(importlib.import_module("fusec.passes.fuse"), "PROLOGUE_QUERY_ROWS", s)
    rng = np.random.default_rng(s + t)
    q, k, v = _data(rng, 2, 3, s, 16), _data(rng, 2, 3, t, 16), _data(rng, 2, 3, t, 8)
    c, sn = _data(rng, 16), _data(rng, 16)
    q[1, 2, 0, 5] = np.nan
    f = fusec.gpu_jit(lambda q, c, sn, k, v: _attention(q * c - fnp.flip(q, -1) * sn, k, v,
                                                        scale=0.3))
    # (70 keys for 3 rows: in 2 parts, then their combination)
    parts = attention_kernel.key_parts(q.shape, k.shape[:-2] + (16, t), v.shape, "gpu")
    assert _kinds(f, q, c, sn, k, v) == ["attention"] * (2 if parts > 1 else 1)
    assert parts == (2 if s == 3 else 1)
    got = np.asarray(f(q, c, sn, k, v))
    q64 = q.astype(np.float64)
    want = _reference(q64 * c - q64[..., ::-1] * sn, k, v, 0.3, None)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[1, 2, 0]).all() and np.isfinite(got[0]).all()
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=2e-5, atol=2e-6)


@pytest.mark.usefixtures("gpu_target")
@pytest.mark.parametrize("s,kinds", [(1, ["attention"]), (16, ["attention"]),
                                     (17, ["elementwise", "attention"])])
def test_query_prologue_by_default_for_few_rows(s: int, kinds: list[str]) -> None:
    # by default (fuse.PROLOGUE_QUERY_ROWS = 16) the kernel computes its queries' elementwise
    # work only where a head has few query rows (a decode step's group of query heads), not a
    # prefill's many
    rng = np.random.default_rng(7 + s)
    q, k, v = _data(rng, 2, 3, s, 16), _data(rng, 2, 3, 29, 16), _data(rng, 2, 3, 29, 8)
    c, sn = _data(rng, 16), _data(rng, 16)
    f = fusec.gpu_jit(lambda q, c, sn, k, v: _attention(q * c - fnp.flip(q, -1) * sn, k, v,
                                                        scale=0.3))
    assert _kinds(f, q, c, sn, k, v) == kinds
    q64 = q.astype(np.float64)
    want = _reference(q64 * c - q64[..., ::-1] * sn, k, v, 0.3, None)
    np.testing.assert_allclose(np.asarray(f(q, c, sn, k, v)), want, rtol=2e-5, atol=2e-6)


@pytest.mark.usefixtures("gpu_target")
@pytest.mark.parametrize("split", [1, 2, 4])
@pytest.mark.parametrize("batch,s,t,d,e", [
    ((2, 3), 70, 67, 8, 8),       # rows past a head's, keys past a tile, ragged
    ((2,), 131, 41, 32, 32),      # more rows than a workgroup; the widest head
    ((1,), 9, 200, 16, 24),       # values wider than keys
    ((3,), 11, 5, 12, 12),        # a head dim only a split of 2 divides into vec4s
])
def test_threads_per_row_match_float64(monkeypatch: pytest.MonkeyPatch, split: int,
                                       batch: tuple[int, ...], s: int, t: int, d: int,
                                       e: int) -> None:
    # on GPUs with subgroup operations a row's head dims are split over SPLIT threads, whose
    # partial scores are summed by subgroup shuffles; every thread of a row must take the same
    # online-softmax steps, masked keys, NaN and infinities included
    from fusec.runtime import get_runtime

    monkeypatch.setattr(attention_kernel, "SPLIT", split)
    rng = np.random.default_rng(s * 7 + t + split)
    q, k, v = _data(rng, *batch, s, d), _data(rng, *batch, t, d), _data(rng, *batch, t, e)
    bias = np.where(rng.random((*batch, s, t)) < 0.3, -np.inf, 0.0).astype(np.float32)
    bias[..., 0, :] = -np.inf  # a row of masked keys only: 0 / 0
    bias[..., 1, t // 2] = np.nan  # a NaN score: its row is NaN
    bias[..., 2, :] = 0.0
    bias[..., 2, t - 1] = np.inf  # a +inf score: inf - inf
    bias[..., 3:, 0] = 0.0  # the other rows keep a key
    scale = 1.0 / np.sqrt(d)
    f = fusec.gpu_jit(lambda q, k, v, b: _attention(q, k, v, b, scale=scale))
    kernels = f.lower(q, k, v, bias).kernels
    assert [kk.kind for kk in kernels] == ["attention"]
    rt = get_runtime()
    assert rt is not None
    used = rt.subgroups > 0 and split > 1 and d % (4 * split) == 0 and e % (4 * split) == 0
    assert ("subgroupShuffleXor" in kernels[0].wgsl) == used
    # at most 256 invocations a workgroup, WebGPU's default limit, whatever the split
    size = int(kernels[0].wgsl.split("@workgroup_size(")[1].split(")")[0])
    assert size <= 256 and size % (split if used else 1) == 0
    got = np.asarray(f(q, k, v, bias))
    want = _reference(q, k, v, scale, bias)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[..., :3, :]).all()
    np.testing.assert_allclose(got[..., 3:, :], want[..., 3:, :], rtol=2e-5, atol=2e-6)


@pytest.mark.usefixtures("gpu_target")
@pytest.mark.parametrize("batch,s,t,d,e", [
    ((1, 3), 3, 64, 64, 64),      # a decode step of SmolLM2: 3 query heads per KV head
    ((), 1, 1, 1, 1),
    ((5,), 8, 131, 100, 17),      # the most rows; a head dim no vec4 divides
    ((2,), 2, 2048, 128, 128),    # the most keys and the widest head
    ((3,), 7, 300, 33, 96),       # values that leave some threads idle (256 = 2 x 96 + 64)
    ((1,), 3, 3001, 64, 64),      # more keys than a workgroup's scores hold: parts in any case
])
@pytest.mark.parametrize("part_keys", [0, 128, 48])
def test_few_rows_kernel_matches_float64(batch: tuple[int, ...], s: int, t: int, d: int,
                                         e: int, part_keys: int,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Few query rows per head (a decode step) take a workgroup per row on GPUs, any head dim up
    to FEW_HEAD: one kernel, against float64, with a causal mask of -inf. Over more than
    PART_KEYS keys, a workgroup per row and part of the keys, then a kernel combining the parts
    (flash-decoding): parts of 128 keys and of 48 (a last part shorter than the others, parts
    masked whole)."""
    monkeypatch.setattr(attention_kernel, "PART_KEYS", part_keys)
    rng = np.random.default_rng(s * 7919 + t)
    q, k, v = _data(rng, *batch, s, d), _data(rng, *batch, t, d), _data(rng, *batch, t, e)
    bias = np.where(np.arange(t)[None, :] <= t - s + np.arange(s)[:, None], 0.0,
                    -np.inf).astype(np.float32)
    if t > 100:  # the middle half of the keys masked for every row: whole parts
        bias[:, t // 4:3 * t // 4] = -np.inf
    scale = 1.0 / np.sqrt(d)
    f = fusec.gpu_jit(lambda q, k, v, b: _attention(q, k, v, b, scale=scale))
    kernels = f.lower(q, k, v, bias).kernels
    parts = attention_kernel.key_parts(q.shape, k.shape[:-2] + (d, t), v.shape, "gpu")
    want_parts = max(min(-(-t // part_keys), attention_kernel.MAX_PARTS) if part_keys else 1,
                     -(-t // attention_kernel.FEW_KEYS))
    assert parts == -(-t // -(-t // want_parts))  # (so that every part holds keys)
    assert [k.kind for k in kernels] == ["attention"] * (1 if parts == 1 else 2)
    assert "threads per query row" in kernels[0].wgsl
    if parts > 1:
        assert f"The keys in {parts} parts" in kernels[0].wgsl
        assert "combined" in kernels[1].wgsl
    got = np.asarray(f(q, k, v, bias))
    np.testing.assert_allclose(got, _reference(q, k, v, scale, bias), rtol=2e-5, atol=2e-6)


@pytest.mark.usefixtures("gpu_target")
@pytest.mark.parametrize("subgroups", [2, 0])
@pytest.mark.parametrize("part_keys", [0, 32])
def test_few_rows_kernel_nan_and_infinities(part_keys: int, subgroups: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """As the written-out softmax: a NaN or +inf score makes its row NaN, -inf weighs 0, a row of
    -inf only is 0 / 0; 200 keys per row, more than the threads of a workgroup; and so in 7
    parts of the keys (row 1's first 6 parts all -inf). The row's maximum and sum by subgroup
    reductions where the device has subgroup operations (lavapipe: 32 subgroups of 8 threads
    a workgroup), by trees in workgroup memory without."""
    subgroup_level(monkeypatch, subgroups, need=min(subgroups, 1))
    monkeypatch.setattr(attention_kernel, "PART_KEYS", part_keys)
    rng = np.random.default_rng(8)
    q, k, v = _data(rng, 6, 40), _data(rng, 200, 40), _data(rng, 200, 64)
    bias = np.zeros((6, 200), np.float32)
    bias[0, 150] = np.nan
    bias[1, :190] = -np.inf
    bias[2, :] = -np.inf
    bias[3, 199] = np.inf
    bias[4, 0] = -np.inf
    f = fusec.gpu_jit(lambda q, k, v, b: _attention(q, k, v, b, scale=0.5))
    assert _kinds(f, q, k, v, bias) == ["attention"] * (2 if part_keys else 1)
    rows = f.lower(q, k, v, bias).kernels[0].wgsl
    assert ("subgroupMax" in rows and "subgroupAdd" in rows) == (subgroups > 0)
    got = np.asarray(f(q, k, v, bias))
    want = _reference(q, k, v, 0.5, bias)
    assert np.isnan(got[[0, 2, 3]]).all() and np.isfinite(got[[1, 4, 5]]).all()
    np.testing.assert_allclose(got[[1, 4, 5]], want[[1, 4, 5]], rtol=2e-5, atol=2e-6)


@pytest.mark.usefixtures("gpu_target")
def test_decode_step_of_a_llama_has_one_attention_kernel_per_layer() -> None:
    """A grouped-query decode step (the KV cache sliced to the context, the query heads that share
    a KV head as rows, fusec.models.llama.forward) takes the few-rows kernel: one attention
    kernel per layer, no written-out scores."""
    from fusec import random as frandom
    from fusec.models.llama import LlamaConfig, Sampling, forward, rope_tables, step_inputs

    cfg = LlamaConfig(n_layers=2, d_model=192, n_heads=3, n_kv_heads=1, d_ff=64, vocab=50,
                      rope_base=10000.0, eps=1e-5, context=64)
    rng = np.random.default_rng(9)

    def m(o: int, i: int) -> np.ndarray:
        return (rng.standard_normal((o, i)) * 0.1).astype(np.float32)

    layers = [{"q": m(192, 192), "k": m(64, 192), "v": m(64, 192), "o": m(192, 192),
               "gate": m(64, 192), "up": m(64, 192), "down": m(192, 64),
               "attn_norm": np.ones(192, np.float32), "ffn_norm": np.ones(192, np.float32)}
              for _ in range(2)]
    params = {"embed": m(50, 192), "lm_head": m(50, 192), "norm": np.ones(192, np.float32),
              "layers": layers}
    cache = [(np.zeros((1, 1, 64, 64), np.float32),) * 2 for _ in range(2)]
    cos, sin, bias = step_inputs(cfg, *rope_tables(cfg, 64), 5, 1, 64)
    f = fusec.gpu_jit(forward, static_argnames=("cfg", "how", "want_logits"))
    lowered = f.lower(params, cache, np.zeros((1,), np.int32), np.int32(5), cos, sin, bias,
                      frandom.key(0), cfg=cfg, how=Sampling())
    assert [k.kind for k in lowered.kernels].count("attention") == 2


@pytest.mark.usefixtures("cpu_target")
@pytest.mark.parametrize("rows,bias", [(128, False), (1, True)])
def test_keys_up_to_the_software_loop_budget(rows: int, bias: bool) -> None:
    # a software adapter ends a shader's loops after 65535 iterations in all and carries on
    # with wrong results: on the cpu target the kernel takes only attentions whose loops stay
    # within the budget, every loop's exit test included. The most keys it takes at head dim 1
    # come out right, and one tile more takes the written-out plan (also right): 128 rows, and
    # one row with a staged bias (a workgroup of one thread loads every key, value and bias)
    lo, hi = 1, 1 << 20
    while hi - lo > 1:  # the most keys that fit
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if attention_kernel.fits((rows, 1), (1, mid), (mid, 1), "cpu") \
            else (lo, mid)
    t = lo
    rng = np.random.default_rng(8)
    for n, kind in ((t, "attention"), (t + 64, "matmul")):
        q, k, v = _data(rng, rows, 1), _data(rng, n, 1), _data(rng, n, 1)
        args = [q, k, v]
        if bias:  # the last keys weigh most: a loop cut short misses them
            b = np.zeros((1, n), np.float32)
            b[0, -50:] = 20.0
            args.append(b)
        f = fusec.gpu_jit((lambda q, k, v, b: _attention(q, k, v, b, scale=0.5)) if bias
                          else (lambda q, k, v: _attention(q, k, v, scale=0.5)))
        kernels = f.lower(*args).kernels
        assert kernels[0].kind == kind
        assert ("bs[" in kernels[0].wgsl) == (bias and kind == "attention")
        np.testing.assert_allclose(np.asarray(f(*args)),
                                   _reference(q, k, v, 0.5, args[3] if bias else None),
                                   rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("target", ["gpu", "cpu"])
@pytest.mark.parametrize("chunk,stage", [(1, False), (4, True), (8, True), (8, False),
                                         (16, True)])
def test_key_chunks_and_staged_bias(monkeypatch: pytest.MonkeyPatch, target: str, chunk: int,
                                    stage: bool) -> None:
    # keys are weighed CHUNK at a time (one rescale per chunk); a bias that broadcasts over the
    # rows (a padding mask) is computed once per tile into workgroup memory. Ragged key counts
    # (the last chunk partly past the keys), a chunk of masked keys only, NaN and infinities
    # in the staged bias, and a head whose keys are all masked.
    from helpers import forced_target

    monkeypatch.setattr(attention_kernel, "CHUNK", chunk)
    monkeypatch.setattr(attention_kernel, "STAGE_BIAS", stage)
    rng = np.random.default_rng(chunk * 10 + stage)
    for t, d, e in ((1, 8, 12), (13, 8, 12), (67, 16, 16), (130, 8, 12)):
        # (16 x 16 on the gpu target: two threads per row where subgroups allow)
        q, k, v = _data(rng, 5, 2, 21, d), _data(rng, 5, 2, t, d), _data(rng, 5, 2, t, e)
        v[4, :, t - 1, 0] = np.inf   # infinite values: a ragged last chunk must not make NaN
        v[4, :, t - 1, 1] = -np.inf  # of them (its padded keys weigh 0)
        mask = (rng.random((5, 1, 1, t)) < 0.8).astype(np.float32)
        mask[:, :, :, 0] = 1.0
        mask[2, :, :, : min(t - 1, 10)] = 0.0  # the first chunk(s) masked: m stays -inf a while
        mask[2, :, :, t - 1] = 1.0
        mask[4, :, :, t - 1] = 1.0  # (the infinite values' key)
        bias = np.where(mask > 0, 0.0, -np.inf).astype(np.float32)
        bias[0, :, :, t // 2] = np.nan   # a NaN key: every row of that batch is NaN
        bias[1, :, :, t - 1] = np.inf    # a +inf key: inf - inf
        bias[3] = -np.inf                # every key masked: 0 / 0
        f = fusec.gpu_jit(lambda q, k, v, b: _attention(q, k, v, b, scale=0.35))
        with forced_target(target):
            kernels = f.lower(q, k, v, bias).kernels
            assert [kk.kind for kk in kernels] == ["attention"]
            assert ("bs[" in kernels[0].wgsl) == stage
            got = np.asarray(f(q, k, v, bias))
        want = _reference(q, k, v, 0.35, bias)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        assert np.isnan(got[[0, 1, 3]]).all() and np.isfinite(got[2]).all()
        assert np.isinf(got[4, :, :, :2]).all()
        fin = np.isfinite(want)
        np.testing.assert_allclose(got[fin], want[fin], rtol=2e-5, atol=2e-6)


# -- wider heads: the written-out plan, its probabilities computed where p @ v loads them --

def _plan(f: Any, *args: Any) -> list[tuple[str, list[tuple[int, ...]]]]:
    """Each kernel's kind and the shapes of what it writes."""
    return [(e.params["kind"], [tuple(o.shape) for o in e.outs])
            for e in f.lower(*args).ir.eqns if e.op is Op.KERNEL]


def _wide_case(rng: np.random.Generator, b: int, s: int, t: int, d: int, e: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q, k, v = _data(rng, b, s, d), _data(rng, b, t, d), _data(rng, b, t, e)
    q[0, 0, 0] = np.nan        # a NaN score: its row is NaN
    q[1, 5, 3] = np.inf        # +inf and -inf scores: inf - inf, its row is NaN
    v[2, 7, 1] = np.inf        # an infinite value: inf in its column where it weighs
    v[3, 9, 2] = -np.inf
    # a row whose every score is far below 0: exp(-max) overflows, so a probability computed
    # for a key past the last (an edge tile's) would be inf, and inf x 0 NaN
    k[4, :, 0] = 1.0 + np.abs(k[4, :, 0])
    q[4, 2] = 0.0
    q[4, 2, 0] = -3000.0
    return q, k, v


def _check_wide(got: np.ndarray, want: np.ndarray) -> None:
    """NaN and infinities where float64 has them; the finite values to float32's tolerance, the
    far-below-zero row to one its scores' rounding justifies (scores of about -400 carry an
    absolute error of about 1e-4, and exp turns it into a relative one)."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    far = np.zeros(want.shape, bool)
    far[4, 2] = True
    np.testing.assert_allclose(got[far], want[far], rtol=1e-3, atol=1e-5)
    fin = np.isfinite(want) & ~far
    np.testing.assert_allclose(got[fin], want[fin], rtol=2e-5, atol=2e-6)


@pytest.mark.usefixtures("gpu_target")
@pytest.mark.parametrize("b,s,t", [
    (12, 1031, 515),  # ragged rows and keys (515 % 16 = 3: the last step of K is past the end)
    (6, 2053, 256),   # a prime number of rows past a tile, keys a whole number of steps
])
def test_probabilities_computed_in_the_product(b: int, s: int, t: int) -> None:
    # head dims past the attention kernel's: the written-out plan, but on GPUs the softmax's
    # kernel only reduces the rows (their maximum and sum) and the p @ v product computes
    # exp(s * scale - max) as it loads A, a step behind its loads, and divides its rows by the
    # sums: the b x s x t probabilities are never written
    rng = np.random.default_rng(s + t)
    d, e = 64, 128
    q, k, v = _wide_case(rng, b, s, t, d, e)
    f = fusec.gpu_jit(lambda q, k, v: _attention(q, k, v, scale=0.125))
    plan = _plan(f, q, k, v)
    assert [kind for kind, _ in plan] == ["matmul", "reduce", "matmul"]
    assert plan[1][1] == [(b, s), (b, s)]  # the rows' statistics, not b x s x t probabilities
    wgsl = f.lower(q, k, v).kernels[2].wgsl
    assert "a step behind the loads" in wgsl and "exp(" in wgsl
    got = np.asarray(f(q, k, v))
    _check_wide(got, _reference(q, k, v, 0.125, None))
    assert np.isnan(got[0, 0]).all() and np.isnan(got[1, 5]).all() and np.isinf(got).any()


@pytest.mark.usefixtures("gpu_target")
def test_probabilities_written_where_the_product_would_wait_for_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the rewrite only where the product's kernel is pipelined; with a bias (a mask); with
    # PROBS_IN_PRODUCT = 0; on the cpu target: the probabilities are written, as before
    import importlib

    att = importlib.import_module("fusec.passes.attention")
    rng = np.random.default_rng(11)
    q, k, v = _wide_case(rng, 12, 1031, 515, 64, 128)
    bias = np.where(rng.random((1031, 515)) < 0.1, -np.inf, 0.0).astype(np.float32)
    want = _reference(q, k, v, 0.125, bias)
    g = fusec.gpu_jit(lambda q, k, v, m: _attention(q, k, v, m, scale=0.125))
    assert _plan(g, q, k, v, bias)[1][1] == [(12, 1031, 515)]
    _check_wide(np.asarray(g(q, k, v, bias)), want)
    small = [x[:4, :37, :] for x in (q, k, v)]
    h = fusec.gpu_jit(lambda q, k, v: _attention(q, k, v, scale=0.125))
    assert _plan(h, *small)[1][1] == [(4, 37, 37)]  # a 64x64 tile: not pipelined
    monkeypatch.setattr(att, "PROBS_IN_PRODUCT", 0)
    f = fusec.gpu_jit(lambda q, k, v: _attention(q, k, v, scale=0.125))
    assert _plan(f, q, k, v)[1][1] == [(12, 1031, 515)]
    monkeypatch.undo()
    from helpers import forced_target

    with forced_target("cpu"):
        c = fusec.gpu_jit(lambda q, k, v: _attention(q, k, v, scale=0.125))
        assert _plan(c, *small)[1][1] == [(4, 37, 37)]


@pytest.mark.usefixtures("gpu_target")
def test_probabilities_computed_where_loaded_without_the_pipeline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # forced onto a product whose kernel is not pipelined, A's arithmetic is computed where it
    # is loaded (slower, see codegen._deferred_a; still right)
    monkeypatch.setattr(fusec.codegen, "deferred_prologue", lambda *a: True)
    rng = np.random.default_rng(12)
    q, k, v = _wide_case(rng, 5, 37, 53, 40, 24)
    f = fusec.gpu_jit(lambda q, k, v: _attention(q, k, v, scale=0.3))
    plan = _plan(f, q, k, v)
    assert plan[1][1] == [(5, 37), (5, 37)]
    assert "a step behind the loads" not in f.lower(q, k, v).kernels[2].wgsl
    _check_wide(np.asarray(f(q, k, v)), _reference(q, k, v, 0.3, None))


@pytest.mark.usefixtures("gpu_target")
@pytest.mark.parametrize("donate", [True, False])
def test_cache_update_done_by_the_attention_kernel(rng: np.random.Generator,
                                                   donate: bool) -> None:
    """A window of a donated cache updated in place (lax.dynamic_update_slice) and then attended
    over by few query rows: the attention kernel does the update (passes.attention's
    fold_cache_update), one kernel; without donation the update is a kernel of its own. Both
    against float64, the returned cache against numpy's update, at positions inside the cache,
    at its end, and one a clamped start moves back inside."""
    from fusec import lax

    h, t, d, s = 3, 37, 16, 2
    scale = 1.0 / np.sqrt(d)

    def step(cache: Any, q: Any, new: Any, pos: Any) -> Any:
        cache = lax.dynamic_update_slice(cache, new, (0, pos, 0))
        return _attention(q, cache, cache, scale=scale), cache

    f = fusec.gpu_jit(step, donate_argnums=(0,) if donate else ())
    for pos in (5, t - 2, t + 3):  # the last start clamps to t - 2
        cache = _data(rng, h, t, d)
        q, new = _data(rng, h, s, d), _data(rng, h, 2, d)
        want_cache = cache.copy()
        at = min(pos, t - 2)
        want_cache[:, at:at + 2] = new
        want = _reference(q, want_cache, want_cache, scale, None)
        c = fusec.device_put(cache)
        kinds = _kinds(f, c, q, new, np.int32(pos))
        assert kinds == (["attention"] if donate else ["elementwise", "attention"]), kinds
        out, got_cache = f(c, q, new, np.int32(pos))
        np.testing.assert_allclose(np.asarray(out), want, rtol=2e-5, atol=2e-6)
        np.testing.assert_array_equal(np.asarray(got_cache), want_cache)


@pytest.mark.parametrize("t,parts", [(1, 1), (7, 3), (130, 4), (200, 7)])
def test_parts_references_compose_to_attention(t: int, parts: int) -> None:
    """The numpy references of attention_parts and attention_combine (the interpreter's and the
    kernels' tests') give attention's, NaN, infinities and keys masked whole included."""
    from fusec import ops

    rng = np.random.default_rng(t)
    q, k, v = _data(rng, 2, 6, 8), _data(rng, 2, t, 8), _data(rng, 2, t, 5)
    kt = np.swapaxes(k, -1, -2)
    bias = np.zeros((6, t), np.float32)
    bias[0, t // 2] = np.nan
    bias[1, :] = -np.inf
    bias[2, t - 1] = np.inf
    bias[3, : max(1, t - 3)] = -np.inf
    params = {"scale": 0.3, "bias": True, "parts": parts}
    shape, dt = ops.TYPE_RULES[Op.ATTENTION_PARTS](
        [(q.shape, "float32"), (kt.shape, "float32"), (v.shape, "float32"),
         (bias.shape, "float32")], params)
    assert shape == (2, 6, parts, 7) and dt == "float32"
    p = ops.NUMPY_RULES[Op.ATTENTION_PARTS]([q, kt, v, bias], params, (shape, dt))
    out_shape = ops.TYPE_RULES[Op.ATTENTION_COMBINE]([(shape, dt)], {})[0]
    assert out_shape == (2, 6, 5)
    got = ops.NUMPY_RULES[Op.ATTENTION_COMBINE]([p], {}, (out_shape, dt))
    want = ops.NUMPY_RULES[Op.ATTENTION]([q, kt, v, bias], params, (out_shape, dt))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(fusec.errors.ShapeError, match="empty"):
        ops.TYPE_RULES[Op.ATTENTION_PARTS]([(q.shape, "f"), (kt.shape, "f"), (v.shape, "f")],
                                           {"scale": 1.0, "parts": t + 1})
