"""fusec.models.llama: SmolLM2-135M's decoding against the plain-numpy reference on the same
dequantised weights (on lavapipe in CI), and the model's parts (prefill against step-by-step,
batches, the float16 cache, sampling, errors) on a small random model of the same structure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fusec
from fusec import quant
from fusec.errors import FusecError
from fusec.models.llama import Llama, LlamaConfig, Sampling, _merged, load_gguf
from fusec.models.llama_numpy import NumpyLlama

REF = Path(__file__).parent / "data" / "smollm2_reference.json"


def _small(seed: int, n_layers: int = 2, vocab: int = 257, quantized: bool = True
           ) -> tuple[LlamaConfig, dict, dict]:
    """A random llama of SmolLM2's head layout (3 query heads per KV head, head dim 64) with
    fewer layers and a small vocabulary: fusec weights (quantized matrices) and the reference's
    (the same values, dequantised)."""
    cfg = LlamaConfig(n_layers=n_layers, d_model=192, n_heads=3, n_kv_heads=1, d_ff=320,
                      vocab=vocab, rope_base=10000.0, eps=1e-5, context=512)
    rng = np.random.default_rng(seed)

    def mat(o: int, i: int, fmt: str = "q4_1") -> tuple:
        w = (rng.standard_normal((o, i)) * 0.1).astype(np.float32)
        if not quantized:
            return w, w
        q = quant.quantize(w, fmt)
        return q, quant.dequantize_numpy(q)

    layers, ref_layers = [], []
    for _ in range(n_layers):
        lw, rw = {}, {}
        for name, shape in {"q": (192, 192), "k": (64, 192), "v": (64, 192), "o": (192, 192),
                            "gate": (320, 192), "up": (320, 192), "down": (192, 320)}.items():
            lw[name], rw[name] = mat(*shape)
        for name in ("attn_norm", "ffn_norm"):
            lw[name] = rw[name] = (1 + 0.1 * rng.standard_normal(192)).astype(np.float32)
        layers.append(_merged(lw) if seed % 2 else lw)  # both forms of a block's weights
        ref_layers.append(rw)
    embed = (rng.standard_normal((vocab, 192)) * 0.5).astype(np.float32)
    head, head_ref = mat(vocab, 192, "q8_0") if quantized else (embed, embed)
    norm = (1 + 0.1 * rng.standard_normal(192)).astype(np.float32)
    w = {"embed": embed, "lm_head": head, "norm": norm, "layers": layers}
    r = {"embed": embed, "lm_head": head_ref, "norm": norm, "layers": ref_layers}
    return cfg, w, r


def _close(got: np.ndarray, want: np.ndarray, rtol: float = 2e-4) -> None:
    scale = float(np.max(np.abs(want)))
    err = float(np.max(np.abs(got - want)))
    assert err <= rtol * max(scale, 1.0), f"max |logit difference| {err} (scale {scale})"


def test_prefill_matches_steps_and_reference() -> None:
    """A 13-token prompt in one call, and one token at a time, give the reference's logits;
    then greedy decoding continues from either the same way."""
    cfg, w, r = _small(0)
    ref = NumpyLlama(cfg, r, max_len=64)
    prompt = [5, 17, 250, 3, 99, 101, 7, 42, 200, 11, 0, 256, 64]
    ref.reset(1)
    want = ref.step(np.asarray([prompt]))[0]
    model = Llama(cfg, w, max_len=64)
    model.reset(1)
    nxt, logits = model.step(np.asarray([prompt]), want_logits=True)
    _close(np.asarray(logits)[0], want)
    assert int(np.asarray(nxt)[0]) == int(np.argmax(want))
    for _ in range(5):  # decoding goes on from the prefilled cache
        tok = int(np.argmax(want))
        want = ref.step(np.asarray([[tok]]))[0]
        nxt, logits = model.step(nxt, want_logits=True)
        _close(np.asarray(logits)[0], want)
    model.reset(1)
    ref.reset(1)
    for tok in prompt:  # the same prompt one token at a time
        want = ref.step(np.asarray([[tok]]))[0]
        nxt, logits = model.step(np.asarray([[tok]]), want_logits=True)
        _close(np.asarray(logits)[0], want)


def test_batch_of_different_prompts_and_context_buckets() -> None:
    """Two sequences at once, each as the reference decodes it alone, across a context bucket
    boundary (64 -> 128 positions attended)."""
    cfg, w, r = _small(1, n_layers=1)
    prompts = np.asarray([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3] * 6,
                          [2, 7, 1, 8, 2, 8, 1, 8, 2, 8] * 6], dtype=np.int32)  # 60 tokens
    model = Llama(cfg, w, max_len=160)
    toks = np.stack(list(model.generate(prompts, 8)), axis=1)  # positions 60 .. 67
    for b in range(2):
        ref = NumpyLlama(cfg, r, max_len=160)
        got_ref, _ = ref.greedy(list(prompts[b]), 8)
        assert toks[b].tolist() == got_ref


def test_float16_cache() -> None:
    """The key/value cache in float16 (where the adapter has shader-f16): the logits stay within
    what rounding the cache's keys and values to float16 explains."""
    cfg, w, r = _small(2, n_layers=1)
    ref = NumpyLlama(cfg, r, max_len=64)
    model = Llama(cfg, w, max_len=64, cache_dtype="float16")
    prompt = [9, 8, 7, 6, 5, 4, 3]
    ref.reset(1)
    want = ref.step(np.asarray([prompt]))[0]
    model.reset(1)
    _, logits = model.step(np.asarray([prompt]), want_logits=True)
    got = np.asarray(logits)[0]
    _close(got, want, rtol=5e-3)
    assert np.max(np.abs(got - want)) > 0  # the cache really was float16
    assert model.cache[0][0].dtype == np.float16


