"""Automatic differentiation: ``grad``, ``value_and_grad``, ``vjp``, ``jvp``, ``jacrev``,
``jacfwd`` and ``custom_vjp``.

fusec differentiates the traced program, not Python. A transform runs the function on fresh
tracers in the current trace and keeps the equations it appended (a *tape*). Reverse mode walks
the tape backwards, calling each op's rule from :data:`fusec.ops.VJP_RULES`; forward mode walks it
forwards with :data:`fusec.ops.JVP_RULES`. The rules emit ordinary equations into the same trace,
so the backward pass is one more part of the program: the pass pipeline fuses it, memory planning
places the activations it reads, and ``grad`` of ``grad`` differentiates those equations in turn.

Called outside ``gpu_jit``, a transformed function compiles itself for its arguments (cached per
signature, as ``gpu_jit`` does) and runs on the device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Optional, Union

import numpy as np

from . import dtypes, lax
from .errors import DTypeError, ShapeError, TraceError
from .ir import Eqn, Lit, Op, Var
from .jit import JitFunction
from .numpy._base import _tracer
from .ops import JVP_RULES, LOWERED_ONLY, NO_DERIVATIVE, VJP_RULES, ad_zeros
from .trace import Builder, Tracer, current_builder
from .tree import flatten_with_paths, num_leaves, unflatten

__all__ = ["grad", "value_and_grad", "vjp", "jvp", "jacrev", "jacfwd", "custom_vjp",
           "stop_gradient"]

Argnums = Union[int, Sequence[int]]


# --- taping ---------------------------------------------------------------------------------------


class _Tape:
    """The equations a function appended to a trace, between its fresh inputs and its results."""

    def __init__(self, b: Builder, inputs: list[Tracer]) -> None:
        self.b = b
        self.inputs = inputs
        self.start = len(b.eqns)
        self.eqns: list[Eqn] = []

    def close(self) -> None:
        self.eqns = self.b.eqns[self.start:]


def _fresh(b: Builder, x: Any, what: str) -> Tracer:
    """A differentiable input: a new variable of its own (an identity the passes remove), so that
    the same array passed twice gets two gradients and values computed before stay constants."""
    t = _tracer(x)
    if not dtypes.is_float(t.var.dtype):
        raise DTypeError(f"{what} is {t.var.dtype}; differentiation needs float32 or float16 "
                         "inputs (cast it with .astype('float32'), or leave it out of argnums)")
    return b.bind(Op.MUL, [t, Lit(1.0, t.var.dtype)], weak=t.weak)


def _like(c: Any, v: Var) -> Any:
    """The cotangent (or tangent) ``c`` in ``v``'s dtype: every value's cotangent has its
    value's dtype (a float16 value's is float16, as in JAX), whatever dtype a rule computed it
    in (a cast between float16 and float32 passes its cotangent through)."""
    if c is None or str(c.dtype) == v.dtype or not dtypes.is_float(v.dtype):
        return c
    return c.astype(v.dtype)


def _active(tape: _Tape) -> set[int]:
    """Variables that depend on the tape's inputs through float values."""
    live = {id(t.var) for t in tape.inputs}
    for e in tape.eqns:
        if any(isinstance(a, Var) and id(a) in live for a in e.inputs):
            for o in e.outs:
                if dtypes.is_float(o.dtype):
                    live.add(id(o))
    return live


def _as_tracer(b: Builder, a: Any) -> Any:
    """An equation's operand for a rule: a tracer of the tape's trace, or a Python scalar."""
    if isinstance(a, Lit):
        return a.value
    return Tracer(a, b)


def _rule(table: dict[Op, Any], op: Op, mode: str) -> Any:
    rule = table.get(op)
    if rule is None:
        if op in NO_DERIVATIVE:
            return None
        if op in LOWERED_ONLY:
            raise TraceError(f"autodiff met the lowered op {op.value}; differentiate traced "
                             "programs, not lowered ones")
        raise TraceError(f"{mode} has no rule for the op {op.value}")
    return rule


