"""Time to first result with and without the persistent cache, and warm-up with 1 vs N threads.

    python bench/disk_cache.py [--runs 5] [--layers 2] [--threads N]

1. Time to first result of a transformer-like block (rms_norm, attention with softmax, an MLP with
   gelu, residual adds; ``--layers`` of them unrolled) in fresh processes: ``--runs`` processes
   with an empty ``FUSEC_CACHE_DIR`` against ``--runs`` with a warm one. Each child creates the
   device first and times only from just before the first call to after ``block_until_ready()``,
   so interpreter start-up and device creation are excluded. A cold run traces, lowers (passes +
   codegen) and compiles pipelines; a warm run traces, loads the lowered program from disk and
   compiles pipelines (the disk cache holds lowered programs, not driver pipelines).
2. ``fusec.warmup_from`` of a recorded manifest of ~20 distinct kernels (elementwise chains of
   different lengths and shapes) with threads=1 and threads=N, each in fresh processes with the
   persistent cache off; prints the pipeline-compile phase and the total.

Prints medians and ratios. Not collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

CHILD = '''
import json
import os
import sys
import time

import numpy as np

import fusec
import fusec.numpy as fnp
from fusec import nn

LAYERS = int(os.environ["BENCH_LAYERS"])
SEQ, D, FF = 64, 64, 256


@fusec.gpu_jit
def model(x, params):
    for p in params:
        h = nn.rms_norm(x, p["g1"])
        q, k, v = h @ p["wq"], h @ p["wk"], h @ p["wv"]
        att = nn.softmax((q @ k.T) * (1.0 / D ** 0.5), axis=-1)
        x = x + (att @ v) @ p["wo"]
        h = nn.rms_norm(x, p["g2"])
        x = x + nn.gelu(h @ p["w1"]) @ p["w2"]
    return x


def main():
    dev = fusec.default_device()  # device creation is not part of the measurement
    rng = np.random.default_rng(0)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    params = [{"g1": np.ones(D, np.float32), "wq": w(D, D), "wk": w(D, D), "wv": w(D, D),
               "wo": w(D, D), "g2": np.ones(D, np.float32), "w1": w(D, FF), "w2": w(FF, D)}
              for _ in range(LAYERS)]
    x = rng.standard_normal((SEQ, D)).astype(np.float32)
    before = fusec.cache_info()
    c0, t0 = time.process_time(), time.perf_counter()
    y = model(x, params)
    y.block_until_ready()
    t1, c1 = time.perf_counter(), time.process_time()
    d = fusec.cache_info() - before
    assert np.isfinite(np.asarray(y)).all()
    print(json.dumps({"seconds": t1 - t0, "cpu_seconds": c1 - c0, "lowerings": d.lowerings,
                      "disk_hits": d.disk_hits,
                      "pipelines": d.pipelines_compiled, "device": dev.adapter}))


main()
'''

KERNELS = '''
import sys

import numpy as np

import fusec
import fusec.numpy as fnp

OPS = [lambda a, y: a * y, lambda a, y: a + 0.5, lambda a, y: fnp.maximum(a, -1.0),
       lambda a, y: a - y, lambda a, y: fnp.tanh(a), lambda a, y: fnp.exp(a * -0.1)]


@fusec.gpu_jit(static_argnames=("n",))
def chain(x, y, n):
    v = x
    for i in range(n):
        v = OPS[i % len(OPS)](v, y)
    return v


SIGNATURES = [(n, shape) for n in (2, 3, 5, 8, 13) for shape in ((256,), (64, 33), (17, 9, 5),
                                                                   (1000,))]

if __name__ == "__main__":
    if sys.argv[1] == "record":
        for n, shape in SIGNATURES:
            chain(np.ones(shape, np.float32), np.ones(shape[-1:], np.float32), n=n)
    else:
        import json

        res = fusec.warmup_from(sys.argv[2], threads=int(sys.argv[3]), progress=False)
        print(json.dumps(res))
'''


def _env(cache: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("XDG_RUNTIME_DIR", "/tmp")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["FUSEC_CACHE_DIR"] = cache
    for k in ("FUSEC_RECORD_SIGNATURES", "FUSEC_LOG_COMPILES", "FUSEC_EXPLAIN_CACHE_MISSES",
              "FUSEC_DEBUG", "FUSEC_VERIFY"):
        env.pop(k, None)
    return env


def _child(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    p = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"child {args} failed:\n{p.stdout}\n{p.stderr}")
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def time_to_first_result(work: Path, runs: int, layers: int) -> None:
    script = work / "ttfr_child.py"
    script.write_text(CHILD)
    cold, warm = [], []
    warm_dir = work / "warm-cache"
    for i in range(runs):
        env = _env(str(work / f"cold-cache-{i}"))  # a fresh, empty directory per run
        env["BENCH_LAYERS"] = str(layers)
        r = _child([str(script)], env)
        assert r["lowerings"] == 1 and r["disk_hits"] == 0, r
        cold.append(r)
    env = _env(str(warm_dir))
    env["BENCH_LAYERS"] = str(layers)
    _child([str(script)], env)  # fill the warm directory
    for _ in range(runs):
        r = _child([str(script)], env)
        assert r["lowerings"] == 0 and r["disk_hits"] == 1, r
        warm.append(r)
    c = statistics.median(r["seconds"] for r in cold)
    w = statistics.median(r["seconds"] for r in warm)
    print(f"device: {cold[0]['device']}")
    print(f"time to first result, transformer-like block x{layers} "
          f"({cold[0]['pipelines']} pipelines), {runs} fresh processes each:")
    cold_ms = ", ".join(f"{1e3 * r['seconds']:.0f}" for r in cold)
    warm_ms = ", ".join(f"{1e3 * r['seconds']:.0f}" for r in warm)
    print(f"  empty cache: median {1e3 * c:8.1f} ms   runs (ms): {cold_ms}")
    print(f"  warm cache:  median {1e3 * w:8.1f} ms   runs (ms): {warm_ms}")
    print(f"  ratio empty/warm: {c / w:.2f}x  (saved {1e3 * (c - w):.1f} ms per process)")
    cc = statistics.median(r["cpu_seconds"] for r in cold)
    cw = statistics.median(r["cpu_seconds"] for r in warm)
    print(f"  process CPU time (less sensitive to other load): empty {1e3 * cc:.1f} ms, "
          f"warm {1e3 * cw:.1f} ms, ratio {cc / cw:.2f}x")


def warmup_threads(work: Path, threads: int, runs: int) -> None:
    script = work / "kernels.py"
    script.write_text(KERNELS)
    manifest = work / "kernels.jsonl"
    env = _env("off")
    env["FUSEC_RECORD_SIGNATURES"] = str(manifest)
    env["FUSEC_RETRACE_WARN"] = "0"  # 20 signatures of one function on purpose
    subprocess.run([sys.executable, str(script), "record"], env=env, check=True)
    env = _env("off")
    results: dict[int, list[dict[str, Any]]] = {1: [], threads: []}
    for _ in range(runs):
        for t in (1, threads):  # interleaved: drifts in machine load hit both alike
            results[t].append(_child([str(script), "replay", str(manifest), str(t)], env))
    first = results[1][0]
    print(f"warmup_from: {first['signatures']} signatures, {first['pipelines']} pipelines, "
          f"{runs} fresh processes each (cpu_count={os.cpu_count()}):")
    for t, rs in results.items():
        comp = statistics.median(r["compile_seconds"] for r in rs)
        tot = statistics.median(r["total_seconds"] for r in rs)
        print(f"  threads={t:<2}  pipeline compiles median {1e3 * comp:7.1f} ms, "
              f"total (trace + lower + compile) median {1e3 * tot:7.1f} ms")
    c1 = statistics.median(r["compile_seconds"] for r in results[1])
    cn = statistics.median(r["compile_seconds"] for r in results[threads])
    print(f"  compile speed-up with {threads} threads: {c1 / cn:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--skip-warmup", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fusec-bench-") as tmp:
        work = Path(tmp)
        time_to_first_result(work, args.runs, args.layers)
        if not args.skip_warmup:
            warmup_threads(work, max(2, args.threads), 3)


if __name__ == "__main__":
    main()
