"""Kernels of kind "attention": ``softmax(q @ kt * scale + bias) @ v`` in one kernel
(:data:`fusec.ir.Op.ATTENTION`, made by :func:`fusec.passes.attention.rewrite_attention`).

A thread per query row (or :data:`SPLIT`, see there), :data:`ROWS` rows per workgroup. The
workgroup walks the keys in tiles
of ``tile`` keys: it loads the tile's keys and values into workgroup memory (each element once
per workgroup; a bias that broadcasts over the rows too, see :data:`STAGE_BIAS`), then each
thread goes through the tile :data:`CHUNK` keys at a time with an online softmax: the chunk's
scores, then, where their maximum exceeds the row's running maximum, the running sum and the
output accumulators rescaled by ``exp(old - new)``, then each key's weight ``exp(s - max)``
added to the sum and, times the key's value row, to the accumulators. The row's output is the
accumulators over the sum. The S x T scores never reach memory; q, k, v and the output are read
or written once per workgroup.

The head dims are unrolled (a thread holds its scaled query row and its accumulators in
registers), so the kernel is made for small head dims, up to :data:`MAX_HEAD` (:func:`fits`;
the measurements there: with wider heads the written-out plan is faster). Values
are read through :class:`fusec.emit.Emitter`, so a transposed or reshaped q, k or v (split
heads) and a broadcast bias are read in place.

NaN and infinities come out as the written-out softmax gives them: a NaN score, or a +inf one,
makes its row NaN; a -inf score weighs 0 (a row of -inf scores only is NaN, 0 / 0).

On GPUs, few query rows per head (a decode step) take the few-rows kernel instead, a workgroup
per row (:func:`few_rows`); over many keys, a workgroup per row and part of the keys
(``attention_parts``, :func:`key_parts`), and a kernel that combines the parts
(``attention_combine``): flash-decoding.
"""

from __future__ import annotations

import hashlib
import math

from .. import config
from ..emit import (
    LOOP_BUDGET,
    Emitter,
    Idx,
    KernelCode,
    _bindings,
    _env,
    _helpers,
    grid_for,
    update_window,
    window_stores,
)
from ..ir import Atom, Eqn, Op, Program, Shape, Var
from ..ops import part_keys, wgsl_literal

