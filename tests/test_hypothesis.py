"""Property tests: hypothesis generates broadcasting shapes and random programs; the GPU must agree.

All run on the real adapter (lavapipe in CI). Programs are kept as *data* (source lines) so that
hypothesis shrinks them and a failure prints a runnable function.

1. Broadcasting: binary elementwise ops (add, subtract, multiply, maximum, minimum, where,
   comparisons) over ``mutually_broadcastable_shapes``, float32 and int32, array or Python-scalar
   operands, against numpy itself: the result shape and dtype are numpy's, integers are bit-exact
   (wrapping like numpy) and float32 is exact too, since WGSL's ``+ - *`` are correctly rounded and
   max/min/select/compare do no arithmetic. The only slack is ``atol = finfo(float32).tiny``: WGSL
   lets a GPU flush subnormal results to zero.
2. Random programs, float32 or int32: a DAG of unary/binary elementwise ops with broadcasting,
   where, scalar operands, constants, reductions (any axes, keepdims), softmax/log_softmax/centering
   along any axis, row statistics reused by a second reduction, bool counts, movement (transpose,
   reshape, expand_dims, broadcast_to) and matmuls (1-D, batched, or reshaped to fit). For each:
   (a) the fused GPU run (sometimes under a storage-buffer limit of 4, sometimes with the codegen
   strategies of the other kind of device) and (b) the ``fuse=False`` run equal the interpreter on
   the unoptimised traced IR, and (c) the pass pipeline verifies after every pass (fused, unfused,
   binding limit 4) and the lowered program, interpreted, still computes the same values.
   ``test_random_program_called_twice`` calls a program twice (numpy, then device arrays, x0
   sometimes donated) and reads the first results last; ``test_donated_input_in_place`` aims at
   in-place reuse of a donated buffer.
3. Longer chains mixing reductions and matmuls (softmax/layer_norm/rms_norm rows feeding matmuls,
   column softmax, Gram matrices, residuals) against the interpreter, fused and unfused.
4. A process abort that the random runs hit (device arrays collected by the cyclic GC), kept as a
   deterministic test in a subprocess.

Tolerances for random programs come from a forward error bound carried along the program (see
``_Val``): every value has a magnitude bound B and an absolute error bound E that the difference
between two correct float32 evaluations (GPU, numpy) cannot exceed; a result passes when
``|got - want| <= 4 E + 1e-6 |want|``. Values computed without rounding (int32; whole numbers
below 2**24; neg, abs, max/min, where, movement, scaling by powers of two) have E = 0 and must
match bit for bit.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import subprocess
import sys
from typing import Any, Optional

import numpy as np
import pytest
from helpers import REPO, pythonpath
from hypothesis import HealthCheck, Phase, example, given, note, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fusec
import fusec.numpy as fnp
from fusec import nn
from fusec.interpret import evaluate
from fusec.jit import interpret_traced
from fusec.passes import run_pipeline

EPS = float(np.finfo(np.float32).eps)  # 2**-23: one rounding, relative, with a factor 2 to spare
TINY = float(np.finfo(np.float32).tiny)  # smallest normal float32; below it a GPU may flush to 0

# Each distinct kernel costs 10-50 ms to compile on lavapipe: the example counts (3250 in all)
# keep the file near 1.5 minutes there when nothing fails.
# The explain phase re-runs a failing example hundreds of times; a shrunk program says enough.
SETTINGS = dict(deadline=None, print_blob=True,
                phases=[p for p in Phase if p is not Phase.explain],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _device_bindings() -> int:
    rt = fusec.runtime.get_runtime()
    return rt.max_bindings if rt is not None else 8


# =================================================================================================
# 1. Broadcasting shapes: binary elementwise ops against numpy
# =================================================================================================

BINARY_OPS = {
    "add": (fnp.add, np.add),
    "subtract": (fnp.subtract, np.subtract),
    "multiply": (fnp.multiply, np.multiply),
    "maximum": (fnp.maximum, np.maximum),
    "minimum": (fnp.minimum, np.minimum),
    "greater": (fnp.greater, np.greater),
    "greater_equal": (fnp.greater_equal, np.greater_equal),
    "less": (fnp.less, np.less),
    "less_equal": (fnp.less_equal, np.less_equal),
    "equal": (fnp.equal, np.equal),
    "not_equal": (fnp.not_equal, np.not_equal),
}

# |x| <= 2**60 keeps every product finite (WGSL leaves float overflow implementation-defined);
# subnormal inputs are excluded because WGSL allows flushing them (comparisons would differ).
FLOAT_ELEMENTS = st.floats(-(2.0**60), 2.0**60, width=32, allow_subnormal=False)
INT_ELEMENTS = st.integers(-(2**31), 2**31 - 1)  # full range: add/subtract/multiply wrap as numpy
ELEMENTS = {"float32": FLOAT_ELEMENTS, "int32": INT_ELEMENTS}
BCAST_SHAPES = dict(min_dims=0, max_dims=4, min_side=1, max_side=5)


def _assert_matches_numpy(got: Any, want: np.ndarray) -> None:
    got_np = np.asarray(got)
    want = np.asarray(want)
    assert got_np.shape == want.shape, f"shape {got_np.shape}, numpy gives {want.shape}"
    assert got_np.dtype == want.dtype, f"dtype {got_np.dtype}, numpy gives {want.dtype}"
    if want.dtype == np.float32:
        np.testing.assert_allclose(got_np, want, rtol=0, atol=TINY)
    else:
        np.testing.assert_array_equal(got_np, want)


@settings(max_examples=400, **SETTINGS)
@given(op=st.sampled_from(sorted(BINARY_OPS)), dtype=st.sampled_from(["float32", "int32"]),
       data=st.data())
def test_broadcast_binary(op: str, dtype: str, data: st.DataObject) -> None:
    fop, nop = BINARY_OPS[op]
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, **BCAST_SHAPES),
                       label="shapes")
    x = data.draw(hnp.arrays(dtype, shapes.input_shapes[0], elements=ELEMENTS[dtype]), label="x")
    # the other operand: an array, or (sometimes) a Python scalar closed over, i.e. a literal
    scalar = data.draw(st.none() | ELEMENTS[dtype].map(lambda v: v if dtype == "int32" else float(
        v)), label="scalar operand (None: an array)")
    if scalar is None:
        y = data.draw(hnp.arrays(dtype, shapes.input_shapes[1], elements=ELEMENTS[dtype]),
                      label="y")
        f = fusec.gpu_jit(lambda a, b: fop(a, b))
        got = f(x, y)
        with np.errstate(all="ignore"):
            want = np.asarray(nop(x, y))
        assert want.shape == np.broadcast_shapes(x.shape, y.shape)
    else:
        left = data.draw(st.booleans(), label="scalar on the left")
        f = fusec.gpu_jit(lambda a: fop(scalar, a) if left else fop(a, scalar))
        got = f(x)
        with np.errstate(all="ignore"):  # numpy 2 (NEP 50): the scalar takes x's dtype
            want = np.asarray(nop(scalar, x) if left else nop(x, scalar))
    _assert_matches_numpy(got, want)


@settings(max_examples=150, **SETTINGS)
@given(dtype=st.sampled_from(["float32", "int32"]), data=st.data())
def test_broadcast_where(dtype: str, data: st.DataObject) -> None:
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=3, **BCAST_SHAPES),
                       label="shapes")
    c = data.draw(hnp.arrays(np.bool_, shapes.input_shapes[0]), label="condition")
    x = data.draw(hnp.arrays(dtype, shapes.input_shapes[1], elements=ELEMENTS[dtype]), label="x")
    y = data.draw(hnp.arrays(dtype, shapes.input_shapes[2], elements=ELEMENTS[dtype]), label="y")
    f = fusec.gpu_jit(lambda c, x, y: fnp.where(c, x, y))
    want = np.where(c, x, y)
    assert want.shape == shapes.result_shape
    _assert_matches_numpy(f(c, x, y), want)


@settings(max_examples=100, **SETTINGS)
@given(dtype=st.sampled_from(["float32", "int32"]), data=st.data())
def test_broadcast_compare_then_where(dtype: str, data: st.DataObject) -> None:
    """``where(x > y, x - y, y * x)``: a fused kernel computing a bool and selecting with it."""
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, **BCAST_SHAPES),
                       label="shapes")
    x = data.draw(hnp.arrays(dtype, shapes.input_shapes[0], elements=ELEMENTS[dtype]), label="x")
    y = data.draw(hnp.arrays(dtype, shapes.input_shapes[1], elements=ELEMENTS[dtype]), label="y")
    f = fusec.gpu_jit(lambda x, y: (fnp.where(x > y, x - y, y * x), x >= y))
    got_sel, got_cmp = f(x, y)
    with np.errstate(all="ignore"):
        want_sel = np.where(x > y, x - y, y * x)
    _assert_matches_numpy(got_sel, want_sel)
    _assert_matches_numpy(got_cmp, x >= y)


# =================================================================================================
# 2. Random small programs against the interpreter on the unoptimised IR
# =================================================================================================


class _Val:
    """What the generator knows about a program value: its numpy shape, a bound B on its magnitude,
    and a bound E on the absolute difference between two correct float32 evaluations of it.

    Rules (eps = 2**-23 = 2u, n = elements reduced, K = contraction length, T = TRANS):
      exact ops (neg, abs, max, min, where, movement, x*2**k, x+0)  E' = E (max of operands)
      add/sub       E' = Ea + Eb + eps (Ba + Bb)
      mul           E' = Ea Bb + Eb Ba + Ea Eb + eps Ba Bb      (also covers FMA contraction)
      tanh, sin     E' = E + T + 4 eps B       (Lipschitz 1, plus the op's own error)
      exp(tanh x)   E' = e (E + 2T + 4 eps B)  (exp' <= e on [-1, 1])
      sqrt(|x|+1)   E' = (E + eps (B+1)) / 2 + 2 eps sqrt(B+1)
      sum           E' = n E + eps (n B) depth(n)
      mean          E' = E + eps B depth(n) + eps B
      matmul        E' = K (Ea Bb + Eb Ba + Ea Eb) + eps (K Ba Bb) depth(K)
      softmax       E' = 2E + 4 eps B + 4T + eps depth(n) + 3 eps   (|d softmax| <= 2 |dx|)
      log_softmax   E' = 2E + 4 eps B + 2T (2 + ln n) + eps depth(n) + eps B'
      x - mean(x)   E' = 2E + eps B depth(n) + eps B + eps B'
    depth(n) = min(n, 8 sqrt(n)): a sum of n terms in float32 is off by at most n u sum|x| (the
    deterministic bound) and, for rounding errors that behave randomly, by 8 sqrt(n) u sum|x| except
    with probability < 2 exp(-32) (Higham & Mary's probabilistic bound with lambda = 8); GPU and
    numpy each contribute one such error, hence eps = 2u. Summing n equal values (the least random
    case) was measured at 1.4x the one-sided probabilistic bound for n = 2053: within the factor 4.

    ``is_int``: the value is a whole number with |v| <= B < 2**24, and so was every value it was
    computed from by + - * sum matmul max min (every partial sum is too): float32 computes it
    exactly in any order, so E = 0. Programs on "ints" inputs are therefore mostly checked bit for
    bit. ``where``'s condition compares only exact (E = 0) values, so both sides take one branch.
    """

    def __init__(self, name: str, shape: tuple[int, ...], bound: float, err: float,
                 is_int: bool) -> None:
        self.name, self.shape, self.bound, self.err = name, tuple(shape), float(bound), float(err)
        self.is_int = is_int

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)


# The GPU's error for tanh/exp/sin/log, from fusec.ops (rtol 2e-5, atol 1e-6 against float64 on
# values of magnitude <= 1; numpy's float32 versions are within a few ulp).
TRANS = 2.1e-5
EXACT_INT = 2.0**24  # float32 represents every whole number up to here


def _depth(n: int) -> float:
    return min(float(n), 8.0 * math.sqrt(n))


MAX_STEPS = 8
MAX_BOUND = 1e4  # float values that could exceed this are not generated (accuracy stays useful)
MAX_SIZE = 140_000  # elements per value
MAX_MATMUL = 4_000_000  # multiply-adds per matmul (lavapipe is a CPU)
# Input dimensions: mostly small; 16/17/64 around the 16x16 matmul tile, 257 and 2053 above the
# 256-thread workgroup (primes), 2053 also enough outputs for thread-per-output reductions, 65537
# (prime) longer than a fused row (fuse.ROW_MAX) and than split_reductions' threshold (2**16).
DIMS = (1, 2, 3, 4, 5, 6, 7, 2, 3, 5, 16, 17, 64, 257, 2053, 65537)
MAX_INPUT = 140_000
# program dtype -> input value styles -> magnitude bound
INPUT_STYLES = {
    "float32": {"ints(-3..3)": 3.0, "uniform(-2,2)": 2.0},
    "int32": {"ints(-3..3)": 3.0, "int32(any)": 2.0**31},  # int32 wraps like numpy: exact
}


def _define(source: str, name: str) -> Any:
    """The function ``name`` that ``source`` defines, with fnp and nn in scope."""
    ns: dict[str, Any] = {"fnp": fnp, "nn": nn}
    exec(compile(source, f"<random {name}>", "exec"), ns)
    return ns[name]


class RandomProgram:
    """A random program as data: input shapes, a list of source lines, the outputs. ``source()``
    is a runnable function (the one under test is built by exec-ing it)."""

    def __init__(self, dtype: str, shapes: list[tuple[int, ...]], style: str, seed: int,
                 lines: list[str], outputs: list[_Val], max_bindings: Optional[int],
                 target: Optional[str], donate: bool) -> None:
        self.dtype, self.shapes, self.style, self.seed = dtype, shapes, style, seed
        self.lines, self.outputs = lines, outputs
        self.max_bindings, self.target = max_bindings, target  # None: the device's own
        self.donate = donate  # donate x0 (donate_argnums=(0,))

    def source(self) -> str:
        args = ", ".join(f"x{i}" for i in range(len(self.shapes)))
        body = "".join(f"    {ln}\n" for ln in self.lines)
        outs = ", ".join(o.name for o in self.outputs)
        return f"def program({args}):\n{body}    return ({outs},)\n"

    def build(self) -> Any:
        return _define(self.source(), "program")

    def inputs(self, second: bool = False) -> list[np.ndarray]:
        rng = np.random.default_rng(self.seed + (1 << 20 if second else 0))
        if self.style == "uniform(-2,2)":
            return [rng.uniform(-2, 2, s).astype(np.float32) for s in self.shapes]
        lo, hi = (-3, 4) if self.style == "ints(-3..3)" else (-(2**31), 2**31)
        return [rng.integers(lo, hi, s).astype(self.dtype) for s in self.shapes]

    def __repr__(self) -> str:
        shapes = ", ".join(f"x{i}: {self.dtype}{list(s)}" for i, s in enumerate(self.shapes))
        lim = "" if self.max_bindings is None else f", max storage buffers {self.max_bindings}"
        lim += "" if self.target is None else f", codegen target {self.target!r}"
        lim += ", x0 donated" if self.donate else ""
        return (f"RandomProgram({shapes}; values {self.style}, seed {self.seed}{lim})\n"
                + self.source())


def _bshape(*shapes: tuple[int, ...]) -> Optional[tuple[int, ...]]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None


@functools.lru_cache(maxsize=None)
def _divisors(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


@functools.lru_cache(maxsize=None)
def _factorizations(n: int, k: int) -> tuple[tuple[int, ...], ...]:
    if k == 1:
        return ((n,),)
    return tuple((d,) + rest for d in _divisors(n) for rest in _factorizations(n // d, k - 1))


@functools.lru_cache(maxsize=None)
def _reshape_targets(n: int) -> tuple[tuple[int, ...], ...]:
    out: list[tuple[int, ...]] = [()] if n == 1 else []
    for k in (1, 2, 3):
        out.extend(s for s in _factorizations(n, k) if s.count(1) <= 1)
    return tuple(out)


def _matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> Optional[tuple[int, ...]]:
    """numpy's matmul result shape, or None."""
    if not a or not b:
        return None
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        return None
    batch = _bshape(a2[:-2], b2[:-2])
    if batch is None:
        return None
    return batch + ((a[-2],) if len(a) >= 2 else ()) + ((b[-1],) if len(b) >= 2 else ())


class _Gen:
    """The state of one program being generated."""

    def __init__(self, draw: Any, dtype: str, vals: list[_Val]) -> None:
        self.draw, self.dtype, self.vals = draw, dtype, vals
        self.is_float = dtype == "float32"

    def recent(self, among: Optional[list[_Val]] = None) -> _Val:
        """A value, biased towards (and shrinking towards) the most recent one."""
        vals = self.vals if among is None else among
        return vals[len(vals) - 1 - self.draw(st.integers(0, len(vals) - 1))]

    def compatible(self, shape: tuple[int, ...], exact: bool = False) -> list[_Val]:
        return [v for v in self.vals
                if _bshape(v.shape, shape) is not None and (not exact or v.err == 0)]

    def axes(self, a: _Val) -> tuple[tuple[int, ...], str]:
        """Reduction axes (sorted) and how the source spells them."""
        if self.draw(st.integers(0, 4)) == 0:
            return tuple(range(a.ndim)), "None"
        axes = tuple(sorted(self.draw(st.sets(st.integers(0, a.ndim - 1), min_size=1))))
        spelled = tuple(k - a.ndim for k in axes) if self.draw(st.booleans()) else axes
        return axes, repr(spelled[0]) if len(spelled) == 1 else repr(spelled)


# (expression, shape, B, E, is_int), or None when the step does not apply
Made = Optional[tuple[str, tuple[int, ...], float, float, bool]]


def _step_unary(g: _Gen) -> Made:
    a = g.recent()
    ops = ["neg", "abs", "tanh", "exp_tanh", "sqrt_abs1", "sin"] if g.is_float else ["neg", "abs"]
    op = g.draw(st.sampled_from(ops))
    B, E = a.bound, a.err
    if op == "neg":
        return f"-{a.name}", a.shape, B, E, a.is_int
    if op == "abs":
        return f"fnp.abs({a.name})", a.shape, B, E, a.is_int
    if op == "tanh":
        return f"fnp.tanh({a.name})", a.shape, min(B, 1.0), E + TRANS + 4 * EPS * B, False
    if op == "exp_tanh":
        return (f"fnp.exp(fnp.tanh({a.name}))", a.shape, math.e,
                math.e * (E + 2 * TRANS + 4 * EPS * B), False)
    if op == "sqrt_abs1":
        b = math.sqrt(B + 1)
        return (f"fnp.sqrt(fnp.abs({a.name}) + 1.0)", a.shape, b,
                (E + EPS * (B + 1)) / 2 + 2 * EPS * b, False)
    if B > 30:  # sin of large arguments: argument reduction is where GPUs differ; keep it modest
        return None
    return f"fnp.sin({a.name})", a.shape, min(B, 1.0), E + TRANS + 4 * EPS * B, False


def _step_binary(g: _Gen) -> Made:
    a = g.recent()
    b = g.recent(g.compatible(a.shape))  # often a's neighbour: x - f(x) patterns
    shape = _bshape(a.shape, b.shape)
    assert shape is not None
    op = g.draw(st.sampled_from(["add", "mul", "sub", "maximum", "minimum"]))
    Ba, Bb, Ea, Eb = a.bound, b.bound, a.err, b.err
    both = a.is_int and b.is_int
    if op in ("add", "sub"):
        sym = "+" if op == "add" else "-"
        return f"{a.name} {sym} {b.name}", shape, Ba + Bb, Ea + Eb + EPS * (Ba + Bb), both
    if op == "mul":
        return (f"{a.name} * {b.name}", shape, Ba * Bb,
                Ea * Bb + Eb * Ba + Ea * Eb + EPS * Ba * Bb, both)
    return f"fnp.{op}({a.name}, {b.name})", shape, max(Ba, Bb), max(Ea, Eb), both


def _step_where(g: _Gen) -> Made:
    c1 = g.draw(st.sampled_from([v for v in g.vals if v.err == 0]))
    c2 = g.draw(st.sampled_from(g.compatible(c1.shape, exact=True)))
    shape = _bshape(c1.shape, c2.shape)
    assert shape is not None
    a = g.draw(st.sampled_from(g.compatible(shape)))
    shape = _bshape(shape, a.shape)
    assert shape is not None
    b = g.draw(st.sampled_from(g.compatible(shape)))
    shape = _bshape(shape, b.shape)
    assert shape is not None
    return (f"fnp.where({c1.name} > {c2.name}, {a.name}, {b.name})", shape,
            max(a.bound, b.bound), max(a.err, b.err), a.is_int and b.is_int)


def _step_count(g: _Gen) -> Made:
    """``sum(c1 > c2)`` over some axes: a bool reduced as int32 (then mixed into the program)."""
    exact = [v for v in g.vals if v.err == 0 and v.ndim > 0]
    if not exact:
        return None
    c1 = g.draw(st.sampled_from(exact))
    c2 = g.draw(st.sampled_from(g.compatible(c1.shape, exact=True)))
    shape = _bshape(c1.shape, c2.shape)
    assert shape is not None
    if math.prod(shape) > MAX_SIZE:  # the comparison is a value too (the oracle computes it):
        return None  # (65537,) > (65537, 1) would be 4.3e9 elements
    cmp = _Val("", shape, 1.0, 0.0, True)
    axes, axis_src = g.axes(cmp)
    n = math.prod(shape[k] for k in axes)
    out = tuple(d for k, d in enumerate(shape) if k not in axes)
    return f"fnp.sum({c1.name} > {c2.name}, axis={axis_src})", out, float(n), 0.0, True


def _step_scalar(g: _Gen) -> Made:
    a = g.recent()
    if not g.is_float:  # Python ints: weakly typed, the result stays int32
        c = g.draw(st.sampled_from([1, 0, -2, 3, 7]))
        sym = "+" if g.draw(st.booleans()) else "*"
        return f"{a.name} {sym} {c!r}", a.shape, 0.0, 0.0, True
    c = g.draw(st.sampled_from([1.0, 0.0, 0.5, -2.0, 0.1, 3.0]))
    whole = float(c).is_integer()
    if g.draw(st.booleans()):
        exact = c == 0.0
        return (f"{a.name} + {c!r}", a.shape, a.bound + abs(c),
                a.err + (0.0 if exact else EPS * (a.bound + abs(c))), a.is_int and whole)
    exact = c == 0.0 or math.log2(abs(c)).is_integer()
    return (f"{a.name} * {c!r}", a.shape, a.bound * abs(c),
            abs(c) * a.err + (0.0 if exact else EPS * a.bound * abs(c)), a.is_int and whole)


def _step_full(g: _Gen) -> Made:
    shape = g.draw(st.sampled_from([v.shape for v in g.vals]))
    if not g.is_float:
        c = g.draw(st.sampled_from([0, 2, -5]))
        return f"fnp.full({shape!r}, {c!r})", shape, 5.0, 0.0, True
    c = g.draw(st.sampled_from([0.5, -1.25, 0.0, 2.0]))
    return f"fnp.full({shape!r}, {c!r})", shape, abs(c), 0.0, float(c).is_integer()


def _step_reduce(g: _Gen) -> Made:
    a = g.recent()
    if a.ndim == 0:
        return None
    op = g.draw(st.sampled_from(["sum", "max", "mean", "min"] if g.is_float
                                else ["sum", "max", "min"]))
    axes, axis_src = g.axes(a)
    keep = g.draw(st.booleans())
    n = math.prod(a.shape[k] for k in axes)
    shape = tuple(1 if k in axes else d for k, d in enumerate(a.shape)) if keep else tuple(
        d for k, d in enumerate(a.shape) if k not in axes)
    B, E = a.bound, a.err
    is_int = a.is_int
    if op == "sum":
        B2, E2 = n * B, n * E + EPS * n * B * _depth(n)
    elif op == "mean":
        # a whole-number sum is exact: only the division rounds
        B2, E2 = B, (EPS * B if a.is_int else E + EPS * B * _depth(n) + EPS * B)
        is_int = False
    else:
        B2, E2 = B, E
    return f"fnp.{op}({a.name}, axis={axis_src}, keepdims={keep})", shape, B2, E2, is_int


def _step_rows(g: _Gen) -> Made:
    """A reduction broadcast back over what it reduced: softmax, log_softmax, x - mean(x)."""
    if not g.is_float:
        return None
    a = g.recent()
    if a.ndim == 0:
        return None
    axis = g.draw(st.integers(-a.ndim, a.ndim - 1))
    n = a.shape[axis]
    B, E = a.bound, a.err
    kind = g.draw(st.sampled_from(["softmax", "log_softmax", "center"]))
    if kind == "softmax":
        return (f"nn.softmax({a.name}, axis={axis})", a.shape, 1.0,
                2 * E + 4 * EPS * B + 4 * TRANS + EPS * _depth(n) + 3 * EPS, False)
    if kind == "log_softmax":
        B2 = 2 * B + math.log(n)
        return (f"nn.log_softmax({a.name}, axis={axis})", a.shape, B2,
                2 * E + 4 * EPS * B + 2 * TRANS * (2 + math.log(n)) + EPS * _depth(n)
                + EPS * B2, False)
    return (f"{a.name} - fnp.mean({a.name}, axis={axis}, keepdims=True)", a.shape, 2 * B,
            2 * E + EPS * B * _depth(n) + 3 * EPS * B, False)


def _step_stats(g: _Gen) -> Optional[list[tuple[str, tuple[int, ...], float, float, bool]]]:
    """Row statistics as values of their own (which may be returned), then reused over the same
    rows by a second reduction: max then sum(exp(a - max)); sum then sum(a - sum); max then the
    number of elements equal to it."""
    a = g.recent()
    if a.ndim == 0:
        return None
    axes, axis_src = g.axes(a)
    n = math.prod(a.shape[k] for k in axes)
    kept = tuple(1 if k in axes else d for k, d in enumerate(a.shape))
    kd = g.draw(st.booleans())
    out = kept if kd else tuple(d for k, d in enumerate(a.shape) if k not in axes)
    m = f"v{len(g.vals)}"  # the name the first value will get
    where = f"axis={axis_src}"
    B, E = a.bound, a.err
    kind = g.draw(st.sampled_from(["lse", "center_sum", "count_max"] if g.is_float
                                  else ["center_sum", "count_max"]))
    if kind == "lse":
        e_err = 2 * E + 4 * EPS * B + 2 * TRANS  # of exp(a - max) <= 1
        return [(f"fnp.max({a.name}, {where}, keepdims=True)", kept, B, E, a.is_int),
                (f"fnp.sum(fnp.exp({a.name} - {m}), {where}, keepdims={kd})", out, float(n),
                 n * e_err + EPS * n * _depth(n), False)]
    if kind == "center_sum":
        Bs, Es = n * B, n * E + EPS * n * B * _depth(n)
        Bd, Ed = B + Bs, E + Es + EPS * (B + Bs)
        return [(f"fnp.sum({a.name}, {where}, keepdims=True)", kept, Bs, Es, a.is_int),
                (f"fnp.sum({a.name} - {m}, {where}, keepdims={kd})", out, n * Bd,
                 n * Ed + EPS * n * Bd * _depth(n), a.is_int)]
    if E != 0:  # which elements equal the maximum must not depend on rounding
        return None
    return [(f"fnp.max({a.name}, {where}, keepdims=True)", kept, B, 0.0, a.is_int),
            (f"fnp.sum({a.name} >= {m}, {where}, keepdims={kd})", out, float(n), 0.0, True)]


def _step_movement(g: _Gen) -> Made:
    a = g.recent()
    kind = g.draw(st.sampled_from(["transpose", "reshape", "expand_dims", "broadcast_to"]))
    keep = (a.bound, a.err, a.is_int)
    if kind == "transpose":
        if a.ndim < 2:
            return None
        perm = tuple(g.draw(st.permutations(range(a.ndim))))
        return (f"fnp.transpose({a.name}, {perm!r})", tuple(a.shape[p] for p in perm), *keep)
    if kind == "reshape":
        shape = g.draw(st.sampled_from(_reshape_targets(a.size)))
        return (f"fnp.reshape({a.name}, {shape!r})", shape, *keep)
    if kind == "expand_dims":
        if a.ndim >= 4:
            return None
        axis = g.draw(st.integers(-(a.ndim + 1), a.ndim))
        shape_l = list(a.shape)
        shape_l.insert(axis % (a.ndim + 1), 1)
        return (f"fnp.expand_dims({a.name}, {axis})", tuple(shape_l), *keep)
    if a.ndim >= 4:
        return None
    lead = g.draw(st.integers(1, 3))
    shape = (lead,) + tuple(d if d != 1 else g.draw(st.integers(1, 3)) for d in a.shape)
    return (f"fnp.broadcast_to({a.name}, {shape!r})", shape, *keep)


def _step_matmul(g: _Gen) -> Made:
    cands = [v for v in g.vals if v.ndim >= 1]
    if not cands:
        return None
    a = g.recent(cands)
    K = a.shape[-1]
    options: list[tuple[_Val, Optional[tuple[int, int]]]] = [
        (v, None) for v in g.vals if _matmul_shape(a.shape, v.shape) is not None]
    options += [(v, (K, v.size // K)) for v in g.vals if v.size % K == 0]  # reshape to fit
    b, reshape_to = g.draw(st.sampled_from(options))
    if reshape_to is None:
        shape = _matmul_shape(a.shape, b.shape)
        rhs = b.name
    else:
        shape = _matmul_shape(a.shape, reshape_to)
        rhs = f"fnp.reshape({b.name}, {reshape_to!r})"
    assert shape is not None
    if math.prod(shape) > 8192 or math.prod(shape) * K > MAX_MATMUL:
        return None
    Ba, Bb, Ea, Eb = a.bound, b.bound, a.err, b.err
    return (f"{a.name} @ {rhs}", shape, K * Ba * Bb,
            K * (Ea * Bb + Eb * Ba + Ea * Eb) + EPS * K * Ba * Bb * _depth(K),
            a.is_int and b.is_int)


STEPS = {  # simplest first: hypothesis shrinks towards the start of sampled_from lists
    "unary": _step_unary, "binary": _step_binary, "scalar": _step_scalar,
    "reduce": _step_reduce, "movement": _step_movement, "matmul": _step_matmul,
    "where": _step_where, "full": _step_full, "rows": _step_rows, "count": _step_count,
    "stats": _step_stats,
}
STEP_MIX = ["unary", "binary", "scalar", "reduce", "movement", "matmul", "where", "full",
            "binary", "reduce", "movement", "matmul", "rows", "movement", "unary", "rows",
            "count", "stats", "stats"]
# For buffer-lifetime tests: what can run in place in a donated buffer (elementwise ops, movement
# ops moving elements around) more often, and no second reduction over the same rows.
STEP_MIX_INPLACE = ["unary", "binary", "scalar", "movement", "where", "reduce", "matmul", "full",
                    "unary", "movement", "binary", "movement", "rows", "movement", "unary"]


@st.composite
def _input_shapes(draw: Any, square: int = 1) -> list[tuple[int, ...]]:
    """1-3 broadcast-compatible shapes; the last two dimensions are equal ``square`` times in 3."""
    nd = draw(st.sampled_from([1, 2, 3, 2, 3, 1, 0]))  # rank; mostly 1-3, shrinking towards 1-D
    dims = [draw(st.sampled_from(DIMS)) for _ in range(nd)]
    if nd >= 2 and draw(st.integers(0, 2)) >= 3 - square:
        dims[-1] = dims[-2]  # square: x @ x, transposes that keep the shape
    while math.prod(dims) > MAX_INPUT:  # keep inputs small: shrink the largest dimension
        dims[dims.index(max(dims))] = 3
    shapes = []
    for _ in range(draw(st.integers(1, 3))):
        drop = draw(st.integers(0, nd)) if draw(st.integers(0, 3)) == 3 else 0
        shapes.append(tuple(1 if draw(st.integers(0, 3)) == 3 else d for d in dims[drop:]))
    return shapes


Step = list[tuple[str, tuple[int, ...], float, float, bool]]


def _admit(g: _Gen, made: Any) -> Optional[Step]:
    """The step's values with their error bounds settled, or None if one is too large."""
    out: Step = []
    for expr, shape, bound, err, is_int in made if isinstance(made, list) else [made]:
        if math.prod(shape) > MAX_SIZE or len(shape) > 4:
            return None
        if not g.is_float:  # int32 arithmetic wraps exactly like numpy's
            out.append((expr, shape, bound, 0.0, True))
        elif is_int and bound < EXACT_INT:
            out.append((expr, shape, bound, 0.0, True))
        elif bound <= MAX_BOUND:
            out.append((expr, shape, bound, err, False))
        else:
            return None
    return out


@st.composite
def _step(draw: Any, g: _Gen, mix: list[str]) -> Step:
    """One step (one or two values), as one hypothesis span: shrinking can delete it whole."""
    for _attempt in range(3):
        made = STEPS[draw(st.sampled_from(mix))](g)
        admitted = None if made is None else _admit(g, made)
        if admitted is not None:
            return admitted
    a = g.vals[-1]  # nothing applied: tanh (or, for int32, negation) of the latest value
    if g.is_float:
        return [(f"fnp.tanh({a.name})", a.shape, min(a.bound, 1.0),
                 a.err + TRANS + 4 * EPS * a.bound, False)]
    return [(f"-{a.name}", a.shape, a.bound, 0.0, True)]


@st.composite
def random_programs(draw: Any, options: bool = False, donation: bool = False) -> RandomProgram:
    """``options``: also draw a storage-buffer limit and a codegen target; ``donation``: also draw
    whether x0 is donated (3 in 4), and favour steps that can run in place (STEP_MIX_INPLACE)."""
    dtype = draw(st.sampled_from(["float32", "int32"]))
    max_bindings = draw(st.sampled_from([None, 4])) if options else None
    target = draw(st.sampled_from([None, "gpu", "cpu"])) if options else None
    donate = draw(st.integers(0, 3)) != 0 if donation else False
    shapes = draw(_input_shapes(square=3 if donation else 1))
    style = draw(st.sampled_from(list(INPUT_STYLES[dtype])))
    seed = draw(st.integers(0, 2**16))
    bound = INPUT_STYLES[dtype][style]
    is_int = style.startswith("ints")
    vals = [_Val(f"x{i}", s, bound, 0.0, is_int) for i, s in enumerate(shapes)]
    g = _Gen(draw, dtype, vals)
    lines = []
    for i in range(MAX_STEPS):
        # another step? 3 in 4 (about 4 steps); a "no" and deleted steps are what shrinking tries
        if i and not draw(st.integers(0, 3)):
            break
        for expr, shape, bound, err, is_int in draw(_step(g, STEP_MIX_INPLACE if donation
                                                          else STEP_MIX)):
            name = f"v{len(vals)}"
            lines.append(f"{name} = {expr}")
            vals.append(_Val(name, shape, bound, err, is_int))
    extra = draw(st.lists(st.integers(0, len(vals) - 1), max_size=2))
    outputs = [vals[-1]] + [vals[i] for i in extra]
    return RandomProgram(dtype, shapes, style, seed, lines, outputs, max_bindings, target, donate)


def _check_close(got: Any, want: np.ndarray, atol: float, rtol: float, what: str) -> None:
    """``|got - want| <= atol + rtol |want|`` elementwise (NaN matches NaN); same shape, dtype."""
    got_np = np.asarray(got)
    assert got_np.shape == want.shape, f"{what}: shape {got_np.shape}, expected {want.shape}"
    assert got_np.dtype == want.dtype, f"{what}: dtype {got_np.dtype}, expected {want.dtype}"
    g = got_np.astype(np.float64)
    w = want.astype(np.float64)
    tol = atol + rtol * np.abs(w)
    ok = np.abs(g - w) <= tol
    ok |= np.isnan(g) & np.isnan(w)
    if not ok.all():
        bad = np.argwhere(~ok) if want.ndim else [()]
        lines = [f"  at {tuple(int(i) for i in ix)}: got {g[tuple(ix)]!r}, expected "
                 f"{w[tuple(ix)]!r}" for ix in bad[:6]]
        raise AssertionError(
            f"{what}: {int((~ok).sum())} of {want.size} elements differ (max |diff| "
            f"{np.nanmax(np.abs(g - w)):.3g}, allowed {atol:.3g} + {rtol:.0e} |expected|)\n"
            + "\n".join(lines))


@settings(max_examples=1500, **SETTINGS)
@given(prog=random_programs(options=True))
def test_random_program(prog: RandomProgram) -> None:
    note(repr(prog))
    fn = prog.build()
    args = prog.inputs()
    errs = [o.err for o in prog.outputs]
    rtols = [0.0 if e == 0 else 1e-6 for e in errs]  # exact values must match bit for bit

    traced = fusec.gpu_jit(fn).trace(*args)
    want = interpret_traced(traced, args)
    assert len(want) == len(prog.outputs)
    for w, o in zip(want, prog.outputs):
        assert w.shape == o.shape, f"{o.name}: traced shape {w.shape}, numpy's is {o.shape}"

    # (c) the verifier passes after every pass, and the lowered program still computes the same
    leaves = [*args, *(np.asarray(c) for c in traced.const_values)]
    for fuse, limit in ((True, _device_bindings()), (False, _device_bindings()), (True, 4)):
        opts = dataclasses.replace(traced.options, fuse=fuse, max_bindings=limit)
        lowered = run_pipeline(traced.program, opts, check=True)
        for i, (g, w) in enumerate(zip(evaluate(lowered, leaves), want)):
            _check_close(g, w, 4 * errs[i], rtols[i], f"lowered IR ({opts}), interpreted, "
                         f"output {i}")

    # (a) fused on the GPU, optionally under a low storage-buffer limit (fusion must split) and
    # with the codegen strategies of the other kind of device
    opts = dataclasses.replace(traced.options, fuse=True)
    if prog.max_bindings is not None:
        opts = dataclasses.replace(opts, max_bindings=prog.max_bindings)
    if prog.target is not None:
        opts = dataclasses.replace(opts, target=prog.target)
    if opts == traced.options:
        got = fusec.gpu_jit(fn)(*args)  # the plain path: jit call, signature cache and all
    else:
        got = dataclasses.replace(traced, options=opts).lower().compile().run_leaves(args)
    assert isinstance(got, tuple) and len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        _check_close(g, w, 4 * errs[i], rtols[i], f"fused GPU output {i}")

    # (b) one kernel per op
    got = fusec.gpu_jit(fn, fuse=False)(*args)
    for i, (g, w) in enumerate(zip(got, want)):
        _check_close(g, w, 4 * errs[i], rtols[i], f"unfused GPU output {i}")


# found on the H200: NVIDIA's compiler turned this int32 min(min(x, -|x|), |x|) into x (2 where
# -2 was due) when the earlier test files had run in the process; fusec now emits integer min and
# max as selects
_FOUND_ON_H200 = RandomProgram(
    "int32", [(1,)], "ints(-3..3)", 0,
    ["v1 = fnp.abs(x0)", "v2 = -v1", "v3 = fnp.minimum(x0, v2)", "v4 = fnp.minimum(v3, v1)"],
    [_Val("v4", (1,), 3.0, 0.0, True)], None, None, False)


@settings(max_examples=600, **SETTINGS)
@given(prog=random_programs(donation=True))
@example(prog=_FOUND_ON_H200)
def test_random_program_called_twice(prog: RandomProgram) -> None:
    """Buffers live across calls (memory planning, donation): call the fused program with numpy
    arrays, then with device arrays holding other values (x0 donated when ``prog.donate``), and
    read the first call's outputs only after the second call has run. A donated array that was not
    returned must refuse to be read."""
    note(repr(prog))
    fn = prog.build()
    args, args2 = prog.inputs(), prog.inputs(second=True)
    errs = [o.err for o in prog.outputs]
    rtols = [0.0 if e == 0 else 1e-6 for e in errs]
    f = fusec.gpu_jit(fn, donate_argnums=(0,) if prog.donate else ())
    traced = f.trace(*args)
    want, want2 = interpret_traced(traced, args), interpret_traced(traced, args2)
    got = f(*args)
    dev2 = [fusec.device_put(x) for x in args2]
    got2 = f(*dev2)
    for i, (g, w) in enumerate(zip(got, want)):
        _check_close(g, w, 4 * errs[i], rtols[i], f"first call, output {i}")
    for i, (g, w) in enumerate(zip(got2, want2)):
        _check_close(g, w, 4 * errs[i], rtols[i], f"second call (device arrays), output {i}")
    if prog.donate and not any(o is dev2[0] for o in got2):  # an input returned as is stays alive
        with pytest.raises(fusec.FusecError, match="donated"):
            np.asarray(dev2[0])


@st.composite
def _donation_programs(draw: Any) -> tuple[tuple[int, ...], tuple[int, ...], str]:
    """(x shape, y shape, source of ``f(x, y)``): whole-number-exact elementwise ops on x and y,
    with shape-preserving transposes anywhere in the chain; the result has x's shape."""
    n = draw(st.integers(1, 9))
    shape = tuple(n if draw(st.booleans()) else draw(st.integers(1, 9))
                  for _ in range(draw(st.integers(1, 3))))
    y_shape = shape[draw(st.integers(0, len(shape))):]
    perms = [p for p in itertools.permutations(range(len(shape)))
             if tuple(shape[k] for k in p) == shape and list(p) != sorted(p)]
    kinds = ["neg", "abs", "scale", "shift", "max_y", "sub_y", "where_y"] + (
        ["transpose"] * 3 if perms else [])
    lines, v = [], "x"
    for i in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(kinds))
        expr = {"neg": f"-{v}", "abs": f"fnp.abs({v})", "scale": f"{v} * 2.0",
                "shift": f"{v} + 1.0", "max_y": f"fnp.maximum({v}, y)", "sub_y": f"{v} - y",
                "where_y": f"fnp.where({v} > y, {v}, y)"}.get(kind)
        if expr is None:
            expr = f"fnp.transpose({v}, {draw(st.sampled_from(perms))!r})"
        lines.append(f"v{i} = {expr}")
        v = f"v{i}"
    body = "".join(f"    {ln}\n" for ln in lines)
    return shape, y_shape, f"def f(x, y):\n{body}    return {v}\n"


@settings(max_examples=300, **SETTINGS)
@given(case=_donation_programs(), seed=st.integers(0, 2**16))
def test_donated_input_in_place(case: tuple[tuple[int, ...], tuple[int, ...], str],
                                seed: int) -> None:
    """``donate_argnums=(0,)``: the output may be computed in x's buffer, in place. That is only
    right when every thread reads x at its own index and nowhere else; transposes anywhere between
    x and the output break it. Expected values come from running the same source on numpy (the
    ops are exact on whole numbers, so the comparison is exact)."""
    shape, y_shape, src = case
    note(f"x: float32{list(shape)} (donated), y: float32{list(y_shape)}\n{src}")
    fns: dict[str, Any] = {}
    for name, ns in (("gpu", {"fnp": fnp}), ("numpy", {"fnp": np})):
        exec(compile(src, "<donation program>", "exec"), ns)
        fns[name] = ns["f"]
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, shape).astype(np.float32)
    y = rng.integers(-3, 4, y_shape).astype(np.float32)
    want = np.asarray(fns["numpy"](x, y))
    xd = fusec.device_put(x)
    got = fusec.gpu_jit(fns["gpu"], donate_argnums=(0,))(xd, y)
    _assert_matches_numpy(got, want)
    if got is not xd:  # (x returned as is, e.g. after -(-x) simplifies, stays alive)
        with pytest.raises(fusec.FusecError, match="donated"):
            np.asarray(xd)


# =================================================================================================
# 3. Longer chains mixing reductions and matmuls
# =================================================================================================

# Each layer maps h (shape (..., M, n)) to a new h; weights are extra inputs, scaled by 1/sqrt(fan
# in) so activations stay O(1). "{k}" is the layer number, "{n}"/"{m}" the width in/out.
LAYERS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    # name: (source line, [(weight name, shape spec)])
    "softmax_matmul": ("h = nn.softmax(h, axis=-1) @ w{k}", [("w{k}", "n,m")]),
    "layer_norm_matmul": ("h = nn.layer_norm(h, g{k}, b{k}, eps=1e-2) @ w{k}",
                          [("g{k}", "n"), ("b{k}", "n"), ("w{k}", "n,m")]),
    "gelu_linear": ("h = nn.gelu(h @ w{k} + b{k})", [("w{k}", "n,m"), ("b{k}", "m")]),
    "center_rows": ("h = h - fnp.mean(h, axis=-1, keepdims=True)", []),
    "log_softmax": ("h = nn.log_softmax(h, axis=-1)", []),
    "rms_norm": ("h = nn.rms_norm(h, g{k}, eps=1e-2)", [("g{k}", "n")]),
    "col_softmax": ("h = nn.softmax(h, axis=-2)", []),
    "residual_tanh": ("h = h + fnp.tanh(h @ w{k})", [("w{k}", "n,n")]),
    "gram": ("h = fnp.tanh((fnp.transpose(h, {perm}) @ h) * {inv_rows!r})", []),  # a mean
    "scale_by_col_max": ("h = fnp.tanh(h) * fnp.max(fnp.abs(h), axis=-2, keepdims=True)", []),
    "relu_mlp": ("h = nn.relu(h @ w{k} + b{k}) @ v{k}",
                 [("w{k}", "n,m"), ("b{k}", "m"), ("v{k}", "m,n")]),
}
TAILS = {  # optional final reduction, returned next to h
    "none": None,
    "row_sum": "fnp.sum(h, axis=-1)",
    "total_max": "fnp.max(h)",
    "col_mean": "fnp.mean(h, axis=-2, keepdims=True)",
}
CHAIN_ATOL = 1e-5  # times max(1, max|want|) times Chain.gains[i]
CHAIN_RTOL = 1e-4
NORMS = ("layer_norm_matmul", "rms_norm")
WIDTHS = st.one_of(st.integers(1, 9), st.sampled_from([16, 17, 33, 64, 300]))


class Chain:
    """A chain of layers as data; ``source()`` is the function under test."""

    def __init__(self, batch: tuple[int, ...], rows: int, widths: list[int], layers: list[str],
                 tail: str, seed: int, target: Optional[str] = None) -> None:
        self.batch, self.rows, self.widths, self.layers = batch, rows, widths, layers
        self.tail, self.seed = tail, seed
        self.target = target  # codegen target of the fused run (None: the device's own)
        self.weights: list[tuple[str, tuple[int, ...], float]] = []  # name, shape, scale
        lines = []
        n = widths[0]
        r = rows  # the current number of rows (gram makes it n)
        nb = len(batch)
        perm = tuple(range(nb)) + (nb + 1, nb)  # swap the last two axes
        # log_softmax's outputs are not O(1) but about -ln(n): the layers after it (a mean, a
        # centring) round values that large, whatever the size of their own outputs
        magnitude = 1.0
        for k, (layer, m) in enumerate(zip(layers, widths[1:])):
            if layer == "log_softmax":
                magnitude *= 1.0 + math.log(n)
            line, ws = LAYERS[layer]
            for wname, spec in ws:
                dims = {"n": n, "m": m}
                shape = tuple(dims[s] for s in spec.split(","))
                scale = 1.0 / math.sqrt(shape[0]) if len(shape) == 2 else 1.0
                self.weights.append((wname.format(k=k), shape, scale))
            lines.append(line.format(k=k, perm=perm, inv_rows=1.0 / r))
            if layer == "gram":
                r = n  # (..., n, n)
            elif any(spec.endswith(",m") for _, spec in ws) and layer != "relu_mlp":
                n = m  # the layer's output width
        self.lines = lines
        self.out_width = n
        # normalising a near-constant row can amplify the errors coming in by up to 1/sqrt(eps) =
        # 10 (the layers use eps = 1e-2); a row sum adds up n elements' errors (randomly: sqrt(n)),
        # but after a centring the row mean's error shifts every element alike: n times it, and a
        # mean of n values of the row's magnitude is off by up to log2(n) u of that in either
        # run (pairwise sums), so the two runs differ by up to 2 n log2(n) u = n log2(n) / 84 in
        # units of CHAIN_ATOL (log_softmax, then a centring, over 300 columns differed by 1.1
        # times the random-walk allowance)
        g = 10.0 ** sum(layer in NORMS for layer in layers) * magnitude
        row_sum = max(math.sqrt(n), n * math.log2(max(n, 2)) / 84.0)
        self.gains = [g, g * (row_sum if tail == "row_sum" else 1.0)]

    def source(self) -> str:
        params = ", ".join(["x"] + [w for w, _, _ in self.weights])
        body = "".join(f"    {ln}\n" for ln in self.lines)
        tail = TAILS[self.tail]
        ret = "(h,)" if tail is None else f"(h, {tail})"
        return f"def chain({params}):\n    h = x\n{body}    return {ret}\n"

    def build(self) -> Any:
        return _define(self.source(), "chain")

    def inputs(self, second: bool = False) -> list[np.ndarray]:
        rng = np.random.default_rng(self.seed + (1 << 20 if second else 0))
        x = rng.uniform(-2, 2, self.batch + (self.rows, self.widths[0])).astype(np.float32)
        return [x] + [(rng.uniform(-1, 1, s) * sc).astype(np.float32)
                      for _, s, sc in self.weights]

    def __repr__(self) -> str:
        tgt = "" if self.target is None else f", codegen target {self.target!r}"
        return (f"Chain(x: float32{list(self.batch + (self.rows, self.widths[0]))}, weights "
                f"{[(w, list(s)) for w, s, _ in self.weights]}, seed {self.seed}{tgt})\n"
                + self.source())


@st.composite
def chains(draw: Any) -> Chain:
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=1)))
    rows = draw(st.one_of(st.integers(1, 9), st.sampled_from([17, 64])))
    layers = draw(st.lists(st.sampled_from(list(LAYERS)), min_size=2, max_size=5))
    widths = [draw(WIDTHS)]
    for layer in layers:
        _, ws = LAYERS[layer]
        needs_m = any("m" in spec for _, spec in ws)
        widths.append(draw(WIDTHS) if needs_m else widths[-1])
    tail = draw(st.sampled_from(list(TAILS)))
    seed = draw(st.integers(0, 2**16))
    target = draw(st.sampled_from([None, "gpu", "cpu"]))
    return Chain(batch, rows, widths, layers, tail, seed, target)


