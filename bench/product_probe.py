"""GPU time of the MiniLM-L6 encoder's products, and of the whole encoder (and its wall clock),
under settings of the planner's constants, side by side in one run. Each setting is a list of
``module.NAME=value`` overrides (``codegen``, ``splitk``, ``merge`` (fusec.passes.merge) or
``attention`` (fusec.kernels.attention); a tuple's values joined by colons),
``default`` for none. ``--torch`` times the same products with cuBLAS first.

    FUSEC_CACHE_DIR=off python bench/product_probe.py [--batch 1x16] [--shapes 16x384x384,...]
        [--settings "default;codegen.GEMV_MIN_KN=0;splitk.MIN_CHUNK=32"] [--no-encoder]

Used for: the few-row template against the 16x16 kernel at batch 1x16 (``codegen.GEMV_MIN_KN=0``
gives every few-row product the few-row template, ``codegen.GEMV=0`` none), and the products
at 32x128 cut along K
(``--batch 32x128 --shapes 4096x1536x384,4096x384x384,4096x384x1536 --settings
"default;splitk.RB_MIN_K=1024,splitk.RB_MIN_CHUNK=512;splitk.RB_MIN_K=1024,splitk.RB_MIN_CHUNK=384"``).
The settings are read at lowering, so the persistent cache must be off.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from timing import overridden, setting_changes, torch_kernels  # noqa: E402  (bench/timing.py)

SHAPES = "16x384x384,16x1536x384,16x384x1536"  # M x K x N


def _torch_row(prods: list[tuple[str, list[Any]]], policy: Any) -> dict[str, Any]:
    """cuBLAS on the same products with the bias (``torch.addmm``, TF32 off): the kernels' own
    time by torch.profiler (CUPTI), mean of 20 calls, and CUDA events around a call (launch
    included) after it."""
    import torch

    from fusec import bench

    torch.backends.cuda.matmul.allow_tf32 = False
    row: dict[str, Any] = {"setting": "torch (cuBLAS addmm, fp32): kernel us, event us"}
    for label, args in prods:
        x, w, bias = (torch.from_numpy(np.asarray(v)).cuda() for v in args)
        call = lambda x=x, w=w, bias=bias: torch.addmm(bias, x, w)  # noqa: E731
        kernels = torch_kernels(torch, call, calls=20, warmup=5)
        row[label] = (round(sum(r["gpu_us"] for r in kernels), 1),
                      round(1e6 * bench.torch_cuda_time(call, policy)["time_s"], 1),
                      sorted({r["kernel"][:60] for r in kernels}))
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="1x16")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--settings", default="default;codegen.GEMV_MIN_KN=0")
    ap.add_argument("--no-encoder", action="store_true")
    ap.add_argument("--torch", action="store_true", help="also time the products with cuBLAS")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds of the settings")
    ap.add_argument("--plain", action="store_true", help="x @ w alone, no bias")
    ap.add_argument("--merged", action="store_true",
                    help="also three projections of x (M x K) to N columns each, which merge "
                         "into one product, read by one elementwise kernel (q * k + v)")
    a = ap.parse_args(argv)
    if a.torch:
        import torch  # noqa: F401  (before fusec: see the guide's note on torch and lavapipe)
    import bert_encoder as be
    import minilm_encoder as ex

    import fusec
    import fusec.numpy as fnp
    from fusec import bench, codegen, nn
    from fusec.kernels import attention
    from fusec.passes import merge, splitk

    modules = {"codegen": codegen, "splitk": splitk, "merge": merge, "attention": attention}
    policy = bench.Policy(warmup=3, min_reps=10, max_reps=30, budget_s=1.0, heat_s=0.2)
    rng = np.random.default_rng(0)
    wts = {k: fusec.device_put(v) for k, v in be.random_weights().items()}
    b, s = (int(v) for v in a.batch.split("x"))
    ids, mask = ex.make_batch(b, s, 30522)
    idd, md = fusec.device_put(ids), fusec.device_put(mask)
    prods = []
    for m, k, n in (tuple(int(v) for v in sh.split("x")) for sh in a.shapes.split(",")):
        args = [fusec.device_put(rng.standard_normal(sz).astype(np.float32))
                for sz in ((m, k), (k, n), (n,))]
        prods.append((f"{m}x{k}x{n}", args))
    merged = [(f"merged {lab}", [args[0]] + [fusec.device_put(
        rng.standard_normal(np.shape(v)).astype(np.float32)) for _ in range(3)
        for v in args[1:]]) for lab, args in prods] if a.merged else []

    def projections(x: Any, wq: Any, bq: Any, wk: Any, bk: Any, wv: Any, bv: Any) -> Any:
        return (x @ wq + bq) * (x @ wk + bk) + (x @ wv + bv)

    if a.torch:
        print(_torch_row(prods, policy), flush=True)
    for setting in [st for _ in range(a.rounds) for st in a.settings.split(";")]:
        with overridden(setting_changes(setting, modules)):
            row: dict[str, Any] = {"setting": setting}
            for label, args in prods:
                f = fusec.gpu_jit((lambda x, w, bias: x @ w) if a.plain
                                  else (lambda x, w, bias: x @ w + bias))
                kinds = [kk.kind for kk in f.lower(*args).kernels]
                row[label] = (round(1e6 * bench.fusec_time(f, args, policy)["time_s"], 1), kinds)
            for label, args in merged:
                f = fusec.gpu_jit(projections)
                kinds = [kk.kind for kk in f.lower(*args).kernels]
                row[label] = (round(1e6 * bench.fusec_time(f, args, policy)["time_s"], 1), kinds)
            if not a.no_encoder:
                enc = fusec.gpu_jit(lambda w, i, m: ex.encode(fnp, nn, w, i, m, 1e-12))
                row["encoder_kernels"] = len(enc.lower(wts, idd, md).kernels)
                row["encoder_gpu_us"] = round(1e6 * bench.fusec_time(
                    enc, [wts, idd, md], policy)["time_s"], 1)
                row["encoder_wall_us"] = round(1e6 * bench.wall_time(
                    lambda enc=enc: enc(wts, idd, md).block_until_ready(), policy)["time_s"], 1)
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
