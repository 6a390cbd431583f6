"""The attention kernel against the same program without it (matmul, softmax and matmul
kernels), side by side in one run: GPU time by timestamps and wall clock per call (call + wait,
inputs on the device), for encoder-like shapes. JAX jit of the same computation beside them
where JAX is installed.

    python bench/attention_ab.py [--out r.json]
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
from timing import write_json  # noqa: E402  (bench/timing.py)

# (batch, heads, rows, keys, head dim): MiniLM at 32x128 and 1x16, a 512-token BERT-base
# layer, the quick bench transformer's heads
SHAPES = [(32, 12, 128, 128, 32), (1, 12, 16, 16, 32), (8, 12, 512, 512, 64),
          (1, 4, 128, 128, 64), (4, 8, 1024, 1024, 64)]


def attention(q: Any, k: Any, v: Any, bias: Any, scale: float, xp: Any = fnp,
              softmax: Any = nn.softmax) -> Any:
    s = (q @ xp.swapaxes(k, -1, -2)) * scale + bias
    return softmax(s, axis=-1) @ v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    policy = bench.Policy(warmup=3, min_reps=10, max_reps=50, budget_s=1.0, heat_s=0.2)
    rows = []
    for b, h, s, t, d in SHAPES:
        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((b, h, n, d)).astype(np.float32)
                   for n in (s, t, t))
        bias = np.where(rng.random((b, 1, 1, t)) < 0.2, -1e9, 0.0).astype(np.float32)
        dev = [fusec.device_put(x) for x in (q, k, v, bias)]
        scale = 1.0 / math.sqrt(d)
        rec: dict[str, Any] = {"shape": [b, h, s, t, d]}
        outs = {}
        for label, max_head in (("kernel", attention_kernel.MAX_HEAD), ("written_out", 0)):
            saved = attention_kernel.MAX_HEAD
            attention_kernel.MAX_HEAD = max_head
            try:
                f = fusec.gpu_jit(lambda q, k, v, m: attention(q, k, v, m, scale))
                kernels = [kk.kind for kk in f.lower(*dev).kernels]
                outs[label] = np.asarray(f(*dev))
                gpu = bench.fusec_time(f, dev, policy)
                wall = bench.wall_time(lambda: f(*dev).block_until_ready(), policy)
            finally:
                attention_kernel.MAX_HEAD = saved
            rec[label] = {"kernels": kernels, "gpu_us": 1e6 * gpu["time_s"],
                          "wall_us": 1e6 * wall["time_s"]}
        rec["max_abs_diff"] = float(np.abs(outs["kernel"] - outs["written_out"]).max())
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
