"""The fusec IR: a flat, single-assignment program in the style of a jaxpr.

A :class:`Program` has input variables, a list of equations and output atoms. Every equation applies
one :class:`Op` to atoms (variables or literals) and defines exactly one new variable. After fusion,
the top-level program holds ``kernel`` equations whose ``body`` parameter is itself a Program: one
equation per GPU kernel.

This module depends on nothing but the standard library: shapes are tuples of ints and dtypes are
the strings in :data:`DTYPES`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Union

DTYPES = ("float32", "float16", "int32", "uint32", "bool")
_FLOATS = ("float32", "float16")
Shape = tuple[int, ...]

# Bump when the meaning of printed IR changes, so that hashes of old programs never collide with
# new ones.
IR_VERSION = "1"


class Op(Enum):
    """Every primitive the IR knows. The facts about each live in :mod:`fusec.ops`."""

    # elementwise, unary
    NEG = "neg"
    ABS = "abs"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    TANH = "tanh"
    SIN = "sin"
    COS = "cos"
    ERF = "erf"
    CAST = "cast"  # params: dtype
    IPOW = "ipow"  # params: n (a Python int exponent)
    FLOOR = "floor"
    CEIL = "ceil"
    TRUNC = "trunc"
    ROUND = "round"  # half to even, as numpy
    SIGN = "sign"
    SIGNBIT = "signbit"
    LOG1P = "log1p"
    EXPM1 = "expm1"
    LOG2 = "log2"
    TAN = "tan"
    SINH = "sinh"
    COSH = "cosh"
    ASIN = "asin"
    ACOS = "acos"
    ATAN = "atan"
    ASINH = "asinh"
    ACOSH = "acosh"
    ATANH = "atanh"
    ISNAN = "isnan"
    ISINF = "isinf"
    ISFINITE = "isfinite"
    NOT = "not"  # logical not of bool, bitwise invert of integers
    COPY = "copy"  # identity: a value that must be a buffer of its own (scatter's operand)
    # identity whose derivative is zero (fusec.lax.stop_gradient); simplify removes it
    STOP_GRADIENT = "stop_gradient"
    # elementwise, binary
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    POW = "pow"
    MAX = "max"
    MIN = "min"
    GT = "gt"
    GE = "ge"
    LT = "lt"
    LE = "le"
    EQ = "eq"
    NE = "ne"
    REM = "rem"  # numpy's remainder (the divisor's sign)
    FMOD = "fmod"  # C's fmod (the dividend's sign)
    FLOORDIV = "floordiv"
    ATAN2 = "atan2"
    COPYSIGN = "copysign"
    AND = "and"  # logical for bool, bitwise for integers
    OR = "or"
    XOR = "xor"
    SHL = "shl"
    SHR = "shr"  # arithmetic for int32, logical for uint32
    # elementwise, ternary
    WHERE = "where"
    # reductions: params axes (sorted tuple), keepdims is expressed with a following reshape
    SUM = "sum"
    RMAX = "reduce_max"
    RMIN = "reduce_min"
    PROD = "reduce_prod"
    # first stage of a multi-stage reduction: params reduce (sum|reduce_max|reduce_min), axes,
    # chunks; out[..., g] reduces chunk g of the flattened reduced axes
    PARTIAL = "reduce_partial"
    # matmul: a[..., M, K] @ b[..., K, N] with equal batch dims
    MATMUL = "matmul"
    # movement
    RESHAPE = "reshape"  # params: shape
    TRANSPOSE = "transpose"  # params: perm
    BROADCAST = "broadcast"  # params: shape (numpy broadcasting of the input to it)
    # params: widths ((before, after) per axis), value (the constant around the input; 0 when
    # absent), as np.pad's constant mode
    PAD = "pad"
    # params: starts, steps (non-zero, may be negative), shape: out[o] = x[start + o * step]
    SLICE = "slice"
    # sources: params shape, axis, dtype: each element's coordinate along axis
    IOTA = "iota"
    # gather: inputs x, i_0 .. i_{ndim-1} (integer arrays broadcasting to the result's shape);
    # out[o] = x[i_0[o], ..., i_{n-1}[o]]; a negative index counts from the end, then every index
    # is clamped into its axis (JAX's default for gathers)
    GATHER = "gather"
    # --- kernels of their own kind (scatter, scan, sort: see KERNEL_KIND) ---
    # scatter: section owned by fusec.passes.scatter / fusec.kernels.scatter
    # inputs operand, updates, i_0 .. i_{ndim-1} (updates and the integer index arrays broadcast
    # to one shape S); params mode (set|add|multiply|min|max): out = operand, then for each p of
    # S, out[i_0[p], ..] (mode)= updates[p]; a negative index counts from the end, an index still
    # outside its axis drops the update (JAX's default for scatters). lower_scatter rewrites it
    # into the two stage ops below, kernels of kind "scatter".
    SCATTER = "scatter"
    # inputs updates, i_0 ..; params shape: zeros of that shape with the updates added at the
    # indices (bool: or-ed); its kernel's output is zero-filled before each call (zero_init).
    # Both stages list in buffer_inputs the inputs their kernel reads from memory: it computes
    # the others from their cones (see fusec.passes.fuse)
    SCATTER_ADD = "scatter_add"
    # inputs target, updates, i_0 ..; params mode (set|add|multiply|min|max): the target with the
    # updates combined in. Its kernel updates the target's buffer in place (writes_into): the
    # target must be a value of its own (a copy of the scatter's operand)
    SCATTER_INTO = "scatter_into"
    # scan: section owned by fusec.passes.scan / fusec.kernels.scan
    # the inclusive scan along one axis, as the user functions trace it: params reduce (sum |
    # prod | max | min), axis, reverse (scan from the end). lower_scan turns it into the stages:
    CUMULATIVE = "cumulative"
    # stage: each row (the positions along axis, in scan order) cut into chunks of params
    # "chunk" positions, each chunk reduced to one value: the result has the input's shape with
    # the axis's length replaced by the number of chunks. params reduce, axis, reverse, chunk,
    # layout ("tile" | "serial") and, for "tile", threads and rounds: the order of the reduction
    # (see ops.scan_reduce_numpy)
    SCAN_REDUCE = "scan_reduce"
    # stage: inputs x and optionally carries (the inclusive scan of x's chunk reductions): each
    # chunk of x scanned, starting from the carry of the chunks before it. params reduce, axis,
    # reverse, chunk, layout and, for "tile", threads and rounds (see ops.scan_numpy)
    SCAN = "scan"
    # attention: section owned by fusec.passes.attention / fusec.kernels.attention
    # inputs q[..., S, D], kt[..., D, T], v[..., T, E] and optionally a bias that broadcasts to
    # [..., S, T]; params scale (a float), bias (whether the 4th input is there): softmax(q @ kt
    # * scale + bias) @ v along T, without the S x T scores in memory. Only the rewrite pass
    # makes it, from that computation written out (matmul, scale, bias, softmax, matmul).
    ATTENTION = "attention"
    # A decode step's attention over many keys, in parts (flash-decoding): attention_parts takes
    # attention's inputs and params and a param parts P; the keys are cut into P runs of
    # ceil(T / P) (fusec.kernels.attention.key_parts) and its result [..., S, P, E + 2] holds, per
    # part, the weighted sum of the values relative to the part's maximum score (E values), that
    # maximum, and the sum of the weights. attention_combine: that result -> [..., S, E], the
    # parts rescaled to the row's maximum and divided by the row's sum (ops.attention_parts_numpy).
    ATTENTION_PARTS = "attention_parts"
    ATTENTION_COMBINE = "attention_combine"
    # quantized weights: section owned by fusec.quant / fusec.passes.quant / fusec.kernels.quant
    # A GGUF-style quantized matrix of shape (N, K) is held as u32 words, one row of K // 32
    # blocks of 32 values per matrix row: params fmt ("q4_1" | "q8_0"; words per block in
    # fusec.ops.QUANT_WORDS, the layout in fusec.quant's docstring) and shape (N, K).
    # dequant: words u32[N, K // 32 * words] -> f32[N, K], the dequantised matrix.
    DEQUANT = "dequant"
    # qmatmul: inputs x f32[..., K] and the words; params fmt, n, k: x @ dequant(words).T ->
    # f32[..., N] without the dequantised matrix in memory. Only fusec.passes.quant makes it,
    # from matmul(x, transpose(dequant(words))) with few rows of x.
    QMATMUL = "qmatmul"
    # sort: section owned by fusec.passes.sort / fusec.kernels.sort
    # argsort: params descending; x[..., n] -> int32[..., n], the stable order of x's last axis
    # (NaN after everything, -0.0 equal to 0.0; descending: the order of the inverted keys, ties
    # still in input order). sort: the same, giving the values (x's dtype, bits kept). Rows up to
    # fusec.kernels.sort.LOCAL_MAX are sorted by one kernel; longer ones are lowered into stages
    # over a state uint32[2, R, n] of (order key, payload) pairs (fusec.ops explains both). Params
    # of the stages: first (reads x[R, n] and computes the keys), last (writes the payloads alone,
    # as int32 indices or, with values, as dtype), descending, values, dtype.
    ARGSORT = "argsort"
    SORT = "sort"
    # GPUs: least-significant-digit radix passes over 8-bit digits (D = 256). radix_hist (params
    # shift, block): per row and block of ``block`` elements, how many keys have each digit
    # (key >> shift) & 255 -> uint32[R, D, blocks]
    RADIX_HIST = "radix_hist"
    # per (row, digit): exclusive prefix sums of the counts over the blocks, then their total:
    # uint32[R, D, blocks + 1]
    RADIX_SCAN = "radix_scan"
    # params shift, block: inputs (x or state, scanned histogram); each element moves to its
    # digit's offset (the row's smaller digits, then the digit's earlier blocks) plus its rank
    # among the block's equal digits: the stable counting sort by that digit
    RADIX_SCATTER = "radix_scatter"
    # software adapters: x[R, n] -> state, each aligned block of ``block`` elements of a row sorted
    SORT_BLOCKS = "sort_blocks"
    # params run: the state sorted in runs of ``run`` -> in runs of 2 * run, each element moved to
    # its place in its own run plus the count of the other run's elements before it
    SORT_MERGE = "sort_merge"
    # GPUs, a float sort of keys alone: params block, descending: inputs (sorted values, x) ->
    # uint32[R, 2, blocks], per block of x its zeros and its NaNs (all zero where the sorted row
    # holds none: no need to count)
    SORT_SPECIALS = "sort_specials"
    # inputs (sorted values, x, their counts): the runs of the zeros' key and the NaNs' key in the
    # sorted values receive x's zeros and NaNs in input order (their own bits), in place
    SORT_FIXUP = "sort_fixup"
    # params side ("left" | "right"): inputs sorted a[n], queries v[...] -> int32[...]: the
    # binary search of each query in a, comparing order keys as argsort does
    SEARCHSORTED = "searchsorted"
    # inputs y, x_0 ..: y (the result of a function with a custom derivative, fusec.custom_vjp),
    # made to depend on that function's arguments x_i for autodiff, whose rule calls the user's
    # backward function; params: rule (a key of fusec.autodiff's registry). simplify removes it
    CUSTOM_VJP = "custom_vjp"
    # a fused kernel
    KERNEL = "kernel"  # params: body (Program), name, kind
    # a compiled loop (section owned by fusec.control_flow / fusec.passes.loops): inputs are the
    # initial carries (params carries = n of them), then loop-invariant values; results are the
    # final carries. params body (a Program: carries then invariants in, new carries out), trips
    # (the static trip count; None for a while loop, which runs until its flag carry, params
    # flag, is false; its body leaves the carries unchanged once the flag is false), inplace
    # ((j, k) pairs: carry k is updated in place in input j's buffer, see passes/loops.py) and,
    # optionally, write_once (in-place carries whose rows each iteration writes once, from a
    # constant start: scan's ys; fusec.control_flow_ad relies on it)
    LOOP = "loop"


UNARY = frozenset({Op.NEG, Op.ABS, Op.EXP, Op.LOG, Op.SQRT, Op.RSQRT, Op.TANH, Op.SIN, Op.COS,
                   Op.ERF, Op.CAST, Op.IPOW, Op.FLOOR, Op.CEIL, Op.TRUNC, Op.ROUND, Op.SIGN,
                   Op.SIGNBIT, Op.LOG1P, Op.EXPM1, Op.LOG2, Op.TAN, Op.SINH, Op.COSH, Op.ASIN,
                   Op.ACOS, Op.ATAN, Op.ASINH, Op.ACOSH, Op.ATANH, Op.ISNAN, Op.ISINF,
                   Op.ISFINITE, Op.NOT, Op.COPY, Op.STOP_GRADIENT})
BINARY = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.POW, Op.MAX, Op.MIN, Op.GT, Op.GE, Op.LT,
                    Op.LE, Op.EQ, Op.NE, Op.REM, Op.FMOD, Op.FLOORDIV, Op.ATAN2, Op.COPYSIGN,
                    Op.AND, Op.OR, Op.XOR, Op.SHL, Op.SHR})
COMPARISON = frozenset({Op.GT, Op.GE, Op.LT, Op.LE, Op.EQ, Op.NE})
ELEMENTWISE = UNARY | BINARY | {Op.WHERE}
# results of a bool dtype whatever the operands'
PREDICATE = COMPARISON | {Op.ISNAN, Op.ISINF, Op.ISFINITE, Op.SIGNBIT}
REDUCE = frozenset({Op.SUM, Op.RMAX, Op.RMIN, Op.PROD})
MOVEMENT = frozenset({Op.RESHAPE, Op.TRANSPOSE, Op.BROADCAST, Op.PAD, Op.SLICE})
# computed inside any kernel like elementwise ops, but read their operand (gather) or nothing
# (iota) at other indices than the result's
SOURCE = frozenset({Op.IOTA})
INDEXING = frozenset({Op.GATHER})
# Ops that are whole kernels of another kind than elementwise/reduce/matmul: the fusion pass gives
# each its own kernel of this kind (codegen: fusec.kernels.<kind>). Filled in by the sections above.
KERNEL_KIND: dict[Op, str] = {}
KERNEL_KIND[Op.SCAN_REDUCE] = "scan"
KERNEL_KIND[Op.SCAN] = "scan"
KERNEL_KIND[Op.ATTENTION] = "attention"
KERNEL_KIND[Op.ATTENTION_PARTS] = "attention"
KERNEL_KIND[Op.ATTENTION_COMBINE] = "attention"
KERNEL_KIND[Op.DEQUANT] = "quant"
KERNEL_KIND[Op.QMATMUL] = "quant"
# scatter's stages (the primitive itself is lowered before fusion)
KERNEL_KIND[Op.SCATTER_ADD] = "scatter"
KERNEL_KIND[Op.SCATTER_INTO] = "scatter"
KERNEL_KIND.update({op: "sort" for op in (Op.ARGSORT, Op.SORT, Op.RADIX_HIST, Op.RADIX_SCAN,
                                          Op.RADIX_SCATTER, Op.SORT_BLOCKS, Op.SORT_MERGE,
                                          Op.SORT_SPECIALS, Op.SORT_FIXUP,
                                          Op.SEARCHSORTED)})


def size_of(shape: Shape) -> int:
    return math.prod(shape)


def reduced_ends(ndim: int, axes: tuple[int, ...]) -> tuple[bool, bool]:
    """(leading, trailing): are a reduction's sorted ``axes`` the first ones of an array of
    ``ndim`` axes (columns, as in ``x.sum(axis=0)``), the last ones (rows), or both?"""
    k = len(axes)
    return axes == tuple(range(k)), axes == tuple(range(ndim - k, ndim))


def itemsize(dtype: str) -> int:
    """Bytes per element as stored on the GPU (bool is stored as a 32-bit word, float16 in 2)."""
    return 2 if dtype == "float16" else 4


def buffer_bytes(size: int, dtype: str) -> int:
    """Bytes of the buffer holding ``size`` elements of ``dtype``: rounded up to whole 32-bit
    words, since WebGPU binds and copies buffers in multiples of 4 bytes (an odd number of
    float16 elements gets 2 bytes of padding)."""
    return -(-size * itemsize(dtype) // 4) * 4


@dataclass(eq=False)
class Var:
    """A value defined once. Identity is by object; printing gives it a canonical name."""

    shape: Shape
    dtype: str

    @property
    def size(self) -> int:
        return size_of(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the value's buffer (whole 32-bit words: see :func:`buffer_bytes`)."""
        return buffer_bytes(self.size, self.dtype)

    def __repr__(self) -> str:
        return f"Var({type_str(self.shape, self.dtype)})"


