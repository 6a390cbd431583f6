"""Training steps per second of the digits MLP (examples/train_digits.py) in fusec, JAX and torch,
side by side in one process.

The same model (64 -> 128 -> 10, ReLU), loss (mean softmax cross-entropy), optimizer (Adam,
lr 3e-3, betas 0.9/0.999, eps 1e-8), batch size, initial parameters (drawn once with numpy) and
minibatch order in every column:

- ``fusec``: the whole step (minibatch gather, forward, ``value_and_grad``, Adam by ``tree_map``)
  one ``gpu_jit`` call, parameters and optimizer state donated;
- ``jax``: the same step under one ``jax.jit``, parameters and state donated;
- ``torch-eager``: ``loss.backward()`` and ``torch.optim.Adam`` (foreach), as one writes it
  (torch's Adam adds eps after the bias correction, not before: the same to within rounding);
- ``torch-compile``: the whole step (``torch.func.grad_and_value`` and the same Adam, updating
  the parameters and state in place) under one ``torch.compile(fullgraph=True)``;
- ``torch-compile-cudagraphs``: that, with ``mode="reduce-overhead"`` (CUDA graphs; CUDA only;
  the state tensors are marked static so that one graph replays over them).

The training set and every step's minibatch indices are uploaded once; a step reads its indices
by its number. Each column runs ``--warmup`` steps (the first one traces and compiles: its time is
reported apart), then ``--repeats`` blocks of ``--steps`` steps, each block timed by the wall
clock from its first call to a device sync after its last (a readback of the loss; for torch also
``torch.cuda.synchronize()``). Reported: the median block's steps per second, and the test
accuracy after training (all columns should agree to within a few tenths of a percent).
Matmuls are float32 everywhere (TF32 off in torch, ``highest`` precision in JAX).

    python bench/train_digits_compare.py [--steps 500] [--warmup 50] [--repeats 3]
        [--batch-size 64] [--only fusec,jax,...] [--out results.json] [--strict]

A library that is not installed is skipped (its column says why). On the GPU machine every
column should run on the GPU: ``--strict`` makes a column that fell back to the CPU an error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

# torch and JAX first: their compiler stacks (LLVM inside triton and jaxlib) must load before
# fusec opens a Vulkan adapter; triton loaded after lavapipe (LLVM too) crashes the process.
# torch imports triton lazily (in torch._dynamo, which torch.optim and torch.compile pull in):
# import that now too.
try:
    import torch
    import torch._dynamo  # noqa: F401
    import torch.func  # noqa: F401
    import torch.optim  # noqa: F401
except Exception:  # noqa: BLE001 - optional
    torch = None
try:
    import jax
except Exception:  # noqa: BLE001 - optional
    jax = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import fusec  # noqa: E402

ex: Any = importlib.import_module("train_digits")  # the example's model, loss and Adam

COLUMNS = ("fusec", "jax", "torch-eager", "torch-compile", "torch-compile-cudagraphs")


# --- what every column shares ---------------------------------------------------------------------


class Setup:
    """Data, initial parameters and minibatch indices, as numpy arrays."""

    def __init__(self, batch_size: int, total_steps: int, seed: int) -> None:
        self.x_tr, self.y_tr, self.x_te, self.y_te = ex.load_data()
        self.batch_size = batch_size
        n = len(self.x_tr)
        if not 1 <= batch_size <= n:
            raise SystemExit(f"--batch-size must be between 1 and {n}; got {batch_size}")
        rng = np.random.default_rng(seed)
        self.params: dict[str, np.ndarray] = {}
        for i, (a, b) in enumerate(zip(ex.LAYERS[:-1], ex.LAYERS[1:])):
            self.params[f"w{i}"] = (rng.standard_normal((a, b)) * np.sqrt(2.0 / a)).astype(
                np.float32)
            self.params[f"b{i}"] = np.zeros(b, np.float32)
        # each epoch a fresh permutation, cut into full batches (the partial one is left out)
        per_epoch = n // batch_size
        rows: list[np.ndarray] = []
        while len(rows) < total_steps:
            perm = rng.permutation(n).astype(np.int32)
            rows.extend(perm[k * batch_size:(k + 1) * batch_size] for k in range(per_epoch))
        self.batches = np.stack(rows[:total_steps])  # (steps, batch_size) int32


class Column:
    """One framework's step, with what the timing loop needs."""

    name = ""
    device = ""
    cpu = False  # whether it ran on the CPU

    def step(self, s: int) -> None:  # run training step number s (do not wait)
        raise NotImplementedError

    def sync(self) -> float:  # wait for all queued work; return the last loss
        raise NotImplementedError

    def accuracy(self) -> float:  # test accuracy of the current parameters
        raise NotImplementedError


