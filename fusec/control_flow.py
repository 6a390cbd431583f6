"""Compiled control flow with JAX's signatures: ``fori_loop``, ``while_loop``, ``scan``, ``cond``
and ``switch`` (:mod:`fusec.lax` exports them).

Each traces its functions once into a program of their own (:func:`fusec.trace.trace_function`)
and checks that a loop body keeps its carry's pytree structure, shapes and dtypes, and that
branches agree. Then:

* A loop with a static trip count of at most :data:`UNROLL_MAX` (or ``unroll=`` covering all of
  it) is unrolled: the body's equations are emitted once per iteration into the enclosing trace,
  where they fuse with each other and with the work around them.
* Otherwise it becomes one ``loop`` equation (:class:`fusec.ir.Op.LOOP`) holding the body program
  and the trip count: the IR does not grow with the trip count. The passes lower the body to
  kernels of its own; the runtime records its dispatches ``trips`` times into the call's one
  compute pass (see :mod:`fusec.passes.loops` and ``runtime._LoopRun``). A loop counter, where
  the body reads it, is one more carry (int32), so every iteration's dispatches are identical.
* ``scan`` reads ``xs`` at the counter with a dynamic gather and writes each ``y`` into a stacked
  buffer with a scatter that updates that buffer in place (no copy of ``ys`` per iteration).
* ``while_loop`` runs a *guarded* body, ``carry' = where(p, body(carry), carry)`` and
  ``p' = p and cond(carry')``, so iterations past the stop change nothing; the runtime runs it in
  chunks of iterations per submit and reads the flag ``p`` once per chunk.
* ``cond`` and ``switch`` evaluate every branch (pure functions) and select the results with
  ``where``: no readback and no second submit; the branches fuse with the work around them.

Like the other :mod:`fusec.lax` functions they trace inside ``gpu_jit`` and, outside it, compile
and run eagerly (one compiled function per function object and argument signature).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, Optional, Union

import numpy as np

from . import dtypes
from .errors import CarryError, DTypeError, ShapeError
from .ir import Eqn, Lit, Op, Program, Var, type_str
from .numpy._base import _elementwise, _traceable, _tracer
from .numpy.creation import zeros
from .numpy.manipulation import stack
from .trace import Aval, Closed, Tracer, current_builder, inline, trace_function
from .tree import TreeDef, describe, flatten, flatten_with_paths, unflatten

__all__ = ["fori_loop", "while_loop", "scan", "cond", "switch", "UNROLL_MAX"]

# Static trip counts up to this are unrolled at trace time: a few copies of the body fuse with
# each other and cost no loop machinery.
UNROLL_MAX = 4

# A loop body's per-trace data (Builder.side: its custom_vjp calls, which the body's marker
# equations name by key), by body: the loop's transforms (fusec.control_flow_ad) inline the body
# again and need it. Not a param: params are printed and hashed, and this holds functions.
BODY_SIDE: weakref.WeakKeyDictionary[Program, dict[str, Any]] = weakref.WeakKeyDictionary()

AtomT = Union[Tracer, Lit]


# --- helpers --------------------------------------------------------------------------------------


def _builder() -> Any:
    b = current_builder()
    assert b is not None, "control flow traces inside a trace (_traceable ensures one)"
    return b


def _aval(t: Tracer) -> Aval:
    return Aval(t.shape, t.var.dtype, t.weak)


def _avals(ts: Sequence[Tracer]) -> list[Aval]:
    return [_aval(t) for t in ts]


def _trace(fun: Callable[..., Any], avals: Sequence[Aval], name: str) -> Closed:
    """Trace ``fun`` taking one argument per leaf."""
    return trace_function(fun, flatten(tuple(range(len(avals))))[1], avals, name)


def _leaves(tree: Any, path: str) -> tuple[list[str], list[Tracer], TreeDef]:
    """A pytree's leaves as traced values (Python scalars stay weakly typed), their paths and
    the tree's structure."""
    leaves, td = flatten_with_paths(tree, path)
    return [p for p, _ in leaves], [_tracer(x) for _, x in leaves], td


def _arrays(atoms: Sequence[AtomT], weak: Sequence[bool]) -> list[Tracer]:
    """Results as traced arrays: a literal a body returned becomes a 0-d value."""
    b = _builder()
    out: list[Tracer] = []
    for a, w in zip(atoms, weak):
        if isinstance(a, Lit):
            out.append(b.bind(Op.BROADCAST, [a], {"shape": ()}, weak=w))
        else:
            out.append(a)
    return out


