"""Each kernel's GPU time in `fusec bench` workloads (``fusec.profile``: every kernel run alone),
beside the call's GPU time in one pass (GPU clocks held: ``fusec.hold_gpu_clocks``).

    python bench/kernel_profile.py [--only transformer,sort] [--reps 3]
"""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="transformer,sort")
    ap.add_argument("--reps", type=int, default=3, help="profiled calls (the report is the last)")
    a = ap.parse_args(argv)

    import numpy as np

    import fusec
    from fusec import bench

    fusec.hold_gpu_clocks()
    ws = {w.name: w for w in bench.workloads(quick=False)}
    for name in a.only.split(","):
        w = ws[name]
        dev = [fusec.device_put(x) for x in w.make_inputs(np.random.default_rng(0))]
        f = fusec.gpu_jit(w.bind(bench.FusecOps))
        f(*dev).block_until_ready()
        t = bench.fusec_time(f, dev, bench.FULL_POLICY)
        print(f"== {name}: GPU time in one pass {1e6 * t['time_s']:.1f} us (median of "
              f"{t['reps']})", flush=True)
        for _ in range(a.reps - 1):
            with fusec.profile(print_report=False):
                f(*dev).block_until_ready()
        with fusec.profile():
            f(*dev).block_until_ready()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