def adam_np_consts() -> tuple[float, float, float, float]:
    return ex.LEARNING_RATE, ex.BETA1, ex.BETA2, ex.EPS


# --- fusec ----------------------------------------------------------------------------------------


class FusecColumn(Column):
    name = "fusec"

    def __init__(self, setup: Setup) -> None:
        from fusec import lax

        dev = fusec.default_device()
        self.device = f"{dev.adapter} ({dev.backend})"
        self.cpu = dev.is_cpu_fallback or dev.adapter_type == "CPU"
        bs = setup.batch_size

        @fusec.gpu_jit(donate_argnums=(0, 1))
        def step(params: Any, state: Any, x: Any, y: Any, batches: Any, s: Any) -> Any:
            idx = lax.dynamic_slice(batches, (s, 0), (1, bs)).reshape(bs)
            loss, grads = fusec.value_and_grad(ex.loss_fn)(params, x[idx], y[idx])
            params, state = ex.adam_update(params, grads, state)
            return params, state, loss

        put = fusec.device_put
        # one upload per leaf: every leaf its own buffer (donation writes into them)
        self.params = {k: put(v) for k, v in setup.params.items()}
        self.state = {"m": {k: put(np.zeros_like(v)) for k, v in setup.params.items()},
                      "v": {k: put(np.zeros_like(v)) for k, v in setup.params.items()},
                      "t": put(np.zeros((), np.float32))}
        self.x, self.y = put(setup.x_tr), put(setup.y_tr)
        self.batches = put(setup.batches)
        self.x_te, self.y_te = put(setup.x_te), put(setup.y_te)
        self._step = step
        self.loss: Any = None

    def step(self, s: int) -> None:
        self.params, self.state, self.loss = self._step(self.params, self.state, self.x, self.y,
                                                        self.batches, s)

    def sync(self) -> float:
        return float(np.asarray(self.loss))

    def accuracy(self) -> float:
        return float(np.asarray(ex.evaluate(self.params, self.x_te, self.y_te)[1]))


# --- JAX ------------------------------------------------------------------------------------------


class JaxColumn(Column):
    name = "jax"

    def __init__(self, setup: Setup) -> None:
        import jax.numpy as jnp

        assert jax is not None
        jax.config.update("jax_default_matmul_precision", "highest")  # float32 matmuls
        d = jax.devices()[0]
        self.device = f"{d.device_kind} ({d.platform})"
        self.cpu = d.platform == "cpu"
        lr, b1, b2, eps = adam_np_consts()
        n_classes = ex.LAYERS[-1]
        tm = jax.tree_util.tree_map

        def forward(p: Any, x: Any) -> Any:
            n = len(p) // 2
            for i in range(n):
                x = x @ p[f"w{i}"] + p[f"b{i}"]
                if i < n - 1:
                    x = jax.nn.relu(x)
            return x

        def loss_fn(p: Any, x: Any, y: Any) -> Any:
            logp = jax.nn.log_softmax(forward(p, x))
            return -jnp.mean(jnp.sum(logp * jax.nn.one_hot(y, n_classes), axis=-1))

        def step(p: Any, st: Any, x: Any, y: Any, batches: Any, s: Any) -> Any:
            idx = batches[s]
            loss, g = jax.value_and_grad(loss_fn)(p, x[idx], y[idx])
            t = st["t"] + 1.0
            m = tm(lambda m, g: b1 * m + (1.0 - b1) * g, st["m"], g)
            v = tm(lambda v, g: b2 * v + (1.0 - b2) * g * g, st["v"], g)
            size = lr * jnp.sqrt(1.0 - b2 ** t) / (1.0 - b1 ** t)
            p = tm(lambda p, m, v: p - size * m / (jnp.sqrt(v) + eps), p, m, v)
            return p, {"m": m, "v": v, "t": t}, loss

        def accuracy(p: Any, x: Any, y: Any) -> Any:
            return jnp.mean(jnp.argmax(forward(p, x), axis=-1) == y)

        put = jax.device_put
        self.params = {k: put(v) for k, v in setup.params.items()}
        self.state = {"m": tm(jnp.zeros_like, self.params), "v": tm(jnp.zeros_like, self.params),
                      "t": jnp.zeros((), jnp.float32)}
        self.x, self.y = put(setup.x_tr), put(setup.y_tr)
        self.batches = put(setup.batches)
        self.x_te, self.y_te = put(setup.x_te), put(setup.y_te)
        self._step = jax.jit(step, donate_argnums=(0, 1))
        self._acc = jax.jit(accuracy)
        self.loss: Any = None

    def step(self, s: int) -> None:
        self.params, self.state, self.loss = self._step(self.params, self.state, self.x, self.y,
                                                        self.batches, s)

    def sync(self) -> float:
        return float(self.loss.block_until_ready())

    def accuracy(self) -> float:
        return float(self._acc(self.params, self.x_te, self.y_te))