# --- custom_vjp registry --------------------------------------------------------------------------

# Each trace keeps its custom_vjp calls in Builder.side["custom_vjp"]: rule key -> (the user's
# backward function, residuals, input treedef (of the arguments' tuple), input vars (None: not
# differentiable), the call's output vars in order, output treedef, function name). Keys count per
# trace, so that programs (and their hashes) do not depend on what was traced before.


def _custom_calls(b: Builder) -> dict[int, Any]:
    return b.custom_vjp_calls()


def _backward(tape: _Tape, out_vars: Sequence[Any], out_cts: Sequence[Any]) -> list[Any]:
    """Cotangents of the tape's inputs, given those of ``out_vars`` (None: zero)."""
    b = current_builder()
    assert b is not None
    active = _active(tape)
    ct: dict[int, Any] = {}

    def add(v: Var, c: Any) -> None:
        if c is None or id(v) not in active:
            return
        if tuple(c.shape) != v.shape:
            raise TraceError(f"internal autodiff error: a cotangent of shape {tuple(c.shape)} "
                             f"for a value of shape {v.shape}")
        c = _like(c, v)
        ct[id(v)] = c if id(v) not in ct else ct[id(v)] + c

    for v, c in zip(out_vars, out_cts):
        if isinstance(v, Var) and c is not None:
            add(v, _tracer(c))
    done_groups: set[int] = set()
    for e in reversed(tape.eqns):
        cts = [ct.get(id(o)) for o in e.outs]
        if e.op is Op.CUSTOM_VJP:
            key = int(e.params["rule"])
            if key not in done_groups:
                done_groups.add(key)
                for v, c in _custom_backward(tape.b, key, ct):
                    add(v, c)
            continue
        if all(c is None for c in cts):
            continue
        if not any(isinstance(a, Var) and id(a) in active for a in e.inputs):
            continue
        rule = _rule(VJP_RULES, e.op, "grad")
        if rule is None:
            continue
        ins = [_as_tracer(tape.b, a) for a in e.inputs]
        outs = [Tracer(o, tape.b) for o in e.outs]
        in_cts = rule(b, e.op, e.params, ins, outs, cts)
        for a, c in zip(e.inputs, in_cts):
            if isinstance(a, Var):
                add(a, c)
    return [ct.get(id(t.var)) for t in tape.inputs]


def _custom_backward(b: Builder, key: int, ct: dict[int, Any]) -> list[tuple[Var, Any]]:
    bwd, res, in_tree, in_vars, out_vars, out_tree, fname = _custom_calls(b)[key]
    arg_sizes = [num_leaves(td) for td in in_tree[2]]  # in_tree: the arguments' tuple
    g_leaves = [ct.get(id(v)) for v in out_vars]
    if all(g is None for g in g_leaves):
        return []
    g_leaves = [g if g is not None else ad_zeros(b, v.shape, v.dtype)
                for g, v in zip(g_leaves, out_vars)]
    cts = bwd(res, unflatten(out_tree, g_leaves))
    if not isinstance(cts, tuple) or len(cts) != len(arg_sizes):
        got = f"a tuple of {len(cts)}" if isinstance(cts, tuple) else type(cts).__name__
        raise TraceError(f"the backward function of {fname} (custom_vjp) must return a tuple "
                         f"with one cotangent per argument ({len(arg_sizes)}); got {got}")
    out = []
    pos = 0
    # matched argument by argument: None stands for a zero cotangent of a whole argument (an
    # integer one, say), as in JAX; a pytree would flatten it away and shift the others
    for k, (n, ct_k) in enumerate(zip(arg_sizes, cts)):
        vars_k = in_vars[pos:pos + n]
        pos += n
        if ct_k is None:
            continue
        leaves, _ = flatten_with_paths(ct_k, f"cotangent[{k}]")
        if len(leaves) != n:
            raise TraceError(f"the backward function of {fname} (custom_vjp) returned "
                             f"{len(leaves)} leaves at cotangent[{k}] for argument {k}, which "
                             f"has {n}")
        for (path, c), v in zip(leaves, vars_k):
            if v is None or c is None:
                continue
            c = _tracer(c)
            if tuple(c.shape) != v.shape:
                try:
                    fits = np.broadcast_shapes(tuple(c.shape), v.shape) == v.shape
                except ValueError:  # shapes that do not broadcast at all
                    fits = False
                if not fits:
                    raise ShapeError(f"the backward function of {fname} (custom_vjp) returned "
                                     f"a cotangent of shape {tuple(c.shape)} at {path} for an "
                                     f"argument of shape {v.shape}")
                c = b.bind(Op.BROADCAST, [c], {"shape": v.shape})
            out.append((v, c))
    return out


