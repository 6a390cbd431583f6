"""Each primitive's facts in one table: result shape and dtype, numpy reference, WGSL expression,
and the tolerance a float32 GPU result is held to against a float64 numpy reference.

Adding an elementwise op means adding one :class:`Elementwise` row here (plus its :class:`Op` name
in :mod:`fusec.ir` and a user-facing function in :mod:`fusec.numpy`); codegen, the interpreter and
the numeric tests all read this table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import dtypes
from .errors import ShapeError
from .ir import PREDICATE, Op, Shape

# --- shape rules ----------------------------------------------------------------------------------


def broadcast_shapes(*shapes: Shape) -> Shape:
    """numpy broadcasting; raises ShapeError with the shapes when they do not broadcast."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(ndim):
        dims = {s[len(s) - ndim + k] for s in shapes if len(s) - ndim + k >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ShapeError(
                f"shapes {' and '.join(str(tuple(s)) for s in shapes)} do not broadcast "
                f"(numpy rules: trailing dimensions must be equal or 1)"
            )
        out.append(dims.pop() if dims else 1)
    return tuple(out)


# --- WGSL literals --------------------------------------------------------------------------------


def wgsl_literal(value: Any, dtype: str) -> str:
    """A WGSL expression for a scalar constant of the given dtype; exact for float32 values."""
    if dtype == "bool":
        return "true" if value else "false"
    if dtype == "int32":
        v = int(np.int32(value))
        return f"{v}i" if v != -(2**31) else "i32(-2147483647 - 1)"
    if dtype == "uint32":
        return f"{int(np.uint32(value))}u"
    f = float(np.float32(value))
    if math.isfinite(f):
        text = repr(f)
        return text + ("f" if ("." in text or "e" in text) else ".0f")
    bits = int(np.array(f, dtype=np.float32).view(np.uint32))
    return f"bitcast<f32>({bits:#x}u)"  # inf and nan have no WGSL literal


# --- elementwise ----------------------------------------------------------------------------------

# Helper functions pasted once into any kernel that uses the op.
HELPERS = {
    "fusec_erf": """
fn fusec_erf(x: f32) -> f32 {
    // Abramowitz & Stegun 7.1.26: |error| < 1.5e-7; WGSL has no erf builtin.
    let t = 1.0 / (1.0 + 0.3275911 * abs(x));
    let p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741
            + t * (-1.453152027 + t * 1.061405429))));
    return sign(x) * (1.0 - p * exp(-x * x));
}""",
    "fusec_tanh": """
fn fusec_tanh(x: f32) -> f32 {
    // One exp2 and one division: 1 - 2 / (e^2|x| + 1) (e = inf gives 1; NaN stays NaN). Near 0
    // that cancels, so below 0.25 an odd series (error < 1e-8 relative there) takes over; the
    // sign is copied from x's bits. Max relative error 3.4e-7 on the H200. The builtin lost all
    // relative accuracy near 0 on lavapipe, and a 16-op chain with 3 tanh ran at 219-224 us with
    // it on the H200 against 190 us with this (the chain's memory time).
    let ax = abs(x);
    let e = exp2(ax * 2.8853900817779268);
    let big = 1.0 - 2.0 / (e + 1.0);
    let x2 = x * x;
    let small = ax * (1.0 + x2 * (-0.33333334 + x2 * (0.13333334 + x2 * (-0.053968254
                + x2 * 0.021869488))));
    let r = select(big, small, ax < 0.25);
    return bitcast<f32>(bitcast<u32>(r) | (bitcast<u32>(x) & 0x80000000u));
}""",
    # written out over the exponent's 32 bits: software adapters end a shader's loops after
    # 65535 iterations in all (see codegen.SOFTWARE_LOOP_LIMIT), and a loop here, run for every
    # element a row kernel's loop visits, passed that (int32 ** over 22000 rows came out wrong)
    "fusec_ipow_u32": """
fn fusec_ipow_u32(x: u32, n: u32) -> u32 {
    // exact integer power by squaring, wrapping modulo 2^32 like numpy
    var r = 1u;
    var b = x;
""" + "\n".join(f"    r = select(r, r * b, (n & {1 << i}u) != 0u);\n    b = b * b;"
               for i in range(31)) + """
    return select(r, r * b, (n & 2147483648u) != 0u);
}""",
    # after fusec_ipow_u32, which it calls: two's complement products wrap to the same bits
    "fusec_ipow_i32": """
fn fusec_ipow_i32(x: i32, n: i32) -> i32 {
    if (n < 0) {
        if (x == 1i) { return 1i; }
        if (x == -1i) { return select(1i, -1i, (n & 1i) != 0i); }
        return 0i;
    }
    return bitcast<i32>(fusec_ipow_u32(bitcast<u32>(x), u32(n)));
}""",
    "fusec_pow": """
fn fusec_pow(x: f32, y: f32) -> f32 {
    // WGSL pow(x, y) is undefined for x < 0 and for x == 0; numpy is not.
    if (y == 0.0) { return 1.0; }
    let r = pow(abs(x), y);
    if (x == 0.0) { return select(0.0, 1.0 / x, y < 0.0); }
    if (x < 0.0) {
        if (floor(y) != y) { return (x - x) / (x - x); }
        if (floor(y * 0.5) != y * 0.5) { return -r; }
    }
    return r;
}""",
}


@dataclass(frozen=True)
class Elementwise:
    """Facts about one elementwise primitive."""

    op: Op
    numpy: Callable[..., Any]  # reference on numpy arrays of the operand dtype
    wgsl: Callable[[Sequence[str], str], str]  # (operand expressions, operand dtype) -> expression
    float_only: bool = False  # trace casts integer operands to float32 first
    bool_ok: bool = True
    # (rtol, atol) of the GPU float32 result against a float64 reference, from WGSL's accuracy rules
    # (e.g. exp: 3 + 2|x| ULP; division 2.5 ULP) and measured on lavapipe and the H100/H200.
    tol: tuple[float, float] = (1e-6, 0.0)


def _neg(a: Sequence[str], dt: str) -> str:
    return f"(0u - {a[0]})" if dt == "uint32" else f"(-{a[0]})"


def _abs(a: Sequence[str], dt: str) -> str:
    return a[0] if dt in ("uint32", "bool") else f"abs({a[0]})"


def _bin(sym: str, bool_sym: str | None = None) -> Callable[[Sequence[str], str], str]:
    def f(a: Sequence[str], dt: str) -> str:
        if dt == "bool" and bool_sym is not None:
            return f"({a[0]} {bool_sym} {a[1]})"
        if dt == "bool" and sym in ("<", "<=", ">", ">="):
            return f"(u32({a[0]}) {sym} u32({a[1]}))"
        return f"({a[0]} {sym} {a[1]})"

    return f


def _call(name: str, bool_sym: str | None = None) -> Callable[[Sequence[str], str], str]:
    def f(a: Sequence[str], dt: str) -> str:
        if dt == "bool" and bool_sym is not None:
            return f"({a[0]} {bool_sym} {a[1]})"
        return f"{name}({', '.join(a)})"

    return f


def _minmax(cmp: str, name: str, bool_sym: str) -> Callable[[Sequence[str], str], str]:
    """Integer min and max as selects: NVIDIA's Vulkan compiler (driver 580, H200) computed x for
    the int32 min(min(x, -abs(x)), abs(x)) in some processes; the select form was right. Floats
    keep the builtins (their NaN handling)."""
    builtin = _call(name, bool_sym)

    def f(a: Sequence[str], dt: str) -> str:
        if dt in ("int32", "uint32"):
            return f"select({a[1]}, {a[0]}, {a[0]} {cmp} {a[1]})"
        return builtin(a, dt)

    return f


def _pow(a: Sequence[str], dt: str) -> str:
    fn = {"float32": "fusec_pow", "int32": "fusec_ipow_i32", "uint32": "fusec_ipow_u32"}[dt]
    return f"{fn}({a[0]}, {a[1]})"


def _np_power(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """numpy's power; for integers, negative exponents give 0 (1 or -1 for bases 1 and -1) where
    numpy would raise, as the GPU computes them."""
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype.kind == "f":
        return np.power(x, y)
    if x.dtype.kind == "i":
        neg = y < 0
        safe = np.power(x, np.where(neg, 0, y))
        special = np.where(x == 1, 1, np.where(x == -1, np.where(y % 2 == 0, 1, -1), 0))
        return np.where(neg, special, safe).astype(x.dtype)
    return np.power(x, y)


def _np_erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)


def _np_bool_safe(fn: Callable[..., Any], bool_fn: Callable[..., Any]) -> Callable[..., Any]:
    def f(*xs: np.ndarray) -> Any:
        if all(np.asarray(x).dtype == np.bool_ for x in xs):
            return bool_fn(*xs)
        return fn(*xs)

    return f


_TRANSCENDENTAL = (2e-5, 1e-6)

ELEMENTWISE: dict[Op, Elementwise] = {
    e.op: e
    for e in [
        Elementwise(Op.NEG, np.negative, _neg, bool_ok=False, tol=(0.0, 0.0)),
        Elementwise(Op.ABS, np.abs, _abs, tol=(0.0, 0.0)),
        Elementwise(Op.EXP, np.exp, _call("exp"), float_only=True, tol=_TRANSCENDENTAL),
        Elementwise(Op.LOG, np.log, _call("log"), float_only=True, tol=_TRANSCENDENTAL),
        Elementwise(Op.SQRT, np.sqrt, _call("sqrt"), float_only=True, tol=(1e-6, 0.0)),
        Elementwise(Op.RSQRT, lambda x: (1 / np.sqrt(x)).astype(x.dtype), _call("inverseSqrt"),
                    float_only=True, tol=(1e-6, 0.0)),
        Elementwise(Op.TANH, np.tanh, _call("fusec_tanh"), float_only=True, tol=_TRANSCENDENTAL),
        # WGSL promises sin/cos only to 2^-11 absolute on [-pi, pi]; real adapters do far better.
        Elementwise(Op.SIN, np.sin, _call("sin"), float_only=True, tol=(1e-5, 2e-6)),
        Elementwise(Op.COS, np.cos, _call("cos"), float_only=True, tol=(1e-5, 2e-6)),
        Elementwise(Op.ERF, _np_erf, _call("fusec_erf"), float_only=True, tol=(1e-5, 1e-6)),
        Elementwise(Op.ADD, _np_bool_safe(np.add, np.logical_or), _bin("+", "||"), tol=(1e-7, 0.0)),
        Elementwise(Op.SUB, np.subtract, _bin("-"), bool_ok=False, tol=(1e-7, 0.0)),
        Elementwise(Op.MUL, _np_bool_safe(np.multiply, np.logical_and), _bin("*", "&&"),
                    tol=(1e-7, 0.0)),
        Elementwise(Op.DIV, np.divide, _bin("/"), float_only=True, tol=(1e-6, 0.0)),
        Elementwise(Op.POW, _np_power, _pow, bool_ok=False, tol=(5e-5, 1e-6)),
        Elementwise(Op.MAX, np.maximum, _minmax(">", "max", "||"), tol=(0.0, 0.0)),
        Elementwise(Op.MIN, np.minimum, _minmax("<", "min", "&&"), tol=(0.0, 0.0)),
        Elementwise(Op.GT, np.greater, _bin(">"), tol=(0.0, 0.0)),
        Elementwise(Op.GE, np.greater_equal, _bin(">="), tol=(0.0, 0.0)),
        Elementwise(Op.LT, np.less, _bin("<"), tol=(0.0, 0.0)),
        Elementwise(Op.LE, np.less_equal, _bin("<="), tol=(0.0, 0.0)),
        Elementwise(Op.EQ, np.equal, _bin("=="), tol=(0.0, 0.0)),
        Elementwise(Op.NE, np.not_equal, _bin("!="), tol=(0.0, 0.0)),
        # where(c, a, b): WGSL select(false_value, true_value, cond)
        Elementwise(Op.WHERE, np.where, lambda a, dt: f"select({a[2]}, {a[1]}, {a[0]})",
                    tol=(0.0, 0.0)),
    ]
}


def cast_wgsl(expr: str, src: str, dst: str) -> str:
    """WGSL for numpy's astype between supported dtypes."""
    if src == dst:
        return expr
    ty = dtypes.WGSL_TYPE[dst]
    if dst == "bool":
        zero = "0.0" if src == "float32" else ("0i" if src == "int32" else "0u")
        return f"({expr} != {zero})"
    if src == "bool":
        one, zero = {"float32": ("1.0", "0.0"), "int32": ("1i", "0i"), "uint32": ("1u", "0u")}[dst]
        return f"select({zero}, {one}, {expr})"
    return f"{ty}({expr})"  # i32<->u32 reinterpret the bits; float->int saturates


def ipow_wgsl(expr: str, n: int, dtype: str) -> str:
    """x ** n for a Python int n, by repeated multiplication (exact for integers, as numpy)."""
    if n == 0:
        return wgsl_literal(1, dtype)
    m = abs(n)
    parts = [expr] * m
    prod = "(" + " * ".join(parts) + ")"
    return f"(1.0 / {prod})" if n < 0 else prod


def elementwise_dtype(op: Op, in_dtypes: Sequence[str], params: dict[str, Any]) -> str:
    if op in PREDICATE:
        return "bool"
    if op is Op.CAST:
        return str(params["dtype"])
    if op is Op.WHERE:
        return in_dtypes[1]
    return in_dtypes[0]


def numpy_elementwise(op: Op, args: Sequence[np.ndarray], params: dict[str, Any],
                      out_dtype: str) -> np.ndarray:
    """The numpy reference of an elementwise primitive, computed in the operand dtype."""
    ndt = np.dtype(out_dtype)
    if op is Op.CAST:
        x = args[0]
        if out_dtype == "bool":
            return np.asarray(x != 0)
        return np.asarray(x).astype(ndt)
    if op is Op.IPOW:
        n = int(params["n"])
        with np.errstate(all="ignore"):
            x = args[0]
            if n < 0:
                return np.asarray(1 / np.power(x, -n)).astype(ndt)
            return np.asarray(np.power(x, n)).astype(ndt)
    with np.errstate(all="ignore"):
        out = ELEMENTWISE[op].numpy(*args)
    return np.asarray(out).astype(ndt, copy=False)


# --- reductions -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reduction:
    op: Op
    numpy: Callable[..., Any]
    combine: Callable[[str, str], str]
    identity: Callable[[str], Any]  # dtype -> Python value


def _max_identity(dt: str) -> Any:
    return {"float32": -math.inf, "int32": -(2**31), "uint32": 0, "bool": False}[dt]


def _min_identity(dt: str) -> Any:
    return {"float32": math.inf, "int32": 2**31 - 1, "uint32": 2**32 - 1, "bool": True}[dt]


REDUCTIONS: dict[Op, Reduction] = {
    Op.SUM: Reduction(Op.SUM, np.sum, lambda a, b: f"({a} + {b})", lambda dt: 0),
    Op.RMAX: Reduction(Op.RMAX, np.max, lambda a, b: f"max({a}, {b})", _max_identity),
    Op.RMIN: Reduction(Op.RMIN, np.min, lambda a, b: f"min({a}, {b})", _min_identity),
}


def partial_numpy(x: np.ndarray, op: Op, axes: tuple[int, ...], chunks: int) -> np.ndarray:
    """Reference of ``reduce_partial``: chunk g of the flattened reduced axes, reduced."""
    kept = [k for k in range(x.ndim) if k not in axes]
    moved = np.transpose(x, kept + list(axes))
    outer = tuple(x.shape[k] for k in kept)
    r = int(np.prod([x.shape[k] for k in axes], dtype=np.int64))
    flat = moved.reshape(outer + (r,))
    size = -(-r // chunks)
    ident = REDUCTIONS[op].identity(x.dtype.name)
    padded = np.full(outer + (size * chunks,), ident, dtype=x.dtype)
    padded[..., :r] = flat
    return np.asarray(REDUCTIONS[op].numpy(padded.reshape(outer + (chunks, size)), axis=-1),
                      dtype=x.dtype)


def slice_shape(shape: Shape, starts: tuple[int, ...], steps: tuple[int, ...],
                out: Shape) -> Shape:
    """Check a static slice: out[o] = x[start + o * step] stays inside ``shape`` on every axis."""
    if not len(shape) == len(starts) == len(steps) == len(out):
        raise ShapeError(f"slice of shape {shape}: starts {starts}, steps {steps} and result "
                         f"shape {out} must have one entry per axis")
    for d, s0, st, n in zip(shape, starts, steps, out):
        if st == 0 or n < 0:
            raise ShapeError(f"slice step must be non-zero; got steps {steps}")
        if n and not (0 <= s0 < d and 0 <= s0 + (n - 1) * st < d):
            raise ShapeError(f"slice starts {starts}, steps {steps}, shape {out} leave the bounds "
                             f"of shape {shape}")
    return tuple(out)


# Facts of ops that live in sections of their own (scatter, scan, sort, ...): the type rule
# ((shape, dtype) per input, params) -> (shape, dtype), and the numpy reference
# (input arrays, params, (shape, dtype) of the result) -> array. The interpreter and the verifier
# read these tables.
TYPE_RULES: dict[Op, Callable[[Sequence[tuple[Shape, str]], dict[str, Any]],
                              tuple[Shape, str]]] = {}
NUMPY_RULES: dict[Op, Callable[[Sequence[np.ndarray], dict[str, Any], tuple[Shape, str]],
                               np.ndarray]] = {}


# --- scan: cumulative sums, products, maxima and minima along an axis (fusec.passes.scan) ---------
# ``cumulative`` is numpy's ufunc.accumulate along the axis. Its stages (``scan_reduce``, ``scan``)
# add floats in another order than numpy does; their references here follow the order the GPU
# kernels use (fusec.kernels.scan), operation for operation in the array's own dtype, so the
# interpreter of a lowered program gives the GPU's float32 results bit for bit.

SCAN_REDUCES = ("sum", "prod", "max", "min")
_SCAN_UFUNC = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def scan_identity(reduce: str, dtype: str) -> Any:
    """The value that leaves anything unchanged under ``reduce`` in ``dtype``."""
    if reduce == "max":
        return _max_identity(dtype)
    if reduce == "min":
        return _min_identity(dtype)
    return {"sum": 0, "prod": 1}[reduce]


def _scan_checked(in_types: Sequence[tuple[Shape, str]], params: dict[str, Any],
                  n_inputs: tuple[int, ...]) -> tuple[Shape, str, int]:
    """The operand's shape and dtype and the scanned axis, after checking the params."""
    from .errors import DTypeError

    if len(in_types) not in n_inputs:
        raise ShapeError(f"scan op takes {' or '.join(map(str, n_inputs))} operand(s); "
                         f"got {len(in_types)}")
    shape, dt = in_types[0]
    reduce, axis = params.get("reduce"), params.get("axis")
    if reduce not in SCAN_REDUCES:
        raise ValueError(f"scan reduce must be one of {SCAN_REDUCES}; got {reduce!r}")
    if dt == "bool" and reduce in ("sum", "prod"):
        raise DTypeError(f"a scan's {reduce} of bool is not defined: scan int32 (numpy's "
                         "cumsum does), or max/min for logical or/and")
    if not isinstance(axis, int) or not 0 <= axis < len(shape):
        raise ShapeError(f"scan axis {axis!r} is out of range for shape {shape}")
    return shape, dt, axis


def _scan_layout_checked(params: dict[str, Any]) -> int:
    """Positions per chunk; for the "tile" layout, check that chunks are whole tiles."""
    chunk = int(params["chunk"])
    if chunk < 1:
        raise ValueError(f"scan chunk must be positive; got {chunk}")
    if params["layout"] == "tile":
        threads, rounds = int(params["threads"]), int(params["rounds"])
        if threads < 1 or threads & (threads - 1) or rounds < 1 or chunk % (4 * threads * rounds):
            raise ValueError(f"a tile scan needs threads a power of two and chunks of whole tiles "
                             f"(4 x threads x rounds); got {params}")
    elif params["layout"] != "serial":
        raise ValueError(f"scan layout must be tile or serial; got {params['layout']!r}")
    return chunk


def _chunked_shape(shape: Shape, axis: int, chunk: int) -> Shape:
    return shape[:axis] + (-(-shape[axis] // chunk),) + shape[axis + 1:]


def _cumulative_type(in_types: Sequence[tuple[Shape, str]], params: dict[str, Any]
                     ) -> tuple[Shape, str]:
    shape, dt, _ = _scan_checked(in_types, params, (1,))
    return shape, dt


def _scan_reduce_type(in_types: Sequence[tuple[Shape, str]], params: dict[str, Any]
                      ) -> tuple[Shape, str]:
    shape, dt, axis = _scan_checked(in_types, params, (1,))
    return _chunked_shape(shape, axis, _scan_layout_checked(params)), dt


def _scan_type(in_types: Sequence[tuple[Shape, str]], params: dict[str, Any]
               ) -> tuple[Shape, str]:
    shape, dt, axis = _scan_checked(in_types, params, (1, 2))
    chunk = _scan_layout_checked(params)
    if len(in_types) == 2 and in_types[1] != (_chunked_shape(shape, axis, chunk), dt):
        raise ShapeError(f"scan carries must be {dt}{_chunked_shape(shape, axis, chunk)} for "
                         f"{dt}{shape} in chunks of {chunk}; got {in_types[1][1]}{in_types[1][0]}")
    return shape, dt


def _scan_rows(x: np.ndarray, axis: int, reverse: bool) -> np.ndarray:
    """x as rows (every other coordinate, in C order) of its positions along ``axis`` in scan
    order."""
    m = np.moveaxis(x, axis, -1)
    rows = m.reshape(math.prod(m.shape[:-1]), m.shape[-1])
    return rows[:, ::-1] if reverse else rows


def _scan_unrows(rows: np.ndarray, shape: Shape, axis: int, reverse: bool) -> np.ndarray:
    if reverse:
        rows = rows[:, ::-1]
    moved = shape[:axis] + shape[axis + 1:] + (shape[axis],)
    return np.ascontiguousarray(np.moveaxis(rows.reshape(moved), -1, axis))


def cumulative_numpy(x: np.ndarray, reduce: str, axis: int, reverse: bool = False) -> np.ndarray:
    """Reference of ``cumulative``: numpy's accumulate along ``axis`` in x's dtype (integers wrap
    around), from the end when ``reverse``."""
    rows = _scan_rows(x, axis, reverse)
    with np.errstate(all="ignore"):
        out = _SCAN_UFUNC[reduce].accumulate(rows, axis=-1) if rows.size else rows
    return _scan_unrows(np.asarray(out, dtype=x.dtype), x.shape, axis, reverse)


def _scan_chunks(x: np.ndarray, p: dict[str, Any]) -> tuple[np.ndarray, int, int]:
    """x's rows cut into chunks, padded with the identity: (rows, chunks, chunk), n, chunks."""
    rows = _scan_rows(x, int(p["axis"]), bool(p["reverse"]))
    n, chunk = rows.shape[1], int(p["chunk"])
    chunks = -(-n // chunk)
    padded = np.full((rows.shape[0], chunks * chunk), scan_identity(p["reduce"], x.dtype.name),
                     dtype=x.dtype)
    padded[:, :n] = rows
    return padded.reshape(rows.shape[0], chunks, chunk), n, chunks


def _tile_total(op: Any, lanes: np.ndarray) -> np.ndarray:
    """A thread's 4 lane values combined as (l0 op l1) op (l2 op l3)."""
    return op(op(lanes[..., 0], lanes[..., 1]), op(lanes[..., 2], lanes[..., 3]))


def scan_reduce_numpy(x: np.ndarray, p: dict[str, Any]) -> np.ndarray:
    """Reference of ``scan_reduce``. "serial": a thread folds its chunk from the identity, one
    position after another. "tile": ``threads`` threads share a chunk of rounds x threads x 4
    positions, position (k * threads + t) * 4 + lane going to thread t's accumulator ``lane``
    in round k; each thread's 4 accumulators combine as (0 op 1) op (2 op 3), then the threads'
    totals in a tree (thread t takes t + s's, s = threads / 2, ..., 1). Positions past the end
    of the row count as the identity."""
    op = _SCAN_UFUNC[p["reduce"]]
    xc, n, chunks = _scan_chunks(x, p)
    ident = scan_identity(p["reduce"], x.dtype.name)
    with np.errstate(all="ignore"):
        if p["layout"] == "serial":
            start = np.full(xc.shape[:2] + (1,), ident, dtype=x.dtype)
            acc = op.accumulate(np.concatenate([start, xc], axis=-1), axis=-1)
            last = np.minimum(int(p["chunk"]), n - np.arange(chunks) * int(p["chunk"]))
            red = np.take_along_axis(acc, np.broadcast_to(last[None, :, None],
                                                          acc.shape[:2] + (1,)), axis=-1)[..., 0]
        else:
            threads, rounds = int(p["threads"]), int(p["rounds"])
            parts = xc.reshape(xc.shape[:2] + (rounds, threads, 4))
            lanes = np.full(xc.shape[:2] + (threads, 4), ident, dtype=x.dtype)
            for k in range(rounds):
                lanes = op(lanes, parts[:, :, k])
            tot = _tile_total(op, lanes)
            s = threads // 2
            while s >= 1:
                tot[..., :s] = op(tot[..., :s], tot[..., s:2 * s])
                s //= 2
            red = tot[..., 0]
    shape = _chunked_shape(x.shape, int(p["axis"]), int(p["chunk"]))
    return _scan_unrows(np.asarray(red, dtype=x.dtype), shape, int(p["axis"]), False)


def scan_numpy(x: np.ndarray, carries: np.ndarray | None, p: dict[str, Any]) -> np.ndarray:
    """Reference of ``scan``: chunk g of each row starts from carries[g - 1] (the identity for
    g = 0 or without carries). "serial": a thread folds its chunk position after position.
    "tile": ``threads`` threads scan a chunk one tile (rounds x threads x 4 positions) after
    another, position (k * threads + t) * 4 + lane of a tile being thread t's lane ``lane`` in
    round k. A thread scans its 4 lanes (l0, l0 op l1, ...); the threads' last lanes are scanned
    across the threads in log2(threads) steps (Kogge-Stone: s[t] = s[t - d] op s[t] for t >= d,
    d = 1, 2, 4, ...), per round. With r the carry, for each round k: thread t's lanes become
    (r op s[t - 1]) op lane (the identity for s[-1]), then r = r op s[threads - 1]. The r after
    the last round carries into the next tile."""
    op = _SCAN_UFUNC[p["reduce"]]
    axis, reverse, chunk = int(p["axis"]), bool(p["reverse"]), int(p["chunk"])
    xc, n, chunks = _scan_chunks(x, p)
    ident = scan_identity(p["reduce"], x.dtype.name)
    carry = np.full(xc.shape[:2], ident, dtype=x.dtype)
    if carries is not None and chunks > 1:
        carry[:, 1:] = _scan_rows(carries, axis, False)[:, :-1]
    with np.errstate(all="ignore"):
        if p["layout"] == "serial":
            out = op.accumulate(np.concatenate([carry[..., None], xc], axis=-1), axis=-1)[..., 1:]
        else:
            threads, rounds = int(p["threads"]), int(p["rounds"])
            tile = 4 * threads * rounds
            parts = xc.reshape(xc.shape[:2] + (chunk // tile, rounds, threads, 4))
            out = np.empty_like(parts)
            for j in range(chunk // tile):
                lanes = op.accumulate(parts[:, :, j], axis=-1)
                s = lanes[..., 3].copy()  # (rows, chunks, rounds, threads)
                d = 1
                while d < threads:
                    s[..., d:] = op(s[..., :-d], s[..., d:])  # numpy reads before it writes
                    d *= 2
                before = np.full(s.shape, ident, dtype=x.dtype)
                before[..., 1:] = s[..., :-1]
                for k in range(rounds):
                    pre = op(carry[..., None], before[:, :, k])
                    out[:, :, j, k] = op(pre[..., None], lanes[:, :, k])
                    carry = op(carry, s[:, :, k, threads - 1])
    rows = np.asarray(out, dtype=x.dtype).reshape(xc.shape[0], chunks * chunk)[:, :n]
    return _scan_unrows(rows, x.shape, axis, reverse)


TYPE_RULES[Op.CUMULATIVE] = _cumulative_type
TYPE_RULES[Op.SCAN_REDUCE] = _scan_reduce_type
TYPE_RULES[Op.SCAN] = _scan_type
NUMPY_RULES[Op.CUMULATIVE] = lambda a, p, t: cumulative_numpy(
    a[0], p["reduce"], int(p["axis"]), bool(p.get("reverse", False)))
NUMPY_RULES[Op.SCAN_REDUCE] = lambda a, p, t: scan_reduce_numpy(a[0], p)
NUMPY_RULES[Op.SCAN] = lambda a, p, t: scan_numpy(a[0], a[1] if len(a) > 1 else None, p)


def slice_numpy(x: np.ndarray, starts: Sequence[int], steps: Sequence[int],
                shape: Shape) -> np.ndarray:
    """Reference of ``slice``."""
    idx = tuple(np.arange(n, dtype=np.int64) * st + s0 for s0, st, n in zip(starts, steps, shape))
    return x[np.ix_(*idx)] if idx else x


def gather_indices(index: np.ndarray, dim: int) -> np.ndarray:
    """A gather index as the GPU reads it: negative counts from the end, then clamped."""
    i = np.asarray(index).astype(np.int64)
    if np.asarray(index).dtype == np.uint32:
        return np.minimum(i, dim - 1)
    i = np.where(i < 0, i + dim, i)
    return np.clip(i, 0, dim - 1)


def gather_numpy(x: np.ndarray, indices: Sequence[np.ndarray], shape: Shape) -> np.ndarray:
    """Reference of ``gather``."""
    if math.prod(shape) == 0:
        return np.zeros(shape, dtype=x.dtype)
    idx = tuple(np.broadcast_to(gather_indices(i, d), shape) for i, d in zip(indices, x.shape))
    return x[idx] if idx else np.broadcast_to(x, shape)


def iota_numpy(shape: Shape, axis: int, dtype: str) -> np.ndarray:
    """Reference of ``iota``."""
    n = shape[axis]
    view = [1] * len(shape)
    view[axis] = n
    return np.broadcast_to(np.arange(n, dtype=np.int64).reshape(view), shape).astype(dtype)


def reduce_shape(shape: Shape, axes: tuple[int, ...]) -> Shape:
    return tuple(d for k, d in enumerate(shape) if k not in axes)


def matmul_shape(a: Shape, b: Shape) -> Shape:
    """a[..., M, K] @ b[..., K, N] with equal batch dims (trace inserts broadcasts)."""
    if len(a) < 2 or len(b) < 2 or a[:-2] != b[:-2] or a[-1] != b[-2]:
        raise ShapeError(f"matmul primitive needs [...,M,K] @ [...,K,N]; got {a} and {b}")
    return a[:-1] + (b[-1],)


def infer_type(op: Op, in_types: Sequence[tuple[Shape, str]], params: dict[str, Any]
               ) -> tuple[Shape, str]:
    """Result (shape, dtype) of a primitive: the one shape/dtype rule of the IR."""
    shapes = [s for s, _ in in_types]
    dts = [d for _, d in in_types]
    if op in ELEMENTWISE or op in (Op.CAST, Op.IPOW):
        return broadcast_shapes(*shapes), elementwise_dtype(op, dts, params)
    if op in REDUCTIONS:
        return reduce_shape(shapes[0], tuple(params["axes"])), dts[0]
    if op is Op.PARTIAL:
        return reduce_shape(shapes[0], tuple(params["axes"])) + (int(params["chunks"]),), dts[0]
    if op is Op.MATMUL:
        return matmul_shape(shapes[0], shapes[1]), dts[0]
    if op is Op.RESHAPE:
        new = tuple(params["shape"])
        if math.prod(new) != math.prod(shapes[0]):
            raise ShapeError(f"cannot reshape {shapes[0]} into {new}")
        return new, dts[0]
    if op is Op.TRANSPOSE:
        perm = tuple(params["perm"])
        if sorted(perm) != list(range(len(shapes[0]))):
            raise ShapeError(
                f"transpose axes {perm} are not a permutation of {len(shapes[0])} axes")
        return tuple(shapes[0][p] for p in perm), dts[0]
    if op is Op.BROADCAST:
        new = tuple(params["shape"])
        if broadcast_shapes(shapes[0], new) != new:
            raise ShapeError(f"cannot broadcast shape {shapes[0]} to {new}")
        return new, dts[0]
    if op is Op.PAD:
        widths = tuple(params["widths"])
        if len(widths) != len(shapes[0]) or any(lo < 0 or hi < 0 for lo, hi in widths):
            raise ShapeError(f"pad widths {widths} do not fit shape {shapes[0]}")
        return tuple(lo + d + hi for d, (lo, hi) in zip(shapes[0], widths)), dts[0]
    if op is Op.SLICE:
        return slice_shape(shapes[0], tuple(params["starts"]), tuple(params["steps"]),
                           tuple(params["shape"])), dts[0]
    if op is Op.IOTA:
        shape = tuple(params["shape"])
        if not 0 <= int(params["axis"]) < len(shape):
            raise ShapeError(f"iota axis {params['axis']} is out of range for shape {shape}")
        return shape, str(params["dtype"])
    if op is Op.GATHER:
        if len(shapes) != 1 + len(shapes[0]):
            raise ShapeError(f"gather of an array of {len(shapes[0])} axes needs as many index "
                             f"arrays; got {len(shapes) - 1}")
        if any(d not in ("int32", "uint32") for d in dts[1:]):
            raise ShapeError(f"gather indices must be int32 or uint32; got {dts[1:]}")
        if 0 in shapes[0] and 0 not in broadcast_shapes(*shapes[1:]):
            raise ShapeError(f"cannot gather from an empty array of shape {shapes[0]}")
        return broadcast_shapes(*shapes[1:]), dts[0]
    rule = TYPE_RULES.get(op)
    if rule is not None:
        return rule(in_types, params)
    raise ValueError(f"no type rule for {op}")