def _scalar(value: int, dtype: str = "int32", weak: bool = True) -> Tracer:
    return _builder().bind(Op.BROADCAST, [Lit(value, dtype)], {"shape": ()}, weak=weak)


def _out_paths(closed: Closed, root: str) -> list[str]:
    tree = unflatten(closed.out_tree, list(range(len(closed.program.outputs))))
    return [p for p, _ in flatten_with_paths(tree, root)[0]]


def _check_carry(fname: str, what: str, tree: TreeDef, paths: Sequence[str],
                 want: Sequence[Aval], out_tree: TreeDef, got: Sequence[Aval]) -> None:
    """A loop body must give back its carry with the same structure, shapes and dtypes."""
    if out_tree != tree:
        raise CarryError(f"{fname}: {what} returned a carry structured as {describe(out_tree)}, "
                         f"but the initial carry is {describe(tree)}; a loop's carry must keep "
                         "its pytree structure")
    for p, w, g in zip(paths, want, got):
        if (w.shape, w.dtype) != (g.shape, g.dtype):
            raise CarryError(
                f"{fname}: {what} changed the carry at {p} from "
                f"{type_str(w.shape, w.dtype)} to {type_str(g.shape, g.dtype)}; a loop's carry "
                "must keep its shape and dtype (start from a value of the type the body returns, "
                "or cast inside the body)")


def _uses(prog: Program, v: Var) -> bool:
    return any(a is v for e in prog.eqns for a in e.inputs) or any(o is v for o in prog.outputs)


def _mark_inplace(body: Program, n: int) -> list[int]:
    """Carries the body only updates with scatters (``buf.at[i].set(v)``, scan's stacked
    ``ys``): carry k whose input is read once, by a chain of scatters (each the operand of the
    next) ending in output k, read by nothing else. Such a carry keeps one buffer for the whole
    loop, which the scatters update in place (``into_operand``), instead of being copied into
    the other of two buffers every iteration. Returns those k; marks their scatters."""
    uses: dict[int, int] = {}
    consumer: dict[int, int] = {}
    for i, e in enumerate(body.eqns):
        for a in e.inputs:
            if isinstance(a, Var):
                uses[id(a)] = uses.get(id(a), 0) + 1
                consumer[id(a)] = i
    for o in body.outputs:
        if isinstance(o, Var):
            uses[id(o)] = uses.get(id(o), 0) + 1
    found = []
    for k in range(n):
        v: Any = body.inputs[k]
        if v.dtype == "float16":
            continue  # its scatters run on a float32 copy (passes/widen.py): not in place
        chain: list[int] = []
        while uses.get(id(v), 0) == 1 and id(v) in consumer:
            i = consumer[id(v)]
            e = body.eqns[i]
            if e.op is not Op.SCATTER or e.inputs[0] is not v:
                break
            chain.append(i)
            v = e.out
            if id(v) not in consumer:
                break
        if chain and body.outputs[k] is v and uses.get(id(v), 0) == 1:
            for i in chain:
                e = body.eqns[i]
                body.eqns[i] = Eqn(e.op, e.inputs, e.outs, {**e.params, "into_operand": True})
            found.append(k)
    return found


def _bind_loop(closed: Closed, init: Sequence[Tracer], trips: Optional[int],
               flag: Optional[int] = None, write_once: Sequence[int] = ()) -> list[Tracer]:
    """Emit one ``loop`` equation running ``closed`` (carries in, carries out) on ``init``.
    ``write_once``: carries (scan's ys) that start as constants and that the body updates in
    place, each iteration writing rows no other iteration writes (for reverse mode: their
    cotangent needs no zeroing of written rows, and their start gets none)."""
    b = _builder()
    prog = closed.program
    n = len(init)
    # carries the body returns as they are: loop invariants, not carries
    keep = [k for k in range(n) if prog.outputs[k] is not prog.inputs[k]]
    if not keep:
        return list(init)
    same = [k for k in range(n) if k not in keep]
    body = Program([prog.inputs[k] for k in keep] + [prog.inputs[k] for k in same]
                   + list(prog.inputs[n:]), list(prog.eqns), [prog.outputs[k] for k in keep])
    inplace = _mark_inplace(body, len(keep)) if flag is None else []
    invariants: list[Tracer] = [init[k] for k in same]
    invariants += [b.const(v) for v in closed.const_values]
    invariants += [b.adopt(t) for t in closed.captured]
    params: dict[str, Any] = {"body": body, "carries": len(keep), "trips": trips,
                              "inplace": tuple((k, k) for k in inplace)}
    if flag is not None:
        params["flag"] = keep.index(flag)
    once = tuple(keep.index(k) for k in write_once if k in keep and keep.index(k) in inplace)
    if once:
        params["write_once"] = once
    if closed.side:
        BODY_SIDE[body] = closed.side
    res = b.bind_multi(Op.LOOP, [init[k] for k in keep] + invariants, params, len(keep))
    final = list(init)
    for k, r in zip(keep, res):
        final[k] = Tracer(r.var, b, init[k].weak)
    return final


