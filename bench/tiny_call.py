"""The tiny call of issue 18: three elementwise ops on 1024 floats already on the device. Wall
clock of one call and its wait (round trip), and per call of back-to-back calls (``--burst``
calls, then one wait), with fusec, JAX jit and torch eager side by side.

    python bench/tiny_call.py [--reps 2000] [--burst 200] [--out r.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

try:  # torch first: its compiler stack must load before fusec opens a Vulkan adapter
    import torch
except Exception:  # noqa: BLE001 - optional
    torch = None

import fusec  # noqa: E402


def _round_trip(call: Callable[[], Any], wait: Callable[[Any], Any], reps: int) -> float:
    for _ in range(20):
        wait(call())
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        wait(call())
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def _burst(call: Callable[[], Any], wait: Callable[[Any], Any], burst: int, reps: int) -> float:
    wait(call())
    ts = []
    for _ in range(max(3, reps // burst)):
        t = time.perf_counter()
        for _ in range(burst):
            r = call()
        wait(r)
        ts.append((time.perf_counter() - t) / burst)
    return statistics.median(ts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--burst", type=int, default=200)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    x = np.random.default_rng(0).standard_normal(1024).astype(np.float32)
    res: dict[str, Any] = {"device": str(fusec.default_device())}

    f = fusec.gpu_jit(lambda v: (v * 2.0 + 1.0) * v)
    xd = fusec.device_put(x)
    wait_f = lambda r: r.block_until_ready()  # noqa: E731
    res["fusec_round_trip_us"] = 1e6 * _round_trip(lambda: f(xd), wait_f, a.reps)
    res["fusec_burst_us_per_call"] = 1e6 * _burst(lambda: f(xd), wait_f, a.burst, a.reps)
    try:
        import jax

        jf = jax.jit(lambda v: (v * 2.0 + 1.0) * v)
        xj = jax.device_put(x)
        res["jax_round_trip_us"] = 1e6 * _round_trip(lambda: jf(xj), jax.block_until_ready,
                                                     a.reps)
        res["jax_burst_us_per_call"] = 1e6 * _burst(lambda: jf(xj), jax.block_until_ready,
                                                    a.burst, a.reps)
    except Exception as exc:  # noqa: BLE001 - optional reference
        res["jax_error"] = repr(exc)
    if torch is not None and torch.cuda.is_available():
        xt = torch.from_numpy(x).cuda()
        sync = lambda r: torch.cuda.synchronize()  # noqa: E731
        res["torch_round_trip_us"] = 1e6 * _round_trip(lambda: (xt * 2.0 + 1.0) * xt, sync,
                                                       a.reps)
        res["torch_burst_us_per_call"] = 1e6 * _burst(lambda: (xt * 2.0 + 1.0) * xt, sync,
                                                      a.burst, a.reps)
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
