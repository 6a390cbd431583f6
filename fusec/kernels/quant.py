"""Kernels of kind "quant": quantized weights (:mod:`fusec.quant`; the word layout of each format
is in :mod:`fusec.ops`' quantized-weights section).

``qmatmul`` (:data:`fusec.ir.Op.QMATMUL`, made by :func:`fusec.passes.quant.rewrite_quant`):
``x @ dequant(words).T`` for few rows of x (a language model's decode step), reading each weight
word from memory once and never writing the dequantised matrix. The work is cut in *units* of 8
values, a quarter of a 32-value block: q4_1's unit is one word of nibbles (values 4q..4q+3 and
16+4q..16+4q+3 of its block) with the block's scale word, q8_0's two words of int8 (values
8q..8q+7) with the scale word. A unit's weights are dequantised once in registers (f16 scales by
``unpack2x16float``, nibbles by shifts and masks, int8 by a left shift then an arithmetic right
shift) and multiplied, as two vec4 dot products, with the matching 8 values of every row of x,
summed into one float32 accumulator per row of x.

On GPUs a *team* of :func:`team` threads (4 to 64, a power of two) shares a weight row: thread t
takes units t, t + team, ... of the row, so that consecutive threads read consecutive words of
the weights and consecutive vec4s of x (both coalesced). Each thread first issues the loads of
all its units (up to :data:`UNROLL` at a time; the units past the row's end load a clamped one
and skip the arithmetic), then does the arithmetic. The team's partial sums
meet in a tree in workgroup memory, or, where the device has subgroup operations (the
``subgroups`` parameter, from Options.subgroups), by ``subgroupShuffleXor`` within each
subgroup's share of the team, whose sums (one per subgroup: two for a team of 64 on NVIDIA's
32-lane subgroups) then meet through workgroup memory after one barrier, in place of a barrier
per level of the tree (H100, the SmolLM2-shaped decode step's GPU time 0.99 -> 0.95 ms at batch
1, 1.83 -> 1.67 ms at batch 8); the workgroup (:data:`WORKGROUP` threads, fewer where its
workgroup memory would not hold ``threads x rows of x`` floats) holds ``WORKGROUP / team`` weight
rows and stores their outputs as runs of consecutive columns. On software adapters (target
"cpu", where a workgroup's invocations are SIMD lanes and barriers are costly) a thread takes a
whole weight row, :data:`CPU_ROWS` rows a workgroup, and no workgroup memory.

x is read as vec4s when it is a buffer of its own (the usual case: a normalisation's result);
a view of a buffer (a reshape, a transpose, a slice) is read in place through
:class:`fusec.emit.Emitter`, element by element.

``dequant`` (:data:`fusec.ir.Op.DEQUANT`): the dequantised matrix written out (the many-rows
product of a prompt's prefill, which then runs as a tiled matmul, or a user's
:func:`fusec.quant.dequantize`): a thread per unit, two vec4 stores.
"""

from __future__ import annotations

import hashlib
import math

from ..emit import (
    LOOP_BUDGET,
    Emitter,
    Idx,
    KernelCode,
    _bindings,
    _env,
    _helpers,
    _nonunit,
    grid_for,
    store_expr,
)
from ..ir import Eqn, Op, Program, Shape, Var
from ..ops import QMATMUL_M, QUANT_BLOCK, QUANT_WORDS, wgsl_literal

