"""Automatic differentiation (fusec.autodiff and the derivative rules in fusec.ops).

Conventions
-----------
* The rule tables drive the tests, so that they cannot drift: every op of the IR that may appear
  in a traced program has a reverse and a forward rule or is listed as having no derivative or as
  lowered-only, and every elementwise op with a ``deriv`` is checked from its row.
* Gradients run on the wgpu device (lavapipe here) and are compared with central finite
  differences of float64 numpy references (the table's ``numpy`` functions for elementwise ops).
  With h = 1e-6 in float64 the differences are exact to ~1e-9 relative where the function is
  smooth, so the whole error is fusec's float32 arithmetic: each derivative is a handful of float32
  operations (each within the op's table tolerance, at most 2e-5 relative) and the structural ones
  sum at most ~100 terms, which float32 rounds to ~n * 2^-24 ~ 6e-6 of the sum of the terms'
  magnitudes. We allow 1e-4 relative to the gradient's scale; rule bugs show up as O(1) errors.
* Inputs are drawn inside each op's domain, away from its kinks (abs at 0, floor at integers,
  max/min ties, remainders at multiples of the divisor), where a finite difference means nothing.
* Many checks share one jitted program: lavapipe compiles slowly, numpy differences are cheap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers import Delta

import fusec
import fusec.lax as lax
import fusec.numpy as fnp
from fusec import nn
from fusec.errors import DTypeError, FusecError, ShapeError, TraceError
from fusec.ir import Op
from fusec.numpy._base import _elementwise
from fusec.numpy.scans import cumulative
from fusec.ops import ELEMENTWISE, JVP_RULES, LOWERED_ONLY, NO_DERIVATIVE, VJP_RULES, _deriv_of

F32 = np.float32
RTOL = 1e-4
H = 1e-6


# --- finite differences --------------------------------------------------------------------------


def fd_grad(fn: Callable[..., float], args: list[np.ndarray]) -> list[np.ndarray]:
    """Central differences of the scalar ``fn`` (float64) at ``args``, element by element."""
    args = [np.array(a, dtype=np.float64) for a in args]
    out = []
    for a in args:
        g = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            keep = a[i]
            a[i] = keep + H
            up = fn(*args)
            a[i] = keep - H
            down = fn(*args)
            a[i] = keep
            g[i] = (up - down) / (2 * H)
        out.append(g)
    return out


def fd_jvp(fn: Callable[..., Any], args: list[np.ndarray], ts: list[np.ndarray]) -> np.ndarray:
    """Central difference of ``fn`` (float64) along the direction ``ts``."""
    a = [np.asarray(x, np.float64) for x in args]
    t = [np.asarray(x, np.float64) for x in ts]
    up = fn(*[x + H * d for x, d in zip(a, t)])
    down = fn(*[x - H * d for x, d in zip(a, t)])
    return (np.asarray(up) - np.asarray(down)) / (2 * H)


def assert_close(got: Any, want: np.ndarray, what: str, rtol: float = RTOL) -> None:
    """``got`` (float32, from the device) against a float64 reference, relative to its scale."""
    got = np.asarray(got)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    scale = max(1.0, float(np.nanmax(np.abs(want)))) if want.size else 1.0
    err = np.abs(got.astype(np.float64) - want)
    bad = ~(err <= rtol * (np.abs(want) + scale))  # NaN where a number is wanted is bad
    bad &= ~(np.isnan(want) & np.isnan(got))
    assert not bad.any(), (f"{what}: max error {err.max():.3g} (scale {scale:.3g}); got\n{got}\n"
                           f"want\n{want}")


# --- the tables are complete ----------------------------------------------------------------------


def test_every_traceable_op_has_both_rules_or_none() -> None:
    # CUSTOM_VJP's reverse rule is fusec.autodiff's own (it calls the user's function)
    handled_by_autodiff = {Op.CUSTOM_VJP}
    missing = []
    for op in Op:
        if op in NO_DERIVATIVE or op in LOWERED_ONLY:
            assert op not in VJP_RULES and op not in JVP_RULES, op
            continue
        if (op not in VJP_RULES and op not in handled_by_autodiff) or op not in JVP_RULES:
            missing.append(op.value)
    assert not missing, f"ops without a derivative rule: {missing}"
    assert not NO_DERIVATIVE & LOWERED_ONLY


def test_elementwise_rows_declare_derivatives_by_result_type() -> None:
    # a row without deriv must be an op whose result or operands are not floats (predicates,
    # bitwise ops): a float op that forgot its derivative would silently differentiate to zero
    no_deriv = {op for op, e in ELEMENTWISE.items() if e.deriv is None}
    assert no_deriv == {Op.SIGNBIT, Op.ISNAN, Op.ISINF, Op.ISFINITE, Op.AND, Op.OR, Op.XOR,
                        Op.NOT, Op.SHL, Op.SHR, Op.GT, Op.GE, Op.LT, Op.LE, Op.EQ, Op.NE}
    assert _deriv_of(Op.CAST, {"dtype": "float32"}) is not None
    assert _deriv_of(Op.CAST, {"dtype": "int32"}) is None


# --- elementwise ops, from the table --------------------------------------------------------------


SHAPE = (3, 7)


def _uniform(lo: float, hi: float, signed: bool = False) -> Callable[[np.random.Generator], Any]:
    def draw(rng: np.random.Generator) -> np.ndarray:
        x = rng.uniform(lo, hi, SHAPE)
        return x * rng.choice([-1.0, 1.0], SHAPE) if signed else x
    return draw


def _off_integers(lo: float, hi: float, frac: tuple[float, float] = (0.1, 0.4)
                  ) -> Callable[[np.random.Generator], Any]:
    """Values whose fractional part stays away from the kinks of floor/ceil/trunc/round (at
    integers, and for round at halves)."""
    def draw(rng: np.random.Generator) -> np.ndarray:
        return np.floor(rng.uniform(lo, hi, SHAPE)) + rng.uniform(*frac, SHAPE)
    return draw


# op -> the domain its operand is drawn from (away from kinks and singularities)
UNARY_DOMAINS: dict[Op, Callable[[np.random.Generator], Any]] = {
    Op.STOP_GRADIENT: _uniform(-2, 2), Op.NEG: _uniform(-2, 2),
    Op.ABS: _uniform(0.1, 2, signed=True), Op.EXP: _uniform(-2, 2), Op.LOG: _uniform(0.2, 3),
    Op.SQRT: _uniform(0.2, 3), Op.RSQRT: _uniform(0.2, 3), Op.TANH: _uniform(-2, 2),
    Op.SIN: _uniform(-3, 3), Op.COS: _uniform(-3, 3), Op.ERF: _uniform(-2, 2),
    Op.FLOOR: _off_integers(-3, 3), Op.CEIL: _off_integers(-3, 3),
    Op.TRUNC: _off_integers(-3, 3), Op.ROUND: _off_integers(-3, 3),
    Op.SIGN: _uniform(0.1, 2, signed=True), Op.LOG1P: _uniform(-0.5, 3),
    Op.LOG2: _uniform(0.2, 3), Op.EXPM1: _uniform(-2, 2), Op.SINH: _uniform(-2, 2),
    Op.COSH: _uniform(-2, 2), Op.TAN: _uniform(-1.2, 1.2), Op.ATAN: _uniform(-3, 3),
    Op.ASIN: _uniform(-0.9, 0.9), Op.ACOS: _uniform(-0.9, 0.9), Op.ASINH: _uniform(-3, 3),
    Op.ACOSH: _uniform(1.1, 3), Op.ATANH: _uniform(-0.9, 0.9),
}

# op -> (domain of x, domain of y); None for y: x plus a gap of at least 0.1 either way (no ties)
BINARY_DOMAINS: dict[Op, tuple[Callable[[np.random.Generator], Any], Any]] = {
    Op.ADD: (_uniform(-2, 2), _uniform(-2, 2)), Op.SUB: (_uniform(-2, 2), _uniform(-2, 2)),
    Op.MUL: (_uniform(-2, 2), _uniform(-2, 2)),
    Op.DIV: (_uniform(-2, 2), _uniform(0.3, 2, signed=True)),
    Op.POW: (_uniform(0.3, 2), _uniform(-2, 2)),
    Op.MAX: (_uniform(-2, 2), None), Op.MIN: (_uniform(-2, 2), None),
    Op.ATAN2: (_uniform(0.3, 2, signed=True), _uniform(0.3, 2, signed=True)),
    Op.COPYSIGN: (_uniform(0.3, 2, signed=True), _uniform(0.3, 2, signed=True)),
    # remainders: x / y kept away from integers (the kinks), below
    Op.REM: (_uniform(-5, 5), _uniform(0.7, 2, signed=True)),
    Op.FMOD: (_uniform(-5, 5), _uniform(0.7, 2, signed=True)),
    Op.FLOORDIV: (_uniform(-5, 5), _uniform(0.7, 2, signed=True)),
}


def _differentiable_rows(arity: int) -> list[Op]:
    ops = []
    for op, e in ELEMENTWISE.items():
        if e.deriv is None or op is Op.WHERE:
            continue
        n = 1 if op in UNARY_DOMAINS else 2 if op in BINARY_DOMAINS else None
        assert n is not None, f"{op.value} has a derivative but no test domain: add one above"
        if n == arity:
            ops.append(op)
    return ops


def _draw_binary(op: Op, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    dx, dy = BINARY_DOMAINS[op]
    x = dx(rng)
    y = x + rng.uniform(0.1, 1.0, SHAPE) * rng.choice([-1.0, 1.0], SHAPE) if dy is None else dy(rng)
    if op in (Op.REM, Op.FMOD, Op.FLOORDIV):
        x = (np.floor(x / y) + rng.uniform(0.2, 0.8, SHAPE)) * y
    return x.astype(F32), y.astype(F32)


def _tol(op: Op) -> float:
    """The table's float32 tolerance of the op, times a few operations for the derivative."""
    return max(RTOL / 10, 8 * ELEMENTWISE[op].tol[0])


