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

Where the kernel does not pay (wider heads) the chain stays written out, but on GPUs its last
product computes the probabilities as it loads them (:func:`_probabilities_in_product`)::

    o = div(matmul(e, v), n)      the matmul marked ``a_prologue``: e = exp(s - m) not written

so the softmax's kernel only reduces the rows (m and n), and the S x T probabilities never reach
memory: the product's kernel computes ``exp(s - m)`` where it loads A, and divides each output
row by its sum in its epilogue.
"""

from __future__ import annotations

import math
from typing import Optional

from .. import codegen, config
from ..emit import update_window, window_shape
from ..ir import Atom, Eqn, Lit, Op, Program, Var
from ..kernels.attention import few_rows, fits, key_parts, split_lanes
from .dce import dce
from .splitk import rb_chunks_for
from .uses import Uses


def _last_axis_reduce(u: Uses, v: Atom, op: Op, src: Var, uses: int = 1) -> bool:
    """``v`` is reshape(op(src, last axis)) back to keepdims shape."""
    r = u.sole(v, Op.RESHAPE, uses)
    if r is None:
        return False
    red = u.sole(r.inputs[0], op)
    return (red is not None and red.inputs[0] is src
            and tuple(red.params["axes"]) == (len(src.shape) - 1,))


# On GPUs, a written-out attention's probabilities are computed by the p @ v product as it loads
# them (see the module's docstring) where v has at most this many columns (the product's tiles
# then span them once or twice, so each probability's exp is computed once or twice); 0: never.
PROBS_IN_PRODUCT = config.env_int("FUSEC_PROBS_IN_PRODUCT", 256)


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


def rewrite_attention(prog: Program, target: str = "gpu", subgroups: int = 0,
                      workgroup_storage: int = codegen.WORKGROUP_STORAGE) -> Program:
    """Replace each attention chain (see the module's docstring) by one ``attention`` op; the
    chain's other equations become dead and are dropped. ``subgroups`` (Options.subgroups): where
    the device has subgroup operations, a query row's head dims may be split over several
    threads (:func:`fusec.kernels.attention.split_lanes`)."""
    if not any(e.op is Op.MATMUL for e in prog.eqns):
        return prog
    u = Uses(prog)
    found: dict[int, Eqn | list[Eqn]] = {}
    for e in prog.eqns:
        if e.op is not Op.MATMUL:
            continue
        hit = _match(u, e)
        if hit is None:
            continue
        ins, scale = hit
        q, kt, v = ins[:3]
        if not fits(q.shape, kt.shape, v.shape, target):
            if _probabilities_pay(e, len(ins) > 3, target, workgroup_storage):
                found[id(e)] = _probabilities_in_product(u, e)
            continue
        # buffer_inputs (): the fusion pass reads the operands through their movement ops
        params = {"scale": scale, "bias": len(ins) > 3, "buffer_inputs": ()}
        if subgroups and few_rows(q.shape, kt.shape, v.shape, target):
            params["subgroups"] = True  # the few-rows kernel's row maximum and sum by subgroups
        parts = key_parts(q.shape, kt.shape, v.shape, target)
        if parts > 1:
            # flash-decoding: a workgroup per query row and part of the keys, then a kernel that
            # combines each row's parts
            pv = Var(e.out.shape[:-1] + (parts, e.out.shape[-1] + 2), e.out.dtype)
            found[id(e)] = [Eqn(Op.ATTENTION_PARTS, tuple(ins), (pv,), {**params, "parts": parts}),
                            Eqn(Op.ATTENTION_COMBINE, (pv,), (e.out,), {})]
            continue
        split = split_lanes(q.shape, kt.shape, v.shape, target, subgroups)
        if split > 1:
            params["split"] = split
        found[id(e)] = Eqn(Op.ATTENTION, tuple(ins), (e.out,), params)
    if not found:
        return prog
    # the chains' other equations are dead now
    eqns: list[Eqn] = []
    for e in prog.eqns:
        new = found.get(id(e), e)
        eqns.extend(new if isinstance(new, list) else [new])
    return dce(Program(list(prog.inputs), eqns, list(prog.outputs)))


def _probabilities_pay(out: Eqn, bias: bool, target: str, workgroup_storage: int) -> bool:
    """Does the p @ v product ``out`` of a written-out attention compute the probabilities as it
    loads them (_probabilities_in_product)? On GPUs, without a bias (the product's kernel then
    reads one value per probability, the score, and one per row, the maximum), where v has at most
    PROBS_IN_PRODUCT columns and the product takes a pipelined kernel, which computes them a step
    behind its loads (codegen.deferred_prologue) and is not split along the keys (split_k)."""
    p, v = out.inputs
    *batch, m, k = p.shape
    n = v.shape[-1]
    nb = math.prod(batch)
    return (target == "gpu" and not bias and 0 < n <= PROBS_IN_PRODUCT
            and codegen.deferred_prologue(m, k, n, nb, target, workgroup_storage)
            and (len(p.shape) > 2 or rb_chunks_for(m, k, n, target) == 1))


def _probabilities_in_product(u: Uses, out: Eqn) -> list[Eqn]:
    """``o = matmul(div(e, n), v)`` as ``o = div(matmul(e, v), n)``, the product marked
    ``a_prologue`` (the fusion pass then leaves e = exp(s - m) to be computed where the product
    loads it; n divides each output row, a per-row factor of the sum over the keys). The
    probabilities' S x T values are then never written: the softmax's kernel reduces the rows
    (its max and sum) only."""
    p, v = out.inputs
    div = u.producer[id(p)]  # _match found it: div(e, n), read by this product only
    e, n = div.inputs
    t = Var(out.out.shape, out.out.dtype)
    return [Eqn(Op.MATMUL, (e, v), (t,), {**out.params, "a_prologue": True}),
            Eqn(Op.DIV, (t, n), (out.out,), {})]


# A decode step's cache update, an elementwise kernel writing a window of a donated cache in place
# (lax.dynamic_update_slice), whose results only the next kernel reads, a few-rows attention, is
# done by that attention kernel (fold_cache_update); 0: never. Every workgroup of the attention
# kernel writes the whole window, so only windows of at most FOLD_WINDOW_MAX elements (all the
# update's outputs together) are folded.
FOLD_CACHE_UPDATE = config.env_int("FUSEC_FOLD_CACHE_UPDATE", 1)
FOLD_WINDOW_MAX = 1024


def fold_cache_update(prog: Program, target: str = "gpu", max_bindings: int = 8) -> Program:
    """Merge each in-place window update into the few-rows attention kernel right after it that
    reads its results (GPUs, after memory planning: only then is it known which buffers are
    donated and written in place).

    The merged kernel's first output is the attention's; the update's outputs follow, each
    written in place into the donated buffer it updates (``params["inplace"]``), and
    ``params["window"]`` counts them. Each workgroup first stores the whole window (every
    workgroup the same values), then a storage barrier, then runs the attention, which reads the
    keys and values from those buffers: it sees its own workgroup's stores, and other
    workgroups' stores of the same values. One kernel (and one dispatch) less per layer of a
    decode step."""
    if not FOLD_CACHE_UPDATE or target != "gpu":
        return prog
    kernels = [i for i, e in enumerate(prog.eqns) if e.op is Op.KERNEL]
    if not any(prog.eqns[i].params.get("kind") == "attention" for i in kernels):
        return prog
    reads: dict[int, int] = {}
    # the buffer each value lives in, as a slot (a program input's own: "inK")
    slot_of: dict[int, str] = {id(v): f"in{k}" for k, v in enumerate(prog.inputs)}
    for e in prog.eqns:
        for a in e.inputs:
            if isinstance(a, Var):
                reads[id(a)] = reads.get(id(a), 0) + 1
        for o, s in zip(e.outs, e.params.get("slots", ())):
            slot_of[id(o)] = s
    merged: dict[int, Eqn] = {}
    dropped: set[int] = set()
    for ui, ai in zip(kernels, kernels[1:]):
        m = _folded(prog.eqns[ui], prog.eqns[ai], reads, slot_of, max_bindings)
        if m is not None:
            merged[ai] = m
            dropped.add(ui)
    if not merged:
        return prog
    eqns = [merged.get(i, e) for i, e in enumerate(prog.eqns) if i not in dropped]
    return Program(list(prog.inputs), eqns, list(prog.outputs))


def _folded(up: Eqn, att: Eqn, reads: dict[int, int], slot_of: dict[int, str],
            max_bindings: int) -> Optional[Eqn]:
    """``up`` (a window update) merged into ``att`` (a few-rows attention kernel), or None where
    that is not possible (see fold_cache_update)."""
    if up.params.get("kind") != "elementwise" or att.params.get("kind") != "attention" \
            or att.params.get("inplace") or att.params.get("window"):
        return None
    ub: Program = up.params["body"]
    ab: Program = att.params["body"]
    inplace = tuple(up.params.get("inplace", ()))
    window = update_window(ub, inplace)
    a_eqn = ab.eqns[-1]
    if window is None or a_eqn.op not in (Op.ATTENTION, Op.ATTENTION_PARTS):
        return None
    q, kt, v = a_eqn.inputs[:3]
    if a_eqn.op is Op.ATTENTION and not few_rows(q.shape, kt.shape, v.shape, "gpu"):
        return None
    if math.prod(window_shape(up.outs[0].shape, window)) * len(up.outs) > FOLD_WINDOW_MAX:
        return None
    if not all(isinstance(a, Var) for a in up.inputs + att.inputs):
        return None
    # the update's results are read by the attention kernel alone (program outputs aside: they
    # are the donated buffers, written in place either way)
    outs = {id(o): k for k, o in enumerate(up.outs)}
    if not any(id(a) in outs for a in att.inputs):
        return None
    for o in up.outs:
        if reads.get(id(o), 0) != sum(1 for a in att.inputs if a is o):
            return None
    old = {k: up.inputs[j] for j, k in inplace}  # the buffer each output is written into
    if any(a is b for a in att.inputs for b in old.values()):
        return None  # (the attention reads a buffer as it was before the update)
    # the update now runs where the attention does: no buffer it reads may be one the attention
    # writes (a pooled buffer, or a donated input's, freed after the update)
    written = {s for s in att.params.get("slots", ()) if s != "new"}
    if any(slot_of.get(id(a)) in written for a in up.inputs):
        return None
    ins: list[Var] = []
    at: dict[int, int] = {}

    def index(a: Atom) -> int:
        assert isinstance(a, Var)
        if id(a) not in at:
            at[id(a)] = len(ins)
            ins.append(a)
        return at[id(a)]

    a_map = [index(old[outs[id(a)]] if id(a) in outs else a) for a in att.inputs]
    u_map = [index(a) for a in up.inputs]
    n_att = len(att.outs)
    new_inplace = tuple((u_map[j], n_att + k) for j, k in inplace)
    if len(ins) - len(new_inplace) + n_att + len(up.outs) > max_bindings:
        return None
    body_in = [Var(a.shape, a.dtype) for a in ins]
    sub_a = {id(bv): body_in[a_map[i]] for i, bv in enumerate(ab.inputs)}
    sub_u = {id(bv): body_in[u_map[i]] for i, bv in enumerate(ub.inputs)}

    def clone(eqns: list[Eqn], sub: dict[int, Var]) -> list[Eqn]:
        return [Eqn(e.op, tuple(sub.get(id(x), x) if isinstance(x, Var) else x
                                for x in e.inputs), e.outs, e.params) for e in eqns]

    def mapped(xs: list[Atom], sub: dict[int, Var]) -> list[Atom]:
        return [sub.get(id(x), x) if isinstance(x, Var) else x for x in xs]

    # (fusion copies cheap work, such as a position's reshape, into every kernel that reads it:
    # an equation of both bodies is computed once)
    shared = {id(e) for e in ub.eqns}
    defined = {id(o) for e in ub.eqns for o in e.outs}
    a_eqns = [e for e in ab.eqns if id(e) not in shared]
    if any(id(o) in defined for e in a_eqns for o in e.outs):
        return None
    body = Program(body_in, clone(ub.eqns, sub_u) + clone(a_eqns, sub_a),
                   mapped(ab.outputs, sub_a) + mapped(ub.outputs, sub_u))
    params = {**att.params, "body": body, "inplace": new_inplace, "window": len(up.outs),
              "slots": tuple(att.params.get("slots", ("new",) * n_att))
              + tuple(up.params.get("slots", ("new",) * len(up.outs)))}
    return Eqn(Op.KERNEL, tuple(ins), att.outs + up.outs, params)
