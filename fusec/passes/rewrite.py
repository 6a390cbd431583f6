"""The walk that simplify and cse share: equations in order, each with its operands already
substituted; an equation that ``replace`` maps to an existing value is dropped and its output
renamed to that value everywhere after it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

from ..ir import Atom, Eqn, Program, Var


def substitute(prog: Program, replace: Callable[[Eqn], Optional[Atom]]) -> Program:
    """``replace(eqn)``: the value that stands for the single output of ``eqn``, or None to keep
    ``eqn`` (with its operands substituted)."""
    subst: dict[int, Atom] = {}
    eqns: list[Eqn] = []

    def sub(a: Atom) -> Atom:
        return subst.get(id(a), a) if isinstance(a, Var) else a

    for e in prog.eqns:
        ins = tuple(sub(a) for a in e.inputs)
        ne = e if ins == e.inputs else Eqn(e.op, ins, e.outs, e.params)
        repl = replace(ne)
        if repl is not None:
            subst[id(ne.out)] = repl
            continue
        eqns.append(ne)
    return Program(list(prog.inputs), eqns, [sub(a) for a in prog.outputs])
