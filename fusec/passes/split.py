"""Multi-stage reductions: a reduction of a very long row into few outputs (e.g. a whole array to a
scalar) would give the GPU only a workgroup or two. It becomes a ``reduce_partial`` over chunks of
the row, one workgroup each, followed by a small reduction of the partial results: both on the GPU.
"""

from __future__ import annotations

import math

from ..ir import REDUCE, Eqn, Op, Program, Var

SPLIT_MIN = 1 << 16  # rows at least this long are split...
SPLIT_MAX_OUTPUTS = 64  # ...when there are at most this many of them
CHUNK = 8192  # elements per partial workgroup
MAX_CHUNKS = 1024


def split_reductions(prog: Program) -> Program:
    eqns: list[Eqn] = []
    for e in prog.eqns:
        if e.op not in REDUCE:
            eqns.append(e)
            continue
        src = e.inputs[0]
        axes = tuple(e.params["axes"])
        r = math.prod(src.shape[k] for k in axes)
        n_out = e.out.size
        if r < SPLIT_MIN or n_out > SPLIT_MAX_OUTPUTS:
            eqns.append(e)
            continue
        chunks = min(-(-r // CHUNK), MAX_CHUNKS)
        part = Var(e.out.shape + (chunks,), e.out.dtype)
        eqns.append(Eqn(Op.PARTIAL, (src,), (part,),
                        {"reduce": e.op.value, "axes": axes, "chunks": chunks}))
        eqns.append(Eqn(e.op, (part,), (e.out,), {"axes": (len(e.out.shape),)}))
    return Program(list(prog.inputs), eqns, list(prog.outputs))
