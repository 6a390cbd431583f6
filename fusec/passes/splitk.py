"""Split-K for matmuls with few workgroups. A product with few rows or few columns (a batch of 8
rows through a layer, or a layer with 8 outputs) gives the 16x16 tiled kernel only a few hundred
workgroups, each walking the whole of K in sequence: about 5% of the memory bandwidth on the H200;
a small product with a long K leaves most of the GPU idle on the register-blocked template too.
Cutting K into S chunks turns it into a batched product of S partial results, (S, M, N), and a
sum over them: S times more workgroups, for a partial-results buffer of S * M * N elements. Later
passes treat the two like any matmul and reduction (an epilogue fuses into the sum).

S is a power of two; where it does not divide K, the chunks are ceil(K / S) long and K is padded
with zeros to S of them (a pad op, read through a clamped index and a select: no copy is made).
Small products become an elementwise product and a sum over K instead (see REDUCE_OUTPUTS).

A float16 product is split in float32 (its operands cast, which its kernels do as they load
them, then the sum cast back), so the partial results are not rounded to float16: the product
accumulates in float32 and rounds once, as it does unsplit.
"""

from __future__ import annotations

from .. import codegen
from ..ir import Eqn, Op, Program, Var
from .split import split_reductions
from .widen import widen

TILE_LIMIT = 1024  # products with fewer 16x16 output tiles than this are split...
GROUPS = 4096  # ...into at most this many workgroups...
MIN_CHUNK = 128  # ...each walking at least this much of K
# Products on the register-blocked template with K of at least RB_MIN_K and fewer workgroups than
# RB_GROUPS (an H100 has 132 SMs) are split too, into chunks of K of at least RB_MIN_CHUNK. On the
# H100 (trusted modules; us, unsplit / split by this rule, M x K x N): 512x4096x512 223 / 95 (8
# chunks), 64x4096x4096 237 / 109 (4), 256x4096x1024 220 / 98 (8), 128x8192x128 418 / 35 (16),
# 2048x4096x256 242 / 188 (4), 512x2048x2048 198 / 180 (2), 1024x2048x1024 189 / 183 (2). With
# K = 1024 a split gained 0-3% (512x1024x1024 60 / 58, 1024^3 97 / 96) for a second kernel, so
# those stay whole.
RB_GROUPS = 256
RB_MIN_K = 2048
RB_MIN_CHUNK = 512
# ...but a product on RB_WAVE or more of the large tiles (128x128) already fills the GPU once over
# (an H200 has 132 SMs): cutting it into chunks only adds their partial sums' kernel. The bench's
# transformer block's down projection, 2048x2816 @ 2816x1024 on 128 large tiles, was cut in 2:
# whole, the block took 1919-1923 us of GPU time against 1939-1941 (H200, 4 interleaved rounds;
# 1912-1922 against 1934-1937 in 3 more; bench/workload_probe.py).
RB_WAVE = 128
# Products with at most REDUCE_OUTPUTS outputs (a dot product; a few rows through a few
# columns) and at most REDUCE_COLUMNS columns become an elementwise product and a sum over K,
# where one of M and N is 1 or the product has at most REDUCE_WORK multiply-adds: the sum is one
# kernel where the product's split is two, but each output of the sum reads its own row of A and
# column of B, 2MN elements per step of K against the product's M + N. H100, us, as a sum / as a
# (split) product (M x K x N): 1x(2^21+3)x1 10.0 / 33.4, 8x4096x8 6.4 / 9.9, 64x4096x1 6.0 /
# 8.5, 16x4099x4 6.5 / 10.9; but 4x100000x3 14.0 / 10.8, 8x1000003x8 290 / 74.5, and with more
# outputs 16x4099x16 9.2 / 10.8, 1x99999x64 62 / 39, 32x50257x64 1228 / 45, 1x99999x1000 785 /
# 162. Unsplit, these products ran in a few workgroups: 1x(2^21+3)x1 42285 us, 8x1000003x8 40016.
# Products on the few-column template over vec4 rows (codegen.FEWCOL4): see fewcol4_chunks.
FEWCOL4_GROUPS = 512
FEWCOL4_MIN_CHUNK = 512
REDUCE_OUTPUTS = 64
REDUCE_COLUMNS = 16
REDUCE_WORK = 1 << 20


