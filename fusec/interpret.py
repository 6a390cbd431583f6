"""A numpy evaluator of the IR: the definition of every op, the oracle for tests, the CPU fallback.

It runs traced programs and lowered ones (``kernel`` equations run their bodies), computing in the
program's own dtypes (float32 stays float32), so it matches what the GPU should produce up to
rounding. float16 is stored as numpy's float16 and computed as numpy computes it, except that sums,
products and matmuls accumulate in float32 and round once, as the GPU's kernels do.

It is also the backend on a machine whose only adapter is a software one (runtime.CpuExecutable),
so it avoids waste: values are numpy views where an op allows one (a broadcast, a reshape or a
transpose copies nothing), a matmul by a weight broadcast over the batch is one BLAS call on the
flattened rows, and only the program's outputs are copied (they must not alias an input). Each
value is dropped after its last use, and a float32 elementwise op writes into the buffer of an
operand that nothing else references any more (numpy's own temporary elision, done across
equations): allocating a fresh multi-megabyte result costs more than computing it.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Optional

import numpy as np

from . import config
from .ir import MOVEMENT, Eqn, Lit, Op, Program, type_str
from .ops import (
    ELEMENTWISE,
    NUMPY_RULES,
    REDUCTIONS,
    compact,
    dequant_numpy,
    float_ufunc,
    gather_numpy,
    iota_numpy,
    numpy_elementwise,
    partial_numpy,
    qmatmul_dequantized,
    slice_numpy,
)


def lit_value(lit: Lit) -> np.ndarray:
    return np.asarray(lit.value, dtype=np.dtype(lit.dtype))


def _ref_counts(arrays: Sequence[Any], i: int) -> tuple[int, int]:
    """References to arrays[i] and to its base (0 for none), this function's own included."""
    x = arrays[i]
    base = x.base
    return sys.getrefcount(x), (0 if base is None else sys.getrefcount(base))


# The counts above for an array referenced only by the list it is passed in, and for a view whose
# base only it references, measured rather than assumed (they differ between Pythons): an operand
# counted higher is referenced from elsewhere (a live value, another view, the caller) and is
# never written into.
_DEAD_REFS = _ref_counts([np.empty(2)], 0)[0]
_DEAD_BASE_REFS = _ref_counts([np.empty(4).reshape(2, 2)], 0)[1]
_F32 = np.dtype(np.float32)
_F16 = np.dtype(np.float16)
_ACCUMULATING = (Op.SUM, Op.PROD)  # reductions a float16 operand runs in float32 for


def _whole_float32(x: Any, shape: tuple[int, ...]) -> bool:
    """x is a writable C-ordered float32 array of ``shape`` that is all of its buffer."""
    if (type(x) is not np.ndarray or x.dtype != _F32 or x.shape != shape or x.size == 0
            or not x.flags.writeable or not x.flags.c_contiguous):
        return False
    base = x.base
    return base is None or (type(base) is np.ndarray and base.base is None
                            and base.size == x.size)


def _dead_operand(args: Sequence[np.ndarray], shape: tuple[int, ...]) -> Optional[np.ndarray]:
    """A float32 operand of ``shape`` whose buffer nothing else uses: the result may overwrite it.
    The evaluator drops every value at its last use, so counts at the minimum mean that no later
    equation, output, view or caller can see the buffer."""
    for i in range(len(args)):
        if _whole_float32(args[i], shape):
            refs, base_refs = _ref_counts(args, i)
            if refs <= _DEAD_REFS and base_refs <= _DEAD_BASE_REFS:
                return args[i]
    return None