# --- torch ----------------------------------------------------------------------------------------


def _torch_device() -> Any:
    assert torch is not None
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 matmuls, as fusec and JAX here
    torch.backends.cudnn.allow_tf32 = False
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _torch_forward(p: dict[str, Any], x: Any) -> Any:
    assert torch is not None
    n = len(p) // 2
    for i in range(n):
        x = x @ p[f"w{i}"] + p[f"b{i}"]
        if i < n - 1:
            x = torch.relu(x)
    return x


class _TorchBase(Column):
    def __init__(self, setup: Setup) -> None:
        assert torch is not None
        self.dev = _torch_device()
        self.device = (torch.cuda.get_device_name(self.dev) if self.dev.type == "cuda"
                       else "cpu") + f" ({self.dev.type})"
        self.cpu = self.dev.type != "cuda"

        def put(a: np.ndarray) -> Any:
            return torch.from_numpy(np.ascontiguousarray(a)).to(self.dev)

        self.put = put
        self.x, self.x_te = put(setup.x_tr), put(setup.x_te)
        self.y, self.y_te = put(setup.y_tr).long(), put(setup.y_te).long()
        self.batches = put(setup.batches).long()
        self.params = {k: put(v) for k, v in setup.params.items()}
        self.loss: Any = None

    def sync(self) -> float:
        assert torch is not None
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
        return float(self.loss)

    def accuracy(self) -> float:
        assert torch is not None
        with torch.no_grad():
            pred = _torch_forward(self.params, self.x_te).argmax(dim=-1)
            return float((pred == self.y_te).float().mean())


class TorchEagerColumn(_TorchBase):
    name = "torch-eager"

    def __init__(self, setup: Setup) -> None:
        super().__init__(setup)
        assert torch is not None
        lr, b1, b2, eps = adam_np_consts()
        for v in self.params.values():
            v.requires_grad_(True)
        self.opt = torch.optim.Adam(list(self.params.values()), lr=lr, betas=(b1, b2), eps=eps,
                                    foreach=True)

    def step(self, s: int) -> None:
        assert torch is not None
        idx = self.batches[s]
        self.opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(_torch_forward(self.params, self.x[idx]),
                                                 self.y[idx])
        loss.backward()
        self.opt.step()
        self.loss = loss.detach()


class TorchCompileColumn(_TorchBase):
    name = "torch-compile"
    mode: str | None = None

    def __init__(self, setup: Setup) -> None:
        super().__init__(setup)
        assert torch is not None
        lr, b1, b2, eps = adam_np_consts()
        F = torch.nn.functional

        def loss_fn(p: dict[str, Any], x: Any, y: Any) -> Any:
            return F.cross_entropy(_torch_forward(p, x), y)

        grad_and_value = torch.func.grad_and_value(loss_fn)

        def step(p: dict[str, Any], m: dict[str, Any], v: dict[str, Any], t: Any, x: Any,
                 y: Any, idx: Any) -> Any:
            # the state is updated in place (as fusec's and JAX's donated buffers are): the
            # CUDA-graph mode then replays one graph over the same, static, addresses
            g, loss = grad_and_value(p, x[idx], y[idx])
            t.add_(1.0)
            size = lr * torch.sqrt(1.0 - b2 ** t) / (1.0 - b1 ** t)
            for k in p:
                m[k].mul_(b1).add_((1.0 - b1) * g[k])
                v[k].mul_(b2).add_((1.0 - b2) * g[k] * g[k])
                p[k].sub_(size * m[k] / (torch.sqrt(v[k]) + eps))
            return loss

        self._step = torch.compile(step, fullgraph=True, mode=self.mode)
        self.m = {k: torch.zeros_like(w) for k, w in self.params.items()}
        self.v = {k: torch.zeros_like(w) for k, w in self.params.items()}
        self.t = torch.zeros((), dtype=torch.float32, device=self.dev)
        if self.mode == "reduce-overhead":
            # inputs the graph mutates must keep their addresses for the graph to be replayed
            for tensor in [*self.params.values(), *self.m.values(), *self.v.values(), self.t]:
                torch._dynamo.mark_static_address(tensor)

    def step(self, s: int) -> None:
        assert torch is not None
        if self.mode == "reduce-overhead":
            # a new iteration: the previous replay's output (the loss) may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        self.loss = self._step(self.params, self.m, self.v, self.t, self.x, self.y,
                               self.batches[s])


class TorchCudagraphsColumn(TorchCompileColumn):
    name = "torch-compile-cudagraphs"
    mode = "reduce-overhead"


MAKERS: dict[str, Callable[[Setup], Column]] = {
    "fusec": FusecColumn, "jax": JaxColumn, "torch-eager": TorchEagerColumn,
    "torch-compile": TorchCompileColumn, "torch-compile-cudagraphs": TorchCudagraphsColumn,
}


