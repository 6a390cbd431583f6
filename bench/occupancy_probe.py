"""How many workgroups of a product's kernel the GPU runs at once: its occupancy, which WebGPU
does not report. The kernel fusec generates for ``x @ w`` is compiled as fusec compiles it (a
trusted module) with a counter added: thread 0 of each workgroup increments a live count when
the workgroup starts, keeps the largest value seen, and decrements it at the end. The peak,
divided by the SM count, is how many workgroups an SM held; with the workgroup's size and its
workgroup memory it bounds the registers a thread uses. A calibration kernel of the same
workgroup size, with few registers and no workgroup memory, shows the probe can see full
occupancy. The product's result is checked against numpy, so the counter did not break it.

    FUSEC_CACHE_DIR=off python bench/occupancy_probe.py [--shapes 4096x4096x4096,...]
        [--settings "default;codegen.MATMUL_BLOCK=..."] [--sms 132] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import overridden, setting_changes  # noqa: E402  (bench/timing.py)

SHAPES = ("4096x4096x4096,4096x384x384,4096x384x1152,4096x384x1536,4096x1536x384,"
          "2048x1024x2816,3072x512x512")

_ENTER = ("    if (lid == 0u) {\n"
          "        let live = atomicAdd(&fusec_occ[0], 1u) + 1u;\n"
          "        atomicMax(&fusec_occ[1], live);\n"
          "        atomicAdd(&fusec_occ[2], 1u);\n"
          "    }\n")
_EXIT = "    if (lid == 0u) {\n        atomicSub(&fusec_occ[0], 1u);\n    }\n"


def instrument(wgsl: str, binding: int) -> str:
    """``wgsl`` with the counters: a binding after the kernel's own, the increment after main's
    test of the workgroup index, the decrement before main's end (main is the last function)."""
    decl = (f"@group(0) @binding({binding}) var<storage, read_write> fusec_occ: "
            "array<atomic<u32>, 4>;\n")
    head, sep, rest = wgsl.partition("\n")
    text = head + sep + decl + rest
    start = text.index("fn main(")
    guard = text.index("return;\n    }\n", start) + len("return;\n    }\n")
    text = text[:guard] + _ENTER + text[guard:]
    end = text.rstrip().rindex("}")
    return text[:end] + _EXIT + text[end:]


def calibration(wx: int, wy: int, iters: int, shared_kib: int = 0) -> str:
    """A kernel of the same workgroup size that only loops on a few registers, holding
    ``shared_kib`` KiB of workgroup memory (written and read, so that it is kept)."""
    vec4s = shared_kib * 64
    pad_decl = f"var<workgroup> pad: array<vec4<f32>, {vec4s}>;\n" if vec4s else ""
    pad_use = (f"    pad[lid % {vec4s}u] = vec4<f32>(v);\n    workgroupBarrier();\n"
               f"    v += pad[(lid + 1u) % {vec4s}u].x;\n") if vec4s else ""
    return (
        "@group(0) @binding(0) var<storage, read_write> out0: array<f32>;\n" + pad_decl +
        f"@compute @workgroup_size({wx}, {wy})\n"
        "fn main(@builtin(workgroup_id) wid: vec3<u32>,\n"
        "        @builtin(local_invocation_index) lid: u32) {\n"
        "    if (wid.x >= 1000000u) {\n        return;\n    }\n"
        "    var v = f32(lid);\n" + pad_use +
        f"    for (var i = 0u; i < {iters}u; i += 1u) {{\n        v = v * 0.999 + 1.0;\n    }}\n"
        "    out0[wid.x * 1024u + lid] = v;\n"
        "}\n")


def run_kernel(rt: Any, wgsl: str, grid: tuple[int, int, int], arrays: list[np.ndarray],
               out_bytes: int, label: str) -> tuple[np.ndarray, list[int], float]:
    """Compile ``wgsl`` through fusec's own pipeline cache (``Runtime.pipeline``: a trusted
    module, as fusec's kernels), bind ``arrays`` (read), an output and the counters, run it once;
    the output, the counters and the wall time of the run in ms."""
    import hashlib

    import wgpu

    dev = rt.device
    n_in = len(arrays)
    pipe, bgl = rt.pipeline(hashlib.sha256(wgsl.encode()).hexdigest(), wgsl, n_in, 2, label)
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    bufs = [dev.create_buffer_with_data(data=np.ascontiguousarray(a), usage=usage) for a in arrays]
    bufs.append(dev.create_buffer(size=out_bytes, usage=usage))
    occ = dev.create_buffer_with_data(data=np.zeros(4, np.uint32), usage=usage)
    bufs.append(occ)
    bg = dev.create_bind_group(layout=bgl, entries=[
        {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}}
        for i, b in enumerate(bufs)])
    enc = dev.create_command_encoder()
    cp = enc.begin_compute_pass()
    cp.set_pipeline(pipe)
    cp.set_bind_group(0, bg)
    cp.dispatch_workgroups(*grid)
    cp.end()
    t0 = time.perf_counter()
    dev.queue.submit([enc.finish()])
    counts = np.frombuffer(dev.queue.read_buffer(occ), np.uint32).tolist()
    ms = 1e3 * (time.perf_counter() - t0)
    out = np.frombuffer(dev.queue.read_buffer(bufs[n_in]), np.float32)
    return out, counts, ms


