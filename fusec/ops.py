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


# --- sort: argsort and sort, the stages they are lowered into, searchsorted -----------------------
# Sorting compares order keys: uint32 words whose unsigned order is the order numpy sorts values
# in. float32: positive values get the sign bit set, negative ones are inverted (so more negative
# is smaller); -0.0 takes the key of 0.0 (they compare equal, ties keep input order) and every NaN
# takes 0xFFFFFFFF (after +inf, in input order, as numpy and JAX sort them). int32: the sign bit
# flipped. uint32: itself. bool: 0 or 1. A descending order inverts every key.
#
# The stages carry (key, payload) pairs in a "state" uint32[2, rows, n]: plane 0 the keys, plane 1
# the payloads, which are the elements' positions in their row (argsort) or, with params
# values=True, the elements' own words (sort: every value keeps its bits, -0.0 and NaN payloads
# included). The last stage writes the payloads alone: int32 indices, or the values in the
# sorted array's dtype (param dtype).

SORT_RADIX_BITS = 8  # bits of the key each radix pass sorts by
SORT_DIGITS = 1 << SORT_RADIX_BITS


def sort_keys(x: np.ndarray, descending: bool = False) -> np.ndarray:
    """The uint32 order keys of ``x`` (see above)."""
    x = np.asarray(x)
    if x.dtype == np.bool_:
        k = x.astype(np.uint32)
    elif x.dtype == np.float32:
        b = x.view(np.uint32)
        mag = b & np.uint32(0x7FFFFFFF)
        k = np.where(b >> np.uint32(31) != 0, ~b, b | np.uint32(0x80000000))
        k = np.where(mag == 0, np.uint32(0x80000000), k)
        k = np.where(mag > np.uint32(0x7F800000), np.uint32(0xFFFFFFFF), k)
    elif x.dtype == np.int32:
        k = x.view(np.uint32) ^ np.uint32(0x80000000)
    else:
        k = x.astype(np.uint32)
    k = np.asarray(k, dtype=np.uint32)
    return ~k if descending else k


def sort_key_bits(dtype: str) -> int:
    """How many low bits of a key can differ between elements (bool: only the lowest)."""
    return 1 if dtype == "bool" else 32


def _words(x: np.ndarray) -> np.ndarray:
    """The uint32 words a GPU buffer holds for ``x`` (bool: 0 or 1)."""
    x = np.ascontiguousarray(x)
    return x.astype(np.uint32) if x.dtype == np.bool_ else x.view(np.uint32)


def _from_words(w: np.ndarray, dtype: str) -> np.ndarray:
    w = np.ascontiguousarray(w, dtype=np.uint32)
    return w != 0 if dtype == "bool" else w.view(np.dtype(dtype))


def _sorted_order(x: np.ndarray, p: dict[str, Any]) -> np.ndarray:
    return np.argsort(sort_keys(x, bool(p.get("descending", False))), axis=-1, kind="stable")


def _argsort_numpy(args: Sequence[np.ndarray], p: dict[str, Any],
                   out: tuple[Shape, str]) -> np.ndarray:
    return _sorted_order(args[0], p).astype(np.int32)


def _sort_numpy(args: Sequence[np.ndarray], p: dict[str, Any],
                out: tuple[Shape, str]) -> np.ndarray:
    return np.take_along_axis(args[0], _sorted_order(args[0], p), axis=-1)


def _sort_type(values: bool) -> Callable[[Sequence[tuple[Shape, str]], dict[str, Any]],
                                         tuple[Shape, str]]:
    def rule(ins: Sequence[tuple[Shape, str]], p: dict[str, Any]) -> tuple[Shape, str]:
        shape, dt = ins[0]
        if len(shape) < 1:
            raise ShapeError("sorts run along the last axis; a 0-d array has none")
        if 2 * math.prod(shape) >= 2**32:
            raise ShapeError(f"cannot sort {math.prod(shape)} elements (shape {shape}): the "
                             "sort's keys and indices must fit 2^32 words")
        return shape, (dt if values else "int32")

    return rule


