"""Training step of the bench transformer block (forward + backward, float32): wall clock per step
with fusec, JAX (``jax.jit(jax.value_and_grad(...))``) and torch eager, side by side in one process.

The block is ``fusec.bench``'s ``_transformer`` (pre-norm, multi-head attention, SwiGLU MLP); the
loss is the mean square of its output; the step returns the loss and the gradients of all nine
parameters. Inputs and parameters are on the device before timing; each timed call ends with the
result ready (fusec: ``block_until_ready``; torch: ``cuda.synchronize``; JAX:
``block_until_ready``). Median of ``--reps`` steps after warm-up. Also checks that the three agree.

    python bench/train_step.py [--seq 2048 --d 1024 --heads 8 --ffn 2816] [--reps 20] [--out r.json]

Two figures per library: ``*_ms``, one call of the value-and-gradient step and its wait (a round
trip); ``*_loop_ms_per_step``, a training loop (gradient and SGD update in one call, parameters
fed from step to step, ``--loop`` steps and one wait), where a step's host work overlaps the GPU
work of the step before, as in real training.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

try:  # torch first: its compiler stack must load before fusec opens a Vulkan adapter
    import torch
except Exception:  # noqa: BLE001 - optional
    torch = None

from timing import back_to_back, median_wall  # noqa: E402  (bench/timing.py)

import fusec  # noqa: E402
import fusec.numpy as fnp  # noqa: E402
from fusec.bench import FusecOps, TorchOps, _transformer  # noqa: E402

NAMES = ("g1", "wq", "wk", "wv", "wo", "g2", "w_gate", "w_up", "w_down")


def make_inputs(seq: int, d: int, ffn: int, seed: int = 0) -> tuple[np.ndarray, dict[str, Any]]:
    rng = np.random.default_rng(seed)

    def w(fan_in: int, *shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32)

    x = rng.standard_normal((seq, d)).astype(np.float32)
    g = (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    params = {"g1": g, "wq": w(d, d, d), "wk": w(d, d, d), "wv": w(d, d, d), "wo": w(d, d, d),
              "g2": g.copy(), "w_gate": w(d, d, ffn), "w_up": w(d, d, ffn),
              "w_down": w(ffn, ffn, d)}
    return x, params


LR = 1e-3


def fusec_train_step(heads: int) -> Callable[..., Any]:
    """Forward, backward and an SGD update, one jitted call (parameters donated)."""
    B = FusecOps()

    def loss(params: dict[str, Any], x: Any) -> Any:
        y = _transformer(heads, B, x, *(params[n] for n in NAMES))
        return fnp.mean(y * y)

    def step(params: dict[str, Any], x: Any) -> Any:
        value, g = fusec.value_and_grad(loss)(params, x)
        return value, fusec.tree_util.tree_map(lambda p, d: p - LR * d, params, g)

    return fusec.gpu_jit(step, donate_argnums=(0,))


def fusec_step(heads: int) -> Callable[..., Any]:
    B = FusecOps()

    def loss(params: dict[str, Any], x: Any) -> Any:
        y = _transformer(heads, B, x, *(params[n] for n in NAMES))
        return fnp.mean(y * y)

    return fusec.gpu_jit(fusec.value_and_grad(loss))


class JaxOps:
    """``B`` for JAX (jax.numpy / jax.nn), as FusecOps is for fusec."""

    def __init__(self) -> None:
        import jax
        import jax.numpy as jnp

        self.jax, self.jnp = jax, jnp

    def silu(self, x: Any) -> Any:
        return self.jax.nn.silu(x)

    def softmax(self, x: Any) -> Any:
        return self.jax.nn.softmax(x, axis=-1)

    def rms_norm(self, x: Any, w: Any) -> Any:
        jnp = self.jnp
        return x * self.jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w

    def split_heads(self, x: Any, heads: int, transposed: bool = False) -> Any:
        s, d = x.shape
        v = x.reshape(s, heads, d // heads)
        return v.transpose(1, 2, 0) if transposed else v.transpose(1, 0, 2)

    def merge_heads(self, o: Any) -> Any:
        h, s, dh = o.shape
        return o.transpose(1, 0, 2).reshape(s, h * dh)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=2816)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="")
    ap.add_argument("--loop", type=int, default=20, help="chained steps per timed loop")
    ap.add_argument("--loop-reps", type=int, default=5)
    ap.add_argument("--fusec-only", action="store_true", help="skip JAX and torch")
    ap.add_argument("--profile", action="store_true", help="print each fusec kernel's GPU time")
    a = ap.parse_args(argv)
    x_np, p_np = make_inputs(a.seq, a.d, a.ffn)
    res: dict[str, Any] = {"shape": f"seq {a.seq}, d {a.d}, {a.heads} heads, ffn {a.ffn}",
                           "device": str(fusec.default_device()), "reps": a.reps}
    grads: dict[str, Any] = {}

    step = fusec_step(a.heads)
    x_dev = fusec.device_put(x_np)
    p_dev = {k: fusec.device_put(v) for k, v in p_np.items()}
    t0 = time.perf_counter()
    out = step(p_dev, x_dev)
    fusec.tree_util.tree_map(lambda t: t.block_until_ready(), out)
    res["fusec_first_call_s"] = time.perf_counter() - t0
    res["fusec_kernels"] = len(step.lower(p_dev, x_dev).kernels)

    def run_fusec() -> None:
        v, g = step(p_dev, x_dev)
        g["w_down"].block_until_ready()

    res["fusec_ms"] = 1e3 * median_wall(run_fusec, a.reps)
    tstep = fusec_train_step(a.heads)
    state = {"p": {k: fusec.device_put(v) for k, v in p_np.items()}, "v": None}

    def fusec_once() -> None:
        state["v"], state["p"] = tstep(state["p"], x_dev)

    res["fusec_loop_ms_per_step"] = 1e3 * back_to_back(
        fusec_once, lambda: state["v"].block_until_ready(), a.loop, a.loop_reps)
    # where the wall time goes: the host's part (the call returns once the work is submitted)
    # and the GPU's (timestamps around the call's one compute pass)
    from fusec.runtime import get_runtime

    rt = get_runtime()
    held: list[Any] = []

    def call_only() -> None:
        held[:] = [step(p_dev, x_dev)]

    res["fusec_host_call_ms"] = 1e3 * median_wall(call_only, a.reps)
    held[-1][1]["w_down"].block_until_ready()
    held.clear()
    if rt is not None and "timestamp-query" in rt.info.features:
        rt.profile = True
        gpu = []
        for _ in range(a.reps):
            run_fusec()
            gpu.append(rt.last_gpu_ns() / 1e6)
        rt.profile = False
        res["fusec_gpu_pass_ms"] = statistics.median(gpu)
    if a.profile:
        with fusec.profile() as prof:  # each kernel's GPU time, printed as a table
            run_fusec()
        res["fusec_gpu_ms_by_kernel_sum"] = sum(r[2] for r in prof.rows) / 1e3
    v, g = step(p_dev, x_dev)
    grads["fusec"] = (float(np.asarray(v)), {k: np.asarray(t) for k, t in g.items()})

    try:
        if a.fusec_only:
            raise RuntimeError("--fusec-only")
        import jax

        B = JaxOps()
        jnp = B.jnp

        def jloss(params: dict[str, Any], x: Any) -> Any:
            y = _transformer(a.heads, B, x, *(params[n] for n in NAMES))
            return jnp.mean(y * y)

        jstep = jax.jit(jax.value_and_grad(jloss))
        xj = jax.device_put(x_np)
        pj = {k: jax.device_put(v) for k, v in p_np.items()}
        res["jax_device"] = str(xj.devices() if hasattr(xj, "devices") else "")

        def run_jax() -> None:
            jax.block_until_ready(jstep(pj, xj))

        # float32 as written: XLA's default precision on NVIDIA GPUs rounds matmul operands to
        # TF32 (as torch's TF32 switch would); the fusec figure is compared with "highest"
        with jax.default_matmul_precision("highest"):
            jstep = jax.jit(jax.value_and_grad(jloss))
            res["jax_ms"] = 1e3 * median_wall(run_jax, a.reps)
        jstep_tf32 = jax.jit(jax.value_and_grad(jloss))
        res["jax_default_precision_ms"] = 1e3 * median_wall(
            lambda: jax.block_until_ready(jstep_tf32(pj, xj)), a.reps)
        with jax.default_matmul_precision("highest"):
            v, g = jstep(pj, xj)

            def jtrain(params: dict[str, Any], x: Any) -> Any:
                value, g = jax.value_and_grad(jloss)(params, x)
                return value, jax.tree_util.tree_map(lambda p, d: p - LR * d, params, g)

            jtrain_step = jax.jit(jtrain, donate_argnums=(0,))
            jstate = {"p": {k: jax.device_put(v) for k, v in p_np.items()}, "v": None}

            def jax_once() -> None:
                jstate["v"], jstate["p"] = jtrain_step(jstate["p"], xj)

            res["jax_loop_ms_per_step"] = 1e3 * back_to_back(
                jax_once, lambda: jax.block_until_ready(jstate["v"]), a.loop, a.loop_reps)
        grads["jax"] = (float(v), {k: np.asarray(t) for k, t in g.items()})
    except Exception as exc:  # noqa: BLE001 - optional reference
        res["jax_error"] = repr(exc)

    if torch is not None and torch.cuda.is_available() and not a.fusec_only:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        T = TorchOps()
        xt = torch.from_numpy(x_np).cuda()
        pt = {k: torch.from_numpy(v).cuda().requires_grad_(True) for k, v in p_np.items()}

        def tstep() -> Any:
            for p in pt.values():
                p.grad = None
            y = _transformer(a.heads, T, xt, *(pt[n] for n in NAMES))
            loss = (y * y).mean()
            loss.backward()
            return loss

        def run_torch() -> None:
            tstep()
            torch.cuda.synchronize()

        res["torch_eager_ms"] = 1e3 * median_wall(run_torch, a.reps)
        tp = {k: torch.from_numpy(v).cuda().requires_grad_(True) for k, v in p_np.items()}

        def torch_once() -> None:
            for p in tp.values():
                p.grad = None
            y = _transformer(a.heads, T, xt, *(tp[n] for n in NAMES))
            (y * y).mean().backward()
            with torch.no_grad():
                for p in tp.values():
                    p -= LR * p.grad

        res["torch_eager_loop_ms_per_step"] = 1e3 * back_to_back(
            torch_once, torch.cuda.synchronize, a.loop, a.loop_reps)
        loss = tstep()
        grads["torch"] = (float(loss.detach()), {k: p.grad.cpu().numpy() for k, p in pt.items()})

    # agreement: each gradient within float32 reach of the others
    if "jax" in grads:
        errs = {}
        for k in NAMES:
            ref = grads["jax"][1][k]
            errs[k] = float(np.abs(grads["fusec"][1][k] - ref).max() / (np.abs(ref).max() + 1e-30))
        res["fusec_vs_jax_max_rel_err"] = max(errs.values())
        res["loss"] = {n: grads[n][0] for n in grads}
    if "jax_ms" in res:
        res["fusec_over_jax"] = res["fusec_ms"] / res["jax_ms"]
    if "jax_loop_ms_per_step" in res:
        res["fusec_over_jax_loop"] = res["fusec_loop_ms_per_step"] / res["jax_loop_ms_per_step"]
    if "torch_eager_loop_ms_per_step" in res:
        res["fusec_over_torch_eager_loop"] = (res["fusec_loop_ms_per_step"]
                                              / res["torch_eager_loop_ms_per_step"])
    if "torch_eager_ms" in res:
        res["fusec_over_torch_eager"] = res["fusec_ms"] / res["torch_eager_ms"]
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0



if __name__ == "__main__":
    sys.exit(main())
