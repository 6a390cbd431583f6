"""Side-by-side GPU measurements in one run: copy bandwidth, fused vs unfused, matmul vs cuBLAS.

    python bench/gpu_report.py [--small] [--out results.json]

(The full suite and its Markdown report: ``fusec bench``; this script keeps a few extra figures:
the matmul's error, the host overhead of a cached call.)

fusec's figures are GPU times of each call's compute pass from timestamp queries (wall clock where
the adapter has none), medians of repeated calls after warm-up; torch's come from CUDA events. The
wall-clock column includes the host overhead of a call and its wait (``block_until_ready``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import fusec  # noqa: E402
import fusec.numpy as fnp  # noqa: E402
from fusec import nn  # noqa: E402
from fusec.bench import gpu_time, median_time, torch_time  # noqa: E402
from fusec.runtime import get_runtime  # noqa: E402


def chain(n: int) -> Callable[..., Any]:
    def f(x: Any, y: Any) -> Any:
        v = x
        for i in range(n):
            v = [lambda a: a * y, lambda a: a + 0.5, lambda a: fnp.maximum(a, -1.0),
                 lambda a: a - y, lambda a: fnp.tanh(a)][i % 5](v)
        return v

    return f


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    dev = fusec.default_device()
    print(f"device: {dev}")
    rows = {}

    n = 1 << (20 if args.small else 26)
    side = 1024 if args.small else 8192
    x1 = fusec.device_put(rng.standard_normal(n).astype(np.float32))
    y1 = fusec.device_put(rng.standard_normal(n).astype(np.float32))
    xr = fusec.device_put(rng.standard_normal((side, side)).astype(np.float32))
    g = fusec.device_put(rng.standard_normal(side).astype(np.float32))

    # copy bandwidth: torch's device-to-device copy, and fusec's one-read-one-write kernel
    try:
        import torch

        tx = torch.randn(n, device="cuda")
        ty = torch.empty_like(tx)
        t = torch_time(lambda: ty.copy_(tx))
        if t:
            rows["copy_torch"] = {"time_s": t, "GB/s": 2 * 4 * n / t / 1e9}
    except Exception as exc:  # no torch / no CUDA
        print(f"torch unavailable: {exc}")
    neg = fusec.gpu_jit(lambda x: fnp.negative(x))
    t = gpu_time(neg, (x1,))
    rows["copy_fusec_neg"] = {"gpu_s": t, "GB/s": 2 * 4 * n / t / 1e9}

    work = [
        ("chain10", chain(10), (x1, y1)),
        ("softmax", lambda x: nn.softmax(x, axis=-1), (xr,)),
        ("layer_norm", lambda x, g: nn.layer_norm(x, g, g), (xr, g)),
        ("rms_norm", lambda x, g: nn.rms_norm(x, g), (xr, g)),
    ]
    rt = get_runtime()
    for name, fn, a in work:
        res: dict[str, Any] = {}
        for fused in (True, False):
            f = fusec.gpu_jit(fn, fuse=fused)
            cost = f.lower(*a).cost_analysis()
            t = median_time(lambda f=f: f(*a).block_until_ready())
            gpu = gpu_time(f, a)
            res["fused" if fused else "unfused"] = {
                "wall_s": t, "gpu_s": gpu, "bytes": cost["bytes accessed"],
                "kernels": cost["kernels"], "GB/s (gpu time)": cost["bytes accessed"] / gpu / 1e9}
        res["speedup (gpu time)"] = res["unfused"]["gpu_s"] / res["fused"]["gpu_s"]
        res["speedup (wall)"] = res["unfused"]["wall_s"] / res["fused"]["wall_s"]
        res["bytes_ratio"] = res["unfused"]["bytes"] / res["fused"]["bytes"]
        rows[name] = res
    assert rt is not None

    m = 1024 if args.small else 4096
    a = rng.standard_normal((m, m)).astype(np.float32)
    b = rng.standard_normal((m, m)).astype(np.float32)
    mm = fusec.gpu_jit(lambda a, b: a @ b)
    ad, bd = fusec.device_put(a), fusec.device_put(b)
    out = np.asarray(mm(ad, bd))
    ref = a.astype(np.float64) @ b
    err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    t = gpu_time(mm, (ad, bd), repeats=5)
    rows["matmul_fusec"] = {"time_s": t, "TFLOP/s": 2 * m**3 / t / 1e12, "rel_err": err}
    try:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
        t = torch_time(lambda: ta @ tb)
        if t:
            rows["matmul_cublas_fp32"] = {"time_s": t, "TFLOP/s": 2 * m**3 / t / 1e12}
    except Exception as exc:
        print(f"torch matmul unavailable: {exc}")

    tiny = fusec.gpu_jit(lambda x, y: x * y + 1.0)
    s1, s2 = fusec.device_put(np.ones(16, np.float32)), fusec.device_put(np.ones(16, np.float32))
    tiny(s1, s2).block_until_ready()
    t = median_time(lambda: tiny(s1, s2), repeats=200, warmup=20)
    rows["host_overhead_cached_call_s"] = {"time_s": t}

    for k, v in rows.items():
        print(f"{k:28s} {json.dumps(v, default=float)}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"device": str(dev), "rows": rows}, fh, indent=2, default=float)


if __name__ == "__main__":
    main()
