"""bench/bert_encoder.py (issue 18's BERT line): its random weights have the checkpoint's names and
shapes, and a short torch-free run on the default adapter counts one layer's kernels and matches
the float64 numpy reference of examples/minilm_encoder.py."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
from helpers import REPO, pythonpath

SCRIPT = REPO / "bench" / "bert_encoder.py"


def _script() -> ModuleType:
    path = list(sys.path)
    try:  # the script puts examples/ and bench/ on sys.path for its own imports
        spec = importlib.util.spec_from_file_location("fusec_bench_bert_encoder", SCRIPT)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path[:] = path


def test_random_weights_have_the_checkpoints_names_and_shapes() -> None:
    mod = _script()
    real, config = mod.ex.load_weights()
    w = mod.random_weights(seed=3)
    assert {k: v.shape for k, v in w.items()} == {k: v.shape for k, v in real.items()}
    assert all(v.dtype == np.float32 for v in w.values())
    assert (mod.VOCAB, mod.D, mod.FFN, mod.EPS) == (
        config["vocab_size"], config["hidden_size"], config["intermediate_size"],
        config["layer_norm_eps"])
    gain = w["encoder.layer.2.output.LayerNorm.weight"]
    assert abs(float(gain.mean()) - 1.0) < 0.01 and 0.01 < float(gain.std()) < 0.03
    q = w["encoder.layer.0.attention.self.query.weight"]
    assert abs(float(q.std()) - 0.02) < 0.002
    # a different seed, different weights
    assert not np.array_equal(mod.random_weights(seed=4)["pooler.dense.bias"],
                              w["pooler.dense.bias"])


def test_torch_free_run_counts_kernels_and_matches_float64(tmp_path: Path) -> None:
    out = tmp_path / "bert.json"
    # wgpu even on a software adapter (the default there is the interpreter): kernels are counted
    env = {**os.environ, "FUSEC_BACKEND": "gpu", "PYTHONPATH": pythonpath()}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--shapes", "1x4,2x3", "--layers", "2", "--reps", "1",
         "--calls", "2", "--budget", "0", "--torch-device", "none", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    # a wgpu adapter (lavapipe here), never the numpy interpreter
    assert not res["cpu_fallback"] and res["backend"] != "cpu", res["device"]
    assert res["layers"] == 2 and res["weights"] == "random" and res["tf32"] is False
    assert [s["shape"] for s in res["shapes"]] == ["1x4", "2x3"]
    for s in res["shapes"]:
        fu = s["fusec"]
        assert fu["kernels_per_layer"] > 0 and fu["kernels_outside_layers"] > 0, fu
        assert fu["kernels_uniform"] and fu["kernels"] == (
            fu["kernels_outside_layers"] + 2 * fu["kernels_per_layer"])
        # float32 through 2 layers against float64: a few 1e-8 measured
        assert fu["max_abs_err_vs_float64"] < 1e-6, fu
        assert fu["wall_ms"] > 0 and fu["b2b_ms"] > 0 and fu["gpu_ms"] > 0
        assert "torch_eager" not in s and s["ratios"] == {}
    assert "fusec kernels: " in proc.stdout and "per layer" in proc.stdout
