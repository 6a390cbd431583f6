"""Algebraic simplification and constant folding.

* An elementwise op whose operands are all literals is computed now and becomes a literal.
* Autodiff's markers (stop_gradient, custom_vjp) are identities once traced: they go.
* Identities: ``x * 1``, ``1 * x``, ``x + 0``, ``0 + x``, ``x - 0``, ``x / 1``, ``x ** 1`` become
  ``x``; ``-(-x)`` becomes ``x``; a cast to the operand's own dtype disappears. A rewrite applies
  only when the result has exactly the shape and dtype of ``x`` (no broadcasting is lost).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..ir import ELEMENTWISE, Atom, Eqn, Lit, Op, Program, Var
from ..ops import numpy_elementwise
from .rewrite import substitute


def _is_const(a: Atom, value: float) -> bool:
    return isinstance(a, Lit) and a.dtype != "bool" and float(a.value) == value


def _fold(e: Eqn) -> Optional[Lit]:
    if not (e.op in ELEMENTWISE or e.op in (Op.CAST, Op.IPOW)):
        return None
    if not all(isinstance(a, Lit) for a in e.inputs) or e.out.shape != ():
        return None
    args = [np.asarray(a.value, dtype=a.dtype) for a in e.inputs]  # type: ignore[union-attr]
    value = numpy_elementwise(e.op, args, e.params, e.out.dtype)
    v: Any = value.item()
    return Lit(v, e.out.dtype)


def _identity(e: Eqn, producer: dict[int, Eqn]) -> Optional[Atom]:
    op, ins = e.op, e.inputs

    def same(a: Atom) -> bool:
        return isinstance(a, Var) and (a.shape, a.dtype) == (e.out.shape, e.out.dtype)

    if op is Op.MUL:
        if _is_const(ins[1], 1) and same(ins[0]):
            return ins[0]
        if _is_const(ins[0], 1) and same(ins[1]):
            return ins[1]
    if op is Op.ADD:
        if _is_const(ins[1], 0) and same(ins[0]):
            return ins[0]
        if _is_const(ins[0], 0) and same(ins[1]):
            return ins[1]
    if op is Op.SUB and _is_const(ins[1], 0) and same(ins[0]):
        return ins[0]
    if op is Op.DIV and _is_const(ins[1], 1) and same(ins[0]):
        return ins[0]
    if op is Op.IPOW and e.params.get("n") == 1 and same(ins[0]):
        return ins[0]
    if op is Op.CAST and same(ins[0]):
        return ins[0]
    if op in (Op.STOP_GRADIENT, Op.CUSTOM_VJP) and (
            isinstance(ins[0], Lit) and e.out.shape == () or same(ins[0])):
        return ins[0]  # autodiff markers: identities once traced
    if op is Op.NEG and isinstance(ins[0], Var):
        p = producer.get(id(ins[0]))
        if p is not None and p.op is Op.NEG and same(p.inputs[0]):
            return p.inputs[0]
    return None


def simplify(prog: Program) -> Program:
    producer: dict[int, Eqn] = {}

    def replace(e: Eqn) -> Optional[Atom]:
        repl = _fold(e) or _identity(e, producer)
        if repl is None:
            for o in e.outs:
                producer[id(o)] = e
        return repl

    return substitute(prog, replace)