def test_sampling() -> None:
    """top_k=1 and a tiny top_p are greedy; temperature sampling is reproducible by seed, stays
    inside the top k, and differs between seeds."""
    cfg, w, _ = _small(3, n_layers=1)
    prompt = np.asarray([[1, 2, 3, 4]], dtype=np.int32)
    greedy = np.concatenate(list(Llama(cfg, w, max_len=64).generate(prompt, 6)))
    for how in (Sampling(temperature=1.0, top_k=1), Sampling(temperature=0.7, top_p=1e-6)):
        got = np.concatenate(list(Llama(cfg, w, max_len=64, sampling=how).generate(prompt, 6)))
        assert got.tolist() == greedy.tolist(), how
    how = Sampling(temperature=1.5, top_k=5)
    a = np.concatenate(list(Llama(cfg, w, max_len=64, sampling=how, seed=1).generate(prompt, 12)))
    b = np.concatenate(list(Llama(cfg, w, max_len=64, sampling=how, seed=1).generate(prompt, 12)))
    c = np.concatenate(list(Llama(cfg, w, max_len=64, sampling=how, seed=2).generate(prompt, 12)))
    assert a.tolist() == b.tolist()
    assert a.tolist() != c.tolist()
    # every drawn token is among the 5 largest logits of its step
    model = Llama(cfg, w, max_len=64, sampling=how, seed=3)
    model.reset(1)
    nxt, logits = model.step(prompt, want_logits=True)
    for _ in range(6):
        top5 = np.argsort(-np.asarray(logits)[0])[:5]
        assert int(np.asarray(nxt)[0]) in top5
        nxt, logits = model.step(nxt, want_logits=True)


