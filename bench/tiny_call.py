"""The tiny call of issue 18: three elementwise ops on 1024 floats already on the device. Wall
clock of one call and its wait (round trip), and per call of back-to-back calls (``--burst``
calls, then one wait), with fusec, JAX jit and torch eager side by side: interleaved in rounds,
medians.

    python bench/tiny_call.py [--reps 2000] [--burst 200] [--out r.json]
        [--settings "default;runtime.AHEAD_SMALL=0"]

``--settings``: fusec once per setting (``bench/timing.py``'s ``module.NAME=value`` overrides of
``runtime`` or ``config``, joined by commas; ``default`` for none), each measured in turn with
the others, reported as ``fusec`` (the first) and ``fusec[setting]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

try:  # torch first: its compiler stack must load before fusec opens a Vulkan adapter
    import torch
except Exception:  # noqa: BLE001 - optional
    torch = None

import fusec  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import ConfigSettings, overridden, report, setting_changes  # noqa: E402


def _round_trips(call: Callable[[], Any], wait: Callable[[Any], Any], n: int) -> list[float]:
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        wait(call())
        ts.append(time.perf_counter() - t)
    return ts


def _burst(call: Callable[[], Any], wait: Callable[[Any], Any], burst: int) -> float:
    wait(call())
    t = time.perf_counter()
    for _ in range(burst):
        r = call()
    wait(r)
    return (time.perf_counter() - t) / burst


Impl = tuple[Callable[[], Any], Callable[[Any], Any], list[tuple[Any, str, Any]]]


def _side_by_side(impls: dict[str, Impl], reps: int, burst: int, blocks: int = 10
                  ) -> dict[str, float]:
    """Round trips and bursts of every implementation (under its settings), interleaved in
    ``blocks`` rounds (the machine's state drifts: each gets its share of every phase); medians
    in microseconds."""
    trips: dict[str, list[float]] = {k: [] for k in impls}
    bursts: dict[str, list[float]] = {k: [] for k in impls}
    for call, wait, changes in impls.values():
        with overridden(changes):
            _round_trips(call, wait, 50)  # warm-up
    for _ in range(blocks):
        for k, (call, wait, changes) in impls.items():
            with overridden(changes):
                trips[k] += _round_trips(call, wait, max(1, reps // blocks))
                bursts[k] += [_burst(call, wait, burst) for _ in range(3)]
    res = {}
    for k in impls:
        res[f"{k}_round_trip_us"] = 1e6 * statistics.median(trips[k])
        res[f"{k}_burst_us_per_call"] = 1e6 * statistics.median(bursts[k])
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--burst", type=int, default=200)
    ap.add_argument("--settings", default="default")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    x = np.random.default_rng(0).standard_normal(1024).astype(np.float32)
    res: dict[str, Any] = {"device": str(fusec.default_device())}

    f = fusec.gpu_jit(lambda v: (v * 2.0 + 1.0) * v)
    xd = fusec.device_put(x)
    modules = {"runtime": fusec.runtime, "config": ConfigSettings()}
    impls: dict[str, Impl] = {}
    for i, setting in enumerate(a.settings.split(";")):
        impls["fusec" if i == 0 else f"fusec[{setting}]"] = (
            lambda: f(xd), lambda r: r.block_until_ready(), setting_changes(setting, modules))
    try:
        import jax

        jf = jax.jit(lambda v: (v * 2.0 + 1.0) * v)
        xj = jax.device_put(x)
        impls["jax"] = (lambda: jf(xj), jax.block_until_ready, [])
        res["jax_platform"] = xj.devices().pop().platform
    except Exception as exc:  # noqa: BLE001 - optional reference
        res["jax_error"] = repr(exc)
    if torch is not None and torch.cuda.is_available():
        xt = torch.from_numpy(x).cuda()
        impls["torch"] = (lambda: (xt * 2.0 + 1.0) * xt, lambda r: torch.cuda.synchronize(), [])
    res.update(_side_by_side(impls, a.reps, a.burst))
    report(res, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
