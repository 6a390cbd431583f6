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

from ..ir import Atom, Eqn, Lit, Op, Program, Var
from ..kernels.quant import fits
from .dce import dce
from .uses import Uses


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


def _params(dq: Eqn, subgroups: int) -> dict[str, object]:
    n, k = (int(d) for d in dq.params["shape"])
    # buffer_inputs: the words are a buffer; x is read through its movement ops (see
    # fusec.passes.fuse), a view of a buffer in place
    params: dict[str, object] = {"fmt": dq.params["fmt"], "n": n, "k": k, "buffer_inputs": (1,)}
    if subgroups:
        params["subgroups"] = True  # a team's sums meet through subgroup shuffles
    return params


def rewrite_quant(prog: Program, target: str = "gpu", subgroups: int = 0) -> Program:
    """Replace each product of few rows with a dequantised matrix (see the module's docstring)
    by a ``qmatmul``; dequants nothing else reads become dead and are dropped. ``subgroups``
    (Options.subgroups): the device's subgroup operations, which the kernels' teams use."""
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
            eqns.append(Eqn(Op.QMATMUL, (a, dq.inputs[0]), (e.out,), _params(dq, subgroups)))
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
            eqns.append(Eqn(Op.QMATMUL, (vt, dq.inputs[0]), (yt,), _params(dq, subgroups)))
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


# Fold a root-mean-square normalisation into the quantized product that alone reads it (GPUs;
# see fold_rms_norm). Off with 0. H200 at full clocks, the synthetic SmolLM2 decode step
# (bench/llama_synthetic.py --hold-clocks --settings "default;quant.FOLD_RMS_NORM=0", 30
# layers, interleaved rounds), folded / not: batch 1, 183 / 244 kernels, GPU 1.07 / 1.24 ms,
# step 1.92-2.14 / 2.33-2.37 ms; batch 8, 213 / 274 kernels, GPU 2.22 / 2.33 ms, step
# 2.97-3.05 / 3.30 ms.
FOLD_RMS_NORM = 1


def _lit(a: Atom) -> Optional[float]:
    return float(a.value) if isinstance(a, Lit) else None


def _rms_norm_of(u: Uses, x: Var) -> Optional[tuple[Var, Optional[Var], float]]:
    """If ``x`` is ``a * rsqrt(sum(a * a, last axis) / K + eps) [* g]`` (what
    :func:`fusec.nn.rms_norm` traces), every value of it read only inside it: (a, g or None,
    eps), else None."""
    k = x.shape[-1]
    top = u.sole(x, Op.MUL)
    g: Optional[Var] = None
    j: Atom = x
    if top is not None:  # [* g], g a weight of shape (K,)
        for y, w in (top.inputs, top.inputs[::-1]):
            if (isinstance(w, Var) and w.shape == (k,) and w.dtype == "float32"
                    and isinstance(y, Var) and y.shape == x.shape):
                inner = u.producer.get(id(y))
                if inner is not None and inner.op is Op.MUL and any(
                        isinstance(v, Var) and v.shape[-1:] == (1,) and len(v.shape) == len(x.shape)
                        for v in inner.inputs):
                    g, j = w, y
                    break
    mj = u.sole(j, Op.MUL)
    if mj is None:
        return None
    for a, r in (mj.inputs, mj.inputs[::-1]):
        if not (isinstance(a, Var) and isinstance(r, Var) and a.shape == x.shape
                and a.dtype == "float32" and r.shape == x.shape[:-1] + (1,)):
            continue
        rs = u.sole(r, Op.RSQRT)
        ad = u.sole(rs.inputs[0], Op.ADD) if rs is not None else None
        if ad is None:
            continue
        ms, c = ad.inputs if isinstance(ad.inputs[0], Var) else ad.inputs[::-1]
        eps = _lit(c)
        dv = u.sole(ms, Op.DIV)
        if eps is None or dv is None or _lit(dv.inputs[1]) != float(k):
            continue
        rh = u.sole(dv.inputs[0], Op.RESHAPE)
        sm = u.sole(rh.inputs[0], Op.SUM) if rh is not None else None
        if sm is None or tuple(sm.params["axes"]) != (len(x.shape) - 1,):
            continue
        sq = u.sole(sm.inputs[0], Op.MUL)
        if sq is None or sq.inputs[0] is not a or sq.inputs[1] is not a:
            continue
        return a, g, eps
    return None


def fold_rms_norm(prog: Program, target: str = "gpu") -> Program:
    """A quantized product whose x is a root-mean-square normalisation that nothing else reads
    (a llama block's two norms and the final one, before the products of a decode step) computes
    the normalisation itself: ``qmatmul(a, words[, g])`` with ``rms_eps``. Each weight row's
    team sums the squares of x's rows as it reads them for the product, and scales its sum by
    the row's ``rsqrt(mean + eps)`` at the end (the normalisation is a per-row factor, so
    ``(a * r * g) @ W = r * ((a * g) @ W)``): the reduction's kernel is gone. On GPUs: a
    software adapter's thread walks a whole weight row, and would sum a row's squares once per
    weight row."""
    if not FOLD_RMS_NORM or target != "gpu" or not any(e.op is Op.QMATMUL for e in prog.eqns):
        return prog
    u = Uses(prog)
    replace: dict[int, Eqn] = {}
    for e in prog.eqns:
        if e.op is not Op.QMATMUL or "rms_eps" in e.params:
            continue
        x = e.inputs[0]
        if not isinstance(x, Var) or u.count.get(id(x), 0) != 1:
            continue
        found = _rms_norm_of(u, x)
        if found is None:
            continue
        a, g, eps = found
        params = dict(e.params)
        params["rms_eps"] = eps
        inputs = (a, e.inputs[1]) + ((g,) if g is not None else ())
        replace[id(e)] = Eqn(Op.QMATMUL, inputs, e.outs, params)
    if not replace:
        return prog
    eqns = [replace.get(id(e), e) for e in prog.eqns]
    return dce(Program(list(prog.inputs), eqns, list(prog.outputs)))
