"""``fusec.vmap``: vectorise a function over a batch axis of its arguments.

The function is traced once for one example (the arguments with their batch axis removed) into a
program of its own (:func:`fusec.trace.trace_function`); vmap then walks that program's equations
and emits, into the trace that called it, each equation batched by its op's rule in
:data:`fusec.ops.BATCH_RULES`. Every value carries its batch dim: the axis that runs over the
examples, or None for a value the same for every example (captured constants, values of enclosing
traces, arguments with ``in_axes`` None, and whatever is computed from them alone), which is
emitted once, unbatched.

Called while a trace is open (inside ``gpu_jit``, ``vmap`` or another transform) the batched
equations go into that trace; called on concrete arrays, the batched function is compiled with
``gpu_jit`` (cached per function and axes) and run, so it fuses into kernels like any jitted
function.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Optional, Union

import numpy as np

from . import dtypes
from .errors import ShapeError, TraceError
from .ir import Eqn, Lit, Op
from .jit import JitFunction
from .numpy._base import _tracer
from .ops import BATCH_RULES, ad_sum_to
from .trace import Aval, Builder, Closed, Tracer, current_builder, is_device_array, trace_function
from .tree import describe, flatten_with_paths, node_items, unflatten

__all__ = ["vmap"]

Axis = Optional[int]
Value = Union[Tracer, Lit]


def vmap(fun: Callable[..., Any], in_axes: Any = 0, out_axes: Any = 0,
         axis_size: Optional[int] = None) -> Callable[..., Any]:
    """Vectorise ``fun`` over an axis of its arguments, as ``jax.vmap``.

    ``vmap(f)(xs)`` computes ``f`` for every ``xs[i]`` and stacks the results along axis 0, as
    one batched program (not a loop):

        def loss(w, x, y):                      # one example
            return ((x @ w - y) ** 2).sum()
        losses = fusec.vmap(loss, in_axes=(None, 0, 0))(w, xs, ys)   # one loss per row

    ``in_axes``: which axis of each positional argument is the batch axis: an int (every
    argument, negative counting from the end), None (the argument is the same for every
    example), or a tuple (or list) with one entry per positional argument, each an int, None or
    a pytree prefix of that argument (a dict of axes for a dict argument, ...). Keyword arguments
    are always batched along axis 0. ``out_axes``: where the batch axis goes in each output, an
    int, None (only for outputs that do not depend on the batch) or a pytree prefix of the
    output. ``axis_size``: the batch size, needed when no argument is batched (outputs are then
    broadcast), checked against the arguments otherwise.

    Works inside and outside ``gpu_jit``: ``gpu_jit(vmap(f))``, ``vmap(gpu_jit(f))`` and
    ``vmap(vmap(f))`` compose, and so do the autodiff transforms (``vmap(grad(loss))`` gives
    per-example gradients; ``custom_vjp`` functions keep their derivative). Called on concrete
    arrays, the batched function is compiled with ``gpu_jit`` and runs on the device.
    """
    if not callable(fun):
        raise TypeError(f"vmap needs a callable; got {type(fun).__name__}")
    if isinstance(in_axes, list):
        in_axes = tuple(in_axes)
    if not (in_axes is None or _is_axis(in_axes) or isinstance(in_axes, tuple)):
        raise TraceError(f"vmap in_axes must be an int, None, or a tuple with one entry per "
                         f"positional argument; got {in_axes!r}")
    _check_axis_spec(in_axes, "in_axes")
    _check_axis_spec(out_axes, "out_axes")
    if axis_size is not None and (not isinstance(axis_size, (int, np.integer))
                                  or isinstance(axis_size, bool) or axis_size < 0):
        raise TraceError(f"vmap axis_size must be a non-negative int; got {axis_size!r}")
    return _Vmapped(fun, in_axes, out_axes, None if axis_size is None else int(axis_size))


class _Vmapped:
    """What :func:`vmap` returns: traces into the open trace, or compiles and runs."""

    def __init__(self, fun: Callable[..., Any], in_axes: Any, out_axes: Any,
                 axis_size: Optional[int]) -> None:
        self.fun = fun
        self.in_axes = in_axes
        self.out_axes = out_axes
        self.axis_size = axis_size
        self.name = f"vmap({getattr(fun, '__qualname__', getattr(fun, '__name__', 'fun'))})"
        functools.update_wrapper(self, fun, updated=())  # type: ignore[arg-type]
        self._jitted: Optional[JitFunction] = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if current_builder() is not None:
            return batch_call(self.fun, args, kwargs, self.in_axes, self.out_axes,
                              self.axis_size, self.name)
        return self.jitted()(*args, **kwargs)

    def jitted(self) -> JitFunction:
        """The batched function under ``gpu_jit`` (how a call on concrete arrays runs)."""
        if self._jitted is None:
            self._jitted = _cached_jit(self)
        return self._jitted

    def __repr__(self) -> str:
        return f"<{self.name}>"


# one gpu_jit per (function, axes), so that vmap(f)(x) in a loop compiles once. Keyed weakly by
# the function; the jitted closure refers to it weakly too (a strong reference from the value
# would keep the key alive for ever).
_JITS: weakref.WeakKeyDictionary[Any, dict[Any, JitFunction]] = weakref.WeakKeyDictionary()


def _cached_jit(v: _Vmapped) -> JitFunction:
    in_axes, out_axes, axis_size, name = v.in_axes, v.out_axes, v.axis_size, v.name
    key: Any = (repr(in_axes), repr(out_axes), axis_size)
    try:
        ref: Callable[[], Any] = weakref.ref(v.fun)
        per_fun = _JITS.setdefault(v.fun, {})
    except TypeError:  # not weakly referenceable: a jit of this vmap object's own
        fun = v.fun
        ref, per_fun = (lambda: fun), {}
    jf = per_fun.get(key)
    if jf is None:
        def batched(*args: Any, **kwargs: Any) -> Any:
            return batch_call(ref(), args, kwargs, in_axes, out_axes, axis_size, name)

        batched.__qualname__ = batched.__name__ = name
        jf = JitFunction(batched)
        per_fun[key] = jf
    return jf


# --- axis specifications --------------------------------------------------------------------------


def _is_axis(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check_axis_spec(spec: Any, what: str) -> None:
    """Every leaf of an in_axes/out_axes tree is an int or None."""
    if spec is None or _is_axis(spec):
        return
    node = node_items(spec, what)
    if node is None:
        raise TraceError(f"vmap {what} must hold ints and None (in tuples, lists or dicts "
                         f"matching the structure); got {spec!r}")
    for _, child in node[2]:
        _check_axis_spec(child, what)


def _prefix_axes(spec: Any, tree: Any, path: str, what: str, fname: str) -> list[Axis]:
    """The axis of every leaf of ``tree``, from ``spec``: a pytree prefix of it whose leaves are
    ints or None (which apply to the whole subtree under them)."""
    if spec is None or _is_axis(spec):
        leaves, _ = flatten_with_paths(tree, path)
        return [None if spec is None else int(spec)] * len(leaves)
    spec_node = node_items(spec, path)
    tree_node = node_items(tree, path)
    assert spec_node is not None  # checked by _check_axis_spec
    if tree_node is None:
        raise ShapeError(f"{fname}: {what} gives {repr(spec)} for {_where(path)}, which is "
                         f"{'None' if tree is None else 'an array'}, not a container: give it an "
                         "int or None")
    skind, saux, sitems = spec_node
    tkind, taux, titems = tree_node
    same_kind = skind == tkind or {skind, tkind} <= {"tuple", "list"}
    if not same_kind or saux != taux or len(sitems) != len(titems):
        td = flatten_with_paths(tree, path)[1]
        raise ShapeError(f"{fname}: {what} {repr(spec)} does not match the structure of "
                         f"{_where(path)}, {describe(td)}: give one axis (or None) per entry, in "
                         "the same kind of container, or a single int or None for all of it")
    out: list[Axis] = []
    for (_, s), (p, t) in zip(sitems, titems):
        out += _prefix_axes(s, t, p, what, fname)
    return out


def _where(path: str) -> str:
    return f"output '{path}'" if path.startswith("output") else f"argument '{path}'"


def _arg_names(fun: Callable[..., Any], n: int) -> list[str]:
    """Names for ``n`` positional arguments of ``fun``, for error messages."""
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        return [f"args[{i}]" for i in range(n)]
    names: list[str] = []
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and len(names) < n:
            names.append(p.name)
        elif p.kind is p.VAR_POSITIONAL:
            names += [f"{p.name}[{i}]" for i in range(n - len(names))]
    return names + [f"args[{i}]" for i in range(len(names), n)]


# --- the transform --------------------------------------------------------------------------------


def _lift(b: Builder, x: Any, path: str, fname: str) -> Tracer:
    """An argument leaf as a value of the current trace."""
    if isinstance(x, Tracer):
        return b.adopt(x)
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        # a Python scalar stays weakly typed, as when passed to gpu_jit
        return b.bind(Op.BROADCAST, [Lit(x, dtypes.weak_dtype(x))], {"shape": ()}, weak=True)
    if is_device_array(x):
        return b.const(x)
    if isinstance(x, (np.ndarray, np.generic)) or hasattr(x, "__array__"):
        return b.const(np.asarray(x))
    raise TraceError(f"{fname}: argument '{path}' is a {type(x).__name__}; vmapped functions "
                     "take arrays, Python scalars, or tuples/lists/dicts of them")


def _norm(axis: int, ndim: int) -> Optional[int]:
    return axis % ndim if -ndim <= axis < ndim else None


def batch_call(fun: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any],
               in_axes: Any, out_axes: Any, axis_size: Optional[int], name: str) -> Any:
    """Emit ``fun`` batched over ``in_axes`` of ``args`` into the current trace."""
    b = current_builder()
    if b is None:
        raise TraceError("batch_call needs an open trace")
    args = tuple(args)
    names = _arg_names(fun, len(args))
    if isinstance(in_axes, tuple) and len(in_axes) != len(args):
        raise ShapeError(f"{name}: in_axes has {len(in_axes)} entries but the function was "
                         f"called with {len(args)} positional arguments; give one axis (or "
                         "None) per positional argument")
    leaves: list[tuple[str, Any]] = []
    axes: list[Axis] = []
    for i, (arg_name, a) in enumerate(zip(names, args)):
        spec = in_axes[i] if isinstance(in_axes, tuple) else in_axes
        leaves += flatten_with_paths(a, arg_name)[0]
        axes += _prefix_axes(spec, a, arg_name, "in_axes", name)
    # keyword arguments: batched along axis 0, as in JAX; in the order pytrees keep dict keys
    for k in sorted(kwargs, key=repr):
        sub = flatten_with_paths(kwargs[k], k)[0]
        leaves += sub
        axes += [0] * len(sub)
    _, in_tree = flatten_with_paths((args, kwargs))
    values = [_lift(b, x, p, name) for p, x in leaves]

    # the batch size, and each argument's axis normalised
    size = axis_size
    source = "axis_size"
    dims: list[Axis] = []
    for (p, _), v, ax in zip(leaves, values, axes):
        if ax is None:
            dims.append(None)
            continue
        d = _norm(ax, v.ndim)
        if d is None:
            raise ShapeError(f"{name}: in_axes gives axis {ax} for argument '{p}' of shape "
                             f"{tuple(v.shape)}, out of range for its {v.ndim} axes")
        dims.append(d)
        n = int(v.shape[d])
        if size is None:
            size, source = n, f"argument '{p}' (axis {d} of shape {tuple(v.shape)})"
        elif n != size:
            here = f"argument '{p}' has {n} (axis {d} of shape {tuple(v.shape)})"
            there = (f"axis_size is {size}" if source == "axis_size"
                     else f"{source} has {size}")
            raise ShapeError(f"{name}: the batch axes of the arguments differ in size: {here}, "
                             f"but {there}")
    if size is None:
        raise ShapeError(f"{name}: no argument is batched (in_axes is None for all of them: "
                         f"{', '.join(repr(p) for p, _ in leaves) or 'there are none'}); pass "
                         "axis_size to say how many examples there are")

    avals = [Aval(tuple(s for k, s in enumerate(v.shape) if k != d), v.var.dtype, v.weak)
             for v, d in zip(values, dims)]
    closed = trace_function(lambda a, k: fun(*a, **k), in_tree, avals, name)
    outs = _batch_program(b, closed, list(zip(values, dims)), size, name)
    out_leaves = flatten_with_paths(unflatten(closed.out_tree, list(range(len(outs)))),
                                    "output")[0]
    out_specs = _prefix_axes(out_axes, unflatten(closed.out_tree, [0] * len(outs)), "output",
                             "out_axes", name)
    results = [_place_output(b, x, d, spec, size, weak, p, name)
               for (x, d), spec, weak, (p, _) in zip(outs, out_specs, closed.out_weak,
                                                       out_leaves)]
    return unflatten(closed.out_tree, results)


def _batch_program(b: Builder, closed: Closed, args: list[tuple[Value, Axis]], size: int,
                   name: str) -> list[tuple[Value, Axis]]:
    """Emit ``closed``'s equations batched: each value with its batch dim."""
    prog = closed.program
    feed: list[tuple[Value, Axis]] = list(args)
    feed += [(b.const(c), None) for c in closed.const_values]
    feed += [(b.adopt(t), None) for t in closed.captured]
    env: dict[int, tuple[Value, Axis]] = {id(v): x for v, x in zip(prog.inputs, feed)}

    def read(a: Any) -> tuple[Value, Axis]:
        return (a, None) if isinstance(a, Lit) else env[id(a)]

    markers: dict[int, list[Eqn]] = {}  # custom_vjp key -> its marker equations
    for e in prog.eqns:
        if e.op is Op.CUSTOM_VJP:
            markers.setdefault(int(e.params["rule"]), []).append(e)
    done: dict[int, tuple[Value, Axis]] = {}  # id(marker eqn) -> its batched result

    for e in prog.eqns:
        ins = [read(a) for a in e.inputs]
        xs = [x for x, _ in ins]
        ds = [d for _, d in ins]
        if e.op is Op.CUSTOM_VJP:
            key = int(e.params["rule"])
            if id(e) not in done:
                done.update(_batch_custom_vjp(b, closed, markers[key], key, env, read, size,
                                              name))
            outs: list[tuple[Value, Axis]] = [done[id(e)]]
        elif all(d is None for d in ds):
            outs = [(t, None) for t in b.bind_multi(e.op, xs, e.params, len(e.outs))]
        else:
            rule = BATCH_RULES.get(e.op)
            if rule is None:
                raise TraceError(f"{name}: vmap has no batching rule for the op '{e.op.value}'")
            res = rule(b, xs, ds, dict(e.params))
            outs = list(res) if isinstance(res, list) else [res]
        for v, (t, d) in zip(e.outs, outs):
            if isinstance(t, Tracer) and tuple(t.shape) != (
                    v.shape[:d] + (t.shape[d],) + v.shape[d:] if d is not None else v.shape):
                raise AssertionError(f"batching rule of {e.op.value} gave {t.shape} at {d} for "
                                     f"{v.shape}")
            env[id(v)] = (t, d)
    return [read(o) for o in prog.outputs]