def _forward(tape: _Tape, tangents: Sequence[Any]) -> dict[int, Any]:
    """Tangents of every value on the tape, given those of its inputs."""
    b = current_builder()
    assert b is not None
    tan: dict[int, Any] = {id(t.var): _tracer(d) for t, d in zip(tape.inputs, tangents)
                           if d is not None}
    for e in tape.eqns:
        ts = [tan.get(id(a)) if isinstance(a, Var) else None for a in e.inputs]
        if all(t is None for t in ts):
            continue
        rule = _rule(JVP_RULES, e.op, "jvp")
        if rule is None:
            continue
        ins = [_as_tracer(tape.b, a) for a in e.inputs]
        outs = [Tracer(o, tape.b) for o in e.outs]
        for o, t in zip(e.outs, rule(b, e.op, e.params, ins, outs, ts)):
            if t is not None and dtypes.is_float(o.dtype):
                tan[id(o)] = _like(t, o)
    return tan


# --- running a function on a tape ---------------------------------------------------------------


def _trace_on_tape(fun: Callable[..., Any], args: tuple[Any, ...], argnums: tuple[int, ...],
                   fname: str, has_aux: bool = False
                   ) -> tuple[_Tape, list[list[Tracer]], list[Any], Any, Any, Any]:
    """Run ``fun`` with fresh inputs for the leaves of ``args[argnums]``; returns the tape, those
    inputs per argnum, the output leaves, the output treedef, and the aux value."""
    b = current_builder()
    assert b is not None
    new_args = list(args)
    per_arg: list[list[Tracer]] = []
    tds: list[Any] = []
    for k in argnums:
        if not -len(args) <= k < len(args):
            raise TraceError(f"argnums={k}: {fname} was called with {len(args)} positional "
                             "arguments")
        leaves, td = flatten_with_paths(args[k], f"args[{k}]")
        fresh = [_fresh(b, x, f"argument '{p}' of {fname}") for p, x in leaves]
        per_arg.append(fresh)
        tds.append(td)
        new_args[k] = unflatten(td, fresh)
    tape = _Tape(b, [t for ts in per_arg for t in ts])
    out = fun(*new_args)
    aux = None
    if has_aux:
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TraceError(f"{fname} was differentiated with has_aux=True, so it must return a "
                             f"pair (output, aux); it returned {type(out).__name__}")
        out, aux = out
    out_leaves, out_tree = flatten_with_paths(out, "output")
    outs = []
    for path, o in out_leaves:
        if isinstance(o, Tracer) or isinstance(o, (np.ndarray, np.generic)) or \
                hasattr(o, "__array__") or isinstance(o, (bool, int, float)):
            outs.append(_tracer(o))
        else:
            raise TraceError(f"{fname} returned a {type(o).__name__} at {path}; differentiated "
                             "functions return arrays or pytrees of them")
    tape.close()
    return tape, per_arg, outs, out_tree, aux, tds


def _norm_argnums(argnums: Argnums) -> tuple[tuple[int, ...], bool]:
    if isinstance(argnums, int):
        return (argnums,), True
    try:
        nums = tuple(int(a) for a in argnums)
    except (TypeError, ValueError):  # not iterable, or items that are no ints (argnums="a")
        raise TraceError(f"argnums must be an int or a sequence of ints; got {argnums!r}") from None
    if not nums:
        raise TraceError("argnums must name at least one argument")
    return nums, False


