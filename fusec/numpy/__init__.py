"""numpy-like functions, usable inside ``@gpu_jit`` (they trace) and outside it (they run eagerly on
the device, one cached kernel per op signature, like ``jax.numpy``).

Results follow numpy's broadcasting and result shapes; dtypes follow JAX's rules with 64-bit types
off (see :mod:`fusec.dtypes`): integer division and transcendental functions of integers give
float32, sums of int32 stay int32.

The functions live in one module per family (elementwise, shapes, creation, reductions, linalg,
indexing, manipulation, scans, sorting); this package gathers them into one namespace and gives
traced values (:class:`fusec.trace.Tracer`) their numpy operators and methods. The methods are
attached here, from above, so that :mod:`fusec.trace` never imports this package.
"""

from __future__ import annotations

import builtins
from typing import Any

from ..trace import Tracer
from . import (
    array_api,
    creation,
    elementwise,
    indexing,
    linalg,
    manipulation,
    reductions,
    scans,
    shapes,
    sorting,
)
from .array_api import *  # noqa: F401,F403
from .creation import *  # noqa: F401,F403
from .elementwise import *  # noqa: F401,F403
from .indexing import *  # noqa: F401,F403
from .linalg import *  # noqa: F401,F403
from .manipulation import *  # noqa: F401,F403
from .reductions import *  # noqa: F401,F403
from .scans import *  # noqa: F401,F403
from .shapes import *  # noqa: F401,F403
from .sorting import *  # noqa: F401,F403

__all__ = sorted({name for m in (array_api, creation, elementwise, indexing, linalg, manipulation,
                                 reductions, scans, shapes, sorting) for name in m.__all__})

_ns = globals()


def _binary(name: str, reflected: builtins.bool = False) -> Any:  # bool: the dtype here
    fn = _ns[name]
    if reflected:
        return lambda self, other: fn(other, self)
    return lambda self, other: fn(self, other)


# Python operators -> fusec.numpy functions (also used for fusec.Array by the runtime)
BINARY_OPERATORS = {
    "add": "add", "sub": "subtract", "mul": "multiply", "truediv": "divide", "pow": "power",
    "matmul": "matmul", "mod": "remainder", "floordiv": "floor_divide", "and": "bitwise_and",
    "or": "bitwise_or", "xor": "bitwise_xor", "lshift": "left_shift", "rshift": "right_shift",
}
COMPARISON_OPERATORS = {
    "gt": "greater", "ge": "greater_equal", "lt": "less", "le": "less_equal", "eq": "equal",
    "ne": "not_equal",
}
UNARY_OPERATORS = {"neg": "negative", "abs": "abs", "invert": "invert"}
METHODS = ("sum", "max", "min", "mean", "astype", "prod", "all", "any", "argmax", "argmin",
           "var", "std", "cumsum", "cumprod", "sort", "argsort", "clip", "round", "squeeze",
           "flatten", "ravel", "take", "repeat", "swapaxes")


def attach_operators(cls: type, skip: tuple[str, ...] = ()) -> None:
    """Give ``cls`` (Tracer, fusec.Array) numpy's operators and array methods, as functions of
    this namespace. ``skip``: method names the class uses for something else."""
    for dunder, name in BINARY_OPERATORS.items():
        if name in _ns:
            setattr(cls, f"__{dunder}__", _binary(name))
            setattr(cls, f"__r{dunder}__", _binary(name, reflected=True))
    for dunder, name in COMPARISON_OPERATORS.items():
        setattr(cls, f"__{dunder}__", _binary(name))
    for dunder, name in UNARY_OPERATORS.items():
        if name in _ns:
            setattr(cls, f"__{dunder}__", lambda self, _f=_ns[name]: _f(self))
    setattr(cls, "__pos__", lambda self: self)
    for name in METHODS:
        if name in _ns and name not in skip:
            setattr(cls, name, lambda self, *a, _f=_ns[name], **k: _f(self, *a, **k))
    cls.reshape = lambda self, *shape: _ns["reshape"](  # type: ignore[attr-defined]
        self, shape[0] if len(shape) == 1 else shape)
    cls.transpose = lambda self, *axes: _ns["transpose"](  # type: ignore[attr-defined]
        self, axes[0] if len(axes) == 1 else (axes or None))
    cls.T = property(lambda self: _ns["transpose"](self))  # type: ignore[attr-defined]
    # indexing: __getitem__ and the .at[] property, from fusec.numpy.indexing
    for attr, value in indexing.ATTACH.items():
        setattr(cls, attr, value)


# a Tracer's .var is its IR variable, so traced values have no .var() method: use fnp.var(x)
attach_operators(Tracer, skip=("var",))
