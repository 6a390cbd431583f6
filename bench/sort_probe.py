"""Sort of float32 rows on the device: each stage kernel's GPU time (``fusec.profile``), the
whole call's GPU time and wall clock, beside JAX's and torch's sort where installed.

    python bench/sort_probe.py [--n 16777216] [--rows 1] [--reps 20] [--configs 16:8192:1,16:8192:8]

``--configs`` (PER:BLOCK:UNROLL, ...) times the whole sort's GPU time with other radix shapes
(scatter elements per thread, elements per workgroup, keys a histogram thread loads at once)
first, side by side in this process.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--configs", default="")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        torch = None
    import fusec
    import fusec.numpy as fnp
    from fusec.runtime import get_runtime

    rng = np.random.default_rng(0)
    shape = (a.rows, a.n) if a.rows > 1 else (a.n,)
    x = rng.standard_normal(shape).astype(np.float32)
    xd = fusec.device_put(x)
    for cfg in filter(None, a.configs.split(",")):
        from fusec.kernels import sort as ksort
        per, block, unroll = (int(v) for v in cfg.split(":"))
        saved = ksort.RADIX_PER_THREAD, ksort.RADIX_BLOCKS, ksort.HIST_UNROLL
        ksort.RADIX_PER_THREAD, ksort.RADIX_BLOCKS, ksort.HIST_UNROLL = per, (block,), unroll
        g = fusec.gpu_jit(lambda v: fnp.sort(v))
        assert np.array_equal(np.asarray(g(xd)), np.sort(x, axis=-1))
        rt = get_runtime()
        assert rt is not None
        rt.profile = True
        ts = []
        for _ in range(a.reps):
            g(xd)
            ns = rt.last_gpu_ns()
            assert ns is not None
            ts.append(ns / 1e6)
        rt.profile = False
        ksort.RADIX_PER_THREAD, ksort.RADIX_BLOCKS, ksort.HIST_UNROLL = saved
        print(f"config {per} per thread, blocks of {block}, histogram unroll {unroll}: gpu "
              f"{statistics.median(ts):.3f} ms")
    f = fusec.gpu_jit(lambda v: fnp.sort(v))
    got = np.asarray(f(xd))
    assert np.array_equal(got, np.sort(x, axis=-1)), "fusec's sort differs from numpy's"
    print("kernels:", [k.name for k in f.lower(xd).kernels])
    with fusec.profile():
        f(xd).block_until_ready()
    rt = get_runtime()
    assert rt is not None
    rt.profile = True
    gpu = []
    for _ in range(a.reps):
        f(xd)
        ns = rt.last_gpu_ns()
        assert ns is not None
        gpu.append(ns / 1e6)
    rt.profile = False
    wall = []
    for _ in range(a.reps):
        t = time.perf_counter()
        f(xd).block_until_ready()
        wall.append((time.perf_counter() - t) * 1e3)
    print(f"fusec sort {shape}: gpu {statistics.median(gpu):.3f} ms, wall "
          f"{statistics.median(wall):.3f} ms (median of {a.reps})")
    try:
        import jax
        import jax.numpy as jnp
        xj = jax.device_put(x)
        g = jax.jit(jnp.sort)
        g(xj).block_until_ready()
        wall = []
        for _ in range(a.reps):
            t = time.perf_counter()
            g(xj).block_until_ready()
            wall.append((time.perf_counter() - t) * 1e3)
        print(f"jax sort: wall {statistics.median(wall):.3f} ms")
    except ImportError:
        pass
    if torch is not None and torch.cuda.is_available():
        xt = torch.from_numpy(x).cuda()
        torch.sort(xt)
        torch.cuda.synchronize()
        wall = []
        for _ in range(a.reps):
            t = time.perf_counter()
            torch.sort(xt)
            torch.cuda.synchronize()
            wall.append((time.perf_counter() - t) * 1e3)
        print(f"torch sort: wall {statistics.median(wall):.3f} ms")


if __name__ == "__main__":
    main()
