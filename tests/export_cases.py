"""Programs the export tests run from Python (tests/test_export.py) and in the browser
(tests/test_export_web.py): each a function, argument specs, fresh random inputs, and a float64
numpy reference."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import fusec
import fusec.numpy as fnp
from fusec import nn

S = fusec.ShapeDtype


@dataclass
class Case:
    name: str
    make: Callable[[np.random.Generator], tuple[Callable[..., Any], tuple[np.ndarray, ...],
                                                Callable[..., Any]]]
    tuning: str | None = None  # None: that of the test's device


def _chain(rng: np.random.Generator) -> Any:
    n = 1001  # odd, prime-ish, not a multiple of 4
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    x[[3, 10, 500]] = [np.nan, np.inf, -np.inf]
    y[7] = np.nan

    def f(x: Any, y: Any) -> Any:
        return fnp.tanh(x * 2.0 + y) * fnp.exp(-fnp.abs(y)) + fnp.maximum(x, 0.5)

    def ref(x: Any, y: Any) -> Any:
        x, y = x.astype(np.float64), y.astype(np.float64)
        with np.errstate(invalid="ignore"):
            return np.tanh(x * 2 + y) * np.exp(-np.abs(y)) + np.maximum(x, 0.5)
    return f, (x, y), ref


def _softmax(rng: np.random.Generator) -> Any:
    x = (3 * rng.standard_normal((37, 129))).astype(np.float32)

    def ref(x: Any) -> Any:
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    return (lambda x: nn.softmax(x, axis=-1)), (x,), ref


def _matmul(rng: np.random.Generator) -> Any:
    a = rng.standard_normal((131, 67)).astype(np.float32)
    w = rng.standard_normal((67, 97)).astype(np.float32)
    b = rng.standard_normal(97).astype(np.float32)

    def f(a: Any, w: Any, b: Any) -> Any:
        return nn.gelu(a @ w + b) + 1.0  # bias, activation and a constant: the epilogue

    def ref(a: Any, w: Any, b: Any) -> Any:
        h = a.astype(np.float64) @ w + b
        return 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3))) + 1
    return f, (a, w, b), ref


def _gather(rng: np.random.Generator) -> Any:
    table = rng.standard_normal((50, 13)).astype(np.float32)
    ids = rng.integers(0, 50, size=(7, 3)).astype(np.int32)
    return (lambda t, i: fnp.take(t, i, axis=0) * 2.0), (table, ids), \
        (lambda t, i: t.astype(np.float64)[i] * 2)


def _dtypes(rng: np.random.Generator) -> Any:
    x = rng.standard_normal(23).astype(np.float32)
    k = rng.integers(-9, 9, size=23).astype(np.int32)

    def f(x: Any, k: Any) -> Any:
        return {"pos": x > 0, "sum": (k * 3).sum(), "u": k.astype(np.uint32) // 2,
                "pair": (x * k, None)}

    def ref(x: Any, k: Any) -> Any:
        return {"pos": x > 0, "sum": np.int64(k * 3).sum(), "u": k.astype(np.uint32) // 2,
                "pair": (x.astype(np.float64) * k, None)}
    return f, (x, k), ref


def block_weights(rng: np.random.Generator, d: int = 48, ff: int = 96, layers: int = 2
                  ) -> list[dict[str, np.ndarray]]:
    def m(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / math.sqrt(shape[0])).astype(np.float32)
    return [{"wq": m(d, d), "wk": m(d, d), "wv": m(d, d), "wo": m(d, d), "w1": m(d, ff),
             "b1": (0.1 * rng.standard_normal(ff)).astype(np.float32), "w2": m(ff, d),
             "g1": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
             "g2": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)}
            for _ in range(layers)]


def transformer(xp: Any, ws: list[dict[str, Any]], x: Any, heads: int = 4) -> Any:
    """A pre-norm transformer (attention, then a GELU MLP) over x (B, S, D), with ``xp``
    fusec.numpy (inside the export) or numpy (the float64 reference)."""
    b, s, d = x.shape
    dh = d // heads

    def norm(v: Any, g: Any) -> Any:
        mu = v.mean(-1, keepdims=True)
        var = ((v - mu) ** 2).mean(-1, keepdims=True)
        return (v - mu) / xp.sqrt(var + 1e-5) * g

    def split(v: Any) -> Any:
        return v.reshape(b, s, heads, dh).transpose(0, 2, 1, 3)

    for w in ws:
        h = norm(x, w["g1"])
        q, k, v = split(h @ w["wq"]), split(h @ w["wk"]), split(h @ w["wv"])
        sc = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh)
        p = xp.exp(sc - sc.max(-1, keepdims=True))
        p = p / p.sum(-1, keepdims=True)
        o = (p @ v).transpose(0, 2, 1, 3).reshape(b, s, d)
        x = x + o @ w["wo"]
        h = norm(x, w["g2"]) @ w["w1"] + w["b1"]
        g = 0.5 * h * (1 + xp.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
        x = x + g @ w["w2"]
    return x


def _block(rng: np.random.Generator) -> Any:
    ws = block_weights(rng)
    x = rng.standard_normal((2, 19, 48)).astype(np.float32)
    ws64 = [{k: v.astype(np.float64) for k, v in w.items()} for w in ws]
    return (lambda x: transformer(fnp, ws, x)), (x,), \
        (lambda x: transformer(np, ws64, x.astype(np.float64)))


CASES = [Case("chain", _chain), Case("softmax", _softmax), Case("matmul", _matmul),
         Case("matmul_gpu_tuned", _matmul, tuning="gpu"), Case("gather", _gather),
         Case("dtypes", _dtypes), Case("block2", _block)]


def leaves(tree: Any) -> list[Any]:
    """The leaves of a nested tuple/list/dict (dicts by sorted key), None dropped."""
    if tree is None:
        return []
    if isinstance(tree, dict):
        return [x for k in sorted(tree) for x in leaves(tree[k])]
    if isinstance(tree, (tuple, list)) and not isinstance(tree, np.ndarray):
        return [x for t in tree for x in leaves(t)]
    return [tree]


def check(got: Any, want: Any, what: str) -> None:
    """float32 tolerances (relative to the reference's scale); exact for integers and bools."""
    g, w = np.asarray(got), np.asarray(want)
    assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
    if w.dtype.kind in "biu":
        np.testing.assert_array_equal(g.astype(np.float64), w.astype(np.float64), err_msg=what)
        return
    scale = float(np.nanmax(np.abs(np.where(np.isfinite(w), w, 0)))) if w.size else 1.0
    np.testing.assert_allclose(g.astype(np.float64), w, rtol=2e-5, atol=2e-5 * max(scale, 1.0),
                               err_msg=what)