# query rows per workgroup (a head's rows where it has fewer). H200, GPU us, best of 2 rounds
# (bench/attention_ab.py --configs), rows x threads per row: 32x12 heads of 128x128, head dim
# 32: 64x1 87.6, 128x1 71.9, 32x2 105.2, 64x2 75.5, 128x2 62.7, 32x4 96.1, 64x4 83.5; 1x12 heads
# of 16x16: 1 thread per row 13.2-15.5, 2 8.6-9.0. (Each workgroup loads its head's keys and
# values: fewer, larger workgroups load them fewer times.) Two or four rows per thread, each key
# read from workgroup memory once for them all, measured no faster: 59.5-62.2 at 128x2 or 128x4.
ROWS = 128
# keys per tile, fewer where workgroup memory is short. H100, GPU us, best of 2 rounds
# (bench/attention_ab.py --configs 128x2x8x1x32), tiles of 32 / 64, at head dim 32: 32x12 heads
# of 128x128 46.3-46.4 / 47.9-48.0 (two leases), 4x12 of 512x512 103.2 / 106.2, 1x12 of 16x16
# 9.3 / 9.9; the MiniLM encoder at 32x128 2940-2944 / 2950-2953 (3 rounds). Tiles of 16 with 64
# rows a workgroup 46.8 (the architecture page has the other shapes tried).
MAX_TILE = 32
# head dims (q's and v's last) up to this take the kernel. H100, GPU time by timestamps, kernel
# against the written-out plan (matmul, softmax, matmul; bench/attention_ab.py), us: head dim
# 32: 32x12 heads of 128x128 89.7 / 117.3, 1x12 of 16x16 14.0 / 11.5 (but 1 kernel, not 3:
# wall 108 / 135); head dim 64: 1x4 of 128x128 45.5 / 21.4, 8x12 of 512x512 894 / 373, 4x8 of
# 1024x1024 1099 / 468. A thread per row holding 2 x 64 values runs too few threads at once.
MAX_HEAD = 32
# The few-rows kernel (a workgroup of FEW_THREADS per query row) takes attentions of at most
# FEW_ROWS query rows per head (a decode step: the query heads that share a KV head), head dims
# up to FEW_HEAD and up to FEW_KEYS keys (their scores held in 8 KiB of workgroup memory).
FEW_ROWS = 8
FEW_HEAD = 128
FEW_KEYS = 2048
# A workgroup of FEW_THREADS threads per query row; FEW_UNROLL keys whose values a thread loads
# before it weighs them. H100, the synthetic SmolLM2 step at batch 1 (GPU ms, 30 layers), 128 /
# 8 before, 256 / 16, 256 / 32: over 64 keys 1.14, 1.08, the same kernel (16 keys a part);
# over 1024 keys 2.93, 2.66, 2.48 (see the architecture page).
FEW_THREADS = 256
FEW_UNROLL = 32
# Flash-decoding: a few-rows attention over more than PART_KEYS keys is cut into parts of about
# PART_KEYS keys each (at most MAX_PARTS parts, and at most FEW_KEYS keys a part), a workgroup per
# query row and part (the attention_parts op), and a second kernel combines each row's parts
# (attention_combine): a decode step's 9 workgroups per layer otherwise walk every key of a long
# cache one after another. 0: only where a workgroup's scores would not fit (FEW_KEYS). H100,
# the synthetic SmolLM2 step at batch 1, GPU ms, parts of 64 / 128 / none: 256 keys 1.12 / 1.23
# / 1.33, 512 keys 1.11 / 1.22 / 1.71, 1024 keys 1.20 / 1.23 / 2.48; batch 8 over 1024 keys 3.01
# / 2.94 / 3.69 (the architecture page).
PART_KEYS = config.env_int("FUSEC_ATTENTION_PART_KEYS", 64)
MAX_PARTS = 32
COMBINE_THREADS = 64  # the combining kernel's workgroup (a thread per output value)
# Where the device has subgroup operations, a query row's head dims are split over SPLIT
# neighbouring threads of one subgroup (a WebGPU subgroup has at least 4): each holds its share
# of the query row and of the output accumulators, and the partial scores are summed with
# subgroupShuffleXor, so that every thread of the row has the same score, bit for bit (the same
# two sums in either order), and takes the same online-softmax steps. A thread per row runs too
# few threads at once to hide the chain of dependent arithmetic behind each key.
SPLIT = 2
# keys a thread weighs at a time (a power of two up to MAX_TILE): their scores are independent
# chains of arithmetic, and the running maximum, sum and accumulators are rescaled once per
# chunk, not once per key. H200, GPU us, 32x12 heads of 128x128 at head dim 32, best of 3
# rounds (bench/attention_ab.py --configs): a key at a time 62.1, chunks of 4 60.9, 8 59.3, 16
# 57.3 (staged bias); but in the MiniLM encoder (merged projections) 16 was slower than 8, 3141
# against 3112 us of GPU time.
CHUNK = 8
# Where the bias broadcasts over the query rows (a padding mask), the workgroup computes a
# tile's bias once into workgroup memory, beside its keys, instead of every row loading it
# (chunks of 8, as above: 62.1 us loaded by every row, 59.3 staged).
STAGE_BIAS = True
# The output stored as vec4s where the head dims allow (see generate).
VEC_STORES = 1
# The few-rows kernel's row maximum and sum of weights by subgroup reductions (subgroupMax,
# subgroupAdd), then one value per subgroup in workgroup memory, where the device has subgroup
# operations (the op's "subgroups" parameter): two barriers each in place of a tree's nine.
ROW_SUBGROUPS = 1


def _tile(d: int, e: int, storage: int, staged: bool = True) -> int:
    """Keys per tile: the most, a power of two up to MAX_TILE, whose keys and values (and a
    staged bias) fit."""
    t = MAX_TILE
    while t > 1 and t * (d + e + staged) * 4 > storage:
        t //= 2
    return t


