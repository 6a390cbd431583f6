"""Dead-code elimination: equations whose results nobody needs are dropped, so they cost no kernel
and no buffer. Program inputs stay (the signature is fixed); the runtime skips uploading unused
ones."""

from __future__ import annotations

from ..ir import Program, Var


def dce(prog: Program) -> Program:
    live: set[int] = {id(a) for a in prog.outputs if isinstance(a, Var)}
    kept = []
    for e in reversed(prog.eqns):
        if any(id(o) in live for o in e.outs):
            kept.append(e)
            live.update(id(a) for a in e.inputs if isinstance(a, Var))
    kept.reverse()
    return Program(list(prog.inputs), kept, list(prog.outputs))


def used_inputs(prog: Program) -> list[bool]:
    """For each program input: is it read by any equation or returned?"""
    used = {id(a) for e in prog.eqns for a in e.inputs if isinstance(a, Var)}
    used |= {id(a) for a in prog.outputs if isinstance(a, Var)}
    return [id(v) in used for v in prog.inputs]
