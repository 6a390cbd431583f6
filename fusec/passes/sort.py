"""Lowering of ``argsort`` and ``sort`` into the stages their kernels compute.

Rows of at most :data:`fusec.kernels.sort.LOCAL_MAX` elements stay one kernel (a workgroup sorts
whole rows in workgroup memory). Longer rows are seen as x[rows, n] and sorted through a state
uint32[2, rows, n] of (order key, payload) pairs (see :mod:`fusec.ops`), in one of two ways:

* GPUs: a least-significant-digit radix sort. Each pass over 8 bits of the keys is three stages
  (``radix_hist``: digit counts per block; ``radix_scan``: where each block's digits go;
  ``radix_scatter``: the stable move). The first pass reads x itself and computes the keys; the
  last writes the payloads alone. 32-bit keys take 4 passes, bool keys one. Words moved for an
  n-element row of argsort: per pass, n for the histogram and 4n for the scatter (keys and
  payloads in and out), plus the histograms (256 counts per block); ~19n for 4 passes, e.g. 2^24
  float32: ~1.3 GB, against ~100 passes of 2n for a bitonic network. A sort of values moves its
  keys alone (2n per scatter, ~12n in all) and the last pass writes the values the keys give;
  a float sort then puts back the zeros' signs and the NaNs' payloads (``sort_specials``,
  ``sort_fixup``: see :mod:`fusec.ops`; where the sorted row holds no zero and no NaN their
  workgroups stop at once). H100, 2^24 float32 (bench/sort_probe.py): 1.26 ms of GPU time
  with pairs, 1.00 ms with keys alone (each scatter 260-320 -> 190-210 us).
* Software adapters ("cpu" target), where shader compile time grows fast with a kernel's size:
  ``sort_blocks`` sorts blocks of LOCAL_MAX elements in workgroup memory, then ``sort_merge``
  passes merge pairs of sorted runs (log2(n / LOCAL_MAX) small kernels, no workgroup memory).
"""

from __future__ import annotations

import math
from typing import Any

from ..ir import Eqn, Op, Program, Var
from ..kernels import sort as kernels
from ..ops import SORT_RADIX_BITS, infer_type, sort_key_bits


def _bind(eqns: list[Eqn], op: Op, inputs: tuple[Var, ...], params: dict[str, Any],
          out: Var | None = None) -> Var:
    shape, dt = infer_type(op, [(a.shape, a.dtype) for a in inputs], params)
    if out is None:
        out = Var(shape, dt)
    assert (out.shape, out.dtype) == (shape, dt)
    eqns.append(Eqn(op, inputs, (out,), params))
    return out


def _radix(src: Var, final: Var | None, common: dict[str, Any], block: int,
           eqns: list[Eqn], subgroups: int = 0) -> Var:
    x = src
    passes = -(-sort_key_bits(common["dtype"]) // SORT_RADIX_BITS)
    # a sort of values moves its keys alone (each key gives its value back, but for the signs of
    # zeros and the NaNs' payloads, which two stages restore): half the traffic of pairs
    planes = 1 if common["values"] else 2
    specials = common["values"] and common["dtype"] == "float32"
    for k in range(passes):
        first, last = k == 0, k == passes - 1
        shift = k * SORT_RADIX_BITS
        hp = {"shift": shift, "block": block, "first": first, "planes": planes,
              "descending": common["descending"]}
        sp: dict[str, Any] = {"subgroups": True} if subgroups else {}
        if subgroups >= 2:
            sp["subgroup_barrier"] = True  # (the scatter's ranking within subgroups needs it)
        if subgroups >= 3:
            sp["narrow"] = True  # subgroups of at most 32 lanes: one-word ballots
        hist = _bind(eqns, Op.RADIX_HIST, (src,), hp)
        scanned = _bind(eqns, Op.RADIX_SCAN, (hist,), {"subgroups": True} if subgroups else {})
        src = _bind(eqns, Op.RADIX_SCATTER, (src, scanned),
                    {"shift": shift, "block": block, "first": first, "last": last,
                     "planes": planes, **common, **sp},
                    final if last and not specials else None)
    if specials:
        p = {"block": block, "descending": common["descending"]}
        counts = _bind(eqns, Op.SORT_SPECIALS, (src, x, scanned), p)
        src = _bind(eqns, Op.SORT_FIXUP, (src, x, counts, scanned),
                    {**p, "writes_into": ((0, 0),)}, final)
    return src


def _merge(src: Var, final: Var | None, common: dict[str, Any], eqns: list[Eqn]) -> Var:
    n = src.shape[-1]
    state = _bind(eqns, Op.SORT_BLOCKS, (src,), {"block": kernels.LOCAL_MAX, **common})
    run = kernels.LOCAL_MAX
    while run < n:
        last = 2 * run >= n
        state = _bind(eqns, Op.SORT_MERGE, (state,), {"run": run, "last": last, **common},
                      final if last else None)
        run *= 2
    return state


def _lower(e: Eqn, eqns: list[Eqn], target: str, workgroup_storage: int,
           subgroups: int) -> None:
    x = e.inputs[0]
    assert isinstance(x, Var)
    n = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    common = {"descending": bool(e.params.get("descending", False)),
              "values": e.op is Op.SORT, "dtype": x.dtype}
    src = x if x.shape == (rows, n) else _bind(eqns, Op.RESHAPE, (x,), {"shape": (rows, n)})
    final = e.out if e.out.shape == (rows, n) else None
    if target == "gpu":
        block = kernels.radix_block(workgroup_storage)
        while block // 2 >= max(n, kernels.RADIX_BLOCKS[-1]):  # short rows: blocks they fill
            block //= 2
        out = _radix(src, final, common, block, eqns, subgroups)
    else:
        out = _merge(src, final, common, eqns)
    if out is not e.out:
        _bind(eqns, Op.RESHAPE, (out,), {"shape": e.out.shape}, e.out)


def lower_sort(prog: Program, target: str = "gpu", workgroup_storage: int = 16384,
               subgroups: int = 0) -> Program:
    """Replace each ``argsort`` and ``sort`` of rows longer than LOCAL_MAX by its stages: radix
    passes for ``target`` "gpu" (blocks as large as ``workgroup_storage`` bytes of workgroup
    memory allow; their scans and ranking use subgroup operations where the device has them:
    ``subgroups``, as Options.subgroups), merges of sorted blocks for "cpu"."""
    if not any(e.op in (Op.ARGSORT, Op.SORT) for e in prog.eqns):
        return prog
    eqns: list[Eqn] = []
    for e in prog.eqns:
        if e.op in (Op.ARGSORT, Op.SORT) and e.out.shape[-1] > kernels.LOCAL_MAX and e.out.size:
            _lower(e, eqns, target, workgroup_storage, subgroups)
        else:
            eqns.append(e)
    return Program(list(prog.inputs), eqns, list(prog.outputs))
