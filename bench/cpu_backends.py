"""Which backend on a machine without a GPU (issue 18, item 5): wall clock per call (call and
wait, inputs already on the device) of ``fusec bench --quick`` workloads and of the tiny call, on
the software adapter (``FUSEC_BACKEND=gpu``: lavapipe on CI) and on fusec's numpy interpreter
(``FUSEC_BACKEND=cpu``), each backend in a subprocess of its own, with plain numpy on the same
workloads (``fusec.bench.NumpyOps``) for scale.

    python bench/cpu_backends.py [--only chain8,softmax,...] [--reps 5] [--out r.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import median_wall  # noqa: E402  (bench/timing.py)

DEFAULT = ("chain8,softmax,layer_norm,matmul_square,matmul_square_bias_gelu,mlp,transformer,"
           "gather,cumsum,argmax,sort")


def measure(only: list[str], reps: int) -> dict[str, Any]:
    """This process's backend: seconds per call of each workload, the tiny call's round trip."""
    import fusec
    from fusec.bench import FusecOps, NumpyOps, select, workloads

    out: dict[str, Any] = {"device": str(fusec.default_device()), "workloads": {}}
    numpy_too = os.environ.get("FUSEC_BACKEND") == "cpu"
    for w in select(workloads(quick=True), only):
        host = w.make_inputs(np.random.default_rng(0))
        dev = [fusec.device_put(a) for a in host]
        f = fusec.gpu_jit(w.bind(FusecOps))
        t0 = time.perf_counter()
        f(*dev).block_until_ready()
        rec = {"first_call_s": time.perf_counter() - t0,
               "s": median_wall(lambda: f(*dev).block_until_ready(), reps, warmup=1)}
        if numpy_too:
            fn = w.bind(NumpyOps)
            rec["numpy_s"] = median_wall(lambda: fn(*host), reps, warmup=1)
        out["workloads"][w.name] = rec
    x = fusec.device_put(np.random.default_rng(0).standard_normal(1024).astype(np.float32))
    tiny = fusec.gpu_jit(lambda v: (v * 2.0 + 1.0) * v)
    out["tiny_call_us"] = 1e6 * median_wall(lambda: tiny(x).block_until_ready(), 20 * reps,
                                            warmup=1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=DEFAULT)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    only = [n for n in a.only.split(",") if n]
    if a.child:
        print(json.dumps(measure(only, a.reps)))
        return 0
    res: dict[str, Any] = {"cpus": os.cpu_count()}
    for backend in ("gpu", "cpu"):
        env = {**os.environ, "FUSEC_BACKEND": backend, "FUSEC_CACHE_DIR": "off"}
        env.setdefault("XDG_RUNTIME_DIR", "/tmp")
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(__file__).resolve().parent.parent)] + ([env["PYTHONPATH"]]
                                                             if env.get("PYTHONPATH") else []))
        p = subprocess.run([sys.executable, __file__, "--child", "--only", a.only,
                            "--reps", str(a.reps)], env=env, capture_output=True, text=True,
                           check=True)
        res[backend] = json.loads(p.stdout.strip().splitlines()[-1])
    gpu, cpu = res["gpu"], res["cpu"]
    print(f"software adapter: {gpu['device']}; interpreter: {cpu['device']}")
    print(f"{'workload':<26}{'adapter ms':>12}{'interp ms':>12}{'numpy ms':>10}"
          f"{'adapter/interp':>16}")
    for name, g in gpu["workloads"].items():
        c = cpu["workloads"][name]
        print(f"{name:<26}{1e3 * g['s']:>12.2f}{1e3 * c['s']:>12.2f}"
              f"{1e3 * c['numpy_s']:>10.2f}{g['s'] / c['s']:>16.1f}")
    print(f"{'tiny call (us)':<26}{gpu['tiny_call_us']:>12.1f}{cpu['tiny_call_us']:>12.1f}"
          f"{'':>10}{gpu['tiny_call_us'] / cpu['tiny_call_us']:>16.1f}")
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
