"""SmolLM2-135M-Instruct in llama.cpp (through llama-cpp-python) on the CPU: the second reference of
fusec's language model, and what local-LLM users compare against. Does not import fusec.

    pip install llama-cpp-python     # builds llama.cpp from source (cmake, a C++ compiler)
    python bench/llamacpp_reference.py --gguf PATH [--check tests/data/smollm2_reference.json]
        [--speed] [--threads N] [--out r.json]

``--check``: for each prompt of the transformers reference (its token ids, chat template
applied), greedy decoding of as many tokens, compared with the reference's: where the two part,
the reference's top-1 margin there (a near-tie or not) and the largest difference between
llama.cpp's logits and the reference's top-5 logits before it. llama.cpp multiplies the Q4_1
weights with activations rounded to 8 bits (Q8_1 blocks, its CPU kernels' way), so its logits
differ from a float32 product by more than float rounding: this tells how far.

``--speed``: decode tokens/s at batch 1 (greedy steps after a chat prompt, ``llm.eval`` of one
token and the argmax of its logits on the host, through the Python binding as a user calls it) and
prefill tokens/s of a 512-token prompt (one ``eval`` of 512 tokens in one batch), medians of
``--reps`` runs on ``--threads`` threads (default: the CPU cores).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np


def load(path: str, threads: int, n_ctx: int) -> Any:
    from llama_cpp import Llama

    return Llama(model_path=path, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=threads,
                 n_threads_batch=threads, logits_all=False, verbose=False)


def last_logits(llm: Any) -> np.ndarray:
    """The logits after the last evaluated token (float32, [vocab], a copy). Read from the
    context: without ``logits_all`` the binding's ``scores`` keeps none (its sampler reads them
    in place)."""
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).copy()


def check(llm: Any, ref: dict[str, Any], prompts: int, tie: float) -> dict[str, Any]:
    rows = []
    for p in ref["prompts"][:prompts]:
        want = p["generated_ids"]
        llm.reset()
        llm.eval(p["prompt_ids"])
        got: list[int] = []
        first_diff = None
        worst = 0.0
        for i in range(len(want)):
            lg = last_logits(llm)
            tok = int(np.argmax(lg))
            ids = p["top_ids"][i]
            worst = max(worst, float(np.max(np.abs(lg[ids] - np.asarray(p["top_logits"][i])))))
            got.append(tok)
            if tok != want[i]:
                first_diff = i
                break  # the sequences part: later steps compare different contexts
            llm.eval([tok])
        margin = None
        if first_diff is not None:
            top = p["top_logits"][first_diff]
            margin = float(top[0] - top[1])
        rows.append({"prompt": p["prompt"], "tokens": len(want), "same_tokens": first_diff is None,
                     "first_difference": first_diff, "ref_margin_there": margin,
                     "max_logit_diff_up_to_there": worst,
                     "near_tie": first_diff is None or (margin is not None and margin <= tie)})
        print(json.dumps(rows[-1]), flush=True)
    return {"prompts": rows, "tie": tie,
            "same_tokens": sum(r["same_tokens"] for r in rows),
            "all_same_or_near_tie": all(r["near_tie"] for r in rows)}


def speed(llm: Any, prompt_ids: list[int], reps: int, tokens: int) -> dict[str, Any]:
    def decode() -> float:
        llm.reset()
        llm.eval(prompt_ids)
        tok = int(np.argmax(last_logits(llm)))
        t = time.perf_counter()
        for _ in range(tokens):
            llm.eval([tok])
            tok = int(np.argmax(last_logits(llm)))
        return tokens / (time.perf_counter() - t)

    rng = np.random.default_rng(0)
    long_prompt = [1] + rng.integers(100, 40000, size=511).tolist()

    def prefill() -> float:
        llm.reset()
        t = time.perf_counter()
        llm.eval(long_prompt)
        return 512 / (time.perf_counter() - t)

    decode()
    prefill()  # warm-up
    dec = [decode() for _ in range(reps)]
    pre = [prefill() for _ in range(reps)]
    for what, runs in (("decode b1", dec), ("prefill 512", pre)):
        print(f"{what}: {statistics.median(runs):,.1f} tokens/s (runs: "
              + ", ".join(f"{r:,.1f}" for r in runs) + ")", flush=True)
    return {"decode_b1_tok_s": statistics.median(dec), "decode_b1_runs": dec,
            "decode_tokens": tokens, "decode_prompt_tokens": len(prompt_ids),
            "prefill_512_tok_s": statistics.median(pre), "prefill_512_runs": pre, "reps": reps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--check", default="", help="reference JSON (bench/smollm2_reference.py)")
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--tie", type=float, default=0.05)
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    llm = load(a.gguf, a.threads, 1024)
    res: dict[str, Any] = {
        "what": "SmolLM2-135M-Instruct Q4_1 in llama.cpp on the CPU: bench/llamacpp_reference.py",
        "llama_cpp_python": importlib.metadata.version("llama_cpp_python"),
        "cpu": platform.processor() or platform.machine(), "threads": a.threads,
        "cpu_count": os.cpu_count()}
    ref = json.loads(Path(a.check).read_text()) if a.check else None
    if ref is not None:
        res["check"] = check(llm, ref, a.prompts, a.tie)
    if a.speed:
        ids = ref["prompts"][0]["prompt_ids"] if ref is not None else [1] + list(range(100, 136))
        res["speed"] = speed(llm, ids, a.reps, a.decode_tokens)
    text = json.dumps(res, indent=1)
    if a.out:
        Path(a.out).write_text(text)
    print(text if not a.out else f"written {a.out}")


if __name__ == "__main__":
    main()
