"""What every kind of kernel's code generation shares: the index and value emitter, bindings,
helper functions, templates, the kernel record and grid sizes.

A kernel body is evaluated by :class:`Emitter`: it asks for "value v at index I" and emits one
``let`` per (value, index) pair, memoised, so a value used twice at the same index is computed once.
Movement ops never move data: broadcast, transpose, reshape and slice only rewrite the index, and a
load whose index is the kernel's own flat index uses it directly, with no index arithmetic.

:mod:`fusec.codegen` (elementwise, reduction and matmul kernels) and the kernel kinds of
:mod:`fusec.kernels` (scatter, scan, sort) build on this module.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import jinja2

from .dtypes import WGSL_STORAGE, WGSL_TYPE, compute_dtype
from .errors import DeviceLimitError
from .ir import ELEMENTWISE, MOVEMENT, Atom, Eqn, Lit, Op, Program, Shape, Var
from .ops import ELEMENTWISE as EW_TABLE
from .ops import HELPERS, cast_wgsl, ipow_wgsl, wgsl_literal

WORKGROUP = 256  # threads per workgroup for elementwise and reduction kernels
# Software adapters (Mesa's llvmpipe, under lavapipe) end a shader invocation's loops after 65535
# iterations in all, every loop of the shader counting towards the one limit, and the kernel
# carries on with wrong results. Kernels for the "cpu" target stay within LOOP_BUDGET iterations
# (see loop_copies; the split pass cuts long reductions).
SOFTWARE_LOOP_LIMIT = 65535
LOOP_BUDGET = 65000
MAX_GROUPS = 65535  # workgroups per grid dimension (WebGPU limit)
WORKGROUP_STORAGE = 16384  # bytes of workgroup memory every WebGPU device offers


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
    """An index into an array of ``shape``: a flat (row-major) offset, per-axis coordinates, or
    both. Each is a WGSL u32 expression."""

    shape: Shape
    flat: Optional[str] = None
    coords: Optional[tuple[str, ...]] = None

    def key(self) -> tuple[Any, ...]:
        return (self.shape, self.flat, self.coords)


class Unaligned(Exception):
    """A fused value would read a register (a row's reduction, a matmul accumulator) at an index
    other than the one it holds. The fusion pass treats this as "cannot fuse"."""


def _nonunit(idx_coords: tuple[str, ...], shape: Shape) -> tuple[str, ...]:
    return tuple(c for c, d in zip(idx_coords, shape) if d != 1)


class Emitter:
    """Emits WGSL statements computing body values at given indices."""

    def __init__(self, body: Program, buffers: dict[int, str], indent: str = "    ",
                 registers: Optional[dict[int, tuple[tuple[str, ...], str]]] = None,
                 counter: Optional[list[int]] = None) -> None:
        self.producer = {id(o): e for e in body.eqns for o in e.outs}
        self.buffers = buffers  # id(var) -> binding name, for values read from memory
        # id(var) -> (the coordinates it is held for, WGSL name): values already in registers
        self.registers = registers if registers is not None else {}
        # row kernels on a GPU: buffers read along the row are kept in per-thread registers
        # (``rc*[j]``) by the first pass that loads them, so later passes do not read memory again
        self.row_cache: Optional[dict[int, tuple[str, str, int]]] = None
        self.row_slot = "j"  # which element of the thread's part of the row (a constant)
        self.stage = 0
        self.row_flat: Optional[str] = None
        self.row_shape: Optional[Shape] = None
        # vectorised elementwise kernels: buffers bound as vec4 arrays, and which flat index is
        # which lane of the thread's vec4 (so a load is one 16-byte access per buffer)
        self.vec_buffers: set[str] = set()
        self.lane_of: dict[str, tuple[str, int]] = {}
        self.lines: list[str] = []
        self.memo: dict[tuple[Any, ...], str] = {}
        self.counter = counter if counter is not None else [0]  # shared: unique names per kernel
        self.indent = indent

    def fresh(self, prefix: str = "v") -> str:
        self.counter[0] += 1
        name = f"{prefix}{self.counter[0]}"
        if name in ("i32", "u32", "f32", "f16"):  # the 32nd index let would shadow type i32
            return self.fresh(prefix)
        return name

    def let(self, expr: str, prefix: str = "v") -> str:
        if expr.isidentifier():
            return expr
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
        first = True  # the outermost non-unit axis needs no modulo: flat < size
        for d, s in zip(idx.shape, st):
            if d == 1:
                out.append("0u")
                continue
            q = idx.flat if s == 1 else f"{idx.flat} / {s}u"
            out.append(self.let(q if first else f"({q}) % {d}u", "c"))
            first = False
        return tuple(out)

    def unbroadcast(self, idx: Idx, shape: Shape) -> Idx:
        """The index into an operand of ``shape`` that broadcasts to ``idx.shape``."""
        if shape == idx.shape:
            return idx
        if math.prod(shape) == 1:
            return Idx(shape, flat="0u")
        lead = len(idx.shape) - len(shape)
        if idx.coords is None and 1 not in shape and idx.shape[lead:] == shape:
            return Idx(shape, flat=self.let(f"{idx.flat} % {math.prod(shape)}u", "i"))
        cs = self.coords(idx)[lead:]
        return Idx(shape, coords=tuple("0u" if d == 1 else c for c, d in zip(cs, shape)))

    # -- values --
    def value(self, a: Atom, idx: Idx) -> str:
        """The WGSL name (or literal) of ``a`` at ``idx``, emitting what computes it.

        The ops between ``a`` and the buffers and registers it is computed from are walked with an
        explicit stack of generators (:meth:`compute` yields the operand values it needs), not by
        recursion, so a chain of any length fits in Python's stack. Lines come out in the order a
        depth-first recursion would give."""
        first = self._value_step(a, idx)
        if isinstance(first, str):
            return first
        stack: list[Generator[tuple[Atom, Idx], str, str]] = [first]
        result: Any = None
        while stack:
            try:
                want = stack[-1].send(result)
            except StopIteration as done:
                stack.pop()
                result = done.value
                continue
            step = self._value_step(*want)
            if isinstance(step, str):
                result = step
            else:
                stack.append(step)
                result = None
        return str(result)

    def _value_step(self, a: Atom, idx: Idx) -> Union[str, Generator[tuple[Atom, Idx], str, str]]:
        """``a`` at ``idx`` if known without computing (literal, memo, register, buffer); else a
        generator that computes it."""
        if isinstance(a, Lit):
            return wgsl_literal(a.value, a.dtype)
        key = (id(a), idx.key())
        if key in self.memo:
            return self.memo[key]
        if id(a) in self.registers:
            held, reg = self.registers[id(a)]
            if _nonunit(self.coords(idx), a.shape) != held:
                raise Unaligned(f"register {reg} read at another index")
            expr = reg
        elif id(a) in self.buffers:
            expr = self.load(a, idx)
        else:
            return self._computed(a, idx, key)
        name = expr if expr.isidentifier() else self.let(expr)
        self.memo[key] = name
        return name

    def _computed(self, a: Var, idx: Idx, key: tuple[Any, ...]
                  ) -> Generator[tuple[Atom, Idx], str, str]:
        expr = yield from self.compute(self.producer[id(a)], idx)
        name = expr if expr.isidentifier() else self.let(expr)
        self.memo[key] = name
        return name

    def load(self, v: Var, idx: Idx) -> str:
        buf = self.buffers[id(v)]
        at = "0u" if v.size == 1 else self.flat(idx)
        raw = f"{buf}[{at}]"
        if buf in self.vec_buffers:
            if at in self.lane_of:
                t, lane = self.lane_of[at]
                raw = f"{self.let(f'{buf}[{t}]', 'q')}.{'xyzw'[lane]}"
            else:
                raw = f"{buf}[({at}) / 4u][({at}) % 4u]"
        if (self.row_cache is not None and v.shape == self.row_shape and v.size > 1
                and at == self.row_flat):
            if id(v) not in self.row_cache:
                name = f"rc{len(self.row_cache)}"
                self.row_cache[id(v)] = (name, WGSL_STORAGE[v.dtype], self.stage)
            name, _, filled_in = self.row_cache[id(v)]
            if filled_in == self.stage:  # the first pass that reads it loads it and keeps it
                raw = self.let(raw)
                self.lines.append(f"{self.indent}{name}[{self.row_slot}] = {raw};")
            else:
                raw = f"{name}[{self.row_slot}]"
        return load_expr(raw, v.dtype)

    def compute(self, e: Eqn, idx: Idx) -> Generator[tuple[Atom, Idx], str, str]:
        """The WGSL expression of ``e``'s result at ``idx``. A generator: it yields (operand,
        index) for each operand value it needs and is sent that value's name (see :meth:`value`).
        """
        op = e.op
        if op in MOVEMENT:
            src = e.inputs[0]
            if op is Op.RESHAPE:
                if tuple(d for d in src.shape if d != 1) == tuple(d for d in idx.shape if d != 1):
                    # only unit axes change: keep the coordinates (no index arithmetic)
                    it = iter(_nonunit(self.coords(idx), idx.shape))
                    cs = tuple("0u" if d == 1 else next(it) for d in src.shape)
                    return (yield (src, Idx(src.shape, coords=cs)))
                padded = id(src) in self.producer and self.producer[id(src)].op is Op.PAD
                merged = self.grouped_coords(idx, src.shape, merges_only=True) if padded else None
                if merged is not None:
                    # a padded array needs coordinates; from a split of its axes (split_k's
                    # chunks of K) they are sums, where the flat index would need divisions
                    return (yield (src, Idx(src.shape, coords=merged)))
                grouped = self.grouped_coords(idx, src.shape) if idx.coords is not None else None
                if grouped is not None:
                    # coordinates axis group by axis group (a head axis split out of a row's
                    # columns: a shift and a mask), where flattening the whole index and taking
                    # it apart again would divide by every stride
                    return (yield (src, Idx(src.shape, coords=grouped)))
                return (yield (src, Idx(src.shape, flat=self.flat(idx))))
            if op is Op.PAD:
                return (yield from self._padded(e, idx))
            if op is Op.SLICE:
                return (yield (src, Idx(src.shape, coords=self._sliced(e, idx))))
            if op is Op.TRANSPOSE:
                perm = e.params["perm"]
                cs = self.coords(idx)
                inv = [""] * len(perm)
                for k, p in enumerate(perm):
                    inv[p] = cs[k]
                return (yield (src, Idx(src.shape, coords=tuple(inv))))
            return (yield (src, self.unbroadcast(idx, src.shape)))
        if op in ELEMENTWISE or op in (Op.CAST, Op.IPOW):
            args = []
            for a in e.inputs:
                args.append((yield (a, self.unbroadcast(idx, a.shape))))
            dt = e.inputs[0].dtype if op is not Op.WHERE else e.inputs[1].dtype
            if op is Op.CAST:
                return cast_wgsl(args[0], dt, e.params["dtype"])
            # the expressions of the dtype the values are computed in (float16: float32)
            dt = compute_dtype(dt)
            if op is Op.IPOW:
                return ipow_wgsl(args[0], int(e.params["n"]), dt)
            return EW_TABLE[op].wgsl(args, dt)
        if op is Op.IOTA:
            c = self.coords(idx)[int(e.params["axis"])]
            dt = e.params["dtype"]
            if dt == "float16":  # a coordinate past 2048 rounds, as numpy's arange does
                return cast_wgsl(f"f32({c})", "float32", dt)
            return c if dt == "uint32" else f"{WGSL_TYPE[dt]}({c})"
        if op is Op.ATTENTION_COMBINE:
            return (yield from self._combined(e, idx))
        if op is Op.GATHER:
            x = e.inputs[0]
            gathered: list[str] = []
            for ia, d in zip(e.inputs[1:], x.shape):
                if d == 1:
                    gathered.append("0u")
                    continue
                i = yield (ia, self.unbroadcast(idx, ia.shape))
                gathered.append(self.let(gather_coord(i, d, ia.dtype), "c"))
            return (yield (x, Idx(x.shape, coords=tuple(gathered))))
        raise AssertionError(f"{op} cannot be computed inline")

    def _combined(self, e: Eqn, idx: Idx) -> Generator[tuple[Atom, Idx], str, str]:
        """attention_combine at ``idx`` (a quantized product's prologue, fusec.passes.fuse):
        part p of the row holds its weighted values, its maximum score m_p and its sum l_p of
        weights ([..., S, P, E + 2]); the value is sum_p o_p exp(m_p - m) / sum_p l_p
        exp(m_p - m), m the largest m_p, as the combining kernel computes it
        (templates/attention_combine.wgsl.j2)."""
        pv = e.inputs[0]
        assert isinstance(pv, Var)
        cs = self.coords(idx)
        parts, width = pv.shape[-2], pv.shape[-1]
        col = {"o": cs[-1], "m": f"{width - 2}u", "l": f"{width - 1}u"}
        got: dict[tuple[str, int], str] = {}
        for what in ("m", "o", "l"):  # every load before any arithmetic
            for p in range(parts):
                at = Idx(pv.shape, coords=cs[:-1] + (f"{p}u", col[what]))
                got[what, p] = yield (pv, at)
        m = got["m", 0]
        for p in range(1, parts):
            m = self.let(f"max({m}, {got['m', p]})", "cm")
        num = den = ""
        for p in range(parts):
            w = self.let(f"exp({got['m', p]} - {m})", "cw")
            num = self.let(f"{num + ' + ' if num else ''}{got['o', p]} * {w}", "cn")
            den = self.let(f"{den + ' + ' if den else ''}{got['l', p]} * {w}", "cd")
        return f"({num} / {den})"

    def _sliced(self, e: Eqn, idx: Idx) -> tuple[str, ...]:
        """Coordinates into a slice's operand: start + coordinate * step on each axis."""
        out = []
        for c, s0, st, d in zip(self.coords(idx), e.params["starts"], e.params["steps"],
                                idx.shape):
            if d == 1:
                out.append(f"{s0}u")
            elif st == 1:
                out.append(c if s0 == 0 else self.let(f"{c} + {s0}u", "c"))
            elif st > 0:
                out.append(self.let(f"{s0}u + {c} * {st}u", "c"))
            else:
                out.append(self.let(f"{s0}u - {c} * {-st}u", "c"))
        return tuple(out)

    def grouped_coords(self, idx: Idx, shape: Shape,
                       merges_only: bool = False) -> Optional[tuple[str, ...]]:
        """Coordinates into ``shape`` (a reshape's operand) for ``idx``, computed per group of
        axes whose sizes match on both sides (their products equal), when there is more than one
        such group; None otherwise. A group of one axis of ``shape`` sums ``idx``'s coordinates;
        one of one axis of ``idx`` takes that coordinate apart; any other group goes through its
        own flat index. The coordinates must lie inside ``idx.shape`` (as every index into a
        value does), else they would not stay inside the group. ``merges_only``: only where each
        axis of ``shape`` merges a run of ``idx``'s axes (a reshape that only splits axes: sums,
        no divisions), however many groups."""
        cs = self.coords(idx)
        a = [(c, d) for c, d in zip(cs, idx.shape) if d != 1]
        b = [d for d in shape if d != 1]
        groups: list[tuple[list[tuple[str, int]], list[int]]] = []
        i = j = 0
        while i < len(a) and j < len(b):
            ga, gb = [a[i]], [b[j]]
            pa, pb = a[i][1], b[j]
            i, j = i + 1, j + 1
            while pa != pb:
                if pa < pb and i < len(a):
                    ga.append(a[i])
                    pa, i = pa * a[i][1], i + 1
                elif pb < pa and j < len(b):
                    gb.append(b[j])
                    pb, j = pb * b[j], j + 1
                else:
                    return None
            groups.append((ga, gb))
        if i != len(a) or j != len(b):
            return None
        if (any(len(gb) > 1 for _, gb in groups) if merges_only else len(groups) < 2):
            return None
        out: list[str] = []
        for ga, gb in groups:
            terms, step = [], 1
            for c, d in reversed(ga):
                terms.append(c if step == 1 else f"{c} * {step}u")
                step *= d
            flat = " + ".join(reversed(terms))
            if len(gb) == 1:
                out.append(self.let(flat, "c"))
                continue
            if len(ga) > 1:
                flat = self.let(flat, "i")
            rest = math.prod(gb)
            for k, d in enumerate(gb):
                rest //= d
                q = flat if rest == 1 else f"{flat} / {rest}u"
                out.append(self.let(q if k == 0 else f"({q}) % {d}u", "c"))
        it = iter(out)
        return tuple("0u" if d == 1 else next(it) for d in shape)

    def _padded(self, e: Eqn, idx: Idx) -> Generator[tuple[Atom, Idx], str, str]:
        """A padded array's element: its input's, or the pad value outside it. The input is read
        at a clamped index (inside it whatever the coordinate), and the read value selected away.
        """
        src = e.inputs[0]
        cs = self.coords(idx)
        inner: list[str] = []
        inside: list[str] = []
        for c, d, (lo, hi) in zip(cs, src.shape, e.params["widths"]):
            if lo == 0 and hi == 0:
                inner.append(c)
                continue
            # u32 arithmetic: below the start, c - lo wraps around to a large value
            t = c if lo == 0 else self.let(f"{c} - {lo}u", "c")
            inside.append(f"{t} < {d}u")
            inner.append(self.let(f"min({t}, {d - 1}u)", "c"))
        v = yield (src, Idx(src.shape, coords=tuple(inner)))
        if not inside:
            return v
        value = e.params.get("value", 0)
        fill = wgsl_literal(bool(value) if src.dtype == "bool" else value, src.dtype)
        return f"select({fill}, {v}, {' && '.join(inside)})"


def gather_coord(i: str, d: int, dtype: str) -> str:
    """A gather index ``i`` into an axis of length ``d`` as a u32 coordinate: negative counts from
    the end, then clamped into the axis (JAX's default)."""
    if dtype == "uint32":
        return f"min({i}, {d - 1}u)"
    return f"u32(clamp(select({i}, {i} + {d}i, {i} < 0i), 0i, {d - 1}i))"


def load_expr(raw: str, dtype: str) -> str:
    """A value as computed (:data:`fusec.dtypes.WGSL_TYPE`) from its stored element ``raw``."""
    if dtype == "bool":
        return f"({raw} != 0u)"
    return f"f32({raw})" if dtype == "float16" else raw


def store_expr(expr: str, dtype: str) -> str:
    """A computed value as the element stored in a buffer (:data:`fusec.dtypes.WGSL_STORAGE`):
    bools as 0/1 words, float16 rounded to f16 (see the helper fusec_f16)."""
    if dtype == "bool":
        return f"select(0u, 1u, {expr})"
    return f"fusec_f16({expr})" if dtype == "float16" else expr


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
    if groups > MAX_GROUPS * MAX_GROUPS:
        raise DeviceLimitError(f"a kernel needs {groups} workgroups, more than a 65535 x 65535 "
                               "grid holds; split the work into smaller arrays")
    x = min(groups, MAX_GROUPS)
    return (x, -(-groups // x), 1)


def _bindings(body: Program, inplace: tuple[tuple[int, int], ...] = (),
              vec: Optional[set[str]] = None) -> tuple[list[dict[str, str]], dict[int, str]]:
    """Bindings in order: inputs (read), then outputs (read_write). An input that is written in
    place (a donated buffer) has no binding of its own: it is read through its output's. Names in
    ``vec`` are bound as arrays of vec4."""
    binds: list[dict[str, str]] = []
    names: dict[int, str] = {}
    aliased = dict(inplace)
    vec = vec or set()

    def ty(name: str, dtype: str) -> str:
        return f"vec4<{WGSL_STORAGE[dtype]}>" if name in vec else WGSL_STORAGE[dtype]

    for i, v in enumerate(body.inputs):
        if i in aliased:
            names[id(v)] = f"out{aliased[i]}"
            continue
        names[id(v)] = f"in{i}"
        binds.append({"name": f"in{i}", "access": "read", "type": ty(f"in{i}", v.dtype)})
    for j, o in enumerate(body.outputs):
        assert isinstance(o, Var)
        binds.append({"name": f"out{j}", "access": "read_write", "type": ty(f"out{j}", o.dtype)})
    return binds, names


def _helpers(code: str) -> str:
    """The helper functions ``code`` calls, and those they call (a helper may only call helpers
    listed before it in HELPERS)."""
    used: set[str] = set()
    for name in reversed(HELPERS):
        if f"{name}(" in code or any(f"{name}(" in HELPERS[u] for u in used):
            used.add(name)
    return "".join(text for name, text in HELPERS.items() if name in used)


# In-place updates over a window (lax.dynamic_update_slice into a donated buffer)

Window = list[Optional[tuple[Atom, int]]]


def window_shape(shape: Shape, window: Window) -> list[int]:
    """The extent of ``window`` (see :func:`update_window`) along each axis of ``shape``."""
    return [d if w is None else w[1] for d, w in zip(shape, window)]


def update_window(body: Program, inplace: tuple[tuple[int, int], ...],
                  which: Optional[Sequence[int]] = None) -> Optional[Window]:
    """Where an elementwise kernel changes the buffers it updates in place only inside a window,
    that window: per axis of its outputs (start, length), or None for the whole axis; None if
    the kernel is not such a kernel.

    That is a ``dynamic_update_slice`` (or ``x.at[a:b].set``) into a donated buffer: every output
    is ``where(inside, new, old)``, ``old`` the body input whose buffer the output is
    (``inplace``), and ``inside`` one conjunction of ``i_j - s_j >= 0`` and ``i_j - s_j < n_j``
    over iotas i_j along some axes (``fusec.numpy.indexing._window_update`` builds it). Outside
    the window each element would be rewritten with its own value, so a kernel over the window
    alone leaves the buffers as the whole one would: a decode step's cache update then touches
    one position instead of the whole cache. ``which``: the outputs that are the update (all of
    them by default; an attention kernel's first output is its own, see
    fusec.passes.attention.fold_cache_update), exactly those written in place."""
    which = range(len(body.outputs)) if which is None else which
    outs = [body.outputs[k] for k in which]
    alias = {k: j for j, k in inplace}
    if not outs or set(alias) != set(which) or len(alias) != len(inplace):
        return None
    producer = {id(o): e for e in body.eqns for o in e.outs}
    shape = outs[0].shape
    inside: Optional[Var] = None
    for k, o in zip(which, outs):
        e = producer.get(id(o)) if isinstance(o, Var) else None
        if e is None or e.op is not Op.WHERE or o.shape != shape:
            return None
        c, old = e.inputs[0], e.inputs[2]
        if old is not body.inputs[alias[k]] or not isinstance(c, Var) or inside not in (None, c):
            return None
        inside = c
    assert inside is not None and isinstance(outs[0], Var)
    tests: dict[int, tuple[int, Atom, list[int]]] = {}  # id(i_j - s_j) -> (j, s_j, bounds)
    stack = [inside]
    while stack:
        v = stack.pop()
        e = producer.get(id(v))
        if e is None:
            return None
        if e.op in (Op.MUL, Op.AND) and v.dtype == "bool":
            if not all(isinstance(a, Var) for a in e.inputs):
                return None
            stack.extend(a for a in e.inputs if isinstance(a, Var))
            continue
        w, bound = e.inputs
        if (e.op not in (Op.GE, Op.LT) or not isinstance(w, Var) or not isinstance(bound, Lit)
                or w.dtype != "int32" or isinstance(bound.value, float)):
            return None
        diff = producer.get(id(w))
        if diff is None or diff.op is not Op.SUB:
            return None
        i, s = diff.inputs
        it = producer.get(id(i)) if isinstance(i, Var) else None
        if it is None or it.op is not Op.IOTA or s.shape != ():
            return None
        j = it.params["axis"]
        if i.shape[j] != shape[j] or (isinstance(s, Lit) and isinstance(s.value, float)):
            return None
        # (two upper bounds keep the last: a window larger than the test is still right, since
        # the kernel evaluates the test itself; a smaller one would not be)
        bounds = tests.setdefault(id(w), (j, s, [0, 0]))[2]
        if e.op is Op.GE and int(bound.value) == 0:
            bounds[0] = 1
        elif e.op is Op.LT and int(bound.value) > 0:
            bounds[1] = int(bound.value)
        else:
            return None
    window: Window = [None] * len(shape)
    for j, s, (low, n) in tests.values():
        if not low or not n or window[j] is not None:
            return None
        window[j] = (s, min(n, shape[j]))
    return window if math.prod(window_shape(shape, window)) < math.prod(shape) else None


def window_stores(body: Program, names: dict[int, str], window: Window, which: Sequence[int],
                  skip: str, indent: str, counter: Optional[list[int]] = None
                  ) -> tuple[list[str], list[str], int]:
    """The code that stores outputs ``which`` of ``body`` at the element ``gid`` of ``window``
    (see :func:`update_window`): its lines (``skip``, "return" or "continue", where the element
    falls outside the array: a start that is not clamped), the stores, and the window's size.
    The element's coordinate on a windowed axis is s_j + o_j."""
    shape = body.outputs[which[0]].shape
    wshape = window_shape(shape, window)
    em = Emitter(body, names, indent=indent, counter=counter)
    coords: list[str] = []
    inside: list[str] = []
    for j, (d, ws, w) in enumerate(zip(shape, strides(tuple(wshape)), window)):
        o = em.let(f"(gid / {ws}u) % {wshape[j]}u" if j else f"gid / {ws}u", "o")
        if w is None:
            coords.append(o)
            continue
        s = w[0]
        start = f"{int(s.value)}i" if isinstance(s, Lit) else em.value(s, Idx((), flat="0u"))
        c = em.let(f"{start} + i32({o})", "w")
        inside.append(f"{c} >= 0i && {c} < {d}i")
        coords.append(em.let(f"u32({c})", "c"))
    if inside:
        test = " && ".join(inside)
        em.lines.append(f"{indent}if (!({test})) {{\n{indent}    {skip};\n{indent}}}")
    flat = em.let(" + ".join(f"{c} * {st}u" for c, st in zip(coords, strides(shape))), "i")
    idx = Idx(shape, flat=flat, coords=tuple(coords))
    stores = []
    for k in which:
        out = body.outputs[k]
        assert isinstance(out, Var)
        stores.append(f"{indent}out{k}[{flat}] = {store_expr(em.value(out, idx), out.dtype)};")
    return em.lines, stores, math.prod(wshape)
