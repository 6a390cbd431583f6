"""The examples under ``examples/``: a real training run on the default adapter, and the
benchmark that times the same training in fusec, JAX and torch (a short smoke run)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import fusec

REPO = Path(__file__).resolve().parent.parent


def _load_example(name: str) -> ModuleType:
    path = REPO / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"fusec_example_{name}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def digits() -> ModuleType:
    import sklearn  # noqa: F401  (the data set; in the test extra: never skipped)
    return _load_example("train_digits")


@pytest.fixture(scope="module")
def digits_run(digits: ModuleType) -> dict[str, Any]:
    """One full training run with the example's defaults, shared by the tests below."""
    dev = fusec.default_device()
    # a real wgpu adapter (lavapipe in CI), never the numpy interpreter
    assert not dev.is_cpu_fallback and dev.backend != "cpu", dev
    result: dict[str, Any] = digits.train(quiet=True)
    return result


def test_digits_reaches_95_percent_in_under_two_minutes(digits_run: dict[str, Any]) -> None:
    assert digits_run["test_accuracy"] >= 0.95, digits_run["test_accuracy"]
    assert digits_run["wall_s"] < 120.0, digits_run["wall_s"]
    assert digits_run["train_accuracy"] >= 0.98
    assert digits_run["steps"] == 20 * (1347 // 64)  # 20 epochs of full batches


def test_digits_loss_decreases(digits_run: dict[str, Any]) -> None:
    losses = digits_run["losses"]
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.1 * losses[0], losses
    # mostly downhill, epoch after epoch (Adam with a fixed step size may wobble a little)
    assert sum(b < a for a, b in zip(losses, losses[1:])) >= 0.8 * (len(losses) - 1), losses


def test_digits_step_is_one_compiled_program(digits_run: dict[str, Any]) -> None:
    """After the first epoch nothing traces or compiles again, and the parameters never come
    back to the host: the only readback of an epoch is its summed loss."""
    first, last = digits_run["step_cache"]
    assert last.traces == first.traces
    assert last.lowerings == first.lowerings
    assert last.misses == first.misses
    assert last.pipelines_compiled == first.pipelines_compiled
    later_epochs = len(digits_run["losses"]) - 1
    later_steps = digits_run["steps"] - digits_run["steps"] // len(digits_run["losses"])
    # each later step one cached call, and nothing else but one shuffle per epoch
    assert last.hits - first.hits == later_steps + later_epochs
    assert last.readbacks - first.readbacks == later_epochs


def test_digits_train_step_kernels(digits: ModuleType) -> None:
    """The step is one program: forward, backward and Adam fused into a handful of kernels, the
    parameters and optimizer state written into their donated buffers."""
    x_tr, y_tr, _, _ = digits.load_data()
    params, state = digits.init_state(fusec.random.key(0))
    order = np.arange(len(x_tr), dtype=np.int32)
    low = digits.train_step.lower(params, state, np.float32(0), x_tr, y_tr, order, 0,
                                  batch_size=64)
    names = [k.name for k in low.kernels]
    assert sum("_mm_" in n for n in names) >= 4, names  # 2 forward + 2 weight-gradient matmuls
    assert len(names) <= 16, names
    text = low.as_text("ir")
    assert "slots=(in" in text  # updates land in donated buffers


def test_digits_main_returns_accuracy(digits: ModuleType,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    acc = digits.main(["--epochs", "2", "--batch-size", "128", "--seed", "3"])
    out = capsys.readouterr().out
    assert isinstance(acc, float) and 0.8 <= acc <= 1.0, acc  # two epochs already get far
    assert "final test accuracy" in out and "steps/s" in out
    assert digits.main(["--epochs", "1", "--quiet"]) > 0.5
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="batch-size"):
        digits.main(["--epochs", "1", "--batch-size", "0", "--quiet"])
    with pytest.raises(ValueError, match="epochs"):
        digits.main(["--epochs", "0", "--quiet"])


def test_digits_init_leaves_have_their_own_buffers(digits: ModuleType) -> None:
    """The train step donates every leaf of the parameters and the optimizer state: no two may
    share a device buffer (zeros of equal shape from one jitted call would)."""
    params, state = digits.init_state(fusec.random.key(1))
    leaves = fusec.tree_util.tree_leaves((params, state))
    buffers = [a._buffer for a in leaves]
    assert len({id(b) for b in buffers}) == len(leaves)


def test_train_digits_compare_smoke(tmp_path: Path) -> None:
    """The benchmark script runs here with tiny step counts (torch columns skip when torch is
    absent) and fusec and JAX, from the same initial parameters and minibatches, agree."""
    import jax  # noqa: F401  (both in the test extra: never skipped)
    import sklearn  # noqa: F401
    out = tmp_path / "compare.json"
    env = dict(os.environ)
    env.setdefault("XDG_RUNTIME_DIR", "/tmp")
    # its own process: the script imports torch (when present) before fusec, as it must
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "train_digits_compare.py"), "--steps", "4",
         "--warmup", "3", "--repeats", "2", "--only", "fusec,jax,torch-eager", "--out",
         str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "steps/s" in proc.stdout
    report = json.loads(out.read_text())
    res = report["results"]
    assert set(res) == {"fusec", "jax", "torch-eager"}
    for name in ("fusec", "jax"):
        r = res[name]
        assert "error" not in r, r
        assert r["steps_per_s"] > 0 and len(r["steps_per_s_blocks"]) == 2
        assert r["steps_trained"] == 3 + 2 * 4
        assert 0.0 <= r["test_accuracy"] <= 1.0
    assert res["fusec"]["traces_while_timed"] == 0
    assert res["fusec"]["pipelines_compiled_while_timed"] == 0
    # same start, same batches, same optimizer: the same loss after 11 steps
    np.testing.assert_allclose(res["fusec"]["final_loss"], res["jax"]["final_loss"], rtol=1e-3)
    assert abs(res["fusec"]["test_accuracy"] - res["jax"]["test_accuracy"]) <= 0.01
    t = res["torch-eager"]
    assert "skipped" in t or "steps_per_s" in t, t


