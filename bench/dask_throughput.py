"""Throughput of a jitted reduction over a Dask array on one worker per GPU (fusec.dask), against
a single worker: blocks/s, GB/s and the ratio. Prints one JSON object.

    python bench/dask_throughput.py [--adapters 0,1] [--block-mb 64] [--blocks 64]
                                    [--op matmul|exp] [--repeats 5] [--out r.json]

A LocalCluster of worker processes (one thread each) pinned to the adapters by
fusec.dask.FusecPlugin (worker i on adapter i) computes ``fusec.dask.reduction(f, x)`` over a
``--blocks``-block float32 array of ``--block-mb`` MiB blocks:

- ``matmul`` (default): ``f(b) = sum(b @ b)`` on square n x n blocks (2 n^3 flops a block: 64 MiB
  is n = 4096, 137 GFLOP: tens of milliseconds on an H200);
- ``exp``: ``f(b) = sum(exp(b) * b)`` on (rows, 1024) blocks (bound by the host-to-device copy).

First with one worker (the first adapter), then with one worker per adapter (N); ``speedup`` is
N workers' blocks/s over one's. The data is generated on the workers before timing (block i from
the seed and i, on worker i mod N, which keeps it), so the timed runs copy each block to its
worker's GPU, reduce it there and combine the small results, but move no block between processes.
Each configuration runs once untimed (which compiles the function on every worker), then
``--repeats`` times.
``--adapters`` defaults to every hardware adapter of the best backend (every adapter where there
is none: then ``--backend gpu`` lets fusec use software adapters, as on CI's lavapipe).
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
from dask import delayed
from distributed import Client, LocalCluster, wait

import fusec
import fusec.dask
import fusec.numpy as fnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import report  # noqa: E402  (bench/timing.py)

_BACKEND_RANK = {"Vulkan": 0, "Metal": 0, "D3D12": 1, "OpenGL": 2}


def matmul_sum(b: Any) -> Any:
    return fnp.sum(b @ b)


def exp_sum(b: Any) -> Any:
    return fnp.sum(fnp.exp(b) * b)


def make_block(seed: int, i: int, shape: tuple[int, int]) -> np.ndarray:
    """Block ``i`` of the data, made on the worker that keeps it."""
    return np.random.default_rng([seed, i]).random(shape, dtype=np.float32)


def default_adapters() -> list[int]:
    """One adapter per GPU: the hardware adapters of the best backend (wgpu lists each GPU once
    per backend); every adapter where there is no hardware one."""
    devs = fusec.devices()
    hw = [d for d in devs if d.adapter_type != "CPU"]
    if not hw:
        return [d.index for d in devs]
    best = min(_BACKEND_RANK.get(d.backend, 3) for d in hw)
    return [d.index for d in hw if _BACKEND_RANK.get(d.backend, 3) == best]


def block_shape(op: str, block_mb: float) -> tuple[int, int]:
    elems = max(1, int(block_mb * (1 << 20)) // 4)
    if op == "matmul":
        n = max(16, int(math.isqrt(elems)) // 16 * 16)  # whole 16 x 16 tiles
        return n, n
    cols = min(1024, elems)
    return max(1, elems // cols), cols


def run_config(adapters: list[int], a: argparse.Namespace, shape: tuple[int, int]
               ) -> dict[str, Any]:
    """One LocalCluster with a worker per adapter: the timed reductions and what ran where."""
    fn = matmul_sum if a.op == "matmul" else exp_sum
    cluster = LocalCluster(n_workers=len(adapters), threads_per_worker=1, processes=True,
                           dashboard_address=None, silence_logs=logging.ERROR)
    client = Client(cluster)
    try:
        t0 = time.perf_counter()
        pinned = fusec.dask.setup(client, adapters=adapters, backend=a.backend or None)
        # block i generated on (and kept by) worker i mod N: each worker holds its share
        workers = sorted(pinned, key=lambda w: (pinned[w], w))
        futures = [client.submit(make_block, a.seed, i, shape, workers=[workers[i % len(workers)]],
                                 allow_other_workers=False, pure=False) for i in range(a.blocks)]
        wait(futures)
        x = da.concatenate([da.from_delayed(delayed(f), shape, np.float32) for f in futures])
        setup_s = time.perf_counter() - t0
        red = fusec.dask.reduction(fn, x)
        t0 = time.perf_counter()
        first = float(red.compute())  # compiles on every worker holding blocks
        first_s = time.perf_counter() - t0
        times, values = [], []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            values.append(float(red.compute()))
            times.append(time.perf_counter() - t0)
        infos = client.run(fusec.dask.worker_info)
        held: dict[str, int] = {w: 0 for w in infos}
        for where in client.who_has(futures).values():
            for w in where:
                held[w] = held.get(w, 0) + 1
    finally:
        client.close()
        cluster.close()
    best, med = min(times), statistics.median(times)
    nbytes = a.blocks * shape[0] * shape[1] * 4
    out: dict[str, Any] = {
        "workers": len(adapters), "adapters": adapters,
        # first_run: the untimed run that compiles; setup: the plugin and the data generated
        "seconds": {"best": best, "median": med, "all": times, "first_run": first_s,
                    "setup": setup_s},
        "blocks_per_s": a.blocks / med, "gb_per_s": nbytes / med / 1e9,
        "result": values[-1], "results_agree": all(v == first for v in values),
        "per_worker": [{"adapter": i["index"], "pinned": i["pinned"],
                        "device": f"{i['adapter']} ({i['backend']})", "blocks_held": held[w],
                        "compiles": i["cache"]["pipelines_compiled"],
                        "calls": i["cache"]["hits"] + i["cache"]["misses"]}
                       for w, i in sorted(infos.items(), key=lambda kv: pinned.get(kv[0], -1))],
    }
    if a.op == "matmul":
        out["tflop_per_s"] = a.blocks * 2 * shape[0] ** 3 / med / 1e12
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--adapters", default="",
                    help="comma-separated fusec.devices() indices, one worker each (default: "
                         "one per GPU)")
    ap.add_argument("--block-mb", type=float, default=64.0, help="MiB per block (float32)")
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--op", choices=("matmul", "exp"), default="matmul")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="",
                    help="FUSEC_BACKEND on the workers (gpu: software adapters too)")
    ap.add_argument("--out", default="", help="also write the JSON here")
    a = ap.parse_args(argv)
    adapters = [int(s) for s in a.adapters.split(",") if s.strip()] or default_adapters()
    if not adapters:
        ap.error("no adapter found (fusec.devices() is empty)")
    shape = block_shape(a.op, a.block_mb)
    devs = {d.index: d for d in fusec.devices()}
    res: dict[str, Any] = {
        "op": a.op, "blocks": a.blocks, "block_shape": list(shape),
        "block_mb": shape[0] * shape[1] * 4 / (1 << 20), "repeats": a.repeats,
        "adapters": [{"index": i, "device": f"{devs[i].adapter} ({devs[i].backend}, "
                      f"{devs[i].adapter_type})" if i in devs else "?"} for i in adapters],
        "runs": [run_config(adapters[:1], a, shape)],
    }
    if len(adapters) > 1:
        res["runs"].append(run_config(adapters, a, shape))
    one, many = res["runs"][0], res["runs"][-1]
    res["speedup"] = many["blocks_per_s"] / one["blocks_per_s"]  # from the medians
    res["results_equal"] = len({r["result"] for r in res["runs"]}) == 1
    res["n_workers"] = many["workers"]
    report(res, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
