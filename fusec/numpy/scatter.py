"""The scatter primitive behind ``x.at[...].set/add/multiply/min/max``.

:func:`scatter` traces one ``scatter`` equation (see :class:`fusec.ir.Op`); the pass
:func:`fusec.passes.scatter.lower_scatter` turns it into the kernels that compute it
(:mod:`fusec.kernels.scatter`)."""

from __future__ import annotations

from typing import Any, Union

import numpy as np

from ..errors import DTypeError, ShapeError, TraceError
from ..ir import Lit, Op
from ..ops import SCATTER_MODES, broadcast_shapes
from ..trace import Tracer
from ._base import _as, _builder_of, _lift, _scalar_lit, _traceable, _tracer

__all__: list[str] = []

MODES = SCATTER_MODES


def _index(x: Any, k: int) -> Union[Tracer, Lit]:
    """Index array ``k`` as a traced int32/uint32 value (an int32 literal for a Python int);
    anything else raises a DTypeError naming it."""
    what = f"scatter: indices[{k}]"
    if isinstance(x, (bool, np.bool_)):
        raise DTypeError(f"{what} must be an integer array or int; got the bool {x!r}")
    v = _lift(x)
    if isinstance(v, Tracer):
        if v.var.dtype not in ("int32", "uint32"):
            raise DTypeError(f"{what} must be an int32 or uint32 array; got {v.var.dtype} of "
                             f"shape {v.shape} (cast it with astype('int32'))")
        return v
    if isinstance(v, int):
        try:
            return _scalar_lit(v, "int32")
        except DTypeError:
            raise DTypeError(f"{what}: {v} does not fit in int32") from None
    raise DTypeError(f"{what} must be an integer array or int; got {type(x).__name__} {x!r}")


@_traceable
def scatter(operand: Any, indices: tuple[Any, ...], updates: Any, mode: str) -> Tracer:
    """``operand`` with ``updates`` combined into it at ``indices``: one integer index array per
    axis of ``operand`` (len(indices) == operand.ndim), all broadcasting with ``updates`` to one
    shape S; for each position p of S, ``out[i_0[p], ..., i_{n-1}[p]] (mode)= updates[p]``.
    Negative indices count from the end; indices still outside the array are dropped (JAX's
    default for scatters). ``mode``: one of MODES; for "add" and "multiply" duplicate indices
    accumulate; for "set" one of the duplicates wins."""
    if not isinstance(mode, str) or mode not in MODES:
        raise TraceError(f"scatter: mode must be one of {MODES}; got {mode!r}")
    x = _tracer(operand)
    if not isinstance(indices, (tuple, list)):
        raise TraceError(f"scatter: indices must be a tuple of index arrays, one per axis of the "
                         f"operand; got {type(indices).__name__}")
    if len(indices) != x.ndim:
        raise ShapeError(f"scatter: indices has {len(indices)} index arrays for an operand of "
                         f"shape {x.shape}; it needs one per axis ({x.ndim})")
    idx = [_index(i, k) for k, i in enumerate(indices)]
    try:
        index_shape = broadcast_shapes(*(i.shape for i in idx))
    except ShapeError:
        raise ShapeError(f"scatter: the index arrays' shapes {[i.shape for i in idx]} do not "
                         "broadcast together") from None
    u = _lift(updates)
    u_shape = u.shape if isinstance(u, Tracer) else ()
    try:
        broadcast_shapes(u_shape, index_shape)
    except ShapeError:
        raise ShapeError(f"scatter: updates of shape {u_shape} do not broadcast with the "
                         f"indices' shape {index_shape}") from None
    # the updates take the operand's dtype, as in JAX (a float update into an int array truncates)
    uv = _as(u, x.var.dtype)
    return _builder_of().bind(Op.SCATTER, [x, uv, *idx], {"mode": mode})
