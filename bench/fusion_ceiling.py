"""How large can fusion's speed-up get? For each memory-bound workload of ``fusec bench`` that
fusion merges into one kernel (softmax, layer_norm, rms_norm, the 16-op chain), this times:

- the fused and the unfused (``fuse=False``) plans, as the benchmark report does;
- a *reference kernel*: fusec's one-op elementwise kernel over the same full-size inputs (``-x``
  for one, ``x * y`` for two), which reads and writes the same bytes per element as the fused
  kernel does. No fused kernel can stream its bytes faster than this one-op kernel streams its
  own, so unfused time / reference time is the largest speed-up a fused kernel could show;
- the unfused plans' kinds of kernel alone: a row reduction (reads only) and a one-op kernel
  (reads one, writes one), to show where the unfused plans' time goes.

With PyTorch on CUDA it also times torch's own fusion on the same workloads: its fused softmax
kernel against the five-kernel composite, and cuBLASLt's fused bias + gelu epilogue against a
product followed by two elementwise kernels.

Every case is timed in 3 interleaved rounds (GPU timestamp queries, median of 15 calls after 0.5 s
of back-to-back calls); the best round's median is reported.

    python bench/fusion_ceiling.py [--small] [--no-torch] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import fusec  # noqa: E402
import fusec.numpy as fnp  # noqa: E402
from fusec import bench as fb  # noqa: E402

POLICY = fb.Policy(warmup=3, min_reps=15, max_reps=15, budget_s=5.0, heat_s=0.5)
ROUNDS = 3
WORKLOADS = ("softmax", "layer_norm", "rms_norm", "chain16")


def best_of_rounds(cases: dict[str, Callable[[], float]]) -> dict[str, float]:
    """Each case's best median over ``ROUNDS`` interleaved rounds (A B C A B C ...), so that a
    noisy neighbour or a clock change slows every case alike."""
    runs: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(ROUNDS):
        for name, once in cases.items():
            runs[name].append(once())
    return {name: min(ts) for name, ts in runs.items()}


def _reference(inputs: Sequence[Any]) -> Any:
    """The one-op kernel over the workload's full-size inputs (see the module docstring)."""
    if len(inputs) == 1:
        return fusec.gpu_jit(lambda a: fnp.negative(a))
    if len(inputs) == 2:
        return fusec.gpu_jit(lambda a, b: a * b)
    raise ValueError(f"no reference kernel for {len(inputs)} full-size inputs")


def fusec_part(small: bool) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    ws = {w.name: w for w in fb.workloads(small) if w.name in WORKLOADS}
    cases: dict[str, Callable[[], float]] = {}
    info: dict[str, dict[str, Any]] = {}
    x2d: Any = None
    for name in WORKLOADS:
        w = ws[name]
        dev = [fusec.device_put(a) for a in w.make_inputs(rng)]
        full = [a for a in dev if a.size == dev[0].size]
        rec: dict[str, Any] = {"size": w.size}
        for label, fuse in (("fused", True), ("unfused", False)):
            f = fusec.gpu_jit(w.bind(fb.FusecOps), fuse=fuse)
            rec[f"{label}_bytes"] = f.lower(*dev).cost_analysis()["bytes accessed"]
            cases[f"{name} {label}"] = _timer(f, dev)
        cases[f"{name} reference"] = _timer(_reference(full), full)
        rec["reference"] = "-x" if len(full) == 1 else "x * y"
        info[name] = rec
        if len(dev[0].shape) == 2 and x2d is None:
            x2d = dev[0]
    if x2d is not None:
        rows = fusec.gpu_jit(lambda a: fnp.max(a, axis=-1, keepdims=True))
        cases["row max (reads only)"] = _timer(rows, [x2d])
        cases["exp (one read, one write)"] = _timer(fusec.gpu_jit(fnp.exp), [x2d])
    times = best_of_rounds(cases)
    for name, rec in info.items():
        for part in ("fused", "unfused", "reference"):
            rec[f"{part}_s"] = times[f"{name} {part}"]
        derive(rec)
    kernels = {}
    if x2d is not None:
        nbytes = x2d.size * 4
        for name, factor in (("row max (reads only)", 1), ("exp (one read, one write)", 2)):
            kernels[name] = {"time_s": times[name], "GB/s": factor * nbytes / times[name] / 1e9}
    return {"workloads": info, "kernels": kernels}


