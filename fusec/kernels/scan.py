"""Kernels of kind "scan": the stages :func:`fusec.passes.scan.lower_scan` turns a cumulative
sum, product, maximum or minimum into, and the plan that chooses them (:func:`plan`).

The scanned axis is a row of ``n`` positions for every other coordinate (no transpose: the
element at position p of row (o, i) is at flat index (o * n + p) * inner + i, ``inner`` being the
product of the axes after the scanned one). Rows are cut into chunks of ``chunk`` positions; a
chunk is one job. Two layouts (see :func:`plan` for which runs where):

- "tile": ``threads`` threads (a power of two; several jobs share a workgroup when fewer than
  it) take a job, 4 consecutive positions each per round, ``rounds`` rounds per tile, and loop
  over the chunk's tiles with a running carry. Where rows are contiguous and ``n`` a multiple
  of 4, the 4 positions are one vec4 load and store.
- "serial": a thread takes a job and walks it; neighbouring threads take neighbouring columns.

Long rows take three stages: ``scan_reduce`` (each chunk reduced to a value), the scan of those
values (recursively, by the same plan), and ``scan`` with carries (each chunk scanned from the
scanned value of the chunks before it): the data is read twice and written once. Short rows,
or rows enough to fill the GPU, take one ``scan`` kernel that reads and writes each element
once. Element loads go through :class:`fusec.emit.Emitter`.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Optional

from ..dtypes import WGSL_TYPE
from ..emit import (
    LOOP_BUDGET,
    WORKGROUP,
    Emitter,
    Idx,
    KernelCode,
    _bindings,
    _env,
    _helpers,
    grid_for,
)
from ..ir import Eqn, Op, Program, Shape, Var
from ..ops import scan_identity, wgsl_literal

TILE_THREADS = 256  # threads per job of a long row ("tile" layout)
# rounds per tile of a long row: tiles of 8 x 256 x 4 = 8192 positions, whose scan across the
# threads takes 16 KiB of workgroup memory (two arrays of 8 x 256 values; every WebGPU device
# has that much). cumsum of 2^26 float32 on the H100 (us; copy 184, sum 96): rounds 1 293,
# 2 288, 4 286, 8 282
TILE_ROUNDS = 8
SHORT = 4096  # "tile" rows up to this long: one kernel, a job per row
MANY_ROWS = 1024  # "tile" rows: from this many, one kernel whatever their length
# chunk lengths of long "tile" rows: the longest that gives at least CHUNK_JOBS jobs, else the
# shortest. 2^26 float32 on the H100: chunks of 8192 286, 16384 282, 32768 286, 65536 301 us
CHUNKS = (16384, 8192)
CHUNK_JOBS = 1024
# "serial" on GPUs: rows are cut into chunks (at least SERIAL_CHUNK_MIN long) that give about
# SERIAL_THREADS threads, unless there are that many rows / 4 already, or the rows are at most
# SERIAL_SHORT long (a walk of a few hundred loads costs less than two more kernels). cumsum of
# 8192 x 8192 float32 along axis 0 on the H100 (copy of the same bytes: 184 us): 2^16 threads
# 623 us, 2^18 325 (loading one position per step); loading 4 per step 358 and 301, 8 325
# and 304
SERIAL_THREADS = 1 << 18
SERIAL_SHORT = 512
SERIAL_CHUNK_MIN = 64
SERIAL_UNROLL = 4  # positions a "serial" thread loads before it combines them
# strided rows with at most this many columns (the product of the axes after the scanned one)
# take the "tile" layout on GPUs, more the "serial" one. Measured worse everywhere on the H100
# (cumsum along axis 0 of 2^26 float32, us, serial / tile: 4 columns 846 / 1018, 8 777 / 4016,
# 16 352 / 2099, 64 320 / 2117, 1024 322 / 1859): strided rows stay "serial"
TILE_MAX_INNER = 1
CPU_SHORT = 16384  # "serial" rows up to this long on the "cpu" target: one kernel
CPU_CHUNK = 4096
# The last stage of a long row on GPUs takes its chunks last to first: the first stage read them
# first to last, so the chunks it read last may still be in the L2 cache when this one starts
# (cumsum of 2^26 float32 on the H100: 285.8 us against 287.4 first to last; little, as the
# cache holds a fifth of the data at most)
FINISH_BACKWARDS = True


@dataclass(frozen=True)
class Plan:
    """How a scan along an axis is computed: ``scan``'s params (layout, chunk, threads,
    rounds); with ``reduce`` (``scan_reduce``'s params) the rows take three stages."""

    scan: dict[str, Any]
    reduce: Optional[dict[str, Any]] = None


def _tile(chunk: int, threads: int, rounds: int) -> dict[str, Any]:
    return {"layout": "tile", "chunk": chunk, "threads": threads, "rounds": rounds}


def _serial(chunk: int) -> dict[str, Any]:
    return {"layout": "serial", "chunk": chunk}


def _short_tile(n: int) -> dict[str, Any]:
    """One job per row: the fewest threads (and rounds) whose tile covers the row."""
    if n <= 4 * TILE_THREADS:
        threads = 1 << max(0, (-(-n // 4) - 1).bit_length())
        return _tile(4 * threads, threads, 1)
    if n <= 4 * TILE_THREADS * TILE_ROUNDS:
        rounds = -(-n // (4 * TILE_THREADS))
        return _tile(4 * TILE_THREADS * rounds, TILE_THREADS, rounds)
    tile = 4 * TILE_THREADS * TILE_ROUNDS
    return _tile(tile * -(-n // tile), TILE_THREADS, TILE_ROUNDS)


def plan(shape: Shape, axis: int, target: str = "gpu") -> Plan:
    """The stages of a scan of an array of ``shape`` along ``axis``.

    GPUs: contiguous rows (the last axis, or only unit axes after it; see TILE_MAX_INNER) take
    the "tile" layout: one kernel for rows up to SHORT long, or from MANY_ROWS rows (a workgroup
    per row, each looping over its row's tiles, fills the GPU), or rows of one chunk; else three
    stages, in chunks of 16384 positions where that gives CHUNK_JOBS jobs. Strided rows take
    the "serial" layout (neighbouring threads read neighbouring columns): one kernel up to
    SERIAL_SHORT positions or from SERIAL_THREADS / 4 rows, else chunks that give about
    SERIAL_THREADS threads. The "cpu" target (a software adapter, where barriers are costly and
    a thread walking its row is what a CPU does best) takes "serial" throughout, in chunks of
    CPU_CHUNK positions past CPU_SHORT (within codegen.LOOP_BUDGET loop iterations per
    invocation)."""
    n = shape[axis]
    rows = math.prod(shape) // max(n, 1)
    inner = math.prod(shape[axis + 1:])
    if target != "gpu":
        if n <= CPU_SHORT:
            return Plan(_serial(n))
        return Plan(_serial(CPU_CHUNK), _serial(CPU_CHUNK))
    if inner > 1 and inner > TILE_MAX_INNER:
        if n <= SERIAL_SHORT or rows >= SERIAL_THREADS // 4:
            return Plan(_serial(n))
        chunk = max(SERIAL_CHUNK_MIN, -(-n * rows // SERIAL_THREADS))
        if chunk >= n:
            return Plan(_serial(n))
        return Plan(_serial(chunk), _serial(chunk))
    chunk = next((c for c in CHUNKS if rows * -(-n // c) >= CHUNK_JOBS), CHUNKS[-1])
    if n <= SHORT or rows >= MANY_ROWS or n <= chunk:
        return Plan(_short_tile(n))
    return Plan(_tile(chunk, TILE_THREADS, TILE_ROUNDS),
                _tile(chunk, TILE_THREADS, chunk // (4 * TILE_THREADS)))


# --- code generation ------------------------------------------------------------------------------

def _combiner(reduce: str, dtype: str) -> Any:
    """WGSL of ``a reduce b`` in the kernel's compute type (bool as u32 words 0 and 1)."""
    def combine(a: str, b: str) -> str:
        if reduce == "sum":
            return f"({a} + {b})"
        if reduce == "prod":
            return f"({a} * {b})"
        if dtype == "float32":
            return f"fusec_{reduce}_f32({a}, {b})"  # NaN wins, as numpy's (see ops.HELPERS)
        # integer max and min as selects (see ops._minmax)
        return f"select({b}, {a}, {a} {'>' if reduce == 'max' else '<'} {b})"

    return combine


@dataclass
class _Geometry:
    """Where a job's positions are: rows of n positions, ``inner`` apart, in ``chunks``."""

    n: int
    inner: int
    outer: int
    chunk: int
    chunks: int
    reverse: bool

    @property
    def rows(self) -> int:
        return self.outer * self.inner


def _geometry(e: Eqn) -> _Geometry:
    x = e.inputs[0]
    axis, chunk = int(e.params["axis"]), int(e.params["chunk"])
    n = x.shape[axis]
    inner = math.prod(x.shape[axis + 1:])
    return _Geometry(n, inner, math.prod(x.shape[:axis]), chunk, -(-n // chunk),
                     bool(e.params["reverse"]))


def _physical(geo: _Geometry, q: str) -> str:
    """The position along the axis of scan position ``q`` (a WGSL expression)."""
    return f"({geo.n - 1}u - {q})" if geo.reverse else q


def _value(em: Emitter, x: Var, flat: str, dtype: str) -> str:
    """x at flat index ``flat``, in the compute type."""
    v = em.value(x, Idx(x.shape, flat=flat))
    return f"select(0u, 1u, {v})" if dtype == "bool" else v


def generate(kernel: Eqn, target: str = "gpu", workgroup_storage: int = 16384) -> KernelCode:
    """WGSL for a kernel of kind "scan" (one ``scan`` or ``scan_reduce`` equation)."""
    body = kernel.params["body"]
    e = body.eqns[0]
    if e.op not in (Op.SCAN, Op.SCAN_REDUCE):
        raise AssertionError(f"a scan kernel computes scan or scan_reduce, not {e.op.value}")
    geo = _geometry(e)
    tile = e.params["layout"] == "tile"
    vec: set[str] = set()
    if tile and geo.inner == 1 and geo.n % 4 == 0:
        vec = {"in0", "out0"} if e.op is Op.SCAN else {"in0"}
    binds, names = _bindings(body, (), vec)
    if tile:
        wgsl, groups = _tile_kernel(body, names, geo, bool(vec), workgroup_storage)
    else:
        wgsl, groups = _serial_kernel(body, names, geo, target)
    header = _env().get_template("bindings.wgsl.j2").render(bindings=binds)
    full = header + _helpers(wgsl) + wgsl
    key = hashlib.sha256(full.encode()).hexdigest()
    return KernelCode(kernel.params["name"], "scan", full, grid_for(groups), len(body.inputs),
                      len(body.outputs), key=key)


def _common(e: Eqn) -> tuple[str, str, str, Any]:
    """Compute type, its identity literal, the dtype, and the combine function."""
    dt = e.out.dtype
    ct = "u32" if dt == "bool" else WGSL_TYPE[dt]
    ident = scan_identity(e.params["reduce"], dt)
    lit = wgsl_literal(int(ident), "uint32") if dt == "bool" else wgsl_literal(ident, dt)
    return ct, lit, dt, _combiner(e.params["reduce"], dt)


def _job_lines(geo: _Geometry, indent: str = "    ") -> list[str]:
    """WGSL defining, from the job index, ``g`` (its chunk) and ``base`` (the flat index of its
    row's first element). Job (o * chunks + g) * inner + i is chunk g of the row of column i
    (of the axes after the scanned one) of the outer coordinate o: the flat index of the
    chunk's value in the chunks' array, and neighbouring jobs are neighbouring columns."""
    if geo.inner == 1:
        return [f"{indent}let g = job % {geo.chunks}u;",
                f"{indent}let base = job / {geo.chunks}u * {geo.n}u;"]
    return [f"{indent}let g = job / {geo.inner}u % {geo.chunks}u;",
            f"{indent}let base = job / {geo.inner * geo.chunks}u * {geo.n * geo.inner}u"
            f" + job % {geo.inner}u;"]


def _carry(em: Emitter, e: Eqn, geo: _Geometry, lit: str, dt: str) -> str:
    """The chunk's starting value: the identity for the first chunk of a row (or without
    carries), else the carries' value of the chunk before, ``inner`` positions back in the
    carries (for the first chunk the read is of its own position, and unused)."""
    if len(e.inputs) < 2:
        return lit
    carries = e.inputs[1]
    assert isinstance(carries, Var)
    v = _value(em, carries, em.let(f"job - select(0u, {geo.inner}u, g > 0u)", "i"), dt)
    return f"select({lit}, {v}, g > 0u)"


def _tile_kernel(body: Program, names: dict[int, str], geo: _Geometry, vec: bool,
                 workgroup_storage: int) -> tuple[str, int]:
    e = body.eqns[0]
    ct, lit, dt, combine = _common(e)
    p = e.params
    threads, rounds, chunk = int(p["threads"]), int(p["rounds"]), geo.chunk
    mode = "scan" if e.op is Op.SCAN else "reduce"
    wg = WORKGROUP
    assert threads <= wg, "a job's threads are within one workgroup"
    if mode == "scan" and 2 * wg * rounds * 4 > workgroup_storage:
        raise AssertionError(f"a tile scan of {rounds} rounds needs more workgroup memory than "
                             f"{workgroup_storage} bytes")
    x = e.inputs[0]
    assert isinstance(x, Var)
    jobs = geo.rows * geo.chunks
    counter = [0]
    pre = Emitter(body, names, indent="    ", counter=counter)
    pre.lines += _job_lines(geo)
    base = "base"
    carry = _carry(pre, e, geo, lit, dt) if mode == "scan" else lit
    indent = "        " if mode == "scan" else "    "
    em = Emitter(body, names, indent=indent, counter=counter)
    em.memo.update(pre.memo)
    if vec:
        em.vec_buffers = {"in0"}
    stores: list[str] = []
    for k in range(rounds):
        q = em.let(f"q0 + {k * threads * 4}u", "q")
        lanes: list[str] = []
        flats: list[str] = []
        if vec:
            qc = f"min({q}, {geo.n - 4}u)"
            first = f"({geo.n - 4}u - {qc})" if geo.reverse else qc
            vi = em.let(f"{base} / 4u + {first} / 4u", "t")
            for lane in range(4):
                phys = 3 - lane if geo.reverse else lane
                flat = f"4u * {vi} + {phys}u"  # read as lane phys of the vec4 at vi
                em.lane_of[flat] = (vi, phys)
                lanes.append(_value(em, x, flat, dt))
            valid = [f"{q} < {geo.n}u"] * 4
            if mode == "scan":
                parts = [f"o{3 - pl if geo.reverse else pl}" for pl in range(4)]
                stores.append(f"            if (live && {q} < {geo.n}u) {{\n"
                              f"                out0[{vi}] = vec4<{ct}>({', '.join(parts)});\n"
                              "            }")
        else:
            valid = []
            for lane in range(4):
                ql = em.let(f"{q} + {lane}u", "q") if lane else q
                qc = em.let(f"min({ql}, {geo.n - 1}u)", "q")
                pos = _physical(geo, qc)
                step = f" * {geo.inner}u" if geo.inner != 1 else ""
                flat = em.let(f"{base} + {pos}{step}", "e")
                flats.append(flat)
                lanes.append(_value(em, x, flat, dt))
                valid.append(f"{ql} < {geo.n}u")
            if mode == "scan":
                stores.append("\n".join(
                    f"            if (live && {valid[lane]}) {{\n"
                    f"                out0[{flats[lane]}] = o{lane};\n            }}"
                    for lane in range(4)))
        for lane in range(4):
            em.lines.append(f"{indent}let x{k}_{lane} = select({lit}, {lanes[lane]}, "
                            f"{valid[lane]});")
    steps = []
    d = 1
    while d < threads:
        steps.append(d)
        d *= 2
    groups = -(-jobs // (wg // threads))
    backwards = FINISH_BACKWARDS and len(e.inputs) > 1
    # (past the last group, the linear index wraps around to a large value: no live job)
    first = f"{groups - 1}u - (wid.y * nwg.x + wid.x)" if backwards else "wid.y * nwg.x + wid.x"
    src = _env().get_template("scan_tile.wgsl.j2").render(
        first=first, mode=mode, wg=wg, ct=ct, identity=lit, threads=threads, rounds=rounds,
        jobs=jobs, chunk=chunk, chunks=geo.chunks, n=geo.n, tiles=chunk // (4 * threads * rounds),
        tile=4 * threads * rounds, prelude="\n".join(pre.lines), carry=carry,
        loads="\n".join(em.lines), steps=steps, final=f"ks{len(steps) % 2}", stores=stores,
        combine=combine)
    return src, groups


def _serial_kernel(body: Program, names: dict[int, str], geo: _Geometry,
                   target: str) -> tuple[str, int]:
    e = body.eqns[0]
    ct, lit, dt, combine = _common(e)
    mode = "scan" if e.op is Op.SCAN else "reduce"
    if target == "cpu" and geo.chunk > LOOP_BUDGET:
        raise AssertionError(f"a serial scan of chunks of {geo.chunk} passes the loop budget")
    x = e.inputs[0]
    assert isinstance(x, Var)
    jobs = geo.rows * geo.chunks
    counter = [0]
    pre = Emitter(body, names, indent="    ", counter=counter)
    pre.lines += _job_lines(geo)
    carry = _carry(pre, e, geo, lit, dt) if mode == "scan" else lit
    em = Emitter(body, names, indent="        ", counter=counter)
    step = f" * {geo.inner}u" if geo.inner != 1 else ""
    unroll = min(SERIAL_UNROLL, geo.chunk)
    for u in range(unroll):
        # past the chunk's end, the last position again (a load inside the buffer; unused)
        q = "q0" if u == 0 else em.let(f"min(q0 + {u}u, end - 1u)", "q")
        em.lines.append(f"        let f{u} = base + {_physical(geo, q)}{step};")
        em.lines.append(f"        let x{u} = {_value(em, x, f'f{u}', dt)};")
    src = _env().get_template("scan_serial.wgsl.j2").render(
        mode=mode, wg=WORKGROUP, ct=ct, jobs=jobs, chunk=geo.chunk, chunks=geo.chunks, n=geo.n,
        prelude="\n".join(pre.lines), carry=carry, loads="\n".join(em.lines), combine=combine,
        unroll=unroll)
    return src, -(-jobs // WORKGROUP)
