"""Activations and normalisations, written with :mod:`fusec.numpy` so that they trace and fuse.

The normalisations (softmax, log_softmax, layer_norm, rms_norm) of float16 arrays compute in
float32 and round the result to float16 once: their sums and variances are not rounded on the
way (the casts fuse into the one kernel)."""

from __future__ import annotations

import math
from typing import Any

from . import numpy as fnp
from .numpy._base import _stop_gradient, _traceable, _tracer
from .trace import Tracer


def _in_float32(x: Any, *others: Any) -> tuple[Any, str | None]:
    """``x`` as float32 and the float16 dtype to round the result to, where ``x`` is float16
    (and ``others``, a normalisation's weight and bias, promote with it to float16); else ``x``
    and None."""
    t = _tracer(x)
    if t.var.dtype != "float16":
        return x, None
    dt = fnp.result_type(t, *(o for o in others if o is not None))
    return fnp.astype(t, "float32"), (str(dt) if dt == fnp.float16 else None)


def _rounded(y: Any, dt: str | None) -> Any:
    return y if dt is None else fnp.astype(y, dt)


__all__ = ["relu", "sigmoid", "tanh", "silu", "swish", "gelu", "leaky_relu", "elu", "softmax",
           "log_softmax", "layer_norm", "rms_norm"]


@_traceable
def relu(x: Any) -> Tracer:
    """``max(x, 0)``; NaN stays NaN, as in JAX. Its derivative is 0 at 0 (jax.nn.relu's),
    where ``maximum``'s would split the tie (0.5)."""
    # the value of max(x, 0), with a derivative of 1 where x > 0 and 0 elsewhere (NaN included)
    return fnp.where(fnp.greater(x, 0), x, _stop_gradient(fnp.maximum(x, 0)))


@_traceable
def sigmoid(x: Any) -> Tracer:
    """``1 / (1 + exp(-x))``; saturates cleanly to 0 and 1."""
    return 1.0 / (1.0 + fnp.exp(fnp.negative(x)))


tanh = fnp.tanh


@_traceable
def silu(x: Any) -> Tracer:
    """``x * sigmoid(x)`` (also called swish)."""
    return x * sigmoid(x)


swish = silu


@_traceable
def gelu(x: Any, approximate: str = "tanh") -> Tracer:
    """GELU. ``approximate="tanh"`` (the default, as in JAX) or ``"none"`` for the erf form."""
    if approximate in ("tanh", True):
        # 0.5 x (1 + tanh(u)), u = c (x + 0.044715 x^3), computed as x / (1 + exp(-2u)) (the same
        # function): 7 ops against tanh's ~30, which is measurable in a matmul's epilogue (H100,
        # gelu(x @ w + b) at 4096^3: 3.18 against 3.22 ms), and no cancellation in 1 + tanh(u)
        # for negative x. A large negative x gives -0 (the exp overflows to inf), x = -inf NaN,
        # as JAX's formula does (-inf * 0).
        a = -2.0 * math.sqrt(2.0 / math.pi)
        return x / (1.0 + fnp.exp(x * (a + (a * 0.044715) * (x * x))))
    if approximate in ("none", False):
        return 0.5 * x * (1.0 + fnp.erf(x * (1.0 / math.sqrt(2.0))))
    raise ValueError(f"gelu: approximate must be 'tanh' or 'none'; got {approximate!r}")


@_traceable
def leaky_relu(x: Any, negative_slope: float = 0.01) -> Tracer:
    """``x`` where positive, ``negative_slope * x`` elsewhere."""
    return fnp.where(fnp.greater_equal(x, 0), x, negative_slope * x)


@_traceable
def elu(x: Any, alpha: float = 1.0) -> Tracer:
    """``x`` where positive, ``alpha * (exp(x) - 1)`` elsewhere."""
    neg = alpha * (fnp.exp(fnp.minimum(x, 0.0)) - 1.0)
    return fnp.where(fnp.greater(x, 0), x, neg)


@_traceable
def softmax(x: Any, axis: int = -1) -> Tracer:
    """``exp(x) / sum(exp(x))`` along ``axis``, shifted by the maximum for stability."""
    x, dt = _in_float32(x)
    # the shift does not change the value: autodiff does not differentiate it (as JAX)
    shifted = x - _stop_gradient(fnp.max(x, axis=axis, keepdims=True))
    e = fnp.exp(shifted)
    return _rounded(e / fnp.sum(e, axis=axis, keepdims=True), dt)


@_traceable
def log_softmax(x: Any, axis: int = -1) -> Tracer:
    """``x - log(sum(exp(x)))`` along ``axis``, computed stably."""
    x, dt = _in_float32(x)
    shifted = x - _stop_gradient(fnp.max(x, axis=axis, keepdims=True))
    return _rounded(shifted - fnp.log(fnp.sum(fnp.exp(shifted), axis=axis, keepdims=True)), dt)


@_traceable
def layer_norm(x: Any, weight: Any = None, bias: Any = None, axis: int = -1,
               eps: float = 1e-5) -> Tracer:
    """Normalise to zero mean and unit variance along ``axis``, then scale and shift."""
    x, dt = _in_float32(x, weight, bias)
    mu = fnp.mean(x, axis=axis, keepdims=True)
    d = x - mu
    var = fnp.mean(d * d, axis=axis, keepdims=True)
    y = d * fnp.rsqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return _rounded(y, dt)


@_traceable
def rms_norm(x: Any, weight: Any = None, axis: int = -1, eps: float = 1e-6) -> Tracer:
    """Divide by the root mean square along ``axis``, then scale."""
    x, dt = _in_float32(x, weight)
    ms = fnp.mean(x * x, axis=axis, keepdims=True)
    y = x * fnp.rsqrt(ms + eps)
    if weight is not None:
        y = y * weight
    return _rounded(y, dt)


@_traceable
def one_hot(x: Any, num_classes: int, dtype: Any = "float32", axis: int = -1) -> Tracer:
    """Indicator vectors of the integer ids ``x``: a new axis of length ``num_classes`` at
    ``axis`` holding 1 at position ``x`` and 0 elsewhere. An id outside ``[0, num_classes)`` —
    negative ones included — gives an all-zero vector (as in JAX)."""
    from .numpy._base import _norm_axis, _tracer
    from .numpy.shapes import _axis_iota, _static_count

    n = _static_count(num_classes, "one_hot's num_classes")
    ids = _tracer(x)
    ax = _norm_axis(axis, ids.ndim + 1, "one_hot's axis")
    # compare in the ids' own dtype: a uint32 id never wraps to a negative one, a float id
    # matches only a whole number
    dt = ids.var.dtype if ids.var.dtype in ("int32", "uint32", "float32", "float16") else "int32"
    classes = _axis_iota(ids.ndim + 1, ax, n, dt)
    hit = fnp.equal(fnp.expand_dims(fnp.astype(ids, dt), ax), classes)
    return fnp.astype(hit, dtype)


__all__ += ["one_hot"]