def _counted(step: Callable[[Tracer, list[AtomT]], list[AtomT]], init: list[Tracer],
             start: int, trips: int, unroll: int, uses_i: bool, name: str,
             write_once: Sequence[int] = ()) -> list[AtomT]:
    """Run ``step(i, carries)`` for i = start .. start + trips - 1: unrolled when short, else one
    loop equation whose body runs ``unroll`` steps (the remainder unrolled after it)."""
    c: list[AtomT] = list(init)
    if trips <= UNROLL_MAX or unroll >= trips:
        for t in range(trips):
            c = step(_scalar(start + t), c)
        return c
    k = max(1, unroll)
    n_iter, rem = divmod(trips, k)
    avals = _avals(init)

    def body_i(i: Tracer, *cs: Tracer) -> list[AtomT]:
        cur: list[AtomT] = list(cs)
        for u in range(k):
            cur = step(i if u == 0 else _elementwise(Op.ADD, i, u), cur)
        return [_elementwise(Op.ADD, i, k), *cur]

    if uses_i:
        closed = _trace(body_i, [Aval((), "int32", True), *avals], name)
        res = _bind_loop(closed, [_scalar(start), *init], n_iter,
                         write_once=[1 + k for k in write_once])[1:]
    else:
        closed = _trace(lambda *cs: body_i(_scalar(0), *cs)[1:], avals, name)
        res = _bind_loop(closed, init, n_iter, write_once=write_once)
    c = list(res)
    for t in range(rem):
        c = step(_scalar(start + n_iter * k + t), c)
    return c


def _static_int(x: Any, what: str, fname: str) -> Optional[int]:
    """``x`` as a Python int if it is a static integer; None if it is an array or traced."""
    if isinstance(x, (bool, np.bool_)):
        raise DTypeError(f"{fname}: {what} is the bool {x!r}; loop bounds must be integers")
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        raise DTypeError(f"{fname}: {what} is the float {x!r}; loop bounds must be integers")
    return None


def _unroll_count(unroll: Any, trips: int, fname: str) -> int:
    if unroll is None or unroll is False:
        return 1
    if unroll is True:
        return max(trips, 1)
    if isinstance(unroll, (int, np.integer)) and int(unroll) >= 1:
        return int(unroll)
    raise ValueError(f"{fname}: unroll must be a positive int or a bool; got {unroll!r}")


# --- fori_loop ------------------------------------------------------------------------------------


