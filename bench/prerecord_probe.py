"""Probe (issue 18): how much of a round trip's wall clock a call recorded ahead of time would
save. Per case, interleaved rounds of: the call as fusec makes it (call + block_until_ready), and
the same call's whole command buffer recorded and finished beforehand (untimed), then only
submitted and waited for (timed), plus the jitted call's own Python measured with the run
stubbed.

    python bench/prerecord_probe.py [--cases bert32x128,transformer] [--reps 40] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="bert32x128,transformer")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    import bert_encoder as be
    import minilm_encoder as ex

    import fusec
    import fusec.numpy as fnp
    from fusec import bench, nn, runtime

    rt = runtime.get_runtime()
    nat = rt.native
    cases: dict[str, tuple[Any, list[Any]]] = {}
    for case in a.cases.split(","):
        if case.startswith("bert"):
            b, s = (int(v) for v in case[4:].split("x"))
            w = {k: fusec.device_put(v) for k, v in be.random_weights().items()}
            ids, mask = ex.make_batch(b, s, 30522)
            f = fusec.gpu_jit(lambda w, i, m: ex.encode(fnp, nn, w, i, m, 1e-12))
            cases[case] = (f, [w, fusec.device_put(ids), fusec.device_put(mask)])
        else:
            wl = {x.name: x for x in bench.workloads(quick=False)}[case]
            dev = [fusec.device_put(x) for x in wl.make_inputs(np.random.default_rng(0))]
            cases[case] = (fusec.gpu_jit(wl.bind(bench.FusecOps)), dev)

    orig = runtime.GpuExecutable._run
    for case, (f, args) in cases.items():
        f(*args).block_until_ready()
        got: list[Any] = []

        def capture(self: Any, inputs: Any, got: list[Any] = got) -> Any:
            got[:] = [self, list(inputs)]
            return orig(self, inputs)

        runtime.GpuExecutable._run = capture  # type: ignore[method-assign]
        out = f(*args)
        runtime.GpuExecutable._run = orig  # type: ignore[method-assign]
        out.block_until_ready()
        exe, inputs = got
        stub = [out]
        runtime.GpuExecutable._run = lambda self, ins: stub  # type: ignore[method-assign]
        py = []
        for _ in range(2000):
            t0 = time.perf_counter()
            f(*args)
            py.append(time.perf_counter() - t0)
        runtime.GpuExecutable._run = orig  # type: ignore[method-assign]

        def record() -> tuple[Any, list[Any]]:
            bufs: list[Any] = [None] * exe.n_slots
            raws: list[Any] = [None] * exe.n_slots
            for i, x in enumerate(inputs):
                if x is not None:
                    bufs[i] = x._buffer
                    raws[i] = x._buffer.raw
            enc = nat.encoder()
            for z in exe.zeroed:
                enc.clear_buffer(exe.pool[z].raw)
            cpass = enc.begin_compute_pass()
            enc, cpass = exe._record_native(bufs, raws, enc, cpass, [])
            cpass.end()
            enc.cpass = None
            raw, enc.raw = enc.raw, None
            cb = nat.finish(raw, nat.cb_desc)
            nat.release_encoder(raw)
            return cb, bufs

        def submit(cb: Any) -> None:
            nat.cbs[0] = cb
            nat.submit(nat.queue, 1, nat.cbs)
            nat.release_cb(cb)

        for rnd in range(a.rounds):
            normal, pre, rec = [], [], []
            for _ in range(a.reps):
                t0 = time.perf_counter()
                f(*args).block_until_ready()
                normal.append(time.perf_counter() - t0)
            for _ in range(a.reps):
                t0 = time.perf_counter()
                cb, bufs = record()
                t1 = time.perf_counter()
                submit(cb)
                rt.wait_idle()
                pre.append(time.perf_counter() - t1)
                rec.append(t1 - t0)
                del bufs
            med = statistics.median
            print(f"{case} round {rnd}: call+wait {1e6 * med(normal):.1f} us; prerecorded "
                  f"submit+wait {1e6 * med(pre):.1f} us (+ the call's Python "
                  f"{1e6 * med(py):.1f} us); recording+finish {1e6 * med(rec):.1f} us",
                  flush=True)
        t = bench.fusec_time(f, args, bench.FULL_POLICY)
        print(f"{case}: GPU time in one pass {1e6 * t['time_s']:.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