def derive(rec: dict[str, Any]) -> None:
    """Add a workload's speed-up, bytes ratio and ceiling to ``rec`` (times and bytes in it)."""
    rec["speed_up"] = rec["unfused_s"] / rec["fused_s"]
    rec["bytes_ratio"] = rec["unfused_bytes"] / rec["fused_bytes"]
    # the speed-up of a fused kernel that streamed its bytes as fast as the reference kernel
    rec["ceiling"] = rec["unfused_s"] / rec["reference_s"]
    rec["fused_vs_reference"] = rec["reference_s"] / rec["fused_s"]


def _timer(f: Any, args: Sequence[Any]) -> Callable[[], float]:
    f(*args).block_until_ready()  # compile outside the timed rounds
    return lambda: float(fb.fusec_time(f, list(args), POLICY)["time_s"])


def torch_part(small: bool) -> dict[str, Any]:
    """torch's own fusion: its fused kernels against the same work as separate kernels."""
    torch = fb._torch()
    F = torch.nn.functional
    torch.backends.cuda.matmul.allow_tf32 = False
    side, sq = (2048, 1024) if small else (8192, 4096)
    x = torch.randn(side, side, device="cuda")
    a = torch.randn(sq, sq, device="cuda")
    b = torch.randn(sq, sq, device="cuda")
    bias = torch.randn(sq, device="cuda")

    def composite_softmax() -> Any:
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)

    fns: dict[str, Callable[[], Any]] = {
        "softmax: torch.softmax (one kernel)": lambda: torch.softmax(x, -1),
        "softmax: five kernels": composite_softmax,
        f"matmul {sq}^3 alone": lambda: a @ b,
        f"matmul {sq}^3 + bias + gelu, three kernels":
            lambda: F.gelu(a @ b + bias, approximate="tanh"),
        f"matmul {sq}^3 + bias + gelu, cuBLASLt epilogue":
            lambda: torch._addmm_activation(bias, a, b, use_gelu=True),
    }
    cases = {name: _torch_timer(fn) for name, fn in fns.items()}
    return {"times_s": best_of_rounds(cases), "device": torch.cuda.get_device_name()}


def _torch_timer(fn: Callable[[], Any]) -> Callable[[], float]:
    return lambda: float(fb.torch_cuda_time(fn, POLICY)["time_s"])


def report(res: dict[str, Any]) -> str:
    lines = [f"device: {res['device']}", "",
             "| workload | fused | unfused | reference kernel | speed-up | bytes ratio | ceiling "
             "| fused / reference speed |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in res["fusec"]["workloads"].items():
        lines.append(
            f"| {name} | {r['fused_s'] * 1e6:.1f} µs | {r['unfused_s'] * 1e6:.1f} µs | "
            f"{r['reference']}: {r['reference_s'] * 1e6:.1f} µs | {r['speed_up']:.3f}x | "
            f"{r['bytes_ratio']:.3f}x | {r['ceiling']:.3f}x | "
            f"{100 * r['fused_vs_reference']:.1f}% |")
    lines += ["", "*ceiling*: unfused time / reference kernel time, the speed-up of a fused kernel "
              "as fast as the one-op kernel that moves the same bytes.", ""]
    for name, k in res["fusec"]["kernels"].items():
        lines.append(f"- {name}: {k['time_s'] * 1e6:.1f} µs, {k['GB/s']:.0f} GB/s")
    if "torch" in res:
        lines += ["", f"torch ({res['torch']['device']}, CUDA events):"]
        lines += [f"- {name}: {t * 1e6:.1f} µs" for name, t in res["torch"]["times_s"].items()]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="the quick sizes (for lavapipe)")
    ap.add_argument("--no-torch", action="store_true", help="skip the torch references")
    ap.add_argument("--out", type=Path, help="write ceiling.json and ceiling.md here")
    args = ap.parse_args()
    rt = fusec.runtime.get_runtime()
    assert rt is not None, "no wgpu adapter"
    if not fb.has_timestamps():
        print("note: no timestamp queries on this adapter; times are wall clock", file=sys.stderr)
    res: dict[str, Any] = {"device": str(rt.info), "fusec": fusec_part(args.small)}
    ok, why = fb.torch_status()
    if not args.no_torch and ok:
        res["torch"] = torch_part(args.small)
    elif not args.no_torch:
        print(f"torch references skipped: {why}", file=sys.stderr)
    text = report(res)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ceiling.json").write_text(json.dumps(res, indent=1))
        (args.out / "ceiling.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
