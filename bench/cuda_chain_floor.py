"""CUDA's own floor for a chain of dependent kernels (issue 19's bound, for comparison with
``bench/grid_barrier_probe.py``'s WebGPU chain): L dependent phases run by torch, captured in one
CUDA graph (CUDA's cheapest way to launch a fixed sequence of kernels), GPU time by CUDA events
per replay, medians:

- ``tiny``: x = x * 0.5 + 1 on 576 floats, 2L kernels (the multiply and the add);
- ``matvec``: y = tanh(W_p y / 24) with W_p 576×576 float32, as the WebGPU probe's phases
  (3 kernels a phase: the product, the scale and the tanh).

    python bench/cuda_chain_floor.py [--phases 150] [--reps 50] [--out r.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import report  # noqa: E402  (bench/timing.py)


def graph_time(fn: Callable[[], None], reps: int) -> float:
    """Median µs per replay of ``fn`` captured in a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(1e3 * a.elapsed_time(b))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phases", type=int, default=150)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    n = a.phases
    x = torch.randn(576, device="cuda")
    ws = [torch.randn(576, 576, device="cuda") for _ in range(n)]
    y = torch.randn(576, device="cuda")

    def tiny() -> None:
        for _ in range(n):
            x.mul_(0.5).add_(1.0)  # two dependent kernels per loop turn

    def matvec() -> None:
        v = y
        for w in ws:
            v = torch.tanh(torch.mv(w, v) / 24.0)
        y.copy_(v)

    res = {"device": torch.cuda.get_device_name(), "phases": n,
           "tiny_us": graph_time(tiny, a.reps), "tiny_kernels": 2 * n,
           "matvec_us": graph_time(matvec, a.reps)}
    res["tiny_us_per_kernel"] = res["tiny_us"] / (2 * n)
    res["matvec_us_per_phase"] = res["matvec_us"] / n
    report(res, a.out)


if __name__ == "__main__":
    main()