def _name(fun: Callable[..., Any]) -> str:
    return getattr(fun, "__name__", type(fun).__name__)


class _Transformed:
    """A transformed function: traced in place inside a trace; compiled and run outside one."""

    def __init__(self, fun: Callable[..., Any], name: str, traced: Callable[..., Any],
                 argnums: tuple[int, ...] = ()) -> None:
        self.fun = fun
        self.__name__ = name
        self.__qualname__ = name
        self.__doc__ = getattr(fun, "__doc__", None)
        self._traced = traced
        self._argnums = argnums
        self._jits: dict[Any, JitFunction] = {}

    def __call__(self, *args: Any) -> Any:
        if current_builder() is not None:
            return self._traced(*args)
        # Python ints, bools, strings and None outside argnums stay Python values, as in an
        # untransformed call (an axis, a flag): one compilation per value, not a traced scalar
        n = len(args)
        diff = {k % n for k in self._argnums if -n <= k < n}
        static = tuple((i, a) for i, a in enumerate(args)
                       if i not in diff and (a is None or type(a) in (bool, int, str)))
        jit = self._jits.get((n, static))
        if jit is None:
            traced, fixed = self._traced, dict(static)

            def run(*dyn: Any) -> Any:
                it = iter(dyn)
                return traced(*[fixed[i] if i in fixed else next(it) for i in range(n)])

            run.__name__ = run.__qualname__ = self.__name__
            jit = self._jits[(n, static)] = JitFunction(run)
        fixed_at = {i for i, _ in static}
        return jit(*[a for i, a in enumerate(args) if i not in fixed_at])

    def __repr__(self) -> str:
        return f"<fusec transform {self.__name__}>"


# --- the public transforms ------------------------------------------------------------------------


def value_and_grad(fun: Callable[..., Any], argnums: Argnums = 0,
                   has_aux: bool = False) -> Callable[..., Any]:
    """``fun``'s value and its gradient with respect to the arguments ``argnums``.

    ``fun`` must return a float scalar (or ``(scalar, aux)`` with ``has_aux=True``). The
    gradient has the structure of the differentiated argument (a tuple of them when ``argnums``
    is a sequence). Differentiated arguments must be float32 or float16 arrays or pytrees of
    them; each gradient has its argument's dtype.
    """
    nums, single = _norm_argnums(argnums)
    fname = _name(fun)

    def traced(*args: Any) -> Any:
        tape, per_arg, outs, out_tree, aux, tds = _trace_on_tape(fun, args, nums, fname, has_aux)
        if len(outs) != 1 or outs[0].shape != () or not dtypes.is_float(outs[0].var.dtype):
            what = ", ".join(f"{tuple(o.shape)} {o.var.dtype}" for o in outs) or "nothing"
            raise ShapeError(f"grad of {fname}: it must return a float scalar (the value to "
                             f"differentiate); it returned {what}. For vector outputs use "
                             "fusec.vjp or fusec.jacrev")
        b = current_builder()
        assert b is not None
        one = b.bind(Op.BROADCAST, [Lit(1.0, outs[0].var.dtype)], {"shape": ()})
        cts = _backward(tape, [outs[0].var], [one])
        grads = _structure(cts, per_arg, tds)
        g = grads[0] if single else tuple(grads)
        value = unflatten(out_tree, outs)
        return ((value, aux), g) if has_aux else (value, g)

    return _Transformed(fun, f"value_and_grad({fname})", traced, nums)


def grad(fun: Callable[..., Any], argnums: Argnums = 0,
         has_aux: bool = False) -> Callable[..., Any]:
    """The gradient of a scalar-valued ``fun`` with respect to the arguments ``argnums``.

    As ``jax.grad``: ``fusec.grad(loss)(params, x, y)`` has the structure of ``params``. Inside
    ``gpu_jit`` the backward pass becomes part of the compiled program; outside, the transformed
    function compiles itself once per signature.
    """
    vg = value_and_grad(fun, argnums, has_aux)
    fname = _name(fun)

    def traced(*args: Any) -> Any:
        (value, g) = vg(*args)
        if has_aux:
            return g, value[1]
        return g

    return _Transformed(fun, f"grad({fname})", traced, _norm_argnums(argnums)[0])


