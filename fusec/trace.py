"""Tracing: abstract values, tracers and the builder that records a :class:`~fusec.ir.Program`.

A jitted function runs once per signature with :class:`Tracer` arguments. Each operation on a
tracer appends one equation to the current :class:`Builder`. Python control flow on a tracer has no
value to look at, so it raises :class:`TracerBoolConversionError` with advice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from . import dtypes
from .errors import TraceError, TracerBoolConversionError
from .ir import Eqn, Lit, Op, Program, Var, type_str
from .ops import infer_type


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
        self.input_names: dict[int, str] = {}  # id(var) -> argument path, for error messages
        self.closed = False

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
        from .runtime import Array

        if isinstance(value, Array):
            shape, dt = value.shape, value.dtype.name
        else:
            arr = np.asarray(value)
            dt = dtypes.canonicalize(arr.dtype, f"an array captured by {self.name}")
            shape = arr.shape
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
                if x.builder is not self:
                    raise TraceError(
                        f"a traced value from another trace was used while tracing {self.name}: "
                        "values computed inside a jitted function cannot escape it (return them "
                        "instead of storing them in globals)"
                    )
                atoms.append(x.var)
            else:
                atoms.append(x)
        shape, dt = infer_type(op, [(a.shape, a.dtype) for a in atoms], params)
        out = Var(shape, dt)
        self.eqns.append(Eqn(op, tuple(atoms), (out,), params))
        return Tracer(out, self, weak)

    def program(self, outputs: Sequence[Union[Tracer, Lit]]) -> Program:
        outs: list[Union[Var, Lit]] = []
        for o in outputs:
            outs.append(o.var if isinstance(o, Tracer) else o)
        return Program(self.inputs + self.const_vars, self.eqns, outs)


_STACK: list[Builder] = []


def current_builder() -> Builder | None:
    return _STACK[-1] if _STACK else None


class _Tracing:
    def __init__(self, b: Builder) -> None:
        self.b = b

    def __enter__(self) -> Builder:
        _STACK.append(self.b)
        return self.b

    def __exit__(self, *exc: Any) -> None:
        _STACK.pop()
        self.b.closed = True


def tracing(b: Builder) -> _Tracing:
    return _Tracing(b)


def _control_flow_error(t: Tracer, what: str) -> TracerBoolConversionError:
    return TracerBoolConversionError(
        f"{what} on a traced value ({type_str(t.shape, t.var.dtype)}) while tracing "
        f"{t.builder.name}: inside @gpu_jit its value is not known until the GPU runs. "
        "To choose between values elementwise use fusec.numpy.where(cond, a, b); to branch in "
        "Python on an argument, make it static: @gpu_jit(static_argnames=('name',))."
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

    @property
    def T(self) -> Tracer:
        from . import numpy as fnp

        return fnp.transpose(self)

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

    def __getitem__(self, idx: Any) -> Any:
        raise TraceError("indexing traced values is not supported yet; use reshape/transpose/"
                         "sum over axes, or pass the slice in as a separate argument")

    __hash__ = None  # type: ignore[assignment]

    # operators
    def __add__(self, o: Any) -> Tracer: return _fnp().add(self, o)
    def __radd__(self, o: Any) -> Tracer: return _fnp().add(o, self)
    def __sub__(self, o: Any) -> Tracer: return _fnp().subtract(self, o)
    def __rsub__(self, o: Any) -> Tracer: return _fnp().subtract(o, self)
    def __mul__(self, o: Any) -> Tracer: return _fnp().multiply(self, o)
    def __rmul__(self, o: Any) -> Tracer: return _fnp().multiply(o, self)
    def __truediv__(self, o: Any) -> Tracer: return _fnp().divide(self, o)
    def __rtruediv__(self, o: Any) -> Tracer: return _fnp().divide(o, self)
    def __pow__(self, o: Any) -> Tracer: return _fnp().power(self, o)
    def __rpow__(self, o: Any) -> Tracer: return _fnp().power(o, self)
    def __matmul__(self, o: Any) -> Tracer: return _fnp().matmul(self, o)
    def __rmatmul__(self, o: Any) -> Tracer: return _fnp().matmul(o, self)
    def __neg__(self) -> Tracer: return _fnp().negative(self)
    def __pos__(self) -> Tracer: return self
    def __abs__(self) -> Tracer: return _fnp().abs(self)
    def __gt__(self, o: Any) -> Tracer: return _fnp().greater(self, o)
    def __ge__(self, o: Any) -> Tracer: return _fnp().greater_equal(self, o)
    def __lt__(self, o: Any) -> Tracer: return _fnp().less(self, o)
    def __le__(self, o: Any) -> Tracer: return _fnp().less_equal(self, o)
    def __eq__(self, o: Any) -> Tracer: return _fnp().equal(self, o)  # type: ignore[override]
    def __ne__(self, o: Any) -> Tracer: return _fnp().not_equal(self, o)  # type: ignore[override]

    # methods
    def sum(self, axis: Any = None, keepdims: bool = False) -> Tracer:
        return _fnp().sum(self, axis=axis, keepdims=keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> Tracer:
        return _fnp().max(self, axis=axis, keepdims=keepdims)

    def min(self, axis: Any = None, keepdims: bool = False) -> Tracer:
        return _fnp().min(self, axis=axis, keepdims=keepdims)

    def mean(self, axis: Any = None, keepdims: bool = False) -> Tracer:
        return _fnp().mean(self, axis=axis, keepdims=keepdims)

    def reshape(self, *shape: Any) -> Tracer:
        return _fnp().reshape(self, shape[0] if len(shape) == 1 else shape)

    def astype(self, dtype: Any) -> Tracer:
        return _fnp().astype(self, dtype)

    def transpose(self, *axes: Any) -> Tracer:
        return _fnp().transpose(self, axes[0] if len(axes) == 1 else (axes or None))


def _fnp() -> Any:
    from . import numpy as fnp

    return fnp