@dataclass(frozen=True)
class Lit:
    """A scalar constant used directly as an operand (Python scalars and literals in user code)."""

    value: Union[float, int, bool]
    dtype: str

    @property
    def shape(self) -> Shape:
        return ()


Atom = Union[Var, Lit]


@dataclass(eq=False)
class Eqn:
    """``outs = op[params](inputs)``. Primitives define one output; fused kernels may define
    several."""

    op: Op
    inputs: tuple[Atom, ...]
    outs: tuple[Var, ...]
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def out(self) -> Var:
        assert len(self.outs) == 1, f"{self.op.value} has {len(self.outs)} outputs"
        return self.outs[0]


@dataclass(eq=False)
class Program:
    inputs: list[Var]
    eqns: list[Eqn]
    outputs: list[Atom]

    def __str__(self) -> str:
        return format_program(self)

    def hash(self) -> str:
        """Structural hash: equal for equal programs, stable across processes and machines."""
        return structural_hash(self)

    def vars(self) -> Iterator[Var]:
        yield from self.inputs
        for e in self.eqns:
            yield from e.outs


def kernel_eqns(prog: Program) -> Iterator[Eqn]:
    """The ``kernel`` equations of a lowered program in the order codegen and the runtime agree
    on: the program's own in order, a loop's body's where the loop stands (depth first)."""
    for e in prog.eqns:
        if e.op is Op.KERNEL:
            yield e
        elif e.op is Op.LOOP:
            yield from kernel_eqns(e.params["body"])