def _by_argument(leaves: list[Any], per_arg: list[list[Tracer]], tds: list[Any]) -> list[Any]:
    """One value per input leaf (in the tape's order) rebuilt into each argument's structure."""
    out = []
    pos = 0
    for fresh, td in zip(per_arg, tds):
        out.append(unflatten(td, leaves[pos:pos + len(fresh)]))
        pos += len(fresh)
    return out


def _structure(cts: list[Any], per_arg: list[list[Tracer]], tds: list[Any]) -> list[Any]:
    """Cotangents per input leaf (None: zero) rebuilt into each argument's structure."""
    b = current_builder()
    assert b is not None
    flat = [t for fresh in per_arg for t in fresh]
    return _by_argument([c if c is not None else ad_zeros(b, t.shape, t.var.dtype)
                         for c, t in zip(cts, flat)], per_arg, tds)


def vjp(fun: Callable[..., Any], *primals: Any, has_aux: bool = False) -> Any:
    """``(fun(*primals), vjp_fn)``; ``vjp_fn(cotangent)`` returns one cotangent per primal.

    Inside a trace the forward equations are emitted once and ``vjp_fn`` adds the backward ones.
    Outside, both run on the device: ``vjp_fn`` recomputes the forward pass with the backward.
    """
    fname = _name(fun)
    if current_builder() is None:
        return _vjp_eager(fun, primals, has_aux, fname)
    nums = tuple(range(len(primals)))
    tape, per_arg, outs, out_tree, aux, tds = _trace_on_tape(fun, primals, nums, fname, has_aux)

    def vjp_fn(cotangent: Any) -> tuple[Any, ...]:
        leaves, ct_tree = flatten_with_paths(cotangent, "cotangent")
        if len(leaves) != len(outs):
            raise ShapeError(f"vjp of {fname}: the cotangent has {len(leaves)} leaves; the "
                             f"output has {len(outs)}")
        cts = []
        for (path, c), o in zip(leaves, outs):
            c = _tracer(c)
            if tuple(c.shape) != tuple(o.shape):
                raise ShapeError(f"vjp of {fname}: the cotangent at {path} has shape "
                                 f"{tuple(c.shape)}; the output there has shape {tuple(o.shape)}")
            dt = o.var.dtype if dtypes.is_float(o.var.dtype) else "float32"
            cts.append(c if c.var.dtype == dt else c.astype(dt))
        res = _backward(tape, [o.var for o in outs], cts)
        return tuple(_structure(res, per_arg, tds))

    value = unflatten(out_tree, outs)
    return (value, vjp_fn, aux) if has_aux else (value, vjp_fn)


def _vjp_eager(fun: Callable[..., Any], primals: tuple[Any, ...], has_aux: bool,
               fname: str) -> Any:
    n = len(primals)

    def forward(*p: Any) -> Any:
        r = vjp(fun, *p, has_aux=has_aux)
        return (r[0], r[2]) if has_aux else r[0]

    def backward(*p_and_ct: Any) -> Any:
        return vjp(fun, *p_and_ct[:n], has_aux=has_aux)[1](p_and_ct[n])

    out = JitFunction(forward)(*primals)
    back = JitFunction(backward)

    def vjp_fn(cotangent: Any) -> Any:
        return back(*primals, cotangent)

    if has_aux:
        return out[0], vjp_fn, out[1]
    return out, vjp_fn


