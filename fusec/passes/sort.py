"""Lowering of ``argsort`` into the stages its kernels compute.

Rows of at most :data:`fusec.kernels.sort.LOCAL_MAX` elements stay one ``argsort`` kernel (a
workgroup sorts whole rows in workgroup memory). Longer rows become a least-significant-digit
radix sort: the array is seen as x[rows, n], and each pass over 4 bits of the order keys is three
stages (``radix_hist``: digit counts per block; ``radix_scan``: where each block's digits go;
``radix_scatter``: the stable move). The first pass reads x itself and computes the keys; later
passes read the state uint32[2, rows, n] (keys, then the original indices) the previous one wrote;
the last writes only the int32 indices. 32-bit keys take 8 passes, bool keys one.

Cost of an n-element row (4-byte words moved): each pass reads the keys for the histogram (n),
reads and writes keys and indices (4n), plus the small histograms; 8 passes ~ 36n words, e.g.
2^24 float32: ~2.4 GB.
"""

from __future__ import annotations

import math

from ..ir import Eqn, Op, Program, Var
from ..kernels.sort import LOCAL_MAX, RADIX_BLOCK
from ..ops import SORT_RADIX_BITS, infer_type, sort_key_bits


def _bind(eqns: list[Eqn], op: Op, inputs: tuple[Var, ...], params: dict[str, object],
          out: Var | None = None) -> Var:
    shape, dt = infer_type(op, [(a.shape, a.dtype) for a in inputs], params)
    if out is None:
        out = Var(shape, dt)
    assert (out.shape, out.dtype) == (shape, dt)
    eqns.append(Eqn(op, inputs, (out,), params))
    return out


def _radix(e: Eqn, eqns: list[Eqn]) -> None:
    x = e.inputs[0]
    assert isinstance(x, Var)
    n = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    descending = bool(e.params.get("descending", False))
    src = x if x.shape == (rows, n) else _bind(eqns, Op.RESHAPE, (x,), {"shape": (rows, n)})
    passes = -(-sort_key_bits(x.dtype) // SORT_RADIX_BITS)
    for k in range(passes):
        first, last = k == 0, k == passes - 1
        shift = k * SORT_RADIX_BITS
        hist = _bind(eqns, Op.RADIX_HIST, (src,), {"shift": shift, "block": RADIX_BLOCK,
                                                    "first": first, "descending": descending})
        offsets = _bind(eqns, Op.RADIX_SCAN, (hist,), {})
        final = e.out if last and e.out.shape == (rows, n) else None
        src = _bind(eqns, Op.RADIX_SCATTER, (src, offsets),
                    {"shift": shift, "block": RADIX_BLOCK, "first": first, "last": last,
                     "descending": descending}, final)
    if src is not e.out:
        _bind(eqns, Op.RESHAPE, (src,), {"shape": e.out.shape}, e.out)


def lower_sort(prog: Program, target: str = "gpu") -> Program:
    """Replace each ``argsort`` of rows longer than LOCAL_MAX by its radix passes."""
    if not any(e.op is Op.ARGSORT for e in prog.eqns):
        return prog
    eqns: list[Eqn] = []
    for e in prog.eqns:
        if e.op is Op.ARGSORT and e.out.shape[-1] > LOCAL_MAX and e.out.size:
            _radix(e, eqns)
        else:
            eqns.append(e)
    return Program(list(prog.inputs), eqns, list(prog.outputs))
