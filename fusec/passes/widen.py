"""float16 operands of the ops whose kernels compute in float32 buffers: widened around the op.

float16 is a storage type (:mod:`fusec.dtypes`): elementwise, reduction and matmul kernels load
f16 elements as f32 and round what they store. A value a kernel stores is rounded, though, so
where a computation passes values between kernels, float16 between them would round partial
results. And the kernels of other kinds (scatter, scan, sort: :mod:`fusec.kernels`) work on
32-bit words: atomics on u32, sort keys, tiles of scan carries. So before those are lowered:

* ``sum`` and ``reduce_prod`` of float16 become ``cast`` to float32, the reduction, ``cast`` back:
  the split pass's partial results (and split_k's) are then float32, so the whole reduction
  accumulates in float32 and rounds once. The casts fuse into the reduction's kernel (a prologue
  and an epilogue), so an unsplit row reduction is still one kernel reading f16;
* ``cumulative`` (cumsum, cumprod, cummax, cummin), ``scatter``, ``argsort``, ``sort`` and
  ``searchsorted`` of float16 the same way (every float16 is exactly a float32, so the sorts and
  the max/min scans give the same values; sums and products accumulate in float32).

max and min reductions stay float16 (they are exact) and ``matmul`` does too (its kernels
accumulate in f32 registers; split_k widens the chunks it cuts a product into).
"""

from __future__ import annotations

from ..ir import Atom, Eqn, Lit, Op, Program, Var

# ops widened when an operand or the result is float16
WIDENED = frozenset({Op.SUM, Op.PROD, Op.CUMULATIVE, Op.SCATTER, Op.ARGSORT, Op.SORT,
                     Op.SEARCHSORTED})


def widen(a: Atom, eqns: list[Eqn]) -> Atom:
    """``a`` as float32 if it is float16 (a cast appended to ``eqns``), else as it is."""
    if a.dtype != "float16":
        return a
    if isinstance(a, Lit):
        return Lit(float(a.value), "float32")
    w = Var(a.shape, "float32")
    eqns.append(Eqn(Op.CAST, (a,), (w,), {"dtype": "float32"}))
    return w


def widen_float16(prog: Program) -> Program:
    """Widen the float16 operands of the ops in WIDENED (see the module's docstring)."""
    if not any(e.op in WIDENED for e in prog.eqns):
        return prog
    eqns: list[Eqn] = []
    for e in prog.eqns:
        if e.op not in WIDENED or not any(a.dtype == "float16" for a in (*e.inputs, *e.outs)):
            eqns.append(e)
            continue
        ins = tuple(widen(a, eqns) for a in e.inputs)
        outs = tuple(Var(o.shape, "float32") if o.dtype == "float16" else o for o in e.outs)
        eqns.append(Eqn(e.op, ins, outs, dict(e.params)))
        for o, w in zip(e.outs, outs):
            if w is not o:
                eqns.append(Eqn(Op.CAST, (w,), (o,), {"dtype": "float16"}))
    return Program(list(prog.inputs), eqns, list(prog.outputs))
