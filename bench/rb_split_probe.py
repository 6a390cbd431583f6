"""GPU time of the MiniLM-L6 encoder's products at batch 32x128 (96 tiles of 128x128: under
one wave on an H200) and of the whole encoder, against splitting products with K below
``fusec.passes.splitk.RB_MIN_K`` along K, side by side in one run.

    FUSEC_CACHE_DIR=off python bench/rb_split_probe.py [--settings 2048:512,1024:512,1024:384]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

SHAPES = [(4096, 1536, 384), (4096, 384, 384), (4096, 384, 1536)]  # M x K x N


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", default="2048:512,1024:512,1024:384")
    a = ap.parse_args(argv)
    import bert_encoder as be
    import minilm_encoder as ex

    import fusec
    import fusec.numpy as fnp
    from fusec import bench, nn
    from fusec.passes import splitk

    policy = bench.Policy(warmup=3, min_reps=10, max_reps=30, budget_s=1.0, heat_s=0.2)
    rng = np.random.default_rng(0)
    wts = {k: fusec.device_put(v) for k, v in be.random_weights().items()}
    ids, mask = ex.make_batch(32, 128, 30522)
    idd, md = fusec.device_put(ids), fusec.device_put(mask)
    prods = [((m, k, n), [fusec.device_put(rng.standard_normal(s).astype(np.float32))
                          for s in ((m, k), (k, n), (n,))]) for m, k, n in SHAPES]
    saved = splitk.RB_MIN_K, splitk.RB_MIN_CHUNK
    for setting in a.settings.split(","):
        min_k, min_chunk = (int(v) for v in setting.split(":"))
        splitk.RB_MIN_K, splitk.RB_MIN_CHUNK = min_k, min_chunk
        try:
            row: dict[str, Any] = {"rb_min_k": min_k, "rb_min_chunk": min_chunk}
            for (m, k, n), args in prods:
                f = fusec.gpu_jit(lambda x, w, b: x @ w + b)
                kinds = [kk.kind for kk in f.lower(*args).kernels]
                row[f"{m}x{k}x{n}"] = (round(1e6 * bench.fusec_time(f, args, policy)["time_s"], 1),
                                       kinds)
            enc = fusec.gpu_jit(lambda w, i, m: ex.encode(fnp, nn, w, i, m, 1e-12))
            row["encoder_kernels"] = len(enc.lower(wts, idd, md).kernels)
            row["encoder_gpu_us"] = round(1e6 * bench.fusec_time(
                enc, [wts, idd, md], policy)["time_s"], 1)
            row["encoder_wall_us"] = round(1e6 * bench.wall_time(
                lambda enc=enc: enc(wts, idd, md).block_until_ready(), policy)["time_s"], 1)
            print(row, flush=True)
        finally:
            splitk.RB_MIN_K, splitk.RB_MIN_CHUNK = saved
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