# Products with at most QMATMUL_M (fusec.ops) rows of x (all batch axes together) take qmatmul; more
# take dequant and the tiled matmul. Why 16: a thread keeps one accumulator per row of x in
# registers and reads x's values again for every weight row it takes (from L1: x is a few KiB), so
# its arithmetic per weight byte grows with the rows while the tiled matmul blocks both operands in
# registers and workgroup memory. Up to 16 rows the product stays bound by reading the weights (q4_1
# at K = 576: 16 x 2 flops per 0.625 bytes, ~51 flops a byte, under an H100's ~20 TFLOP/s of FMA
# over 3.3 TB/s ~ 60), where the float path moves 6.4x (q4_1) or 3.8x (q8_0) the bytes (the f32
# matrix written and read back), and fusec's own float GEMV kernel takes up to 16 rows
# (codegen.GEMV_M) for the same reason. Beyond it, arithmetic grows and the dequantised matrix's
# traffic is paid once for many rows (a 512-token prefill): the tiled matmul is the better kernel.
UNIT = 8  # values a thread dequantises at once: a quarter block
WORKGROUP = 256  # threads per workgroup on GPUs (qmatmul at most; dequant always)
MAX_TEAM = 64  # threads sharing a weight row on GPUs, at most
UNROLL = 6  # units whose loads a thread issues before their arithmetic, at most
CPU_ROWS = 64  # weight rows (threads) per workgroup on software adapters
# A team grows (up to MAX_TEAM) while each thread keeps at least TEAM_UNITS / 2 units. H100, the
# synthetic SmolLM2 step (bench/llama_synthetic.py --settings "default;kquant.TEAM_UNITS=2",
# best of 2 interleaved rounds), GPU ms, TEAM_UNITS 8 (teams of 16 at K = 576, 32 at 1536) / 4 /
# 2 (64 at both): batch 1 1.11 / - / 0.98-0.99 (step 1.93 -> 1.76 ms); batch 8 2.30 / 1.95-1.97
# / 1.83-1.84: a team of 16 left most of the GPU's threads idle (gate and up at batch 8: 49K
# threads where an H100 holds 270K), each thread's units' arithmetic in a row.
TEAM_UNITS = 2


def units(k: int) -> int:
    """Units (8 values) in a weight row of ``k`` values."""
    return k // UNIT


def team(k: int, target: str = "gpu") -> int:
    """Threads sharing a weight row: a power of two from 4 to MAX_TEAM, each with at least
    TEAM_UNITS / 2 units where the row has them (K = 576 and 1536: 64 threads of 1 or 2 and of
    3 units); one thread on software adapters. A thread issues the word loads of its units
    before any arithmetic; a decode step's products are small (a few hundred KB of weights), so
    what bounds them is each thread's chain of loads and arithmetic, and more threads per row
    shorten it, the team's sums at the end (a tree of 6 levels, or shuffles) costing less than
    it saves (see TEAM_UNITS)."""
    if target != "gpu":
        return 1
    u = units(k)
    t = 4
    while t < MAX_TEAM and TEAM_UNITS * t <= u:
        t *= 2
    return t


def workgroup(k: int, rows: int, target: str, storage: int) -> int:
    """Threads per qmatmul workgroup: WORKGROUP, halved while the reduction's rows x threads
    floats do not fit in ``storage`` bytes of workgroup memory (a team must still fit)."""
    if target != "gpu":
        return CPU_ROWS
    wg = WORKGROUP
    while wg > team(k, target) and wg * rows * 4 > storage:
        wg //= 2
    return wg


def fits(rows: int, n: int, k: int, target: str) -> bool:
    """Whether qmatmul takes a product with ``rows`` rows of x (all batch axes), ``n`` weight rows
    and ``k`` values each: few rows (QMATMUL_M), nothing empty, and on a software adapter (which
    ends an invocation's loops after 65535 iterations in all) a weight row's units within the
    loop budget."""
    if not 1 <= rows <= QMATMUL_M or n < 1 or k < QUANT_BLOCK or k % QUANT_BLOCK:
        return False
    return target == "gpu" or units(k) <= LOOP_BUDGET  # a thread walks its row's units


def _loads(fmt: str, j: int, unit: str, rowbase: str, src: str) -> list[str]:
    """WGSL lines loading the words of unit ``unit`` of the row at word ``rowbase``: its block's
    scale word ``s{j}`` and its value words ``p{j}`` (q8_0: ``p{j}``, ``r{j}``)."""
    w = QUANT_WORDS[fmt]
    lines = [f"let b{j} = {unit} / 4u;",
             f"let q{j} = {unit} % 4u;",
             f"let o{j} = {rowbase} + b{j} * {w}u;",
             f"let s{j} = {src}[o{j}];"]
    if fmt == "q4_1":
        lines.append(f"let p{j} = {src}[o{j} + 1u + q{j}];")
    else:
        lines += [f"let p{j} = {src}[o{j} + 1u + 2u * q{j}];",
                  f"let r{j} = {src}[o{j} + 2u + 2u * q{j}];"]
    return lines


