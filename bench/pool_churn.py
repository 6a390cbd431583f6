"""A workload whose first call finds fusec's buffer pool full of earlier work's buffers, as in a
``fusec bench`` full run: wall clock per call (call + wait) and how many buffers its calls
destroy. With a pool that dropped the buffer just released, each call created and destroyed its
output (and every destroy dropped the executables' cached bind groups); the pool now lets its
oldest buffers go instead.

    python bench/pool_churn.py [--calls 60] [--rows 4096]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--rows", type=int, default=4096)
    a = ap.parse_args()
    import fusec
    from fusec.runtime import get_runtime

    rng = np.random.default_rng(0)
    table = fusec.device_put(rng.standard_normal((50257 // 8, 768)).astype(np.float32))
    idx = fusec.device_put(rng.integers(0, table.shape[0], a.rows).astype(np.int32))
    rt = get_runtime()
    assert rt is not None, "needs a wgpu device (FUSEC_BACKEND=gpu on a software adapter)"
    # earlier work leaves buffers of other sizes in the pool, up to its limit
    for mb in (9, 13, 21):
        x = fusec.device_put(np.zeros(mb << 18, np.float32))
        x.block_until_ready()
        del x
    rt.flush()
    rt.pool_limit = rt._free_bytes  # full
    f = fusec.gpu_jit(lambda t, i: t[i] * 2.0)
    f(table, idx).block_until_ready()  # the workload's first call
    rt.flush()
    destroyed = rt.destroyed
    ts = []
    for _ in range(a.calls):
        t = time.perf_counter()
        f(table, idx).block_until_ready()
        ts.append(time.perf_counter() - t)
    rt.flush()
    print(f"gather of {a.rows} rows: {1e6 * statistics.median(ts[a.calls // 6:]):.0f} us per call "
          f"(median of {a.calls - a.calls // 6}), {rt.destroyed - destroyed} buffers destroyed "
          f"in {a.calls} calls")


if __name__ == "__main__":
    main()