def test_elementwise_unary_grad_and_jvp_match_finite_differences(rng: np.random.Generator
                                                                 ) -> None:
    ops = _differentiable_rows(1)
    xs = {op.value: UNARY_DOMAINS[op](rng).astype(F32) for op in ops}
    ws = {op.value: rng.standard_normal(SHAPE).astype(F32) for op in ops}
    ts = {op.value: rng.standard_normal(SHAPE).astype(F32) for op in ops}

    def loss(xs: Any, ws: Any) -> Any:
        return sum(fnp.sum(ws[op.value] * _elementwise(op, xs[op.value])) for op in ops)

    def each(xs: Any) -> Any:
        return {op.value: _elementwise(op, xs[op.value]) for op in ops}

    @fusec.gpu_jit
    def both(xs: Any, ws: Any, ts: Any) -> Any:
        return fusec.grad(loss)(xs, ws), fusec.jvp(each, (xs,), (ts,))[1]

    grads, tangents = both(xs, ws, ts)
    for op in ops:
        ref = ELEMENTWISE[op].numpy
        x, w, t = (np.asarray(d[op.value], np.float64) for d in (xs, ws, ts))
        slope = (ref(x + H) - ref(x - H)) / (2 * H)
        if op is Op.STOP_GRADIENT:  # the identity whose derivative is zero by definition
            slope = np.zeros_like(slope)
        assert_close(grads[op.value], w * slope, f"grad of {op.value}", _tol(op))
        assert_close(tangents[op.value], t * slope, f"jvp of {op.value}", _tol(op))


def test_elementwise_binary_grad_and_jvp_match_finite_differences(rng: np.random.Generator
                                                                  ) -> None:
    ops = _differentiable_rows(2)
    pairs = {op.value: _draw_binary(op, rng) for op in ops}
    xs = {k: v[0] for k, v in pairs.items()}
    ys = {k: v[1] for k, v in pairs.items()}
    ws = {op.value: rng.standard_normal(SHAPE).astype(F32) for op in ops}
    tx = {op.value: rng.standard_normal(SHAPE).astype(F32) for op in ops}
    ty = {op.value: rng.standard_normal(SHAPE).astype(F32) for op in ops}

    def loss(xs: Any, ys: Any, ws: Any) -> Any:
        return sum(fnp.sum(ws[k] * _elementwise(op, xs[k], ys[k]))
                   for op in ops for k in [op.value])

    def each(xs: Any, ys: Any) -> Any:
        return {op.value: _elementwise(op, xs[op.value], ys[op.value]) for op in ops}

    @fusec.gpu_jit
    def both(xs: Any, ys: Any, ws: Any, tx: Any, ty: Any) -> Any:
        return (fusec.grad(loss, argnums=(0, 1))(xs, ys, ws),
                fusec.jvp(each, (xs, ys), (tx, ty))[1])

    (gx, gy), tangents = both(xs, ys, ws, tx, ty)
    for op in ops:
        k = op.value
        ref = ELEMENTWISE[op].numpy
        x, y, w, a, c = (np.asarray(d[k], np.float64) for d in (xs, ys, ws, tx, ty))
        sx = (ref(x + H, y) - ref(x - H, y)) / (2 * H)
        sy = (ref(x, y + H) - ref(x, y - H)) / (2 * H)
        assert_close(gx[k], w * sx, f"grad of {k} by x", _tol(op))
        assert_close(gy[k], w * sy, f"grad of {k} by y", _tol(op))
        assert_close(tangents[k], a * sx + c * sy, f"jvp of {k}", _tol(op))


# --- batched checks of functions against float64 numpy references ---------------------------------


class Case:
    """``fz`` (fusec.numpy) and ``fn`` (float64 numpy) compute the same function of ``args``
    (float32 arrays, all differentiated); integer operands are closed over by both."""

    def __init__(self, name: str, fz: Callable[..., Any], fn: Callable[..., Any],
                 *args: np.ndarray, rtol: float = RTOL) -> None:
        self.name, self.fz, self.fn, self.rtol = name, fz, fn, rtol
        self.args = [np.asarray(a, F32) for a in args]


def check_cases(cases: list[Case], rng: np.random.Generator) -> None:
    """One program: the gradient of sum(w * f(args)) (random w) of every case, and the jvp of
    every f along random tangents; each compared with finite differences of its reference."""
    names = [c.name for c in cases]
    assert len(set(names)) == len(names), names
    args = {c.name: tuple(c.args) for c in cases}
    outs = {c.name: np.asarray(c.fn(*[a.astype(np.float64) for a in c.args])) for c in cases}
    ws = {k: rng.standard_normal(v.shape).astype(F32) for k, v in outs.items()}
    ts = {c.name: tuple(rng.standard_normal(a.shape).astype(F32) for a in c.args)
          for c in cases}

    def loss(args: Any, ws: Any) -> Any:
        return sum(fnp.sum(ws[c.name] * c.fz(*args[c.name])) for c in cases)

    def each(args: Any) -> Any:
        return {c.name: c.fz(*args[c.name]) for c in cases}

    @fusec.gpu_jit
    def both(args: Any, ws: Any, ts: Any) -> Any:
        return fusec.grad(loss)(args, ws), fusec.jvp(each, (args,), (ts,))

    grads, (values, tangents) = both(args, ws, ts)
    for c in cases:
        w = ws[c.name].astype(np.float64)
        assert_close(values[c.name], outs[c.name], f"value of {c.name}", c.rtol)
        want = fd_grad(lambda *a: float(np.sum(w * c.fn(*a))), c.args)  # noqa: B023
        for k, (g, fd) in enumerate(zip(grads[c.name], want)):
            assert_close(g, fd, f"grad of {c.name} by argument {k}", c.rtol)
        assert_close(tangents[c.name], fd_jvp(c.fn, c.args, list(ts[c.name])),
                     f"jvp of {c.name}", c.rtol)


def _n(shape: tuple[int, ...], rng: np.random.Generator, lo: float = -2.0, hi: float = 2.0
       ) -> np.ndarray:
    return rng.uniform(lo, hi, shape).astype(F32)