# --- timing ---------------------------------------------------------------------------------------


def run_column(col: Column, warmup: int, steps: int, repeats: int) -> dict[str, Any]:
    """Warm up (the first step timed apart), then time ``repeats`` blocks of ``steps`` steps."""
    t = time.perf_counter()
    col.step(0)
    col.sync()
    first = time.perf_counter() - t
    s = 1
    for _ in range(warmup - 1):
        col.step(s)
        s += 1
    col.sync()
    compiles = fusec.cache_info()
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(steps):
            col.step(s)
            s += 1
        loss = col.sync()
        rates.append(steps / (time.perf_counter() - t))
    rate = statistics.median(rates)
    after = fusec.cache_info()
    extra = {}
    if col.name == "fusec":  # the timed steps must reuse the one compiled step
        extra = {"traces_while_timed": after.traces - compiles.traces,
                 "pipelines_compiled_while_timed":
                     after.pipelines_compiled - compiles.pipelines_compiled}
    return {**extra, "device": col.device, "on_cpu": col.cpu, "first_step_s": first,
            "steps_per_s": rate, "ms_per_step": 1e3 / rate, "steps_per_s_blocks": rates,
            "steps_trained": s, "final_loss": loss, "test_accuracy": col.accuracy()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=500, help="steps per timed block")
    p.add_argument("--warmup", type=int, default=50, help="steps before timing (>= 1)")
    p.add_argument("--repeats", type=int, default=3, help="timed blocks; the median is reported")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=",".join(COLUMNS),
                   help=f"comma-separated columns out of {','.join(COLUMNS)}")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--strict", action="store_true",
                   help="fail if a library is missing or a column ran on the CPU")
    a = p.parse_args(argv)
    if a.warmup < 1 or a.steps < 1 or a.repeats < 1:
        raise SystemExit("--warmup, --steps and --repeats must be at least 1")
    cols = [c.strip() for c in a.only.split(",") if c.strip()]
    bad = [c for c in cols if c not in MAKERS]
    if bad:
        raise SystemExit(f"unknown column(s) {bad}; choose from {','.join(COLUMNS)}")

    setup = Setup(a.batch_size, a.warmup + a.steps * a.repeats, a.seed)
    results: dict[str, Any] = {}
    for name in cols:
        if name.startswith("torch") and torch is None:
            results[name] = {"skipped": "torch is not installed"}
            continue
        if name == "torch-compile-cudagraphs" and not torch.cuda.is_available():
            results[name] = {"skipped": "CUDA graphs need a CUDA device"}
            continue
        if name == "jax" and jax is None:
            results[name] = {"skipped": "jax is not installed"}
            continue
        try:
            results[name] = run_column(MAKERS[name](setup), a.warmup, a.steps, a.repeats)
        except Exception as e:  # noqa: BLE001 - one broken column must not lose the others
            results[name] = {"error": f"{type(e).__name__}: {e}",
                             "traceback": traceback.format_exc(limit=8)}

    report = {
        "what": "digits MLP training steps per second, one process",
        "config": {"layers": list(ex.LAYERS), "batch_size": a.batch_size, "optimizer": "adam",
                   "lr": ex.LEARNING_RATE, "warmup": a.warmup, "steps": a.steps,
                   "repeats": a.repeats, "seed": a.seed, "train_examples": len(setup.x_tr),
                   "test_examples": len(setup.x_te), "float32_matmuls": True},
        "host": {"python": platform.python_version(), "machine": platform.machine(),
                 "fusec": fusec.__version__ if hasattr(fusec, "__version__") else None,
                 "torch": getattr(torch, "__version__", None), "jax": _jax_version()},
        "results": results,
    }
    print(_table(results))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {a.out}")
    if a.strict:
        wrong = [n for n, r in results.items() if "steps_per_s" not in r or r["on_cpu"]]
        if wrong:
            raise SystemExit(f"--strict: these columns did not run on a GPU: {wrong}")
    return report


def _jax_version() -> str | None:
    return None if jax is None else str(jax.__version__)


def _table(results: dict[str, Any]) -> str:
    lines = [f"{'column':<26} {'steps/s':>9} {'ms/step':>8} {'first step s':>12} "
             f"{'test acc':>8}  device"]
    for name, r in results.items():
        if "steps_per_s" in r:
            lines.append(f"{name:<26} {r['steps_per_s']:9.1f} {r['ms_per_step']:8.3f} "
                         f"{r['first_step_s']:12.3f} {r['test_accuracy']:8.4f}  {r['device']}")
        else:
            why = r.get("skipped") or r.get("error", "")
            lines.append(f"{name:<26} {'-':>9} {'-':>8} {'-':>12} {'-':>8}  {why.splitlines()[0]}")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
