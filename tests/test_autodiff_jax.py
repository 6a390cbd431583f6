"""fusec.grad against jax.grad on whole programs: an MLP, softmax cross-entropy, layer_norm, a
gather (take and .at[].add), the bench transformer block, a scan, and the NaN conventions.

JAX runs in float32 (64-bit types off, its default; on the CPU, or on the GPU machine's CUDA device
with its matmuls at "highest" precision), fusec on the wgpu device; both
round differently, so gradients are compared with float32 tolerances: 2e-4 relative to each
gradient's scale (its largest magnitude), room for the few-ULP differences of transcendental
functions and sums of up to a few hundred terms in another order. A wrong rule is off by O(1).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusec
import fusec.numpy as fnp
from fusec import nn
from fusec.bench import FusecOps, _transformer

# float32 products as written: on an NVIDIA GPU JAX's default precision rounds matmul operands to
# TF32 (errors of 1e-3 relative), which is not the reference these tolerances are for
jax.config.update("jax_default_matmul_precision", "highest")

RTOL = 2e-4
F32 = np.float32


def assert_tree_close(got: Any, want: Any, what: str, rtol: float = RTOL) -> None:
    g_leaves, g_tree = jax.tree_util.tree_flatten(
        jax.tree_util.tree_map(np.asarray, got, is_leaf=lambda x: isinstance(x, fusec.Array)))
    w_leaves, w_tree = jax.tree_util.tree_flatten(want)
    assert g_tree == w_tree, f"{what}: structure {g_tree} != {w_tree}"
    for k, (g, w) in enumerate(zip(g_leaves, w_leaves)):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert g.shape == w.shape, f"{what} leaf {k}: shape {g.shape} != {w.shape}"
        scale = max(float(np.max(np.abs(w))), 1e-6)
        err = float(np.max(np.abs(g - w))) if g.size else 0.0
        assert err <= rtol * scale, f"{what} leaf {k}: error {err:.3g} at scale {scale:.3g}"


def _n(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(F32)


def test_mlp_regression(rng: np.random.Generator) -> None:
    x, y = _n(rng, 16, 7), _n(rng, 16, 3)
    params = {"w1": _n(rng, 7, 32, scale=0.4), "b1": _n(rng, 32, scale=0.1),
              "w2": _n(rng, 32, 3, scale=0.2), "b2": _n(rng, 3, scale=0.1)}

    def loss(B: Any, act: Any, p: Any, x: Any, y: Any) -> Any:
        h = act(x @ p["w1"] + p["b1"])
        h = B.tanh(h @ p["w2"] + p["b2"])
        return B.mean((h - y) ** 2)

    got = fusec.gpu_jit(fusec.value_and_grad(
        lambda p, x, y: loss(fnp, nn.relu, p, x, y)))(params, x, y)
    want = jax.value_and_grad(lambda p, x, y: loss(jnp, jax.nn.relu, p, x, y))(params, x, y)
    assert_tree_close(got[0], want[0], "MLP loss")
    assert_tree_close(got[1], want[1], "MLP gradient")


@pytest.mark.parametrize("form", ["index", "take_along_axis"])
def test_softmax_cross_entropy(form: str, rng: np.random.Generator) -> None:
    x, w = _n(rng, 13, 10), _n(rng, 10, 29, scale=0.5)
    labels = rng.integers(0, 29, 13).astype(np.int32)

    def loss(B: Any, log_softmax: Any, w: Any, x: Any) -> Any:
        logp = log_softmax(x @ w)
        if form == "index":
            picked = logp[B.arange(13), labels]
        else:
            picked = B.take_along_axis(logp, labels[:, None], axis=1)
        return -B.mean(picked)

    got = fusec.gpu_jit(fusec.grad(lambda w, x: loss(fnp, nn.log_softmax, w, x),
                                   argnums=(0, 1)))(w, x)
    want = jax.grad(lambda w, x: loss(jnp, jax.nn.log_softmax, w, x), argnums=(0, 1))(w, x)
    assert_tree_close(got, want, f"cross-entropy gradient ({form})")


def test_layer_norm(rng: np.random.Generator) -> None:
    x, r = _n(rng, 6, 37), _n(rng, 6, 37)
    g, b = 1.0 + _n(rng, 37, scale=0.1), _n(rng, 37, scale=0.1)

    def jax_layer_norm(x: Any, g: Any, b: Any) -> Any:
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5) * g + b

    got = fusec.gpu_jit(fusec.grad(lambda x, g, b: fnp.sum(nn.layer_norm(x, g, b) * r) + fnp.sum(
        nn.layer_norm(x * 2.0) ** 2), argnums=(0, 1, 2)))(x, g, b)
    want = jax.grad(lambda x, g, b: jnp.sum(jax_layer_norm(x, g, b) * r) + jnp.sum(
        jax_layer_norm(x * 2.0, 1.0, 0.0) ** 2), argnums=(0, 1, 2))(x, g, b)
    assert_tree_close(got, want, "layer_norm gradient")


def test_gather_and_scatter_add(rng: np.random.Generator) -> None:
    table, upd, r = _n(rng, 11, 5), _n(rng, 7, 5), _n(rng, 9, 5)
    ids = np.array([3, 0, 10, 3, 3, 7, 1, 0, 9], np.int32)  # repeated rows
    at = np.array([2, -1, 4, 2, 0, -11, 2], np.int32)  # negative and repeated places

    def f(B: Any, table: Any, upd: Any) -> Any:
        rows = B.take(table, ids, axis=0)
        added = table.at[at].add(upd * rows[:7])
        return B.sum(B.sin(rows) * r) + B.sum(added ** 2) + B.sum(table[ids[:4], 2:4])

    got = fusec.gpu_jit(fusec.grad(lambda t, u: f(fnp, t, u), argnums=(0, 1)))(table, upd)
    want = jax.grad(lambda t, u: f(jnp, t, u), argnums=(0, 1))(table, upd)
    assert_tree_close(got, want, "gather/scatter-add gradient")


class _JaxOps:
    """The bench transformer's ops namespace for JAX (as fusec.bench.FusecOps)."""

    @staticmethod
    def rms_norm(x: Any, w: Any) -> Any:
        return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w

    @staticmethod
    def softmax(x: Any) -> Any:
        return jax.nn.softmax(x, axis=-1)

    @staticmethod
    def silu(x: Any) -> Any:
        return x * jax.nn.sigmoid(x)

    @staticmethod
    def split_heads(x: Any, heads: int, transposed: bool = False) -> Any:
        s, d = x.shape
        return jnp.transpose(x.reshape(s, heads, d // heads),
                             (1, 2, 0) if transposed else (1, 0, 2))

    @staticmethod
    def merge_heads(o: Any) -> Any:
        h, s, dh = o.shape
        return jnp.transpose(o, (1, 0, 2)).reshape(s, h * dh)


def test_bench_transformer_block(rng: np.random.Generator) -> None:
    s, d, heads, f = 8, 16, 2, 24
    x, r = _n(rng, s, d), _n(rng, s, d)

    def w(fan_in: int, *shape: int) -> np.ndarray:
        return _n(rng, *shape, scale=1.0 / math.sqrt(fan_in))

    params = [1.0 + _n(rng, d, scale=0.1), w(d, d, d), w(d, d, d), w(d, d, d), w(d, d, d),
              1.0 + _n(rng, d, scale=0.1), w(d, d, f), w(d, d, f), w(f, f, d)]

    def loss(B: Any, sum_: Any, x: Any, params: Any) -> Any:
        return sum_(_transformer(heads, B, x, *params) * r)

    got = fusec.gpu_jit(fusec.grad(lambda x, p: loss(FusecOps, fnp.sum, x, p),
                                   argnums=(0, 1)))(x, params)
    want = jax.grad(lambda x, p: loss(_JaxOps, jnp.sum, x, p), argnums=(0, 1))(x, params)
    assert_tree_close(got, want, "transformer block gradient")


# --- a scan ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [3, 23])  # unrolled (short) and a compiled loop
def test_scan_recurrence(rng: np.random.Generator, length: int) -> None:
    w, u = _n(rng, 6, 6, scale=0.3), _n(rng, 6, scale=0.2)
    h0, xs = _n(rng, 4, 6), _n(rng, length, 4, 6)

    def loss(np_: Any, scan: Any, w: Any, u: Any, h0: Any, xs: Any) -> Any:
        def step(h: Any, x: Any) -> Any:
            h = np_.tanh(h @ w + x * u)
            return h, np_.sum(h * h)

        h, ys = scan(step, h0, xs)
        return np_.sum(h) + np_.sum(ys * np_.arange(length, dtype=np.float32))

    got = fusec.gpu_jit(fusec.value_and_grad(
        lambda *a: loss(fnp, fusec.lax.scan, *a), argnums=(0, 1, 2, 3)))(w, u, h0, xs)
    want = jax.value_and_grad(lambda *a: loss(jnp, jax.lax.scan, *a),
                              argnums=(0, 1, 2, 3))(w, u, h0, xs)
    assert_tree_close(got[0], want[0], "scan loss")
    assert_tree_close(got[1], want[1], "scan gradient")


# --- NaN conventions ------------------------------------------------------------------------------


def test_nan_conventions_match_jax() -> None:
    nan = np.float32(np.nan)
    v = np.array([nan, -1.0, 2.0, 2.0], F32)
    cond = np.array([True, False, True, False])
    ct = np.array([nan, nan, 1.0, 3.0], F32)
    ones = np.ones(4, F32)

    def programs(B: Any, relu: Any) -> dict[str, Any]:
        return {
            "relu": lambda a: B.sum(relu(a)),
            "maximum": lambda a: B.sum(B.maximum(a, 2.0)),
            "minimum": lambda a: B.sum(B.minimum(a, -1.0)),
            "max": lambda a: B.max(a),
            "where": lambda a: B.sum(B.where(cond, a, ones) * ct),
            "where_other": lambda a: B.sum(B.where(cond, ones, a) * ct),
            "clip": lambda a: B.sum(B.clip(a, -0.5, 1.5)),
        }

    ours = programs(fnp, nn.relu)
    theirs = programs(jnp, jax.nn.relu)

    @fusec.gpu_jit
    def run(v: Any) -> Any:
        return {k: fusec.grad(f)(v) for k, f in ours.items()}

    got = run(v)
    for k, f in theirs.items():
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(jax.grad(f)(v)),
                                      err_msg=f"grad of {k} at NaN")