def test_operand_forms_literals_broadcasting_and_integer_powers(rng: np.random.Generator
                                                                ) -> None:
    x = _n((3, 7), rng, 0.3, 2.0)
    row = _n((1, 7), rng, 0.3, 2.0)
    vec = _n((7,), rng, 0.3, 2.0)
    s = _n((), rng, 0.3, 2.0)
    c = rng.random((3, 7)) < 0.5
    y = _n((3, 7), rng)
    cases = [
        Case("ipow2", lambda x: x ** 2, lambda x: x ** 2, x),
        Case("ipow3", lambda x: x ** 3, lambda x: x ** 3, x),
        Case("ipow-2", lambda x: x ** -2, lambda x: x ** -2.0, x),
        Case("ipow1", lambda x: x ** 1, lambda x: x, x),
        Case("ipow0", lambda x: x ** 0, lambda x: x ** 0, x),
        Case("square", fnp.square, np.square, y),
        Case("pow_literal_exp", lambda x: x ** 2.5, lambda x: x ** 2.5, x),
        Case("pow_literal_base", lambda x: 2.0 ** x, lambda x: 2.0 ** x, y),
        Case("pow_literal_zero", lambda x: x ** 0.0, lambda x: x ** 0.0, x),
        Case("pow_row", fnp.power, np.power, x, row),
        Case("add_row", fnp.add, np.add, y, row),
        Case("mul_vec", fnp.multiply, np.multiply, y, vec),
        Case("div_scalar_array", fnp.divide, np.divide, y, s),
        Case("rdiv_literal", lambda x: 3.0 / x, lambda x: 3.0 / x, x),
        Case("rsub_literal", lambda x: 1.5 - x, lambda x: 1.5 - x, y),
        Case("atan2_row", fnp.arctan2, np.arctan2, y, row),
        Case("max_vec", fnp.maximum, np.maximum, y + 5.0, vec),
        Case("same_operand", lambda x: x * x - x / (x + 3.0),
             lambda x: x * x - x / (x + 3.0), x),
        Case("where", lambda a, b: fnp.where(c, a, b), lambda a, b: np.where(c, a, b), y, x),
        Case("where_literal", lambda a: fnp.where(c, a, 0.5), lambda a: np.where(c, a, 0.5), y),
        Case("where_row", lambda a, b: fnp.where(c, a, b), lambda a, b: np.where(c, a, b), y,
             row),
        Case("int_round_trip", lambda a: (a * 3.0).astype("int32").astype("float32") + a,
             lambda a: np.trunc(a * 3.0) + a, y + 0.01),
        Case("float_mask", lambda a: (a > 0).astype("float32") * a,
             lambda a: (a > 0) * a, y),
    ]
    # no kinks: keep y * 3 away from integers for the truncation
    cases[-2].args[0] = (np.floor(y * 3.0) + rng.uniform(0.2, 0.8, y.shape)).astype(F32) / 3.0
    check_cases(cases, rng)


def test_reductions(rng: np.random.Generator) -> None:
    x = _n((3, 4, 5), rng)
    p = _n((3, 5), rng, 0.5, 1.5) * rng.choice([-1, 1], (3, 5)).astype(F32)
    pz = p.copy()
    pz[1, 2] = 0.0  # a zero factor: the others' product, not a division by it
    pz[2, 0] = pz[2, 3] = 0.0  # two zeros in a row: every gradient there but theirs is zero

    def lse(a: np.ndarray, axis: Any) -> np.ndarray:
        m = np.max(a, axis=axis, keepdims=True)
        return np.squeeze(m, axis) + np.log(np.sum(np.exp(a - m), axis=axis)) if axis is not \
            None else float(m.max()) + np.log(np.sum(np.exp(a - m)))

    cases = [
        Case("sum0", lambda a: fnp.sum(a, axis=0), lambda a: np.sum(a, axis=0), x),
        Case("sum02_keep", lambda a: fnp.sum(a, axis=(0, 2), keepdims=True),
             lambda a: np.sum(a, axis=(0, 2), keepdims=True), x),
        Case("sum_all", fnp.sum, np.sum, x),
        Case("mean_last", lambda a: fnp.mean(a, axis=-1), lambda a: np.mean(a, axis=-1), x),
        Case("max1", lambda a: fnp.max(a, axis=1), lambda a: np.max(a, axis=1), x),
        Case("min01", lambda a: fnp.min(a, axis=(0, 1)), lambda a: np.min(a, axis=(0, 1)), x),
        Case("max_all", lambda a: a.max(), np.max, x),
        Case("prod1", lambda a: fnp.prod(a, axis=1), lambda a: np.prod(a, axis=1), p),
        Case("prod_zeros", lambda a: fnp.prod(a, axis=-1), lambda a: np.prod(a, axis=-1), pz),
        Case("prod_all", fnp.prod, np.prod, p[:2]),
        Case("var", lambda a: fnp.var(a, axis=1), lambda a: np.var(a, axis=1), x),
        Case("std_ddof1", lambda a: fnp.std(a, axis=(0, 2), ddof=1),
             lambda a: np.std(a, axis=(0, 2), ddof=1), x),
        Case("logsumexp1", lambda a: fnp.logsumexp(a, axis=1), lambda a: lse(a, 1), x),
        Case("logsumexp_all", fnp.logsumexp, lambda a: lse(a, None), x),
    ]
    check_cases(cases, rng)


def test_matmul_and_einsum(rng: np.random.Generator) -> None:
    a, w = _n((4, 6), rng), _n((6, 3), rng)
    ba, bw = _n((2, 4, 6), rng), _n((2, 6, 3), rng)
    v = _n((6,), rng)
    sq = _n((5, 5), rng)
    cases = [
        Case("matmul", fnp.matmul, np.matmul, a, w),
        Case("batched", fnp.matmul, np.matmul, ba, bw),
        Case("broadcast_rhs", fnp.matmul, np.matmul, ba, w),
        Case("broadcast_lhs", lambda x, y: x @ y, np.matmul, a, bw),
        Case("vec_mat", fnp.matmul, np.matmul, v, w),
        Case("mat_vec", fnp.matmul, np.matmul, a, v),
        Case("dot_vv", fnp.dot, np.dot, v, v * 2.0),
        Case("same_twice", lambda x: x @ x, lambda x: x @ x, sq),
        Case("einsum_ij_jk", lambda x, y: fnp.einsum("ij,jk->ik", x, y),
             lambda x, y: np.einsum("ij,jk->ik", x, y), a, w),
        Case("einsum_batched", lambda x, y: fnp.einsum("bij,bjk->bik", x, y),
             lambda x, y: np.einsum("bij,bjk->bik", x, y), ba, bw),
        Case("einsum_outer_sum", lambda x, y: fnp.einsum("i,jk->kj", x, y),
             lambda x, y: np.einsum("i,jk->kj", x, y), v, w),
        Case("einsum_trace", lambda x: fnp.einsum("ii->", x), lambda x: np.einsum("ii->", x),
             sq),
    ]
    check_cases(cases, rng)


def test_movement_and_slicing(rng: np.random.Generator) -> None:
    x = _n((4, 6), rng)
    x3 = _n((2, 3, 5), rng)
    r = _n((1, 6), rng)
    cases = [
        Case("reshape", lambda a: a.reshape(3, 8), lambda a: a.reshape(3, 8), x),
        Case("transpose3", lambda a: fnp.transpose(a, (2, 0, 1)),
             lambda a: np.transpose(a, (2, 0, 1)), x3),
        Case("T", lambda a: a.T, lambda a: a.T, x),
        Case("broadcast_to", lambda a: fnp.broadcast_to(a, (3, 4, 6)),
             lambda a: np.broadcast_to(a, (3, 4, 6)), r),
        Case("expand_squeeze", lambda a: fnp.squeeze(fnp.expand_dims(a, 1), 1) * 2.0,
             lambda a: a * 2.0, x),
        Case("pad", lambda a: fnp.pad(a, ((1, 2), (0, 3)), constant_values=1.5),
             lambda a: np.pad(a, ((1, 2), (0, 3)), constant_values=1.5), x),
        Case("slice", lambda a: a[1:3, 2:], lambda a: a[1:3, 2:], x),
        Case("slice_steps", lambda a: a[::2, 1::3], lambda a: a[::2, 1::3], x),
        Case("slice_negative", lambda a: a[::-1, -1:0:-2], lambda a: a[::-1, -1:0:-2], x),
        Case("slice_3d", lambda a: a[1, ::-2, 1:4], lambda a: a[1, ::-2, 1:4], x3),
        Case("flip", lambda a: fnp.flip(a, 1), lambda a: np.flip(a, 1), x),
        Case("concatenate", lambda a, b: fnp.concatenate([a, b, a], axis=0),
             lambda a, b: np.concatenate([a, b, a], axis=0), x, r),
        Case("concatenate1", lambda a: fnp.concatenate([a, a[:, :2]], axis=1),
             lambda a: np.concatenate([a, a[:, :2]], axis=1), x),
        Case("stack", lambda a, b: fnp.stack([a, b * 2.0], axis=1),
             lambda a, b: np.stack([a, b * 2.0], axis=1), x, x[::-1]),
        Case("roll", lambda a: fnp.roll(a, 2, axis=1), lambda a: np.roll(a, 2, axis=1), x),
        Case("tile", lambda a: fnp.tile(a, (2, 1)), lambda a: np.tile(a, (2, 1)), r),
        Case("repeat", lambda a: fnp.repeat(a, 2, axis=0), lambda a: np.repeat(a, 2, axis=0),
             x),
    ]
    check_cases(cases, rng)