@_traceable
def fori_loop(lower: Any, upper: Any, body_fun: Callable[[Any, Any], Any], init_val: Any, *,
              unroll: Any = None) -> Any:
    """``val = body_fun(i, val)`` for ``i`` from ``lower`` to ``upper - 1``; returns ``val``.

    ``init_val`` is a pytree of arrays; ``body_fun`` must return one of the same structure,
    shapes and dtypes. With Python-int bounds the trip count is static: up to
    :data:`UNROLL_MAX` iterations are unrolled, more become one compiled loop (all iterations'
    dispatches in one submit); ``unroll=k`` puts k iterations in each loop step (``True``:
    all). With traced bounds it runs as a :func:`while_loop`. ``i`` is an int32 scalar."""
    lo = _static_int(lower, "lower", "fori_loop")
    hi = _static_int(upper, "upper", "fori_loop")
    paths, init, tree = _leaves(init_val, "init_val")
    if not callable(body_fun):
        raise TypeError(f"fori_loop: body_fun must be callable; got {type(body_fun).__name__}")
    if lo is None or hi is None:
        return _fori_dynamic(lower, upper, body_fun, init, tree, paths)
    avals = _avals(init)

    def step_fun(i: Tracer, *cs: Tracer) -> Any:
        return body_fun(i, unflatten(tree, cs))

    closed = _trace(step_fun, [Aval((), "int32", True), *avals], "fori_loop's body_fun")
    _check_carry("fori_loop", "body_fun", tree, paths, avals, closed.out_tree, closed.out_avals)
    trips = max(0, hi - lo)
    weak = [a.weak for a in avals]

    def step(i: Tracer, cs: list[AtomT]) -> list[AtomT]:
        return list(_arrays(inline(closed, [i, *cs]), closed.out_weak))

    uses_i = _uses(closed.program, closed.program.inputs[0])
    out = _counted(step, init, lo, trips, _unroll_count(unroll, trips, "fori_loop"), uses_i,
                   "fori_loop")
    return unflatten(tree, _arrays(out, weak))


def _bound(x: Any, what: str) -> Tracer:
    t = _tracer(x)
    if t.ndim != 0:
        raise ShapeError(f"fori_loop: {what} must be a scalar; got an array of shape {t.shape}")
    if t.var.dtype not in dtypes.INTS:
        raise DTypeError(f"fori_loop: {what} has dtype {t.var.dtype}; loop bounds must be "
                         "integers (int32 or uint32)")
    if t.var.dtype != "int32":
        t = _builder().bind(Op.CAST, [t], {"dtype": "int32"})
    return t


def _fori_dynamic(lower: Any, upper: Any, body_fun: Callable[[Any, Any], Any],
                  init: list[Tracer], tree: TreeDef, paths: list[str]) -> Any:
    """fori_loop with a bound known only when the program runs: a while loop over (i, val)."""
    lo = _bound(lower, "lower")
    hi = _bound(upper, "upper")

    def cond_fun(s: tuple[Any, Any]) -> Any:
        return s[0] < hi

    def body(s: tuple[Any, Any]) -> Any:
        return (s[0] + 1, body_fun(s[0], s[1]))

    val = unflatten(tree, init)
    _, res = _while(cond_fun, body, (lo, val), "fori_loop", "body_fun",
                    ["i", *paths])
    return res


# --- while_loop -----------------------------------------------------------------------------------


@_traceable
def while_loop(cond_fun: Callable[[Any], Any], body_fun: Callable[[Any], Any],
               init_val: Any) -> Any:
    """``while cond_fun(val): val = body_fun(val)``; returns ``val``.

    ``cond_fun`` must return a boolean scalar; ``body_fun`` a pytree of the structure, shapes
    and dtypes of ``init_val``. The stop is data-dependent: the loop runs on the device in
    chunks of iterations (2, 4, 8, ... up to 64, ``FUSEC_WHILE_CHUNK_MAX``), each followed by a
    read of one flag, so a call that contains a while loop waits for it to finish."""
    for name, f in (("cond_fun", cond_fun), ("body_fun", body_fun)):
        if not callable(f):
            raise TypeError(f"while_loop: {name} must be callable; got {type(f).__name__}")
    leaves, _ = flatten_with_paths(init_val, "init_val")
    return _while(cond_fun, body_fun, init_val, "while_loop", "body_fun",
                  [p for p, _ in leaves])


