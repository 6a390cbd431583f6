"""Does a CUDA context in the same process (JAX's, torch's) change fusec's wall clock per call?
A small `fusec bench` workload (``--workload``, matmul_skinny_m by default) timed round trip
(call + wait, inputs on the device), medians of ``--reps``, in phases: fusec alone, after JAX
has run the same workload on its GPU, after torch has made a CUDA context too; JAX's own round
trip; fusec once more.

    python bench/coresident.py [--reps 2000] [--workload matmul_skinny_m]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import fusec
from fusec import bench

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import median_wall  # noqa: E402  (bench/timing.py)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--workload", default="matmul_skinny_m")
    a = ap.parse_args(argv)
    w = next(x for x in bench.workloads(False) if x.name == a.workload)
    rng = np.random.default_rng(0)
    host = w.make_inputs(rng)
    args = [fusec.device_put(x) for x in host]
    f = fusec.gpu_jit(w.bind(bench.FusecOps()))

    def trip() -> None:
        f(*args).block_until_ready()

    res: dict[str, float] = {}
    res["fusec_alone_us"] = 1e6 * median_wall(trip, a.reps, warmup=100)
    import jax

    jargs = [jax.device_put(x) for x in host]
    jf = jax.jit(w.bind(bench.JaxOps()))
    with jax.default_matmul_precision("highest"):
        jf(*jargs).block_until_ready()
        res["fusec_with_jax_us"] = 1e6 * median_wall(trip, a.reps, warmup=100)
        import torch

        torch.ones(1, device="cuda").sum().item()
        res["fusec_with_jax_and_torch_us"] = 1e6 * median_wall(trip, a.reps, warmup=100)
        res["jax_us"] = 1e6 * median_wall(lambda: jf(*jargs).block_until_ready(), a.reps,
                                           warmup=100)
        res["fusec_again_us"] = 1e6 * median_wall(trip, a.reps, warmup=100)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
