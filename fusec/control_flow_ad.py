"""The transforms of compiled loops: the ``loop`` op's rules in :data:`fusec.ops.VJP_RULES`,
:data:`fusec.ops.JVP_RULES` and :data:`fusec.ops.BATCH_RULES` (registered when fusec is
imported).

Reverse mode (loops with a static trip count T: ``fori_loop``, ``scan``) emits two loops:

1. the forward loop again, which now also stacks each iteration's input carries into buffers of
   T rows (scatters that update them in place: O(carry) per iteration);
2. a reverse loop of T iterations, t = T-1 down to 0: it reads iteration t's carries from the
   stacks, recomputes the body forward on them (rematerialisation: nothing but the carries is
   stored) and runs the body's VJP. The carries' cotangents are the reverse loop's carries; the
   cotangents of the loop-invariant inputs (weights, captured values, scan's ``xs``) accumulate
   in carries of their own. Where the body reads an invariant sparsely (a gather of one row, as
   ``scan`` reads ``xs[t]``), the accumulation is rewritten from ``acc + scatter(zeros, g, t)``
   into ``scatter(acc, g, t)``, which updates the accumulator in place: O(row) per iteration,
   not O(xs).

So a reverse pass costs about three forward passes (the primal loop, the stacking loop, the
rematerialised forward in the reverse loop) plus the VJP, and T stacked copies of the carries.

Forward mode (every loop, ``while_loop`` included) is one loop over (carries, tangents) whose body
is the body's JVP. Reverse mode through ``while_loop`` is refused, as in JAX: its trip count is
not known when the program is built.

Batching (``vmap``) runs one loop whose body is the batched body: a carry is batched (batch axis
first) when its initial value is, or when the body makes it depend on batched values (found by
retracing until the batched carries stop changing). A while loop whose flag becomes batched
stops when no example's condition holds any more: its flag is then the ``any`` of the examples'
flags, and each example's carries stop changing at its own stop (the guard is elementwise).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Optional, cast

from . import dtypes
from .autodiff import _backward, _forward, _trace_on_tape
from .control_flow import BODY_SIDE, _arrays, _bind_loop, _builder, _row, _scalar, _trace
from .errors import TraceError
from .ir import Eqn, Lit, Op, Program, Var
from .numpy._base import _elementwise, _tracer
from .numpy.creation import zeros
from .ops import (
    BATCH_RULES,
    JVP_RULES,
    VJP_RULES,
    _batch_first,
    _batch_size,
    ad_zeros,
    broadcast_shapes,
)
from .trace import Aval, Closed, Tracer, inline
from .tree import flatten
from .vmap import _batch_program


def _unmarked(body: Program) -> Program:
    """``body`` without its scatters' ``into_operand`` marks: they hold only inside the loop,
    whose carry is the scatter's operand and read by nothing else."""
    eqns = [Eqn(e.op, e.inputs, e.outs, {k: v for k, v in e.params.items()
                                          if k != "into_operand"})
            if e.params.get("into_operand") else e for e in body.eqns]
    return Program(list(body.inputs), eqns, list(body.outputs))


def _body_fn(body: Program) -> Callable[..., list[Tracer]]:
    """The loop body as a function of its inputs (carries, then invariants) that emits its
    equations into the current trace (unmarked: see :func:`_unmarked`)."""
    prog = _unmarked(body)
    n_out = len(prog.outputs)
    closed = Closed(prog, len(prog.inputs), [], [], flatten(tuple(range(n_out)))[1],
                    (False,) * n_out, BODY_SIDE.get(body, {}))

    def f(*leaves: Any) -> list[Tracer]:
        return _arrays(inline(closed, list(leaves)), closed.out_weak)

    return f


def _operands(ins: Sequence[Any]) -> list[Tracer]:
    return [_tracer(x) for x in ins]


def _float(vs: Sequence[Var]) -> list[int]:
    return [k for k, v in enumerate(vs) if dtypes.is_float(v.dtype)]


def _zeros_of(x: Tracer) -> Any:
    """Zeros of ``x``'s shape and (float) dtype: a cotangent or tangent of ``x``."""
    return ad_zeros(_builder(), x.shape, x.var.dtype)