def _while(cond_fun: Callable[[Any], Any], body_fun: Callable[[Any], Any], init_val: Any,
           fname: str, what: str, paths: list[str]) -> Any:
    _, init, tree = _leaves(init_val, "init_val")
    avals = _avals(init)
    weak = [a.weak for a in avals]
    cond_c = _trace(lambda *cs: cond_fun(unflatten(tree, cs)), avals, f"{fname}'s cond_fun")
    outs = cond_c.out_avals
    if cond_c.out_tree != ("leaf",) or outs[0].shape != () or outs[0].dtype != "bool":
        got = ", ".join(type_str(a.shape, a.dtype) for a in outs) or "nothing"
        raise CarryError(f"{fname}: cond_fun must return a boolean scalar; it returned {got}")
    body_c = _trace(lambda *cs: body_fun(unflatten(tree, cs)), avals, f"{fname}'s {what}")
    _check_carry(fname, what, tree, paths, avals, body_c.out_tree, body_c.out_avals)
    p0 = inline(cond_c, list(init))[0]
    if isinstance(p0, Lit) and not p0.value:
        return unflatten(tree, list(init))  # never runs
    p0t = _arrays([p0], [False])[0]

    def guarded(*leaves: Tracer) -> list[AtomT]:
        cs, p = list(leaves[:-1]), leaves[-1]
        bb = _builder()
        new = inline(body_c, cs)
        kept: list[AtomT] = [o if n is o else bb.bind(Op.WHERE, [p, n, o], weak=o.weak)
                             for n, o in zip(new, cs)]
        q = inline(cond_c, kept)[0]
        return [*kept, bb.bind(Op.AND, [p, q])]

    closed = _trace(guarded, [*avals, Aval((), "bool")], fname)
    res = _bind_loop(closed, [*init, p0t], None, flag=len(init))
    return unflatten(tree, _arrays(res[:-1], weak))


# --- scan -----------------------------------------------------------------------------------------


@_traceable
def scan(f: Callable[[Any, Any], tuple[Any, Any]], init: Any, xs: Any = None,
         length: Optional[int] = None, reverse: bool = False, unroll: Any = 1) -> tuple[Any, Any]:
    """``carry, y = f(carry, x)`` for each ``x`` along the leading axis of ``xs`` (pytrees
    allowed); returns the final carry and the ``y``s stacked along a new leading axis.

    With ``xs=None``, ``length`` gives the number of iterations and ``f`` gets ``None``.
    ``reverse=True`` runs from the last element to the first (``ys[i]`` still belongs to
    ``xs[i]``). ``unroll=k`` runs k steps per loop iteration (``True``: unroll all). Scans of at
    most :data:`UNROLL_MAX` steps are unrolled; longer ones are one compiled loop whose body
    gathers ``xs[i]`` and scatters ``y`` into the stacked result in place."""
    if not callable(f):
        raise TypeError(f"scan: f must be callable; got {type(f).__name__}")
    cpaths, cinit, ctree = _leaves(init, "init")
    xpaths, xts, xtree = _leaves(xs, "xs")
    n = _scan_length(xpaths, xts, length)
    nc = len(cinit)
    avals = _avals(cinit)
    xavals = [Aval(t.shape[1:], t.var.dtype, t.weak) for t in xts]
    ytree: list[TreeDef] = []
    ctree_out: list[TreeDef] = []

    def step_fun(*leaves: Tracer) -> Any:
        carry = unflatten(ctree, leaves[:nc])
        x = unflatten(xtree, leaves[nc:])
        res = f(carry, x)
        if not isinstance(res, (tuple, list)) or len(res) != 2:
            raise CarryError(f"scan: f must return a pair (carry, y); got {type(res).__name__}")
        cl, ctd = flatten(res[0])
        yl, ytd = flatten(res[1])
        ctree_out.append(ctd)
        ytree.append(ytd)
        return (*cl, *yl)

    closed = _trace(step_fun, [*avals, *xavals], "scan's f")
    out_avals = closed.out_avals
    _check_carry("scan", "f", ctree, cpaths, avals, ctree_out[0], out_avals[:nc])
    yavals = out_avals[nc:]
    cweak = [a.weak for a in avals]
    u = _unroll_count(unroll, n, "scan")

    def x_at(i: Any) -> list[Tracer]:
        """Each xs leaf's element at iteration i (a Python int: a static slice)."""
        if isinstance(i, int):
            return [t[i] for t in xts]
        return [_row(t, i) for t in xts]

    def position(i: Any) -> Any:
        if isinstance(i, int):
            return n - 1 - i if reverse else i
        return _elementwise(Op.SUB, n - 1, i) if reverse else i

    if n <= UNROLL_MAX or u >= n:
        c: list[AtomT] = list(cinit)
        ys: list[list[Tracer]] = [[] for _ in yavals]
        for t in range(n):
            res = inline(closed, [*c, *x_at(position(t))])
            c = res[:nc]
            for k, y in enumerate(_arrays(res[nc:], [a.weak for a in yavals])):
                ys[k].append(y)
        if reverse:
            ys = [list(reversed(col)) for col in ys]
        stacked = [stack(col) if col else zeros((0, *a.shape), a.dtype)
                   for col, a in zip(ys, yavals)]
        return unflatten(ctree, _arrays(c, cweak)), unflatten(ytree[0], stacked)

    def step(i: Tracer, state: list[AtomT]) -> list[AtomT]:
        pos = position(i)
        res = inline(closed, [*state[:nc], *x_at(pos)])
        ys = _arrays(res[nc:], [a.weak for a in yavals])
        bufs = [buf.at[pos].set(y) for buf, y in zip(state[nc:], ys)]  # type: ignore
        return [*_arrays(res[:nc], cweak), *bufs]

    ybufs = [zeros((n, *a.shape), a.dtype) for a in yavals]
    uses_i = bool(xts) or bool(yavals)
    out = _counted(step, [*cinit, *ybufs], 0, n, u, uses_i, "scan",
                   write_once=range(nc, nc + len(ybufs)))
    return (unflatten(ctree, _arrays(out[:nc], cweak)), unflatten(ytree[0], list(out[nc:])))


