"""Does work of another framework in the same process slow fusec's next calls? (issue 18: in
``fusec bench``'s process, which times fusec's and JAX's wall clocks in alternating windows,
fusec's small calls measured 85-106 µs where a fusec-only process measured 60-70.)

    python bench/neighbour_probe.py [--only gather,matmul_skinny_m,argmax] [--rounds 5]
                                    [--reps 200] [--out r.json]

Per workload and round, fusec's round trip (call + ``block_until_ready``, median of ``--reps``)
in windows: ``alone`` (after a fusec window), ``after_jax`` (straight after a window of JAX's
calls of the same workload), ``after_jax_rest`` (the same, 0.3 s later), ``after_torch``
(straight after torch eager's), and JAX's and torch's own round trips. The GPU's clocks are held
(``fusec.hold_gpu_clocks``; JAX and torch hold them anyway).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np


def window(call: Callable[[], Any], reps: int) -> float:
    """Median µs of ``reps`` round trips of ``call`` (which waits for its result)."""
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        call()
        ts.append(time.perf_counter() - t)
    return 1e6 * statistics.median(ts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="gather,matmul_skinny_m,argmax")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    import jax
    import torch  # (before fusec: see the guide's note on torch and lavapipe)

    import fusec
    from fusec import bench

    print(fusec.hold_gpu_clocks(), jax.devices())
    torch.backends.cuda.matmul.allow_tf32 = False
    rng = np.random.default_rng(0)
    res: dict[str, Any] = {}
    for w in bench.select(bench.workloads(quick=False), a.only.split(",")):
        host = w.make_inputs(rng)
        f = fusec.gpu_jit(w.bind(bench.FusecOps))
        xs = [fusec.device_put(x) for x in host]
        with jax.default_matmul_precision("highest"):
            jf = jax.jit(w.bind(bench.JaxOps()))
            js = [jax.device_put(x) for x in host]
            jf(*js).block_until_ready()
        ts = [torch.from_numpy(x).cuda() for x in host]
        tf = w.bind(bench.TorchOps())

        def fusec_call() -> None:
            f(*xs).block_until_ready()

        def jax_call() -> None:
            jf(*js).block_until_ready()

        def torch_call() -> None:
            tf(*ts)
            torch.cuda.synchronize()

        fusec_call()
        torch_call()
        rows: dict[str, list[float]] = {k: [] for k in (
            "alone", "after_jax", "after_jax_rest", "after_torch", "jax", "torch")}
        with jax.default_matmul_precision("highest"):
            for _ in range(a.rounds):
                window(fusec_call, a.reps)
                rows["alone"].append(window(fusec_call, a.reps))
                rows["jax"].append(window(jax_call, a.reps))
                rows["after_jax"].append(window(fusec_call, a.reps))
                window(jax_call, a.reps)
                time.sleep(0.3)
                rows["after_jax_rest"].append(window(fusec_call, a.reps))
                rows["torch"].append(window(torch_call, a.reps))
                rows["after_torch"].append(window(fusec_call, a.reps))
        res[w.name] = rows
        print(w.name, json.dumps({k: [round(v, 1) for v in vs] for k, vs in rows.items()}),
              flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
