"""GPU time and wall clock of `fusec bench` workloads (full sizes) and of a few probe functions,
under settings of the planner's constants, side by side in interleaved rounds of one process;
JAX's wall clock beside them with ``--jax``.

    FUSEC_CACHE_DIR=off python bench/workload_probe.py --only argmax,row_max,row_sum
        [--settings "default;codegen.NAME=value"] [--rounds 3] [--jax]

Names: any `fusec bench` workload, or one of PROBES (the argmax workload's input reduced other
ways, to tell its arithmetic from its memory traffic; products whose B is read along K, as the
transformer block's ``q @ kᵀ`` and a ``x @ w.T``). Settings are ``module.NAME=value``
overrides (``codegen``, ``splitk``, ``fuse``, ``merge``, ``attention``, ``ksort``, ``kquant``
(fusec.kernels.sort and .quant), or ``config`` for
fusec.config's settings: ``config.record_ahead=off``) joined by commas, ``default`` for none;
the constants are read at lowering, so the persistent cache must be off.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import ConfigSettings, overridden, setting_changes  # noqa: E402  (bench/timing.py)

# name: (function of the ops namespace and the arrays, input shapes)
PROBES: dict[str, tuple[Callable[..., Any], tuple[tuple[int, ...], ...]]] = {
    "row_max": (lambda B, x: x.max(axis=-1), ((8192, 8192),)),
    "row_sum": (lambda B, x: x.sum(axis=-1), ((8192, 8192),)),
    # products whose B is read along K (a B tile stored k-major from columns of K)
    "q_kt": (lambda B, q, k: q @ k.swapaxes(-1, -2), ((8, 2048, 128), (8, 2048, 128))),
    "x_wt": (lambda B, x, w: x @ w.T, ((2048, 1024), (2816, 1024))),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", required=True, help="workload or probe names, comma-separated")
    ap.add_argument("--settings", default="default")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds of the settings")
    ap.add_argument("--jax", action="store_true", help="JAX jit's wall clock once per round")
    ap.add_argument("--quick", action="store_true", help="the quick sizes (a check on lavapipe)")
    a = ap.parse_args(argv)

    import fusec
    from fusec import bench, codegen
    from fusec.kernels import quant as kquant
    from fusec.kernels import sort as ksort
    from fusec.passes import splitk

    fusec.hold_gpu_clocks()  # (a process without a CUDA context runs the GPU at idle clocks)

    # (fusec.passes exports the pass functions fuse and merge under their modules' names)
    modules = {"codegen": codegen, "splitk": splitk, "fuse": sys.modules["fusec.passes.fuse"],
               "merge": sys.modules["fusec.passes.merge"],
               "attention": sys.modules["fusec.passes.attention"], "config": ConfigSettings(),
               "ksort": ksort, "kquant": kquant}
    policy = bench.Policy(warmup=3, min_reps=10, max_reps=30, budget_s=1.0, heat_s=0.2)
    rng = np.random.default_rng(0)
    known = {w.name: w for w in bench.workloads(quick=a.quick)}
    cases: list[tuple[str, Callable[..., Any], list[np.ndarray]]] = []
    for name in a.only.split(","):
        if name in PROBES:
            fn, shapes = PROBES[name]
            host = [rng.standard_normal(tuple(d // 8 if a.quick else d for d in s),
                                        dtype=np.float32) for s in shapes]
            cases.append((name, fn, host))
        else:
            w = known[name]
            cases.append((name, w.fn, w.make_inputs(rng)))
    dev = {name: [fusec.device_put(x) for x in host] for name, _, host in cases}
    jax = bench._jax() if a.jax else None
    for rnd in range(a.rounds):
        for setting in a.settings.split(";"):
            with overridden(setting_changes(setting, modules)):
                row: dict[str, Any] = {"round": rnd, "setting": setting}
                for name, fn, host in cases:
                    f = fusec.gpu_jit(lambda *xs, fn=fn: fn(bench.FusecOps, *xs))
                    args = dev[name]
                    kinds = [k.kind for k in f.lower(*args).kernels]
                    gpu = bench.fusec_time(f, args, policy)["time_s"]
                    wall = bench.wall_clock(lambda f=f, args=args: f(*args), bench._ready,
                                            policy)["time_s"]
                    row[name] = {"gpu_us": round(1e6 * gpu, 1), "wall_us": round(1e6 * wall, 1),
                                 "kernels": kinds}
                print(row, flush=True)
        if jax is not None:
            jrow: dict[str, Any] = {"round": rnd, "setting": "jax wall"}
            with jax.default_matmul_precision("highest"):
                for name, fn, host in cases:
                    jf = jax.jit(lambda *xs, fn=fn: fn(bench.JaxOps(), *xs))
                    jargs = [jax.device_put(x) for x in host]
                    jrow[name] = round(1e6 * bench.wall_clock(lambda jf=jf, jargs=jargs: jf(*jargs),
                                                              bench._ready, policy)["time_s"], 1)
            print(jrow, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