def _clip_index(i: np.ndarray, n: int) -> np.ndarray:
    """A gather's index as fusec reads it: negative from the end, then clamped into the axis."""
    return np.clip(np.where(i < 0, i + n, i), 0, n - 1)


def test_gathers_and_scatters(rng: np.random.Generator) -> None:
    x = _n((5, 6), rng)
    x3 = _n((3, 4, 5), rng)
    ids = np.array([4, -1, 0, 2, 2, -5], np.int32)  # negative and repeated
    wild = np.array([7, -9, 1, 3], np.int32)  # out of range: clamped (x[...] gathers)
    rows = np.arange(5, dtype=np.int32)
    labels = rng.integers(0, 6, 5).astype(np.int32)
    along = rng.integers(0, 6, (5, 3)).astype(np.int32)
    pick = np.array([[1], [0], [5], [5], [2]], np.int32)
    down = rng.integers(0, 5, (4, 6)).astype(np.int32)
    uniq = np.array([3, 0, -1], np.int32)  # distinct places: .at[].set is then deterministic
    dup = np.array([1, 3, 1, -2, 1], np.int32)
    v = _n((3, 6), rng)
    vd = _n((5, 6), rng)
    start = np.array(2, np.int32)

    far = np.array([7, 2, -6], np.int32)  # one past each end, and a place inside

    def _dropped(a: np.ndarray, u: np.ndarray, add: bool) -> np.ndarray:
        a = a.copy()
        a[2] = a[2] + u[1] if add else u[1]
        return a

    def at_set(a: np.ndarray, u: np.ndarray) -> np.ndarray:
        a = a.copy()
        a[uniq] = u
        return a

    def at_add(a: np.ndarray, u: np.ndarray) -> np.ndarray:
        a = a.copy()
        np.add.at(a, dup, u)
        return a

    def at_add_scalar(a: np.ndarray) -> np.ndarray:
        a = a.copy()
        np.add.at(a, (dup, 2), 3.0 * a[0, 0])
        return a

    cases = [
        Case("take0", lambda a: fnp.take(a, ids, axis=0), lambda a: np.take(a, ids, axis=0), x),
        Case("take1", lambda a: fnp.take(a, ids[:4], axis=1),
             lambda a: np.take(a, ids[:4], axis=1), x),
        Case("take_clip", lambda a: fnp.take(a, wild, axis=1, mode="clip"),
             lambda a: np.take(a, np.clip(wild, 0, 5), axis=1), x),
        Case("index", lambda a: a[ids], lambda a: a[ids], x),
        Case("index_clamped", lambda a: a[wild], lambda a: a[_clip_index(wild, 5)], x),
        Case("index_pair", lambda a: a[ids, ids[::-1]],
             lambda a: a[ids, _clip_index(ids[::-1], 6)], x),
        Case("index_cols", lambda a: a[:, ids[:3]], lambda a: a[:, ids[:3]], x),
        Case("index_mixed_3d", lambda a: a[1:, ids[:4] % 4, 2],
             lambda a: a[1:, ids[:4] % 4, 2], x3),
        Case("row_pick", lambda a: a[rows, labels], lambda a: a[rows, labels], x),
        Case("row_pick_negative", lambda a: a[rows, labels - 6],
             lambda a: a[rows, labels - 6], x),
        Case("take_along", lambda a: fnp.take_along_axis(a, along, axis=1),
             lambda a: np.take_along_axis(a, along, axis=1), x),
        Case("take_along_pick", lambda a: fnp.take_along_axis(a, pick, axis=1),
             lambda a: np.take_along_axis(a, pick, axis=1), x),
        Case("take_along0", lambda a: fnp.take_along_axis(a, down, axis=0),
             lambda a: np.take_along_axis(a, down, axis=0), x),
        Case("at_set", lambda a, u: a.at[uniq].set(u), at_set, x, v),
        Case("at_add", lambda a, u: a.at[dup].add(u), at_add, x, vd),
        Case("at_add_computed", lambda a: a.at[dup, 2].add(3.0 * a[0, 0]), at_add_scalar, x),
        Case("at_set_slice", lambda a, u: a.at[1:3].set(u[:2] * 2.0),
             lambda a, u: np.concatenate([a[:1], u[:2] * 2.0, a[3:]]), x, v),
        # indices outside the array (after counting negative ones from the end) drop their
        # updates: those get no gradient
        Case("at_add_dropped", lambda a, u: a.at[far].add(u), lambda a, u: _dropped(a, u, True),
             x, v),
        Case("at_set_dropped", lambda a, u: a.at[far].set(u), lambda a, u: _dropped(a, u, False),
             x, v),
        # a start index that is a traced value (an int32 array, not a Python int)
        Case("dynamic_slice", lambda a: lax.dynamic_slice(a, (start, 1), (2, 3)),
             lambda a: a[2:4, 1:4], x),
        Case("dynamic_update_slice", lambda a, u: lax.dynamic_update_slice(a, u[:2, :3],
                                                                           (start, 2)),
             lambda a, u: np.concatenate([a[:2], np.concatenate(
                 [a[2:4, :2], u[:2, :3], a[2:4, 5:]], axis=1), a[4:]]), x, v),
        Case("top_k", lambda a: lax.top_k(a, 3)[0], lambda a: -np.sort(-a, axis=-1)[:, :3], x),
        Case("diagonal", lambda a: fnp.diagonal(a, 1), lambda a: np.diagonal(a, 1), x),
        Case("tril", lambda a: fnp.tril(a, -1), lambda a: np.tril(a, -1), x),
        Case("split", lambda a: fnp.split(a, 3, axis=1)[1] * fnp.split(a, [1, 4])[2][:, :2],
             lambda a: np.split(a, 3, axis=1)[1] * np.split(a, [1, 4])[2][:, :2], x),
    ]
    check_cases(cases, rng)


def _np_cum(a: np.ndarray, fn: Callable[..., Any], axis: int, reverse: bool) -> np.ndarray:
    if reverse:
        return np.flip(fn(np.flip(a, axis), axis=axis), axis)
    return fn(a, axis=axis)


def test_scans_and_sort(rng: np.random.Generator) -> None:
    x = _n((4, 7), rng)
    p = (_n((4, 7), rng, 0.5, 1.5) * rng.choice([-1, 1], (4, 7))).astype(F32)
    pz = p.copy()
    pz[0, 2] = 0.0  # one zero in a row
    pz[1, 1] = pz[1, 4] = 0.0  # two
    pz[3, 6] = 0.0  # the last (the first, scanned in reverse)
    # distinct values (no ties: cummax/sort are not differentiable at ties)
    d = (rng.permutation(28).reshape(4, 7) * 0.25 + rng.uniform(0, 0.1, (4, 7))).astype(F32)
    acc_max, acc_min = np.maximum.accumulate, np.minimum.accumulate
    cases = [
        Case("cumsum1", lambda a: fnp.cumsum(a, axis=1), lambda a: np.cumsum(a, axis=1), x),
        Case("cumsum0", lambda a: fnp.cumsum(a, axis=0), lambda a: np.cumsum(a, axis=0), x),
        Case("cumsum_flat", fnp.cumsum, np.cumsum, x),
        Case("cumsum_reverse", lambda a: cumulative(a, "sum", 1, reverse=True),
             lambda a: _np_cum(a, np.cumsum, 1, True), x),
        Case("cumprod1", lambda a: fnp.cumprod(a, axis=1), lambda a: np.cumprod(a, axis=1), p),
        Case("cumprod_reverse", lambda a: cumulative(a, "prod", 0, reverse=True),
             lambda a: _np_cum(a, np.cumprod, 0, True), p),
        # with zeros: the derivative is the product of the others, not y / x
        Case("cumprod_zeros", lambda a: fnp.cumprod(a, axis=1),
             lambda a: np.cumprod(a, axis=1), pz),
        Case("cumprod_zeros_reverse", lambda a: cumulative(a, "prod", 1, reverse=True),
             lambda a: _np_cum(a, np.cumprod, 1, True), pz),
        Case("cumprod_zeros0", lambda a: fnp.cumprod(a, axis=0),
             lambda a: np.cumprod(a, axis=0), pz),
        Case("cummax", lambda a: fnp.cummax(a, axis=1), lambda a: acc_max(a, axis=1), d),
        Case("cummax_reverse", lambda a: lax.cummax(a, axis=1, reverse=True),
             lambda a: _np_cum(a, acc_max, 1, True), d),
        Case("cummin0", lambda a: fnp.cummin(a, axis=0), lambda a: acc_min(a, axis=0), d),
        Case("cummin_reverse", lambda a: lax.cummin(a, axis=0, reverse=True),
             lambda a: _np_cum(a, acc_min, 0, True), d),
        Case("sort", lambda a: fnp.sort(a, axis=-1), lambda a: np.sort(a, axis=-1), d),
        Case("sort0", lambda a: fnp.sort(a, axis=0), lambda a: np.sort(a, axis=0), d),
        Case("sort_descending", lambda a: fnp.sort(a, descending=True),
             lambda a: -np.sort(-a, axis=-1), d),
        Case("sort_flat", lambda a: fnp.sort(a.reshape(-1)), lambda a: np.sort(a.reshape(-1)),
             d),
    ]
    check_cases(cases, rng)