def _row(x: Tracer, i: Tracer) -> Tracer:
    """``x[i]`` for a traced index known to be in range (scan's counter): a gather that the
    kernels reading the row compute themselves."""
    b = _builder()
    shape = x.shape[1:]
    idx: list[AtomT] = [i]
    for k in range(len(shape)):
        idx.append(b.bind(Op.IOTA, [], {"shape": shape, "axis": k, "dtype": "int32"}))
    return b.bind(Op.GATHER, [x, *idx], weak=x.weak)


def _scan_length(paths: list[str], xts: list[Tracer], length: Optional[int]) -> int:
    if length is not None:
        if isinstance(length, (bool, np.bool_)) or not isinstance(length, (int, np.integer)) or (
                length < 0):
            raise ShapeError(f"scan: length must be a non-negative Python int; got {length!r}")
    for p, t in zip(paths, xts):
        if t.ndim == 0:
            raise ShapeError(f"scan: xs leaf {p} is a scalar; every xs leaf needs a leading "
                             "axis to scan over")
    lens = {t.shape[0] for t in xts}
    if len(lens) > 1:
        listed = ", ".join(f"{p} has {t.shape[0]}" for p, t in zip(paths, xts))
        raise ShapeError(f"scan: the xs leaves have different leading lengths ({listed})")
    if lens:
        n = lens.pop()
        if length is not None and int(length) != n:
            raise ShapeError(f"scan: length={length} but xs leaf {paths[0]} has leading length "
                             f"{n}")
        return n
    if length is None:
        raise ShapeError("scan: with xs=None (or no xs leaves), give length")
    return int(length)


# --- cond / switch --------------------------------------------------------------------------------


def _check_branches(fname: str, closed: Sequence[tuple[str, Closed]]) -> None:
    """Every branch returns the structure, shapes and dtypes of the first."""
    name0, c0 = closed[0]
    paths = _out_paths(c0, "output")
    for name, c in closed[1:]:
        if c.out_tree != c0.out_tree:
            raise CarryError(f"{fname}: {name0} and {name} must return the same structure; "
                             f"{name0} returns {describe(c0.out_tree)} and {name} "
                             f"{describe(c.out_tree)}")
        for p, a, b in zip(paths, c0.out_avals, c.out_avals):
            if (a.shape, a.dtype) != (b.shape, b.dtype):
                raise CarryError(f"{fname}: {name0} and {name} must return the same shapes and "
                                 f"dtypes; at {p} {name0} returns {type_str(a.shape, a.dtype)} "
                                 f"and {name} {type_str(b.shape, b.dtype)}")


def _select(pred: Tracer, a: Sequence[AtomT], b: Sequence[AtomT], wa: Sequence[bool],
            wb: Sequence[bool]) -> list[Tracer]:
    """``where(pred, a, b)`` leaf by leaf (a result both sides share is kept as it is)."""
    bl = _builder()
    out: list[Tracer] = []
    for x, y, u, v in zip(a, b, wa, wb):
        if x is y and isinstance(x, Tracer):
            out.append(x)
        else:
            out.append(bl.bind(Op.WHERE, [pred, x, y], weak=u and v))
    return out


def _branch_operands(operands: tuple[Any, ...]) -> tuple[list[Tracer], TreeDef, list[Aval]]:
    _, ts, tree = _leaves(operands, "operands")
    return ts, tree, _avals(ts)