def _state_shape(shape: Shape, dt: str) -> tuple[int, int]:
    if len(shape) != 3 or shape[0] != 2 or dt != "uint32":
        raise ShapeError(f"a sort stage reads the state uint32[2, rows, n]; got {dt}{shape}")
    return shape[1], shape[2]


def _rows_shape(shape: Shape, dt: str, p: dict[str, Any]) -> tuple[int, int]:
    """(rows, n) of a stage's source: x[rows, n] on the first stage, else the state."""
    if p.get("first", False):
        if len(shape) != 2:
            raise ShapeError(f"a first sort stage reads x[rows, n]; got shape {shape}")
        return shape[0], shape[1]
    return _state_shape(shape, dt)


def _final_type(rows: int, n: int, p: dict[str, Any]) -> tuple[Shape, str]:
    return (rows, n), (str(p["dtype"]) if p["values"] else "int32")


def _rows_of(src: np.ndarray, p: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(keys, payloads) of a stage's source: x itself (first stage) or the state."""
    if p.get("first", False):
        keys = sort_keys(src, bool(p["descending"]))
        if p.get("values", False):
            return keys, _words(src)
        return keys, np.broadcast_to(np.arange(src.shape[-1], dtype=np.uint32), src.shape)
    return src[0].astype(np.uint32), src[1].astype(np.uint32)


def _stage_out(keys: np.ndarray, pay: np.ndarray, p: dict[str, Any]) -> np.ndarray:
    """The state, or (last stage) the payloads as indices or values."""
    if p.get("last", False):
        return _from_words(pay, p["dtype"]) if p["values"] else pay.astype(np.int32)
    return np.stack([keys, pay]).astype(np.uint32)


def _blocks_of(n: int, block: int) -> int:
    return max(1, -(-n // block))


def _digits(keys: np.ndarray, shift: int) -> np.ndarray:
    return ((keys >> np.uint32(shift)) & np.uint32(SORT_DIGITS - 1)).astype(np.int64)


# radix_hist: uint32[rows, D, blocks]
def _radix_hist_type(ins: Sequence[tuple[Shape, str]], p: dict[str, Any]) -> tuple[Shape, str]:
    rows, n = _rows_shape(*ins[0], p)
    return (rows, SORT_DIGITS, _blocks_of(n, int(p["block"]))), "uint32"


def _radix_hist_numpy(args: Sequence[np.ndarray], p: dict[str, Any],
                      out: tuple[Shape, str]) -> np.ndarray:
    keys, _ = _rows_of(args[0], p)
    rows, n = keys.shape
    nb = out[0][2]
    group = (np.arange(n) // int(p["block"]))[None, :] * SORT_DIGITS + _digits(keys, p["shift"])
    flat = (group + np.arange(rows)[:, None] * (nb * SORT_DIGITS)).ravel()
    counts = np.bincount(flat, minlength=rows * nb * SORT_DIGITS).reshape(rows, nb, SORT_DIGITS)
    return counts.transpose(0, 2, 1).astype(np.uint32)


# radix_scan: uint32[rows, D, blocks + 1]
def _radix_scan_type(ins: Sequence[tuple[Shape, str]], p: dict[str, Any]) -> tuple[Shape, str]:
    shape, dt = ins[0]
    if len(shape) != 3 or shape[1] != SORT_DIGITS or dt != "uint32":
        raise ShapeError(f"radix_scan of a histogram uint32[rows, {SORT_DIGITS}, blocks]; got "
                         f"{dt}{shape}")
    return shape[:2] + (shape[2] + 1,), dt


def _radix_scan_numpy(args: Sequence[np.ndarray], p: dict[str, Any],
                      out: tuple[Shape, str]) -> np.ndarray:
    """Per (row, digit): exclusive prefix sums of the counts over the blocks, then the total."""
    h = args[0].astype(np.int64)
    c = np.cumsum(h, axis=2)
    return np.concatenate([c - h, c[:, :, -1:]], axis=2).astype(np.uint32)


def _radix_scatter_type(ins: Sequence[tuple[Shape, str]], p: dict[str, Any]
                        ) -> tuple[Shape, str]:
    rows, n = _rows_shape(*ins[0], p)
    want = (rows, SORT_DIGITS, _blocks_of(n, int(p["block"])) + 1)
    if tuple(ins[1]) != (want, "uint32"):
        raise ShapeError(f"radix_scatter's offsets must be uint32{want}; got {ins[1]}")
    return _final_type(rows, n, p) if p["last"] else ((2, rows, n), "uint32")


def _radix_scatter_numpy(args: Sequence[np.ndarray], p: dict[str, Any],
                         out: tuple[Shape, str]) -> np.ndarray:
    keys, pay = _rows_of(args[0], p)
    scanned = args[1].astype(np.int64)
    rows, n = keys.shape
    nb = scanned.shape[2] - 1
    # a digit's elements of block b go after the row's smaller digits and its earlier blocks
    totals = scanned[:, :, nb]
    offsets = scanned[:, :, :nb] + (np.cumsum(totals, axis=1) - totals)[:, :, None]
    digit = _digits(keys, p["shift"])
    blk = np.broadcast_to(np.arange(n) // int(p["block"]), (rows, n))
    # rank of each element among the earlier elements of its block with its digit
    group = blk * SORT_DIGITS + digit
    order = np.argsort(group, axis=-1, kind="stable")
    grouped = np.take_along_axis(group, order, axis=-1)
    size = nb * SORT_DIGITS
    counts = np.bincount((grouped + np.arange(rows)[:, None] * size).ravel(),
                         minlength=rows * size).reshape(rows, size)
    start = np.cumsum(counts, axis=1) - counts
    rank = np.empty((rows, n), dtype=np.int64)
    np.put_along_axis(rank, order, np.arange(n)[None, :] - np.take_along_axis(start, grouped, 1),
                      axis=-1)
    r = np.broadcast_to(np.arange(rows)[:, None], (rows, n))
    dst = offsets[r, digit, blk] + rank
    new_keys = np.zeros((rows, n), dtype=np.uint32)
    new_pay = np.zeros((rows, n), dtype=np.uint32)
    new_keys[r, dst] = keys
    new_pay[r, dst] = pay
    return _stage_out(new_keys, new_pay, p)


# sort_blocks: x[rows, n] -> state, each aligned block of ``block`` elements of a row sorted
def _sort_blocks_type(ins: Sequence[tuple[Shape, str]], p: dict[str, Any]) -> tuple[Shape, str]:
    rows, n = _rows_shape(*ins[0], {"first": True})
    return (2, rows, n), "uint32"


def _sort_blocks_numpy(args: Sequence[np.ndarray], p: dict[str, Any],
                       out: tuple[Shape, str]) -> np.ndarray:
    keys, pay = _rows_of(args[0], {**p, "first": True})
    blk = np.broadcast_to(np.arange(keys.shape[1]) // int(p["block"]), keys.shape)
    order = np.lexsort((keys, blk), axis=-1)
    return _stage_out(np.take_along_axis(keys, order, -1), np.take_along_axis(pay, order, -1),
                      {"last": False})


# sort_merge: state sorted in runs of ``run`` -> runs of 2 * run (or, last, the final payloads)
def _sort_merge_type(ins: Sequence[tuple[Shape, str]], p: dict[str, Any]) -> tuple[Shape, str]:
    rows, n = _state_shape(*ins[0])
    return _final_type(rows, n, p) if p["last"] else ((2, rows, n), "uint32")


def _sort_merge_numpy(args: Sequence[np.ndarray], p: dict[str, Any],
                      out: tuple[Shape, str]) -> np.ndarray:
    """Each element's place in its merged pair of runs: its place in its own run plus the count
    of the other run's elements before it (smaller keys; equal keys too for the right run), by
    binary search as the kernel does. Keys are made unique per (row, pair) by a prefix so that
    one search over all runs at once stays within the element's own pair."""
    keys, pay = args[0][0].astype(np.uint64), args[0][1]
    rows, n = keys.shape
    m = int(p["run"])
    pos = np.arange(n)
    q = pos // m
    pair = q // 2
    npairs = int(pair[-1]) + 1 if n else 1
    base = (np.arange(rows)[:, None] * npairs + pair[None, :]).astype(np.uint64) << np.uint64(32)
    comp = base | keys
    left = (q % 2 == 0)[None, :].repeat(rows, 0)
    lc, rc = comp[left], comp[~left]  # each sorted: runs in order, keys sorted within a run
    cb = base[left], base[~left]
    count = np.empty((rows, n), dtype=np.int64)
    count[left] = np.searchsorted(rc, comp[left], "left") - np.searchsorted(rc, cb[0], "left")
    count[~left] = np.searchsorted(lc, comp[~left], "right") - np.searchsorted(lc, cb[1], "left")
    dst = pair * 2 * m + (pos - q * m) + count
    r = np.broadcast_to(np.arange(rows)[:, None], (rows, n))
    new_keys = np.zeros((rows, n), dtype=np.uint32)
    new_pay = np.zeros((rows, n), dtype=np.uint32)
    new_keys[r, dst] = args[0][0]
    new_pay[r, dst] = pay
    return _stage_out(new_keys, new_pay, p)


def _searchsorted_type(ins: Sequence[tuple[Shape, str]], p: dict[str, Any]
                       ) -> tuple[Shape, str]:
    (a_shape, a_dt), (v_shape, v_dt) = ins
    if len(a_shape) != 1:
        raise ShapeError(f"searchsorted searches a 1-D array; got shape {a_shape}")
    if a_dt != v_dt:
        raise ShapeError(f"searchsorted compares equal dtypes; got {a_dt} and {v_dt}")
    if p.get("side") not in ("left", "right"):
        raise ShapeError(f"searchsorted side must be 'left' or 'right'; got {p.get('side')!r}")
    return v_shape, "int32"


def searchsorted_numpy(a: np.ndarray, v: np.ndarray, side: str) -> np.ndarray:
    """Reference of ``searchsorted``: the binary search the kernel runs, step for step (so an
    unsorted ``a`` gives the kernel's answer too), comparing order keys."""
    ka, kv = sort_keys(a), sort_keys(v)
    n = ka.shape[0]
    lo = np.zeros(kv.shape, dtype=np.int64)
    hi = np.full(kv.shape, n, dtype=np.int64)
    while True:
        active = lo < hi
        if not active.any():
            break
        mid = (lo + hi) // 2
        km = ka[np.minimum(mid, max(n - 1, 0))]
        right = (km < kv) if side == "left" else (km <= kv)
        lo = np.where(active & right, mid + 1, lo)
        hi = np.where(active & ~right, mid, hi)
    return lo.astype(np.int32)


TYPE_RULES.update({
    Op.ARGSORT: _sort_type(False),
    Op.SORT: _sort_type(True),
    Op.RADIX_HIST: _radix_hist_type,
    Op.RADIX_SCAN: _radix_scan_type,
    Op.RADIX_SCATTER: _radix_scatter_type,
    Op.SORT_BLOCKS: _sort_blocks_type,
    Op.SORT_MERGE: _sort_merge_type,
    Op.SEARCHSORTED: _searchsorted_type,
})
NUMPY_RULES.update({
    Op.ARGSORT: _argsort_numpy,
    Op.SORT: _sort_numpy,
    Op.RADIX_HIST: _radix_hist_numpy,
    Op.RADIX_SCAN: _radix_scan_numpy,
    Op.RADIX_SCATTER: _radix_scatter_numpy,
    Op.SORT_BLOCKS: _sort_blocks_numpy,
    Op.SORT_MERGE: _sort_merge_numpy,
    Op.SEARCHSORTED: lambda args, p, out: searchsorted_numpy(args[0], args[1], p["side"]),
})


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