def _matmul_float(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b for float32. A ``b`` whose batch axes are a broadcast (stride 0: one weight matrix
    for every batch entry, as a dense layer traces) multiplies all of a's rows at once: one large
    BLAS call instead of one small one per batch entry, and the broadcast is never copied."""
    if b.ndim > 2 and a.ndim == b.ndim and a.size and not any(b.strides[:-2]):
        w = b[(0,) * (b.ndim - 2)]
        return (a.reshape(-1, a.shape[-1]) @ w).reshape(a.shape[:-1] + (w.shape[-1],))
    return np.matmul(a, b)


# Quantized weights' dequantised matrices, kept between calls. A decode step of SmolLM2-135M
# spent 82% of its time dequantising its 98 MB of weights again (0.44 s a token on 2 cores); its
# products themselves take 23 ms through BLAS. Kept only for words whose array owns its memory
# and is read-only, as fusec's arrays are (no one writes into them), and only while that array
# lives: by (id, address, shape, strides) of the view read and the format, with a weak reference
# to the array. FUSEC_DEQUANT_CACHE_MB bounds the bytes kept; past it, matrices are dequantised
# at each use.
_DEQUANT: dict[tuple[Any, ...], tuple[weakref.ref[np.ndarray], np.ndarray]] = {}
# re-entrant: a weak reference's callback (_forget) may run inside the locked blocks, where an
# allocation sets off the cycle collector
_DEQUANT_LOCK = threading.RLock()
_dequant_bytes = 0


def _forget(root_id: int) -> None:
    global _dequant_bytes
    with _DEQUANT_LOCK:
        for key in [k for k in _DEQUANT if k[0] == root_id]:
            _dequant_bytes -= _DEQUANT.pop(key)[1].nbytes


def dequantized(words: np.ndarray, fmt: str, shape: tuple[int, int]) -> np.ndarray:
    """The float32 (N, K) matrix ``words`` hold (:func:`fusec.ops.dequant_numpy`), read-only,
    from the cache above where it may be kept."""
    global _dequant_bytes
    root = words
    while isinstance(root.base, np.ndarray):
        root = root.base
    limit = int(config.get("dequant_cache_mb")) << 20
    if limit <= 0 or root.base is not None or root.flags.writeable:
        return dequant_numpy(words, fmt, shape)
    key = (id(root), words.__array_interface__["data"][0], words.shape, words.strides, fmt,
           tuple(shape))
    with _DEQUANT_LOCK:
        hit = _DEQUANT.get(key)
    if hit is not None and hit[0]() is root:
        return hit[1]
    w = dequant_numpy(words, fmt, shape)
    w.flags.writeable = False
    with _DEQUANT_LOCK:
        if _dequant_bytes + w.nbytes <= limit and key not in _DEQUANT:
            root_id = id(root)
            _DEQUANT[key] = (weakref.ref(root, lambda _: _forget(root_id)), w)
            _dequant_bytes += w.nbytes
    return w


def eval_eqn(e: Eqn, args: Sequence[np.ndarray],
             spent: Sequence[np.ndarray] = ()) -> list[np.ndarray]:
    """The results of ``e`` on ``args``. ``spent``: operands that are donated inputs at their
    last use, whose memory the result may take (see :func:`evaluate`)."""
    if e.op is Op.KERNEL:
        return evaluate(e.params["body"], args)
    if e.op is Op.LOOP:
        return eval_loop(e, args)
    return [_eval_primitive(e, args, spent)]


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


_WHERE_SLABS_MIN = 4096  # elements; below, np.where's one pass costs less than the set-up


def _where_along_one_axis(args: Sequence[np.ndarray], shape: tuple[int, ...],
                          dtype: str, spent: Sequence[np.ndarray] = ()) -> Optional[np.ndarray]:
    """``where(cond, a, b)`` whose condition varies along one axis only (a window's test, as
    ``dynamic_update_slice`` traces it: a decode step's cache update): a copy of the operand
    chosen most often, the other's slabs put in along that axis. A copy and a few slabs cost
    a third of np.where's pass over three arrays (a (1, 3, 1024, 64) cache: 0.15 ms). Where
    the operand chosen is in ``spent`` (a donated input at its last use: a decode step's
    cache) and is all of a writable buffer of the result's shape, the slabs go into it and
    nothing is copied. None where the condition varies along several axes or the dtypes
    differ."""
    cond, a, b = args
    if cond.ndim != len(shape) or a.dtype != dtype or b.dtype != dtype:
        return None
    c = compact(cond)  # the condition's distinct values
    axes = [j for j, n in enumerate(c.shape) if n > 1]
    if len(axes) != 1:
        return None
    j = axes[0]
    mask = c.reshape(-1).astype(bool)
    hits = np.flatnonzero(mask)
    base, other, pick = (b, a, hits) if 2 * hits.size <= mask.size else (
        a, b, np.flatnonzero(~mask))
    if any(base is x for x in spent) and base.shape == shape and base.flags.writeable \
            and base.flags.c_contiguous:
        out = base  # (the caller gave this buffer up: see evaluate's ``donated``)
    else:
        out = np.array(np.broadcast_to(base, shape), dtype=dtype)
    if pick.size:
        lo = int(pick[0])
        # one run of slabs (a window) as a slice: basic indexing, no index array
        at = slice(lo, lo + pick.size) if int(pick[-1]) - lo + 1 == pick.size else pick
        sel = (slice(None),) * j + (at,)
        out[sel] = np.broadcast_to(other, shape)[sel]
    return out


def _all_float32(args: Sequence[np.ndarray]) -> bool:
    for x in args:
        if x.dtype != _F32:
            return False
    return True


def _ufunc_result(ufunc: Any, args: Sequence[np.ndarray], shape: tuple[int, ...],
                  reuse: bool) -> np.ndarray:
    """A float32 elementwise op's result of ``shape`` through its ufunc, written into a dead
    operand's buffer where ``reuse`` allows and one is found (a 0-d result may come back as a
    numpy scalar)."""
    buf = _dead_operand(args, shape) if reuse else None
    if buf is not None:
        return ufunc(*args, out=buf)  # type: ignore[no-any-return]
    out = ufunc(*args)
    # (a read-only view only where the operands were all smaller: results stay writable)
    return out if out.shape == shape else np.broadcast_to(out, shape)


def _eval_primitive(e: Eqn, args: Sequence[np.ndarray],
                    spent: Sequence[np.ndarray] = ()) -> np.ndarray:
    op, p = e.op, e.params
    # (one dictionary lookup per equation, where there were up to five: an Op's hash runs
    # Python code, some 10,000 times a token in a decode step of SmolLM2)
    ufunc, kind = _KIND.get(op, _OTHER)
    if ufunc is not None and e.out.dtype == "float32" and _all_float32(args):
        # float32 elementwise ops straight through their ufunc: a decode step of SmolLM2 runs
        # some 1,500 of them on vectors, where the general path's dispatch and its floating-point
        # error state (evaluate ignores errors for the whole program) took 6 us an op against
        # the ufunc's 0.5. Small results are allocated afresh: searching for a dead operand
        # costs more than that there.
        return _ufunc_result(ufunc, args, e.out.shape, e.out.size >= _REUSE_MIN)
    if op is Op.WHERE and e.out.size >= _WHERE_SLABS_MIN:
        slabs = _where_along_one_axis(args, e.out.shape, e.out.dtype, spent)
        if slabs is not None:
            return slabs
    if kind == _ELEMENTWISE:
        out = numpy_elementwise(op, args, p, e.out.dtype)
        # (a read-only view only where the operands were all smaller: results stay writable)
        return out if out.shape == e.out.shape else np.broadcast_to(out, e.out.shape)
    if kind == _REDUCE:
        x = args[0]
        axes = tuple(p["axes"])
        if any(x.shape[a] == 0 for a in axes):  # numpy's max and min refuse; the GPU's identity
            return np.full(e.out.shape, REDUCTIONS[op].identity(x.dtype.name), dtype=x.dtype)
        if x.dtype == _F16 and op in _ACCUMULATING:
            with np.errstate(over="ignore"):
                return np.asarray(REDUCTIONS[op].numpy(x.astype(_F32), axis=axes)).astype(_F16)
        return np.asarray(REDUCTIONS[op].numpy(x, axis=axes), dtype=x.dtype)
    if op is Op.PARTIAL:
        x, red = args[0], Op(p["reduce"])
        if x.dtype == _F16 and red in _ACCUMULATING:
            with np.errstate(over="ignore"):
                return partial_numpy(x.astype(_F32), red, tuple(p["axes"]),
                                     int(p["chunks"])).astype(_F16)
        return partial_numpy(x, red, tuple(p["axes"]), int(p["chunks"]))
    if op is Op.MATMUL:
        a, b = args
        if a.dtype == np.float32:
            return _matmul_float(a, b)
        if a.dtype == _F16:  # accumulated in float32, rounded once
            with np.errstate(over="ignore"):
                return _matmul_float(a.astype(_F32), b.astype(_F32)).astype(_F16)
        # integers wrap around modulo 2**32 on the GPU; int64 products reduced the same way agree
        return np.matmul(a.astype(np.int64), b.astype(np.int64)).astype(a.dtype)
    if kind == _MOVEMENT:
        x = args[0]
        if op is Op.RESHAPE:
            return x.reshape(p["shape"])
        if op is Op.TRANSPOSE:
            return x.transpose(p["perm"])
        if op is Op.PAD:  # (np.pad costs some 40 us of Python even for a few elements)
            out = np.full(e.out.shape, p.get("value", 0), dtype=x.dtype)
            out[tuple(slice(lo, lo + d) for (lo, _), d in zip(p["widths"], x.shape))] = x
            return out
        if op is Op.SLICE:
            return slice_numpy(x, p["starts"], p["steps"], e.out.shape)
        return np.broadcast_to(x, p["shape"])
    if op is Op.IOTA:
        return iota_numpy(e.out.shape, int(p["axis"]), e.out.dtype)
    if op is Op.GATHER:
        return gather_numpy(args[0], args[1:], e.out.shape)
    if op is Op.QMATMUL:
        w = dequantized(args[1], str(p["fmt"]), (int(p["n"]), int(p["k"])))
        return qmatmul_dequantized(w, args, p, (e.out.shape, e.out.dtype))
    if op is Op.DEQUANT:  # (read-only: no later equation writes into it)
        shape = tuple(p["shape"])
        return dequantized(args[0], str(p["fmt"]), (int(shape[0]), int(shape[1])))
    if op in NUMPY_RULES:
        return NUMPY_RULES[op](args, p, (e.out.shape, e.out.dtype))
    raise NotImplementedError(f"interpreter: no rule for {op}")


# the ufuncs float32 elementwise ops compute with (and write into a dead operand's buffer with)
_UFUNCS = {op: f for op in ELEMENTWISE if (f := float_ufunc(op)) is not None}
# per op: its float32 ufunc (or None) and which of _eval_primitive's general paths takes it
_ELEMENTWISE, _REDUCE, _MOVEMENT = 1, 2, 3
_OTHER: tuple[Any, int] = (None, 0)
_KIND: dict[Op, tuple[Any, int]] = {
    **{op: (None, _MOVEMENT) for op in MOVEMENT},
    **{op: (None, _REDUCE) for op in REDUCTIONS},
    **{op: (_UFUNCS.get(op), _ELEMENTWISE) for op in (*ELEMENTWISE, Op.CAST, Op.IPOW)},
}
# elements from which a float32 elementwise result reuses a dead operand's buffer
_REUSE_MIN = 4096

# One step of a program's run, made once per program (_steps): the equation; the env keys of its
# operands (a literal's is its Lit's id, its array put in env at the start of a run); the values
# last used by it (dropped before it runs); for a float32 elementwise op over float32 operands
# (their dtypes are the IR's, which env's arrays keep), its ufunc, result shape and whether it may
# write into a dead operand's buffer; its outputs' ids and numpy dtypes.
_Step = tuple[Eqn, tuple[int, ...], list[int], Optional[tuple[int, Any, tuple[int, ...], bool]],
              tuple[tuple[int, np.dtype[Any]], ...]]
# what a step's fast path does: its ufunc (over float32 operands), or a movement op that keeps
# its operand's dtype (a view wherever numpy can make one)
_UFUNC, _RESHAPE, _TRANSPOSE, _BROADCAST = 0, 1, 2, 3

# per program: its steps and literals, with the equation list and its length they were made for (a
# program rebuilt in place is planned again)
_STEPS: weakref.WeakKeyDictionary[
    Program, tuple[int, int, list[_Step], list[tuple[int, np.ndarray]]]] = (
    weakref.WeakKeyDictionary())


def _steps(prog: Program) -> tuple[list[_Step], list[tuple[int, np.ndarray]]]:
    got = _STEPS.get(prog)
    if got is not None and got[0] == id(prog.eqns) and got[1] == len(prog.eqns):
        return got[2], got[3]
    last: dict[int, int] = {}
    lits: dict[int, np.ndarray] = {}
    for k, e in enumerate(prog.eqns):
        for a in e.inputs:
            if isinstance(a, Lit):
                # one array per literal for every run, read-only: no op takes its buffer
                # (_dead_operand wants a writable one, referenced by nothing else)
                arr = lit_value(a)
                arr.flags.writeable = False
                lits[id(a)] = arr
            else:
                last[id(a)] = k
    for o in prog.outputs:
        if not isinstance(o, Lit):
            last[id(o)] = len(prog.eqns)  # outputs live to the end
    dead: list[list[int]] = [[] for _ in prog.eqns]
    for v, k in last.items():
        if k < len(prog.eqns):
            dead[k].append(v)
    steps: list[_Step] = []
    for e, d in zip(prog.eqns, dead):
        ufunc = _KIND.get(e.op, _OTHER)[0]
        fast: Optional[tuple[int, Any, tuple[int, ...], bool]] = None
        if (ufunc is not None and len(e.outs) == 1 and e.out.dtype == "float32"
                and all(a.dtype == "float32" for a in e.inputs)):
            fast = (_UFUNC, ufunc, e.out.shape, e.out.size >= _REUSE_MIN)
        elif e.op is Op.RESHAPE:
            fast = (_RESHAPE, tuple(e.params["shape"]), e.out.shape, False)
        elif e.op is Op.TRANSPOSE:
            fast = (_TRANSPOSE, tuple(e.params["perm"]), e.out.shape, False)
        elif e.op is Op.BROADCAST:
            fast = (_BROADCAST, tuple(e.params["shape"]), e.out.shape, False)
        steps.append((e, tuple(id(a) for a in e.inputs), d, fast,
                      tuple((id(v), np.dtype(v.dtype)) for v in e.outs)))
    lit_list = list(lits.items())
    _STEPS[prog] = (id(prog.eqns), len(prog.eqns), steps, lit_list)
    return steps, lit_list


def evaluate(prog: Program, args: Sequence[Any],
             timings: Optional[list[tuple[str, float]]] = None,
             donated: Sequence[int] = ()) -> list[np.ndarray]:
    """Run ``prog`` on numpy arrays (one per program input); returns one array per output.
    ``timings``: append (op and result type, microseconds) for each of the program's equations
    (a loop or a kernel counts as one). ``donated``: inputs whose arrays the caller gives up
    (writable, seen by nobody else): an equation that is an input's last use may write its
    result into it (a decode step's cache update then writes the step's window in place)."""
    if len(args) != len(prog.inputs):
        raise ValueError(f"program takes {len(prog.inputs)} inputs, got {len(args)}")
    env: dict[int, np.ndarray] = {}
    spent = {id(prog.inputs[i]) for i in donated}
    for v, a in zip(prog.inputs, args):
        arr = np.asarray(a)
        if arr.dtype != np.dtype(v.dtype):
            arr = arr.astype(v.dtype)
        # a donated input's array itself, not a view (an output written into it is then
        # returned as it is)
        env[id(v)] = arr if id(v) in spent and arr.shape == v.shape else arr.reshape(v.shape)
    with np.errstate(all="ignore"):  # (as the GPU: inf and NaN, no warnings; entered once)
        return _run(prog, env, timings, spent)


def _run(prog: Program, env: dict[int, np.ndarray],
         timings: Optional[list[tuple[str, float]]], donated: AbstractSet[int] = frozenset()
         ) -> list[np.ndarray]:
    """Each equation of ``prog`` in turn, its operands read from ``env`` and its results
    stored there; each value dropped at its last use; a donated input's array (``donated``:
    their values' ids) offered to the equation that is its last use. Returns the outputs.

    A float32 elementwise op over float32 operands runs its ufunc here, and a reshape, transpose
    or broadcast its numpy view, without the general path's calls and checks (some 2,800 of a
    SmolLM2 decode step's 3,300 equations)."""
    steps, lits = _steps(prog)
    env.update(lits)
    for e, keys, dead, fast, outs in steps:
        ins = [env[k] for k in keys]
        spent = [env[vid] for vid in dead if vid in donated] if donated else ()
        for vid in dead:
            del env[vid]
        # (no local of this frame may keep a result alive into the next equation: that would
        # hide a dead operand from _dead_operand)
        if timings is not None:
            t0 = time.perf_counter()
            _store(env, outs, eval_eqn(e, ins, spent))
            timings.append((f"{e.op.value} {type_str(e.outs[0].shape, e.outs[0].dtype)}",
                            1e6 * (time.perf_counter() - t0)))
        elif fast is not None and fast[0] != _UFUNC:
            code, param = fast[0], fast[1]
            x = ins[0]
            env[outs[0][0]] = (x.reshape(param) if code == _RESHAPE else x.transpose(param)
                               if code == _TRANSPOSE else np.broadcast_to(x, param))
            del x
        elif fast is not None:
            out = np.asarray(_ufunc_result(fast[1], ins, fast[2], fast[3]))  # (keeps 0-d)
            env[outs[0][0]] = out if out.dtype == _F32 else out.astype(_F32)
            del out
        else:
            _store(env, outs, eval_eqn(e, ins, spent))
        del ins, spent
    return [_owned(lit_value(o) if isinstance(o, Lit) else env[id(o)]) for o in prog.outputs]


def _store(env: dict[int, np.ndarray], outs: tuple[tuple[int, np.dtype[Any]], ...],
           results: list[np.ndarray]) -> None:
    for (vid, dtype), out in zip(outs, results):
        # views stay views (no op writes into its operands); only a wrong dtype is converted
        arr = np.asarray(out)  # (keeps 0-d)
        if arr.dtype != dtype:
            arr = arr.astype(dtype)
        env[vid] = arr


def _owned(x: np.ndarray) -> np.ndarray:
    """An output as an array of its own: a view of an input, of a broadcast, of a literal or of
    another output is copied (the caller may keep or change it), a fresh result is not."""
    x = np.asarray(x)
    if x.base is None and x.flags.writeable and x.flags.c_contiguous:
        return x
    return np.array(x, order="C")
