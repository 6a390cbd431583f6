"""A call's wall clock three ways, for `fusec bench` workloads (full sizes), beside its GPU time
(timestamps), under settings of fusec.config, in interleaved rounds of one process (GPU clocks
held: ``fusec.hold_gpu_clocks``):

- **round trip**: call + ``block_until_ready``, one call after another (what `fusec bench`'s
  wall clock measures), median of 30;
- **back to back**: 30 calls, then one wait, per call;
- **after idle**: a round trip after the GPU idled for ``--idle-ms``, median of 20.

    FUSEC_CACHE_DIR=off python bench/round_trip_modes.py [--only matmul_square,mlp,transformer]
        [--settings "default;record_ahead=off;wait=poll;submit_first=0"] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np


def _set(setting: str, fusec: Any, on: bool) -> None:
    for kv in ([] if setting == "default" else setting.split(",")):
        key, value = kv.split("=")
        fusec.config.set(key, (int(value) if value.isdigit() else value) if on else None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="matmul_square,mlp,transformer,matmul_skinny_n")
    ap.add_argument("--settings", default="default;record_ahead=off;wait=poll;submit_first=0")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--idle-ms", type=float, default=2.0)
    a = ap.parse_args(argv)

    import fusec
    from fusec import bench

    fusec.hold_gpu_clocks()
    known = {w.name: w for w in bench.workloads(quick=False)}
    policy = bench.Policy(warmup=3, min_reps=10, max_reps=30, budget_s=1.0, heat_s=0.2)
    rng = np.random.default_rng(0)
    cases = {}
    for name in a.only.split(","):
        w = known[name]
        cases[name] = (fusec.gpu_jit(w.bind(bench.FusecOps)),
                       [fusec.device_put(x) for x in w.make_inputs(rng)])
    for rnd in range(a.rounds):
        for setting in a.settings.split(";"):
            _set(setting, fusec, True)
            for name, (f, dev) in cases.items():
                gpu = bench.fusec_time(f, dev, policy)["time_s"]
                for _ in range(20):
                    f(*dev).block_until_ready()
                trips = []
                for _ in range(30):
                    t = time.perf_counter()
                    f(*dev).block_until_ready()
                    trips.append(time.perf_counter() - t)
                t = time.perf_counter()
                outs = [f(*dev) for _ in range(30)]
                outs[-1].block_until_ready()
                b2b = (time.perf_counter() - t) / 30
                idle = []
                for _ in range(20):
                    time.sleep(a.idle_ms / 1e3)
                    t = time.perf_counter()
                    f(*dev).block_until_ready()
                    idle.append(time.perf_counter() - t)
                print(f"round {rnd} {setting:28s} {name:16s} GPU {1e6 * gpu:8.1f} us  round trip "
                      f"{1e6 * statistics.median(trips):8.1f}  back to back {1e6 * b2b:8.1f}  "
                      f"after idle {1e6 * statistics.median(idle):8.1f}", flush=True)
            _set(setting, fusec, False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
