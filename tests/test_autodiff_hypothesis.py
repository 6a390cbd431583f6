"""Property tests of autodiff: hypothesis builds random small programs (a few ops composed, each
reading any earlier value) and checks, on the wgpu device:

* the gradient of ``sum(w * program(x0, x1))`` against central finite differences of the same
  program evaluated in float64 numpy;
* the jvp along random tangents against the directional finite difference;
* ``<v, J u>`` (forward mode) against ``<J^T v, u>`` (reverse mode) for random u, v.

Programs are data (a list of steps) so that hypothesis shrinks them and a failure prints them.
The ops are smooth where they are drawn: an example whose numpy evaluation passes within 1e-3 of
a kink (max/min ties, a where's switch, sort ties) or grows past 1e3 is discarded, since there a
finite difference means nothing or float32 has no digits left. Tolerance: 2e-4 relative to the
result's scale (max(1, max |value|)); float32 rounds each of the at most ~8 steps by a few ULP
(~1e-6), and an error in a rule is O(1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, assume, given, note, settings
from hypothesis import strategies as st

import fusec
import fusec.lax as lax
import fusec.numpy as fnp
from fusec import nn
from fusec.ir import Op
from fusec.ops import ELEMENTWISE

SHAPE = (4, 4)
RTOL = 2e-4
H = 1e-6
IDX = np.array([1, 1, 3, -1], np.int32)  # a repeated and a negative index
ALONG = np.array([[3, 0, 0, 1], [2, 2, 2, 2], [0, 1, 2, 3], [1, 3, 3, 0]], np.int32)
SETTINGS: dict[str, Any] = dict(
    deadline=None, print_blob=True, phases=[p for p in Phase if p is not Phase.explain],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

_erf = ELEMENTWISE[Op.ERF].numpy
INF = float("inf")


def _gap(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.min(np.abs(a - b)))


def _top2_gap(a: np.ndarray, axis: int) -> float:
    s = np.sort(a, axis=axis)
    return float(np.min(np.abs(np.diff(s, axis=axis)))) if s.shape[axis] > 1 else INF


def _np_softmax(a: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _np_shift(a: np.ndarray) -> np.ndarray:
    return np.pad(a[1:], ((0, 1), (0, 0)))


def _np_at_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = a.copy()
    np.add.at(out, IDX, b)
    return out


def _np_at_set(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = a.copy()
    out[1:3, ::2] = b[:2, :2]
    return out


def _np_update(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = a.copy()
    out[1:3, 1:4] = b[:2, :3] * 2.0
    return out


def _np_layer_norm(a: np.ndarray) -> np.ndarray:
    d = a - a.mean(-1, keepdims=True)
    return d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)


# name -> (fusec function, numpy function, kink distance (numpy operands) or None)
Unary = tuple[Callable[[Any], Any], Callable[[np.ndarray], np.ndarray],
              Callable[[np.ndarray], float] | None]
UNARY: dict[str, Unary] = {
    "sin": (fnp.sin, np.sin, None),
    "tanh": (fnp.tanh, np.tanh, None),
    "square": (lambda a: a * a, lambda a: a * a, None),
    "exp_tanh": (lambda a: fnp.exp(fnp.tanh(a)), lambda a: np.exp(np.tanh(a)), None),
    "log1p_sq": (lambda a: fnp.log1p(a * a), lambda a: np.log1p(a * a), None),
    "sqrt_1p": (lambda a: fnp.sqrt(1.0 + a * a), lambda a: np.sqrt(1.0 + a * a), None),
    "atan": (fnp.arctan, np.arctan, None),
    "erf": (fnp.erf, _erf, None),
    "sigmoid": (nn.sigmoid, lambda a: 1 / (1 + np.exp(-a)), None),
    "tanh_cubed": (lambda a: fnp.tanh(a) ** 3, lambda a: np.tanh(a) ** 3, None),
    "softmax0": (lambda a: nn.softmax(a, axis=0), lambda a: _np_softmax(a, 0), None),
    "log_softmax1": (nn.log_softmax,
                     lambda a: a - np.log(np.exp(a).sum(-1, keepdims=True)), None),
    "layer_norm": (nn.layer_norm, _np_layer_norm,
                   lambda a: float(np.min(a.std(-1))) * 10),  # keep rows far from constant
    "cumsum1": (lambda a: fnp.cumsum(a, axis=1), lambda a: np.cumsum(a, axis=1), None),
    "cumprod0": (lambda a: fnp.cumprod(fnp.tanh(a), axis=0),
                 lambda a: np.cumprod(np.tanh(a), axis=0), None),
    "flip0": (lambda a: fnp.flip(a, 0), lambda a: np.flip(a, 0), None),
    "T": (lambda a: a.T, lambda a: a.T, None),
    "roll1": (lambda a: fnp.roll(a, 1, axis=1), lambda a: np.roll(a, 1, axis=1), None),
    "shift0": (lambda a: fnp.pad(a[1:], ((0, 1), (0, 0))), _np_shift, None),
    "strided": (lambda a: fnp.concatenate([a[::-2], a[::2]], axis=0),
                lambda a: np.concatenate([a[::-2], a[::2]], axis=0), None),
    "gather": (lambda a: a[IDX], lambda a: a[IDX], None),
    "mean0": (lambda a: fnp.broadcast_to(fnp.mean(a, axis=0, keepdims=True), SHAPE),
              lambda a: np.broadcast_to(a.mean(0, keepdims=True), SHAPE), None),
    "max1": (lambda a: fnp.broadcast_to(fnp.max(a, axis=1, keepdims=True), SHAPE),
             lambda a: np.broadcast_to(a.max(1, keepdims=True), SHAPE),
             lambda a: _top2_gap(a, 1)),
    "logsumexp0": (lambda a: fnp.broadcast_to(fnp.logsumexp(a, axis=0, keepdims=True), SHAPE),
                   lambda a: np.broadcast_to(np.log(np.exp(a).sum(0, keepdims=True)), SHAPE),
                   None),
    "sort1": (lambda a: fnp.sort(a, axis=1), lambda a: np.sort(a, axis=1),
              lambda a: _top2_gap(a, 1)),
    "cummax0": (lambda a: fnp.cummax(a, axis=0), lambda a: np.maximum.accumulate(a, axis=0),
                lambda a: _top2_gap(a, 0)),
    "reshape_T": (lambda a: a.reshape(2, 8).T.reshape(4, 4),
                  lambda a: a.reshape(2, 8).T.reshape(4, 4), None),
    "prod0": (lambda a: fnp.broadcast_to(fnp.prod(fnp.tanh(a), axis=0), SHAPE),
              lambda a: np.broadcast_to(np.prod(np.tanh(a), axis=0), SHAPE), None),
    "var1": (lambda a: fnp.broadcast_to(fnp.var(a, axis=1, keepdims=True), SHAPE),
             lambda a: np.broadcast_to(np.var(a, axis=1, keepdims=True), SHAPE), None),
    "sum_all": (lambda a: fnp.sum(a) + 0.0 * a, lambda a: np.sum(a) + 0.0 * a, None),
    "take_along": (lambda a: fnp.take_along_axis(a, ALONG, axis=1),
                   lambda a: np.take_along_axis(a, ALONG, axis=1), None),
    "clip": (lambda a: fnp.clip(a, -0.5, 0.5), lambda a: np.clip(a, -0.5, 0.5),
             lambda a: min(_gap(a, -0.5 + 0 * a), _gap(a, 0.5 + 0 * a))),
    "abs": (fnp.abs, np.abs, lambda a: float(np.min(np.abs(a)))),
    "rem": (lambda a: fnp.remainder(a, 0.7), lambda a: np.remainder(a, 0.7),
            lambda a: float(np.min(np.abs(a / 0.7 - np.round(a / 0.7)))) * 0.7),
    "pad_value": (lambda a: fnp.pad(a[:, 1:], ((0, 0), (0, 1)), constant_values=2.0),
                  lambda a: np.pad(a[:, 1:], ((0, 0), (0, 1)), constant_values=2.0), None),
    "rsqrt": (lambda a: fnp.rsqrt(1.0 + a * a), lambda a: 1 / np.sqrt(1.0 + a * a), None),
    "sort_desc0": (lambda a: fnp.sort(a, axis=0, descending=True),
                   lambda a: -np.sort(-a, axis=0), lambda a: _top2_gap(a, 0)),
    "cummin_rev1": (lambda a: lax.cummin(a, axis=1, reverse=True),
                    lambda a: np.flip(np.minimum.accumulate(np.flip(a, 1), axis=1), 1),
                    lambda a: _top2_gap(a, 1)),
}

Binary = tuple[Callable[[Any, Any], Any], Callable[[np.ndarray, np.ndarray], np.ndarray],
               Callable[[np.ndarray, np.ndarray], float] | None]
BINARY: dict[str, Binary] = {
    "add": (fnp.add, np.add, None),
    "sub": (fnp.subtract, np.subtract, None),
    "mul": (fnp.multiply, np.multiply, None),
    "div_safe": (lambda a, b: a / (1.0 + b * b), lambda a, b: a / (1.0 + b * b), None),
    "maximum": (fnp.maximum, np.maximum, _gap),
    "minimum": (fnp.minimum, np.minimum, _gap),
    "where": (lambda a, b: fnp.where(a > b, a * b, a - b),
              lambda a, b: np.where(a > b, a * b, a - b), _gap),
    "matmul": (lambda a, b: (a @ b) * 0.25, lambda a, b: (a @ b) * 0.25, None),
    "matmul_T": (lambda a, b: (a @ b.T) * 0.25, lambda a, b: (a @ b.T) * 0.25, None),
    "pow": (lambda a, b: (1.0 + a * a) ** fnp.tanh(b),
            lambda a, b: (1.0 + a * a) ** np.tanh(b), None),
    "at_add": (lambda a, b: a.at[IDX].add(b), _np_at_add, None),
    "row_bias": (lambda a, b: a + b[0], lambda a, b: a + b[0], None),
    "einsum": (lambda a, b: fnp.einsum("ij,kj->ik", a, b) * 0.25,
               lambda a, b: np.einsum("ij,kj->ik", a, b) * 0.25, None),
    "at_set": (lambda a, b: a.at[1:3, ::2].set(b[:2, :2]),
               lambda a, b: _np_at_set(a, b), None),
    "update_slice": (lambda a, b: lax.dynamic_update_slice(a, b[:2, :3] * 2.0, (1, 1)),
                     lambda a, b: _np_update(a, b), None),
    "stack_mean": (lambda a, b: fnp.stack([a, b * b]).mean(0),
                   lambda a, b: np.stack([a, b * b]).mean(0), None),
}
NAMES = sorted(UNARY) + sorted(BINARY)

step = st.tuples(st.sampled_from(NAMES), st.integers(0, 50), st.integers(0, 50))
programs = st.lists(step, min_size=1, max_size=6)


class Program:
    """Steps (name, i, j): value k + 2 = op(values[i % (k + 2)], values[j % (k + 2)]); the inputs
    are values 0 and 1; the result is the last value."""

    def __init__(self, steps: list[tuple[str, int, int]]) -> None:
        self.steps = [(name, i % (k + 2), j % (k + 2)) for k, (name, i, j) in enumerate(steps)]

    def __str__(self) -> str:
        lines = []
        for k, (name, i, j) in enumerate(self.steps):
            args = f"v{i}" if name in UNARY else f"v{i}, v{j}"
            lines.append(f"v{k + 2} = {name}({args})")
        return "\n".join(lines)

    def fusec(self, x0: Any, x1: Any) -> Any:
        vals = [x0, x1]
        for name, i, j in self.steps:
            vals.append(UNARY[name][0](vals[i]) if name in UNARY else
                        BINARY[name][0](vals[i], vals[j]))
        return vals[-1]

    def numpy(self, x0: np.ndarray, x1: np.ndarray) -> tuple[np.ndarray, float, float]:
        """The result in float64, the smallest distance to a kink met on the way, and the
        largest magnitude."""
        vals = [x0, x1]
        kink, big = INF, float(max(np.abs(x0).max(), np.abs(x1).max()))
        for name, i, j in self.steps:
            if name in UNARY:
                _, fn, gap = UNARY[name]
                args: tuple[np.ndarray, ...] = (vals[i],)
            else:
                _, fn, gap = BINARY[name]  # type: ignore[assignment]
                args = (vals[i], vals[j])
            if gap is not None:
                kink = min(kink, gap(*args))  # type: ignore[arg-type]
            out = np.asarray(fn(*args), np.float64)  # type: ignore[arg-type]
            big = max(big, float(np.max(np.abs(out))))
            vals.append(out)
        return vals[-1], kink, big


def _close(got: Any, want: np.ndarray, what: str) -> None:
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    scale = max(1.0, float(np.max(np.abs(want))))
    err = float(np.max(np.abs(got - want)))
    assert err <= RTOL * scale, f"{what}: error {err:.3g} at scale {scale:.3g}\n{got}\n{want}"


@settings(max_examples=100, **SETTINGS)
@given(programs, st.integers(0, 2**32 - 1))
def test_random_program_gradients(steps: list[tuple[str, int, int]], seed: int) -> None:
    prog = Program(steps)
    note(str(prog))
    rng = np.random.default_rng(seed)
    x0, x1, w, u0, u1, v = (rng.uniform(-1.5, 1.5, SHAPE).astype(np.float32) for _ in range(6))
    d = [a.astype(np.float64) for a in (x0, x1, w, u0, u1, v)]
    want, kink, big = prog.numpy(d[0], d[1])
    assume(kink > 1e-3 and big < 1e3)

    @fusec.gpu_jit
    def run(x0: Any, x1: Any, w: Any, u0: Any, u1: Any, v: Any) -> Any:
        g = fusec.grad(lambda a, b: fnp.sum(w * prog.fusec(a, b)), argnums=(0, 1))(x0, x1)
        out, ju = fusec.jvp(prog.fusec, (x0, x1), (u0, u1))
        jtv = fusec.vjp(prog.fusec, x0, x1)[1](v)
        return g, out, ju, jtv, fnp.sum(v * ju), fnp.sum(jtv[0] * u0) + fnp.sum(jtv[1] * u1)

    (g0, g1), out, ju, jtv, v_ju, jtv_u = run(x0, x1, w, u0, u1, v)
    _close(out, want, "value")

    def loss(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.sum(d[2] * prog.numpy(a, b)[0]))

    fd0 = np.zeros(SHAPE)
    fd1 = np.zeros(SHAPE)
    for fd, k in ((fd0, 0), (fd1, 1)):
        for i in np.ndindex(SHAPE):
            up, down = [d[0].copy(), d[1].copy()], [d[0].copy(), d[1].copy()]
            up[k][i] += H
            down[k][i] -= H
            fd[i] = (loss(*up) - loss(*down)) / (2 * H)
    _close(g0, fd0, "grad by x0")
    _close(g1, fd1, "grad by x1")
    fd_dir = (prog.numpy(d[0] + H * d[3], d[1] + H * d[4])[0]
              - prog.numpy(d[0] - H * d[3], d[1] - H * d[4])[0]) / (2 * H)
    _close(ju, fd_dir, "jvp")
    # the two modes are each other's transposes; scale: the products' magnitudes
    scale = float(np.sum(np.abs(d[5] * fd_dir))) + 1.0
    assert abs(float(v_ju) - float(jtv_u)) <= RTOL * scale, (float(v_ju), float(jtv_u))
