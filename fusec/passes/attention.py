"""Attention written out (``softmax(q @ kt * scale + bias) @ v``) becomes one ``attention`` op,
computed by one kernel that never writes the S x T scores to memory (fusec.kernels.attention).

The pass looks for this chain, as ``fusec.nn.softmax`` traces it, from the last matmul back::

    s  = matmul(q, kt)            q[..., S, D], kt[..., D, T]
    s  = mul(s, c) | div(s, c)    optional, c a scalar literal
    s  = add(s, bias)             optional, bias broadcasting to [..., S, T]
    m  = reshape(reduce_max(s, last axis))
    e  = exp(sub(s, m))
    n  = reshape(sum(e, last axis))
    o  = matmul(div(e, n), v)     v[..., T, E]

Every value inside the chain must be used only by the chain (the scores or probabilities that a
program returns, or that a backward pass reads, keep it as it is). It is rewritten only where the
kernel pays (:func:`fusec.kernels.attention.fits`): float32 and head dims up to 32.
"""

from __future__ import annotations

from typing import Optional

from ..ir import Atom, Eqn, Lit, Op, Program, Var
from ..kernels.attention import fits, split_lanes
from .dce import dce
from .uses import Uses


def _last_axis_reduce(u: Uses, v: Atom, op: Op, src: Var, uses: int = 1) -> bool:
    """``v`` is reshape(op(src, last axis)) back to keepdims shape."""
    r = u.sole(v, Op.RESHAPE, uses)
    if r is None:
        return False
    red = u.sole(r.inputs[0], op)
    return (red is not None and red.inputs[0] is src
            and tuple(red.params["axes"]) == (len(src.shape) - 1,))


def _match(u: Uses, out: Eqn) -> Optional[tuple[list[Atom], float]]:
    """The inputs (q, kt, v[, bias]) and scale of the chain ending in matmul ``out``."""
    p, v = out.inputs
    div = u.sole(p, Op.DIV)
    if div is None:
        return None
    e, n = div.inputs
    exp = u.sole(e, Op.EXP, uses=2)  # e feeds the sum and the division
    if exp is None or not isinstance(e, Var):
        return None
    if not _last_axis_reduce(u, n, Op.SUM, e):
        return None
    sub = u.sole(exp.inputs[0], Op.SUB)
    if sub is None:
        return None
    s, m = sub.inputs
    if not isinstance(s, Var) or u.count.get(id(s), 0) != 2:  # the max and the subtraction
        return None
    if not _last_axis_reduce(u, m, Op.RMAX, s):
        return None
    # the scores: [add bias] after [scale] after the matmul
    bias: Optional[Atom] = None
    scale = 1.0
    cur: Atom = s
    add = u.producer.get(id(cur))
    if add is not None and add.op is Op.ADD:
        a0, a1 = add.inputs
        for x, b in ((a0, a1), (a1, a0)):
            if isinstance(x, Var) and isinstance(b, Var) and x.shape == s.shape and \
                    b.dtype == s.dtype:
                bias, cur = b, x
                break
        if bias is None:
            return None
        if cur is not s and u.count.get(id(cur), 0) != 1:
            return None
    sc = u.producer.get(id(cur))
    if sc is not None and sc.op in (Op.MUL, Op.DIV) and (cur is s or u.count.get(id(cur)) == 1):
        a0, a1 = sc.inputs
        if sc.op is Op.MUL and isinstance(a0, Lit) and isinstance(a1, Var):
            a0, a1 = a1, a0
        if isinstance(a1, Lit) and isinstance(a0, Var) and a1.value != 0:
            scale = float(a1.value) if sc.op is Op.MUL else 1.0 / float(a1.value)
            cur = a0
    mm = u.producer.get(id(cur))
    if mm is None or mm.op is not Op.MATMUL:
        return None
    if cur is not s and u.count.get(id(cur), 0) != 1:
        return None
    q, kt = mm.inputs
    ins = [q, kt, v] + ([bias] if bias is not None else [])
    if not all(isinstance(a, Var) and a.dtype == "float32" for a in ins):
        return None
    return ins, scale


def rewrite_attention(prog: Program, target: str = "gpu", subgroups: int = 0) -> Program:
    """Replace each attention chain (see the module's docstring) by one ``attention`` op; the
    chain's other equations become dead and are dropped. ``subgroups`` (Options.subgroups): where
    the device has subgroup operations, a query row's head dims may be split over several
    threads (:func:`fusec.kernels.attention.split_lanes`)."""
    if not any(e.op is Op.MATMUL for e in prog.eqns):
        return prog
    u = Uses(prog)
    found: dict[int, Eqn] = {}
    for e in prog.eqns:
        if e.op is not Op.MATMUL:
            continue
        hit = _match(u, e)
        if hit is None:
            continue
        ins, scale = hit
        q, kt, v = ins[:3]
        if not fits(q.shape, kt.shape, v.shape, target):
            continue
        # buffer_inputs (): the fusion pass reads the operands through their movement ops
        params = {"scale": scale, "bias": len(ins) > 3, "buffer_inputs": ()}
        split = split_lanes(q.shape, kt.shape, v.shape, target, subgroups)
        if split > 1:
            params["split"] = split
        found[id(e)] = Eqn(Op.ATTENTION, tuple(ins), (e.out,), params)
    if not found:
        return prog
    # the chains' other equations are dead now
    return dce(Program(list(prog.inputs), [found.get(id(e), e) for e in prog.eqns],
                       list(prog.outputs)))
