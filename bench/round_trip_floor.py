"""Where a tiny call's round trip goes (issue 18): fusec's call split into recording and the wait,
against the floor of wgpu-native on this machine (an empty command buffer submitted and waited
for; one dispatch of the same kernel, recorded by hand) and JAX's round trip, side by side.

    python bench/round_trip_floor.py [--reps 3000] [--out r.json]
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

import fusec
from fusec import runtime

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import median_wall, report  # noqa: E402  (bench/timing.py)


def _median_us(fn: Callable[[], Any], reps: int) -> float:
    return 1e6 * median_wall(fn, reps, warmup=50)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3000)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    x = np.random.default_rng(0).standard_normal(1024).astype(np.float32)
    f = fusec.gpu_jit(lambda v: (v * 2.0 + 1.0) * v)
    xd = fusec.device_put(x)
    f(xd).block_until_ready()
    rt = runtime.get_runtime()
    assert rt is not None
    dev = rt.device
    res: dict[str, Any] = {"device": str(fusec.default_device())}
    # the wait's variants, interleaved in rounds: spin + the next batch opened while waiting
    # (the default), spin alone, and the blocking poll
    variants = {"default": ("spin", True), "spin_no_preopen": ("spin", False),
                "blocking_poll": ("poll", False)}
    trips: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(10):
        for k, (wait_mode, preopen) in variants.items():
            fusec.config.set("wait", wait_mode)
            runtime.PREOPEN_BATCH = preopen
            for _ in range(20):
                f(xd).block_until_ready()
            for _ in range(max(1, a.reps // 10)):
                t = time.perf_counter()
                f(xd).block_until_ready()
                trips[k].append(time.perf_counter() - t)
    fusec.config.set("wait", "spin")
    runtime.PREOPEN_BATCH = True
    res["variants_round_trip_us"] = {k: 1e6 * statistics.median(v) for k, v in trips.items()}
    res["fusec_round_trip_us"] = _median_us(lambda: f(xd).block_until_ready(), a.reps)

    held: list[Any] = [None]
    rec, wait = [], []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        held[0] = f(xd)
        t1 = time.perf_counter()
        held[0].block_until_ready()
        t2 = time.perf_counter()
        rec.append(t1 - t0)
        wait.append(t2 - t1)
    res["fusec_record_us"] = 1e6 * statistics.median(rec)
    res["fusec_flush_and_wait_us"] = 1e6 * statistics.median(wait)

    def empty() -> None:
        enc = dev.create_command_encoder()
        enc.begin_compute_pass().end()
        dev.queue.submit([enc.finish()])
        dev._poll_wait()

    res["empty_submit_wait_us"] = _median_us(empty, a.reps)

    def submit_only() -> None:
        enc = dev.create_command_encoder()
        enc.begin_compute_pass().end()
        dev.queue.submit([enc.finish()])

    res["empty_submit_no_wait_us"] = _median_us(submit_only, a.reps)
    dev._poll_wait()
    res["poll_idle_us"] = _median_us(dev._poll_wait, a.reps)

    # one dispatch of fusec's kernel, by hand, into a fresh output buffer kept across calls
    pipe, layout = next(iter(rt.pipelines.values()))
    out = dev.create_buffer(size=4096, usage=runtime.STORAGE_USAGE
                            if hasattr(runtime, "STORAGE_USAGE") else 0x80 | 0x4 | 0x8)
    bg = dev.create_bind_group(layout=layout, entries=[
        {"binding": 0, "resource": {"buffer": xd._buffer.raw, "offset": 0, "size": 4096}},
        {"binding": 1, "resource": {"buffer": out, "offset": 0, "size": 4096}}])

    def one_dispatch() -> None:
        enc = dev.create_command_encoder()
        p = enc.begin_compute_pass()
        p.set_pipeline(pipe)
        p.set_bind_group(0, bg)
        p.dispatch_workgroups(4)
        p.end()
        dev.queue.submit([enc.finish()])
        spin_wait()

    from wgpu.backends.wgpu_native._api import ffi, lib

    raw_dev = dev._internal

    def spin_wait() -> None:
        while not lib.wgpuDevicePoll(raw_dev, False, ffi.NULL) & 0xFF:  # a C bool: low byte
            pass

    # the same through wgpu-native's C functions directly (descriptors made once): what wgpu-py's
    # wrappers cost
    encd = ffi.new("WGPUCommandEncoderDescriptor *")
    passd = ffi.new("WGPUComputePassDescriptor *")
    cbd = ffi.new("WGPUCommandBufferDescriptor *")
    cbs = ffi.new("WGPUCommandBuffer[1]")
    queue = dev.queue._internal
    raw_pipe, raw_bg = pipe._internal, bg._internal

    def one_dispatch_raw() -> None:
        enc = lib.wgpuDeviceCreateCommandEncoder(raw_dev, encd)
        p = lib.wgpuCommandEncoderBeginComputePass(enc, passd)
        lib.wgpuComputePassEncoderSetPipeline(p, raw_pipe)
        lib.wgpuComputePassEncoderSetBindGroup(p, 0, raw_bg, 0, ffi.NULL)
        lib.wgpuComputePassEncoderDispatchWorkgroups(p, 4, 1, 1)
        lib.wgpuComputePassEncoderEnd(p)
        cbs[0] = lib.wgpuCommandEncoderFinish(enc, cbd)
        lib.wgpuQueueSubmit(queue, 1, cbs)
        lib.wgpuCommandBufferRelease(cbs[0])
        lib.wgpuComputePassEncoderRelease(p)
        lib.wgpuCommandEncoderRelease(enc)
        spin_wait()

    try:
        for _ in range(5):  # interleaved rounds
            for k, fn in (("hand_dispatch_wgpu_py_us", one_dispatch),
                          ("hand_dispatch_raw_ffi_us", one_dispatch_raw)):
                res.setdefault(k, []).append(_median_us(fn, max(1, a.reps // 5)))
        for k in ("hand_dispatch_wgpu_py_us", "hand_dispatch_raw_ffi_us"):
            res[k] = statistics.median(res[k])
    except Exception as exc:  # noqa: BLE001 - the layout may differ; report, do not fail
        res["hand_dispatch_error"] = repr(exc)
    # each step of an empty submit on its own (medians over reps)
    steps: dict[str, list[float]] = {k: [] for k in ("encoder", "begin_pass", "end_pass", "finish",
                                                     "submit", "poll_wait")}
    for _ in range(a.reps):
        t0 = time.perf_counter()
        enc = dev.create_command_encoder()
        t1 = time.perf_counter()
        cp = enc.begin_compute_pass()
        t2 = time.perf_counter()
        cp.end()
        t3 = time.perf_counter()
        cb = enc.finish()
        t4 = time.perf_counter()
        dev.queue.submit([cb])
        t5 = time.perf_counter()
        dev._poll_wait()
        t6 = time.perf_counter()
        for k, dt in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)):
            steps[k].append(dt)
    res["empty_steps_us"] = {k: 1e6 * statistics.median(v) for k, v in steps.items()}

    # the wait by spinning on the non-blocking poll (its low byte: whether the queue is empty)
    def empty_spin() -> None:
        enc = dev.create_command_encoder()
        enc.begin_compute_pass().end()
        dev.queue.submit([enc.finish()])
        spin_wait()

    res["empty_submit_spin_us"] = _median_us(empty_spin, a.reps)

    def fusec_spin() -> None:
        f(xd)
        rt.flush()
        spin_wait()

    res["fusec_call_flush_spin_us"] = _median_us(fusec_spin, a.reps)
    try:
        import jax

        jf = jax.jit(lambda v: (v * 2.0 + 1.0) * v)
        xj = jax.device_put(x)
        res["jax_round_trip_us"] = _median_us(lambda: jf(xj).block_until_ready(), a.reps)
        res["jax_dispatch_only_us"] = _median_us(lambda: jf(xj), a.reps)
    except Exception as exc:  # noqa: BLE001 - optional reference
        res["jax_error"] = repr(exc)
    report(res, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
