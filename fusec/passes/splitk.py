"""Split-K for skinny matmuls. A product with few rows or few columns (a batch of 8 rows through a
layer, or a layer with 8 outputs) gives the 16x16 tiled kernel only a few hundred workgroups, each
walking the whole of K in sequence: about 5% of the memory bandwidth on the H200. Cutting K into S
chunks turns it into a batched product of S partial results, (S, M, N), and a sum over them:
S times more workgroups, for a partial-results buffer of S * M * N elements. Later passes treat the
two like any matmul and reduction (an epilogue fuses into the sum).
"""

from __future__ import annotations

from .. import codegen
from ..ir import Eqn, Op, Program, Var

TILE_LIMIT = 1024  # products with fewer 16x16 output tiles than this are split...
GROUPS = 4096  # ...into at most this many workgroups...
MIN_CHUNK = 128  # ...each walking at least this much of K


def chunks_for(m: int, k: int, n: int, target: str = "gpu") -> int:
    """How many chunks to cut K into (1: leave the product alone)."""
    if codegen.use_fewcol(m, n, 1, target):  # parallel enough along M already
        return 1
    if codegen.use_gemv(m, n, target):  # a workgroup per 256 columns
        tiles = -(-n // codegen.WORKGROUP)
    else:  # a workgroup per 16x16 tile
        tiles = -(-m // codegen.TILE) * -(-n // codegen.TILE)
    if tiles >= TILE_LIMIT:
        return 1
    s = 1
    while k % (2 * s) == 0 and k // (2 * s) >= MIN_CHUNK and tiles * 2 * s <= GROUPS:
        s *= 2
    return s


def _chunks(e: Eqn, target: str) -> int:
    """Chunks to cut this equation's K into: 1 unless it is a 2-D product that the register-blocked
    template would not take (that one has parallelism enough)."""
    if e.op is not Op.MATMUL:
        return 1
    a, b = e.inputs
    if len(a.shape) != 2 or len(b.shape) != 2:
        return 1
    (m, k), n = a.shape, b.shape[1]
    return chunks_for(m, k, n, target) if codegen.mm_config(e, target) is None else 1


def split_k(prog: Program, target: str) -> Program:
    if target != "gpu":
        return prog
    eqns: list[Eqn] = []
    for e in prog.eqns:
        s = _chunks(e, target)
        if s == 1:
            eqns.append(e)
            continue
        a, b = e.inputs
        assert isinstance(a, Var) and isinstance(b, Var)
        (m, k), n = a.shape, b.shape[1]
        kc = k // s
        a3 = Var((m, s, kc), a.dtype)
        at = Var((s, m, kc), a.dtype)
        b3 = Var((s, kc, n), b.dtype)
        part = Var((s, m, n), e.out.dtype)
        eqns += [Eqn(Op.RESHAPE, (a,), (a3,), {"shape": (m, s, kc)}),
                 Eqn(Op.TRANSPOSE, (a3,), (at,), {"perm": (1, 0, 2)}),
                 Eqn(Op.RESHAPE, (b,), (b3,), {"shape": (s, kc, n)}),
                 Eqn(Op.MATMUL, (at, b3), (part,), {}),
                 Eqn(Op.SUM, (part,), (e.out,), {"axes": (0,)})]
    return Program(list(prog.inputs), eqns, list(prog.outputs))
