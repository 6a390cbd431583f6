"""Tracing: abstract values, tracers and the builder that records a :class:`~fusec.ir.Program`.

A jitted function runs once per signature with :class:`Tracer` arguments. Each operation on a
tracer appends one equation to the current :class:`Builder`. Python control flow on a tracer has no
value to look at, so it raises :class:`TracerBoolConversionError` with advice.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from . import dtypes
from .errors import TraceError, TracerBoolConversionError
from .ir import Eqn, Lit, Op, Program, Var, type_str
from .ops import MULTI_TYPE_RULES, infer_type


@dataclass(frozen=True)
class ShapeDtype:
    """An abstract array argument: only its shape and dtype matter (for trace, lower, warmup)."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    def __init__(self, shape: Sequence[int] | int, dtype: Any = "float32") -> None:
        shp = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
        if any(d < 0 for d in shp):
            raise ValueError(f"ShapeDtype shape must be non-negative; got {shp}")
        object.__setattr__(self, "shape", shp)
        object.__setattr__(self, "dtype", dtypes.canonicalize(dtype, "ShapeDtype"))


@dataclass(frozen=True)
class Aval:
    """The abstract value of a leaf argument: what the signature and the trace see."""

    shape: tuple[int, ...]
    dtype: str
    weak: bool = False  # a Python scalar: takes the dtype of the arrays it meets

    def __str__(self) -> str:
        return type_str(self.shape, self.dtype) + (" (weak)" if self.weak else "")


class Builder:
    """Collects equations while a function is traced."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.inputs: list[Var] = []
        self.eqns: list[Eqn] = []
        self.const_vars: list[Var] = []
        self.const_values: list[Any] = []
        self._const_ids: dict[int, Tracer] = {}
        self._keep: list[Any] = []
        self.input_names: dict[int, str] = {}  # id(var) -> argument path, for error messages
        self.closed = False
        # values of enclosing traces used here (a sub-trace: a loop body, a vmapped function):
        # each becomes an extra input; the transform that made the sub-trace feeds the outer value
        self.captured: list[Tracer] = []
        self.capture_vars: list[Var] = []
        self._captured_ids: dict[int, Tracer] = {}
        self.side: dict[str, Any] = {}  # per-trace data of the transforms (custom_vjp calls)
        self.producer: dict[int, Eqn] = {}  # id(var) -> the equation that defines it

    def capture(self, outer: Tracer) -> Tracer:
        """``outer``, a tracer of an enclosing open trace, as an input of this one."""
        hit = self._captured_ids.get(id(outer))
        if hit is not None:
            return hit
        v = Var(outer.shape, outer.var.dtype)
        self.captured.append(outer)
        self.capture_vars.append(v)
        t = Tracer(v, self, outer.weak)
        self._captured_ids[id(outer)] = t
        return t

    def adopt(self, x: Tracer) -> Tracer:
        """``x`` as a value of this trace: itself, or captured from an enclosing trace."""
        if x.builder is self:
            return x
        if not x.builder.closed and x.builder in _STACK.builders and x.builder is not self:
            return self.capture(x)
        if x.builder.closed:
            raise TraceError("a traced value from a finished trace was used; return values from "
                             "jitted functions instead of keeping tracers")
        raise TraceError(
            f"a traced value from another trace was used while tracing {self.name}: "
            "values computed inside a jitted function cannot escape it (return them "
            "instead of storing them in globals)"
        )

    def new_input(self, aval: Aval, name: str = "") -> Tracer:
        v = Var(aval.shape, aval.dtype)
        self.inputs.append(v)
        if name:
            self.input_names[id(v)] = name
        return Tracer(v, self, aval.weak)

    def const(self, value: Any) -> Tracer:
        """A concrete array captured from the enclosing scope: an extra program input."""
        key = id(value)
        if key in self._const_ids:
            return self._const_ids[key]
        if is_device_array(value):
            shape, dt = value.shape, value.dtype.name
        else:
            arr = np.asarray(value)
            dt = dtypes.canonicalize(arr.dtype, f"an array captured by {self.name}")
            shape = arr.shape
            if arr.dtype != np.dtype(dt):
                self._keep.append(value)  # its id is the key above: keep it alive
                value = arr.astype(dt)  # float64 -> float32 etc., as the warning said
        v = Var(tuple(shape), dt)
        self.const_vars.append(v)
        self.const_values.append(value)
        t = Tracer(v, self, False)
        self._const_ids[key] = t
        return t

    def bind(self, op: Op, inputs: Sequence[Union[Tracer, Lit]],
             params: dict[str, Any] | None = None, weak: bool = False) -> Tracer:
        params = dict(params or {})
        atoms: list[Union[Var, Lit]] = []
        for x in inputs:
            if isinstance(x, Tracer):
                atoms.append(self.adopt(x).var)
            else:
                atoms.append(x)
        shape, dt = infer_type(op, [(a.shape, a.dtype) for a in atoms], params)
        out = Var(shape, dt)
        eqn = Eqn(op, tuple(atoms), (out,), params)
        self.eqns.append(eqn)
        self.producer[id(out)] = eqn
        return Tracer(out, self, weak)

    def custom_vjp_calls(self) -> dict[int, Any]:
        """This trace's custom_vjp calls (fusec.autodiff): rule key -> what its rule needs."""
        calls: dict[int, Any] = self.side.setdefault("custom_vjp", {})
        return calls

    def bind_multi(self, op: Op, inputs: Sequence[Union[Tracer, Lit]], params: dict[str, Any],
                   n_out: int) -> list[Tracer]:
        """Bind an op of several results (a loop); single-result ops go through :meth:`bind`."""
        if n_out == 1 and op not in MULTI_TYPE_RULES:
            return [self.bind(op, inputs, params)]
        atoms = [self.adopt(x).var if isinstance(x, Tracer) else x for x in inputs]
        types = MULTI_TYPE_RULES[op]([(a.shape, a.dtype) for a in atoms], dict(params))
        outs = tuple(Var(s, d) for s, d in types)
        self.eqns.append(Eqn(op, tuple(atoms), outs, dict(params)))
        return [Tracer(v, self, False) for v in outs]

    def program(self, outputs: Sequence[Union[Tracer, Lit]]) -> Program:
        outs: list[Union[Var, Lit]] = []
        for o in outputs:
            outs.append(o.var if isinstance(o, Tracer) else o)
        return Program(self.inputs + self.const_vars + self.capture_vars, self.eqns, outs)


