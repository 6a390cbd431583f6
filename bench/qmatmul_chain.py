"""What one quantized product costs inside a decode step's pass: a chain of ``--depth``
dependent q4_1 products x <- x @ W_i.T (one row of x, square weights; each product a
kernel of its own), GPU time of the call's one pass by timestamps, per product, beside a chain
of as many tiny dependent elementwise kernels (the dispatch's own cost) and the bytes' time at
the copy bandwidth. ``--teams`` times other team sizes (threads per weight row) side by side.

    python bench/qmatmul_chain.py [--k 576,1536] [--depth 40] [--teams 8,16,32,64]
        [--configs 128:6,256:2]
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

import fusec
from fusec import bench, quant
from fusec.kernels import quant as kquant
from fusec.tree_util import tree_map


def gpu_ms(f: Any, *args: Any, reps: int = 20) -> float:
    """Median GPU milliseconds of ``f(*args)`` by timestamps (fusec.bench's timing)."""
    policy = bench.Policy(min_reps=reps, max_reps=reps, budget_s=float("inf"))
    return 1e3 * float(bench.fusec_time(f, args, policy)["time_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", default="576,1536")
    ap.add_argument("--depth", type=int, default=40)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--teams", default="")
    ap.add_argument("--configs", default="",
                    help="WORKGROUP:UNROLL pairs to time as well, e.g. 128:6,256:2")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal(8).astype(np.float32)
    tiny = fusec.gpu_jit(lambda x: [x := x * 1.0001 + 0.5 for _ in range(a.depth)][-1],
                         fuse=False)
    t_tiny = gpu_ms(tiny, fusec.device_put(x0))
    print(f"{a.depth} dependent tiny elementwise kernels: {1e3 * t_tiny / a.depth:.2f} us each")
    default_team = kquant.team
    for k in (int(v) for v in a.k.split(",")):
        ws = [quant.quantize((rng.standard_normal((k, k)) * (1 / np.sqrt(k))).astype(np.float32),
                             "q4_1") for _ in range(a.depth)]
        wd = tree_map(fusec.device_put, ws)
        x = fusec.device_put(rng.standard_normal((a.rows, k)).astype(np.float32))
        nbytes = sum(np.asarray(w.data).nbytes for w in ws)
        for team in [0] + [int(t) for t in filter(None, a.teams.split(","))]:
            if team:
                kquant.team = lambda kk, target="gpu", t=team: t if target == "gpu" else 1
            f = fusec.gpu_jit(lambda x, ws: [x := quant.matmul(x, w) for w in ws][-1])
            t = gpu_ms(f, x, wd)
            kquant.team = default_team
            kinds = [kk.kind for kk in f.lower(x, wd).kernels]
            print(f"K = N = {k}, {a.rows} row(s), team {team or kquant.team(k)}: "
                  f"{1e3 * t / a.depth:.2f} us per product ({kinds.count('quant')} quant kernels "
                  f"of {len(kinds)}; weights {nbytes / a.depth / 1e6:.2f} MB each, "
                  f"{nbytes / a.depth / 3e12 * 1e6:.2f} us at 3 TB/s)")
        for cfg in filter(None, a.configs.split(",")):
            wgs, unr = (int(v) for v in cfg.split(":"))
            saved = kquant.WORKGROUP, kquant.UNROLL
            kquant.WORKGROUP, kquant.UNROLL = wgs, unr
            f = fusec.gpu_jit(lambda x, ws: [x := quant.matmul(x, w) for w in ws][-1])
            t = gpu_ms(f, x, wd)
            kquant.WORKGROUP, kquant.UNROLL = saved
            print(f"K = N = {k}, {a.rows} row(s), workgroup {wgs}, unroll {unr}: "
                  f"{1e3 * t / a.depth:.2f} us per product")


if __name__ == "__main__":
    main()
