"""The all-MiniLM-L6-v2 example (examples/minilm_encoder.py): a real 6-layer BERT encoder with its
packaged weights, run on the wgpu adapter, against the same network in float64 numpy."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np

import fusec
import fusec.numpy as fnp
from fusec import nn

REPO = Path(__file__).resolve().parent.parent


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fusec_example_minilm",
                                                  REPO / "examples" / "minilm_encoder.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_minilm_embeddings_match_float64_numpy() -> None:
    ex = _example()
    assert not fusec.default_device().is_cpu_fallback
    w, config = ex.load_weights()
    # every tensor of the checkpoint but position_ids: embeddings, layers, the (unused) pooler
    assert len(w) == 5 + 16 * ex.LAYERS + 2
    eps = float(config["layer_norm_eps"])
    ids, mask = ex.make_batch(3, 13, int(config["vocab_size"]), seed=7)
    f = fusec.gpu_jit(lambda w, ids, mask: ex.encode(fnp, nn, w, ids, mask, eps))
    got = np.asarray(f({k: fusec.device_put(v) for k, v in w.items()}, ids, mask))
    want = ex.reference(w, ids, mask, eps)
    assert got.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, rtol=1e-5)
    # float32 through 6 layers: a few 1e-7 measured; padding must not leak into the pooling
    np.testing.assert_allclose(got, want, atol=3e-6)
    other_pad = np.where(mask == 1, ids, 7).astype(np.int32)
    got2 = np.asarray(f({k: fusec.device_put(v) for k, v in w.items()}, other_pad, mask))
    np.testing.assert_allclose(got2, got, atol=3e-6)