class _Stack(threading.local):
    """The traces in progress, innermost last: one stack per thread, so that threads driving
    different devices trace independently."""

    def __init__(self) -> None:
        self.builders: list[Builder] = []


_STACK = _Stack()


@dataclass
class Closed:
    """A function traced on its own, inside or outside another trace (a loop body, a vmapped or
    differentiated function): its program and what its extra inputs are.

    ``program.inputs`` are the arguments' leaves (``n_args`` of them), then the captured
    constants (``const_values``), then the values of enclosing traces it used (``captured``).
    """

    program: Program
    n_args: int
    const_values: list[Any]
    captured: list[Tracer]
    out_tree: Any  # a fusec.tree TreeDef
    out_weak: tuple[bool, ...]
    # the sub-trace's Builder.side (the transforms' per-trace data, e.g. its custom_vjp calls,
    # which its equations refer to by key)
    side: dict[str, Any] = field(default_factory=dict)

    @property
    def out_avals(self) -> list[Aval]:
        return [Aval(o.shape, o.dtype, w) for o, w in zip(self.program.outputs, self.out_weak)]


def trace_function(fun: Callable[..., Any], in_tree: Any, in_avals: Sequence[Aval],
                   name: str) -> Closed:
    """Trace ``fun`` for arguments of structure ``in_tree`` whose leaves have ``in_avals``."""
    from .tree import flatten_with_paths, unflatten

    b = Builder(name)
    tracers = [b.new_input(a) for a in in_avals]
    with tracing(b):
        args = unflatten(in_tree, tracers)
        out = fun(*args)
        leaves, out_tree = flatten_with_paths(out, "output")
        atoms: list[Union[Tracer, Lit]] = []
        weak: list[bool] = []
        for path, o in leaves:
            if isinstance(o, Tracer):
                t = b.adopt(o)
                atoms.append(t)
                weak.append(t.weak)
            elif isinstance(o, (bool, int, float)) and not isinstance(o, np.generic):
                atoms.append(Lit(o, dtypes.weak_dtype(o)))
                weak.append(True)
            elif isinstance(o, (np.ndarray, np.generic)) or is_device_array(o):
                atoms.append(b.const(o if is_device_array(o) else np.asarray(o)))
                weak.append(False)
            else:
                raise TraceError(f"{name} returned a {type(o).__name__} at {path}; it must return "
                                 "arrays, scalars, or tuples/lists/dicts of them")
    return Closed(b.program(atoms), len(in_avals), list(b.const_values), list(b.captured),
                  out_tree, tuple(weak), b.side)