@settings(max_examples=200, **SETTINGS)
@given(chain=chains())
@example(chain=Chain((), 1, [300] * 4, ["gram", "log_softmax", "center_rows"], "row_sum", 0))
def test_reduction_matmul_chains(chain: Chain) -> None:
    """The fused run (with the device's codegen strategies or, per ``chain.target``, the other
    kind's) and the unfused run against the interpreter.

    Tolerance: ``1e-5 * S * gain + 1e-4 |want|`` with S = max(1, max|want|) (for a row sum,
    max|terms|: float32 and the GPU both miss a cancelling sum by ~n u max|terms|). Activations
    stay O(1) (weights scaled by 1/sqrt(fan-in), Gram matrices averaged, softmax rows sum to 1)
    except after log_softmax, whose outputs are about -ln(n): gain 1 + ln(n) for each;
    per layer, float32 rounding over K <= 300 terms is ~8 sqrt(K) u ~ 1e-5 relative (see _Val)
    and tanh/exp/log add ~2e-5 (fusec.ops); softmax, tanh and gelu are Lipschitz ~1. Normalising a
    near-constant row can amplify the error coming in by up to 1/sqrt(eps) = 10 (the layers use
    eps = 1e-2), hence gain 10 per normalisation layer; a row sum adds up n errors (gain sqrt(n)).
    Measured errors stayed below 10% of this tolerance over 600 chains; a wrong index, axis or
    fusion gives errors of order S."""
    note(repr(chain))
    fn = chain.build()
    args = chain.inputs()
    traced = fusec.gpu_jit(fn).trace(*args)
    want = interpret_traced(traced, args)
    for fuse in (True, False):  # the verifier runs after every pass
        run_pipeline(traced.program, dataclasses.replace(traced.options, fuse=fuse), check=True)
    if chain.target is None:
        fused = fusec.gpu_jit(fn)
    else:
        opts = dataclasses.replace(traced.options, target=chain.target)
        compiled = dataclasses.replace(traced, options=opts).lower().compile()
        fused = lambda *xs: compiled.run_leaves(xs)  # noqa: E731
    for label, f in (("fused", fused), ("unfused", fusec.gpu_jit(fn, fuse=False))):
        got = f(*args)
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            # a row sum's rounding error scales with its terms (output 0), not with the sum,
            # which cancellation can make ~0 (e.g. the sum of a mean-centred row)
            terms = want[0] if i == 1 and chain.tail == "row_sum" else w
            scale = max(1.0, float(np.max(np.abs(terms), initial=0.0)))
            _check_close(g, w, CHAIN_ATOL * scale * chain.gains[i], CHAIN_RTOL,
                         f"{label} GPU output {i}")