def jvp(fun: Callable[..., Any], primals: Sequence[Any], tangents: Sequence[Any]) -> Any:
    """``(fun(*primals), tangent of the output)`` for ``tangents`` of the primals (forward
    mode). ``primals`` and ``tangents`` are tuples of the same structure, as in JAX."""
    fname = _name(fun)
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise TraceError(f"jvp of {fname}: primals and tangents must be tuples (one entry per "
                         "argument)")
    if len(primals) != len(tangents):
        raise ShapeError(f"jvp of {fname}: {len(primals)} primals but {len(tangents)} tangents")
    if current_builder() is None:
        n = len(primals)
        return JitFunction(lambda *a: jvp(fun, a[:n], a[n:]))(*primals, *tangents)
    nums = tuple(range(len(primals)))
    tape, per_arg, outs, out_tree, _, tds = _trace_on_tape(fun, tuple(primals), nums, fname)
    flat_t = []
    for k, (fresh, t) in enumerate(zip(per_arg, tangents)):
        leaves, _ = flatten_with_paths(t, f"tangents[{k}]")
        if len(leaves) != len(fresh):
            raise ShapeError(f"jvp of {fname}: tangents[{k}] has {len(leaves)} leaves; "
                             f"primals[{k}] has {len(fresh)}")
        for (path, d), x in zip(leaves, fresh):
            d = _tracer(d)
            if tuple(d.shape) != tuple(x.shape):
                raise ShapeError(f"jvp of {fname}: the tangent at {path} has shape "
                                 f"{tuple(d.shape)}; the primal has shape {tuple(x.shape)}")
            flat_t.append(d if d.var.dtype == x.var.dtype else d.astype(x.var.dtype))
    tan = _forward(tape, flat_t)
    b = current_builder()
    assert b is not None
    out_t = [tan.get(id(o.var)) if id(o.var) in tan else
             ad_zeros(b, o.shape, o.var.dtype if dtypes.is_float(o.var.dtype) else "float32")
             for o in outs]
    return unflatten(out_tree, outs), unflatten(out_tree, out_t)


def jacrev(fun: Callable[..., Any], argnums: Argnums = 0) -> Callable[..., Any]:
    """The Jacobian of ``fun`` by reverse mode: ``out.shape + arg.shape`` per argument. One
    backward pass, batched over the rows of the identity with ``vmap``."""
    nums, single = _norm_argnums(argnums)
    fname = _name(fun)

    def traced(*args: Any) -> Any:
        from . import numpy as fnp
        from .vmap import vmap

        b = current_builder()
        assert b is not None
        tape, per_arg, outs, out_tree, _, tds = _trace_on_tape(fun, args, nums, fname)
        if len(outs) != 1:
            raise TraceError(f"jacrev of {fname}: it must return one array")
        out = outs[0]

        def row(e: Any) -> list[Any]:
            bb = current_builder()
            res = _backward(tape, [out.var], [fnp.reshape(e, out.shape)])
            return [r if r is not None else ad_zeros(bb, x.shape)
                    for r, x in zip(res, tape.inputs)]

        if out.size:
            rows = vmap(row)(fnp.eye(out.size, dtype="float32"))
        else:
            rows = [ad_zeros(b, (0,) + tuple(x.shape)) for x in tape.inputs]
        jac = _by_argument([fnp.reshape(r, tuple(out.shape) + tuple(x.shape))
                            for r, x in zip(rows, tape.inputs)], per_arg, tds)
        return jac[0] if single else tuple(jac)

    return _Transformed(fun, f"jacrev({fname})", traced, nums)


