"""Products with a quantized matrix and few rows become one ``qmatmul``, computed by one kernel
that dequantises the weights in registers (fusec.kernels.quant): each weight word is read once
and the dequantised matrix never reaches memory.

:func:`fusec.quant.matmul` (and a user's ``x @ fusec.quant.dequantize(q).T``) traces::

    w  = dequant(words)              f32[N, K]
    wt = transpose(w)                f32[K, N]
    [wt = broadcast(wt)]             f32[..., K, N]   (x with batch axes, written with @)
    y  = matmul(x, wt)               x f32[..., M, K] -> f32[..., M, N]

which becomes ``y = qmatmul(x, words)``; and ``w @ v`` (the matrix on the left, v f32[K, M]) becomes
the transpose of ``qmatmul(v^T, words)``. It is rewritten only where the kernel pays
(:func:`fusec.kernels.quant.fits`: at most QMATMUL_M rows of x in all, see there); products with
more rows (a prompt's prefill) keep the dequant kernel and the tiled matmul. The dequant stays as
long as anything else reads it (dce drops it otherwise). A fusion: unfused plans keep the matmul.
"""

from __future__ import annotations

import math
from typing import Optional

from ..ir import Atom, Eqn, Op, Program, Var
from ..kernels.quant import fits
from .dce import dce


def _through(producer: dict[int, Eqn], v: Atom) -> Optional[Var]:
    """The 2-D value that ``v`` broadcasts along leading batch axes (``v`` itself when it is
    2-D), or None."""
    if not isinstance(v, Var):
        return None
    while len(v.shape) > 2:
        e = producer.get(id(v))
        if e is None or e.op not in (Op.BROADCAST, Op.RESHAPE):
            return None
        src = e.inputs[0]
        if (not isinstance(src, Var) or src.shape[-2:] != v.shape[-2:]
                or len(src.shape) > len(v.shape) or any(d != 1 for d in src.shape[:-2])):
            return None
        v = src
    return v if len(v.shape) == 2 else None


def _dequant_of(producer: dict[int, Eqn], v: Optional[Var], transposed: bool
                ) -> Optional[Eqn]:
    """The dequant ``v`` is (or, ``transposed``, the transpose of), or None."""
    if v is None:
        return None
    e = producer.get(id(v))
    if transposed:
        if e is None or e.op is not Op.TRANSPOSE or tuple(e.params["perm"]) != (1, 0):
            return None
        src = e.inputs[0]
        e = producer.get(id(src)) if isinstance(src, Var) else None
    return e if e is not None and e.op is Op.DEQUANT else None


def _params(dq: Eqn) -> dict[str, object]:
    n, k = (int(d) for d in dq.params["shape"])
    # buffer_inputs: the words are a buffer; x is read through its movement ops (see
    # fusec.passes.fuse), a view of a buffer in place
    return {"fmt": dq.params["fmt"], "n": n, "k": k, "buffer_inputs": (1,)}


def rewrite_quant(prog: Program, target: str = "gpu") -> Program:
    """Replace each product of few rows with a dequantised matrix (see the module's docstring)
    by a ``qmatmul``; dequants nothing else reads become dead and are dropped."""
    if not any(e.op is Op.DEQUANT for e in prog.eqns):
        return prog
    producer = {id(o): e for e in prog.eqns for o in e.outs}
    eqns: list[Eqn] = []
    changed = False
    for e in prog.eqns:
        if e.op is not Op.MATMUL:
            eqns.append(e)
            continue
        a, b = e.inputs
        assert isinstance(a, Var) and isinstance(b, Var)
        batch = a.shape[:-2]
        rows = math.prod(a.shape[:-1])
        # x @ dequant(words).T
        dq = _dequant_of(producer, _through(producer, b), transposed=True)
        if dq is not None and fits(rows, b.shape[-1], a.shape[-1], target):
            eqns.append(Eqn(Op.QMATMUL, (a, dq.inputs[0]), (e.out,), _params(dq)))
            changed = True
            continue
        # dequant(words) @ v: (v^T @ dequant(words).T)^T
        dq = _dequant_of(producer, _through(producer, a), transposed=False)
        if dq is not None and fits(math.prod(b.shape[:-2]) * b.shape[-1], a.shape[-2],
                                   a.shape[-1], target):
            perm = tuple(range(len(batch))) + (len(batch) + 1, len(batch))
            vt = Var(batch + (b.shape[-1], b.shape[-2]), b.dtype)
            yt = Var(batch + (b.shape[-1], a.shape[-2]), e.out.dtype)
            # a single column: the transposes only move a unit axis (reshapes, no copies)
            if b.shape[-1] == 1:
                eqns.append(Eqn(Op.RESHAPE, (b,), (vt,), {"shape": vt.shape}))
            else:
                eqns.append(Eqn(Op.TRANSPOSE, (b,), (vt,), {"perm": perm}))
            eqns.append(Eqn(Op.QMATMUL, (vt, dq.inputs[0]), (yt,), _params(dq)))
            if b.shape[-1] == 1:
                eqns.append(Eqn(Op.RESHAPE, (yt,), (e.out,), {"shape": e.out.shape}))
            else:
                eqns.append(Eqn(Op.TRANSPOSE, (yt,), (e.out,), {"perm": perm}))
            changed = True
            continue
        eqns.append(e)
    if not changed:
        return prog
    return dce(Program(list(prog.inputs), eqns, list(prog.outputs)))