# --- custom_vjp functions -------------------------------------------------------------------------
# A custom_vjp call in the traced function is a group of marker equations (one per output) whose
# key names an entry of the sub-trace's registry (fusec.autodiff: the backward function, its
# residuals, the argument and output variables). Batched, the markers are re-emitted under a new
# key of the current trace's registry, whose entry refers to the batched variables; when anything
# of the call is batched, its backward function becomes the vmap of the user's one (cotangents of
# unbatched arguments summed over the examples).


def _batch_custom_vjp(b: Builder, closed: Closed, eqns: list[Eqn], key: int,
                      env: dict[int, tuple[Value, Axis]],
                      read: Callable[[Any], tuple[Value, Axis]], size: int, name: str
                      ) -> dict[int, tuple[Value, Axis]]:
    bwd, res, in_tree, in_vars, out_vars, out_tree, fname = closed.side["custom_vjp"][key]
    res_leaves, res_tree = flatten_with_paths(res, "residuals")
    # residuals: values of the traced function (batched or not), or anything else, kept as is
    res_dyn: list[tuple[int, Value, Axis]] = []
    for k, (_, r) in enumerate(res_leaves):
        if isinstance(r, Tracer):
            x, d = env[id(r.var)] if id(r.var) in env else (b.adopt(r), None)
            res_dyn.append((k, x, d))
    ins = [None if v is None else env[id(v)] for v in in_vars]
    batched = (any(d is not None for e in eqns for _, d in map(read, e.inputs))
               or any(d is not None for _, _, d in res_dyn))
    calls = b.custom_vjp_calls()
    new_key = len(calls)
    calls[new_key] = None  # reserved: the backward function below may trace calls of its own
    done: dict[int, tuple[Value, Axis]] = {}
    for e in eqns:
        (y, dy), *rest = map(read, e.inputs)
        if batched:
            if dy is None:  # every output of a batched call is batched: one cotangent each
                y, dy = _batch_first_value(b, y, size), 0
            done[id(e)] = BATCH_RULES[Op.CUSTOM_VJP](
                b, [y, *(x for x, _ in rest)], [dy, *(d for _, d in rest)], {"rule": new_key})
        else:
            done[id(e)] = (b.bind(Op.CUSTOM_VJP, [y, *(x for x, _ in rest)], {"rule": new_key},
                                  weak=isinstance(y, Tracer) and y.weak), None)
    new_outs = [done[id(e)][0] for e in eqns]
    new_in_vars = [None if i is None or not isinstance(i[0], Tracer) else i[0].var for i in ins]
    new_out_vars = [t.var for t in new_outs if isinstance(t, Tracer)]
    if not batched:
        leaves = [r for _, r in res_leaves]
        for k, x, _ in res_dyn:
            leaves[k] = x
        calls[new_key] = (bwd, unflatten(res_tree, leaves), in_tree, new_in_vars, new_out_vars,
                          out_tree, fname)
        return done

    res_dims = [d for _, _, d in res_dyn]
    out_dims = [done[id(e)][1] for e in eqns]
    example_shapes = [None if v is None else v.shape for v in in_vars]
    in_dims = [None if i is None else i[1] for i in ins]
    static_res = [r for _, r in res_leaves]
    bwd_name = f"vmap(backward of {fname})"

    def example(*flat: Any) -> list[Any]:
        """The user's backward function for one example; its cotangents as the arguments'."""
        leaves = list(static_res)
        for (k, _, _), x in zip(res_dyn, flat):
            leaves[k] = x
        g = unflatten(out_tree, list(flat[len(res_dyn):]))
        cts = bwd(unflatten(res_tree, leaves), g)
        if not isinstance(cts, tuple):
            raise TraceError(f"the backward function of {fname} (custom_vjp) must return a tuple "
                             f"with one cotangent per argument; got {type(cts).__name__}")
        got = flatten_with_paths(cts, "cotangent")[0]
        if len(got) != len(example_shapes):
            raise TraceError(f"the backward function of {fname} (custom_vjp) returned "
                             f"{len(got)} cotangent leaves for {len(example_shapes)} argument "
                             "leaves")
        out = []
        for (path, c), shape in zip(got, example_shapes):
            if shape is not None:
                out.append(_fit(_tracer(c), shape, path, fname))
        return out

    def batched_bwd(res_values: list[Any], g: Any) -> tuple[Any, ...]:
        here = current_builder()
        assert here is not None
        g_leaves = [x for _, x in flatten_with_paths(g, "g")[0]]
        cts = iter(batch_call(example, [*res_values, *g_leaves], {},
                              tuple(res_dims) + tuple(out_dims), 0, size, bwd_name))
        leaves: list[Any] = []
        for shape, d in zip(example_shapes, in_dims):
            if shape is None:
                leaves.append(0.0)  # not differentiable: autodiff skips it
                continue
            c = next(cts)  # the examples' cotangents along axis 0
            if d is None:  # an argument shared by the examples: the sum of theirs
                c = here.bind(Op.SUM, [c], {"axes": (0,)})
            elif d != 0:
                perm = list(range(1, len(c.shape)))
                perm.insert(d, 0)
                c = here.bind(Op.TRANSPOSE, [c], {"perm": tuple(perm)})
            leaves.append(c)
        return tuple(unflatten(in_tree, leaves))

    calls[new_key] = (batched_bwd, [x for _, x, _ in res_dyn], in_tree, new_in_vars,
                      new_out_vars, out_tree, fname)
    return done


