"""A short tour of fusec: ``python -m fusec.demo``.

Jit-compiles a few small functions, runs them on random data, checks each result against numpy, and
shows the kernels each one was lowered to (the WGSL of one of them in full) and the cache counters.
Exits with status 1 if any result is off by more than its tolerance.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import fusec
import fusec.numpy as fnp
from fusec import nn

# --- the functions --------------------------------------------------------------------------------


@fusec.gpu_jit
def elementwise_chain(x: Any, y: Any) -> Any:
    """Seven elementwise ops over a broadcast pair: one fused kernel."""
    z = fnp.exp(-(x * x)) + fnp.sqrt(fnp.abs(y))
    return fnp.where(z > 1.0, fnp.tanh(z), z * 0.5)


@fusec.gpu_jit
def row_softmax(x: Any) -> Any:
    return nn.softmax(x, axis=-1)


@fusec.gpu_jit
def dense_gelu(x: Any, w: Any, b: Any) -> Any:
    """A tiled matmul with the bias and gelu fused into its epilogue: one kernel."""
    return nn.gelu(x @ w + b)


@fusec.gpu_jit(static_argnames=("axis",))
def mean_square(x: Any, axis: int = 0) -> Any:
    """A reduction that stays on the GPU, with its elementwise prologue fused in."""
    return fnp.mean(x * x, axis=axis)


@fusec.gpu_jit
def embed_scatter_sort(table: Any, ids: Any, pos: Any) -> Any:
    """The array language: a gather fused with a slice and relu (one kernel), a scatter-add of
    the rows back into the table, and a sort of each row."""
    h = nn.relu(fnp.take(table, ids, axis=0) + pos[: ids.shape[0]])
    counts = fnp.zeros(table.shape[0], "float32").at[ids].add(1.0)
    return fnp.sort(h, axis=-1)[:, ::-1] + counts[ids][:, None]


# --- numpy references (float64) -------------------------------------------------------------------


def _embed_ref(table: np.ndarray, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
    ids = ids.astype(np.int64)  # (main hands references float64 copies of every argument)
    h = np.maximum(table.astype(np.float64)[ids] + pos[: len(ids)], 0.0)
    counts = np.zeros(table.shape[0])
    np.add.at(counts, ids, 1.0)
    return np.sort(h, axis=-1)[:, ::-1] + counts[ids][:, None]


def _gelu_ref(v: np.ndarray) -> np.ndarray:
    return 0.5 * v * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (v + 0.044715 * v ** 3)))


def _softmax_ref(v: np.ndarray) -> np.ndarray:
    e = np.exp(v - v.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _chain_ref(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    z = np.exp(-(x * x)) + np.sqrt(np.abs(y))
    return np.where(z > 1.0, np.tanh(z), z * 0.5)


@dataclass
class Case:
    title: str
    fn: Any  # a fusec.JitFunction
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    reference: Callable[..., np.ndarray]
    tol: float


def _cases(rng: np.random.Generator) -> list[Case]:
    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    x = rand(1000, 37)
    y = rand(37)  # broadcast along the rows of x
    s = rand(64, 129) * 4
    a, w, b = rand(33, 70), rand(70, 45) * 0.2, rand(45)
    r = rand(300, 17)
    return [
        Case("elementwise chain  where(z > 1, tanh(z), z/2), z = exp(-x*x) + sqrt|y|",
             elementwise_chain, (x, y), {}, _chain_ref, 1e-5),
        Case("softmax            nn.softmax(x, axis=-1)", row_softmax, (s,), {},
             _softmax_ref, 1e-5),
        Case("dense + gelu       nn.gelu(x @ w + b)", dense_gelu, (a, w, b), {},
             lambda x, w, b: _gelu_ref(x.astype(np.float64) @ w + b), 1e-4),
        Case("reduction          fnp.mean(x * x, axis=0)", mean_square, (r,), {"axis": 0},
             lambda x, axis: np.mean(x.astype(np.float64) ** 2, axis=axis), 1e-5),
        Case("indexing           take + slice, .at[ids].add, sort, x[:, ::-1]",
             embed_scatter_sort, (rand(50, 16), rng.integers(0, 50, 21).astype(np.int32),
                                  rand(32, 16)), {}, _embed_ref, 1e-6),
    ]


def _shapes(args: tuple[Any, ...]) -> str:
    return ", ".join(f"{a.dtype}{list(a.shape)}" for a in args)


def main() -> int:
    rng = np.random.default_rng(0)
    print(f"fusec {fusec.__version__}")
    dev = fusec.default_device()
    print(f"device: {dev}")
    if dev.reason:
        print(f"        ({dev.reason})")
    print()

    ok = True
    lowered_all = []
    for case in _cases(rng):
        out = np.asarray(case.fn(*case.args, **case.kwargs))
        ref = case.reference(*(a.astype(np.float64) for a in case.args), **case.kwargs)
        err = float(np.max(np.abs(out - ref) / (1.0 + np.abs(ref))))
        good = out.shape == ref.shape and err <= case.tol
        ok &= good
        lowered = case.fn.lower(*case.args, **case.kwargs)
        lowered_all.append((case, lowered))
        print(f"{case.title}")
        print(f"  in: {_shapes(case.args)}  out: {out.dtype}{list(out.shape)}")
        print(f"  max error vs numpy (float64): {err:.2e}  (tolerance {case.tol:.0e}) "
              f"{'ok' if good else 'FAILED'}")
        names = ", ".join(k.name for k in lowered.kernels)
        print(f"  {len(lowered.kernels)} kernel(s): {names}")
        print()

    # The lowered IR of the matmul function and the WGSL of its fused epilogue kernel.
    case, lowered = lowered_all[2]
    print(f"lowered IR of {case.fn.name} (one `kernel` equation per GPU kernel):")
    print(lowered.as_text("ir"))
    print()
    k = lowered.kernels[-1]
    print(f"WGSL of kernel {k.name} ({k.kind}, grid {k.grid}):")
    print(k.wgsl)

    # A second call with the same signature traces nothing and compiles nothing.
    before = fusec.cache_info()
    dense_gelu(*lowered_all[2][0].args)
    delta = fusec.cache_info() - before
    print(f"second call of {case.fn.name}: traces={delta.traces}, "
          f"pipelines compiled={delta.pipelines_compiled}, hits={delta.hits}")
    print(f"cache_info(): {fusec.cache_info()}")
    print()
    print("all results match numpy" if ok else "SOME RESULTS DO NOT MATCH NUMPY")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
