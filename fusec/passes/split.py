"""Multi-stage reductions: a reduction of a very long row into few outputs (e.g. a whole array to a
scalar) would give the GPU only a workgroup or two. It becomes a ``reduce_partial`` over chunks of
the row, one workgroup each, followed by a small reduction of the partial results: both on the GPU.
On GPUs, reductions over leading axes (columns) with too few columns to fill the GPU are split the
same way along their columns (see codegen.partial_layout for how the chunks are read).
"""

from __future__ import annotations

import math

from .. import codegen
from ..ir import REDUCE, Eqn, Op, Program, Var, reduced_ends

SPLIT_MIN = 1 << 16  # rows at least this long are split...
SPLIT_MAX_OUTPUTS = 64  # ...when there are at most this many of them
CHUNK = 8192  # elements per partial workgroup
MAX_CHUNKS = 1024
# GPUs only: a reduction over leading axes (columns, such as x.sum(axis=0)) runs a thread per
# column, too few threads to load at the memory's speed unless there are very many columns. It
# is split along the columns, aiming at COLUMN_THREADS threads, each reducing at least COLUMN_MIN
# elements of one column.
# (H200, column sums of 2^26 float32: 8192 x 8192 3133 -> 77 us, 65536 x 1024 412 -> 73,
# 1024 x 65536 396 -> 71; 2^17 threads gave 78-88 us, 2^16 111-139)
COLUMN_THREADS = 1 << 18
COLUMN_MIN = 64


def _chunks(r: int, n_out: int, leading: bool, trailing: bool, target: str) -> int:
    """How many chunks a reduction of ``n_out`` rows or columns of ``r`` elements is split into
    (1: not split). Up to codegen.FLAT_COLUMNS columns on GPUs, a workgroup reads a chunk of
    rows as one run of elements: chunks of CHUNK elements (whole rows), at most MAX_CHUNKS, as
    long rows get. More columns (a thread per chunk of a column) aim at COLUMN_THREADS threads
    even where few and long: split like long rows, 64 columns of 2^20 got 8192 threads and took
    658 us on the H100, against 99 us so (see codegen.partial_layout)."""
    if codegen.partial_layout(leading, trailing, n_out, target) == "flat":
        return max(1, min(-(-r * n_out // CHUNK), MAX_CHUNKS, r))
    columns = target == "gpu" and leading and not trailing and n_out < COLUMN_THREADS
    column_chunks = max(1, min(-(-COLUMN_THREADS // n_out), r // COLUMN_MIN)) if columns else 1
    if columns and n_out >= codegen.PARTIAL_COLUMNS_MIN:
        return column_chunks
    # on the "cpu" target whatever the outputs: a thread's loop over a whole long row would pass
    # the software adapter's loop limit (see codegen.SOFTWARE_LOOP_LIMIT)
    if r >= SPLIT_MIN and (n_out <= SPLIT_MAX_OUTPUTS or target == "cpu"):
        return min(-(-r // CHUNK), MAX_CHUNKS)
    return column_chunks


def split_reductions(prog: Program, target: str = "gpu") -> Program:
    eqns: list[Eqn] = []
    for e in prog.eqns:
        if e.op not in REDUCE:
            eqns.append(e)
            continue
        src = e.inputs[0]
        axes = tuple(e.params["axes"])
        r = math.prod(src.shape[k] for k in axes)
        leading, trailing = reduced_ends(len(src.shape), axes)
        chunks = _chunks(r, e.out.size, leading, trailing, target)
        if chunks < 2:
            eqns.append(e)
            continue
        part = Var(e.out.shape + (chunks,), e.out.dtype)
        eqns.append(Eqn(Op.PARTIAL, (src,), (part,),
                        {"reduce": e.op.value, "axes": axes, "chunks": chunks}))
        eqns.append(Eqn(e.op, (part,), (e.out,), {"axes": (len(e.out.shape),)}))
    return Program(list(prog.inputs), eqns, list(prog.outputs))
