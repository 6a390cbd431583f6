"""Data parallelism over the GPUs of one host: speed-ups against one device, and all_reduce's
bandwidth.

    python bench/multi_gpu.py [--devices 0,1] [--runs 10] [--small] [--out r.json]

Measures, wall clock, median of ``--runs`` after warm-up calls:
(a) forward: the bench transformer block (tests/export_cases.py: pre-norm attention and a GELU
    MLP, ``--layers`` layers, d 384, MLP 1536, 12 heads) on a batch of 64 x 128 tokens, on one
    device against the batch split over all of them (``fusec.shard``, weights replicated);
(b) train step: loss = mean squared error of the block's output against a target; the gradient
    by ``fusec.grad`` inside a jitted step per shard, ``fusec.all_reduce(grads, "mean")``, and a
    jitted SGD update on every device; against the same step on one device. Also the largest
    relative difference (per leaf, max |a - b| / max |b|) between the all-reduced gradients and
    the gradient of the whole batch on one device;
(c) all_reduce of a 64 MiB float32 array (sum over the devices, result on every device): GB/s
    counted as the array's bytes per second; and an ``Array.to`` copy of it between the first
    two devices.

Devices: ``--devices`` (indices into ``fusec.devices()``); by default every device that is not a
CPU (software) adapter, of the best backend among them (Vulkan/Metal, then D3D12, then OpenGL:
one GPU can be listed once per backend), or every device where all are CPU adapters. On one
device the speed-ups are 1.0 and there is no all_reduce to time. Prints one JSON object.
``--small`` runs a tiny configuration (2 layers of d 48 on 4 x 16 tokens, a 1 MiB all_reduce)
to check the script on a software adapter.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_cases import block_weights, transformer  # noqa: E402  (the tests' block)
from timing import median_wall, report  # noqa: E402

import fusec  # noqa: E402
import fusec.numpy as fnp  # noqa: E402
from fusec import tree_util  # noqa: E402

_BACKEND_RANK = {"Vulkan": 0, "Metal": 0, "D3D12": 1, "OpenGL": 2}


def choose_devices(spec: str) -> list[fusec.DeviceInfo]:
    """The devices named by ``spec`` ("0,1"), or the default choice (see the module doc)."""
    devs = fusec.devices()
    if not devs:
        raise SystemExit("multi_gpu: fusec.devices() lists no device (no wgpu adapter)")
    if spec:
        try:
            idx = [int(s) for s in spec.split(",") if s.strip()]
        except ValueError:
            raise SystemExit(f"multi_gpu: --devices takes indices like 0,1; got {spec!r}") from None
        bad = [i for i in idx if not 0 <= i < len(devs)]
        if bad or not idx or len(set(idx)) != len(idx):
            raise SystemExit(f"multi_gpu: --devices {spec!r}: give distinct indices of "
                             f"fusec.devices() (0 to {len(devs) - 1})")
        return [devs[i] for i in idx]
    gpus = [d for d in devs if d.adapter_type != "CPU"]
    if not gpus:
        return devs
    best = min(_BACKEND_RANK.get(d.backend, 3) for d in gpus)
    return [d for d in gpus if _BACKEND_RANK.get(d.backend, 3) == best]


def rel_diff(a: Any, b: Any) -> float:
    """max |a - b| / max |b| over the leaves of two pytrees (b the reference)."""
    worst = 0.0
    for x, y in zip(tree_util.tree_leaves(a), tree_util.tree_leaves(b)):
        x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
        worst = max(worst, float(np.abs(x64 - y64).max() / max(np.abs(y64).max(), 1e-30)))
    return worst


def ready(tree: Any) -> None:
    for leaf in tree_util.tree_leaves(tree):
        leaf.block_until_ready()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", default="", help="indices into fusec.devices(), e.g. 0,1")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--small", action="store_true", help="a tiny configuration (a smoke test)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    if a.small:
        d, ff, heads, batch, seq, reduce_mib = 48, 96, 4, 4, 16, 1
    else:
        d, ff, heads, batch, seq, reduce_mib = 384, 1536, 12, 64, 128, 64
    devs = choose_devices(a.devices)
    n = len(devs)
    first = devs[0]
    res: dict[str, Any] = {
        "devices": [{"index": v.index, "name": v.name, "backend": v.backend,
                     "type": v.adapter_type} for v in devs],
        "n_devices": n,
        "config": {"d": d, "ff": ff, "heads": heads, "layers": a.layers, "batch": batch,
                   "tokens": seq, "runs": a.runs},
    }
    rng = np.random.default_rng(0)
    ws = block_weights(rng, d=d, ff=ff, layers=a.layers)
    x = rng.standard_normal((batch, seq, d)).astype(np.float32)
    y = rng.standard_normal((batch, seq, d)).astype(np.float32)

    # (a) forward
    fwd = fusec.gpu_jit(lambda ws, x: transformer(fnp, ws, x, heads=heads))
    ws1 = tree_util.tree_map(lambda w: fusec.device_put(w, first), ws)
    x1 = fusec.device_put(x, first)
    t0 = time.perf_counter()
    out1 = fwd(ws1, x1).block_until_ready()
    compile1 = time.perf_counter() - t0
    t_one = median_wall(lambda: fwd(ws1, x1).block_until_ready(), a.runs)
    fw: dict[str, Any] = {"one_device_ms": 1e3 * t_one, "first_call_s": compile1}
    if n > 1:
        wsr = tree_util.tree_map(lambda w: fusec.replicate(w, devs), ws)
        xs = fusec.shard(x, devs)
        t0 = time.perf_counter()
        outn = fwd(wsr, xs).block_until_ready()
        fw["first_call_all_devices_s"] = time.perf_counter() - t0
        t_all = median_wall(lambda: fwd(wsr, xs).block_until_ready(), a.runs)
        fw.update(all_devices_ms=1e3 * t_all, speedup=t_one / t_all,
                  max_rel_diff_vs_one_device=rel_diff(outn, out1))
    else:
        fw.update(all_devices_ms=1e3 * t_one, speedup=1.0)
    res["forward"] = fw

    # (b) a training step
    rows = [len(p) for p in np.array_split(np.arange(batch), n)]

    def loss(ws: Any, x: Any, y: Any, scale: Any) -> Any:
        # scale: rows of this shard * devices / batch, so that the mean over the devices of the
        # shards' losses is the whole batch's mean (1.0 where the batch splits evenly)
        return fnp.mean((transformer(fnp, ws, x, heads=heads) - y) ** 2) * scale[0]

    grad_step = fusec.gpu_jit(fusec.grad(loss))
    sgd = fusec.gpu_jit(lambda ws, g: tree_util.tree_map(lambda w, gw: w - 1e-3 * gw, ws, g))
    y1 = fusec.device_put(y, first)
    one = np.ones(1, np.float32)
    g1 = grad_step(ws1, x1, y1, one)
    state1 = {"ws": ws1}

    def step_one() -> None:
        g = grad_step(state1["ws"], x1, y1, one)
        state1["ws"] = sgd(state1["ws"], g)
        ready(state1["ws"])

    t0 = time.perf_counter()
    step_one()
    tr: dict[str, Any] = {"first_step_s": time.perf_counter() - t0}
    t_one = median_wall(step_one, a.runs)
    tr["one_device_ms"] = 1e3 * t_one
    if n > 1:
        xs, ys = fusec.shard(x, devs), fusec.shard(y, devs)
        scale = fusec.shard(np.array([r * n / batch for r in rows], np.float32), devs)
        gn = fusec.all_reduce(grad_step(wsr, xs, ys, scale), "mean")
        tr["grad_max_rel_diff_vs_one_device"] = rel_diff(
            tree_util.tree_map(lambda s: s.shards[0], gn), g1)
        staten = {"ws": wsr}

        def step_all() -> None:
            g = fusec.all_reduce(grad_step(staten["ws"], xs, ys, scale), "mean")
            staten["ws"] = sgd(staten["ws"], g)
            ready(staten["ws"])

        t0 = time.perf_counter()
        step_all()
        tr["first_step_all_devices_s"] = time.perf_counter() - t0
        t_all = median_wall(step_all, a.runs)
        tr.update(all_devices_ms=1e3 * t_all, speedup=t_one / t_all)
        # the all_reduce's share of a step: the gradients' bytes and their all_reduce alone
        gsh = grad_step(staten["ws"], xs, ys, scale)
        ready(gsh)
        tr["grad_bytes"] = sum(leaf.shards[0].nbytes for leaf in tree_util.tree_leaves(gsh))
        tr["all_reduce_ms"] = 1e3 * median_wall(lambda: ready(fusec.all_reduce(gsh, "mean")),
                                             a.runs)
    else:
        tr.update(all_devices_ms=1e3 * t_one, speedup=1.0, grad_max_rel_diff_vs_one_device=0.0)
    res["train_step"] = tr

    # (c) all_reduce bandwidth
    nbytes = reduce_mib << 20
    big = rng.standard_normal(nbytes // 4).astype(np.float32)
    ar: dict[str, Any] = {"bytes": nbytes}
    if n > 1:
        rep = fusec.replicate(big, devs)
        ready(rep)
        t = median_wall(lambda: ready(fusec.all_reduce(rep, "sum")), max(3, a.runs // 2))
        check = fusec.all_reduce(rep, "sum")
        ok = all(np.array_equal(np.asarray(s), big * n) for s in check.shards) if n == 2 else \
            all(np.allclose(np.asarray(s), big * n, rtol=1e-6) for s in check.shards)
        ar.update(ms=1e3 * t, gbps=nbytes / t / 1e9, correct=bool(ok),
                  note="GB/s: the array's bytes per second; each device reads its shard back "
                       "and receives the result (2 x bytes per device through the host)")
        src = fusec.device_put(big, first)
        src.block_until_ready()
        t = median_wall(lambda: src.to(devs[1]).block_until_ready(), max(3, a.runs // 2))
        res["copy"] = {"bytes": nbytes, "from": first.index, "to": devs[1].index, "ms": 1e3 * t,
                       "gbps": nbytes / t / 1e9}
    else:
        ar.update(ms=None, gbps=None, note="one device: nothing to reduce")
    res["all_reduce"] = ar
    report(res, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