def _dequant(fmt: str, j: int) -> list[str]:
    """WGSL lines dequantising unit j's loaded words into ``lo{j}`` and ``hi{j}`` (vec4s of
    values from k ``ka{j}`` and ``kb{j}`` of the row on, both multiples of 4)."""
    if fmt == "q4_1":
        return [
            f"let d{j} = unpack2x16float(s{j});",
            f"let lo{j} = vec4<f32>((vec4<u32>(p{j}) >> vec4<u32>(0u, 8u, 16u, 24u)) & "
            f"vec4<u32>(15u)) * d{j}.x + d{j}.y;",
            f"let hi{j} = vec4<f32>((vec4<u32>(p{j}) >> vec4<u32>(4u, 12u, 20u, 28u)) & "
            f"vec4<u32>(15u)) * d{j}.x + d{j}.y;",
            f"let ka{j} = b{j} * 32u + q{j} * 4u;",
            f"let kb{j} = ka{j} + 16u;",
        ]
    # int8 lanes: each byte shifted to the top, then arithmetically back (sign extension)
    return [
        f"let d{j} = unpack2x16float(s{j}).x;",
        f"let lo{j} = vec4<f32>((vec4<i32>(bitcast<i32>(p{j})) << vec4<u32>(24u, 16u, 8u, 0u))"
        f" >> vec4<u32>(24u)) * d{j};",
        f"let hi{j} = vec4<f32>((vec4<i32>(bitcast<i32>(r{j})) << vec4<u32>(24u, 16u, 8u, 0u))"
        f" >> vec4<u32>(24u)) * d{j};",
        f"let ka{j} = b{j} * 32u + q{j} * 8u;",
        f"let kb{j} = ka{j} + 4u;",
    ]


def _row_coords(shape: Shape, m: int) -> tuple[str, ...]:
    """The coordinates of x's leading axes for its flattened row ``m`` (constants)."""
    out: list[str] = []
    for d in reversed(shape[:-1]):
        out.append(f"{m % d}u")
        m //= d
    return tuple(reversed(out))


def _check(kernel: Eqn, op: Op) -> tuple[Program, Eqn]:
    body: Program = kernel.params["body"]
    e = body.eqns[-1]
    assert e.op is op, f"quant kernels of this kind compute {op.value}, not {e.op.value}"
    return body, e


def _epilogue(body: Program, e: Eqn, names: dict[int, str], counter: list[int],
              lead: tuple[str, ...], col: str, flat: str, indent: str) -> str:
    """The stores of the kernel's outputs at product element (``lead``, ``col``) (flat index
    ``flat``), whose product is held in ``prod``: the product itself, or elementwise work on it
    (a residual add, an activation) that the fusion pass merged into the kernel."""
    out_shape = e.out.shape
    ee = Emitter(body, names, indent=indent, counter=counter)
    coords = lead + (col,)
    ee.registers[id(e.out)] = (_nonunit(coords, out_shape), "prod")
    here = Idx(out_shape, flat=flat, coords=coords)
    stores = []
    for j, o in enumerate(body.outputs):
        assert isinstance(o, Var) and o.shape == out_shape, "epilogue outputs: the product's shape"
        stores.append(f"{indent}out{j}[{flat}] = {store_expr(ee.value(o, here), o.dtype)};")
    return "\n".join(ee.lines + stores)