def chunks_for(m: int, k: int, n: int, target: str = "gpu") -> int:
    """How many chunks to cut K into (1: leave the product alone)."""
    if codegen.use_fewcol(m, n, k, 1, target):  # parallel enough along M already
        return 1
    if codegen.use_fewcol4(m, n, k, 1, target):
        return fewcol4_chunks(m, k)
    if codegen.use_gemv(m, n, target, k):  # a workgroup per 256 columns
        tiles = -(-n // codegen.WORKGROUP)
    else:  # a workgroup per 16x16 tile
        tiles = -(-m // codegen.TILE) * -(-n // codegen.TILE)
    if tiles >= TILE_LIMIT:
        return 1
    s = 1
    while k // (2 * s) >= MIN_CHUNK and tiles * 2 * s <= GROUPS:
        s *= 2
    return s


def fewcol4_chunks(m: int, k: int) -> int:
    """Chunks of K for a product on the few-column template over vec4 rows of A (see
    codegen.FEWCOL4): the most (a power of two) that keep FEWCOL4_GROUPS workgroups or fewer,
    chunks of FEWCOL4_MIN_CHUNK or more, and whole vec4s in each chunk (a chunk padded with zeros
    would not be read as vec4s). 4096x4096 @ 4096x8 on the H200: 8 chunks of 512, 27.6-28.3 us
    (16 of 256 28.5; bench/fewcol_proto.py)."""
    groups = -(-m // (codegen.WORKGROUP // codegen.FEWCOL4_LANES * codegen.FEWCOL4_ROWS))
    s = 1
    while (k // (2 * s) >= FEWCOL4_MIN_CHUNK and k % (8 * s) == 0
           and groups * 2 * s <= FEWCOL4_GROUPS):
        s *= 2
    return s


def rb_chunks_for(m: int, k: int, n: int, target: str = "gpu") -> int:
    """How many chunks to cut K into for a product on the register-blocked template: with K of at
    least RB_MIN_K, the fewest (a power of two) that give RB_GROUPS workgroups, as far as chunks
    of RB_MIN_CHUNK allow; none for a product whole on RB_WAVE or more of the large tiles. The
    chunks form a batch, which may take another tile than the whole product would."""
    def config(s: int) -> tuple[int, int, int, int, int]:
        cfg = codegen.matmul_config(m, n, target, -(-k // s), s)
        assert cfg is not None, "a product on the register-blocked template stays on it"
        return cfg

    def groups(s: int) -> int:
        # (128x192 tiles counted as the 128x128 ones they stand in for: codegen.MATMUL_LARGE_WIDE
        # is chosen to share the same columns out better)
        cfg = config(s)
        bm, bn = codegen.MATMUL_LARGE[:2] if cfg == codegen.MATMUL_LARGE_WIDE else cfg[:2]
        return s * -(-m // bm) * -(-n // bn)

    if k < RB_MIN_K or (codegen.large_tile(config(1)) and groups(1) >= RB_WAVE):
        return 1
    s = 1
    while groups(s) < RB_GROUPS and k // (2 * s) >= RB_MIN_CHUNK:
        s *= 2
    return s


def _chunks(prog: Program, e: Eqn, target: str) -> int:
    """Chunks to cut this equation's K into: 1 unless it is a 2-D product with too few
    workgroups for its template."""
    if e.op is not Op.MATMUL:
        return 1
    a, b = e.inputs
    if len(a.shape) != 2 or len(b.shape) != 2:
        return 1
    (m, k), n = a.shape, b.shape[1]
    if codegen.mm_config(e, target) is None:
        if codegen.use_rowk(m, n, k, 1, target) and codegen.rowk_operands(prog, e):
            return 1  # one dispatch over all of K (codegen.ROWK)
        return chunks_for(m, k, n, target)
    return rb_chunks_for(m, k, n, target)


def _as_sum_wanted(e: Eqn) -> bool:
    """Is ``e`` a small 2-D product, to compute as a sum (see REDUCE_OUTPUTS)?"""
    if e.op is not Op.MATMUL:
        return False
    a, b = e.inputs
    if len(a.shape) != 2 or len(b.shape) != 2:
        return False
    (m, k), n = a.shape, b.shape[1]
    return m * n <= REDUCE_OUTPUTS and n <= REDUCE_COLUMNS and (
        min(m, n) == 1 or m * n * k <= REDUCE_WORK)


def _as_sum(e: Eqn) -> list[Eqn]:
    """``a @ b`` as ``(a[:, :, None] * b[None]).sum(axis=1)`` (float16: in float32)."""
    a, b = e.inputs
    assert isinstance(a, Var) and isinstance(b, Var)
    (m, k), n = a.shape, b.shape[1]
    eqns: list[Eqn] = []
    a, b = widen(a, eqns), widen(b, eqns)
    a3, b3 = Var((m, k, 1), a.dtype), Var((1, k, n), b.dtype)
    prod = Var((m, k, n), a.dtype)
    out = e.out if e.out.dtype == a.dtype else Var(e.out.shape, a.dtype)
    eqns += [Eqn(Op.RESHAPE, (a,), (a3,), {"shape": (m, k, 1)}),
             Eqn(Op.RESHAPE, (b,), (b3,), {"shape": (1, k, n)}),
             Eqn(Op.MUL, (a3, b3), (prod,), {}),
             Eqn(Op.SUM, (prod,), (out,), {"axes": (1,)})]
    if out is not e.out:
        eqns.append(Eqn(Op.CAST, (out,), (e.out,), {"dtype": e.out.dtype}))
    return eqns


def split_k(prog: Program, target: str, sums: bool = True) -> Program:
    """Cut the K of products with too few workgroups into chunks; with ``sums`` (fusion on: the
    elementwise product must fuse into the sum, never be written out), compute some as sums over
    K instead (see REDUCE_OUTPUTS)."""
    if target != "gpu":
        return prog
    eqns: list[Eqn] = []
    made_sums = False
    for e in prog.eqns:
        if sums and _as_sum_wanted(e):
            eqns += _as_sum(e)
            made_sums = True
            continue
        s = _chunks(prog, e, target)
        if s == 1:
            eqns.append(e)
            continue
        a, b = e.inputs
        assert isinstance(a, Var) and isinstance(b, Var)
        (m, k), n = a.shape, b.shape[1]
        a, b = widen(a, eqns), widen(b, eqns)  # (casts only for float16: Vars stay Vars)
        assert isinstance(a, Var) and isinstance(b, Var)
        kc = -(-k // s)  # the last chunk is short where s does not divide K: zeros fill it
        if kc * s != k:
            ap, bp = Var((m, kc * s), a.dtype), Var((kc * s, n), b.dtype)
            eqns += [Eqn(Op.PAD, (a,), (ap,), {"widths": ((0, 0), (0, kc * s - k))}),
                     Eqn(Op.PAD, (b,), (bp,), {"widths": ((0, kc * s - k), (0, 0))})]
            a, b = ap, bp
        a3 = Var((m, s, kc), a.dtype)
        at = Var((s, m, kc), a.dtype)
        b3 = Var((s, kc, n), b.dtype)
        part = Var((s, m, n), a.dtype)
        total = e.out if e.out.dtype == a.dtype else Var(e.out.shape, a.dtype)
        eqns += [Eqn(Op.RESHAPE, (a,), (a3,), {"shape": (m, s, kc)}),
                 Eqn(Op.TRANSPOSE, (a3,), (at,), {"perm": (1, 0, 2)}),
                 Eqn(Op.RESHAPE, (b,), (b3,), {"shape": (s, kc, n)}),
                 Eqn(Op.MATMUL, (at, b3), (part,), {}),
                 Eqn(Op.SUM, (part,), (total,), {"axes": (0,)})]
        if total is not e.out:
            eqns.append(Eqn(Op.CAST, (total,), (e.out,), {"dtype": e.out.dtype}))
    out = Program(list(prog.inputs), eqns, list(prog.outputs))
    # the new sums over K are split like any long reduction (the pass leaves the rest as it is)
    return split_reductions(out, target) if made_sums else out
