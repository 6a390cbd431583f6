"""What the rewrites that match a chain of equations share (``attention``, ``fold_rms_norm``):
each value's producer, and how many times it is read (a program output counts as read twice, so
that no chain ever swallows it)."""

from __future__ import annotations

from typing import Optional

from ..ir import Atom, Eqn, Op, Program, Var


class Uses:
    def __init__(self, prog: Program) -> None:
        self.count: dict[int, int] = {}
        for e in prog.eqns:
            for a in e.inputs:
                if isinstance(a, Var):
                    self.count[id(a)] = self.count.get(id(a), 0) + 1
        for a in prog.outputs:
            if isinstance(a, Var):
                self.count[id(a)] = self.count.get(id(a), 0) + 2  # never inside a chain
        self.producer = {id(o): e for e in prog.eqns for o in e.outs}

    def sole(self, v: Atom, op: Op, uses: int = 1) -> Optional[Eqn]:
        """The producer of ``v`` when it is ``op`` and ``v`` has exactly ``uses`` uses."""
        if not isinstance(v, Var) or self.count.get(id(v), 0) != uses:
            return None
        e = self.producer.get(id(v))
        return e if e is not None and e.op is op else None