def test_generate_stops_where_the_steps_called_ahead_leave_no_trace() -> None:
    """generate calls each step before reading the tokens of the one before; where it stops
    early (eos, or the caller stops iterating) the model is where plain steps would leave it:
    its position counts the tokens fed, and the next step gives the token a longer run did."""
    cfg, w, _ = _small(4, n_layers=1)
    prompt = np.asarray([[11, 12, 13, 14, 15]], dtype=np.int32)
    full = [int(t[0]) for t in Llama(cfg, w, max_len=64).generate(prompt, 9)]
    k = next(i for i in range(2, 8) if full[i] not in full[:i])  # a first occurrence as eos
    model = Llama(cfg, w, max_len=64)
    got = [int(t[0]) for t in model.generate(prompt, 9, eos=full[k])]
    assert got == full[:k + 1]
    assert model.pos == prompt.shape[1] + k  # the prompt and the tokens before the eos fed
    assert int(np.asarray(model.step(np.asarray([full[k]], np.int32)))[0]) == full[k + 1]
    gen = model.generate(prompt, 9)
    taken = [int(next(gen)[0]) for _ in range(3)]
    gen.close()  # the caller stops: the step called for the fourth token is dropped
    assert taken == full[:3] and model.pos == prompt.shape[1] + 2
    assert int(np.asarray(model.step(np.asarray([full[2]], np.int32)))[0]) == full[3]
    assert [int(t[0]) for t in model.generate(prompt, 1)] == full[:1] and model.pos == 5


def test_errors() -> None:
    cfg, w, _ = _small(4, n_layers=1)
    model = Llama(cfg, w, max_len=16)
    model.reset(2)
    for call in (model.step, model.lower_step):  # lower_step checks its tokens as step does
        with pytest.raises(FusecError, match="batch=2"):
            call(np.zeros((1, 3), np.int32))
        with pytest.raises(FusecError, match="max_len=16"):
            call(np.zeros((2, 17), np.int32))
        with pytest.raises(FusecError, match=r"ids in \[0, 257\)"):
            call(np.asarray([[1, 2], [3, 257]]))
        with pytest.raises(FusecError, match=r"ids in \[0, 257\)"):
            call(np.asarray([[1, 2], [-1, 0]]))
    with pytest.raises(FusecError, match="context"):
        Llama(cfg, w, max_len=4096)
    with pytest.raises(FusecError, match=r"\[batch, length\]"):
        next(model.generate([1, 2, 3], 2))


def test_smollm2_tokens_match_reference() -> None:
    """The real SmolLM2-135M (Q4_1 weights, Q8_0 LM head) on this adapter: for the first prompt
    of the reference file, the prompt fed one token at a time and then 3 greedy tokens; every
    step's logits within float32's reach of the float64 numpy reference on the same dequantised
    weights, and the tokens equal to the reference's and to transformers' (the file's)."""
    cfg, weights = load_gguf()
    _, dense = load_gguf(dequantize=True)
    case = json.loads(REF.read_text())["prompts"][0]
    prompt = case["prompt_ids"]
    ref = NumpyLlama(cfg, dense, max_len=64)
    model = Llama(cfg, weights, max_len=64)
    model.reset(1)
    ref.reset(1)
    # one compiled step (T = 1) serves the whole test: lavapipe compiles slowly
    for tok in prompt:
        want = ref.step(np.asarray([[tok]]))[0]
        nxt, logits = model.step(np.asarray([[tok]]), want_logits=True)
    _close(np.asarray(logits)[0], want, rtol=1e-4)
    got = []
    for _ in range(3):
        tok = int(np.asarray(nxt)[0])
        assert tok == int(np.argmax(want))
        got.append(tok)
        want = ref.step(np.asarray([[tok]]))[0]
        nxt, logits = model.step(nxt, want_logits=True)
        _close(np.asarray(logits)[0], want, rtol=1e-4)
    assert got == case["generated_ids"][:3]
    assert fusec.default_device() is not None