def _batch_first_value(b: Builder, x: Value, size: int) -> Tracer:
    return b.bind(Op.BROADCAST, [x], {"shape": (size,) + tuple(x.shape)})


def _fit(c: Tracer, shape: tuple[int, ...], path: str, fname: str) -> Tracer:
    """A cotangent brought to its argument's shape, as fusec.autodiff does."""
    if tuple(c.shape) == shape:
        return c
    if np.broadcast_shapes(tuple(c.shape), shape) != shape:
        raise ShapeError(f"the backward function of {fname} (custom_vjp) returned a cotangent "
                         f"of shape {tuple(c.shape)} at {path} for an argument of shape {shape}")
    b = c.builder
    if c.ndim > len(shape):
        return ad_sum_to(b, c, shape)  # type: ignore[no-any-return]
    return b.bind(Op.BROADCAST, [c], {"shape": shape})


def _place_output(b: Builder, x: Value, d: Axis, spec: Axis, size: int, weak: bool, path: str,
                  name: str) -> Any:
    """An output with its batch axis at ``spec`` (unbatched ones broadcast along it)."""
    if isinstance(x, Lit):
        x = b.bind(Op.BROADCAST, [x], {"shape": ()}, weak=True)
    shape = tuple(x.shape)
    if spec is None:
        if d is not None:
            raise ShapeError(f"{name}: out_axes is None for {_where(path)}, but it depends on the "
                             "batched arguments (it differs between examples); give it an axis")
        return _weak(x, weak)
    rank = len(shape) + (d is None)
    k = _norm(int(spec), rank)
    if k is None:
        per = shape if d is None else shape[:d] + shape[d + 1:]
        raise ShapeError(f"{name}: out_axes gives axis {spec} for {_where(path)}, out of range "
                         f"for its {rank} axes (per-example shape {per} plus the batch axis)")
    if d is None:  # the same for every example: broadcast along a new axis k
        unit = b.bind(Op.RESHAPE, [x], {"shape": shape[:k] + (1,) + shape[k:]})
        out = b.bind(Op.BROADCAST, [unit], {"shape": shape[:k] + (size,) + shape[k:]})
        return _weak(out, weak)
    if d != k:
        perm = [a for a in range(len(shape)) if a != d]
        perm.insert(k, d)
        x = b.bind(Op.TRANSPOSE, [x], {"perm": tuple(perm)})
    return _weak(x, weak)


def _weak(t: Tracer, weak: bool) -> Tracer:
    return t if t.weak == weak else Tracer(t.var, t.builder, weak)