def test_selection_and_nn(rng: np.random.Generator) -> None:
    x = _n((5, 11), rng, -3.0, 3.0)
    y = _n((5, 11), rng)
    g, bias = _n((11,), rng), _n((11,), rng)
    away = np.where(np.abs(x) < 0.2, x + 0.5, x).astype(F32)  # off relu's kink at 0
    clipped = np.where(np.abs(np.abs(x) - 1) < 0.1, x * 0.8, x).astype(F32)  # off -1 and 1

    def softmax(a: np.ndarray, axis: int = -1) -> np.ndarray:
        e = np.exp(a - a.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)

    def log_softmax(a: np.ndarray) -> np.ndarray:
        m = a.max(axis=-1, keepdims=True)
        return a - m - np.log(np.exp(a - m).sum(axis=-1, keepdims=True))

    def layer_norm(a: np.ndarray, w: Any = None, c: Any = None, eps: float = 1e-5) -> Any:
        mu = a.mean(-1, keepdims=True)
        out = (a - mu) / np.sqrt(((a - mu) ** 2).mean(-1, keepdims=True) + eps)
        return out * (1.0 if w is None else w) + (0.0 if c is None else c)

    def rms_norm(a: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
        return a / np.sqrt((a * a).mean(-1, keepdims=True) + eps) * w

    erf = ELEMENTWISE[Op.ERF].numpy
    k = math.sqrt(2 / math.pi)
    cases = [
        Case("where", lambda a, b: fnp.where(a > b, a * a, fnp.exp(b)),
             lambda a, b: np.where(a > b, a * a, np.exp(b)), x, y),
        Case("clip", lambda a: fnp.clip(a, -1.0, 1.0), lambda a: np.clip(a, -1.0, 1.0),
             clipped),
        Case("relu", nn.relu, lambda a: np.maximum(a, 0), away),
        Case("softmax", nn.softmax, softmax, x),
        Case("softmax0", lambda a: nn.softmax(a, axis=0), lambda a: softmax(a, 0), x),
        Case("log_softmax", nn.log_softmax, log_softmax, x),
        Case("layer_norm", nn.layer_norm, layer_norm, x),
        Case("layer_norm_affine", nn.layer_norm, layer_norm, x, g, bias),
        Case("rms_norm", nn.rms_norm, rms_norm, x, g),
        Case("gelu_tanh", nn.gelu,
             lambda a: 0.5 * a * (1 + np.tanh(k * (a + 0.044715 * a ** 3))), x),
        Case("gelu_erf", lambda a: nn.gelu(a, approximate="none"),
             lambda a: 0.5 * a * (1 + erf(a / math.sqrt(2))), x),
        Case("silu", nn.silu, lambda a: a / (1 + np.exp(-a)), x),
        Case("sigmoid", nn.sigmoid, lambda a: 1 / (1 + np.exp(-a)), x),
        Case("elu", nn.elu, lambda a: np.where(a > 0, a, np.expm1(np.minimum(a, 0))), away),
        Case("leaky_relu", nn.leaky_relu, lambda a: np.where(a >= 0, a, 0.01 * a), away),
    ]
    check_cases(cases, rng)


# --- the transforms -------------------------------------------------------------------------------


def _np_f(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.concatenate([np.sin(a) * b[0], np.tanh(a @ b[1:].reshape(2, 3)).ravel() ** 2])


def _fz_f(a: Any, b: Any) -> Any:
    return fnp.concatenate([fnp.sin(a) * b[0], (fnp.tanh(a @ b[1:].reshape(2, 3)) ** 2).ravel()])


def test_jacrev_jacfwd_and_finite_differences_agree(rng: np.random.Generator) -> None:
    a, b = _n((2,), rng), _n((7,), rng)

    @fusec.gpu_jit
    def jacs(a: Any, b: Any) -> Any:
        return (fusec.jacrev(_fz_f, argnums=(0, 1))(a, b),
                fusec.jacfwd(_fz_f, argnums=(0, 1))(a, b),
                fusec.jacrev(lambda m: fnp.exp(m) @ m)(b[1:].reshape(2, 3)[:, :2]))

    rev, fwd, mat = jacs(a, b)
    # column k of the Jacobian: the derivative along the k-th basis vector
    for k, (arg, n) in enumerate(((a, 2), (b, 7))):
        cols = []
        for j in range(n):
            e = [np.zeros(2), np.zeros(7)]
            e[k][j] = 1.0
            cols.append(fd_jvp(_np_f, [a, b], e))
        want = np.stack(cols, axis=-1)
        assert_close(rev[k], want, f"jacrev by argument {k}")
        assert_close(fwd[k], want, f"jacfwd by argument {k}")
    m = b[1:].reshape(2, 3)[:, :2].astype(np.float64)
    want = np.zeros((2, 2, 2, 2))
    for i in np.ndindex(2, 2):
        e = np.zeros((2, 2))
        e[i] = 1.0
        want[(...,) + i] = fd_jvp(lambda x: np.exp(x) @ x, [m], [e])
    assert_close(mat, want, "jacrev of a matrix function (out.shape + in.shape)")


def test_vjp_and_jvp_are_transposes(rng: np.random.Generator) -> None:
    # <v, J u> == <J^T v, u> for the same function, for random u and v
    a, b = _n((2,), rng), _n((7,), rng)
    u = (_n((2,), rng), _n((7,), rng))
    v = _n((5,), rng)

    @fusec.gpu_jit
    def both(a: Any, b: Any, u: Any, v: Any) -> Any:
        out, ju = fusec.jvp(_fz_f, (a, b), u)
        out2, pull = fusec.vjp(_fz_f, a, b)
        jtv = pull(v)
        return fnp.sum(v * ju), fnp.sum(jtv[0] * u[0]) + fnp.sum(jtv[1] * u[1]), out - out2

    lhs, rhs, diff = both(a, b, u, v)
    assert abs(float(lhs) - float(rhs)) <= 1e-5 * (1 + abs(float(lhs)))
    assert np.all(np.asarray(diff) == 0), "jvp and vjp computed different primal outputs"
    assert_close(lhs, np.dot(v, fd_jvp(_np_f, [a, b], list(u))), "<v, J u>")


def test_higher_order_derivatives_match_analytic(rng: np.random.Generator) -> None:
    x = _n((4,), rng, 0.2, 1.5)
    s = np.float32(0.7)

    def f(a: Any) -> Any:  # a^3 sin(a), elementwise
        return a ** 3 * fnp.sin(a)

    def d1(a: np.ndarray) -> np.ndarray:
        return 3 * a ** 2 * np.sin(a) + a ** 3 * np.cos(a)

    def d2(a: np.ndarray) -> np.ndarray:
        return 6 * a * np.sin(a) + 6 * a ** 2 * np.cos(a) - a ** 3 * np.sin(a)

    def d3(a: np.ndarray) -> np.ndarray:
        return (6 * np.sin(a) + 18 * a * np.cos(a) - 9 * a ** 2 * np.sin(a)
                - a ** 3 * np.cos(a))

    total = lambda a: fnp.sum(f(a))  # noqa: E731
    g1 = fusec.grad(total)
    g2 = fusec.grad(lambda a: fnp.sum(g1(a)))  # the Hessian is diagonal: its row sums

    @fusec.gpu_jit
    def all_orders(x: Any, s: Any) -> Any:
        scalar = fusec.grad(fusec.grad(fusec.grad(f)))(s)
        hess_ff = fusec.jacfwd(g1)(x)
        hess_rr = fusec.jacrev(g1)(x)
        fwd_over_rev = fusec.jvp(g1, (x,), (fnp.ones_like(x),))[1]
        return g1(x), g2(x), scalar, hess_ff, hess_rr, fwd_over_rev

    first, second, third, hff, hrr, fvr = all_orders(x, s)
    xd = x.astype(np.float64)
    assert_close(first, d1(xd), "grad")
    assert_close(second, d2(xd), "grad of grad")
    assert_close(third, d3(np.float64(s)), "third derivative of a scalar function")
    assert_close(hff, np.diag(d2(xd)), "jacfwd of grad")
    assert_close(hrr, np.diag(d2(xd)), "jacrev of grad")
    assert_close(fvr, d2(xd), "jvp of grad")


def test_grad_of_pytrees_argnums_aux_and_repeated_arguments(rng: np.random.Generator) -> None:
    w1, w2, b = _n((3, 4), rng), _n((4,), rng), _n((), rng)
    x = _n((5, 3), rng)

    def model(p: Any, x: Any) -> Any:
        h = fnp.tanh(x @ p["layers"][0] + p["bias"])
        return fnp.sum((h @ p["layers"][1]) ** 2)

    def np_model(w1: np.ndarray, w2: np.ndarray, b: np.ndarray, x: np.ndarray) -> float:
        return float(np.sum((np.tanh(x @ w1 + b) @ w2) ** 2))

    params = {"layers": [w1, w2], "bias": b}

    @fusec.gpu_jit
    def run(p: Any, x: Any) -> Any:
        gp = fusec.grad(model)(p, x)
        gboth = fusec.grad(model, argnums=(0, 1))(p, x)
        (val, aux), gaux = fusec.value_and_grad(
            lambda p, x: (model(p, x), {"h": x * 2.0}), has_aux=True)(p, x)
        g_aux_only, aux2 = fusec.grad(lambda p: (model(p, x), p["bias"] + 1.0),
                                      has_aux=True)(p)
        twice = fusec.grad(lambda a, c: fnp.sum(a * c * c), argnums=(0, 1))(x, x)
        return gp, gboth, val, aux, gaux, g_aux_only, aux2, twice

    gp, gboth, val, aux, gaux, g_aux_only, aux2, twice = run(params, x)
    fw1, fw2, fb, fx = fd_grad(np_model, [w1, w2, b, x])
    assert set(gp) == {"layers", "bias"} and isinstance(gp["layers"], list)
    for g in (gp, gboth[0], gaux, g_aux_only):
        assert_close(g["layers"][0], fw1, "grad of a nested list leaf")
        assert_close(g["layers"][1], fw2, "grad of a nested list leaf")
        assert_close(g["bias"], fb, "grad of a scalar leaf")
    assert isinstance(gboth, tuple) and len(gboth) == 2
    assert_close(gboth[1], fx, "grad by the second argnum")
    assert_close(val, np_model(w1, w2, b, x), "value_and_grad's value")
    assert_close(aux["h"], x * 2.0, "aux")
    assert_close(aux2, b + 1.0, "grad's aux")
    # the same array passed twice gets one gradient per position
    assert_close(twice[0], x.astype(np.float64) ** 2, "d/da of a c^2 at a = c = x")
    assert_close(twice[1], 2.0 * x.astype(np.float64) ** 2, "d/dc of a c^2 at a = c = x")


def test_closures_inside_gpu_jit_are_constants(rng: np.random.Generator) -> None:
    x, y = _n((6,), rng), _n((6,), rng)

    @fusec.gpu_jit
    def run(x: Any, y: Any) -> Any:
        z = fnp.sin(x)  # computed from x outside grad: a constant to it
        g_outer = fusec.grad(lambda a: fnp.sum(a * y * z))(x)
        # a nested grad closing over the outer grad's input
        nested = fusec.grad(lambda a: fnp.sum(fusec.grad(lambda c: fnp.sum(c * c * a))(y)))(x)
        return g_outer, nested

    g_outer, nested = run(x, y)
    assert_close(g_outer, y.astype(np.float64) * np.sin(x.astype(np.float64)),
                 "closed-over traced values are constants")
    assert_close(nested, 2.0 * y.astype(np.float64), "d/da sum(2 y a)")


def test_stop_gradient(rng: np.random.Generator) -> None:
    x = _n((5,), rng)

    @fusec.gpu_jit
    def run(x: Any) -> Any:
        g1 = fusec.grad(lambda a: fnp.sum(a * fusec.stop_gradient(a)))(x)
        g2 = fusec.grad(lambda a: fnp.sum(fusec.stop_gradient({"k": a * 3.0})["k"] + a))(x)
        g3 = fusec.grad(lambda a: fnp.sum(fusec.stop_gradient(fnp.exp(a))))(x)
        return g1, g2, g3, fusec.stop_gradient(x * 2.0)

    g1, g2, g3, value = run(x)
    assert_close(g1, x, "d/da a * stop(a)")
    assert_close(g2, np.ones(5), "stop_gradient of a pytree")
    assert_close(g3, np.zeros(5), "a fully stopped function")
    assert_close(value, x * 2.0, "stop_gradient is the identity on values")
    assert fusec.stop_gradient(x) is x  # outside a trace: nothing to stop


# custom_vjp: a function whose gradient is clipped (a classic use: its true derivative is y)
@fusec.custom_vjp
def clipped_mul(x: Any, y: Any) -> Any:
    return x * y


def _clipped_mul_fwd(x: Any, y: Any) -> Any:
    return clipped_mul(x, y), (x, y)  # calling the function itself, as JAX's examples do


def _clipped_mul_bwd(res: Any, g: Any) -> Any:
    x, y = res
    return fnp.clip(g * y, -0.5, 0.5), g * x * 10.0


clipped_mul.defvjp(_clipped_mul_fwd, _clipped_mul_bwd)


@fusec.custom_vjp
def tree_op(p: Any, s: Any, ids: Any) -> Any:
    return {"out": p["a"] * p["b"] + s, "a": p["a"][ids]}


def _tree_fwd(p: Any, s: Any, ids: Any) -> Any:
    return tree_op(p, s, ids), (p, ids)


def _tree_bwd(res: Any, g: Any) -> Any:
    p, ids = res
    ga = fnp.zeros_like(p["a"]).at[ids].add(g["a"])
    # None: no cotangent for the integer argument, as in JAX
    return {"a": g["out"] * p["b"] + ga, "b": g["out"] * p["a"] * 2.0}, fnp.sum(g["out"]), None


tree_op.defvjp(_tree_fwd, _tree_bwd)


def test_custom_vjp(rng: np.random.Generator) -> None:
    x, y = _n((6,), rng), _n((6,), rng)
    a, bb = _n((4,), rng), _n((4,), rng)
    ids = np.array([0, 2, 2], np.int32)

    @fusec.gpu_jit
    def run(x: Any, y: Any, a: Any, bb: Any) -> Any:
        gx, gy = fusec.grad(lambda u, v: fnp.sum(clipped_mul(u, v) * 3.0), argnums=(0, 1))(x, y)
        gp, gs = fusec.grad(
            lambda p, s: fnp.sum(tree_op(p, s, ids)["out"]) + fnp.sum(tree_op(p, s, ids)["a"]),
            argnums=(0, 1))({"a": a, "b": bb}, np.float32(1.5))
        # grad of grad: the backward function's equations are differentiated in turn
        gg = fusec.grad(lambda u: fnp.sum(fusec.grad(
            lambda c: fnp.sum(clipped_mul(c, c)))(u)))(x)
        return gx, gy, gp, gs, gg, clipped_mul(x, y)

    gx, gy, gp, gs, gg, plain = run(x, y, a, bb)
    xd, yd = x.astype(np.float64), y.astype(np.float64)
    assert_close(gx, np.clip(3.0 * yd, -0.5, 0.5), "custom gradient of x")
    assert_close(gy, 30.0 * xd, "custom gradient of y")
    assert_close(plain, xd * yd, "the function's value")
    ad, bd = a.astype(np.float64), bb.astype(np.float64)
    # tree_op is called twice: the first call's "out" and the second's "a" are used, and each
    # call's backward gets a zero cotangent for the output it does not use
    count = np.bincount(ids, minlength=4)
    assert_close(gp["a"], bd + count, "custom gradient of a pytree leaf")
    assert_close(gp["b"], 2.0 * ad, "custom gradient of a pytree leaf")
    assert_close(gs, 4.0, "custom gradient of a scalar argument")
    # d/du of sum(clip(u, .5) + 10 u)
    assert_close(gg, (np.abs(xd) < 0.5) + 10.0, "grad of grad through custom_vjp")
    # outside any trace it is the plain function
    assert_close(clipped_mul(xd, yd), xd * yd, "custom_vjp called eagerly")


def test_custom_vjp_errors(rng: np.random.Generator) -> None:
    x = _n((5,), rng)

    def grad_through(bwd: Callable[..., Any], fwd: Any = None) -> Any:
        @fusec.custom_vjp
        def op(a: Any) -> Any:
            return a * 2.0

        op.defvjp(fwd or (lambda a: (op(a), None)), bwd)
        return fusec.grad(lambda a: fnp.sum(op(a)))(x)

    with pytest.raises(ShapeError, match=r"op \(custom_vjp\).*shape \(2,\) at cotangent\[0\] "
                                         r"for an argument of shape \(5,\)"):
        grad_through(lambda r, g: (g[:2],))
    with pytest.raises(TraceError, match=r"backward function of op.*tuple with one cotangent "
                                         r"per argument \(1\); got Tracer"):
        grad_through(lambda r, g: g)
    with pytest.raises(TraceError, match=r"one cotangent per argument \(1\); got a tuple of 2"):
        grad_through(lambda r, g: (g, g))
    with pytest.raises(TraceError, match=r"forward function of op.*pair \(output, residuals\)"):
        grad_through(lambda r, g: (g,), fwd=lambda a: a * 2.0)
    with pytest.raises(TraceError, match=r"forward-mode.*custom_vjp"):
        fusec.jvp(clipped_mul, (x, x), (x, x))

    @fusec.custom_vjp
    def undefined(a: Any) -> Any:
        return a

    with pytest.raises(TraceError, match=r"undefined was called before defvjp"):
        fusec.grad(lambda a: fnp.sum(undefined(a)))(x)


# --- outside and inside gpu_jit; caching ----------------------------------------------------------


def _loss(w: Any, x: Any) -> Any:
    return fnp.sum(fnp.tanh(x @ w) ** 2)


def _np_loss(w: np.ndarray, x: np.ndarray) -> float:
    return float(np.sum(np.tanh(x @ w) ** 2))


def test_transforms_run_eagerly_and_in_gpu_jit_and_trace_once(rng: np.random.Generator) -> None:
    w, x = _n((4, 3), rng), _n((5, 4), rng)
    want = fd_grad(_np_loss, [w, x])
    g = fusec.grad(_loss)
    assert isinstance(g(w, x), fusec.Array)  # outside gpu_jit: compiled, run on the device
    with Delta() as eager_again:
        got = g(w, x)
    assert eager_again.traces == 0 and eager_again.pipelines_compiled == 0
    assert_close(got, want[0], "eager grad")
    assert_close(g(fusec.device_put(w), x), want[0], "eager grad of a device array")

    value, gw = fusec.value_and_grad(_loss)(w, x)
    assert_close(value, _np_loss(w, x), "eager value_and_grad's value")
    assert_close(gw, want[0], "eager value_and_grad's gradient")

    out, pull = fusec.vjp(_loss, w, x)
    gw2, gx2 = pull(np.float32(2.0))
    assert_close(out, _np_loss(w, x), "eager vjp's value")
    assert_close(gw2, 2 * want[0], "eager vjp")
    assert_close(gx2, 2 * want[1], "eager vjp")
    out, tangent = fusec.jvp(_loss, (w, x), (np.ones_like(w), np.zeros_like(x)))
    assert_close(tangent, np.sum(want[0]), "eager jvp")
    assert_close(fusec.jacrev(lambda a: fnp.sin(a))(x[0]), np.diag(np.cos(x[0])), "eager jacrev")
    assert_close(fusec.jacfwd(lambda a: fnp.sin(a))(x[0]), np.diag(np.cos(x[0])), "eager jacfwd")

    # Python ints, bools, strings and None outside argnums stay Python values (an axis, a
    # flag), as in a plain call: one compilation per value
    g_axis = fusec.grad(lambda a, axis, twice, name: fnp.sum(
        fnp.max(a, axis=axis) * (2.0 if twice else 1.0)) * (1.0 if name == "x" else 0.0))
    first_row = np.zeros_like(x)
    first_row[np.arange(5), np.argmax(x, axis=1)] = 2.0
    assert_close(g_axis(x, 1, True, "x"), first_row, "eager grad with a static axis")
    assert_close(g_axis(x, -1, True, "y"), np.zeros_like(x), "another static value")
    with Delta() as again:
        g_axis(x, 1, True, "x")
    assert again.traces == 0

    jitted = fusec.gpu_jit(fusec.grad(_loss, argnums=(0, 1)))
    with Delta() as first:
        gw3, gx3 = jitted(w, x)
    with Delta() as second:
        jitted(w * 2.0, x)
    assert first.traces == 1 and first.misses == 1
    assert second.traces == 0 and second.pipelines_compiled == 0 and second.hits == 1
    assert_close(gw3, want[0], "gpu_jit(grad)")
    assert_close(gx3, want[1], "gpu_jit(grad)")
    assert "matmul" in str(jitted.trace(w, x).ir)  # the backward pass is in the program


# --- NaN and infinity -----------------------------------------------------------------------------


def test_nan_and_inf_in_gradients() -> None:
    nan, inf = np.float32(np.nan), np.float32(np.inf)
    v3 = np.array([nan, -1.0, 2.0], F32)
    cond = np.array([True, False, True])
    ct = np.array([nan, nan, 1.0], F32)

    @fusec.gpu_jit
    def run(v3: Any, ct: Any) -> Any:
        ones = fnp.ones(3)
        return {
            # JAX: relu and maximum send nothing to a NaN operand (the comparisons are false)
            "relu": fusec.grad(lambda a: fnp.sum(nn.relu(a)))(v3),
            "maximum": fusec.grad(lambda a: fnp.sum(fnp.maximum(a, 2.0)))(v3),
            # a max reduction over a NaN: NaN everywhere, as JAX
            "max": fusec.grad(lambda a: fnp.max(a))(v3),
            # the unselected branch gets a zero, not the NaN cotangent times a zero mask
            "where": fusec.grad(lambda a, b: fnp.sum(fnp.where(cond, a, b) * ct),
                                argnums=(0, 1))(ones, ones),
            # the classic trap: sqrt's derivative at 0 is inf, and 0 * inf is NaN (as JAX); the
            # double where avoids it
            "where_sqrt": fusec.grad(lambda a: fnp.sum(fnp.where(a > 0, fnp.sqrt(a), 0.0)))(
                fnp.asarray([0.0, 1.0, 4.0])),
            "where_safe": fusec.grad(lambda a: fnp.sum(fnp.where(
                a > 0, fnp.sqrt(fnp.where(a > 0, a, 1.0)), 0.0)))(fnp.asarray([0.0, 1.0, 4.0])),
            "exp_inf": fusec.grad(lambda a: fnp.sum(fnp.exp(a)))(fnp.asarray([inf, -inf, 0.0])),
            "log_zero": fusec.grad(lambda a: fnp.sum(fnp.log(a)))(fnp.asarray([0.0, 1.0])),
            "negative_base": fusec.grad(lambda a: fnp.sum((-2.0) ** a))(fnp.asarray([0.5, 2.0])),
            "literal_where": fusec.grad(lambda a: fnp.sum(fnp.where(True, a * 3.0, a)))(ones),
            "sort_nan": fusec.grad(lambda a: fnp.sum(fnp.sort(a) * fnp.arange(3.0)))(
                fnp.asarray([nan, 2.0, 1.0])),
            "cummax_nan": fusec.grad(lambda a: fnp.sum(fnp.cummax(a) * fnp.arange(5.0)))(
                fnp.asarray([1.0, 3.0, nan, 2.0, 5.0])),
        }

    got = {k: (tuple(np.asarray(x) for x in v) if isinstance(v, tuple) else np.asarray(v))
           for k, v in run(v3, ct).items()}
    np.testing.assert_array_equal(got["relu"], [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(got["maximum"], [0.0, 0.0, 0.5])  # a tie shares equally
    assert np.isnan(got["max"]).all()
    np.testing.assert_array_equal(got["where"][0], [nan, 0.0, 1.0])
    np.testing.assert_array_equal(got["where"][1], [0.0, nan, 0.0])
    np.testing.assert_array_equal(got["where_sqrt"], [nan, 0.5, 0.25])
    np.testing.assert_array_equal(got["where_safe"], [0.0, 0.5, 0.25])
    np.testing.assert_array_equal(got["exp_inf"], [inf, 0.0, 1.0])
    np.testing.assert_array_equal(got["log_zero"], [inf, 1.0])
    assert np.isnan(got["negative_base"]).all()  # log(-2) is NaN, as in JAX
    np.testing.assert_array_equal(got["literal_where"], [3.0, 3.0, 3.0])
    np.testing.assert_array_equal(got["sort_nan"], [2.0, 1.0, 0.0])  # NaN sorts last
    # from the NaN on, the running maximum is that NaN: its results' cotangents go to it, as
    # sort's do (JAX sends them nowhere; before the fix they went to the 3.0, which does not
    # change them)
    np.testing.assert_array_equal(got["cummax_nan"], [0.0, 1.0, 9.0, 0.0, 0.0])


# --- fused backward passes ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layer_norm", "layer_norm_affine",
                                  "rms_norm", "rms_norm_weight"])
def test_backward_of_a_normalisation_is_one_kernel(name: str, rng: np.random.Generator) -> None:
    x, ct = _n((64, 100), rng), _n((64, 100), rng)
    w, b = _n((100,), rng), _n((100,), rng)
    fn = {"softmax": nn.softmax, "log_softmax": nn.log_softmax, "layer_norm": nn.layer_norm,
          "layer_norm_affine": lambda a: nn.layer_norm(a, w, b), "rms_norm": nn.rms_norm,
          "rms_norm_weight": lambda a: nn.rms_norm(a, w)}[name]

    def backward(x: Any, ct: Any) -> Any:
        return fusec.vjp(fn, x)[1](ct)[0]

    jitted = fusec.gpu_jit(backward)
    kernels = jitted.lower(x, ct).kernels
    assert len(kernels) == 1, [k.name for k in kernels]
    # and it computes the right thing
    ref = {"softmax": lambda a: np.exp(a) / np.exp(a).sum(-1, keepdims=True),
           "log_softmax": lambda a: a - np.log(np.exp(a).sum(-1, keepdims=True)),
           "layer_norm": lambda a: (a - a.mean(-1, keepdims=True)) / np.sqrt(
               a.var(-1, keepdims=True) + 1e-5),
           "rms_norm": lambda a: a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6)}
    base = name.split("_affine")[0].split("_weight")[0]
    if base == name:  # check the plain ones numerically on a few rows (cheap)
        rows = slice(0, 3)
        want = fd_grad(lambda a: float(np.sum(ct[rows] * ref[base](a))), [x[rows]])[0]
        assert_close(np.asarray(jitted(x, ct))[rows], want, f"backward of {name}")


@pytest.mark.parametrize("form", ["take_along_axis", "index"])
def test_grad_of_cross_entropy_is_one_kernel(form: str, rng: np.random.Generator) -> None:
    x = _n((64, 100), rng)
    labels = rng.integers(0, 100, 64).astype(np.int32)

    def cross_entropy(x: Any, labels: Any) -> Any:
        logp = nn.log_softmax(x)
        if form == "take_along_axis":
            picked = fnp.take_along_axis(logp, labels[:, None], axis=1)
        else:
            picked = logp[fnp.arange(64), labels]
        return -fnp.mean(picked)

    jitted = fusec.gpu_jit(fusec.grad(cross_entropy))
    kernels = jitted.lower(x, labels).kernels
    assert len(kernels) == 1, [k.name for k in kernels]
    xd = x.astype(np.float64)
    p = np.exp(xd - xd.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = (p - np.eye(100)[labels]) / 64  # the analytic gradient of mean cross-entropy
    assert_close(jitted(x, labels), want, f"grad of cross-entropy ({form})")


# --- bad input: errors that name the argument -----------------------------------------------------


def test_bad_inputs_raise_errors_that_name_the_argument() -> None:
    x = np.ones(5, F32)
    ids = np.arange(5, dtype=np.int32)

    def vector(a: Any) -> Any:
        return a * 2.0

    def dot(a: Any, i: Any) -> Any:
        return fnp.sum(a * i)

    with pytest.raises(ShapeError, match=r"grad of vector: it must return a float scalar.*"
                                         r"returned \(5,\) float32"):
        fusec.grad(vector)(x)
    with pytest.raises(DTypeError, match=r"argument 'args\[1\]' of dot is int32"):
        fusec.grad(dot, argnums=1)(x, ids)
    with pytest.raises(DTypeError, match=r"argument 'args\[0\]\['b'\]' of <lambda> is int32"):
        fusec.grad(lambda p: fnp.sum(p["a"]))({"a": x, "b": ids})
    with pytest.raises(TraceError, match=r"argnums=2: dot was called with 2 positional"):
        fusec.grad(dot, argnums=(0, 2))(x, x)
    with pytest.raises(TraceError, match=r"argnums must be an int or a sequence of ints; got 'a'"):
        fusec.grad(dot, argnums="a")(x, x)
    with pytest.raises(TraceError, match=r"argnums must name at least one argument"):
        fusec.grad(dot, argnums=())(x, x)
    with pytest.raises(TraceError, match=r"<lambda> was differentiated with has_aux=True, so it "
                                         r"must return a pair"):
        fusec.grad(lambda a: fnp.sum(a), has_aux=True)(x)
    with pytest.raises(ShapeError, match=r"jvp of vector: the tangent at tangents\[0\] has shape "
                                         r"\(3,\); the primal has shape \(5,\)"):
        fusec.jvp(vector, (x,), (x[:3],))
    with pytest.raises(ShapeError, match=r"the tangent at tangents\[0\]\['w'\] has shape"):
        fusec.jvp(lambda p: p["w"] * 2.0, ({"w": x},), ({"w": x[:3]},))
    with pytest.raises(ShapeError, match=r"jvp of vector: 1 primals but 2 tangents"):
        fusec.jvp(vector, (x,), (x, x))
    with pytest.raises(TraceError, match=r"jvp of vector: primals and tangents must be tuples"):
        fusec.jvp(vector, x, x)
    with pytest.raises(ShapeError, match=r"vjp of vector: the cotangent at cotangent has shape "
                                         r"\(3,\); the output there has shape \(5,\)"):
        fusec.vjp(vector, x)[1](x[:3])
    with pytest.raises(ShapeError, match=r"the cotangent at cotangent\['b'\] has shape \(2,\)"):
        fusec.vjp(lambda a: {"a": a, "b": a * 2.0}, x)[1]({"a": x, "b": x[:2]})
    with pytest.raises(ShapeError, match=r"the cotangent has 1 leaves; the output has 2"):
        fusec.vjp(lambda a: (a, a), x)[1](x)
    with pytest.raises(TraceError, match=r"jacrev of <lambda>: it must return one array"):
        fusec.jacrev(lambda a: (a, a))(x)
    with pytest.raises(TraceError, match=r"jacfwd of <lambda>: it must return one array"):
        fusec.jacfwd(lambda a: [a, a])(x)
    with pytest.raises(DTypeError, match=r"argument 'args\[0\]' of vector is int32"):
        fusec.jacfwd(vector)(ids)
    with pytest.raises(DTypeError, match=r"argument 'args\[1\]' of dot is int32"):
        fusec.jacrev(dot, argnums=(0, 1))(x, ids)
    with pytest.raises(TraceError, match=r"argnums=-3: dot was called with 2 positional"):
        fusec.value_and_grad(dot, argnums=-3)(x, x)
    with pytest.raises(ShapeError, match=r"grad of vector: it must return a float scalar"):
        fusec.value_and_grad(vector)(x)
    with pytest.raises(DTypeError, match=r"argument 'args\[0\]' of <lambda> is int32"):
        fusec.jvp(lambda a: a * 2, (ids,), (x,))
    with pytest.raises(DTypeError, match=r"argument 'args\[0\]' of <lambda> is bool"):
        fusec.vjp(lambda a: a, ids > 2)
    with pytest.raises(TraceError, match=r"returned a str at output"):
        fusec.grad(lambda a: "loss")(x)
    for mode in ("max", "min", "multiply"):
        with pytest.raises(TraceError, match=rf"grad of a scatter with mode '{mode}' "
                                             rf"\(\.at\[\]\.{mode}\) is not supported"):
            fusec.grad(lambda a: fnp.sum(getattr(a.at[ids[:3]], mode)(2.0)))(x)  # noqa: B023
        with pytest.raises(TraceError, match=rf"jvp of a scatter with mode '{mode}'"):
            fusec.jvp(lambda a: getattr(a.at[ids[:3]], mode)(2.0), (x,), (x,))  # noqa: B023
    for err in (ShapeError, DTypeError, TraceError):
        assert issubclass(err, FusecError)