def _stacked_carries(f: Callable[..., list[Tracer]], init: list[Tracer], inv: list[Tracer],
                     trips: int, which: list[int]) -> list[Tracer]:
    """Run the loop forward again, stacking the input carries ``which`` of each iteration: row
    t of a stack is that carry as iteration t reads it."""
    n = len(init)
    stacks0 = [zeros((trips, *init[k].shape), init[k].var.dtype) for k in which]

    def step(i: Tracer, *state: Tracer) -> list[Any]:
        c, st = list(state[:n]), list(state[n:])
        new_st = [s.at[i].set(c[k]) for s, k in zip(st, which)]
        return [_elementwise(Op.ADD, i, 1), *f(*c, *inv), *new_st]

    avals = [Aval(t.shape, t.var.dtype) for t in [*init, *stacks0]]
    closed = _trace(step, [Aval((), "int32", True), *avals], "a loop's forward pass (stacked)")
    return _bind_loop(closed, [_scalar(0), *init, *stacks0], trips)[1 + n:]


def _producers(prog: Program) -> tuple[dict[int, int], dict[int, int]]:
    producer: dict[int, int] = {}
    uses: dict[int, int] = {}
    for i, e in enumerate(prog.eqns):
        for o in e.outs:
            producer[id(o)] = i
        for a in e.inputs:
            if isinstance(a, Var):
                uses[id(a)] = uses.get(id(a), 0) + 1
    for a in prog.outputs:
        if isinstance(a, Var):
            uses[id(a)] = uses.get(id(a), 0) + 1
    return producer, uses


def _is_zero(a: Any) -> bool:
    return isinstance(a, Lit) and a.dtype != "bool" and float(a.value) == 0.0


def _accumulate_sparsely(prog: Program, positions: Sequence[int]) -> None:
    """In the reverse loop's body, ``acc' = acc + c`` where ``c`` is zero but for the rows a
    gather read (its VJP: ``scatter_add(zeros, g, idx)``, or ``where(iota == pick, g, 0)`` for
    one pick per row) becomes ``scatter_add(acc, g, idx)``: an in-place update of the
    accumulator (fusec.control_flow marks it) instead of a pass over all of it. ``positions``:
    the accumulators' indices among the inputs and outputs."""
    producer, uses = _producers(prog)
    eqns = prog.eqns
    for pos in positions:
        acc, out = prog.inputs[pos], prog.outputs[pos]
        if not isinstance(out, Var) or id(out) not in producer:
            continue
        ei = producer[id(out)]
        add = eqns[ei]
        if add.op is not Op.ADD or acc not in add.inputs or uses.get(id(acc), 0) != 1:
            continue
        x = add.inputs[1] if add.inputs[0] is acc else add.inputs[0]
        if not isinstance(x, Var) or uses.get(id(x), 0) != 1 or id(x) not in producer:
            continue
        xe = eqns[producer[id(x)]]
        new: Optional[list[Eqn]] = None
        if xe.op is Op.SCATTER and xe.params.get("mode") == "add" and xe.out.shape == acc.shape:
            z = xe.inputs[0]
            ze = eqns[producer[id(z)]] if isinstance(z, Var) and id(z) in producer else None
            if ze is not None and ze.op is Op.BROADCAST and _is_zero(ze.inputs[0]):
                new = [Eqn(Op.SCATTER, (acc, *xe.inputs[1:]), (out,), {"mode": "add"})]
        elif xe.op is Op.WHERE and _is_zero(xe.inputs[2]) and isinstance(xe.inputs[0], Var):
            new = _pick_as_scatter(eqns, producer, xe, acc, out)
        if new is not None:
            eqns[ei:ei + 1] = new
            producer, uses = _producers(prog)


def _pick_as_scatter(eqns: list[Eqn], producer: dict[int, int], where: Eqn, acc: Var,
                     out: Var) -> Optional[list[Eqn]]:
    """``where(iota_a == pick, broadcast(g), 0)`` (a gather's VJP for one pick per row along
    axis a) as a scatter-add of g into ``acc`` at ``pick`` along a."""
    hit, gb = where.inputs[0], where.inputs[1]
    he = eqns[producer[id(hit)]] if id(hit) in producer else None
    if he is None or he.op is not Op.EQ or not isinstance(he.inputs[0], Var):
        return None
    io = eqns[producer[id(he.inputs[0])]] if id(he.inputs[0]) in producer else None
    if io is None or io.op is not Op.IOTA or tuple(io.params["shape"]) != acc.shape:
        return None
    a = int(io.params["axis"])
    pick = he.inputs[1]
    ge = eqns[producer[id(gb)]] if isinstance(gb, Var) and id(gb) in producer else None
    g = ge.inputs[0] if ge is not None and ge.op is Op.BROADCAST else gb
    shape = tuple(g.shape)
    if len(shape) != len(acc.shape) or shape[a] != 1 or (
            broadcast_shapes(tuple(pick.shape), shape) != shape):
        return None
    made: list[Eqn] = []
    idx: list[Any] = []
    for k in range(len(shape)):
        if k == a:
            idx.append(pick)
            continue
        v = Var(shape, "int32")
        made.append(Eqn(Op.IOTA, (), (v,), {"shape": shape, "axis": k, "dtype": "int32"}))
        idx.append(v)
    return made + [Eqn(Op.SCATTER, (acc, g, *idx), (out,), {"mode": "add"})]


