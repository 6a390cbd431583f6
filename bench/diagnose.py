"""Where does a call's time go? GPU time (timestamp queries) against wall time, per workload."""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

from timing import median_wall  # noqa: E402  (bench/timing.py)

import fusec  # noqa: E402
import fusec.numpy as fnp  # noqa: E402
from fusec import nn  # noqa: E402
from fusec.runtime import get_runtime  # noqa: E402


def med(fn: Callable[[], Any], n: int = 10) -> float:
    return median_wall(fn, n, warmup=1)


def main() -> None:
    small = "--small" in sys.argv
    rt = get_runtime()
    assert rt is not None
    print(rt.info)
    rng = np.random.default_rng(0)
    n = 1 << (20 if small else 26)
    side = 1024 if small else 8192
    x = fusec.device_put(rng.standard_normal(n).astype(np.float32))
    y = fusec.device_put(rng.standard_normal(n).astype(np.float32))
    xr = fusec.device_put(rng.standard_normal((side, side)).astype(np.float32))
    s16 = fusec.device_put(np.ones(16, np.float32))
    tiny = fusec.gpu_jit(lambda a: a * 2.0)
    neg = fusec.gpu_jit(lambda a: -a)
    print(f"tiny call, no wait          {med(lambda: tiny(s16), 50) * 1e3:8.3f} ms")
    t = med(lambda: tiny(s16).block_until_ready(), 50)
    print(f"tiny call + wait            {t * 1e3:8.3f} ms")
    small_buf = rt.buffer(16)
    print(f"read 4 bytes (idle)         {med(lambda: rt.read(small_buf, 4), 50) * 1e3:8.3f} ms")
    print(f"create 256 MiB buffer       {med(lambda: rt.buffer(1 << 28), 10) * 1e3:8.3f} ms")
    print(f"neg 2^{n.bit_length() - 1} call + wait        "
          f"{med(lambda: neg(x).block_until_ready()) * 1e3:8.3f} ms")

    def ten() -> None:
        for _ in range(9):
            neg(x)
        neg(x).block_until_ready()

    t = med(ten, 5) / 10
    print(f"10 x neg 2^{n.bit_length() - 1}, one wait     {t * 1e3:8.3f} ms per call")
    work = [("neg", lambda a: -a, (x,)),
            ("chain10", lambda a, b: fnp.tanh(((a * b + 0.5) - b) * b + 0.5) * b - b, (x, y)),
            ("softmax", lambda a: nn.softmax(a), (xr,)),
            ("layer_norm", lambda a: nn.layer_norm(a), (xr,))]
    for name, fn, args in work:
        for fused in (True, False):
            f = fusec.gpu_jit(fn, fuse=fused)
            cost = f.lower(*args).cost_analysis()
            f(*args).block_until_ready()
            rt.profile = True
            gpu = []
            for _ in range(5):
                f(*args)
                gpu.append(rt.last_gpu_ns())
            rt.profile = False
            wall = med(lambda f=f: f(*args).block_until_ready(), 5)
            g = statistics.median(gpu) / 1e9
            print(f"{name:10s} fused={fused!s:5s} kernels={int(cost['kernels']):2d} "
                  f"GPU {g * 1e3:8.3f} ms ({cost['bytes accessed'] / g / 1e9:7.1f} GB/s)  "
                  f"wall {wall * 1e3:8.3f} ms")


if __name__ == "__main__":
    main()
