"""Cost of matmul epilogues: fused (each way of storing the product), in a kernel of their own
(`separate`), and unfused, in GPU time.

    python bench/epilogue_probe.py [N]
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import fusec  # noqa: E402
from fusec import codegen, nn  # noqa: E402
from fusec.bench import gpu_time  # noqa: E402


def gpu(f, args):  # type: ignore[no-untyped-def]
    """Milliseconds: median of 11 timestamped calls after 0.3 s of back-to-back ones."""
    return gpu_time(f, args, repeats=11) * 1e3


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
        row = [f"unfused {gpu(fusec.gpu_jit(fn, fuse=False), (a, b, c)):.3f} ms"]
        for mode in ("direct", "staged", "separate"):
            codegen.MATMUL_EPILOGUE = mode  # new jitted functions generate code with it
            row.append(f"{mode} {gpu(fusec.gpu_jit(fn), (a, b, c)):.3f} ms")
        print(f"{n}^3 {name:10s} " + "  ".join(row))
    codegen.MATMUL_EPILOGUE = "auto"


if __name__ == "__main__":
    main()