def test_decode_step_prologues_on_gpu_target(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels for GPUs: a decode step at batch 1 computes SwiGLU's x in the down projection
    and RoPE on the queries in the attention kernel as they load them (fuse's prologues): two
    kernels a block fewer than without, and the reference's logits."""
    import importlib

    from helpers import forced_target

    cfg, w, r = _small(3)
    ref = NumpyLlama(cfg, r, max_len=64)
    prompt = [7, 100, 3, 255, 18]
    fuse_module = importlib.import_module("fusec.passes.fuse")
    # (the cache update is folded into the attention kernel only where the attention kernel
    # comes right after it, as RoPE's prologue lets it: the next test)
    monkeypatch.setattr(importlib.import_module("fusec.passes.attention"), "FOLD_CACHE_UPDATE", 0)
    with forced_target("gpu"):
        counts = []
        for prologue_max in (0, fuse_module.PROLOGUE_MAX):
            monkeypatch.setattr(fuse_module, "PROLOGUE_MAX", prologue_max)
            model = Llama(cfg, w, max_len=64)
            model.reset(1)
            ref.reset(1)
            want = ref.step(np.asarray([prompt]))[0]
            nxt, logits = model.step(np.asarray([prompt]), want_logits=True)
            _close(np.asarray(logits)[0], want)
            counts.append(len(model.lower_step(nxt).kernels))
            for _ in range(3):
                want = ref.step(np.asarray([[int(np.argmax(want))]]))[0]
                nxt, logits = model.step(nxt, want_logits=True)
                _close(np.asarray(logits)[0], want)
    assert counts[0] - counts[1] == 2 * cfg.n_layers, counts


def _five_steps(model: Llama, prompts: np.ndarray) -> tuple[list[np.ndarray], Any]:
    """The prompts' prefill and 4 greedy decode steps: each step's logits, and the lowered
    decode step (at the position after the prefill)."""
    model.reset(len(prompts))
    nxt, logits = model.step(prompts, want_logits=True)
    got = [np.asarray(logits)]
    low = model.lower_step(nxt)
    for _ in range(4):
        nxt, logits = model.step(nxt, want_logits=True)
        got.append(np.asarray(logits))
    return got, low


@pytest.mark.parametrize("batch", [1, 2])
def test_decode_step_cache_update_in_the_attention_kernel(
        monkeypatch: pytest.MonkeyPatch, batch: int) -> None:
    """Kernels for GPUs: a decode step's in-place update of the cache is done by the attention
    kernel that reads it (passes.attention.fold_cache_update): one kernel a block fewer, and at
    every step (each attending over the positions the steps before wrote) the logits of the
    same model without the fold, and the reference's; the cache after the steps as without the
    fold, bit for bit. (A float16 cache is updated over the whole buffer, two values to a
    32-bit word, never in place over a window: nothing to fold there.)"""
    import importlib

    from helpers import forced_target

    att = importlib.import_module("fusec.passes.attention")
    cfg, w, r = _small(4 + batch)
    prompts = np.asarray([[7, 100, 3, 255, 18], [4, 4, 90, 1, 200]][:batch])
    ref = NumpyLlama(cfg, r, max_len=64)
    runs: dict[int, tuple[list[np.ndarray], list[np.ndarray], int, list[str]]] = {}
    with forced_target("gpu"):
        for fold in (0, 1):
            monkeypatch.setattr(att, "FOLD_CACHE_UPDATE", fold)
            model = Llama(cfg, w, max_len=64)
            got, low = _five_steps(model, prompts)
            cache = [np.asarray(c) for kv in model.cache for c in kv]
            runs[fold] = (got, cache, len(low.kernels),
                          [k.wgsl for k in low.kernels if k.kind == "attention"])
    (off, cache_off, n_off, _), (on, cache_on, n_on, att_on) = runs[0], runs[1]
    assert n_off - n_on == cfg.n_layers, (n_off, n_on)
    assert len(att_on) == cfg.n_layers and all("storageBarrier" in k for k in att_on)
    for a, b in zip(on, off):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    for a, b in zip(cache_on, cache_off):
        np.testing.assert_array_equal(a, b)
    assert np.abs(cache_on[0][:, :, :9]).min() > 0  # the steps wrote positions 0..8
    np.testing.assert_array_equal(cache_on[0][:, :, 9:], 0)
    ref.reset(batch)  # the reference, token by token
    want = ref.step(prompts)
    _close(on[0], want)
    for step in range(1, 5):
        want = ref.step(np.argmax(on[step - 1], axis=-1)[:, None])
        _close(on[step], want)


@pytest.mark.parametrize("batch,cache_dtype", [(1, "float32"), (3, "float32"), (1, "float16")])
def test_decode_step_attends_in_parts(monkeypatch: pytest.MonkeyPatch, batch: int,
                                      cache_dtype: str) -> None:
    """Kernels for GPUs: a decode step's attention over the cache in parts of the keys
    (flash-decoding: kernels.attention.PART_KEYS, here 16 of the 64 positions the step attends
    over, so the parts past the prompt are masked whole), the float32 cache's update still
    folded into the parts' kernel at batch 1: one kernel a block more (the parts'
    combination), none at batch 1 with fuse.COMBINE_PROLOGUE over at most COMBINE_MAX_PARTS
    parts (the output projection's kernel combines the parts as it loads them), and at every
    step the logits of the same model attending in one piece, and the reference's (a float16
    cache: within what its rounding explains)."""
    import importlib

    from helpers import forced_target

    katt = importlib.import_module("fusec.kernels.attention")
    cfg, w, r = _small(7 + batch)
    prompts = np.asarray([[7, 100, 3, 255, 18], [4, 4, 90, 1, 200], [8, 1, 2, 3, 4]][:batch])
    runs: dict[int, tuple[list[np.ndarray], list[str]]] = {}
    combined_in_products = 0
    with forced_target("gpu"):
        for part_keys in (0, 16):
            monkeypatch.setattr(katt, "PART_KEYS", part_keys)
            model = Llama(cfg, w, max_len=64, cache_dtype=cache_dtype)
            got, low = _five_steps(model, prompts)
            runs[part_keys] = (got, [k.wgsl for k in low.kernels if k.kind == "attention"])
            combined_in_products += sum(k.kind == "quant" and "attention_combine" in k.name
                                        for k in low.kernels)
            assert model.cache[0][0].dtype == cache_dtype
    (whole, att_whole), (parts, att_parts) = runs[0], runs[16]
    assert len(att_whole) == cfg.n_layers
    fuse_module = importlib.import_module("fusec.passes.fuse")
    folded = batch == 1 and fuse_module.COMBINE_PROLOGUE and fuse_module.COMBINE_MAX_PARTS >= 4
    assert len(att_parts) == (1 if folded else 2) * cfg.n_layers
    assert combined_in_products == (cfg.n_layers if folded else 0)
    assert sum("The keys in 4 parts of 16" in k for k in att_parts) == cfg.n_layers
    if batch == 1 and cache_dtype == "float32":
        assert sum("storageBarrier" in k for k in att_parts) == cfg.n_layers
    for a, b in zip(parts, whole):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    tol = {"rtol": 5e-3} if cache_dtype == "float16" else {}
    ref = NumpyLlama(cfg, r, max_len=64)
    ref.reset(batch)
    _close(parts[0], ref.step(prompts), **tol)
    for step in range(1, 5):
        _close(parts[step], ref.step(np.argmax(parts[step - 1], axis=-1)[:, None]), **tol)


def test_decode_steps_recorded_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode loop with calls recorded ahead (each step's kernels recorded while the host
    waits for the last token; generate() reads without that wait: copy_to_host_async): each
    step donates the cache, takes the last step's token and uploads its RoPE rows and mask; the
    call recorded ahead binds those buffers. Greedy tokens equal to the reference's, and most
    steps submitted as recorded ahead."""
    from fusec import config, runtime

    rt = runtime.get_runtime()
    assert rt is not None and rt.native is not None
    cfg, w, r = _small(5)
    prompt = [9, 33, 140, 2, 71, 5]
    want, _ = NumpyLlama(cfg, r, max_len=64).greedy(prompt, 10)
    monkeypatch.setattr(runtime, "BATCH_CALLS", 0)  # (a small model's step would join the batch)
    config.set("record_ahead", "always")
    try:
        used = rt.ahead_used
        model = Llama(cfg, w, max_len=64)
        model.reset(1)
        nxt = model.step(np.asarray([prompt]))
        got = []
        for i in range(10):  # each token read before the next step (the wait records it)
            got.append(int(np.asarray(nxt)[0]))
            if i < 9:
                nxt = model.step(nxt)
        assert got == want
        assert rt.ahead_used - used >= 6
        # generate's reads wait for their copies alone (copy_to_host_async)
        got = [int(t[0]) for t in model.generate(np.asarray([prompt]), 10)]
        assert got == want
    finally:
        config.set("record_ahead", None)
