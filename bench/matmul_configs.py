"""Matmul float32 through fusec (register-blocked config from FUSEC_MATMUL_BLOCK) against cuBLAS:
GPU timestamps for fusec, CUDA events for torch (TF32 off), in one process.

    FUSEC_MATMUL_BLOCK=128,128,8,8,8 python bench/matmul_configs.py [M [N [K]]]
"""

from __future__ import annotations

import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import fusec  # noqa: E402
from fusec import codegen  # noqa: E402
from fusec.runtime import get_runtime  # noqa: E402


def main() -> None:
    m, n, k = (int(a) for a in (sys.argv[1:] + ["4096"] * 3)[:3])
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    ad, bd = fusec.device_put(a), fusec.device_put(b)
    f = fusec.gpu_jit(lambda x, y: x @ y)
    out = np.asarray(f(ad, bd))
    ref = a.astype(np.float64) @ b
    err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    rt = get_runtime()
    assert rt is not None
    rt.profile = True
    ts = []
    for _ in range(10):
        f(ad, bd)
        ns = rt.last_gpu_ns()
        assert ns is not None
        ts.append(ns / 1e9)
    rt.profile = False
    t = statistics.median(ts)
    block = codegen.MATMUL_BLOCK or (codegen.MATMUL_LARGE if min(m, n) >= 128 else
                                     codegen.MATMUL_SMALL)
    line = (f"block {block}: {m}x{n}x{k} {2 * m * n * k / t / 1e12:6.2f} TFLOP/s "
            f"({t * 1e3:.3f} ms, rel err {err:.1e})")
    try:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
        for _ in range(3):
            ta @ tb
        torch.cuda.synchronize()
        tt = []
        for _ in range(10):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            ta @ tb
            e1.record()
            torch.cuda.synchronize()
            tt.append(e0.elapsed_time(e1) / 1e3)
        tc = statistics.median(tt)
        line += (f"; cuBLAS fp32 {2 * m * n * k / tc / 1e12:6.2f} TFLOP/s: fusec at "
                 f"{tc / t * 100:.0f}% of cuBLAS")
    except Exception as exc:
        line += f"; no torch ({type(exc).__name__})"
    print(line)


if __name__ == "__main__":
    main()
