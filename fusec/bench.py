"""The benchmark suite behind ``fusec bench``: fused vs ``fuse=False`` vs numpy vs PyTorch vs JAX.

    fusec bench [--quick] [--out DIR] [--only softmax,chain2] [--no-torch] [--no-torch-compile]
                [--no-jax]

Each workload is written once, against a small namespace of ops (``B``) that has a fusec, a numpy,
a PyTorch and a JAX form, so they all run the same computation. For each workload, in one process:

- **fusec fused** and **fusec unfused** (``fuse=False``: one kernel per op, same single submit):
  the GPU time of the call's compute pass from timestamp queries when the adapter offers
  ``timestamp-query``, wall clock of call + ``block_until_ready`` otherwise;
- **numpy** on the CPU (wall clock; skipped in the full set above ``NUMPY_MAX_FLOPS``);
- **PyTorch eager** and **torch.compile** when ``import torch`` works and CUDA is available
  (CUDA events; TF32 off; 'n/a' with the reason when either fails);
- **JAX** ``jax.jit`` when ``import jax`` works, on whatever platform JAX picks (GPU or CPU: the
  report says which; ``highest`` matmul precision). JAX has no GPU timestamps: it is timed by wall
  clock only.

Beside the GPU times, the wall clock of every device implementation: call + wait for the result
(fusec and JAX: ``block_until_ready``; torch: ``torch.cuda.synchronize``), inputs already on the
device, no readback: what a caller waits per call, host overhead included. Every time is the
median of repeats after warm-up. The run also measures the device-to-device copy
bandwidth (``torch`` copy when available, always fusec's one-read-one-write kernel ``-x``) and, with
torch, the cuBLAS float32 matmul rate, so each result is also a fraction of a roof: bytes of the
fused plan (``cost_analysis``) / time against the copy bandwidth for memory-bound workloads, flops /
time against cuBLAS for compute-bound ones. The report: ``DIR/report.md``, ``DIR/results.json`` and,
when matplotlib is installed, ``DIR/times.png``, ``DIR/wall.png`` and ``DIR/fraction.png``.
"""

from __future__ import annotations

import datetime as _dt
import functools
import gc
import importlib
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

import fusec

from . import nn
from . import numpy as fnp
from .errors import FusecError
from .runtime import get_runtime

SCHEMA_VERSION = 2  # 2: wall clock of every device column, and JAX
RATIO_SLACK = 0.001  # a speed-up this close below the bytes ratio counts as reaching it
NUMPY_MAX_FLOPS = 1e10  # full set: numpy runs only below this (a 4096^3 matmul takes minutes)


def _torch() -> Any:
    """PyTorch, imported on demand (an optional reference; ImportError when absent)."""
    return importlib.import_module("torch")


def _jax() -> Any:
    """JAX, imported on demand (an optional reference; ImportError when absent)."""
    # XLA takes 75% of the GPU's memory at its first allocation unless told not to; fusec and
    # torch share the GPU in this process. The user's own setting wins.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return importlib.import_module("jax")


# --- the ops each workload is written against -----------------------------------------------------