def _generate_qmatmul(kernel: Eqn, target: str, workgroup_storage: int) -> KernelCode:
    body: Program = kernel.params["body"]
    e = next(b for b in body.eqns if b.op is Op.QMATMUL)
    x, words = e.inputs[:2]
    assert isinstance(x, Var) and isinstance(words, Var)
    fmt, n, k = str(e.params["fmt"]), int(e.params["n"]), int(e.params["k"])
    # a folded normalisation (fusec.passes.quant.fold_rms_norm): the rows' sums of squares beside
    # the products, and the normalisation's weight, where there is one, applied to x's values
    rms = "rms_eps" in e.params
    g = e.inputs[2] if len(e.inputs) > 2 else None
    assert g is None or isinstance(g, Var)
    rows = math.prod(x.shape[:-1])
    u_row = units(k)
    t = team(k, target)
    # (the fold is made for GPUs only, where a team of threads shares a weight row)
    assert not rms or t > 1, "a folded normalisation needs a team per weight row (GPUs)"
    wg = workgroup(k, rows * (2 if rms else 1), target, workgroup_storage)
    per_group = wg // t  # weight rows per workgroup
    groups = -(-n // per_group)
    iters = -(-u_row // t)  # units per thread
    # software adapters run a workgroup's invocations as SIMD lanes: unrolling buys nothing
    # there, and lavapipe's compile time grows with it (q4_1, 16 rows of x, K = 576: 4.3 s of
    # CPU unrolled 6 times, 0.3 s not unrolled)
    unroll = min(UNROLL, iters) if target == "gpu" else 1
    step = t * unroll
    inplace = tuple(kernel.params.get("inplace", ()))
    _, names0 = _bindings(body, inplace)
    # x as vec4s where it is a buffer, or a reshape of one (the same flat layout); a view that
    # moves elements is read in place element by element
    src: Var = x
    producer = {id(o): b for b in body.eqns for o in b.outs}
    while id(src) not in names0 and id(src) in producer and producer[id(src)].op is Op.RESHAPE:
        nxt = producer[id(src)].inputs[0]
        assert isinstance(nxt, Var)
        src = nxt
    x_vec = id(src) in names0
    vec = {names0[id(src)]} if x_vec else set()
    g_vec = g is not None and id(g) in names0
    if g_vec:
        assert g is not None
        vec.add(names0[id(g)])
    binds, names = _bindings(body, inplace, vec)
    wsrc = names[id(words)]
    counter = [0]

    lines: list[str] = []
    ind = "        "
    for j in range(unroll):
        # every load is issued (from a clamped, valid unit) before any arithmetic
        lines.append(f"{ind}let u{j} = min(ux + {j * t}u, {u_row - 1}u);")
        lines += [ind + s for s in _loads(fmt, j, f"u{j}", "rowbase", wsrc)]
    guarded = u_row % step != 0  # some threads' last units lie past the row's end
    inner = ind + "    "
    for j in range(unroll):
        lines.append(f"{ind}if (ux + {j * t}u < {u_row}u) {{" if guarded else f"{ind}{{")
        lines += [inner + s for s in _dequant(fmt, j)]
        if g is not None:  # the normalisation's weight at the unit's values
            if g_vec:
                gs = names[id(g)]
                lines += [f"{inner}let ga{j} = {gs}[ka{j} >> 2u];",
                          f"{inner}let gb{j} = {gs}[kb{j} >> 2u];"]
            else:
                eg = Emitter(body, names, indent=inner, counter=counter)
                ga = [eg.value(g, Idx(g.shape, coords=(f"(ka{j} + {i}u)",))) for i in range(4)]
                gb = [eg.value(g, Idx(g.shape, coords=(f"(kb{j} + {i}u)",))) for i in range(4)]
                lines += eg.lines
                lines += [f"{inner}let ga{j} = vec4<f32>({', '.join(ga)});",
                          f"{inner}let gb{j} = vec4<f32>({', '.join(gb)});"]
        for m in range(rows):
            if x_vec:
                xs = names[id(src)]
                base = m * (k // 4)
                va = f"{xs}[{base}u + (ka{j} >> 2u)]"
                vb = f"{xs}[{base}u + (kb{j} >> 2u)]"
            else:
                lead = _row_coords(x.shape, m)
                em = Emitter(body, names, indent=inner, counter=counter)
                va_parts = [em.value(x, Idx(x.shape, coords=lead + (f"(ka{j} + {i}u)",)))
                            for i in range(4)]
                vb_parts = [em.value(x, Idx(x.shape, coords=lead + (f"(kb{j} + {i}u)",)))
                            for i in range(4)]
                lines += em.lines
                va = f"vec4<f32>({', '.join(va_parts)})"
                vb = f"vec4<f32>({', '.join(vb_parts)})"
            if rms:
                lines.append(f"{inner}let xa{j}_{m} = {va};")
                lines.append(f"{inner}let xb{j}_{m} = {vb};")
                va, vb = f"xa{j}_{m}", f"xb{j}_{m}"
                lines.append(f"{inner}ss{m} += dot({va}, {va}) + dot({vb}, {vb});")
                if g is not None:
                    va, vb = f"{va} * ga{j}", f"{vb} * gb{j}"
            lines.append(f"{inner}a{m} += dot({va}, lo{j}) + dot({vb}, hi{j});")
        lines.append(f"{ind}}}")
    code = "\n".join(lines)
    # the team's tree: strides t/2, t/4, .., 1
    strides = []
    s = t // 2
    while s >= 1:
        strides.append(s)
        s //= 2
    # the stores: (GPUs) of row m, a runtime value; (software adapters) of each row m in turn
    if t > 1:
        em = Emitter(body, names, indent="            ", counter=counter)
        lead = tuple(em.coords(Idx(x.shape[:-1], flat="m"))) if len(x.shape) > 1 else ()
        stores = ["\n".join(em.lines) + "\n" + _epilogue(
            body, e, names, counter, lead, "col", f"m * {n}u + col", "            ")]
    else:
        stores = [_epilogue(body, e, names, counter, _row_coords(x.shape, m), "wr",
                            f"{m * n}u + wr", "            ") for m in range(rows)]
    # the normalisation's factor of a row: 1 / sqrt(mean of its squares + eps)
    scale = (f" / {wgsl_literal(float(k), 'float32')} + "
             f"{wgsl_literal(float(e.params['rms_eps']), 'float32')}" if rms else "")
    wgsl = _env().get_template("quant_matmul.wgsl.j2").render(
        bindings=binds, helpers=_helpers(code + "\n".join(stores)), fmt=fmt, n=n, k=k, rows=rows,
        team=t, wg=wg, per_group=per_group, groups=groups,
        row_words=k // QUANT_BLOCK * QUANT_WORDS[fmt], units=u_row, step=step, body=code,
        strides=strides, out_count=per_group * rows, stores=stores, rms=rms, scale=scale,
        sub=t > 1 and bool(e.params.get("subgroups")))
    key = hashlib.sha256(wgsl.encode()).hexdigest()
    return KernelCode(kernel.params["name"], "quant", wgsl, grid_for(groups), len(body.inputs),
                      len(body.outputs), key=key)


def _generate_dequant(kernel: Eqn, target: str, workgroup_storage: int) -> KernelCode:
    body, e = _check(kernel, Op.DEQUANT)
    (words,) = e.inputs
    assert isinstance(words, Var)
    fmt = str(e.params["fmt"])
    n, k = (int(d) for d in e.params["shape"])
    binds, names = _bindings(body, tuple(kernel.params.get("inplace", ())), {"out0"})
    code = "\n".join("    " + s for s in _loads(fmt, 0, "u", "row * "
                                                 f"{k // QUANT_BLOCK * QUANT_WORDS[fmt]}u",
                                                 names[id(words)]) + _dequant(fmt, 0))
    total = n * units(k)
    groups = -(-total // WORKGROUP)
    wgsl = _env().get_template("quant_dequant.wgsl.j2").render(
        bindings=binds, helpers=_helpers(code), fmt=fmt, n=n, k=k, wg=WORKGROUP, total=total,
        units=units(k), body=code)
    key = hashlib.sha256(wgsl.encode()).hexdigest()
    return KernelCode(kernel.params["name"], "quant", wgsl, grid_for(groups), len(body.inputs),
                      len(body.outputs), key=key)


def generate(kernel: Eqn, target: str = "gpu", workgroup_storage: int = 16384) -> KernelCode:
    """WGSL for a kernel of kind "quant" (a qmatmul or a dequant)."""
    body: Program = kernel.params["body"]
    if any(e.op is Op.QMATMUL for e in body.eqns):
        return _generate_qmatmul(kernel, target, workgroup_storage)
    return _generate_dequant(kernel, target, workgroup_storage)
