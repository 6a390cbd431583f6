"""Where the wall-clock time of a call goes beyond its GPU time, for some `fusec bench`
workloads (issue 18): wall clock per call (call + wait, inputs on the device, median) under
variants of the runtime, interleaved in rounds, beside GPU time by timestamps; and the GPU's cost
per dispatch inside one pass (a chain of tiny dependent kernels, and of independent ones),
against the sum of the same kernels timed one by one (fusec.profile).

    python bench/overhead_probe.py [--only gather,matmul_skinny_m] [--out r.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import fusec
import fusec.numpy as fnp
from fusec import bench, runtime

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import report  # noqa: E402  (bench/timing.py)

NAMES = ["gather", "matmul_skinny_m", "matmul_skinny_n", "matmul_square", "chain8", "softmax"]
# variant: (batch calls, spin microseconds)
VARIANTS = {"default": (runtime.BATCH_CALLS, 2000), "no_batch": (0, 2000),
            "spin_50ms": (runtime.BATCH_CALLS, 50000), "block": (runtime.BATCH_CALLS, 0)}


def _walls(f: Any, args: list[Any], n: int) -> list[float]:
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f(*args).block_until_ready()
        ts.append(time.perf_counter() - t)
    return ts


def workloads(only: list[str]) -> list[dict[str, Any]]:
    out = []
    for w in bench.select(bench.workloads(quick=False), only):
        rng = np.random.default_rng(0)
        dev = [fusec.device_put(a) for a in w.make_inputs(rng)]
        fs = {}
        for name, (batch, _) in VARIANTS.items():
            runtime.BATCH_CALLS = batch
            fs[name] = fusec.gpu_jit(w.bind(bench.FusecOps))
            fs[name](*dev).block_until_ready()
        runtime.BATCH_CALLS = VARIANTS["default"][0]
        gpu = bench.fusec_time(fs["default"], dev, bench.Policy(3, 10, 30, 1.0, 0.2))
        walls: dict[str, list[float]] = {k: [] for k in fs}
        for _ in range(8):
            for name, f in fs.items():
                fusec.config.set("spin_us", VARIANTS[name][1])
                fusec.config.set("wait", "poll" if VARIANTS[name][1] == 0 else "spin")
                walls[name] += _walls(f, dev, 10)
        fusec.config.set("spin_us", None)
        fusec.config.set("wait", None)
        kernels = fs["default"].lower(*dev).kernels
        rec = {"name": w.name, "gpu_us": 1e6 * gpu["time_s"], "kernels": len(kernels),
               "batchable": bool(getattr(_executable(fs["default"], dev), "batchable", None)),
               "wall_us": {k: 1e6 * statistics.median(v) for k, v in walls.items()}}
        print(json.dumps(rec))
        out.append(rec)
    return out


def _executable(f: Any, dev: list[Any]) -> Any:
    hit = next(iter(f._fast.values()), None) if getattr(f, "_fast", None) else None
    return getattr(hit, "executable", hit)


def dispatch_gaps() -> list[dict[str, Any]]:
    """GPU time per dispatch of n tiny kernels in one pass: dependent (each reads the one
    before: wgpu puts a barrier between them) and independent (each reads the input)."""
    x = fusec.device_put(np.random.default_rng(1).standard_normal(4096).astype(np.float32))

    def dependent(v: Any) -> Any:
        for i in range(64):
            v = fnp.tanh(v) + float(i)
        return v

    def independent(v: Any) -> Any:
        t = fnp.tanh(v)
        return [t * float(i + 2) for i in range(64)]

    rows = []
    for label, fn in (("dependent", dependent), ("independent", independent)):
        f = fusec.gpu_jit(fn, fuse=False)
        n = len(f.lower(x).kernels)
        gpu = bench.fusec_time(f, [x], bench.Policy(3, 10, 30, 1.0, 0.2))["time_s"]
        with fusec.profile(print_report=False) as p:
            for _ in range(5):
                f(x)
        per_kernel_sum = sum(r[2] for r in p.rows) / 5
        rec = {"chain": label, "kernels": n, "gpu_us_one_pass": 1e6 * gpu,
               "sum_of_kernels_alone_us": per_kernel_sum,
               "gap_per_dispatch_us": (1e6 * gpu - per_kernel_sum) / n}
        print(json.dumps(rec))
        rows.append(rec)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(NAMES))
    ap.add_argument("--out", default="")
    ap.add_argument("--with", dest="with_", default="",
                    help="jax and/or torch (comma-separated): load and run them first, as "
                         "fusec bench does in its process")
    a = ap.parse_args(argv)
    if "jax" in a.with_:
        import jax

        jax.jit(lambda v: v * 2.0)(np.ones(1024, np.float32)).block_until_ready()
    if "torch" in a.with_:
        import torch

        (torch.ones(1024, device="cuda") * 2.0).sum().item()
    res = {"device": str(fusec.default_device()), "with": a.with_,
           "gaps": dispatch_gaps() if not a.with_ else [],
           "workloads": workloads(a.only.split(","))}
    if a.out:
        report(res, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
