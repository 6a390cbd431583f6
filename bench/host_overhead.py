"""Host overhead of a cached call on device-resident inputs, against a hand-written wgpu-py
encode-and-submit of the same kernels (same pipelines, bind groups made once, one encoder, one
compute pass, one submit): the best a Python caller can do with wgpu-py.

    python bench/host_overhead.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import fusec  # noqa: E402
import fusec.numpy as fnp  # noqa: E402
from fusec import nn  # noqa: E402
from fusec.runtime import GpuExecutable, get_runtime  # noqa: E402


def per_call(fns: list[Callable[[], Any]], calls: int = 4000,
             sync_every: int = 200) -> list[float]:
    """Median time per call of each of ``fns``, measured in interleaved blocks (A B A B ...) so
    that a noisy neighbour slows all of them alike; the queue is drained between blocks."""
    rt = get_runtime()
    assert rt is not None
    for fn in fns:
        for _ in range(50):
            fn()
    rt.sync()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(calls // sync_every):
        for fn, ts in zip(fns, times):
            t = time.perf_counter()
            for _ in range(sync_every):
                fn()
            ts.append((time.perf_counter() - t) / sync_every)
            rt.sync()
    return [statistics.median(ts) for ts in times]


def hand_written(f: Any, args: tuple[Any, ...]) -> Callable[[], None]:
    """The same kernels submitted by hand: pipelines and bind groups prepared once."""
    rt = get_runtime()
    assert rt is not None
    compiled = f.warmup(*args)
    exe: GpuExecutable = compiled.executable
    dev = rt.device
    bufs: dict[int, Any] = {}
    for i, a in enumerate(args):
        bufs[i] = a.device_buffer(rt)
    launches = []
    for st in exe.steps:
        if not hasattr(st, "pipeline"):
            bufs[st.dst] = bufs[st.src]
            continue
        for w in st.writes:
            bufs[w] = rt.buffer(exe.var_of[w].nbytes)
        entries = [{"binding": i, "resource": {"buffer": bufs[s].raw, "offset": 0,
                                               "size": bufs[s].size}}
                   for i, s in enumerate(st.reads + st.writes)]
        bg = dev.create_bind_group(layout=st.layout, entries=entries)
        launches.append((st.pipeline, bg, st.grid))

    def run() -> None:
        enc = dev.create_command_encoder()
        cpass = enc.begin_compute_pass()
        for pipe, bg, grid in launches:
            cpass.set_pipeline(pipe)
            cpass.set_bind_group(0, bg)
            cpass.dispatch_workgroups(*grid)
        cpass.end()
        dev.queue.submit([enc.finish()])

    return run


def main() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    x = fusec.device_put(rng.standard_normal((16, 16)).astype(np.float32))
    w = fusec.device_put(rng.standard_normal((16, 16)).astype(np.float32))
    cases = [
        ("1 kernel: x * w + 1", lambda a, b: a * b + 1.0),
        ("1 kernel: softmax", lambda a, b: nn.softmax(a * b)),
        ("3 kernels: matmul, softmax, matmul", lambda a, b: nn.softmax(a @ b) @ b),
        ("5 kernels, unfused chain", fusec.gpu_jit(lambda a, b: fnp.tanh(a * b + 1.0) - b,
                                                  fuse=False).fun),
    ]
    out = {}
    print(f"device: {fusec.default_device()}")
    for name, fn in cases:
        fuse = not name.startswith("5 kernels")
        f = fusec.gpu_jit(fn, fuse=fuse)
        f(x, w).block_until_ready()
        t_fusec, t_hand = per_call([lambda: f(x, w), hand_written(f, (x, w))])
        out[name] = {"fusec_us": t_fusec * 1e6, "hand_us": t_hand * 1e6,
                     "ratio": t_fusec / t_hand, "kernels": len(f.lower(x, w).kernels)}
        print(f"{name:38s} fusec {t_fusec * 1e6:7.1f} us   hand-written {t_hand * 1e6:7.1f} us"
              f"   ratio {t_fusec / t_hand:5.2f}")
    return out


if __name__ == "__main__":
    main()
