"""Common-subexpression elimination: two equations applying the same op with the same params to the
same operands compute the same value once."""

from __future__ import annotations

from typing import Any

from ..ir import Atom, Eqn, Lit, Program, Var


def _key(a: Atom) -> tuple[Any, ...]:
    return ("lit", a.dtype, repr(a.value)) if isinstance(a, Lit) else ("var", id(a))


def _params_key(params: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


def cse(prog: Program) -> Program:
    seen: dict[tuple[Any, ...], Eqn] = {}
    subst: dict[int, Atom] = {}
    eqns: list[Eqn] = []

    def sub(a: Atom) -> Atom:
        return subst.get(id(a), a) if isinstance(a, Var) else a

    for e in prog.eqns:
        ins = tuple(sub(a) for a in e.inputs)
        ne = e if ins == e.inputs else Eqn(e.op, ins, e.outs, e.params)
        key = (ne.op, tuple(_key(a) for a in ins), _params_key(ne.params))
        prev = seen.get(key)
        if prev is not None and len(prev.outs) == len(ne.outs) == 1:
            subst[id(ne.out)] = prev.out
            continue
        seen[key] = ne
        eqns.append(ne)
    return Program(list(prog.inputs), eqns, [sub(a) for a in prog.outputs])