def _few_rows_shape(q: Shape, kt: Shape, v: Shape, target: str) -> bool:
    """A decode step's attention, on a GPU: few query rows per head, head dims up to FEW_HEAD,
    some keys (however many)."""
    d, t, e = q[-1], kt[-1], v[-1]
    return (target == "gpu" and 0 < q[-2] <= FEW_ROWS and 0 < d <= FEW_HEAD
            and 0 < e <= FEW_HEAD and t > 0)


def few_rows(q: Shape, kt: Shape, v: Shape, target: str) -> bool:
    """Whether the few-rows kernel takes this attention (a workgroup per query row: a decode
    step's few rows per head, whatever the head dim up to FEW_HEAD, and keys whose scores fit
    FEW_KEYS floats of workgroup memory). On GPUs only: a software adapter runs each workgroup's
    loops for every one of its invocations."""
    return _few_rows_shape(q, kt, v, target) and kt[-1] <= FEW_KEYS


def key_parts(q: Shape, kt: Shape, v: Shape, target: str) -> int:
    """Parts the keys of a few-rows attention are cut into (:data:`PART_KEYS`): 1 where the
    attention is not cut (not a few-rows one, or over few keys), 0 where it cannot be computed in
    parts (more keys than MAX_PARTS parts of FEW_KEYS hold)."""
    t = kt[-1]
    if not _few_rows_shape(q, kt, v, target):
        return 1
    parts = max(-(-t // PART_KEYS) if PART_KEYS > 0 else 1, -(-t // FEW_KEYS))
    parts = min(parts, MAX_PARTS, t)
    if parts > 1:
        parts = -(-t // part_keys(t, parts))  # every part holds keys
    return 0 if part_keys(t, parts) > FEW_KEYS else parts


def fits(q: Shape, kt: Shape, v: Shape, target: str, storage: int = 16384) -> bool:
    """Whether a kernel takes this attention: the few-rows kernel (:func:`few_rows`), or the
    thread-per-row kernel for head dims up to MAX_HEAD, and on a software adapter (which ends a
    shader's loops after 65535 iterations in all) loops within budget."""
    d, t, e = q[-1], kt[-1], v[-1]
    if few_rows(q, kt, v, target) or key_parts(q, kt, v, target) > 1:
        return True
    if d > MAX_HEAD or e > MAX_HEAD or min(q[-2], d, t, e) == 0:
        return False
    tile = _tile(d, e, storage)
    if tile < 8:
        return False
    tiles = -(-t // tile)
    threads = min(ROWS, q[-2])  # a workgroup's (software adapters: a thread per row)
    # each tile, counted as the software adapter counts (every iteration and every exit test;
    # with one test per tile, keys past ~59,900 at head dim 1 came out wrong on lavapipe): the
    # loop over its chunks of keys, the loads of its keys, values and (staged) bias, the step
    per_tile = (-(-tile // min(CHUNK, tile)) + -(-tile * d // threads) + -(-tile * e // threads)
                + -(-tile // threads) + 5)
    return target == "gpu" or tiles * per_tile <= LOOP_BUDGET


def split_lanes(q: Shape, kt: Shape, v: Shape, target: str, subgroups: int) -> int:
    """Threads per query row in the thread-per-row kernel: SPLIT where the device has subgroup
    operations and both head dims split into whole vec4s, else 1."""
    d, e = q[-1], v[-1]
    if (SPLIT <= 1 or not subgroups or target != "gpu" or few_rows(q, kt, v, target)
            or d % (4 * SPLIT) or e % (4 * SPLIT)):
        return 1
    return SPLIT


def _value(body: Program, names: dict[int, str], counter: list[int], a: Atom, idx: Idx,
           indent: str) -> tuple[str, list[str]]:
    """``a`` at ``idx`` and the lines that compute it (an emitter of its own: each load site
    sits in its own scope of the kernel)."""
    em = Emitter(body, names, indent=indent, counter=counter)
    return em.value(a, idx), em.lines


def generate(kernel: Eqn, target: str = "gpu", workgroup_storage: int = 16384) -> KernelCode:
    """WGSL for a kernel of kind "attention"."""
    body: Program = kernel.params["body"]
    e = body.eqns[-1]
    if e.op is Op.ATTENTION_COMBINE:
        return _combine(kernel, body, e)
    assert e.op in (Op.ATTENTION, Op.ATTENTION_PARTS), \
        f"attention kernels compute attention, not {e.op}"
    q, kt, v = e.inputs[:3]
    bias = e.inputs[3] if e.params.get("bias") else None
    assert isinstance(q, Var) and isinstance(kt, Var) and isinstance(v, Var)
    out = body.outputs[0]
    assert isinstance(out, Var)
    batch = q.shape[:-2]
    nb = math.prod(batch)
    s_len, d, t_len, e_len = q.shape[-2], q.shape[-1], kt.shape[-1], v.shape[-1]
    # a bias the same for every query row (its row axis broadcast) is staged per tile
    staged = bias is not None and STAGE_BIAS and (len(bias.shape) < 2 or bias.shape[-2] == 1)
    tile = _tile(d, e_len, workgroup_storage, staged)
    inplace = tuple(kernel.params.get("inplace", ()))
    counter = [0]

    # the batch coordinates of the workgroup's (flattened) batch index bh
    bcoords: list[str] = []
    prelude: list[str] = []
    stride = nb
    for k, dim in enumerate(batch):
        stride //= dim
        name = f"b{k}"
        expr = "bh" if stride == 1 else f"bh / {stride}u"
        prelude.append(f"    let {name} = ({expr}) % {dim}u;")
        bcoords.append(name)
    bc = tuple(bcoords)

    scale = wgsl_literal(float(e.params["scale"]), "float32")
    if e.op is Op.ATTENTION_PARTS or few_rows(q.shape, kt.shape, v.shape, target):
        return _few_rows(kernel, body, e, bc, "\n".join(prelude), scale)
    # head dims that are multiples of 4: the rows and tiles as vec4 (a quarter of the
    # workgroup-memory reads, and dot products)
    vec = d % 4 == 0 and e_len % 4 == 0
    lanes = 4 if vec else 1
    # ... and the output stored as vec4s: one 16-byte store where there were four 4-byte ones
    # (unless an input is read through the output's binding, written in place)
    out_vec = vec and VEC_STORES and not inplace
    binds, names = _bindings(body, inplace, {"out0"} if out_vec else None)
    split = int(e.params.get("split", 1))  # threads per row (split_lanes); thread part's share
    assert split & (split - 1) == 0 and (
        split == 1 or (vec and d % (4 * split) == 0 and e_len % (4 * split) == 0))
    # (a workgroup of at most 256 invocations: WebGPU's default limit)
    rows = min(ROWS, s_len, 256 // split)
    row_blocks = -(-s_len // rows)
    q_loads: list[str] = []
    for j in range(0, d // split, lanes):
        vals = []
        for jj in range(j, j + lanes):
            col = f"{jj}u" if split == 1 else f"(qd + {jj}u)"
            val, lines = _value(body, names, counter, q,
                                Idx(q.shape, coords=bc + ("r", col)), "    ")
            q_loads += lines
            vals.append(val)
        v0 = f"vec4<f32>({', '.join(vals)})" if vec else vals[0]
        q_loads.append(f"    let q{j // lanes} = {v0} * {scale};")

    def tile_load(a: Var, coords: tuple[str, str], lane_axis: int) -> tuple[str, list[str]]:
        """The tile element at ``coords`` (its head-dim coordinate at ``lane_axis``), or with
        vec4, the 4 elements from there along the head dim."""
        if not vec:
            return _value(body, names, counter, a, Idx(a.shape, coords=bc + coords),
                          "            ")
        vals, lines = [], []
        for lane in range(4):
            c = tuple(f"({x} + {lane}u)" if i == lane_axis else x for i, x in enumerate(coords))
            val, ls = _value(body, names, counter, a, Idx(a.shape, coords=bc + c),
                             "            ")
            vals.append(val)
            lines += ls
        return f"vec4<f32>({', '.join(vals)})", lines

    k_val, k_lines = tile_load(kt, ("kd", "kt"), 0)
    v_val, v_lines = tile_load(v, ("vt", "ve"), 1)
    bias_val, bias_lines = "", []
    if bias is not None:
        scores = q.shape[:-1] + (t_len,)
        em = Emitter(body, names, indent="            " if staged else "                ",
                     counter=counter)
        idx = em.unbroadcast(Idx(scores, coords=bc + ("r", "t")), bias.shape)
        bias_val = em.value(bias, idx)
        bias_lines = em.lines
    code = "\n".join(q_loads + k_lines + v_lines + bias_lines)
    chunk = max(1, min(CHUNK, tile))
    assert chunk & (chunk - 1) == 0 and tile % chunk == 0
    wgsl = _env().get_template("attention.wgsl.j2").render(
        bindings=binds, helpers=_helpers(code), rows=rows, tile=tile, d=d, e=e_len,
        s=s_len, t=t_len, nb=nb, row_blocks=row_blocks, prelude="\n".join(prelude),
        q_loads="\n".join(q_loads), k_lines="\n".join(k_lines), k_val=k_val,
        v_lines="\n".join(v_lines), v_val=v_val, bias_lines="\n".join(bias_lines),
        bias_val=bias_val, lanes=lanes, out_vec=out_vec, split=split, chunk=chunk,
        ragged=t_len % chunk != 0,
        staged_bias=staged,
        shuffle_masks=[1 << i for i in range(split.bit_length() - 1)],
        ty="vec4<f32>" if vec else "f32")
    key = hashlib.sha256(wgsl.encode()).hexdigest()
    return KernelCode(kernel.params["name"], "attention", wgsl, grid_for(nb * row_blocks),
                      len(body.inputs) - len(inplace), len(body.outputs), key=key)


def _few_rows(kernel: Eqn, body: Program, e: Eqn, bc: tuple[str, ...], prelude: str,
              scale: str) -> KernelCode:
    """The few-rows kernel (templates/attention_rows.wgsl.j2): a workgroup per query row, or
    per query row and part of the keys (attention_parts)."""
    q, kt, v = e.inputs[:3]
    bias = e.inputs[3] if e.params.get("bias") else None
    assert isinstance(q, Var) and isinstance(kt, Var) and isinstance(v, Var)
    batch = q.shape[:-2]
    nb = math.prod(batch)
    s_len, d, t_len, e_len = q.shape[-2], q.shape[-1], kt.shape[-1], v.shape[-1]
    # in parts (attention_parts): workgroup (row, part) takes keys t0 .. t0 + cn - 1
    kparts = int(e.params["parts"]) if e.op is Op.ATTENTION_PARTS else 1
    chunk = part_keys(t_len, kparts)
    assert chunk <= FEW_KEYS
    inplace = tuple(kernel.params.get("inplace", ()))
    binds, names = _bindings(body, inplace)
    counter = [0]
    # a cache update folded in (fusec.passes.attention.fold_cache_update): its outputs, the last
    # ones, stored over their window by every workgroup before the attention reads them
    folded = int(kernel.params.get("window", 0))
    window_lines: list[str] = []
    window_n = 0
    if folded:
        which = list(range(len(body.outputs) - folded, len(body.outputs)))
        window = update_window(body, inplace, which)
        assert window is not None, "a folded cache update is a window update"
        lines, stores, window_n = window_stores(body, names, window, which, "continue",
                                                "        ", counter)
        window_lines = lines + stores
    q_val, q_lines = _value(body, names, counter, q, Idx(q.shape, coords=bc + ("r", "qd")),
                            "        ")

    def unrolled(a: Var, coords: list[tuple[str, str]], indent: str) -> tuple[list[str], list[str]]:
        """``a`` at each of ``coords`` (after the batch coordinates): values and their lines."""
        vals: list[str] = []
        lines: list[str] = []
        for c in coords:
            val, ls = _value(body, names, counter, a, Idx(a.shape, coords=bc + c), indent)
            vals.append(val)
            lines += ls
        return vals, lines

    k_vals, k_lines = unrolled(kt, [(f"{kd}u", "t") for kd in range(d)], "        ")
    parts = max(1, FEW_THREADS // e_len)
    unroll = max(1, min(FEW_UNROLL, -(-chunk // parts)))
    v_keys = [f"vt{u}" if kparts == 1 else f"(t0 + vt{u})" for u in range(unroll)]
    v_vals, v_lines = unrolled(v, [(k, "ve") for k in v_keys], "            ")
    bias_val, bias_lines = "", []
    if bias is not None:
        em = Emitter(body, names, indent="        ", counter=counter)
        idx = em.unbroadcast(Idx(q.shape[:-1] + (t_len,), coords=bc + ("r", "t")), bias.shape)
        bias_val = em.value(bias, idx)
        bias_lines = em.lines
    code = "\n".join(window_lines + q_lines + k_lines + v_lines + bias_lines)
    wgsl = _env().get_template("attention_rows.wgsl.j2").render(
        bindings=binds, helpers=_helpers(code), wg=FEW_THREADS, d=d, e=e_len, s=s_len, t=t_len,
        nb=nb, prelude=prelude, scale=scale, q_lines="\n".join(q_lines), q_val=q_val,
        k_lines="\n".join(k_lines), k_vals=k_vals, v_lines="\n".join(v_lines), v_vals=v_vals,
        bias_lines="\n".join(bias_lines), bias_val=bias_val, cols=e_len, parts=parts,
        unroll=unroll, window_lines="\n".join(window_lines), window_n=window_n,
        kparts=kparts, chunk=chunk,
        sub=bool(ROW_SUBGROUPS) and bool(e.params.get("subgroups")))
    key = hashlib.sha256(wgsl.encode()).hexdigest()
    return KernelCode(kernel.params["name"], "attention", wgsl, grid_for(nb * s_len * kparts),
                      len(body.inputs) - len(inplace), len(body.outputs), key=key)


def _combine(kernel: Eqn, body: Program, e: Eqn) -> KernelCode:
    """attention_combine (templates/attention_combine.wgsl.j2): a thread per output value
    rescales the row's parts to the row's maximum score."""
    parts_in = e.inputs[0]
    assert isinstance(parts_in, Var) and body.outputs[0] is e.out
    *lead, kparts, e2 = parts_in.shape
    e_len = e2 - 2
    rows = math.prod(lead)
    binds, names = _bindings(body, tuple(kernel.params.get("inplace", ())))
    assert not kernel.params.get("inplace"), "attention_combine writes a buffer of its own"
    counter = [0]

    def load(p: int, col: str) -> tuple[str, list[str]]:
        """Part p's value at column ``col`` of the thread's row (row-major [..., S, P, E + 2])."""
        flat = f"(row * {kparts * e2}u + {p * e2}u + {col})"
        return _value(body, names, counter, parts_in, Idx(parts_in.shape, flat=flat), "    ")

    ms: list[str] = []
    os_: list[str] = []
    ls: list[str] = []
    lines: list[str] = []
    for p in range(kparts):
        for dest, col in ((ms, f"{e_len}u"), (ls, f"{e_len + 1}u"), (os_, "c")):
            val, ln = load(p, col)
            dest.append(val)
            lines += ln
    code = "\n".join(lines)
    wgsl = _env().get_template("attention_combine.wgsl.j2").render(
        bindings=binds, helpers=_helpers(code), wg=COMBINE_THREADS, rows=rows, e=e_len,
        kparts=kparts, loads=code, m_vals=ms, l_vals=ls, o_vals=os_)
    key = hashlib.sha256(wgsl.encode()).hexdigest()
    groups = -(-rows * e_len // COMBINE_THREADS)
    return KernelCode(kernel.params["name"], "attention", wgsl, grid_for(groups),
                      len(body.inputs), len(body.outputs), key=key)
