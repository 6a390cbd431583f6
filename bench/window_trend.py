"""Do fusec's and JAX's wall clocks drift across the bench's interleaved windows? (issue 18:
in `fusec bench`, fusec's round trips of one workload went 149, 129, 118, 86, 84 µs over its five
windows while JAX's went 115, 102, 116, 129, 132.)

    python bench/window_trend.py [--only matmul_skinny_m,sort] [--windows 10] [--passes 2]

Runs the bench's own `run_workload` (torch eager, then JAX's windows in turn with fusec's) for
each workload ``--passes`` times in one process, with ``--windows`` windows each, and prints
every window's median round trip, fusec's and JAX's, in µs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="matmul_skinny_m,sort")
    ap.add_argument("--windows", type=int, default=10)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)

    import torch  # before fusec opens a device (see the developers' guide's known trap)

    import fusec
    from fusec import bench

    torch.backends.cuda.matmul.allow_tf32 = False
    fusec.hold_gpu_clocks()
    platform_, _ = bench.jax_status()
    opts = bench.Options(torch_compile=False)
    policy = dataclasses.replace(bench.FULL_POLICY, wall_rounds=a.windows)
    ws = {w.name: w for w in bench.workloads(quick=False)}
    roofs = {"copy_reference": {"GB/s": 4000.0}}  # only for the record's rates
    rows = []
    for p in range(a.passes):
        for name in a.only.split(","):
            rec = bench.run_workload(ws[name], opts, policy, not a.no_torch, roofs, platform_)
            res = rec["results"]
            fused = [round(1e6 * t, 1) for t in res["fused"].get("wall_rounds_s", [])]
            jax = [round(1e6 * t, 1) for t in res["jax"].get("wall_rounds_s", [])]
            row = {"pass": p, "workload": name, "fused_gpu_us": round(
                1e6 * res["fused"]["time_s"], 1), "fused_windows_us": fused,
                "jax_windows_us": jax}
            print(json.dumps(row), flush=True)
            rows.append(row)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
