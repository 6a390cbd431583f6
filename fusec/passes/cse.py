"""Common-subexpression elimination: two equations applying the same op with the same params to the
same operands compute the same value once."""

from __future__ import annotations

from typing import Any, Optional

from ..ir import Atom, Eqn, Lit, Program
from .rewrite import substitute


def _key(a: Atom) -> tuple[Any, ...]:
    return ("lit", a.dtype, repr(a.value)) if isinstance(a, Lit) else ("var", id(a))


def _params_key(params: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


def cse(prog: Program) -> Program:
    seen: dict[tuple[Any, ...], Eqn] = {}

    def replace(e: Eqn) -> Optional[Atom]:
        key = (e.op, tuple(_key(a) for a in e.inputs), _params_key(e.params))
        prev = seen.get(key)
        if prev is not None and len(prev.outs) == len(e.outs) == 1:
            return prev.out
        seen[key] = e
        return None

    return substitute(prog, replace)