def jacfwd(fun: Callable[..., Any], argnums: Argnums = 0) -> Callable[..., Any]:
    """The Jacobian of ``fun`` by forward mode: ``out.shape + arg.shape`` per argument. One
    forward-mode pass per argument leaf, batched over its basis directions with ``vmap``."""
    nums, single = _norm_argnums(argnums)
    fname = _name(fun)

    def traced(*args: Any) -> Any:
        from . import numpy as fnp
        from .vmap import vmap

        b = current_builder()
        assert b is not None
        tape, per_arg, outs, out_tree, _, tds = _trace_on_tape(fun, args, nums, fname)
        if len(outs) != 1:
            raise TraceError(f"jacfwd of {fname}: it must return one array")
        out = outs[0]
        flat = [x for fresh in per_arg for x in fresh]
        cols: list[Any] = []
        for j, x in enumerate(flat):

            def column(e: Any, j: int = j, x: Any = x) -> Any:
                ts: list[Any] = [None] * len(flat)
                ts[j] = fnp.reshape(e, x.shape)
                t = _forward(tape, ts).get(id(out.var))
                return t if t is not None else ad_zeros(current_builder(), out.shape)

            if x.size:
                col = vmap(column, out_axes=-1)(fnp.eye(x.size, dtype="float32"))
            else:
                col = ad_zeros(b, tuple(out.shape) + (0,))
            cols.append(fnp.reshape(col, tuple(out.shape) + tuple(x.shape)))
        jac = _by_argument(cols, per_arg, tds)
        return jac[0] if single else tuple(jac)

    return _Transformed(fun, f"jacfwd({fname})", traced, nums)


stop_gradient = lax.stop_gradient


class custom_vjp:
    """A function with a reverse-mode derivative of your own, as ``jax.custom_vjp``::

        @fusec.custom_vjp
        def f(x, y): ...
        def f_fwd(x, y): return f(x, y), residuals
        def f_bwd(residuals, g): return (ct_x, ct_y)
        f.defvjp(f_fwd, f_bwd)

    Under ``grad``/``vjp`` the forward pass runs ``f_fwd`` and the backward pass calls ``f_bwd``
    with the output's cotangent; everywhere else ``f`` runs as written. Forward mode (``jvp``)
    through it is refused, as in JAX.
    """

    def __init__(self, fun: Callable[..., Any]) -> None:
        self.fun = fun
        self.__name__ = _name(fun)
        self.__doc__ = getattr(fun, "__doc__", None)
        self.fwd: Optional[Callable[..., Any]] = None
        self.bwd: Optional[Callable[..., Any]] = None
        self._in_fwd = False

    def defvjp(self, fwd: Callable[..., Any], bwd: Callable[..., Any]) -> None:
        """Set the forward (returns ``(output, residuals)``) and backward functions."""
        self.fwd, self.bwd = fwd, bwd

    def __call__(self, *args: Any) -> Any:
        b = current_builder()
        if b is None or self._in_fwd:
            # outside a trace; or the forward function calling this function itself (JAX's
            # usual pattern: f_fwd returns f(x) and residuals): the plain function
            return self.fun(*args)
        if self.fwd is None or self.bwd is None:
            raise TraceError(f"custom_vjp function {self.__name__} was called before defvjp "
                             "gave it forward and backward functions")
        self._in_fwd = True
        try:
            got = self.fwd(*args)
        finally:
            self._in_fwd = False
        if not (isinstance(got, tuple) and len(got) == 2):
            raise TraceError(f"the forward function of {self.__name__} (custom_vjp) must return "
                             f"a pair (output, residuals); it returned {type(got).__name__}")
        out, res = got
        in_leaves, in_tree = flatten_with_paths(args, "args")
        in_tracers: list[Any] = []
        in_vars: list[Optional[Var]] = []
        for _, x in in_leaves:
            if isinstance(x, (Tracer, np.ndarray)) or hasattr(x, "__array__") or \
                    isinstance(x, (int, float)):
                t = _tracer(x)
                in_tracers.append(t)
                in_vars.append(t.var if dtypes.is_float(t.var.dtype) else None)
            else:
                in_vars.append(None)
        out_leaves, out_tree = flatten_with_paths(out, "output")
        calls = _custom_calls(b)
        key = len(calls)
        marked = []
        for _, o in out_leaves:
            t = _tracer(o)
            marked.append(b.bind(Op.CUSTOM_VJP, [t, *in_tracers], {"rule": key}, weak=t.weak))
        calls[key] = (self.bwd, res, in_tree, in_vars, [m.var for m in marked], out_tree,
                        self.__name__)
        return unflatten(out_tree, marked)

