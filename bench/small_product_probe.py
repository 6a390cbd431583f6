"""GPU time of the MiniLM-L6 encoder's products at batch 1x16 (16 rows: the few-row template) and
of the whole encoder, against how K is split (``fusec.passes.splitk.MIN_CHUNK``) and with the
16x16 tiled kernel in place of the few-row one (``codegen.GEMV`` off), side by side in one run.

    FUSEC_CACHE_DIR=off python bench/small_product_probe.py [--chunks 128,64,32,16]
        [--shapes 16x384x384,...] [--no-encoder]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

SHAPES = [(16, 384, 384), (16, 1536, 384), (16, 384, 1536)]  # M x K x N


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", default="128,64,32,16")
    ap.add_argument("--shapes", default=",".join(f"{m}x{k}x{n}" for m, k, n in SHAPES))
    ap.add_argument("--no-encoder", action="store_true")
    a = ap.parse_args(argv)
    import bert_encoder as be
    import minilm_encoder as ex

    import fusec
    import fusec.numpy as fnp
    from fusec import bench, codegen, nn
    from fusec.passes import splitk

    policy = bench.Policy(warmup=3, min_reps=10, max_reps=30, budget_s=1.0, heat_s=0.2)
    rng = np.random.default_rng(0)
    wts = {k: fusec.device_put(v) for k, v in be.random_weights().items()}
    ids, mask = ex.make_batch(1, 16, 30522)
    idd, md = fusec.device_put(ids), fusec.device_put(mask)
    prods = []
    for m, k, n in (tuple(int(v) for v in sh.split("x")) for sh in a.shapes.split(",")):
        x, w, b = (fusec.device_put(rng.standard_normal(s).astype(np.float32))
                   for s in ((m, k), (k, n), (n,)))
        prods.append(((m, k, n), [x, w, b]))
    settings: list[tuple[str, int, bool]] = [(f"min_chunk {c}", int(c), True)
                                             for c in a.chunks.split(",")]
    settings.append(("16x16 tiles (no gemv)", splitk.MIN_CHUNK, False))
    saved = splitk.MIN_CHUNK, codegen.GEMV
    for label, chunk, gemv in settings:
        splitk.MIN_CHUNK, codegen.GEMV = chunk, gemv
        try:
            row: dict[str, Any] = {"setting": label}
            for shape, args in prods:
                f = fusec.gpu_jit(lambda x, w, b: x @ w + b)
                kinds = [kk.kind for kk in f.lower(*args).kernels]
                row[f"{shape[0]}x{shape[1]}x{shape[2]}"] = (
                    round(1e6 * bench.fusec_time(f, args, policy)["time_s"], 1), kinds)
            if a.no_encoder:
                print(row, flush=True)
                continue
            enc = fusec.gpu_jit(lambda w, i, m: ex.encode(fnp, nn, w, i, m, 1e-12))
            row["encoder_gpu_us"] = round(1e6 * bench.fusec_time(
                enc, [wts, idd, md], policy)["time_s"], 1)
            row["encoder_wall_us"] = round(1e6 * bench.wall_time(
                lambda enc=enc: enc(wts, idd, md).block_until_ready(), policy)["time_s"], 1)
            print(row, flush=True)
        finally:
            splitk.MIN_CHUNK, codegen.GEMV = saved
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
