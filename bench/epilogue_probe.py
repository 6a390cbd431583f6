"""Cost of fused matmul epilogues: fused vs unfused GPU time for epilogues of growing weight."""

from __future__ import annotations

import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import fusec  # noqa: E402
from fusec import codegen, nn  # noqa: E402
from fusec.runtime import get_runtime  # noqa: E402


def gpu(f, args):  # type: ignore[no-untyped-def]
    rt = get_runtime()
    f(*args).block_until_ready()
    rt.profile = True
    ts = []
    for _ in range(7):
        f(*args)
        ts.append(rt.last_gpu_ns() / 1e6)
    rt.profile = False
    return statistics.median(ts)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    rng = np.random.default_rng(0)
    a = fusec.device_put(rng.standard_normal((n, n)).astype(np.float32))
    b = fusec.device_put(rng.standard_normal((n, n)).astype(np.float32))
    c = fusec.device_put(rng.standard_normal(n).astype(np.float32))
    cases = {"none": lambda x, y, z: x @ y, "bias": lambda x, y, z: x @ y + z,
             "bias_relu": lambda x, y, z: nn.relu(x @ y + z),
             "bias_gelu": lambda x, y, z: nn.gelu(x @ y + z)}
    for name, fn in cases.items():
        fused = gpu(fusec.gpu_jit(fn), (a, b, c))
        unfused = gpu(fusec.gpu_jit(fn, fuse=False), (a, b, c))
        print(f"block {codegen.MATMUL_BLOCK}: {name:10s} fused {fused:.3f} ms  unfused "
              f"{unfused:.3f} ms")


if __name__ == "__main__":
    main()