def inline(closed: Closed, args: Sequence[Union[Tracer, Lit]]) -> list[Union[Tracer, Lit]]:
    """Emit ``closed``'s equations into the current trace, with ``args`` for its arguments."""
    b = current_builder()
    if b is None:
        raise TraceError("inline needs an open trace")
    prog = closed.program
    feed: list[Union[Tracer, Lit]] = list(args)
    feed += [b.const(v) for v in closed.const_values]
    feed += [b.adopt(t) for t in closed.captured]
    env: dict[int, Union[Tracer, Lit]] = {id(v): a for v, a in zip(prog.inputs, feed)}

    def read(a: Any) -> Union[Tracer, Lit]:
        return a if isinstance(a, Lit) else env[id(a)]

    # custom_vjp calls (fusec.autodiff) are entries of the trace's registry, which their marker
    # equations name by key: the inlined markers get keys of this trace's registry
    calls = closed.side.get("custom_vjp", {})
    rekey: dict[int, int] = {}
    for e in prog.eqns:
        params = e.params
        if e.op is Op.CUSTOM_VJP and int(params["rule"]) in calls:
            old = int(params["rule"])
            if old not in rekey:
                mine = b.custom_vjp_calls()
                rekey[old] = len(mine)
                mine[rekey[old]] = None  # filled in below, once every value is inlined
            params = {**params, "rule": rekey[old]}
        outs = b.bind_multi(e.op, [read(a) for a in e.inputs], params, len(e.outs))
        for v, t in zip(e.outs, outs):
            env[id(v)] = t
    for old, new in rekey.items():
        b.custom_vjp_calls()[new] = _inlined_entry(calls[old], env)
    return [read(o) for o in prog.outputs]


def _inlined_entry(entry: Any, env: dict[int, Union[Tracer, Lit]]) -> Any:
    """A registry entry of an inlined trace with its variables and traced values (the call's
    arguments, results and residuals) replaced by what they became in the current trace."""
    from .tree import flatten, unflatten

    leaves, td = flatten(entry)
    out = []
    for x in leaves:
        if isinstance(x, Var) and id(x) in env:
            t = env[id(x)]
            x = t.var if isinstance(t, Tracer) else None  # a literal: nothing to differentiate
        elif isinstance(x, Tracer) and id(x.var) in env:
            t = env[id(x.var)]
            x = t if isinstance(t, Tracer) else t.value
        out.append(x)
    return unflatten(td, out)



def current_builder() -> Builder | None:
    stack = _STACK.builders
    return stack[-1] if stack else None


class _Tracing:
    def __init__(self, b: Builder) -> None:
        self.b = b

    def __enter__(self) -> Builder:
        _STACK.builders.append(self.b)
        return self.b

    def __exit__(self, *exc: Any) -> None:
        _STACK.builders.pop()
        self.b.closed = True


def tracing(b: Builder) -> _Tracing:
    return _Tracing(b)


def _control_flow_error(t: Tracer, what: str) -> TracerBoolConversionError:
    return TracerBoolConversionError(
        f"{what} on a traced value ({type_str(t.shape, t.var.dtype)}) while tracing "
        f"{t.builder.name}: inside @gpu_jit its value is not known until the GPU runs. "
        "To choose between values elementwise use fusec.numpy.where(cond, a, b); for a branch or "
        "a loop that depends on traced values use fusec.lax.cond, fusec.lax.while_loop or "
        "fusec.lax.fori_loop; to branch in Python on an argument, make it static: "
        "@gpu_jit(static_argnames=('name',))."
    )


