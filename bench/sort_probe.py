"""Sort of float32 rows on the device: each stage kernel's GPU time (``fusec.profile``), the
whole call's GPU time and wall clock, beside JAX's and torch's sort where installed.

    python bench/sort_probe.py [--n 16777216] [--rows 1] [--reps 20] [--configs 16:8192:1,16:8192:8]
                               [--ab 3] [--dtype float32|int32|uint32] [--wall]

``--configs`` (PER:BLOCK:UNROLL, ...) times the whole sort's GPU time with other radix shapes
(scatter elements per thread, elements per workgroup, keys a histogram thread loads at once)
first, side by side in this process. ``--ab K`` times the sort with ranking in subgroups,
with subgroup scans only and with no subgroup operations, K rounds interleaved. ``--dtype``:
float32 from a normal distribution (the default) or int32 / uint32 drawn uniformly. ``--wall``
breaks the wall clock down: the call alone (host work up to its last submit), call + wait, and
both with the call's dispatches submitted at once (FUSEC_SUBMIT_FIRST=0) and in chunks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import median_wall  # noqa: E402  (bench/timing.py)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--configs", default="")
    ap.add_argument("--ab", type=int, default=0)
    ap.add_argument("--dtype", default="float32", choices=["float32", "int32", "uint32"])
    ap.add_argument("--wall", action="store_true")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        torch = None
    import fusec
    import fusec.numpy as fnp
    from fusec import bench
    from fusec.kernels import sort as ksort

    rng = np.random.default_rng(0)
    shape = (a.rows, a.n) if a.rows > 1 else (a.n,)
    if a.dtype == "float32":
        x = rng.standard_normal(shape).astype(np.float32)
    else:
        info = np.iinfo(a.dtype)
        x = rng.integers(info.min, info.max, shape, dtype=np.int64, endpoint=True).astype(a.dtype)
    xd = fusec.device_put(x)
    # GPU time by timestamps after the GPU has been kept busy (fusec.bench), wall clock of call +
    # wait (bench/timing.py): the bench's own helpers, a fixed number of timed calls
    policy = bench.Policy(min_reps=a.reps, max_reps=a.reps, budget_s=float("inf"))

    def gpu_ms(f: Any) -> float:
        return 1e3 * float(bench.fusec_time(f, [xd], policy)["time_s"])

    for cfg in filter(None, a.configs.split(",")):
        per, block, unroll = (int(v) for v in cfg.split(":"))
        saved = ksort.RADIX_PER_THREAD, ksort.RADIX_BLOCKS, ksort.HIST_UNROLL
        ksort.RADIX_PER_THREAD, ksort.RADIX_BLOCKS, ksort.HIST_UNROLL = per, (block,), unroll
        g = fusec.gpu_jit(lambda v: fnp.sort(v))
        assert np.array_equal(np.asarray(g(xd)), np.sort(x, axis=-1))
        t = gpu_ms(g)
        ksort.RADIX_PER_THREAD, ksort.RADIX_BLOCKS, ksort.HIST_UNROLL = saved
        print(f"config {per} per thread, blocks of {block}, histogram unroll {unroll}: gpu "
              f"{t:.3f} ms")
    if a.ab:
        # the same sort traced with fewer subgroup operations (Runtime.subgroups: 3 one-word
        # ballots (NVIDIA), 2 four-word ballots, both with scans, 1 scans only, 0 none), in turns
        from fusec.runtime import Runtime
        print("device subgroup level:", fusec.runtime.get_runtime().subgroups)
        variants = {}
        saved_prop = Runtime.subgroups
        for name, level in (("one-word ballots", 3), ("ranking in subgroups", 2),
                            ("subgroup scans", 1), ("none", 0)):
            Runtime.subgroups = property(lambda self, v=level: min(v, saved_prop.fget(self)))  # type: ignore[assignment,attr-defined]
            g = fusec.gpu_jit(lambda v: fnp.sort(v))
            assert np.array_equal(np.asarray(g(xd)), np.sort(x, axis=-1))
            variants[name] = g
        Runtime.subgroups = saved_prop  # type: ignore[method-assign]
        for k in range(a.ab):
            for name, g in variants.items():
                w = median_wall(lambda: g(xd).block_until_ready(), a.reps)
                print(f"round {k} {name}: gpu {gpu_ms(g):.3f} ms, wall {1e3 * w:.3f} ms")
    if a.wall:
        import time
        w = fusec.gpu_jit(lambda v: fnp.sort(v))
        w(xd).block_until_ready()
        for first in (4, 0, 2, 8):
            fusec.config.set("submit_first", first)
            call_s = []
            for _ in range(a.reps):
                w(xd).block_until_ready()
                t = time.perf_counter()
                out = w(xd)
                call_s.append(time.perf_counter() - t)
                out.block_until_ready()
            call_s.sort()
            full = median_wall(lambda: w(xd).block_until_ready(), a.reps)
            print(f"submit_first {first}: call alone {1e6 * call_s[len(call_s) // 2]:.0f} us, "
                  f"call + wait {1e6 * full:.0f} us")
        fusec.config.set("submit_first", None)
    f = fusec.gpu_jit(lambda v: fnp.sort(v))
    got = np.asarray(f(xd))
    assert np.array_equal(got, np.sort(x, axis=-1)), "fusec's sort differs from numpy's"
    print("kernels:", [k.name for k in f.lower(xd).kernels])
    with fusec.profile():
        f(xd).block_until_ready()
    wall = median_wall(lambda: f(xd).block_until_ready(), a.reps)
    print(f"fusec sort {shape}: gpu {gpu_ms(f):.3f} ms, wall {1e3 * wall:.3f} ms "
          f"(median of {a.reps})")
    try:
        import jax
        import jax.numpy as jnp
        xj = jax.device_put(x)
        g = jax.jit(jnp.sort)
        jax_wall = median_wall(lambda: g(xj).block_until_ready(), a.reps)
        print(f"jax sort: wall {1e3 * jax_wall:.3f} ms")
    except ImportError:
        pass
    if torch is not None and torch.cuda.is_available() and a.dtype != "uint32":
        xt = torch.from_numpy(x).cuda()

        def torch_sort() -> None:
            torch.sort(xt)
            torch.cuda.synchronize()

        print(f"torch sort: wall {1e3 * median_wall(torch_sort, a.reps):.3f} ms")


if __name__ == "__main__":
    main()
