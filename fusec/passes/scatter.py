"""Lowering of the scatter primitive into the ops its kernels compute.

``y = scatter[mode](x, u, i_0, ..)`` becomes

* mode "add": ``z = scatter_add[shape](u, i_0, ..)`` accumulating into a buffer zero-filled at
  the start of each call (``zero_init``), then ``y = add(x, z)``: a plain elementwise op, which
  fuses with the elementwise ops that read ``y`` (and those computing ``x``). An add followed by
  elementwise work is two kernels. For bool, add is logical or, as in numpy.
* other modes: ``c = cast(x)`` to its own dtype, a copy (simplify, which would remove it, ran
  before this pass), then ``y = scatter_into[mode](c, u, i_0, ..)``, whose kernel updates ``c``'s
  buffer in place (``writes_into``: its output is its input 0). The copy keeps ``x`` itself
  unchanged (a program input, or a value read elsewhere); it fuses with whatever computes ``x``.

Both stages are kernels of kind "scatter" that compute their updates and indices themselves:
``buffer_inputs`` tells the fusion pass which inputs must be buffers (only scatter_into's
target), so the elementwise ops, iotas and broadcasts that make the others (``x.at[i, 1::2]``
builds index arrays from iotas; a scalar update is a broadcast) fuse into the scatter kernel
instead of being written to memory first.

A scatter of no updates, or into an empty array, is its operand.
"""

from __future__ import annotations

import math

from ..ir import Atom, Eqn, Op, Program, Var
from ..ops import broadcast_shapes


def lower_scatter(prog: Program, target: str = "gpu", in_loop: bool = False) -> Program:
    """``in_loop``: the program is a loop's body, where no buffer can be zero-filled per
    iteration: a scatter-add becomes a copy and a scatter_into as the other modes do. A scatter
    marked ``into_operand`` (fusec.control_flow: a loop carry updated in place) becomes a
    scatter_into its operand itself, without the copy."""
    subst: dict[int, Atom] = {}
    eqns: list[Eqn] = []

    def sub(a: Atom) -> Atom:
        return subst.get(id(a), a) if isinstance(a, Var) else a

    for e in prog.eqns:
        ins = tuple(sub(a) for a in e.inputs)
        if e.op is not Op.SCATTER:
            eqns.append(e if ins == e.inputs else Eqn(e.op, ins, e.outs, e.params))
            continue
        x, u, idx = ins[0], ins[1], ins[2:]
        out = e.out
        updates = math.prod(broadcast_shapes(u.shape, *(i.shape for i in idx)))
        if out.size == 0 or updates == 0:
            subst[id(out)] = x  # nothing to combine
            continue
        if e.params.get("into_operand"):
            eqns.append(Eqn(Op.SCATTER_INTO, (x, u, *idx), (out,),
                            {"mode": e.params["mode"], "writes_into": ((0, 0),),
                             "buffer_inputs": (0,)}))
        elif e.params["mode"] == "add" and not in_loop:
            z = Var(out.shape, out.dtype)
            eqns.append(Eqn(Op.SCATTER_ADD, (u, *idx), (z,),
                            {"shape": out.shape, "zero_init": (0,), "buffer_inputs": ()}))
            eqns.append(Eqn(Op.ADD, (x, z), (out,)))
        else:
            c = Var(out.shape, out.dtype)
            eqns.append(Eqn(Op.CAST, (x,), (c,), {"dtype": out.dtype}))
            eqns.append(Eqn(Op.SCATTER_INTO, (c, u, *idx), (out,),
                            {"mode": e.params["mode"], "writes_into": ((0, 0),),
                             "buffer_inputs": (0,)}))
    return Program(list(prog.inputs), eqns, [sub(a) for a in prog.outputs])