def calibration_peak(rt: Any, wx: int, wy: int, iters: int, shared_kib: int, sms: int) -> int:
    """The most calibration workgroups alive at once, best of 2 runs of 32 per SM."""
    wgsl = instrument(calibration(wx, wy, iters, shared_kib), 1)
    return max(run_kernel(rt, wgsl, (32 * sms, 1, 1), [], 4 * 1024 * 32 * sms,
                          "calibration")[1][1] for _ in range(2))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES, help="M x K x N products, comma-separated")
    ap.add_argument("--settings", default="default")
    ap.add_argument("--sms", type=int, default=132, help="the GPU's SM count (H100 SXM, H200: 132)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cal-iters", type=int, default=200000,
                    help="the calibration kernel's loop count (long enough to overlap)")
    ap.add_argument("--calibrate", default="",
                    help="calibration kernels alone: threads:KiB of workgroup memory, ...")
    ap.add_argument("--out")
    a = ap.parse_args(argv)

    import fusec
    from fusec import codegen, runtime
    from fusec.exported import workgroup_size
    from fusec.passes import splitk

    rt = runtime.get_runtime()
    assert rt is not None, "no GPU adapter"
    modules = {"codegen": codegen, "splitk": splitk}
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    for item in filter(None, a.calibrate.split(",")):
        threads, kib = (int(v) for v in item.split(":"))
        peak = calibration_peak(rt, threads, 1, a.cal_iters, kib, a.sms)
        row = {"calibration": item, "peak_live": peak, "per_sm": round(peak / a.sms, 2)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    calibrated: dict[tuple[int, int], int] = {}
    for setting in a.settings.split(";"):
        for shape in a.shapes.split(","):
            m, k, n = (int(v) for v in shape.split("x"))
            x = rng.standard_normal((m, k), dtype=np.float32)
            w = rng.standard_normal((k, n), dtype=np.float32)
            with overridden(setting_changes(setting, modules)):
                lowered = fusec.gpu_jit(lambda p, q: p @ q).lower(x, w)
            kernels = list(lowered.kernels)
            if len(kernels) != 1:
                print(f"{setting} {shape}: {len(kernels)} kernels, skipped")
                continue
            kc = kernels[0]
            wx, wy, _ = workgroup_size(kc.wgsl)
            tile = next((ln for ln in kc.wgsl.splitlines() if "computes a" in ln), "").strip()
            peaks, ms = [], []
            for _ in range(a.runs):
                out, counts, t = run_kernel(rt, instrument(kc.wgsl, kc.n_inputs + kc.n_outputs),
                                            kc.grid, [x, w], 4 * m * n, kc.name)
                peaks.append(counts[1])
                ms.append(round(t, 3))
            assert counts[0] == 0, counts
            groups = counts[2]
            ref = x.astype(np.float64) @ w.astype(np.float64)
            err = float(np.max(np.abs(out.reshape(m, n) - ref)))
            assert err < 1e-4 * np.sqrt(k) * 8, (shape, err)
            if (wx, wy) not in calibrated:
                calibrated[(wx, wy)] = calibration_peak(rt, wx, wy, a.cal_iters, 0, a.sms)
            row = {"setting": setting, "shape": shape, "tile": tile, "threads": wx * wy,
                   "workgroups": groups, "peak_live": max(peaks), "peaks": peaks,
                   "per_sm": round(max(peaks) / a.sms, 2),
                   "calibration_peak": calibrated[(wx, wy)],
                   "calibration_per_sm": round(calibrated[(wx, wy)] / a.sms, 2),
                   "wall_ms": ms, "max_abs_err": err}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.out:
        device = f"{rt.info.adapter} on {rt.info.backend}"
        Path(a.out).write_text(json.dumps({"device": device, "sms": a.sms, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