class Tracer:
    """A traced array. Supports numpy-style operators; see :mod:`fusec.numpy` for functions."""

    # numpy defers binary operators to us (ndarray + Tracer -> Tracer.__radd__)
    __array_priority__ = 100

    def __init__(self, var: Var, builder: Builder, weak: bool = False) -> None:
        self.var = var
        self.builder = builder
        self.weak = weak

    shape = property(lambda self: self.var.shape)
    dtype = property(lambda self: np.dtype(self.var.dtype))
    ndim = property(lambda self: len(self.var.shape))
    size = property(lambda self: self.var.size)

    def __repr__(self) -> str:
        return f"Tracer<{type_str(self.shape, self.var.dtype)}>"

    # Python control flow and conversions: no value exists at trace time.
    def __bool__(self) -> bool:
        raise _control_flow_error(self, "Python `if`/`while`/`bool()`")

    def __float__(self) -> float:
        raise _control_flow_error(self, "float()")

    def __int__(self) -> int:
        raise _control_flow_error(self, "int()")

    def __index__(self) -> int:
        raise _control_flow_error(self, "using it as an index")

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TraceError(
            f"a traced value ({type_str(self.shape, self.var.dtype)}) cannot become a numpy array "
            f"while tracing {self.builder.name}; use fusec.numpy functions (import fusec.numpy as "
            "fnp) instead of numpy ones inside @gpu_jit"
        )

    def __iter__(self) -> Any:
        raise TraceError("iterating over a traced value is not supported; index-free ops only")

    def __len__(self) -> int:
        if not self.shape:
            raise TraceError("len() of a 0-d traced value")
        return self.shape[0]

    __hash__ = None  # type: ignore[assignment]

    # numpy's operators and methods (+, @, .sum, .T, ...) are attached by fusec.numpy

    if TYPE_CHECKING:  # attached by fusec.numpy.attach_operators; declared for type checkers
        def __add__(self, o: Any) -> Tracer: ...
        def __radd__(self, o: Any) -> Tracer: ...
        def __sub__(self, o: Any) -> Tracer: ...
        def __rsub__(self, o: Any) -> Tracer: ...
        def __mul__(self, o: Any) -> Tracer: ...
        def __rmul__(self, o: Any) -> Tracer: ...
        def __truediv__(self, o: Any) -> Tracer: ...
        def __rtruediv__(self, o: Any) -> Tracer: ...
        def __pow__(self, o: Any) -> Tracer: ...
        def __rpow__(self, o: Any) -> Tracer: ...
        def __matmul__(self, o: Any) -> Tracer: ...
        def __rmatmul__(self, o: Any) -> Tracer: ...
        def __mod__(self, o: Any) -> Tracer: ...
        def __rmod__(self, o: Any) -> Tracer: ...
        def __floordiv__(self, o: Any) -> Tracer: ...
        def __rfloordiv__(self, o: Any) -> Tracer: ...
        def __and__(self, o: Any) -> Tracer: ...
        def __rand__(self, o: Any) -> Tracer: ...
        def __or__(self, o: Any) -> Tracer: ...
        def __ror__(self, o: Any) -> Tracer: ...
        def __xor__(self, o: Any) -> Tracer: ...
        def __rxor__(self, o: Any) -> Tracer: ...
        def __lshift__(self, o: Any) -> Tracer: ...
        def __rlshift__(self, o: Any) -> Tracer: ...
        def __rshift__(self, o: Any) -> Tracer: ...
        def __rrshift__(self, o: Any) -> Tracer: ...
        def __gt__(self, o: Any) -> Tracer: ...
        def __ge__(self, o: Any) -> Tracer: ...
        def __lt__(self, o: Any) -> Tracer: ...
        def __le__(self, o: Any) -> Tracer: ...
        def __eq__(self, o: Any) -> Tracer: ...  # type: ignore[override]
        def __ne__(self, o: Any) -> Tracer: ...  # type: ignore[override]
        def __neg__(self) -> Tracer: ...
        def __abs__(self) -> Tracer: ...
        def __invert__(self) -> Tracer: ...
        def __pos__(self) -> Tracer: ...
        def sum(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def max(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def min(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def mean(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def astype(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def prod(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def all(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def any(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def argmax(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def argmin(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def std(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def cumsum(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def cumprod(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def sort(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def argsort(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def clip(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def round(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def squeeze(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def flatten(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def ravel(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def take(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def repeat(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def swapaxes(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def reshape(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def transpose(self, *args: Any, **kwargs: Any) -> Tracer: ...
        def __getitem__(self, idx: Any) -> Tracer: ...
        @property
        def T(self) -> Tracer: ...
        @property
        def at(self) -> Any: ...


# --- hooks filled in from above (fusec.runtime, fusec.jit), so that tracing imports neither -------

_ARRAY_TYPES: list[type] = []
_EAGER: list[Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]] = []


def register_array_type(cls: type) -> None:
    """Declare ``cls`` (fusec.Array) a device array: traced as a captured constant, like numpy."""
    if cls not in _ARRAY_TYPES:
        _ARRAY_TYPES.append(cls)


def is_device_array(x: Any) -> bool:
    return any(isinstance(x, c) for c in _ARRAY_TYPES)


def set_eager_runner(fn: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]
                     ) -> None:
    """Install how a fusec.numpy function runs outside ``gpu_jit`` (fusec.jit compiles it)."""
    _EAGER[:] = [fn]


def run_eager(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not _EAGER:
        raise TraceError(f"{getattr(fn, '__name__', fn)} needs fusec.jit to run outside "
                         "gpu_jit; import fusec")
    return _EAGER[0](fn, args, kwargs)