class FusecOps:
    """``B`` for fusec: :mod:`fusec.numpy` and :mod:`fusec.nn`, traced inside ``gpu_jit``."""

    name = "fusec"
    tanh = staticmethod(fnp.tanh)
    maximum = staticmethod(fnp.maximum)
    relu = staticmethod(nn.relu)
    silu = staticmethod(nn.silu)

    @staticmethod
    def gelu(x: Any) -> Any:
        return nn.gelu(x, approximate="tanh")

    @staticmethod
    def softmax(x: Any) -> Any:
        return nn.softmax(x, axis=-1)

    @staticmethod
    def layer_norm(x: Any, w: Any, b: Any) -> Any:
        return nn.layer_norm(x, w, b, eps=1e-5)

    @staticmethod
    def rms_norm(x: Any, w: Any) -> Any:
        return nn.rms_norm(x, w, eps=1e-6)

    @staticmethod
    def split_heads(x: Any, heads: int, transposed: bool = False) -> Any:
        """(s, d) -> (heads, s, d/heads), or (heads, d/heads, s) when ``transposed``."""
        s, d = x.shape
        return fnp.transpose(fnp.reshape(x, (s, heads, d // heads)),
                             (1, 2, 0) if transposed else (1, 0, 2))

    @staticmethod
    def merge_heads(o: Any) -> Any:
        h, s, dh = o.shape
        return fnp.reshape(fnp.transpose(o, (1, 0, 2)), (s, h * dh))


    # the array-language workloads
    @staticmethod
    def take_rows(table: Any, ids: Any) -> Any:
        return fnp.take(table, ids, axis=0)

    @staticmethod
    def cumsum(x: Any) -> Any:
        return fnp.cumsum(x)

    @staticmethod
    def argmax_rows(x: Any) -> Any:
        return fnp.argmax(x, axis=-1)

    @staticmethod
    def sort(x: Any) -> Any:
        return fnp.sort(x)


class NumpyOps:
    """``B`` for numpy on the CPU (float32 throughout: Python scalars do not promote)."""

    name = "numpy"

    @staticmethod
    def take_rows(table: Any, ids: Any) -> Any:
        return np.take(table, ids, axis=0)

    @staticmethod
    def cumsum(x: Any) -> Any:
        return np.cumsum(x, dtype=np.float32)

    @staticmethod
    def argmax_rows(x: Any) -> Any:
        return np.argmax(x, axis=-1).astype(np.int32)

    @staticmethod
    def sort(x: Any) -> Any:
        return np.sort(x)

    @staticmethod
    def tanh(x: Any) -> Any:
        return np.tanh(x)

    @staticmethod
    def maximum(x: Any, c: float) -> Any:
        return np.maximum(x, np.float32(c))

    @staticmethod
    def relu(x: Any) -> Any:
        return np.maximum(x, np.float32(0))

    @staticmethod
    def gelu(x: Any) -> Any:
        c = np.float32(math.sqrt(2.0 / math.pi))
        return np.float32(0.5) * x * (np.float32(1) + np.tanh(c * (x + np.float32(0.044715) * x
                                                                     * x * x)))

    @staticmethod
    def silu(x: Any) -> Any:
        return x / (np.float32(1) + np.exp(-x))

    @staticmethod
    def softmax(x: Any) -> Any:
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    @staticmethod
    def layer_norm(x: Any, w: Any, b: Any) -> Any:
        d = x - x.mean(axis=-1, keepdims=True)
        var = (d * d).mean(axis=-1, keepdims=True)
        return d / np.sqrt(var + np.float32(1e-5)) * w + b

    @staticmethod
    def rms_norm(x: Any, w: Any) -> Any:
        ms = (x * x).mean(axis=-1, keepdims=True)
        return x / np.sqrt(ms + np.float32(1e-6)) * w

    @staticmethod
    def split_heads(x: Any, heads: int, transposed: bool = False) -> Any:
        s, d = x.shape
        return x.reshape(s, heads, d // heads).transpose((1, 2, 0) if transposed else (1, 0, 2))

    @staticmethod
    def merge_heads(o: Any) -> Any:
        h, s, dh = o.shape
        return o.transpose(1, 0, 2).reshape(s, h * dh)


class TorchOps:
    """``B`` for PyTorch on CUDA (its fused library functions where it has them). An instance
    holds the modules, so that ``torch.compile`` traces plain attribute lookups, not imports."""

    name = "torch"

    def __init__(self) -> None:
        self.torch = _torch()
        self.F = importlib.import_module("torch.nn.functional")

    def tanh(self, x: Any) -> Any:
        return self.torch.tanh(x)

    def maximum(self, x: Any, c: float) -> Any:
        return self.torch.clamp_min(x, c)

    def relu(self, x: Any) -> Any:
        return self.torch.relu(x)

    def gelu(self, x: Any) -> Any:
        return self.F.gelu(x, approximate="tanh")

    def silu(self, x: Any) -> Any:
        return self.F.silu(x)

    def softmax(self, x: Any) -> Any:
        return self.torch.softmax(x, dim=-1)

    def layer_norm(self, x: Any, w: Any, b: Any) -> Any:
        return self.F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)

    def rms_norm(self, x: Any, w: Any) -> Any:
        if hasattr(self.F, "rms_norm"):  # torch >= 2.4
            return self.F.rms_norm(x, (x.shape[-1],), w, eps=1e-6)
        return x * self.torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w

    def split_heads(self, x: Any, heads: int, transposed: bool = False) -> Any:
        s, d = x.shape
        v = x.view(s, heads, d // heads)
        return v.permute(1, 2, 0) if transposed else v.permute(1, 0, 2)

    def merge_heads(self, o: Any) -> Any:
        h, s, dh = o.shape
        return o.permute(1, 0, 2).reshape(s, h * dh)

    def take_rows(self, table: Any, ids: Any) -> Any:
        return self.torch.index_select(table, 0, ids)

    def cumsum(self, x: Any) -> Any:
        return self.torch.cumsum(x, 0)

    def argmax_rows(self, x: Any) -> Any:
        return self.torch.argmax(x, dim=-1)

    def sort(self, x: Any) -> Any:
        return self.torch.sort(x).values


class JaxOps:
    """``B`` for JAX (``jax.numpy`` and ``jax.nn``), traced inside ``jax.jit``. The formulas and
    constants are fusec's: tanh-approximated gelu, layer_norm's eps 1e-5, rms_norm's 1e-6."""

    name = "jax"

    def __init__(self) -> None:
        jax = _jax()
        self.jnp = jax.numpy
        self.jnn = jax.nn
        self.lax = jax.lax

    def tanh(self, x: Any) -> Any:
        return self.jnp.tanh(x)

    def maximum(self, x: Any, c: float) -> Any:
        return self.jnp.maximum(x, c)  # a Python float is weakly typed: float32 stays float32

    def relu(self, x: Any) -> Any:
        return self.jnn.relu(x)

    def gelu(self, x: Any) -> Any:
        return self.jnn.gelu(x, approximate=True)

    def silu(self, x: Any) -> Any:
        return self.jnn.silu(x)

    def softmax(self, x: Any) -> Any:
        return self.jnn.softmax(x, axis=-1)

    def layer_norm(self, x: Any, w: Any, b: Any) -> Any:
        d = x - self.jnp.mean(x, axis=-1, keepdims=True)
        var = self.jnp.mean(d * d, axis=-1, keepdims=True)
        return d * self.lax.rsqrt(var + 1e-5) * w + b

    def rms_norm(self, x: Any, w: Any) -> Any:
        ms = self.jnp.mean(x * x, axis=-1, keepdims=True)
        return x * self.lax.rsqrt(ms + 1e-6) * w

    def split_heads(self, x: Any, heads: int, transposed: bool = False) -> Any:
        s, d = x.shape
        return self.jnp.transpose(self.jnp.reshape(x, (s, heads, d // heads)),
                                  (1, 2, 0) if transposed else (1, 0, 2))

    def merge_heads(self, o: Any) -> Any:
        h, s, dh = o.shape
        return self.jnp.reshape(self.jnp.transpose(o, (1, 0, 2)), (s, h * dh))

    def take_rows(self, table: Any, ids: Any) -> Any:
        return self.jnp.take(table, ids, axis=0)

    def cumsum(self, x: Any) -> Any:
        return self.jnp.cumsum(x)

    def argmax_rows(self, x: Any) -> Any:
        return self.jnp.argmax(x, axis=-1)

    def sort(self, x: Any) -> Any:
        return self.jnp.sort(x)


# --- the workloads --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Input:
    """A float32 input: standard normal * ``scale`` + ``offset``; or, with ``high`` > 0, int32
    indices drawn uniformly from [0, high)."""

    shape: tuple[int, ...]
    scale: float = 1.0
    offset: float = 0.0
    high: int = 0


@dataclass(frozen=True)
class Workload:
    """One benchmark: ``fn(B, *arrays)`` written against an ops namespace ``B``.

    ``bound`` names the roof the fused time is compared with: "memory" (bytes of the fused plan /
    time against the measured copy bandwidth) or "compute" (flops / time against cuBLAS).
    """

    name: str
    group: str  # elementwise | reduction | matmul | block | language
    bound: str  # memory | compute
    fn: Callable[..., Any]
    inputs: tuple[Input, ...]
    size: str  # how big, for the report
    # bytes the operation must move at least (a gather reads only the rows it takes, not the
    # table): used for the fraction of the copy roof in place of the fused plan's buffer sizes
    useful_bytes: Optional[int] = None

    def bind(self, ops: Any) -> Callable[..., Any]:
        """The workload as a plain function of its arrays, for one ops namespace."""
        fn = self.fn

        def run(*arrays: Any) -> Any:
            return fn(ops, *arrays)

        run.__name__ = run.__qualname__ = self.name.replace("-", "_")
        return run

    def make_inputs(self, rng: np.random.Generator) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for spec in self.inputs:
            if spec.high:
                out.append(rng.integers(0, spec.high, spec.shape, dtype=np.int32))
                continue
            a = rng.standard_normal(spec.shape, dtype=np.float32)
            if spec.scale != 1.0:
                a *= np.float32(spec.scale)
            if spec.offset:
                a += np.float32(spec.offset)
            out.append(a)
        return out


_CHAIN_STEPS: tuple[Callable[[Any, Any, Any], Any], ...] = (
    lambda B, a, y: a * y,
    lambda B, a, y: a + 0.5,
    lambda B, a, y: B.maximum(a, -1.0),
    lambda B, a, y: a - y,
    lambda B, a, y: B.tanh(a),
)


def _chain(n_ops: int, B: Any, x: Any, y: Any) -> Any:
    """``n_ops`` elementwise ops cycling through multiply, add, maximum, subtract and tanh."""
    v = x
    for i in range(n_ops):
        v = _CHAIN_STEPS[i % len(_CHAIN_STEPS)](B, v, y)
    return v


def _softmax(B: Any, x: Any) -> Any:
    return B.softmax(x)


def _layer_norm(B: Any, x: Any, w: Any, b: Any) -> Any:
    return B.layer_norm(x, w, b)


def _rms_norm(B: Any, x: Any, w: Any) -> Any:
    return B.rms_norm(x, w)


def _matmul(B: Any, a: Any, b: Any) -> Any:
    return a @ b


def _matmul_bias_gelu(B: Any, a: Any, b: Any, bias: Any) -> Any:
    return B.gelu(a @ b + bias)


def _mlp(B: Any, x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
    return B.relu(x @ w1 + b1) @ w2 + b2


def _transformer(heads: int, B: Any, x: Any, g1: Any, wq: Any, wk: Any, wv: Any, wo: Any,
                 g2: Any, w_gate: Any, w_up: Any, w_down: Any) -> Any:
    """Pre-norm block: rms_norm, multi-head attention (no mask), residual; rms_norm, SwiGLU MLP,
    residual."""
    d = x.shape[-1]
    h = B.rms_norm(x, g1)
    q = B.split_heads(h @ wq, heads)
    k_t = B.split_heads(h @ wk, heads, transposed=True)
    v = B.split_heads(h @ wv, heads)
    p = B.softmax((q @ k_t) * (1.0 / math.sqrt(d // heads)))
    x = x + B.merge_heads(p @ v) @ wo
    h = B.rms_norm(x, g2)
    return x + (B.silu(h @ w_gate) * (h @ w_up)) @ w_down


def _w(fan_in: int, *shape: int) -> Input:
    return Input(tuple(shape), scale=1.0 / math.sqrt(fan_in))


def workloads(quick: bool) -> list[Workload]:
    """The fixed workload set: ``quick`` sizes finish on lavapipe in about a minute; the full
    sizes are for real GPUs."""
    # quick: inputs as large as the quick copy measurement (2^22 floats), so that neither sits in
    # a CPU cache the other does not
    n = 1 << (22 if quick else 26)
    rows, cols = (2048, 2048) if quick else (8192, 8192)
    sq = 256 if quick else 4096
    k_sk, m_sk = (1024, 8) if quick else (4096, 8)
    m_mlp, d_mlp, h_mlp = (256, 256, 1024) if quick else (4096, 1024, 4096)
    s_tf, d_tf, heads, f_tf = (128, 256, 4, 704) if quick else (2048, 1024, 8, 2816)

    ws: list[Workload] = []
    for k in (2, 4, 8, 16):
        ws.append(Workload(f"chain{k}", "elementwise", "memory", functools.partial(_chain, k),
                           (Input((n,)), Input((n,))), f"{n:,} ({k} ops)"))
    vec = Input((cols,), scale=0.1, offset=1.0)
    ws += [
        Workload("softmax", "reduction", "memory", _softmax, (Input((rows, cols)),),
                 f"{rows}x{cols}"),
        Workload("layer_norm", "reduction", "memory", _layer_norm,
                 (Input((rows, cols)), vec, Input((cols,), scale=0.1)), f"{rows}x{cols}"),
        Workload("rms_norm", "reduction", "memory", _rms_norm, (Input((rows, cols)), vec),
                 f"{rows}x{cols}"),
    ]
    shapes = [("square", "compute", sq, sq, sq), ("skinny_m", "memory", m_sk, k_sk, k_sk),
              ("skinny_n", "memory", k_sk, k_sk, m_sk)]
    for tag, bound, m, k, nn_ in shapes:
        a, b = Input((m, k)), _w(k, k, nn_)
        size = f"{m}x{k}x{nn_}"
        ws.append(Workload(f"matmul_{tag}", "matmul", bound, _matmul, (a, b), size))
        ws.append(Workload(f"matmul_{tag}_bias_gelu", "matmul", bound, _matmul_bias_gelu,
                           (a, b, Input((nn_,), scale=0.1)), size))
    ws.append(Workload(
        "mlp", "block", "compute", _mlp,
        (Input((m_mlp, d_mlp)), _w(d_mlp, d_mlp, h_mlp), Input((h_mlp,), scale=0.1),
         _w(h_mlp, h_mlp, d_mlp), Input((d_mlp,), scale=0.1)),
        f"{m_mlp}x{d_mlp}, hidden {h_mlp}"))
    g = Input((d_tf,), scale=0.1, offset=1.0)
    ws.append(Workload(
        "transformer", "block", "compute", functools.partial(_transformer, heads),
        (Input((s_tf, d_tf)), g, _w(d_tf, d_tf, d_tf), _w(d_tf, d_tf, d_tf),
         _w(d_tf, d_tf, d_tf), _w(d_tf, d_tf, d_tf), g, _w(d_tf, d_tf, f_tf),
         _w(d_tf, d_tf, f_tf), _w(f_tf, f_tf, d_tf)),
        f"seq {s_tf}, d {d_tf}, {heads} heads, ffn {f_tf}"))
    # the array language: a gather, a scan, a search reduction and a sort
    vocab, dim, taken = (5000, 256, 1024) if quick else (50257, 768, 4096)
    ws.append(Workload(
        "gather", "language", "memory", lambda B, t, i: B.take_rows(t, i),
        (Input((vocab, dim)), Input((taken,), high=vocab)),
        f"{taken} rows of {vocab}x{dim}", useful_bytes=2 * 4 * taken * dim + 4 * taken))
    ws.append(Workload("cumsum", "language", "memory", lambda B, x: B.cumsum(x),
                       (Input((n,)),), f"{n:,}", useful_bytes=8 * n))
    ws.append(Workload("argmax", "language", "memory", lambda B, x: B.argmax_rows(x),
                       (Input((rows, cols)),), f"{rows}x{cols} rows",
                       useful_bytes=4 * rows * cols + 4 * rows))
    n_sort = 1 << (20 if quick else 24)
    ws.append(Workload("sort", "language", "memory", lambda B, x: B.sort(x), (Input((n_sort,)),),
                       f"{n_sort:,}", useful_bytes=8 * n_sort))
    return ws


def workload_names() -> list[str]:
    return [w.name for w in workloads(quick=True)]


def select(ws: Sequence[Workload], only: Optional[Sequence[str]]) -> list[Workload]:
    """The workloads named in ``only`` (all when empty), in suite order; unknown names raise."""
    if not only:
        return list(ws)
    names = {w.name for w in ws}
    unknown = [o for o in only if o not in names]
    if unknown:
        raise ValueError(f"unknown workload(s) {', '.join(unknown)}; "
                         f"known: {', '.join(w.name for w in ws)}")
    return [w for w in ws if w.name in set(only)]


# --- timing ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """How long to time: ``warmup`` calls, then at least ``min_reps`` and at most ``max_reps``
    timed calls, stopping early once ``budget_s`` seconds of measured time have passed."""

    warmup: int = 2
    min_reps: int = 5
    max_reps: int = 30
    budget_s: float = 2.0
    # GPU timings first keep the GPU busy this long (see _heat)
    heat_s: float = 0.3
    # fusec's and JAX's wall clocks are measured in turn this many times (see interleaved_walls)
    wall_rounds: int = 5


QUICK_POLICY = Policy(warmup=1, min_reps=5, max_reps=10, budget_s=0.5, heat_s=0.05, wall_rounds=1)


def _heat(fn: Callable[[], Any], sync: Callable[[], Any], seconds: float) -> None:
    """Back-to-back calls for ``seconds``. An idle GPU runs at a low clock and clocks up only
    under continuous load, which a loop of timed calls, each waited for, is not: on the H200 an
    8-op elementwise chain timed straight after idle took 656 µs, and 225 µs after this."""
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            fn()
        sync()
FULL_POLICY = Policy()


def _median_of(once: Callable[[], float], policy: Policy) -> dict[str, Any]:
    """Run ``once`` (it returns the seconds it measured) after warm-up; median and spread."""
    for _ in range(policy.warmup):
        once()
    ts: list[float] = []
    start = time.perf_counter()
    while len(ts) < policy.max_reps:
        ts.append(once())
        if len(ts) >= policy.min_reps and time.perf_counter() - start > policy.budget_s:
            break
    return {"time_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "reps": len(ts)}


def wall_time(fn: Callable[[], Any], policy: Policy) -> dict[str, Any]:
    def once() -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    return _median_of(once, policy)


def has_timestamps() -> bool:
    rt = get_runtime()
    return rt is not None and "timestamp-query" in rt.info.features


def fusec_time(f: Any, args: Sequence[Any], policy: Policy) -> dict[str, Any]:
    """GPU time of ``f(*args)``'s compute pass from timestamp queries (``method`` "gpu
    timestamps"), or wall clock of call + ``block_until_ready`` without them."""
    rt = get_runtime()
    if rt is None or not has_timestamps():
        res = wall_time(lambda: f(*args).block_until_ready(), policy)
        res["method"] = "wall clock"
        return res
    _heat(lambda: f(*args), rt.sync, policy.heat_s)
    rt.profile = True
    try:
        def once() -> float:
            f(*args)
            ns = rt.last_gpu_ns()
            assert ns is not None, "profile mode recorded no timestamps"
            return ns / 1e9

        res = _median_of(once, policy)
    finally:
        rt.profile = False
    res["method"] = "gpu timestamps"
    return res


def torch_cuda_time(fn: Callable[[], Any], policy: Policy) -> dict[str, Any]:
    """CUDA-event time of ``fn()`` on the current stream."""
    torch = _torch()

    def once() -> float:
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        return float(a.elapsed_time(b)) / 1e3

    _heat(fn, torch.cuda.synchronize, policy.heat_s)
    torch.cuda.synchronize()
    res = _median_of(once, policy)
    res["method"] = "cuda events"
    return res


# Kept for bench/gpu_report.py and bench/diagnose.py (their earlier names).
def median_time(fn: Callable[[], Any], repeats: int = 10, warmup: int = 2) -> float:
    return float(wall_time(fn, Policy(warmup, repeats, repeats, 0.0))["time_s"])


def gpu_time(f: Any, args: tuple[Any, ...], repeats: int = 10) -> float:
    return float(fusec_time(f, args, Policy(1, repeats, repeats, 0.0))["time_s"])


def torch_time(fn: Callable[[], Any], repeats: int = 20) -> Optional[float]:
    try:
        _torch()
    except ImportError:
        return None
    return float(torch_cuda_time(fn, Policy(3, repeats, repeats, 0.0))["time_s"])


def torch_status() -> tuple[bool, str]:
    """(usable, why): PyTorch imports and sees a CUDA device."""
    try:
        torch = _torch()
    except Exception as exc:  # not installed, or a broken install
        return False, f"torch not importable ({type(exc).__name__})"
    try:
        if not torch.cuda.is_available():
            return False, f"torch {torch.__version__}: no CUDA device"
        return True, f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}"
    except Exception as exc:
        return False, f"torch CUDA unusable: {exc}"


def jax_status() -> tuple[Optional[str], str]:
    """(platform, why): the platform JAX runs on ("gpu", "cpu", ...), None when it does not
    import or start. JAX on the CPU counts: the report names the platform."""
    try:
        jax = _jax()
        dev = jax.devices()[0]
        platform_ = str(jax.default_backend())
    except Exception as exc:  # not installed, a broken install, or no backend starts
        return None, f"jax not usable ({_err_text(exc)})"
    kind = str(dev.device_kind)
    return platform_, (f"jax {jax.__version__}, platform {platform_}"
                       + (f" ({kind})" if kind != platform_ else ""))


# --- one run --------------------------------------------------------------------------------------


@dataclass
class Options:
    quick: bool = False
    out: Path = Path("bench-out")
    only: Optional[list[str]] = None
    torch: bool = True
    torch_compile: bool = True
    jax: bool = True
    llm: bool = False  # also SmolLM2-135M's decode and prefill tokens/s (llm_section)
    policy: Optional[Policy] = None
    seed: int = 0
    progress: Callable[[str], None] = field(
        default=lambda msg: print(msg, file=sys.stderr, flush=True))


def _rel_err(got: Any, ref: np.ndarray) -> float:
    g = np.asarray(got, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    return float(np.max(np.abs(g - r)) / max(float(np.max(np.abs(r))), 1e-30))


def _err_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 300 else text[:297] + "..."


def _baseline_matmul(opts: Options, policy: Policy) -> dict[str, Any]:
    """fusec's 16x16 tiled matmul template on the square workload's size: the baseline the
    register-blocked templates are measured against. It is the "cpu" codegen target's matmul, so
    the function is traced with that target forced."""
    m = next(w.inputs[0].shape[0] for w in workloads(opts.quick) if w.name == "matmul_square")
    rng = np.random.default_rng(opts.seed)
    a, b = (fusec.device_put(rng.standard_normal((m, m), dtype=np.float32)) for _ in range(2))
    before = fusec.config.get("target")
    fusec.config.set("target", "cpu")
    try:
        f = fusec.gpu_jit(lambda x, y: fnp.matmul(x, y))
        f(a, b).block_until_ready()  # traced and compiled for the forced target
    finally:
        fusec.config.set("target", before)
    try:
        t = fusec_time(f, (a, b), policy)
    except Exception as exc:
        return {"error": _err_text(exc)}
    return {"what": f"fusec 16x16 tiled matmul {m}^3", "m": m, "flops": 2.0 * m ** 3, **t,
            "GFLOP/s": 2.0 * m ** 3 / t["time_s"] / 1e9}


def _fusec_copy(opts: Options, policy: Policy) -> dict[str, Any]:
    """fusec's own copy bandwidth: -x, one read and one write per element."""
    n = 1 << (22 if opts.quick else 26)
    x = fusec.device_put(np.random.default_rng(opts.seed).standard_normal(n, dtype=np.float32))
    neg = fusec.gpu_jit(lambda a: fnp.negative(a))
    # GPUs idle at low clocks: keep this one busy for a moment before timing anything
    _heat(lambda: neg(x), lambda: neg(x).block_until_ready(), 0.2 if opts.quick else 1.0)
    t = fusec_time(neg, (x,), policy)
    return {"what": f"fusec -x over {n:,} float32 (one read, one write)", "elements": n,
            "bytes": 8 * n, **t, "GB/s": 8 * n / t["time_s"] / 1e9}


def measure_roofs(opts: Options, policy: Policy, use_torch: bool) -> dict[str, Any]:
    """Copy bandwidth (torch and fusec) and the cuBLAS float32 matmul rate."""
    roofs: dict[str, Any] = {"copy_fusec": _fusec_copy(opts, policy)}
    n = roofs["copy_fusec"]["elements"]
    if use_torch:
        torch = _torch()

        try:
            src = torch.randn(n, device="cuda")
            dst = torch.empty_like(src)
            t = torch_cuda_time(lambda: dst.copy_(src), policy)
            roofs["copy_torch"] = {"what": f"torch copy_ of {n:,} float32 (device to device)",
                                   "elements": n, "bytes": 8 * n, **t,
                                   "GB/s": 8 * n / t["time_s"] / 1e9}
            del src, dst
        except Exception as exc:
            roofs["copy_torch"] = {"error": _err_text(exc)}
        # the size of the square matmul workload
        m = next(w.inputs[0].shape[0] for w in workloads(opts.quick) if w.name == "matmul_square")
        try:
            a = torch.randn(m, m, device="cuda")
            b = torch.randn(m, m, device="cuda")
            t = torch_cuda_time(lambda: a @ b, policy)
            roofs["cublas"] = {"what": f"torch float32 matmul {m}^3, TF32 off", "m": m,
                               "flops": 2.0 * m ** 3, **t,
                               "GFLOP/s": 2.0 * m ** 3 / t["time_s"] / 1e9}
            del a, b
        except Exception as exc:
            roofs["cublas"] = {"error": _err_text(exc)}
    roofs["matmul_16x16"] = _baseline_matmul(opts, policy)
    copy = roofs.get("copy_torch", {})
    if "GB/s" in copy:
        roofs["copy_reference"] = {"source": "copy_torch", "GB/s": copy["GB/s"]}
    else:
        roofs["copy_reference"] = {"source": "copy_fusec", "GB/s": roofs["copy_fusec"]["GB/s"]}
    if "GFLOP/s" in roofs.get("cublas", {}):
        roofs["compute_reference"] = {"source": "cublas", "GFLOP/s": roofs["cublas"]["GFLOP/s"]}
    return roofs


def _cell(res: dict[str, Any]) -> Optional[float]:
    t = res.get("time_s")
    return float(t) if isinstance(t, (int, float)) and t > 0 else None


def wall_clock(call: Callable[[], Any], wait: Callable[[Any], Any],
               policy: Policy) -> dict[str, Any]:
    """Wall clock of ``wait(call())``: what a caller waits for one call's result, host overhead
    included (inputs are already on the device; nothing is read back). After ``policy.heat_s`` of
    back-to-back calls (see :func:`_heat`), like the GPU timings."""
    last: list[Any] = [None]

    def fire() -> None:
        last[0] = call()

    _heat(fire, lambda: wait(last[0]), policy.heat_s)
    res = wall_time(lambda: wait(call()), policy)
    res["method"] = "wall clock"
    return res


def _ready(out: Any) -> Any:
    return out.block_until_ready()


def interleaved_walls(calls: dict[str, Callable[[], Any]], wait: Callable[[Any], Any],
                      policy: Policy) -> dict[str, list[float]]:
    """Each call's wall clock (:func:`wall_clock`, a shorter window each) measured in turn,
    ``policy.wall_rounds`` times over: seconds per round, by name. On the shared GPU machine the
    host's speed drifts between windows of a second or two: one 2-kernel product measured 82 to
    120 us per call from one window to the next at the same GPU time, and JAX's gather 64 us in
    one bench run and 116 in another. Alternating windows exposes both sides to the same
    drift."""
    window = Policy(warmup=1, min_reps=5, max_reps=policy.max_reps,
                    budget_s=policy.budget_s / 4, heat_s=policy.heat_s / 3)
    out: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(policy.wall_rounds):
        for name, call in calls.items():
            out[name].append(wall_clock(call, wait, window)["time_s"])
    return out


def _jax_result(w: Workload, host: Sequence[np.ndarray], platform_: str, policy: Policy,
                fused_out: Any, ref: Optional[np.ndarray],
                fused_call: Optional[Callable[[], Any]] = None
                ) -> tuple[dict[str, Any], Optional[list[float]]]:
    """``jax.jit`` of the workload, timed by wall clock (JAX offers no GPU timestamps); with
    ``fused_call``, in turn with it (:func:`interleaved_walls`), whose rounds come back too."""
    jax = _jax()
    fused_rounds: Optional[list[float]] = None
    # float32 as written: XLA's default precision on NVIDIA GPUs rounds float32 matmul operands
    # to TF32 (torch runs with TF32 off, fusec has none). Traced and called inside the context.
    with jax.default_matmul_precision("highest"):
        jf = jax.jit(w.bind(JaxOps()))
        # once, as placed by device_put: float32 stays float32, int32 stays int32
        jargs = [jax.device_put(a) for a in host]
        jax.block_until_ready(jargs)
        t0 = time.perf_counter()
        out = jf(*jargs).block_until_ready()
        first = time.perf_counter() - t0
        if fused_call is not None and policy.wall_rounds > 1:
            rounds = interleaved_walls({"fused": fused_call, "jax": lambda: jf(*jargs)}, _ready,
                                       policy)
            res = {"time_s": statistics.median(rounds["jax"]), "wall_rounds_s": rounds["jax"],
                   "method": "wall clock, interleaved with fusec's"}
            fused_rounds = rounds["fused"]
        else:
            res = wall_clock(lambda: jf(*jargs), _ready, policy)
    res["wall_s"] = res["time_s"]
    res["first_call_s"] = first
    res["platform"] = platform_
    got = np.asarray(out)
    if fused_out is not None:  # the two implementations agree?
        res["rel_err_vs_fused"] = _rel_err(got, np.asarray(fused_out))
    if ref is not None:
        res["rel_err"] = _rel_err(got, ref)
    return res, fused_rounds


def run_workload(w: Workload, opts: Options, policy: Policy, use_torch: bool,
                 roofs: dict[str, Any], jax_platform: Optional[str] = None) -> dict[str, Any]:
    """Measure one workload every way it can run; errors become entries, not exceptions.
    ``jax_platform``: where JAX runs (from :func:`jax_status`), None to skip JAX."""
    rng = np.random.default_rng(opts.seed)
    host = w.make_inputs(rng)
    dev = [fusec.device_put(a) for a in host]
    rec: dict[str, Any] = {"name": w.name, "group": w.group, "bound": w.bound, "size": w.size,
                           "shapes": [list(a.shape) for a in host], "results": {}}
    outs: dict[str, Any] = {}
    calls: dict[str, Callable[[], Any]] = {}
    plans: dict[str, list[str]] = {}
    # the fused wall clock is measured in turn with JAX's (interleaved_walls), not before it
    interleave = jax_platform is not None and policy.wall_rounds > 1
    for label, fuse in (("fused", True), ("unfused", False)):
        try:
            f = fusec.gpu_jit(w.bind(FusecOps), fuse=fuse)
            lowered = f.lower(*dev)
            cost = lowered.cost_analysis()
            plans[label] = [k.wgsl for k in lowered.kernels]
            t0 = time.perf_counter()
            outs[label] = f(*dev).block_until_ready()
            first = time.perf_counter() - t0
            res = fusec_time(f, dev, policy)
            res["first_call_s"] = first
            calls[label] = functools.partial(f, *dev)
            if not (label == "fused" and interleave):  # (else measured in turn with JAX's)
                res["wall_s"] = wall_clock(calls[label], _ready, policy)["time_s"]
            res["kernels"] = int(cost["kernels"])
            res["bytes"] = cost["bytes accessed"]
            res["flops"] = cost["flops"]
            rec["results"][label] = res
        except Exception as exc:
            rec["results"][label] = {"error": _err_text(exc)}
    fused = rec["results"]["fused"]
    unfused = rec["results"]["unfused"]
    rec["flops"] = fused.get("flops")
    rec["bytes"] = fused.get("bytes")
    rec["bytes_unfused"] = unfused.get("bytes")
    if w.useful_bytes is not None:
        # the plans' buffer sizes overstate what a gather or a multi-pass kernel must move
        rec["bytes"] = rec["bytes_unfused"] = w.useful_bytes
    # nothing to fuse (a bare matmul): both plans run the same kernels, and their times differ
    # only by noise
    rec["same_plan"] = len(plans) == 2 and plans["fused"] == plans["unfused"]
    if "fused" in outs and "unfused" in outs:
        rec["fused_vs_unfused_rel_err"] = _rel_err(outs["fused"], np.asarray(outs["unfused"]))

    flops = rec["flops"] if rec["flops"] is not None else 0.0
    ref: Optional[np.ndarray] = None
    if opts.quick or flops < NUMPY_MAX_FLOPS:
        try:
            fn = w.bind(NumpyOps)
            ref = fn(*host)
            res = wall_time(lambda: fn(*host), Policy(1, 3, policy.max_reps, policy.budget_s))
            res["method"] = "wall clock"
            rec["results"]["numpy"] = res
            for label, out in outs.items():
                rec["results"][label]["rel_err"] = _rel_err(out, ref)
        except Exception as exc:
            ref = None
            rec["results"]["numpy"] = {"error": _err_text(exc)}
    else:
        rec["results"]["numpy"] = {"skipped": f"flops {flops:.2g} > {NUMPY_MAX_FLOPS:.0e}"}

    if use_torch:
        torch = _torch()

        targs = [torch.from_numpy(a).cuda() if a.dtype != np.int32 else
                 torch.from_numpy(a.astype(np.int64)).cuda() for a in host]
        eager = w.bind(TorchOps())
        runs: list[tuple[str, Callable[..., Any]]] = [("torch_eager", eager)]
        if opts.torch_compile:
            runs.append(("torch_compile", torch.compile(eager)))
        for label, tf in runs:
            try:
                with torch.no_grad():
                    t0 = time.perf_counter()
                    tf(*targs)
                    torch.cuda.synchronize()
                    first = time.perf_counter() - t0
                    out = tf(*targs)
                    res = torch_cuda_time(functools.partial(tf, *targs), policy)
                    res["wall_s"] = wall_clock(functools.partial(tf, *targs),
                                               lambda _: torch.cuda.synchronize(),
                                               policy)["time_s"]
                res["first_call_s"] = first
                if "fused" in outs:  # the two implementations agree?
                    res["rel_err_vs_fused"] = _rel_err(outs["fused"], out.cpu().numpy())
                rec["results"][label] = res
            except Exception as exc:
                rec["results"][label] = {"error": _err_text(exc)}
        del targs
    else:
        for label in ("torch_eager", "torch_compile"):
            rec["results"][label] = {"skipped": "no torch with CUDA"}
    if use_torch and not opts.torch_compile:
        rec["results"]["torch_compile"] = {"skipped": "--no-torch-compile"}

    if jax_platform is not None:
        try:
            jres, fused_rounds = _jax_result(w, host, jax_platform, policy, outs.get("fused"),
                                             ref, calls.get("fused"))
            rec["results"]["jax"] = jres
            if fused_rounds is not None:  # the fused wall clock, in turn with JAX's
                rec["results"]["fused"]["wall_s"] = statistics.median(fused_rounds)
                rec["results"]["fused"]["wall_rounds_s"] = fused_rounds
        except Exception as exc:
            rec["results"]["jax"] = {"error": _err_text(exc)}
    else:
        rec["results"]["jax"] = {"skipped": "--no-jax" if not opts.jax else "no usable jax"}
    if "fused" in calls and "wall_s" not in rec["results"]["fused"]:  # JAX failed: alone
        rec["results"]["fused"]["wall_s"] = wall_clock(calls["fused"], _ready, policy)["time_s"]

    _derive(rec, roofs)
    return rec


def _derive(rec: dict[str, Any], roofs: dict[str, Any]) -> None:
    """Speed-up, bytes ratio, the wall clock against JAX's, achieved rate and the fraction of the
    roof."""
    r = rec["results"]
    tf, tu = _cell(r["fused"]), _cell(r["unfused"])
    rec["speedup"] = tu / tf if tf and tu else None
    wf, wj = _wall(r["fused"]), _wall(r.get("jax", {}))
    rec["fused_wall_over_jax"] = wf / wj if wf and wj else None
    b, bu = rec.get("bytes"), rec.get("bytes_unfused")
    rec["bytes_ratio"] = bu / b if b and bu else None
    # "yes" within RATIO_SLACK: medians of timings that spread by about +-0.5% (H100)
    rec["speedup_ge_bytes_ratio"] = (rec["speedup"] >= rec["bytes_ratio"] * (1 - RATIO_SLACK)
                                     if rec["speedup"] and rec["bytes_ratio"]
                                     and not rec.get("same_plan") else None)
    if rec["bound"] == "memory":
        rec["roof"] = "copy bandwidth"
        unit, num, ref = "GB/s", (b or 0.0) / 1e9, roofs["copy_reference"]["GB/s"]
    else:
        rec["roof"] = "cuBLAS"
        unit, num = "GFLOP/s", (rec.get("flops") or 0.0) / 1e9
        ref = roofs.get("compute_reference", {}).get("GFLOP/s")
    rec["rate_unit"] = unit
    # the same numerator for every column (what the fused plan moves or computes), so the
    # fractions compare the implementations on one scale
    rec["rate"] = {}
    rec["fraction_of_roof"] = {}
    for label, res in r.items():
        t = _cell(res)
        if t is None or not num:
            continue
        rec["rate"][label] = num / t
        # numpy runs on the CPU, not under the device's roof; JAX's time is wall clock (host
        # overhead included, and maybe the CPU), not the device time the others are
        if ref and label not in ("numpy", "jax"):
            rec["fraction_of_roof"][label] = num / t / ref


def run(opts: Options) -> dict[str, Any]:
    """Run the suite, write the report, return the results (also in ``results.json``)."""
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    policy = opts.policy or (QUICK_POLICY if opts.quick else FULL_POLICY)
    ws = select(workloads(opts.quick), opts.only)
    t_start = time.perf_counter()
    # torch and JAX before fusec opens its adapter: their compiler stacks (LLVM in triton and in
    # jaxlib) must load before a software Vulkan adapter (lavapipe: LLVM too); triton loaded
    # after lavapipe crashes the process. JAX on the CPU after lavapipe works (tried), but the
    # order costs nothing.
    torch_ok, torch_why = torch_status() if opts.torch else (False, "--no-torch")
    if torch_ok:
        torch = _torch()

        if opts.torch_compile:
            importlib.import_module("torch._dynamo")  # torch.compile's stack (triton), now
        # float32 means float32: no TF32 in cuBLAS or in what torch.compile generates
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    jax_platform, jax_why = jax_status() if opts.jax else (None, "--no-jax")
    dev = fusec.default_device()
    # an NVIDIA GPU runs at full clocks while a CUDA context exists (JAX's and torch's, when they
    # run on it); without one it idles at its lowest and climbs only under a second of load:
    # every framework is timed at full clocks (fusec.clocks)
    clocks = (fusec.hold_gpu_clocks() if dev.adapter_type.lower() != "cpu"
              else "nothing held: a software adapter")
    opts.progress(f"fusec bench ({'quick' if opts.quick else 'full'}): {len(ws)} workload(s) on "
                  f"{dev}; timing {'gpu timestamps' if has_timestamps() else 'wall clock'}; "
                  f"{torch_why}; {jax_why}; GPU clocks {clocks}")
    t = time.perf_counter()
    roofs = measure_roofs(opts, policy, torch_ok)
    line = f"copy bandwidth: fusec {roofs['copy_fusec']['GB/s']:.1f} GB/s"
    if "GB/s" in roofs.get("copy_torch", {}):
        line += f", torch {roofs['copy_torch']['GB/s']:.1f} GB/s"
    if "GFLOP/s" in roofs.get("cublas", {}):
        line += f"; cuBLAS fp32 {roofs['cublas']['GFLOP/s'] / 1e3:.2f} TFLOP/s"
    opts.progress(f"[0/{len(ws)}] {line} ({time.perf_counter() - t:.1f} s)")
    records = []
    for i, w in enumerate(ws, 1):
        t = time.perf_counter()
        rec = run_workload(w, opts, policy, torch_ok, roofs, jax_platform)
        gc.collect()  # this workload's device buffers go back to the pool before the next
        rec["bench_seconds"] = time.perf_counter() - t
        records.append(rec)
        opts.progress(f"[{i}/{len(ws)}] {_progress_line(rec)} ({rec['bench_seconds']:.1f} s)")

    ts = has_timestamps()
    results: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "mode": "quick" if opts.quick else "full",
        "fusec_version": fusec.__version__,
        "device": {"adapter": dev.adapter, "adapter_type": dev.adapter_type,
                   "backend": dev.backend, "features": list(dev.features),
                   "text": str(dev)},
        "host": {"python": platform.python_version(), "numpy": np.__version__,
                 "machine": platform.machine(), "cpus": os.cpu_count()},
        "torch": torch_why,
        "jax": {"status": jax_why, "platform": jax_platform},
        "gpu_clocks": clocks,
        "timing": {
            "gpu_timestamps": ts,
            "fusec": ("GPU timestamp queries around the call's compute pass" if ts else
                      "wall clock of the call + block_until_ready (no timestamp queries)"),
            "torch": "CUDA events around the call" if torch_ok else "n/a",
            "numpy": "wall clock",
            "jax": (f"wall clock only (JAX has no GPU timestamps), jax.jit on the "
                    f"{jax_platform} platform, 'highest' matmul precision"
                    if jax_platform else "n/a"),
            "wall": ("call + wait for the result (fusec and JAX: block_until_ready; torch: "
                     "torch.cuda.synchronize), inputs already on the device, no readback"
                     + (f"; where JAX runs, fusec's fused and JAX's are measured in turn, "
                        f"{policy.wall_rounds} windows each, and the median of the windows' "
                        f"medians is given" if jax_platform and policy.wall_rounds > 1 else "")),
            "statistic": (f"median of {policy.min_reps}..{policy.max_reps} repeats (stopping "
                          f"after {policy.budget_s:g} s) after {policy.warmup} warm-up call(s); "
                          f"GPU timings after {policy.heat_s:g} s of back-to-back calls"),
        },
        "roofs": roofs,
        "workloads": records,
    }
    if opts.llm:
        t = time.perf_counter()
        results["llm"] = llm_section(opts.quick)
        opts.progress(f"[llm] SmolLM2-135M: {results['llm'].get('speed') or results['llm']} "
                      f"({time.perf_counter() - t:.1f} s)")
    results["seconds"] = time.perf_counter() - t_start
    write_report(results, opts.out)
    return results


# --- the report -----------------------------------------------------------------------------------

# the device time of each implementation (numpy: its CPU wall clock)
COLUMNS = (("fused", "fusec fused"), ("unfused", "fusec unfused"), ("numpy", "numpy"),
           ("torch_eager", "torch eager"), ("torch_compile", "torch.compile"))
# the wall clock of call + wait of each device implementation (JAX's only time)
WALL_COLUMNS = (("fused", "fusec fused"), ("unfused", "fusec unfused"), ("jax", "jax.jit"),
                ("torch_eager", "torch eager"), ("torch_compile", "torch.compile"))
_COLORS = {"fused": "C0", "unfused": "C1", "numpy": "C2", "torch_eager": "C3",
           "torch_compile": "C4", "jax": "C5"}


def _wall(res: dict[str, Any]) -> Optional[float]:
    t = res.get("wall_s")
    return float(t) if isinstance(t, (int, float)) and t > 0 else None


def fmt_seconds(t: float) -> str:
    if t < 1e-3:
        return f"{t * 1e6:.1f} µs"
    if t < 1:
        return f"{t * 1e3:.2f} ms"
    return f"{t:.2f} s"


def fmt_time(res: Optional[dict[str, Any]], wall: bool = False) -> str:
    """The median time of a result (its wall clock with ``wall``), "error" or "n/a"."""
    if not res:
        return "n/a"
    t = _wall(res) if wall else _cell(res)
    if t is None:
        return "error" if "error" in res else "n/a"
    return fmt_seconds(t)


def fmt_count(x: Optional[float], unit: str = "") -> str:
    if x is None:
        return "n/a"
    for div, p in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g} {p}{unit}".rstrip()
    return f"{x:.3g} {unit}".rstrip()


def fmt_ratio(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def fmt_rate(rec: dict[str, Any], label: str = "fused") -> str:
    v = rec.get("rate", {}).get(label)
    if v is None:
        return "n/a"
    if rec["rate_unit"] == "GFLOP/s":
        return f"{v / 1e3:.2f} TFLOP/s" if v >= 1e3 else f"{v:.3g} GFLOP/s"
    return f"{v:.4g} GB/s"


def fmt_fraction(rec: dict[str, Any], label: str = "fused") -> str:
    v = rec.get("fraction_of_roof", {}).get(label)
    roof = "copy" if rec["bound"] == "memory" else "cuBLAS"
    return f"n/a ({roof})" if v is None else f"{100 * v:.1f}% {roof}"


def jax_label(results: dict[str, Any]) -> str:
    """"jax (gpu, wall)": JAX's column names the platform it ran on."""
    plat = (results.get("jax") or {}).get("platform")
    return f"jax ({plat}, wall)" if plat else "jax (wall)"


def _columns(results: dict[str, Any]) -> list[tuple[str, str, Callable[[dict[str, Any]], str]]]:
    """(key, header, cell of a workload's record) of the report's table."""
    # fusec's device time is GPU time where the adapter has timestamp queries, else wall clock
    tag = "GPU" if results.get("timing", {}).get("gpu_timestamps", True) else "wall, no ts"

    def t(label: str, wall: bool = False) -> Callable[[dict[str, Any]], str]:
        return lambda rec: fmt_time(rec["results"].get(label), wall)

    def kernels(rec: dict[str, Any]) -> str:
        r = rec["results"]
        return f"{r['fused'].get('kernels', '?')}/{r['unfused'].get('kernels', '?')}"

    def verdict(rec: dict[str, Any]) -> str:
        ok = rec.get("speedup_ge_bytes_ratio")
        return ("same plan" if rec.get("same_plan") else
                "n/a" if ok is None else ("yes" if ok else "no"))

    return [
        ("workload", "workload", lambda rec: rec["name"]),
        ("size", "size", lambda rec: rec["size"]),
        ("bytes", "bytes", lambda rec: fmt_count(rec.get("bytes"), "B")),
        ("flops", "flops", lambda rec: fmt_count(rec.get("flops"))),
        ("kernels", "kernels f/u", kernels),
        ("fused", f"fused ({tag})", t("fused")),
        ("unfused", f"unfused ({tag})", t("unfused")),
        ("numpy", "numpy (CPU)", t("numpy")),
        ("torch_eager", "torch eager (GPU)", t("torch_eager")),
        ("torch_compile", "torch.compile (GPU)", t("torch_compile")),
        ("fused_wall", "fused (wall)", t("fused", wall=True)),
        ("unfused_wall", "unfused (wall)", t("unfused", wall=True)),
        ("jax_wall", jax_label(results), t("jax", wall=True)),
        ("torch_eager_wall", "torch eager (wall)", t("torch_eager", wall=True)),
        ("torch_compile_wall", "torch.compile (wall)", t("torch_compile", wall=True)),
        ("fused_wall_over_jax", "fused wall / jax wall",
         lambda rec: fmt_ratio(rec.get("fused_wall_over_jax"))),
        ("speedup", "speed-up", lambda rec: fmt_ratio(rec.get("speedup"))),
        ("bytes_ratio", "bytes ratio", lambda rec: fmt_ratio(rec.get("bytes_ratio"))),
        ("verdict", "speed-up >= ratio", verdict),
        ("rate", "fused rate", fmt_rate),
        ("roof", "% of roof", fmt_fraction),
    ]


def table_rows(results: dict[str, Any],
               keys: Optional[Sequence[str]] = None) -> tuple[list[str], list[list[str]]]:
    """The report's table (only the columns ``keys`` name, in that order, when given)."""
    cols = _columns(results)
    if keys is not None:
        by_key = {c[0]: c for c in cols}
        cols = [by_key[k] for k in keys]
    return ([h for _, h, _ in cols],
            [[cell(rec) for _, _, cell in cols] for rec in results["workloads"]])


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    right = {i for i, h in enumerate(head) if h not in ("workload", "size")}
    lines = ["| " + " | ".join(head) + " |",
             "|" + "|".join("---:" if i in right else "---" for i in range(len(head))) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    fmt = [(str.ljust if h in ("workload", "size") else str.rjust) for h in head]
    out = ["  ".join(f(c, w) for f, c, w in zip(fmt, head, widths)),
           "  ".join("-" * w for w in widths)]
    out += ["  ".join(f(c, w) for f, c, w in zip(fmt, row, widths)) for row in rows]
    return "\n".join(out)


# the printed summary: device times, wall clocks side by side, fusion's figures
SUMMARY_COLUMNS = ("workload", "fused", "unfused", "torch_eager", "torch_compile", "fused_wall",
                   "jax_wall", "torch_eager_wall", "torch_compile_wall", "fused_wall_over_jax",
                   "speedup", "bytes_ratio", "roof")


def summary_table(results: dict[str, Any]) -> str:
    return text_table(*table_rows(results, SUMMARY_COLUMNS))


def _progress_line(rec: dict[str, Any]) -> str:
    r = rec["results"]
    parts = [f"{rec['name']} ({rec['size']}):"]
    for k, label in COLUMNS:
        res = r.get(k, {})
        if "skipped" in res:
            continue
        parts.append(f"{label.replace('fusec ', '')} {fmt_time(res)}")
    parts.append(f"speed-up {fmt_ratio(rec.get('speedup'))} "
                 f"(bytes ratio {fmt_ratio(rec.get('bytes_ratio'))}), {fmt_fraction(rec)}")
    walls = [f"{label.replace('fusec ', '')} {fmt_time(r.get(k, {}), wall=True)}"
             for k, label in WALL_COLUMNS if "skipped" not in r.get(k, {})]
    parts.append(f"wall: {', '.join(walls)}"
                 + (f" (fused / jax {fmt_ratio(rec['fused_wall_over_jax'])})"
                    if rec.get("fused_wall_over_jax") else ""))
    errs = [f"{k}: {v['error']}" for k, v in r.items() if "error" in v]
    line = ", ".join(parts[1:])
    return f"{parts[0]} {line}" + (f"; errors: {'; '.join(errs)}" if errs else "")


def markdown_report(results: dict[str, Any], charts: list[str], chart_note: str) -> str:
    roofs = results["roofs"]
    tm = results["timing"]
    lines = [f"# fusec benchmark ({results['mode']} set)", "",
             f"- date: {results['date']}",
             f"- device: {results['device']['text']}; fusec {results['fusec_version']}; "
             f"numpy {results['host']['numpy']} on {results['host']['cpus']} CPU(s)",
             f"- PyTorch: {results['torch']}"]
    jx = results.get("jax") or {}
    if jx:
        lines.append(f"- JAX: {jx['status']}"
                     + (" (JAX runs on the CPU here: its wall clock is the CPU's work, not a "
                        "GPU's)" if jx.get("platform") == "cpu" else ""))
    lines.append(f"- timing: fusec: {tm['fusec']}; torch: {tm['torch']}; numpy: {tm['numpy']}"
                 + (f"; JAX: {tm['jax']}" if "jax" in tm else "") + f"; {tm['statistic']}")
    if "wall" in tm:
        lines.append(f"- wall clock (the *(wall)* columns): {tm['wall']}; the same statistic, "
                     "after the same back-to-back calls")
    cf = roofs["copy_fusec"]
    lines.append(f"- copy bandwidth: fusec {cf['GB/s']:.1f} GB/s ({cf['what']})")
    ct = roofs.get("copy_torch")
    if ct:
        lines.append(f"- copy bandwidth: torch {ct['GB/s']:.1f} GB/s ({ct['what']})" if "GB/s"
                     in ct else f"- copy bandwidth: torch failed: {ct.get('error')}")
    ref = roofs["copy_reference"]
    lines.append(f"- memory-bound roof: {ref['GB/s']:.1f} GB/s (from {ref['source']})")
    cb = roofs.get("cublas")
    if cb and "GFLOP/s" in cb:
        lines.append(f"- compute roof: cuBLAS {cb['GFLOP/s'] / 1e3:.2f} TFLOP/s ({cb['what']})")
    else:
        lines.append("- compute roof: n/a (no PyTorch with CUDA: no cuBLAS figure; the "
                     "'% of roof' of compute-bound workloads is n/a, their rate is given)")
    base = roofs.get("matmul_16x16", {})
    if "GFLOP/s" in base:
        g = base["GFLOP/s"]
        rate = f"{g / 1e3:.2f} TFLOP/s" if g >= 100 else f"{g:.3g} GFLOP/s"
        lines.append(f"- baseline: {base['what']}: {rate}"
                     + (f" ({100 * base['GFLOP/s'] / cb['GFLOP/s']:.1f}% of cuBLAS)"
                        if cb and "GFLOP/s" in cb else ""))
    lines.append(f"- run time: {results['seconds']:.1f} s")
    if results["mode"] == "quick":
        lines.append("- quick set: small sizes that caches partly hold, and short kernels: "
                     "fractions of the roof can pass 100% and figures are indicative; the "
                     "acceptance figures come from the full set (`fusec bench`)")
    if results["device"]["adapter_type"].lower() == "cpu":
        lines.append("- software adapter: the 'GPU' is the CPU; its figures say whether the "
                     "suite runs, not how fast fusec is on a GPU")
    head, rows = table_rows(results)
    lines += ["", markdown_table(head, rows), "",
              "Columns: *bytes* and *flops* from `cost_analysis()` of the fused plan; "
              "*kernels f/u*: kernels of the fused / unfused plan; times are medians; "
              "*(GPU)*: the device's time for the call (fusec: timestamp queries around its "
              "compute pass; torch: CUDA events), the host's work not included; *(wall)*: what "
              "the caller waits for a call's result (call + wait, inputs already on the device, "
              "no readback), the host's work (dispatch, encoding, submit, the wait) included; "
              "JAX offers no GPU timestamps and has a wall clock only; "
              "*fused wall / jax wall*: below 1x fusec's call returns sooner than JAX's; "
              "*speed-up* = unfused time / fused time; *bytes ratio* = bytes moved by the unfused "
              "plan / the fused plan; *fused rate* and *% of roof*: the fused plan's bytes "
              "(memory-bound workloads, against the copy bandwidth) or flops (compute-bound, "
              "against cuBLAS float32) per second of the fused time. *speed-up >= ratio*: the "
              "design target (fusion should save at least the time of the bytes it saves; on "
              "compute-bound workloads the bytes are a small part of the time, so read it there "
              f"with that in mind), \"yes\" from {100 * (1 - RATIO_SLACK):g}% of the ratio on, "
              "below the spread of repeated timings; *same plan*: fusion has nothing to merge, "
              "both plans run the same kernels and their times differ by noise only. numpy is "
              f"skipped in the full set above {NUMPY_MAX_FLOPS:.0e} flops.", ""]
    errs = [(rec["name"], k, v["error"]) for rec in results["workloads"]
            for k, v in rec["results"].items() if "error" in v]
    if errs:
        lines += ["## Errors", ""] + [f"- {n} / {k}: `{e}`" for n, k, e in errs] + [""]
    bad = [(rec["name"], k, v["rel_err"]) for rec in results["workloads"]
           for k, v in rec["results"].items() if v.get("rel_err", 0.0) > 1e-3]
    if bad:
        lines += ["## Accuracy warnings (max abs error / max |numpy| > 1e-3)", ""]
        lines += [f"- {n} / {k}: {e:.2e}" for n, k, e in bad] + [""]
    llm = results.get("llm")
    if llm:
        lines += ["## A language model: SmolLM2-135M (Q4_1 weights, fusec.models.llama)", ""]
        if "error" in llm:
            lines += [f"not measured: {llm['error']}", ""]
        else:
            lines += [f"Wall clock, median of {llm['reps']} runs: decode after a "
                      f"{llm['prompt_len']}-token prompt, tokens/s = batch x steps / s "
                      "('streaming': each step's tokens read back; 'on device': read at the "
                      "end); prefill: one call. transformers' figures on the same model come "
                      "from bench/smollm2_reference.py.", "",
                      markdown_table(["what", "tokens/s"],
                                     [[k, f"{v:.1f}"] for k, v in llm["speed"].items()]), ""]
    lines += ["## Charts", ""]
    lines += [f"![{c}]({c})" for c in charts] if charts else [chart_note]
    lines.append("")
    return "\n".join(lines)


def llm_section(quick: bool) -> dict[str, Any]:
    """SmolLM2-135M's decoding and prefill speed (``fusec bench --llm``), or why not."""
    reps, prompt_len = (2, 8) if quick else (5, 32)
    try:
        from .models.llama import Llama, measure_speed

        model = Llama.from_gguf(max_len=64 if quick else 1024)
        speed = measure_speed(model, reps=reps, decode_tokens=4 if quick else 32,
                              batches=(1,) if quick else (1, 8),
                              prefill_len=0 if quick else 512, prompt_len=prompt_len)
    except (ImportError, FusecError) as exc:
        return {"error": str(exc)}
    return {"reps": reps, "prompt_len": prompt_len, "speed": speed}


def write_charts(results: dict[str, Any], out: Path) -> tuple[list[str], str]:
    """times.png (device times), wall.png (wall clock) and fraction.png; ([], why) when
    matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], ("Charts not written: matplotlib is not installed "
                    "(`pip install 'fusec[bench]'` or `pip install matplotlib`).")
    recs = results["workloads"]
    names = [r["name"] for r in recs]
    x = np.arange(len(names))
    charts = []

    labels_of = {**dict(COLUMNS), "jax": jax_label(results).replace(", wall", "")}

    def bars(ax: Any, series: list[tuple[str, list[Optional[float]]]]) -> None:
        """Grouped bars, one series per implementation (same colour in every chart)."""
        series = [(k, vals) for k, vals in series if any(v is not None for v in vals)]
        width = 0.8 / max(len(series), 1)
        for j, (k, vals) in enumerate(series):
            ax.bar(x + (j - (len(series) - 1) / 2) * width,
                   [np.nan if v is None else v for v in vals], width, label=labels_of[k],
                   color=_COLORS[k])

    for name, cols, get, what in (
            ("times.png", COLUMNS, _cell, "device time per call (numpy: CPU wall clock)"),
            ("wall.png", WALL_COLUMNS, _wall, "wall clock per call (call + wait)")):
        fig, ax = plt.subplots(figsize=(max(8.0, 0.75 * len(names) + 3), 5.5))
        bars(ax, [(k, [None if (t := get(r["results"].get(k, {}))) is None else t * 1e3
                       for r in recs]) for k, _ in cols])
        ax.set_yscale("log")
        ax.set_ylabel(f"{what}\n(ms, log scale; lower is better)")
        ax.set_xticks(x, names, rotation=40, ha="right")
        ax.set_title(f"fusec {results['mode']} benchmark, {what.split(' (')[0]}: "
                     f"{results['device']['adapter']} ({results['date']})", fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(axis="y", which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        charts.append(name)

    fig, ax = plt.subplots(figsize=(max(8.0, 0.75 * len(names) + 3), 5.5))
    labels = [f"{r['name']}\n({'copy' if r['bound'] == 'memory' else 'cuBLAS'})" for r in recs]
    bars(ax, [(k, [None if (f := r.get("fraction_of_roof", {}).get(k)) is None else 100 * f
                   for r in recs]) for k, _ in COLUMNS if k != "numpy"])
    ax.axhline(100, color="black", linewidth=0.8)
    ax.set_ylabel("% of roof (copy bandwidth or cuBLAS fp32)")
    ax.set_xticks(x, labels, rotation=40, ha="right", fontsize=8)
    ax.set_title("achieved fraction of the roof on the device (fused plan's bytes or flops / "
                 "time); higher is better", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "fraction.png", dpi=110)
    plt.close(fig)
    charts.append("fraction.png")
    return charts, ""


def write_report(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    charts, note = write_charts(results, out)
    results["charts"] = charts
    if note:
        results["charts_note"] = note
    with open(out / "results.json", "w") as fh:
        json.dump(results, fh, indent=2, default=float)
        fh.write("\n")
    (out / "report.md").write_text(markdown_report(results, charts, note))


def main(opts: Options) -> int:
    """``fusec bench``: run, write the report, print the summary table on stdout."""
    results = run(opts)
    print(summary_table(results))
    print()
    print(f"{results['mode']} run: {len(results['workloads'])} workload(s) in "
          f"{results['seconds']:.1f} s; report: {opts.out / 'report.md'}, "
          f"{opts.out / 'results.json'}"
          + (f", charts: {', '.join(str(opts.out / c) for c in results['charts'])}"
             if results["charts"] else f"; {results.get('charts_note', '')}"))
    return 1 if any("error" in v for rec in results["workloads"]
                    for v in rec["results"].values()) else 0
