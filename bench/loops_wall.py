"""Compiled loops: wall clock per call (call + wait, inputs on the device) of fori_loop,
while_loop and scan with fusec and JAX side by side, for several trip counts.

    python bench/loops_wall.py [--n 1024] [--reps 20] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from timing import median_wall, write_json  # (bench/timing.py)

import fusec
import fusec.numpy as fnp


def programs(np_: Any, lax: Any, trips: int) -> dict[str, Callable[..., Any]]:
    def fori(x: Any) -> Any:
        return lax.fori_loop(0, trips, lambda i, c: np_.tanh(c * 1.01 + 0.1), x)

    def fori_i(x: Any) -> Any:
        return lax.fori_loop(0, trips, lambda i, c: c * 0.99 + i.astype(np.float32), x)

    def while_(x: Any) -> Any:
        def body(c: Any) -> Any:
            k, v = c
            return k + 1, np_.tanh(v * 1.01 + 0.1)

        return lax.while_loop(lambda c: c[0] < trips, body, (np.int32(0), x))[1]

    def scan(x: Any) -> Any:
        def step(c: Any, _: Any) -> Any:
            c = np_.tanh(c * 1.01 + 0.1)
            return c, np_.sum(c)

        return lax.scan(step, x, None, length=trips)

    return {"fori_loop": fori, "fori_loop_reads_i": fori_i, "while_loop": while_, "scan": scan}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--trips", default="10,100,1000")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    x = np.random.default_rng(0).standard_normal(a.n).astype(np.float32)
    res: dict[str, Any] = {"device": str(fusec.default_device()), "n": a.n, "rows": []}
    try:
        import jax
        import jax.numpy as jnp

        xj = jax.device_put(x)
    except Exception:  # noqa: BLE001 - optional reference
        jax = None
    xd = fusec.device_put(x)
    for trips in (int(t) for t in a.trips.split(",")):
        fp = programs(fnp, fusec.lax, trips)
        jp = programs(jnp, jax.lax, trips) if jax is not None else {}
        for name, f in fp.items():
            jf = fusec.gpu_jit(f)
            row: dict[str, Any] = {"loop": name, "trips": trips}
            t0 = time.perf_counter()
            fusec.tree_util.tree_map(lambda t: t.block_until_ready(), jf(xd))
            row["fusec_first_call_s"] = time.perf_counter() - t0
            row["fusec_ms"] = 1e3 * median_wall(
                lambda: fusec.tree_util.tree_map(lambda t: t.block_until_ready(), jf(xd)),
                a.reps, warmup=2)
            got = fusec.tree_util.tree_leaves(jf(xd))
            if jax is not None:
                jj = jax.jit(jp[name])
                row["jax_ms"] = 1e3 * median_wall(
                    lambda: jax.block_until_ready(jj(xj)), a.reps, warmup=2)
                want = jax.tree_util.tree_leaves(jj(xj))
                row["max_abs_diff_vs_jax"] = max(
                    float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64))))
                    for g, w in zip(got, want))
            res["rows"].append(row)
            print(json.dumps(row))
    write_json(res, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