# =================================================================================================
# 4. A crash the random runs above hit, kept deterministic
# =================================================================================================

_CYCLIC_GC_SCRIPT = """
import gc
import numpy as np
import fusec

f = fusec.gpu_jit(lambda x: x + 1)
x = fusec.device_put(np.zeros(1024, np.float32))
a = fusec.device_put(np.ones(1024, np.float32))
cycle = [a]
cycle.append(cycle)  # the array is only reachable from a reference cycle
del a, cycle
gc.collect()  # finalises the wgpu buffer (its handle released) and the array's DeviceBuffer
y = f(x)  # the output buffer comes from the runtime's pool
assert np.array_equal(np.asarray(y), np.ones(1024, np.float32))
print("ok")
"""


def test_device_arrays_collected_in_a_reference_cycle() -> None:
    """Found by this file: after a failing example, hypothesis keeps its traceback, whose frames
    hold device arrays in reference cycles; when the cyclic GC collects them it finalises the wgpu
    buffer (releasing its handle) and fusec's DeviceBuffer (which puts that buffer back in the
    pool) in no particular order. A later call then gets a released buffer from the pool and
    wgpu-native aborts the process in create_bind_group ("invalid bind group entry"), taking the
    test session with it. Run in a subprocess so that an abort fails only this test."""
    env = {**os.environ, "PYTHONPATH": pythonpath()}
    proc = subprocess.run([sys.executable, "-c", _CYCLIC_GC_SCRIPT], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, (  # the panic message comes first
        f"exit status {proc.returncode}\n{proc.stdout}\n{proc.stderr[:600]}")


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__, "-q"]))
