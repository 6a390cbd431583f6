"""The backward pass is compiled like any program: what its kernels look like."""

from __future__ import annotations

import numpy as np

import fusec
import fusec.numpy as fnp
from fusec import nn


def _kernels(f, *args):  # type: ignore[no-untyped-def]
    return fusec.gpu_jit(f).lower(*args).kernels


def test_matmul_backward_reads_transposed_operands_in_place() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 128)).astype(np.float32)
    w = rng.standard_normal((128, 192)).astype(np.float32)
    b = rng.standard_normal(192).astype(np.float32)

    def loss(w, b, x):  # type: ignore[no-untyped-def]
        return fnp.sum(nn.relu(x @ w + b) ** 2)

    ks = _kernels(fusec.grad(loss, argnums=(0, 1)), w, b, x)
    kinds = [k.name.split("_")[1] for k in ks]
    # forward product with the backward's elementwise part as its epilogue, the bias gradient
    # (a column sum: one kernel, or two where split_reductions splits it for a GPU), and the
    # weight gradient: no kernel of its own for a transpose or an elementwise step
    assert kinds.count("mm") == 2 and set(kinds) == {"mm", "red"} and len(ks) <= 4, \
        [k.name for k in ks]
    assert not any("transpose" in k.name for k in ks)
    gw, gb = fusec.grad(loss, argnums=(0, 1))(w, b, x)
    h = x.astype(np.float64) @ w + b
    d = 2 * np.maximum(h, 0) * (h > 0)
    np.testing.assert_allclose(np.asarray(gw), x.T.astype(np.float64) @ d, rtol=2e-4, atol=1e-2)
    np.testing.assert_allclose(np.asarray(gb), d.sum(0), rtol=2e-4, atol=1e-2)


def test_broadcast_gradient_is_a_reduction_kernel() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((300, 7)).astype(np.float32)
    s = rng.standard_normal(7).astype(np.float32)
    ks = _kernels(fusec.grad(lambda s, x: fnp.sum(fnp.tanh(x * s)), argnums=0), s, x)
    # the sum over the broadcast rows is computed by the kernel that computes the elementwise
    # part (and a second stage where split_reductions splits the sum for a GPU)
    assert all("_red_" in k.name for k in ks) and len(ks) <= 2, [k.name for k in ks]
    assert "tanh" in ks[0].name or "mul" in ks[0].name
    g = np.asarray(fusec.grad(lambda s, x: fnp.sum(fnp.tanh(x * s)))(s, x))
    ref = ((1 - np.tanh(x.astype(np.float64) * s) ** 2) * x).sum(0)
    np.testing.assert_allclose(g, ref, rtol=1e-4, atol=1e-4)


def test_relu_derivative_is_zero_at_zero_and_nan() -> None:
    x = np.array([-np.inf, -2, -0.0, 0, 1, np.inf, np.nan], np.float32)
    g = np.asarray(fusec.grad(lambda x: fnp.sum(nn.relu(x)))(x))
    np.testing.assert_array_equal(g, [0, 0, 0, 0, 1, 1, 0])  # jax.nn.relu's
    y = np.asarray(nn.relu(x))
    np.testing.assert_array_equal(y[:6], [0, 0, 0, 0, 1, np.inf])
    assert np.isnan(y[6]) and not np.signbit(y[:6]).any()