def _trace_branch(fun: Callable[..., Any], tree: TreeDef, avals: list[Aval], name: str
                  ) -> Closed:
    if not callable(fun):
        raise TypeError(f"{name} must be callable; got {type(fun).__name__}")
    return _trace(lambda *ls: fun(*unflatten(tree, ls)), avals, name)


@_traceable
def cond(pred: Any, true_fun: Callable[..., Any], false_fun: Callable[..., Any],
         *operands: Any) -> Any:
    """``true_fun(*operands)`` if ``pred`` else ``false_fun(*operands)``.

    ``pred`` is a boolean (or integer: non-zero is true) scalar. Both branches must return the
    same structure, shapes and dtypes. With a traced ``pred`` both are computed and each result
    leaf is selected with ``where`` (branches are pure functions, so this is exact); with a
    Python bool only the chosen one is."""
    static: Optional[bool] = None
    if isinstance(pred, (bool, np.bool_, int, np.integer)) and not isinstance(pred, np.ndarray):
        static = bool(pred)
    else:
        p = _tracer(pred)
        if p.ndim != 0:
            raise ShapeError(f"cond: pred must be a scalar; got an array of shape {p.shape}")
        if p.var.dtype != "bool":
            if p.var.dtype not in dtypes.INTS:
                raise DTypeError(f"cond: pred has dtype {p.var.dtype}; it must be a boolean "
                                 "(or integer) scalar")
            p = _builder().bind(Op.NE, [p, Lit(0, p.var.dtype)])
    ts, tree, avals = _branch_operands(operands)
    ct = _trace_branch(true_fun, tree, avals, "cond's true_fun")
    cf = _trace_branch(false_fun, tree, avals, "cond's false_fun")
    _check_branches("cond", [("true_fun", ct), ("false_fun", cf)])
    if static is not None:
        chosen = ct if static else cf
        return unflatten(chosen.out_tree, _arrays(inline(chosen, ts), chosen.out_weak))
    out = _select(p, inline(ct, ts), inline(cf, ts), ct.out_weak, cf.out_weak)
    return unflatten(ct.out_tree, out)


@_traceable
def switch(index: Any, branches: Sequence[Callable[..., Any]], *operands: Any) -> Any:
    """``branches[index](*operands)``, with ``index`` clamped into ``[0, len(branches) - 1]``
    as in JAX. Every branch must return the same structure, shapes and dtypes; with a traced
    index all are computed and the results selected with ``where``."""
    try:
        fns = list(branches)
    except TypeError:
        raise TypeError(f"switch: branches must be a sequence of callables; got "
                        f"{type(branches).__name__}") from None
    if not fns:
        raise ValueError("switch: branches must not be empty")
    ts, tree, avals = _branch_operands(operands)
    closed = [_trace_branch(f, tree, avals, f"switch's branches[{k}]") for k, f in enumerate(fns)]
    _check_branches("switch", [(f"branches[{k}]", c) for k, c in enumerate(closed)])
    n = len(fns)
    if isinstance(index, (bool, np.bool_)):
        index = int(index)
    if isinstance(index, (int, np.integer)) and not isinstance(index, np.ndarray):
        chosen = closed[min(max(int(index), 0), n - 1)]
        return unflatten(chosen.out_tree, _arrays(inline(chosen, ts), chosen.out_weak))
    t = _tracer(index)
    if t.ndim != 0:
        raise ShapeError(f"switch: index must be a scalar; got an array of shape {t.shape}")
    if t.var.dtype not in dtypes.INTS:
        raise DTypeError(f"switch: index has dtype {t.var.dtype}; it must be an integer scalar")
    b = _builder()
    if t.var.dtype == "uint32":
        t = b.bind(Op.CAST, [_elementwise(Op.MIN, t, n - 1)], {"dtype": "int32"})
    t = _elementwise(Op.MIN, _elementwise(Op.MAX, t, 0), n - 1)
    res: list[AtomT] = inline(closed[0], ts)
    weak = list(closed[0].out_weak)
    for k in range(1, n):
        hit = b.bind(Op.EQ, [t, Lit(k, "int32")])
        res = list(_select(hit, inline(closed[k], ts), res, closed[k].out_weak, weak))
        weak = [u and v for u, v in zip(weak, closed[k].out_weak)]
    return unflatten(closed[0].out_tree, _arrays(res, weak))
