"""Cost of matmul epilogues: fused (each way of storing the product), in a kernel of their own
(`separate`), and unfused, in GPU time; with ``--parts``, what in GELU's epilogue costs the time
(each part of it alone after the bias, interleaved rounds; ``--modes auto,staged`` adds a few of
them under other FUSEC_MATMUL_EPILOGUE modes).

    python bench/epilogue_probe.py [N] [--parts] [--rounds R] [--modes auto,staged,separate]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import fusec  # noqa: E402
import fusec.numpy as fnp  # noqa: E402
from fusec import codegen, nn  # noqa: E402
from fusec.bench import gpu_time  # noqa: E402

_A = -2.0 * math.sqrt(2.0 / math.pi)

# each an epilogue after x @ y + z (v): the parts of nn.gelu's x / (1 + exp(x (a + b x^2)))
PARTS: dict[str, Callable[[Any], Any]] = {
    "bias": lambda v: v,
    "relu": nn.relu,
    "polynomial": lambda v: v * (_A + (_A * 0.044715) * (v * v)),
    "exp": lambda v: fnp.exp(v * (_A + (_A * 0.044715) * (v * v))),
    "divide": lambda v: v / (1.0 + v * v),
    "exp_times": lambda v: v * fnp.exp(fnp.minimum(v, 0.0)),
    "exp_plus": lambda v: v + fnp.exp(v * (_A + (_A * 0.044715) * (v * v))),
    "exp_times_sq": lambda v: v * fnp.exp(-(v * v)),
    "reciprocal": lambda v: fnp.reciprocal(1.0 + v * v),
    "gelu": nn.gelu,
    "gelu_recip": lambda v: v * fnp.reciprocal(1.0 + fnp.exp(v * (_A + (_A * 0.044715)
                                                                 * (v * v)))),
    # 1 / d as rsqrt(d * d) (d > 0): one special-function instruction in place of a division
    "gelu_rsqrt": lambda v: v * fnp.rsqrt(fnp.square(1.0 + fnp.exp(v * (_A + (_A * 0.044715)
                                                                      * (v * v))))),
    "gelu_tanh": lambda v: 0.5 * v * (1.0 + fnp.tanh(-0.5 * v * (_A + (_A * 0.044715)
                                                                * (v * v)))),
}


def gpu(f: Any, args: Any) -> float:
    """Milliseconds: median of 11 timestamped calls after 0.3 s of back-to-back ones."""
    return gpu_time(f, args, repeats=11) * 1e3


def modes(n: int) -> None:
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


COMPARED = ("bias", "divide", "exp_plus", "gelu")


def parts(n: int, rounds: int, epilogues: list[str]) -> None:
    rng = np.random.default_rng(0)
    a = fusec.device_put(rng.standard_normal((n, n)).astype(np.float32))
    b = fusec.device_put((rng.standard_normal((n, n)) / math.sqrt(n)).astype(np.float32))
    c = fusec.device_put(rng.standard_normal(n).astype(np.float32))
    fs = {"bare": fusec.gpu_jit(lambda x, y, z: x @ y)}
    for mode in epilogues:
        codegen.MATMUL_EPILOGUE = mode  # new jitted functions generate code with it
        for name, g in PARTS.items():
            if mode != "auto" and name not in COMPARED:
                continue
            f = fusec.gpu_jit(lambda x, y, z, g=g: g(x @ y + z))
            f(a, b, c).block_until_ready()  # (generated now, with this setting)
            fs[name + ("" if mode == "auto" else f" {mode}")] = f
    codegen.MATMUL_EPILOGUE = "auto"
    ref = np.asarray(fs["gelu"](a, b, c))
    for name in ("gelu_rsqrt", "gelu_tanh"):
        err = float(np.max(np.abs(np.asarray(fs[name](a, b, c)) - ref)))
        print(f"{name}: largest difference from gelu {err:.3g}")
    times: dict[str, list[float]] = {k: [] for k in fs}
    for _ in range(rounds):
        for name, f in fs.items():
            times[name].append(gpu(f, (a, b, c)))
    for name, ts in times.items():
        print(f"{n}^3 {name:20s} " + " ".join(f"{t:.3f}" for t in ts) + " ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, nargs="?", default=4096)
    ap.add_argument("--parts", action="store_true", help="time GELU's parts as epilogues")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--modes", default="auto",
                    help="codegen.MATMUL_EPILOGUE values to compare, e.g. auto,staged")
    args = ap.parse_args()
    print(fusec.hold_gpu_clocks())
    if args.parts:
        parts(args.n, args.rounds, args.modes.split(","))
    else:
        modes(args.n)


if __name__ == "__main__":
    main()