# --- printing -------------------------------------------------------------------------------------

_DT_SHORT = {"float32": "f32", "float16": "f16", "int32": "i32", "uint32": "u32", "bool": "bool"}


def type_str(shape: Shape, dtype: str) -> str:
    return f"{_DT_SHORT.get(dtype, dtype)}[{','.join(str(d) for d in shape)}]"


def lit_str(lit: Lit) -> str:
    v = lit.value
    if lit.dtype == "bool":
        text = "True" if v else "False"
    elif lit.dtype in _FLOATS:
        text = repr(float(v))
    else:
        text = str(int(v))
    return f"{text}:{_DT_SHORT[lit.dtype]}"


def _name(i: int) -> str:
    """a, b, ..., z, ba, bb, ... (like jaxprs): short, stable names in order of definition."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    s = letters[i % 26]
    i //= 26
    while i:
        s = letters[i % 26] + s
        i //= 26
    return s


def _tuple_str(value: tuple[Any, ...]) -> str:
    items = [_tuple_str(v) if isinstance(v, tuple) else str(v) for v in value]
    return f"({','.join(items)}{',' if len(value) == 1 else ''})"


def _param_str(key: str, value: Any) -> str:
    if isinstance(value, tuple):
        return f"{key}={_tuple_str(value)}"
    if isinstance(value, float):
        return f"{key}={value!r}"
    return f"{key}={value}"


def format_program(prog: Program, indent: str = "", names: dict[int, str] | None = None) -> str:
    names = {} if names is None else names
    counter = [len(names)]

    def define(v: Var) -> str:
        n = _name(counter[0])
        counter[0] += 1
        names[id(v)] = n
        return n

    def use(a: Atom) -> str:
        if isinstance(a, Lit):
            return lit_str(a)
        return names.get(id(a), "?")

    ins = " ".join(f"{define(v)}:{type_str(v.shape, v.dtype)}" for v in prog.inputs)
    lines = [f"{indent}{{ lambda {ins} ."]
    for e in prog.eqns:
        params = {k: v for k, v in e.params.items() if k != "body"}
        ptxt = "".join(f" {_param_str(k, params[k])}" for k in sorted(params))
        args = " ".join(use(a) for a in e.inputs)
        out = " ".join(f"{define(o)}:{type_str(o.shape, o.dtype)}" for o in e.outs)
        lines.append(f"{indent}    {out} = {e.op.value}{ptxt} {args}".rstrip())
        if "body" in e.params:
            lines.append(format_program(e.params["body"], indent + "        "))
    lines.append(f"{indent}  in ({', '.join(use(a) for a in prog.outputs)}) }}")
    return "\n".join(lines)


def structural_hash(prog: Program) -> str:
    text = f"fusec-ir-{IR_VERSION}\n{format_program(prog)}"
    return hashlib.sha256(text.encode()).hexdigest()


# --- serialisation (the persistent cache stores lowered programs) ---------------------------------


def to_json(prog: Program) -> dict[str, Any]:
    """A JSON-able description of ``prog`` (kernel bodies too); :func:`from_json` inverts it."""
    ids: dict[int, int] = {}

    def var(v: Var) -> int:
        if id(v) not in ids:
            ids[id(v)] = len(ids)
        return ids[id(v)]

    def atom(a: Atom) -> Any:
        if isinstance(a, Lit):
            return {"lit": a.value if a.dtype not in _FLOATS else repr(float(a.value)),
                    "dtype": a.dtype}
        return var(a)

    def param(v: Any) -> Any:
        if isinstance(v, Program):
            return {"program": to_json(v)}
        if isinstance(v, tuple):
            return {"tuple": [param(x) for x in v]}
        return v

    inputs = [[var(v), list(v.shape), v.dtype] for v in prog.inputs]
    eqns = []
    for e in prog.eqns:
        ins = [atom(a) for a in e.inputs]
        outs = [[var(o), list(o.shape), o.dtype] for o in e.outs]
        eqns.append({"op": e.op.value, "in": ins, "out": outs,
                     "params": {k: param(v) for k, v in sorted(e.params.items())}})
    return {"inputs": inputs, "eqns": eqns, "outputs": [atom(a) for a in prog.outputs]}


def from_json(data: dict[str, Any]) -> Program:
    vars_: dict[int, Var] = {}

    def define(spec: list[Any]) -> Var:
        v = Var(tuple(spec[1]), spec[2])
        vars_[spec[0]] = v
        return v

    def atom(a: Any) -> Atom:
        if isinstance(a, dict):
            value = float(a["lit"]) if a["dtype"] in _FLOATS else a["lit"]
            return Lit(value, a["dtype"])
        return vars_[a]

    def param(v: Any) -> Any:
        if isinstance(v, dict) and "program" in v:
            return from_json(v["program"])
        if isinstance(v, dict) and "tuple" in v:
            return tuple(param(x) for x in v["tuple"])
        return v

    inputs = [define(s) for s in data["inputs"]]
    eqns = []
    for e in data["eqns"]:
        ins = tuple(atom(a) for a in e["in"])
        outs = tuple(define(s) for s in e["out"])
        eqns.append(Eqn(Op(e["op"]), ins, outs, {k: param(v) for k, v in e["params"].items()}))
    return Program(inputs, eqns, [atom(a) for a in data["outputs"]])


def kernel_cost(e: Eqn) -> tuple[int, int]:
    """(flops, bytes) of one ``kernel`` equation: the bytes of its operands and results, and the
    arithmetic of its body (a product's 2 x M x N x K, attention's two products, one operation
    per element of every other compute equation; movement costs nothing)."""
    nbytes = sum(a.nbytes for a in e.inputs if isinstance(a, Var))
    nbytes += sum(o.nbytes for o in e.outs)
    flops = 0
    for be in e.params["body"].eqns:
        if be.op is Op.MATMUL:
            a = be.inputs[0]
            flops += 2 * math.prod(be.out.shape) * a.shape[-1]
        elif be.op in (Op.ATTENTION, Op.ATTENTION_PARTS):
            q, kt, v = be.inputs[:3]
            flops += 2 * math.prod(q.shape[:-1]) * kt.shape[-1] * (q.shape[-1] + v.shape[-1])
        elif be.op is Op.QMATMUL:
            flops += 2 * math.prod(be.out.shape) * int(be.params["k"])
        elif be.op in REDUCE:
            flops += be.inputs[0].size if isinstance(be.inputs[0], Var) else 1
        elif be.op not in MOVEMENT:
            flops += be.out.size
    return flops, nbytes
