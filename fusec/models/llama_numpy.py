"""A plain-numpy reference of a Llama-architecture model (SmolLM2), written from the model's
definition, on the same dequantised weights as :mod:`fusec.models.llama`: the oracle its tests
and benchmarks compare tokens and logits against.

It computes in float64 by default (``dtype``) with a key/value cache, one call per step, exactly
as the fusec model does: RMSNorm, Q/K/V projections, RoPE on adjacent pairs of each head's values
(the layout of GGUF's Q and K rows, which llama.cpp rotates as pairs ``(2i, 2i + 1)``), grouped
query attention with the causal mask, the output projection, SwiGLU, the final norm and the tied
LM head.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .llama import LlamaConfig, rope_tables


class NumpyLlama:
    """The reference model. ``weights`` are the float arrays of :func:`fusec.models.llama.
    load_gguf` with ``dequantize=True`` (matrices (out, in), as GGUF stores rows)."""

    def __init__(self, cfg: LlamaConfig, weights: dict[str, Any], max_len: int = 512,
                 dtype: Any = np.float64) -> None:
        self.cfg = cfg
        self.dtype = np.dtype(dtype)

        def cast(a: Any) -> np.ndarray:
            return np.asarray(a, dtype=self.dtype)

        self.embed = cast(weights["embed"])
        self.lm_head = cast(weights["lm_head"])
        self.norm = cast(weights["norm"])
        self.layers = [{k: cast(v) for k, v in lw.items()} for lw in weights["layers"]]
        cos, sin = rope_tables(cfg, max_len)
        self.cos, self.sin = cast(cos), cast(sin)
        self.max_len = max_len
        self.reset(1)

    def reset(self, batch: int) -> None:
        c = self.cfg
        shape = (batch, c.n_kv_heads, self.max_len, c.head_dim)
        self.k = [np.zeros(shape, self.dtype) for _ in range(c.n_layers)]
        self.v = [np.zeros(shape, self.dtype) for _ in range(c.n_layers)]
        self.pos = 0

    def _rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        ms = np.mean(x * x, axis=-1, keepdims=True)
        return x / np.sqrt(ms + self.cfg.eps) * w

    def _rope(self, x: np.ndarray, pos: int) -> np.ndarray:
        """x[B, T, heads, hd]: pairs (2i, 2i+1) of each head rotated by position * freq_i."""
        t = x.shape[1]
        cos = self.cos[pos:pos + t][None, :, None, :]
        sin = self.sin[pos:pos + t][None, :, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    def step(self, tokens: np.ndarray) -> np.ndarray:
        """Logits [B, V] of the last position after feeding ``tokens`` [B, T] at the current
        position; the cache advances by T."""
        c = self.cfg
        tokens = np.asarray(tokens)
        b, t = tokens.shape
        pos = self.pos
        if pos + t > self.max_len:
            raise ValueError(f"the cache holds {self.max_len} positions; {pos} + {t} exceed it")
        hd, kvh, g = c.head_dim, c.n_kv_heads, c.n_heads // c.n_kv_heads
        x = self.embed[tokens]
        allowed = np.arange(pos + t)[None, :] <= (pos + np.arange(t))[:, None]  # [T, keys]
        for i, lw in enumerate(self.layers):
            h = self._rms(x, lw["attn_norm"])
            q = self._rope((h @ lw["q"].T).reshape(b, t, c.n_heads, hd), pos)
            k = self._rope((h @ lw["k"].T).reshape(b, t, kvh, hd), pos)
            v = (h @ lw["v"].T).reshape(b, t, kvh, hd)
            self.k[i][:, :, pos:pos + t] = k.transpose(0, 2, 1, 3)
            self.v[i][:, :, pos:pos + t] = v.transpose(0, 2, 1, 3)
            kk = self.k[i][:, :, :pos + t]  # [B, KVH, keys, hd]
            vv = self.v[i][:, :, :pos + t]
            qg = q.reshape(b, t, kvh, g, hd).transpose(0, 2, 3, 1, 4)  # [B, KVH, G, T, hd]
            s = qg @ kk[:, :, None].swapaxes(-1, -2) / np.sqrt(hd)  # [B, KVH, G, T, keys]
            s = np.where(allowed, s, -np.inf)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            a = (s / s.sum(axis=-1, keepdims=True)) @ vv[:, :, None]  # [B, KVH, G, T, hd]
            a = a.transpose(0, 3, 1, 2, 4).reshape(b, t, c.d_model)
            x = x + a @ lw["o"].T
            h = self._rms(x, lw["ffn_norm"])
            gate = h @ lw["gate"].T
            x = x + ((gate / (1 + np.exp(-gate))) * (h @ lw["up"].T)) @ lw["down"].T
        self.pos = pos + t
        return self._rms(x[:, -1], self.norm) @ self.lm_head.T

    def greedy(self, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
        """Greedy decoding of ``n`` tokens after ``prompt``: the tokens and each step's logits."""
        self.reset(1)
        logits = self.step(np.asarray([prompt]))[0]
        out, all_logits = [], []
        for _ in range(n):
            all_logits.append(logits)
            tok = int(np.argmax(logits))
            out.append(tok)
            if len(out) == n:
                break
            logits = self.step(np.asarray([[tok]]))[0]
        return out, all_logits
