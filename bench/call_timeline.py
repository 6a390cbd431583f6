"""Where a multi-kernel call's wall clock goes beyond its GPU time (issue 18): the call recorded
and submitted as fusec really does it (in chunks: ``FUSEC_SUBMIT_FIRST``/``GROWTH``), with a GPU
timestamp at the beginning and the end of every compute pass it records (one pass per submitted
chunk), and the host's clock at the call's start, at each submit and at its return.

    python bench/call_timeline.py [--cases tiny,bert32x128,bert1x16,bench:mlp] [--reps 30]
                                  [--firsts 4/2,0] [--out r.json] [--hold-clocks]

Per case and setting, medians over ``--reps`` calls (call + ``block_until_ready``, the GPU idle
before each):

- **wall**: the call's round trip on the host;
- **span**: GPU time from the first pass's beginning to the last pass's end;
- **passes**: the passes' own GPU time summed; **gaps**: span - passes, the GPU's time between
  chunks (idle, or starting the next command buffer);
- **outside** = wall - span: the host's time before the GPU starts plus after it ends (recording
  and submitting the first chunk, the GPU's start, noticing the end);
- **to record**, **first submit**, **last submit**: when the call's recording started, and when
  its first and last chunks' submits returned, from the call's start; **finish first**, **queue
  first**: the first chunk's wgpu-native ``finish`` and ``submit``, and **finish all**, **queue
  all** the call's in all;
- **profiled**: the call's GPU time as ``fusec bench`` measures it (one pass, timestamps around
  it: ``fusec.bench.fusec_time``).

GPU and host clocks are not related, so a pass's start cannot be placed on the host's time line;
the tiny case (one kernel) gives ``outside`` for a call whose recording is negligible. A pass
pre-opened while the host waits (``runtime.PREOPEN_BATCH``) would take its query index in the
call before; the probe turns that off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from timing import submit_setting  # noqa: E402  (bench/timing.py)

MAX_PASSES = 256


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="tiny,bert32x128,bert1x16")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--firsts", default="4/2,0")
    ap.add_argument("--out", default="")
    ap.add_argument("--heat", type=float, default=1.0, help="seconds of calls before a case")
    ap.add_argument("--hold-clocks", action="store_true",
                    help="keep an NVIDIA GPU at full clocks (fusec.hold_gpu_clocks)")
    a = ap.parse_args(argv)
    import bert_encoder as be
    import minilm_encoder as ex

    import fusec
    import fusec.numpy as fnp
    from fusec import bench, native, nn, runtime

    if a.hold_clocks:
        print(f"GPU clocks {fusec.hold_gpu_clocks()}")
    rt = runtime.get_runtime()
    if rt is None or rt.native is None or "timestamp-query" not in rt.info.features:
        print("needs wgpu-native's recorder and timestamp queries", file=sys.stderr)
        return 1
    runtime.PREOPEN_BATCH = 0
    wgpu = rt.wgpu
    qs = rt.device.create_query_set(type=wgpu.QueryType.timestamp, count=2 * MAX_PASSES)
    resolve = rt.device.create_buffer(size=16 * MAX_PASSES,
                                      usage=wgpu.BufferUsage.QUERY_RESOLVE
                                      | wgpu.BufferUsage.COPY_SRC)
    n = rt.native
    ffi = n.ffi
    state: dict[str, Any] = {"on": False, "passes": 0, "keep": [], "submits": []}
    plain_begin = n.begin

    def timed_begin(enc: Any, desc: Any) -> Any:
        if not state["on"] or state["passes"] >= MAX_PASSES:
            return plain_begin(enc, desc)
        i = state["passes"]
        state["passes"] = i + 1
        tw = ffi.new("WGPUPassTimestampWrites *")
        tw.querySet = qs._internal
        tw.beginningOfPassWriteIndex = 2 * i
        tw.endOfPassWriteIndex = 2 * i + 1
        d = ffi.new("WGPUComputePassDescriptor *")
        d.timestampWrites = tw
        state["keep"] += [tw, d]
        return plain_begin(enc, d)

    n.begin = timed_begin
    plain_submit = native.Encoder.submit

    def timed_submit(self: Any) -> None:
        plain_submit(self)
        if state["on"]:
            state["submits"].append(time.perf_counter())

    native.Encoder.submit = timed_submit  # type: ignore[method-assign]
    # the host's own marks: where the call's recording starts, and each finish and submit
    def timed(fn: Callable[..., Any], into: str) -> Callable[..., Any]:
        def call(*a: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a)
            finally:
                if state["on"]:
                    state[into].append(time.perf_counter() - t)
        return call

    n.finish, n.submit = timed(n.finish, "finish"), timed(n.submit, "queue")
    plain_record = runtime.GpuExecutable._record_native

    def timed_record(self: Any, *a: Any) -> Any:
        if state["on"] and "record" not in state:
            state["record"] = time.perf_counter()
        return plain_record(self, *a)

    runtime.GpuExecutable._record_native = timed_record  # type: ignore[method-assign]

    policy = bench.Policy(warmup=3, min_reps=10, max_reps=30, budget_s=1.0, heat_s=0.2)
    cases: list[tuple[str, Any, list[Any]]] = []
    for c in a.cases.split(","):
        if c == "tiny":
            x = fusec.device_put(np.random.default_rng(0).standard_normal(1024).astype(np.float32))
            cases.append((c, fusec.gpu_jit(lambda x: fnp.tanh(x * 2.0 + 1.0)), [x]))
        elif c.startswith("bert"):
            b, s = (int(v) for v in c[4:].split("x"))
            wts = {k: fusec.device_put(v) for k, v in be.random_weights().items()}
            ids, mask = ex.make_batch(b, s, 30522)
            enc = fusec.gpu_jit(lambda w, i, m: ex.encode(fnp, nn, w, i, m, 1e-12))
            cases.append((c, enc, [wts, fusec.device_put(ids), fusec.device_put(mask)]))
        elif c.startswith("bench:"):
            w = bench.select(bench.workloads(quick=False), [c[6:]])[0]
            args = [fusec.device_put(v) for v in w.make_inputs(np.random.default_rng(0))]
            cases.append((c, fusec.gpu_jit(w.bind(bench.FusecOps)), args))
        else:
            raise SystemExit(f"unknown case {c!r}")

    def one(f: Callable[..., Any], args: list[Any]) -> dict[str, float]:
        rt.sync()
        state.update(on=True, passes=0, keep=[], submits=[], finish=[], queue=[])
        state.pop("record", None)
        t0 = time.perf_counter()
        out = f(*args)
        out.block_until_ready()
        t1 = time.perf_counter()
        state["on"] = False
        k = state["passes"]
        ce = rt.device.create_command_encoder()
        ce.resolve_query_set(qs, 0, 2 * k, resolve, 0)
        rt.device.queue.submit([ce.finish()])
        ts = np.frombuffer(rt.read(resolve, 16 * k), dtype=np.uint64).astype(np.int64)
        begins, ends = ts[0::2], ts[1::2]
        span = (ends.max() - begins.min()) / 1e3
        passes = float((ends - begins).sum()) / 1e3
        wall = (t1 - t0) * 1e6
        subs = state["submits"]
        return {"wall": wall, "span": span, "passes": passes, "gaps": span - passes,
                "outside": wall - span, "chunks": k,
                "to_record": (state["record"] - t0) * 1e6 if "record" in state else 0.0,
                "first_submit": (subs[0] - t0) * 1e6 if subs else 0.0,
                "last_submit": (subs[-1] - t0) * 1e6 if subs else 0.0,
                "finish_first": state["finish"][0] * 1e6 if state["finish"] else 0.0,
                "queue_first": state["queue"][0] * 1e6 if state["queue"] else 0.0,
                "finish_all": sum(state["finish"]) * 1e6,
                "queue_all": sum(state["queue"]) * 1e6}

    results = []
    for name, f, args in cases:
        kernels = len(f.lower(*args).kernels)
        end = time.perf_counter() + a.heat
        while time.perf_counter() < end:  # the GPU's clocks up before the first setting
            f(*args).block_until_ready()
        for setting in a.firsts.split(","):
            submit_setting(setting)
            for _ in range(3):
                one(f, args)
            rows = [one(f, args) for _ in range(a.reps)]
            med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
            prof = 1e6 * bench.fusec_time(f, args, policy)["time_s"]
            submit_setting(None)
            res = {"case": name, "kernels": kernels, "submit": setting,
                   **{k: round(float(v), 1) for k, v in med.items()}, "profiled": round(prof, 1)}
            results.append(res)
            print(res, flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
