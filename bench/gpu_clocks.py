"""Does fusec's wall clock follow the GPU's clocks, and do they depend on what else the process
holds? (issue 18: the same code measured 1.2 ms of GPU time per decode step in one process and
3–4 ms in another; small bench calls ran faster in ``fusec bench``'s process, which also holds a
CUDA context for JAX and torch, than in processes that ran fusec alone.)

    python bench/gpu_clocks.py [--phases alone,cuda,alone] [--reps 40] [--layers 30] [--quick]
                            [--out r.json]

Each phase times, in this one process: a few ``fusec bench`` workloads (call + wait, medians of
``--reps``; and their GPU time by timestamps) and the synthetic SmolLM2 decode step
(``llama_synthetic.py``; step to token on the host, and GPU time). ``nvidia-smi`` samples the
GPU's performance state, SM and memory clocks and power every 50 ms in the background; each
phase reports the samples taken during it. Phases: ``alone`` (fusec only), ``cuda`` (torch
creates a CUDA context on the same GPU first, and keeps it), ``cudabusy`` (and a torch thread
keeps a small kernel running all the time: the GPU never idles), ``hold`` (a CUDA primary context
retained through libcuda, ``fusec.hold_gpu_clocks``, then idle), ``idle`` (nothing), ``loop``
(back-to-back calls, one wait) and ``trips`` (round trips), each of the last three for
``--seconds``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

WORKLOADS = ("matmul_skinny_m", "gather", "argmax", "sort")
FIELDS = "timestamp,pstate,clocks.sm,clocks.mem,power.draw,utilization.gpu"


def _samples(path: Path, t0: float, t1: float, start: float) -> dict[str, Any]:
    """The nvidia-smi samples taken between ``t0`` and ``t1`` (perf_counter seconds; the
    sampler started at ``start``), summarised."""
    rows = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 6:
            continue
        try:
            rows.append((float(parts[0]), parts[1], float(parts[2].split()[0]),
                         float(parts[3].split()[0]), float(parts[4].split()[0]),
                         float(parts[5].split()[0])))
        except (ValueError, IndexError):
            continue
    picked = [r for r in rows if t0 - start <= r[0] <= t1 - start]
    if not picked:
        return {"samples": 0}
    med = statistics.median
    return {"samples": len(picked),
            "pstates": sorted({r[1] for r in picked}),
            "sm_mhz": [min(r[2] for r in picked), med(r[2] for r in picked),
                       max(r[2] for r in picked)],
            "mem_mhz": [min(r[3] for r in picked), max(r[3] for r in picked)],
            "power_w": [min(r[4] for r in picked), med(r[4] for r in picked),
                        max(r[4] for r in picked)],
            "util": med(r[5] for r in picked)}


def timed(calls: dict[str, Any], rt: Any, reps: int) -> dict[str, Any]:
    """Each workload's wall clock (call + wait) and GPU time (timestamps): medians of reps."""
    row = {}
    for name, (f, xs) in calls.items():
        walls, gpus = [], []
        for _ in range(reps):
            t = time.perf_counter()
            f(*xs).block_until_ready()
            walls.append(time.perf_counter() - t)
        rt.profile = True
        try:
            for _ in range(reps):
                f(*xs)
                ns = rt.last_gpu_ns()
                if ns is not None:
                    gpus.append(ns / 1e3)
        finally:
            rt.profile = False
        row[name] = {"wall_us": 1e6 * statistics.median(walls),
                     "gpu_us": statistics.median(gpus) if gpus else None}
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phases", default="alone,cuda,cudabusy")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--out", default="")
    ap.add_argument("--seconds", type=float, default=3.0, help="of an idle, loop or trips phase")
    ap.add_argument("--quick", action="store_true", help="the bench's small sizes")
    a = ap.parse_args(argv)
    smi = shutil.which("nvidia-smi")
    log = Path(tempfile.mkstemp(suffix=".csv")[1])
    start = time.perf_counter()
    sampler = None
    if smi:
        # "timestamp" prints a date; the sampler's own elapsed time is what is compared, so
        # each line is stamped by this process as it arrives
        sampler = subprocess.Popen([smi, f"--query-gpu={FIELDS}", "--format=csv,noheader",
                                    "-lms", "50"], stdout=subprocess.PIPE, text=True)

        def pump() -> None:
            assert sampler is not None and sampler.stdout is not None
            with log.open("w") as fh:
                for line in sampler.stdout:
                    fh.write(f"{time.perf_counter() - start:.3f},{line.split(',', 1)[1]}")
                    fh.flush()

        threading.Thread(target=pump, daemon=True).start()
    else:
        print("nvidia-smi not found: no clock samples", file=sys.stderr)
    time.sleep(1.0)  # the clocks before the process opens a device
    opened = time.perf_counter() - start

    torch: Any = None
    if any(p.startswith("cuda") for p in a.phases.split(",")):
        import torch  # (first: see the guide's note on torch and lavapipe)

    from llama_synthetic import gpu_steps, synthetic, timed_steps, warmed_up

    import fusec
    from fusec import bench
    from fusec.models.llama import Llama
    from fusec.runtime import get_runtime

    rt = get_runtime()
    assert rt is not None, "needs a GPU adapter"
    rng = np.random.default_rng(0)
    calls = {}
    for w in bench.select(bench.workloads(quick=a.quick), list(WORKLOADS)):
        f = fusec.gpu_jit(w.bind(bench.FusecOps))
        xs = [fusec.device_put(x) for x in w.make_inputs(rng)]
        f(*xs).block_until_ready()
        calls[w.name] = (f, xs)
    cfg, weights = synthetic(a.layers)
    model = Llama(cfg, weights, max_len=256)
    nxt = warmed_up(model, 1)

    busy = {"on": False}
    results: list[dict[str, Any]] = []
    marks: list[tuple[str, float, float]] = []
    for phase in a.phases.split(","):
        if phase.startswith("cuda") and torch is not None:
            torch.zeros(1, device="cuda").sum().item()  # a CUDA context, kept from here on
        if phase == "hold":
            print(f"GPU clocks {fusec.hold_gpu_clocks()}", flush=True)
        if phase == "cudabusy" and not busy["on"]:
            busy["on"] = True

            def spin() -> None:
                x = torch.ones(1024, device="cuda")
                while busy["on"]:
                    x = x * 1.0000001
                    torch.cuda.synchronize()

            threading.Thread(target=spin, daemon=True).start()
        t0 = time.perf_counter()
        row: dict[str, Any] = {"phase": phase}
        if phase in ("idle", "hold"):  # the device open, nothing to do
            time.sleep(a.seconds)
        elif phase == "loop":  # back-to-back calls, one wait at the end: the GPU never idles
            f, xs = calls["matmul_skinny_m"]
            n = 0
            while time.perf_counter() - t0 < a.seconds:
                for _ in range(20):
                    f(*xs)
                n += 20
            f(*xs).block_until_ready()
            row["calls"] = n
        elif phase == "trips":  # round trips: the GPU idles while the host waits and calls
            f, xs = calls["matmul_skinny_m"]
            walls = []
            while time.perf_counter() - t0 < a.seconds:
                t = time.perf_counter()
                f(*xs).block_until_ready()
                walls.append(time.perf_counter() - t)
            row["wall_us"] = 1e6 * statistics.median(walls)
        else:
            row.update(timed(calls, rt, a.reps))
            if model.pos > 150:
                nxt = warmed_up(model, 1)
            _host, step, nxt = timed_steps(model, nxt, a.reps)
            gpu, nxt = gpu_steps(model, nxt, a.reps)
            row["decode"] = {"step_ms": 1e3 * statistics.median(step),
                             "gpu_ms": statistics.median(gpu) if gpu else None}
        t1 = time.perf_counter()
        marks.append((phase, t0 - start, t1 - start))
        time.sleep(0.2)
        row["clocks"] = _samples(log, t0, t1, start) if smi else {}
        results.append(row)
        print(json.dumps(row), flush=True)
    busy["on"] = False
    if sampler is not None:
        sampler.terminate()
    if a.out:
        trace = log.read_text().splitlines() if smi else []
        Path(a.out).write_text(json.dumps({"phases": results, "marks": marks, "opened": opened,
                                           "samples": trace}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
