"""The IR verifier: single assignment, definition before use, and types that match the op rules.
The test suite runs it after every pass."""

from __future__ import annotations

from ..errors import FusecError
from ..ir import Op, Program, Var
from ..ops import MULTI_TYPE_RULES, infer_type


class VerifyError(FusecError):
    """The IR broke an invariant: a compiler bug, never a user error."""


def verify(prog: Program, where: str = "") -> None:
    defined: set[int] = set()
    ctx = f" (after {where})" if where else ""
    for v in prog.inputs:
        if id(v) in defined:
            raise VerifyError(f"input defined twice{ctx}")
        defined.add(id(v))
    for i, e in enumerate(prog.eqns):
        for a in e.inputs:
            if isinstance(a, Var) and id(a) not in defined:
                raise VerifyError(
                    f"eqn {i} ({e.op.value}) uses a variable before it is defined{ctx}")
        if e.op is Op.KERNEL:
            body: Program = e.params["body"]
            verify(body, where)
            ins = [a for a in e.inputs]
            if len(ins) != len(body.inputs) or any(
                    (a.shape, a.dtype) != (b.shape, b.dtype) for a, b in zip(ins, body.inputs)):
                raise VerifyError(
                    f"kernel {e.params.get('name')} inputs do not match its body{ctx}")
            if len(e.outs) != len(body.outputs) or any(
                    (a.shape, a.dtype) != (b.shape, b.dtype) for a, b in zip(e.outs, body.outputs)):
                raise VerifyError(
                    f"kernel {e.params.get('name')} outputs do not match its body{ctx}")
        elif e.op is Op.LOOP:
            verify(e.params["body"], where)
            types = MULTI_TYPE_RULES[Op.LOOP]([(a.shape, a.dtype) for a in e.inputs], e.params)
            if [(o.shape, o.dtype) for o in e.outs] != types:
                raise VerifyError(f"eqn {i} (loop) results do not match its carries{ctx}")
        else:
            if len(e.outs) != 1:
                raise VerifyError(f"primitive {e.op.value} must define one value{ctx}")
            shape, dt = infer_type(e.op, [(a.shape, a.dtype) for a in e.inputs], e.params)
            if (shape, dt) != (e.out.shape, e.out.dtype):
                raise VerifyError(f"eqn {i} ({e.op.value}) has type {e.out.dtype}{e.out.shape}, "
                                  f"rule gives {dt}{shape}{ctx}")
        for o in e.outs:
            if id(o) in defined:
                raise VerifyError(f"eqn {i} ({e.op.value}) redefines a variable{ctx}")
            defined.add(id(o))
    for a in prog.outputs:
        if isinstance(a, Var) and id(a) not in defined:
            raise VerifyError(f"an output is never defined{ctx}")
