"""Kernel IR -> WGSL. Per-op expressions come from :mod:`fusec.ops`; the kernel skeletons are jinja2
templates in the top-level ``templates/`` folder (shipped in the wheel as ``fusec/templates``).

A kernel body is evaluated by :class:`Emitter`: it asks for "value v at index I" and emits one
``let`` per (value, index) pair, memoised, so a value used twice at the same index is computed once.
Movement ops never move data: broadcast, transpose and reshape only rewrite the index, and a load
whose index is the kernel's own flat index uses it directly, with no index arithmetic.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import jinja2

from .dtypes import WGSL_STORAGE, WGSL_TYPE
from .ir import ELEMENTWISE, MOVEMENT, REDUCE, Atom, Eqn, Lit, Op, Program, Shape, Var
from .ops import ELEMENTWISE as EW_TABLE
from .ops import HELPERS, REDUCTIONS, cast_wgsl, ipow_wgsl, wgsl_literal

WORKGROUP = 256  # threads per workgroup for elementwise and reduction kernels
TILE = 16  # matmul tile edge
MAX_GROUPS = 65535  # workgroups per grid dimension (WebGPU limit)


def _template_dir() -> Path:
    here = Path(__file__).resolve().parent
    shipped = here / "templates"  # inside an installed wheel
    return shipped if shipped.is_dir() else here.parent / "templates"


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_template_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def strides(shape: Shape) -> list[int]:
    out = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        out[k] = out[k + 1] * shape[k + 1]
    return out


@dataclass(frozen=True)
class Idx:
    """An index into an array of ``shape``: a flat (row-major) offset, per-axis coordinates, or both.
    Each is a WGSL u32 expression."""

    shape: Shape
    flat: Optional[str] = None
    coords: Optional[tuple[str, ...]] = None

    def key(self) -> tuple[Any, ...]:
        return (self.shape, self.flat, self.coords)


class Emitter:
    """Emits WGSL statements computing body values at given indices."""

    def __init__(self, body: Program, buffers: dict[int, str], indent: str = "    ") -> None:
        self.producer = {id(o): e for e in body.eqns for o in e.outs}
        self.buffers = buffers  # id(var) -> binding name, for values read from memory
        self.lines: list[str] = []
        self.memo: dict[tuple[Any, ...], str] = {}
        self.n = 0
        self.indent = indent

    def fresh(self, prefix: str = "v") -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def let(self, expr: str, prefix: str = "v") -> str:
        key = ("let", expr)
        if key in self.memo:
            return self.memo[key]
        name = self.fresh(prefix)
        self.lines.append(f"{self.indent}let {name} = {expr};")
        self.memo[key] = name
        return name

    # -- indices --
    def flat(self, idx: Idx) -> str:
        if idx.flat is not None:
            return idx.flat
        assert idx.coords is not None
        terms = [f"{c} * {s}u" if s != 1 else c for c, s, d in
                 zip(idx.coords, strides(idx.shape), idx.shape) if d != 1]
        return self.let(" + ".join(terms) if terms else "0u", "i")

    def coords(self, idx: Idx) -> tuple[str, ...]:
        if idx.coords is not None:
            return idx.coords
        assert idx.flat is not None
        out = []
        st = strides(idx.shape)
        for k, (d, s) in enumerate(zip(idx.shape, st)):
            if d == 1:
                out.append("0u")
                continue
            q = idx.flat if s == 1 else f"{idx.flat} / {s}u"
            out.append(self.let(q if k == 0 else f"({q}) % {d}u", "c"))
        return tuple(out)

    def unbroadcast(self, idx: Idx, shape: Shape) -> Idx:
        """The index into an operand of ``shape`` that broadcasts to ``idx.shape``."""
        if shape == idx.shape:
            return idx
        if math.prod(shape) == 1:
            return Idx(shape, flat="0u")
        lead = len(idx.shape) - len(shape)
        if idx.flat is not None and 1 not in shape and idx.shape[lead:] == shape:
            return Idx(shape, flat=self.let(f"{idx.flat} % {math.prod(shape)}u", "i"))
        cs = self.coords(idx)[lead:]
        return Idx(shape, coords=tuple("0u" if d == 1 else c for c, d in zip(cs, shape)))

    # -- values --
    def value(self, a: Atom, idx: Idx) -> str:
        if isinstance(a, Lit):
            return wgsl_literal(a.value, a.dtype)
        key = (id(a), idx.key())
        if key in self.memo:
            return self.memo[key]
        if id(a) in self.buffers:
            expr = self.load(a, idx)
        else:
            expr = self.compute(self.producer[id(a)], idx)
        name = expr if expr.isidentifier() else self.let(expr)
        self.memo[key] = name
        return name

    def load(self, v: Var, idx: Idx) -> str:
        buf = self.buffers[id(v)]
        at = "0u" if v.size == 1 else self.flat(idx)
        raw = f"{buf}[{at}]"
        return f"({raw} != 0u)" if v.dtype == "bool" else raw

    def compute(self, e: Eqn, idx: Idx) -> str:
        op = e.op
        if op in MOVEMENT:
            src = e.inputs[0]
            if op is Op.RESHAPE:
                return self.value(src, Idx(src.shape, flat=self.flat(idx)))
            if op is Op.TRANSPOSE:
                perm = e.params["perm"]
                cs = self.coords(idx)
                inv = [""] * len(perm)
                for k, p in enumerate(perm):
                    inv[p] = cs[k]
                return self.value(src, Idx(src.shape, coords=tuple(inv)))
            return self.value(src, self.unbroadcast(idx, src.shape))
        if op in ELEMENTWISE or op in (Op.CAST, Op.IPOW):
            args = [self.value(a, self.unbroadcast(idx, a.shape)) for a in e.inputs]
            dt = e.inputs[0].dtype if op is not Op.WHERE else e.inputs[1].dtype
            if op is Op.CAST:
                return cast_wgsl(args[0], dt, e.params["dtype"])
            if op is Op.IPOW:
                return ipow_wgsl(args[0], int(e.params["n"]), dt)
            return EW_TABLE[op].wgsl(args, dt)
        raise AssertionError(f"{op} cannot be computed inline")


def store_expr(expr: str, dtype: str) -> str:
    return f"select(0u, 1u, {expr})" if dtype == "bool" else expr


@dataclass
class KernelCode:
    """A kernel ready to compile: WGSL, grid, and which buffers bind where."""

    name: str
    kind: str
    wgsl: str
    grid: tuple[int, int, int]
    n_inputs: int
    n_outputs: int
    key: str  # pipeline cache key: hash of the kernel IR and launch configuration

    def __str__(self) -> str:
        return f"// kernel {self.name} ({self.kind}), grid {self.grid}\n{self.wgsl}"


def grid_for(groups: int) -> tuple[int, int, int]:
    """Spread ``groups`` workgroups over x and y so neither exceeds 65535."""
    if groups <= 0:
        return (0, 1, 1)
    x = min(groups, MAX_GROUPS)
    return (x, -(-groups // x), 1)


def _bindings(body: Program) -> tuple[list[dict[str, str]], dict[int, str]]:
    binds: list[dict[str, str]] = []
    names: dict[int, str] = {}
    for i, v in enumerate(body.inputs):
        names[id(v)] = f"in{i}"
        binds.append({"name": f"in{i}", "access": "read", "type": WGSL_STORAGE[v.dtype]})
    for j, o in enumerate(body.outputs):
        assert isinstance(o, Var)
        binds.append({"name": f"out{j}", "access": "read_write", "type": WGSL_STORAGE[o.dtype]})
    return binds, names


def _helpers(code: str) -> str:
    return "".join(text for name, text in HELPERS.items() if f"{name}(" in code)


def generate(kernel: Eqn) -> KernelCode:
    """WGSL for one ``kernel`` equation produced by the fusion pass."""
    body: Program = kernel.params["body"]
    kind = kernel.params["kind"]
    name = kernel.params["name"]
    binds, names = _bindings(body)
    if kind == "elementwise":
        wgsl, groups = _elementwise(body, names)
    elif kind == "reduce":
        wgsl, groups = _reduce(body, names)
    else:
        wgsl, groups = _matmul(body, names)
    header = _env().get_template("bindings.wgsl.j2").render(bindings=binds)
    full = header + _helpers(wgsl) + wgsl
    return KernelCode(name, kind, full, grid_for(groups), len(body.inputs), len(body.outputs),
                      key=body.hash() + f":{kind}:{groups}")


def _elementwise(body: Program, names: dict[int, str]) -> tuple[str, int]:
    outs = [o for o in body.outputs if isinstance(o, Var)]
    shape = outs[0].shape
    n = math.prod(shape)
    em = Emitter(body, names, indent="    ")
    idx = Idx(shape, flat="gid")
    stores = []
    for j, o in enumerate(outs):
        stores.append(f"    out{j}[gid] = {store_expr(em.value(o, idx), o.dtype)};")
    src = _env().get_template("elementwise.wgsl.j2").render(
        wg=WORKGROUP, n=n, body="\n".join(em.lines), stores="\n".join(stores))
    return src, -(-n // WORKGROUP)


def reduce_strategy(n_out: int, r: int, last_axis_reduced: bool) -> str:
    """'workgroup' (a workgroup per output, tree reduction in shared memory) or 'thread' (a thread
    per output, sequential loop). Threads win when outputs are many and rows short or strided."""
    if n_out < 2048 or (last_axis_reduced and r >= 64):
        return "workgroup"
    return "thread"


def _reduce(body: Program, names: dict[int, str]) -> tuple[str, int]:
    red = body.eqns[-1]
    assert red.op in REDUCE
    src = red.inputs[0]
    assert isinstance(src, Var)
    shape, axes = src.shape, tuple(red.params["axes"])
    kept = [k for k in range(len(shape)) if k not in axes]
    n_out = math.prod(shape[k] for k in kept)
    r = math.prod(shape[k] for k in axes)
    dt = red.out.dtype
    info = REDUCTIONS[red.op]
    strategy = reduce_strategy(n_out, r, bool(axes) and axes[-1] == len(shape) - 1)
    em = Emitter(body, names, indent="        ")
    if axes == tuple(range(len(shape) - len(axes), len(shape))):
        idx = Idx(shape, flat=em.let(f"o * {r}u + r", "i") if n_out > 1 else "r")
    elif axes == tuple(range(len(axes))):
        idx = Idx(shape, flat=em.let(f"r * {n_out}u + o", "i") if n_out > 1 else "r")
    else:
        oc = em.coords(Idx(tuple(shape[k] for k in kept), flat="o"))
        rc = em.coords(Idx(tuple(shape[k] for k in axes), flat="r"))
        coords = [""] * len(shape)
        for k, c in zip(kept, oc):
            coords[k] = c
        for k, c in zip(axes, rc):
            coords[k] = c
        idx = Idx(shape, coords=tuple(coords))
    val = em.value(src, idx)
    src_code = _env().get_template("reduce.wgsl.j2").render(
        strategy=strategy, wg=WORKGROUP, n_out=n_out, r=r, ty=WGSL_TYPE[dt],
        identity=wgsl_literal(info.identity(dt), dt), body="\n".join(em.lines), value=val,
        combine_acc=info.combine("acc", val), combine_shared=info.combine("sdata[lid]",
                                                                          "sdata[lid + s]"),
        store=store_expr("acc" if strategy == "thread" else "sdata[0]", dt))
    groups = n_out if strategy == "workgroup" else -(-n_out // WORKGROUP)
    return src_code, groups


def _matmul(body: Program, names: dict[int, str]) -> tuple[str, int]:
    mm = body.eqns[-1]
    assert mm.op is Op.MATMUL
    a, b = mm.inputs
    assert isinstance(a, Var) and isinstance(b, Var)
    *batch, m, k = a.shape
    n = b.shape[-1]
    nb = math.prod(batch)
    tn, tm = -(-n // TILE), -(-m // TILE)
    ea = Emitter(body, names, indent="            ")
    eb = Emitter(body, names, indent="            ")
    batch_coords_a = tuple(ea.coords(Idx(tuple(batch), flat="bt"))) if batch else ()
    batch_coords_b = tuple(eb.coords(Idx(tuple(batch), flat="bt"))) if batch else ()
    va = ea.value(a, Idx(a.shape, coords=batch_coords_a + ("row", "ka")))
    vb = eb.value(b, Idx(b.shape, coords=batch_coords_b + ("kb", "col")))
    dt = mm.out.dtype
    src = _env().get_template("matmul.wgsl.j2").render(
        tile=TILE, m=m, n=n, k=k, tn=tn, tm=tm, total=tn * tm * nb, ty=WGSL_TYPE[dt],
        zero=wgsl_literal(0, dt), load_a="\n".join(ea.lines), val_a=va,
        load_b="\n".join(eb.lines), val_b=vb)
    return src, tn * tm * nb
