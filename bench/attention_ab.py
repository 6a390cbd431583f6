"""The attention kernel against the same program without it (matmul, softmax and matmul
kernels), side by side in one run: GPU time by timestamps and wall clock per call (call + wait,
inputs on the device), for encoder-like shapes. JAX jit of the same computation beside them
where JAX is installed.

    python bench/attention_ab.py [--configs 64x1,64x2,32x4] [--max-head 64] [--shapes 0,1]
        [--rounds 2] [--out r.json]

``--configs``: variants of the thread-per-row kernel, ROWSxSPLIT[xCHUNK[xSTAGE[xTILE]]] (query
rows per workgroup x threads per row x keys per chunk x staged bias 0/1 x keys per tile;
``fusec.kernels.attention.ROWS`` / ``SPLIT`` / ``CHUNK`` / ``STAGE_BIAS`` / ``MAX_TILE``), each
timed beside the written-out plan, in ``--rounds`` interleaved rounds (the best round's median
is reported);
``--max-head`` lets wider heads take the kernel (``MAX_HEAD``); ``--shapes`` picks rows of
SHAPES by index. The settings are read at lowering: run with ``FUSEC_CACHE_DIR=off``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

import fusec
import fusec.numpy as fnp
from fusec import bench, nn
from fusec.kernels import attention as attention_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import overridden, write_json  # noqa: E402  (bench/timing.py)

# (batch, heads, rows, keys, head dim): MiniLM at 32x128 and 1x16, a 512-token BERT-base
# layer, the quick bench transformer's heads, MiniLM's heads over 512 tokens
SHAPES = [(32, 12, 128, 128, 32), (1, 12, 16, 16, 32), (8, 12, 512, 512, 64),
          (1, 4, 128, 128, 64), (4, 8, 1024, 1024, 64), (4, 12, 512, 512, 32)]


def attention(q: Any, k: Any, v: Any, bias: Any, scale: float, xp: Any = fnp,
              softmax: Any = nn.softmax) -> Any:
    s = (q @ xp.swapaxes(k, -1, -2)) * scale + bias
    return softmax(s, axis=-1) @ v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="")
    ap.add_argument("--configs", default="")
    ap.add_argument("--max-head", type=int, default=attention_kernel.MAX_HEAD)
    ap.add_argument("--shapes", default="")
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args(argv)
    variants: list[tuple[str, dict[str, int]]] = [("kernel", {"MAX_HEAD": a.max_head})]
    for c in (c for c in a.configs.split(",") if c):
        vals = [int(v) for v in c.split("x")]
        names = ("ROWS", "SPLIT", "CHUNK", "STAGE_BIAS", "MAX_TILE")[:len(vals)]
        variants.append((f"kernel_{c}", {"MAX_HEAD": a.max_head, **dict(zip(names, vals))}))
    variants.append(("written_out", {"MAX_HEAD": 0}))
    shapes = [SHAPES[int(i)] for i in a.shapes.split(",")] if a.shapes else SHAPES
    policy = bench.Policy(warmup=3, min_reps=10, max_reps=50, budget_s=1.0, heat_s=0.2)
    rows = []
    for b, h, s, t, d in shapes:
        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((b, h, n, d)).astype(np.float32)
                   for n in (s, t, t))
        bias = np.where(rng.random((b, 1, 1, t)) < 0.2, -1e9, 0.0).astype(np.float32)
        dev = [fusec.device_put(x) for x in (q, k, v, bias)]
        scale = 1.0 / math.sqrt(d)
        rec: dict[str, Any] = {"shape": [b, h, s, t, d]}
        outs = {}
        for label, setting in [v for _ in range(a.rounds) for v in variants]:
            with overridden([(attention_kernel, name, value) for name, value in setting.items()]):
                f = fusec.gpu_jit(lambda q, k, v, m: attention(q, k, v, m, scale))
                kernels = [kk.kind for kk in f.lower(*dev).kernels]
                outs[label] = np.asarray(f(*dev))
                gpu = bench.fusec_time(f, dev, policy)
                wall = bench.wall_time(lambda: f(*dev).block_until_ready(), policy)
            old = rec.get(label, {"gpu_us": math.inf, "wall_us": math.inf})
            rec[label] = {"kernels": kernels, "gpu_us": min(old["gpu_us"], 1e6 * gpu["time_s"]),
                          "wall_us": min(old["wall_us"], 1e6 * wall["time_s"])}
        rec["max_abs_diff"] = max(float(np.abs(o - outs["written_out"]).max())
                                  for o in outs.values())
        try:
            import jax

            jf = jax.jit(lambda q, k, v, m: attention(q, k, v, m, scale, jax.numpy,
                                                      jax.nn.softmax))
            jd = [jax.device_put(x) for x in (q, k, v, bias)]
            with jax.default_matmul_precision("highest"):
                jf(*jd).block_until_ready()
                rec["jax_wall_us"] = 1e6 * bench.wall_time(
                    lambda: jf(*jd).block_until_ready(), policy)["time_s"]
        except Exception as exc:  # noqa: BLE001 - optional reference
            rec["jax_error"] = repr(exc)[:200]
        print(json.dumps(rec))
        rows.append(rec)
    write_json(rows, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
