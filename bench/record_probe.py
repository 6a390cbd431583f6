"""Host time of recording one call of the MiniLM-L6 encoder (bench/bert_encoder.py's random
weights) and what it is made of: wall of the call alone (no wait), bind groups created per call,
and the time of wgpu-py's recording methods, per call (issue 18).

    python bench/record_probe.py [--shape 32x128] [--calls 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import bert_encoder as be  # noqa: E402
import minilm_encoder as ex  # noqa: E402

import fusec  # noqa: E402
import fusec.numpy as fnp  # noqa: E402
from fusec import nn, runtime  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="32x128")
    ap.add_argument("--calls", type=int, default=30)
    a = ap.parse_args(argv)
    b, s = (int(v) for v in a.shape.split("x"))
    w = be.random_weights()
    ids, mask = ex.make_batch(b, s, 30522)
    wd = {k: fusec.device_put(v) for k, v in w.items()}
    idd, md = fusec.device_put(ids), fusec.device_put(mask)
    f = fusec.gpu_jit(lambda w, i, m: ex.encode(fnp, nn, w, i, m, 1e-12))
    f(wd, idd, md).block_until_ready()
    rt = runtime.get_runtime()
    assert rt is not None
    made = [0]
    real_bg = rt.device.create_bind_group

    def counting(**kw: Any) -> Any:
        made[0] += 1
        return real_bg(**kw)

    rt.device.create_bind_group = counting  # type: ignore[method-assign]
    rec, total = [], []
    for _ in range(a.calls):
        t0 = time.perf_counter()
        r = f(wd, idd, md)
        t1 = time.perf_counter()
        r.block_until_ready()
        t2 = time.perf_counter()
        rec.append(t1 - t0)
        total.append(t2 - t0)
    print(f"{a.shape}: kernels {len(f.lower(wd, idd, md).kernels)}; record (call alone) "
          f"{1e3 * statistics.median(rec):.3f} ms, round trip {1e3 * statistics.median(total):.3f}"
          f" ms; bind groups created per call {made[0] / a.calls:.1f}")
    import cProfile
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    for _ in range(a.calls):
        f(wd, idd, md).block_until_ready()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(12)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