def _loop_vjp(b: Any, op: Op, p: dict[str, Any], ins: Sequence[Any], outs: Sequence[Any],
              cts: Sequence[Any]) -> list[Any]:
    if p["trips"] is None:
        raise TraceError("grad (reverse mode) of a while_loop is not supported: its trip count "
                         "is not known when the program is built (as in JAX). Use fori_loop or "
                         "scan with a static trip count, or forward mode (fusec.jvp)")
    body: Program = p["body"]
    n, trips = int(p["carries"]), int(p["trips"])
    args = _operands(ins)
    init, inv = args[:n], args[n:]
    fc = _float(body.inputs[:n])
    if all(cts[k] is None for k in fc):
        return [None] * len(ins)
    # carries updated in place by scatters: the VJP of a scatter never reads its operand's
    # values, so they are not stacked (the rematerialised body gets the final value instead)
    inplace = {k for _, k in p.get("inplace", ())}
    # scan's ys: rows each written by one iteration, from a constant start: their cotangent is
    # read row by row and never needs zeroing, so it stays a loop invariant, not a carry
    once = set(p.get("write_once", ()))
    fr = [k for k in fc if k not in once]  # carries whose cotangents the reverse loop carries
    fv = [n + j for j in _float(body.inputs[n:])]
    f = _body_fn(body)
    stacked = [k for k in range(n) if k not in inplace]
    stacks = dict(zip(stacked, _stacked_carries(f, init, inv, trips, stacked)))
    fixed = {k: (_tracer(cts[k]) if cts[k] is not None else _zeros_of(init[k]))
             for k in fc if k in once}
    ct0 = [cts[k] if cts[k] is not None else _zeros_of(init[k]) for k in fr]
    acc0 = [_zeros_of(args[j]) for j in fv]
    nr = len(fr)
    finals = [_tracer(o) for o in outs]

    def reverse(r: Tracer, *state: Tracer) -> list[Any]:
        carried = dict(zip(fr, state[:nr]))
        acc = list(state[nr:])
        t = _elementwise(Op.SUB, trips - 1, r)
        cur: list[Any] = [_row(stacks[k], t) if k in stacks else finals[k] for k in range(n)]
        cur += list(inv)
        diff = fc + fv

        def forward(*primals: Any) -> tuple[Any, ...]:
            a = list(cur)
            for k, x in zip(diff, primals):
                a[k] = x
            res = f(*a)
            return tuple(res[k] for k in fc)

        tape, _, o, _, _, _ = _trace_on_tape(forward, tuple(cur[k] for k in diff),
                                             tuple(range(len(diff))), "a loop body")
        got = _backward(tape, [x.var for x in o], [carried.get(k, fixed.get(k)) for k in fc])
        by_input = dict(zip(diff, got))
        new_ct = [by_input[k] if by_input[k] is not None else _zeros_of(init[k]) for k in fr]
        new_acc = [a if by_input[j] is None else a + by_input[j] for a, j in zip(acc, fv)]
        return [_elementwise(Op.ADD, r, 1), *new_ct, *new_acc]

    avals = [Aval((), "int32", True)] + [Aval(init[k].shape, init[k].var.dtype) for k in fr] + [
        Aval(args[j].shape, args[j].var.dtype) for j in fv]
    closed = _trace(reverse, avals, "a loop's reverse pass")
    _accumulate_sparsely(closed.program, range(1 + nr, 1 + nr + len(fv)))
    res = _bind_loop(closed, [_scalar(0), *ct0, *acc0], trips)[1:]
    out: list[Any] = [None] * len(ins)
    for k, c in zip(fr, res[:nr]):
        out[k] = c
    for j, c in zip(fv, res[nr:]):
        out[j] = c
    return out


