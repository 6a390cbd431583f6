"""Loops (``loop`` equations, :data:`fusec.ir.Op.LOOP`): their bodies get kernels of their own.

The passes before fusion treat a loop as one opaque equation; the fusion pass never merges
across it (it is a group of kind "loop": its inputs and results are buffers); memory planning
gives its results buffers like a kernel's. :func:`prepare_loops` runs just before fusion, and
for each loop of the program:

* makes every input a buffer of its own where the loop needs one: a literal input becomes a 0-d
  value, and the initial value of an *in-place* carry (``params["inplace"]``: carry k updated in
  place by scatters, see fusec.control_flow) becomes a copy, since the loop overwrites it and the
  copy's buffer is the loop's result (an alias, like a scatter's ``writes_into``). A copy is a
  cast to the value's own dtype, as in lower_scatter (simplify, which would remove it, has run);
* lowers the body through the whole pass pipeline on its own (``lower_body``, with the options
  of a loop body: :attr:`Options.loop_carries`), so nested loops are lowered depth first.

In a loop body the runtime ping-pongs every other carry between two buffers (iteration i reads
one and writes the other), so each carry result must be a buffer written by a kernel of the
body and by nothing else. :func:`prepare_loops` therefore also fixes a loop body's own results:
a literal, a body input, or a value that is another result as well (possibly through reshapes)
becomes a copy. An in-place carry's result must be its own input's buffer (a chain of scatters
into it); lower_scatter writes those scatters straight into their operand (``into_operand``).
Inside loop bodies nothing is zero-filled per call (a scatter-add becomes a copy and a scatter
into it), since the runtime fills such buffers once per call, not once per iteration.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..ir import Atom, Eqn, Lit, Op, Program, Var


def _root(v: Atom, producer: dict[int, Eqn]) -> Atom:
    """The value whose buffer ``v`` will live in: through reshapes (aliases), scatters into
    their operand, and in-place loop carries into the loop's input."""
    while isinstance(v, Var) and id(v) in producer:
        e = producer[id(v)]
        if e.op is Op.RESHAPE or e.op is Op.SCATTER_INTO or (
                e.op is Op.SCATTER and e.params.get("into_operand")):
            v = e.inputs[0]
        elif e.op is Op.LOOP:
            k = next(k for k, o in enumerate(e.outs) if o is v)
            src = {kk: j for j, kk in e.params.get("inplace", ())}
            if k not in src:
                break
            v = e.inputs[src[k]]
        else:
            break
    return v


def prepare_loops(prog: Program, opts: Any, lower_body: Callable[[Program, Any], Program]
                  ) -> Program:
    """See the module docstring. ``opts``: the pipeline's Options; ``lower_body(body, opts)``
    runs the pipeline on a body."""
    eqns: list[Eqn] = []
    for e in prog.eqns:
        if e.op is not Op.LOOP:
            eqns.append(e)
            continue
        ins = list(e.inputs)
        for j, a in enumerate(ins):
            if isinstance(a, Lit):
                v = Var((), a.dtype)
                eqns.append(Eqn(Op.BROADCAST, (a,), (v,), {"shape": ()}))
                ins[j] = v
        for j, _ in e.params.get("inplace", ()):
            c = Var(ins[j].shape, ins[j].dtype)
            eqns.append(Eqn(Op.CAST, (ins[j],), (c,), {"dtype": c.dtype}))  # a copy
            ins[j] = c
        n = int(e.params["carries"])
        body_opts = opts.for_loop_body(n, tuple(k for _, k in e.params.get("inplace", ())))
        body = lower_body(e.params["body"], body_opts)
        eqns.append(Eqn(Op.LOOP, tuple(ins), e.outs, {**e.params, "body": body}))
    out = Program(list(prog.inputs), eqns, list(prog.outputs))
    if opts.loop_carries >= 0:
        out = _fix_results(out, opts.loop_carries, set(opts.loop_inplace))
    return out


def _fix_results(prog: Program, n: int, inplace: set[int]) -> Program:
    """A loop body's carry results as buffers of their own (see the module docstring)."""
    producer = {id(o): e for e in prog.eqns for o in e.outs}
    inputs = {id(v) for v in prog.inputs}
    eqns = list(prog.eqns)
    outputs = list(prog.outputs)
    seen: set[int] = set()
    for k in range(n):
        a = outputs[k]
        if k in inplace:
            r = _root(a, producer)
            assert r is prog.inputs[k], "an in-place carry's result is not its input's buffer"
            continue
        if isinstance(a, Lit):
            v = Var((), a.dtype)
            eqns.append(Eqn(Op.BROADCAST, (a,), (v,), {"shape": ()}))
            outputs[k] = v
            seen.add(id(v))
            continue
        r = _root(a, producer)
        if id(r) in inputs or id(r) in seen:
            v = Var(a.shape, a.dtype)
            eqns.append(Eqn(Op.CAST, (a,), (v,), {"dtype": v.dtype}))  # a copy
            outputs[k] = v
            r = v
        seen.add(id(r))
    return Program(list(prog.inputs), eqns, outputs)