def test_user_guide_training_snippets_run(capsys: pytest.CaptureFixture[str]) -> None:
    """The code blocks of the user guide's Training section run, in order, as one program, and
    compute what their comments say."""
    import re

    text = (REPO / "docs" / "user-guide.md").read_text()
    section = text.split("\n## Training\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) >= 5
    ns: dict[str, Any] = {}
    exec(compile("\n".join(blocks), "user-guide.md#training", "exec"), ns)  # noqa: S102
    x = np.linspace(0.0, 1.0, 5)
    np.testing.assert_allclose(np.asarray(ns["g"]), np.sin(x) + x * np.cos(x), rtol=1e-5,
                               atol=1e-6)
    assert float(ns["l"]) == 9.0 and ns["gw"].shape == (3, 2)
    xv = np.array([0.0, 0.5, 1.0])
    np.testing.assert_allclose(np.asarray(ns["ct"]), 1 - np.tanh(xv) ** 2, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(ns["dy"]), 1 - np.tanh(xv) ** 2, rtol=1e-5)
    A = ns["A"].astype(np.float64)
    want = (1 - np.tanh(A @ xv) ** 2)[:, None] * A
    np.testing.assert_allclose(np.asarray(ns["J"]), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(ns["J2"]), want, rtol=1e-5, atol=1e-6)
    out = capsys.readouterr().out
    assert "[0.5 1. ]" in out and "[0.5 nan]" in out
    assert float(ns["loss"]) < 0.2


def test_smollm2_example_streams_the_reference_reply(capsys: pytest.CaptureFixture[str]) -> None:
    """examples/smollm2.py on this adapter: the chat prompt through the GGUF file's tokenizer,
    the prefill in one call, and the first token of the reply streamed as text: "The" (the first
    token of "The capital of France is Paris." that transformers gives, tests/data)."""
    example = _load_example("smollm2")
    assert example.main(["What is the capital of France?", "--tokens", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == "The", captured.out
    assert "1 generated" in captured.err and "prompt tokens" in captured.err


@pytest.fixture(scope="module")
def export_web() -> ModuleType:
    return _load_example("export_web")


def test_export_web_example_writes_a_demo_that_loads_back(export_web: ModuleType,
                                                          tmp_path: Path) -> None:
    """examples/export_web.py with one encoder layer: the web directory holds the demo page, its
    settings and the sentences' tokens; the export, loaded back, gives unit embeddings that match
    the float64 numpy network of examples/minilm_encoder.py and their similarity matrix."""
    from safetensors.numpy import load_file

    assert not fusec.default_device().is_cpu_fallback
    out = export_web.build(tmp_path / "demo", layers=1)
    assert out == tmp_path / "demo"
    for name in ("manifest.json", "weights.safetensors", "samples.safetensors", "model.js",
                 "model.d.ts", "index.html"):
        assert (out / name).is_file(), name
    m = json.loads((out / "manifest.json").read_text())
    assert all((out / k["file"]).is_file() for k in m["kernels"]) and m["kernels"]
    sentences = list(export_web.SENTENCES)
    b = len(sentences)
    assert [i["dtype"] for i in m["inputs"]] == ["int32", "int32"]
    # outputs: the dict's leaves in sorted key order, embeddings then similarity
    assert [o["shape"] for o in m["outputs"]] == [[b, 384], [b, b]]
    demo = m["demo"]
    assert demo["heatmap"] == 1 and demo["labels"] == sentences
    assert demo["cell"] >= 32 and demo["title"] and "first" in demo["description"]
    assert m["samples"] == "samples.safetensors"

    samples = load_file(str(out / "samples.safetensors"))
    ids, mask = samples["in0"], samples["in1"]
    # [CLS] tokens [SEP] [PAD]...: padded to the longest sentence, not to the file's 128
    lengths = mask.sum(1)
    assert ids.shape == mask.shape and ids.shape[1] == lengths.max() < 40
    assert len(set(lengths.tolist())) > 1  # sentences of different lengths: padding is tested
    assert (ids[:, 0] == 101).all() and (ids[np.arange(b), lengths - 1] == 102).all()
    assert (ids[mask == 0] == 0).all()

    exported = fusec.load_exported(out)
    res = exported(ids, mask)
    emb, sim = np.asarray(res["embeddings"]), np.asarray(res["similarity"])
    np.testing.assert_allclose(np.linalg.norm(emb, axis=-1), 1.0, rtol=1e-5)
    minilm = _load_example("minilm_encoder")
    w, config = minilm.load_weights()
    want = minilm.reference(w, ids, mask, float(config["layer_norm_eps"]), layers=1)
    # float32 through one layer and pooling (test_minilm.py measures a few 1e-7 over six)
    np.testing.assert_allclose(emb, want, atol=3e-6)
    np.testing.assert_allclose(sim, want @ want.T, atol=1e-5)
    # what the demo page compares the browser's outputs with: what Python computed at export
    np.testing.assert_allclose(samples["out0"], emb, atol=1e-6)
    np.testing.assert_allclose(samples["out1"], sim, atol=1e-6)


def test_export_web_sentences_make_a_structured_matrix(export_web: ModuleType) -> None:
    """The demo's sentences (two pairs of paraphrases, two unrelated ones) through the full
    6-layer network in float64 numpy: each pair is clearly more similar than any two sentences
    of different pairs, so the heatmap shows two bright blocks."""
    minilm = _load_example("minilm_encoder")
    w, config = minilm.load_weights()
    ids, mask = export_web.tokenize(export_web.SENTENCES)
    emb = minilm.reference(w, ids, mask, float(config["layer_norm_eps"]))
    sim = emb @ emb.T
    pairs = {(0, 1), (2, 3)}
    inside = [sim[i, j] for i, j in pairs]
    outside = [sim[i, j] for i in range(len(sim)) for j in range(i) if (j, i) not in pairs]
    assert min(inside) > 0.5 and max(outside) < 0.2, (inside, outside)
    with pytest.raises(ValueError, match="layers"):
        export_web.build("/nonexistent", layers=7)
    with pytest.raises(ValueError, match="sentences"):
        export_web.build("/nonexistent", sentences="one string")
