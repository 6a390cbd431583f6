"""Lowering of the scan primitive (``cumulative``: cumsum, cumprod, cummax, cummin along an axis)
into the ops its kernels compute, as :func:`fusec.kernels.scan.plan` says:

- short rows (or rows enough to fill the GPU): ``scan``, one kernel;
- long rows: ``scan_reduce`` (each chunk of a row reduced to one value), the scan of those values
  along the same axis (lowered the same way, so very long rows recurse), and ``scan`` with the
  scanned values as carries (each chunk scanned from the value of the chunks before it).

The chunk values are kept in scan order (for a reverse scan the first chunk is the last one of
the row), so their own scan runs forwards.
"""

from __future__ import annotations

from ..ir import Eqn, Op, Program, Var
from ..kernels.scan import plan


def _lower(x: Var, out: Var, params: dict[str, object], target: str, eqns: list[Eqn]) -> None:
    axis = int(params["axis"])  # type: ignore[call-overload]
    if x.size == 0:
        # nothing to scan: the (empty) result is the operand
        eqns.append(Eqn(Op.RESHAPE, (x,), (out,), {"shape": out.shape}))
        return
    stages = plan(x.shape, axis, target)
    if stages.reduce is None:
        eqns.append(Eqn(Op.SCAN, (x,), (out,), {**params, **stages.scan}))
        return
    chunk = int(stages.scan["chunk"])
    shape = x.shape[:axis] + (-(-x.shape[axis] // chunk),) + x.shape[axis + 1:]
    parts = Var(shape, x.dtype)
    eqns.append(Eqn(Op.SCAN_REDUCE, (x,), (parts,), {**params, **stages.reduce}))
    carries = Var(shape, x.dtype)
    _lower(parts, carries, {**params, "reverse": False}, target, eqns)
    eqns.append(Eqn(Op.SCAN, (x, carries), (out,), {**params, **stages.scan}))


def lower_scan(prog: Program, target: str = "gpu") -> Program:
    """Replace every ``cumulative`` by its stages (see the module's docstring)."""
    if not any(e.op is Op.CUMULATIVE for e in prog.eqns):
        return prog
    eqns: list[Eqn] = []
    for e in prog.eqns:
        if e.op is not Op.CUMULATIVE:
            eqns.append(e)
            continue
        x = e.inputs[0]
        assert isinstance(x, Var), "a scan's operand is an array"
        params = {"reduce": e.params["reduce"], "axis": int(e.params["axis"]),
                  "reverse": bool(e.params.get("reverse", False))}
        _lower(x, e.out, params, target, eqns)
    return Program(list(prog.inputs), eqns, list(prog.outputs))
