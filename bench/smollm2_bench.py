"""SmolLM2-135M-Instruct in fusec (fusec.models.llama, Q4_1/Q8_0 weights): tokens checked against
a reference and speed, for the GPU machine.

    python bench/smollm2_bench.py --check tests/data/smollm2_reference.json --out r.json
    python bench/smollm2_bench.py --speed --out s.json [--gguf PATH]

``--check``: greedy decoding of each prompt of the reference file (transformers on the same
dequantised weights, bench/smollm2_reference.py) for its number of tokens. A step whose token
differs is accepted only when it is a near-tie in the reference (the reference's top two logits
within ``--tie``) and the logits agreed up to it; the report gives, per prompt, the first
difference, the largest logit difference of the steps before it (on the reference's top-k ids)
and the reference's margin there.

``--profile``: GPU time per kernel of one decode step (fusec.profile).

``--speed``: decode tokens/s (batch x steps / s) at batch 1 and 8 (greedy, after a chat
prompt; each step's tokens read back as ``Llama.generate`` streams them, their copy started
before the next step is called and read after it, and also back to back with the tokens left
on the device),
prefill tokens/s of a 512-token prompt (one call), wall clock, medians of ``--reps`` runs; the
bytes a decode step reads (weights + the key/value cache it attends over) over the measured copy
bandwidth gives the fraction of the memory-bandwidth limit.

On an NVIDIA GPU the clocks are held at full speed (``--no-hold-clocks`` not to): see
``fusec.hold_gpu_clocks``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

try:  # (before fusec: torch's compiler stack and Mesa's LLVM collide the other way round)
    import torch  # noqa: F401
except ImportError:
    pass
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import report  # noqa: E402

import fusec  # noqa: E402
from fusec.models.llama import Llama, measure_speed  # noqa: E402


def check(model: Llama, ref: dict[str, Any], tie: float, n_prompts: int) -> dict[str, Any]:
    rows = []
    for p in ref["prompts"][:n_prompts]:
        want = p["generated_ids"]
        model.reset(1)
        nxt, logits = model.step(np.asarray([p["prompt_ids"]], dtype=np.int32), want_logits=True)
        got: list[int] = []
        worst = 0.0
        first_diff = None
        for i in range(len(want)):
            lg = np.asarray(logits)[0]
            tok = int(np.asarray(nxt)[0])
            ids = p["top_ids"][i]
            diff = float(np.max(np.abs(lg[ids] - np.asarray(p["top_logits"][i]))))
            if first_diff is None:
                worst = max(worst, diff)
            got.append(tok)
            if tok != want[i] and first_diff is None:
                first_diff = i
                break  # the sequences part; later steps compare different contexts
            if i + 1 < len(want):
                nxt, logits = model.step(nxt, want_logits=True)
        margin = None
        if first_diff is not None:
            top = p["top_logits"][first_diff]
            margin = float(top[0] - top[1])
        ok = first_diff is None or (margin is not None and margin <= tie)
        rows.append({"prompt": p["prompt"], "tokens": len(want), "same_tokens": first_diff is None,
                     "first_difference": first_diff, "ref_margin_there": margin,
                     "max_logit_diff_before": worst, "ok": ok, "got": got})
        print(json.dumps(rows[-1])[:400], flush=True)
    return {"prompts": rows, "all_ok": all(r["ok"] for r in rows)}


def _copy_bandwidth() -> tuple[float, str]:
    """Bytes/s (read + write) of the best of 10 device copies of 512 MiB: torch's where it has
    CUDA (the machine's reference), else fusec's elementwise copy timed by GPU timestamps."""
    n = 1 << 27
    try:
        import torch

        if torch.cuda.is_available():
            x = torch.ones(n, device="cuda")
            y = torch.empty_like(x)
            ts = []
            for _ in range(10):
                torch.cuda.synchronize()
                t = time.perf_counter()
                y.copy_(x)
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t)
            return 2 * 4 * n / min(ts), "torch copy_"
    except ImportError:
        pass
    xf = fusec.device_put(np.ones(n, np.float32))
    f = fusec.gpu_jit(lambda a: a + 1.0)
    f(xf).block_until_ready()
    with fusec.profile(print_report=False) as p:
        for _ in range(10):
            f(xf).block_until_ready()
    return 2 * 4 * n / (min(us for _, us in p.kernels) * 1e-6), "fusec add, GPU timestamps"


def _weight_bytes(model: Llama) -> int:
    """Bytes of weights a decode step reads: every matrix's words and the norms (the embedding
    table's one row per token aside)."""
    mats = [v for lw in model.params["layers"] for v in lw.values()]
    return sum(int(v.nbytes) for v in mats + [model.params["lm_head"], model.params["norm"]])


def speed(model: Llama, reps: int, decode_tokens: int) -> dict[str, Any]:
    res: dict[str, Any] = dict(measure_speed(model, reps=reps, decode_tokens=decode_tokens))
    bw, bw_how = _copy_bandwidth()
    wbytes = _weight_bytes(model)
    cfg = model.cfg
    ctx_mean = 64  # the bucket the first 32 decode tokens after a 32-token prompt attend over
    cache_item = np.dtype(model.cache_dtype).itemsize
    kv_bytes = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * ctx_mean * cache_item
    per_token = wbytes + kv_bytes
    limit_tok_s = bw / per_token
    res.update({"copy_bandwidth_GBs": bw / 1e9, "copy_bandwidth_by": bw_how,
                "weight_bytes": wbytes,
                "kv_bytes_per_token_b1": kv_bytes, "bandwidth_limit_tok_s_b1": limit_tok_s,
                "fraction_of_limit_b1_streaming": res["decode_b1_tok_s_streaming"] / limit_tok_s,
                "fraction_of_limit_b1_device": res["decode_b1_tok_s_device"] / limit_tok_s})
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--check", default="", help="reference JSON (bench/smollm2_reference.py)")
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--tie", type=float, default=0.05)
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--cache-dtype", default="float32")
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--out", default="")
    ap.add_argument("--no-hold-clocks", action="store_true",
                    help="leave an NVIDIA GPU's clocks to its driver: by default a CUDA context "
                         "holds them at full speed (fusec.hold_gpu_clocks), as the transformers "
                         "reference's own context does")
    a = ap.parse_args()
    clocks = "not held (--no-hold-clocks)" if a.no_hold_clocks else fusec.hold_gpu_clocks()
    t = time.perf_counter()
    model = Llama.from_gguf(a.gguf, max_len=a.max_len, cache_dtype=a.cache_dtype)
    res: dict[str, Any] = {"device": str(fusec.default_device()), "load_s":
                           time.perf_counter() - t, "cache_dtype": a.cache_dtype,
                           "gpu_clocks": clocks}
    if a.check:
        res["check"] = check(model, json.loads(Path(a.check).read_text()), a.tie, a.prompts)
    if a.speed:
        res["speed"] = speed(model, a.reps, a.decode_tokens)
    if a.profile:
        model.reset(1)
        nxt = model.step(np.arange(100, 132, dtype=np.int32)[None])
        for _ in range(3):
            nxt = model.step(nxt)
        np.asarray(nxt)
        with fusec.profile() as prof:
            np.asarray(model.step(nxt))
        t = time.perf_counter()
        for _ in range(20):
            nxt = model.step(nxt)
        np.asarray(nxt)
        res["profile"] = {"kernels": len(prof.kernels),
                          "gpu_ms_sum": sum(us for _, us in prof.kernels) / 1e3,
                          "wall_ms_per_step_back_to_back": (time.perf_counter() - t) / 20 * 1e3}
    report(res, a.out)


if __name__ == "__main__":
    main()