def _loop_jvp(b: Any, op: Op, p: dict[str, Any], ins: Sequence[Any], outs: Sequence[Any],
              ts: Sequence[Any]) -> list[Any]:
    body: Program = p["body"]
    n = int(p["carries"])
    args = _operands(ins)
    init, inv = args[:n], args[n:]
    fc = _float(body.inputs[:n])
    fv = [n + j for j in _float(body.inputs[n:]) if ts[n + j] is not None]
    if all(ts[k] is None for k in fc) and not fv:
        return [None] * n
    f = _body_fn(body)
    dc0 = [ts[k] if ts[k] is not None else _zeros_of(init[k]) for k in fc]
    dv = [_tracer(ts[j]) for j in fv]
    nf = len(fc)

    def step(*state: Tracer) -> list[Any]:
        c, dc = list(state[:n]), list(state[n:])
        cur: list[Any] = c + list(inv)
        diff = fc + fv

        def forward(*primals: Any) -> tuple[Any, ...]:
            a = list(cur)
            for k, x in zip(diff, primals):
                a[k] = x
            return tuple(f(*a))

        tape, _, o, _, _, _ = _trace_on_tape(forward, tuple(cur[k] for k in diff),
                                             tuple(range(len(diff))), "a loop body")
        tan = _forward(tape, [*dc, *dv])
        new_dc = [tan.get(id(o[k].var)) for k in fc]
        new_dc = [d if d is not None else _zeros_of(init[k]) for d, k in zip(new_dc, fc)]
        return [*o, *new_dc]

    avals = [Aval(v.shape, v.dtype) for v in body.inputs[:n]] + [
        Aval(init[k].shape, init[k].var.dtype) for k in fc]
    closed = _trace(step, avals, "a loop's forward-mode pass")
    flag = p.get("flag")
    res = _bind_loop(closed, [*init, *dc0], p["trips"], flag=flag)
    out: list[Any] = [None] * n
    for k, d in zip(fc, res[n:n + nf]):
        out[k] = d
    return out


def _loop_batch(b: Any, args: Sequence[Any], dims: Sequence[Any], params: dict[str, Any]
                ) -> list[tuple[Any, Any]]:
    body: Program = params["body"]
    n = int(params["carries"])
    size = _batch_size(args, dims)
    flag: Optional[int] = params.get("flag")
    invariants = [(x, d) for x, d in zip(args[n:], dims[n:])]
    # (the in-place marks are found again on the batched body, whose operands may differ)
    prog = _unmarked(body)
    closed_body = Closed(prog, len(prog.inputs), [], [],
                         flatten(tuple(range(len(prog.outputs))))[1], (False,) * n,
                         BODY_SIDE.get(body, {}))
    batched = [d is not None for d in dims[:n]]
    while True:
        grown: list[int] = []
        any_flag = flag is not None and batched[flag]

        def step(*cs: Tracer) -> list[Any]:
            bb = _builder()
            carries = cs[:n]
            res = _batch_program(bb, closed_body,
                                 [(c, 0 if batched[k] else None) for k, c in enumerate(carries)]
                                 + invariants, size, "a loop body")
            out: list[Any] = []
            for k, (t, d) in enumerate(res):
                if batched[k]:
                    out.append(_batch_first(bb, t, d, size))
                elif d is not None:
                    grown.append(k)  # this carry depends on batched values: batch it too
                    out.append(carries[k])
                else:
                    out.append(t)
            if any_flag:  # the loop goes on while any example's condition holds
                assert flag is not None
                out.append(_any(bb, out[flag]))
            return out

        avals = [Aval((size, *v.shape) if batched[k] else v.shape, v.dtype)
                 for k, v in enumerate(body.inputs[:n])]
        if any_flag:
            avals.append(Aval((), "bool"))
        closed = _trace(step, avals, "a batched loop")
        if not grown:
            break
        for k in grown:
            batched[k] = True
    init = [_batch_first(b, x, d, size) if batched[k] else x
            for k, (x, d) in enumerate(zip(args[:n], dims[:n]))]
    new_flag = flag
    if flag is not None and batched[flag]:
        init.append(_any(b, init[flag]))
        new_flag = n
    res = _bind_loop(closed, init, params["trips"], flag=new_flag,
                     write_once=params.get("write_once", ()))
    return [(r, 0 if batched[k] else None) for k, r in enumerate(res[:n])]


def _any(b: Any, p: Any) -> Any:
    """Whether any of the bool vector ``p`` is true, as a bool scalar."""
    as_int = b.bind(Op.CAST, [p], {"dtype": "int32"})
    return b.bind(Op.NE, [b.bind(Op.RMAX, [as_int], {"axes": (0,)}), Lit(0, "int32")])


VJP_RULES[Op.LOOP] = _loop_vjp
JVP_RULES[Op.LOOP] = _loop_jvp
# (a rule of several results returns a list of (value, batch dim): fusec.vmap accepts both)
BATCH_RULES[Op.LOOP] = cast(Any, _loop_batch)
