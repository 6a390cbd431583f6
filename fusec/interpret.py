"""A numpy evaluator of the IR: the definition of every op, the oracle for tests, the CPU fallback.

It runs traced programs and lowered ones (``kernel`` equations run their bodies), computing in the
program's own dtypes (float32 stays float32), so it matches what the GPU should produce up to
rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .ir import MOVEMENT, Atom, Eqn, Lit, Op, Program
from .ops import (
    ELEMENTWISE,
    NUMPY_RULES,
    REDUCTIONS,
    gather_numpy,
    iota_numpy,
    numpy_elementwise,
    partial_numpy,
    slice_numpy,
)


def lit_value(lit: Lit) -> np.ndarray:
    return np.asarray(lit.value, dtype=np.dtype(lit.dtype))


def eval_eqn(e: Eqn, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    if e.op is Op.KERNEL:
        return evaluate(e.params["body"], args)
    if e.op is Op.LOOP:
        return eval_loop(e, args)
    return [_eval_primitive(e, args)]


def eval_loop(e: Eqn, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """A loop: its body applied ``trips`` times to the carries, or, for a while loop (trips
    None), until the flag carry is false (the body itself leaves the carries unchanged from
    then on, so stopping at once gives what the GPU's extra iterations give)."""
    p = e.params
    n = int(p["carries"])
    body: Program = p["body"]
    carries = list(args[:n])
    invariants = list(args[n:])
    if p["trips"] is None:
        flag = int(p["flag"])
        while bool(carries[flag]):
            carries = evaluate(body, carries + invariants)
    else:
        for _ in range(int(p["trips"])):
            carries = evaluate(body, carries + invariants)
    return carries


def _eval_primitive(e: Eqn, args: Sequence[np.ndarray]) -> np.ndarray:
    op, p = e.op, e.params
    if op in ELEMENTWISE or op in (Op.CAST, Op.IPOW):
        out = numpy_elementwise(op, args, p, e.out.dtype)
        return np.broadcast_to(out, e.out.shape)
    if op in REDUCTIONS:
        x = args[0]
        return np.asarray(REDUCTIONS[op].numpy(x, axis=tuple(p["axes"])), dtype=x.dtype)
    if op is Op.PARTIAL:
        return partial_numpy(args[0], Op(p["reduce"]), tuple(p["axes"]), int(p["chunks"]))
    if op is Op.MATMUL:
        a, b = args
        if a.dtype == np.float32:
            return np.matmul(a, b)
        # integers wrap around modulo 2**32 on the GPU; int64 products reduced the same way agree
        return np.matmul(a.astype(np.int64), b.astype(np.int64)).astype(a.dtype)
    if op in MOVEMENT:
        x = args[0]
        if op is Op.RESHAPE:
            return x.reshape(p["shape"])
        if op is Op.TRANSPOSE:
            return x.transpose(p["perm"])
        if op is Op.PAD:
            return np.pad(x, p["widths"], constant_values=p.get("value", 0))
        if op is Op.SLICE:
            return slice_numpy(x, p["starts"], p["steps"], e.out.shape)
        return np.broadcast_to(x, p["shape"])
    if op is Op.IOTA:
        return iota_numpy(e.out.shape, int(p["axis"]), e.out.dtype)
    if op is Op.GATHER:
        return gather_numpy(args[0], args[1:], e.out.shape)
    if op in NUMPY_RULES:
        return NUMPY_RULES[op](args, p, (e.out.shape, e.out.dtype))
    raise NotImplementedError(f"interpreter: no rule for {op}")


def evaluate(prog: Program, args: Sequence[Any]) -> list[np.ndarray]:
    """Run ``prog`` on numpy arrays (one per program input); returns one array per output."""
    if len(args) != len(prog.inputs):
        raise ValueError(f"program takes {len(prog.inputs)} inputs, got {len(args)}")
    env: dict[int, np.ndarray] = {}
    for v, a in zip(prog.inputs, args):
        arr = np.asarray(a)
        if arr.dtype != np.dtype(v.dtype):
            arr = arr.astype(v.dtype)
        env[id(v)] = arr.reshape(v.shape)

    def read(a: Atom) -> np.ndarray:
        return lit_value(a) if isinstance(a, Lit) else env[id(a)]

    for e in prog.eqns:
        outs = eval_eqn(e, [read(a) for a in e.inputs])
        for v, out in zip(e.outs, outs):
            env[id(v)] = np.array(out, dtype=np.dtype(v.dtype), order="C")  # keeps 0-d
    return [np.asarray(read(o)) for o in prog.outputs]
