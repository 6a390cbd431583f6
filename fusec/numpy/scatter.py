"""The scatter primitive behind ``x.at[...].set/add/multiply/min/max`` (not written yet)."""

from __future__ import annotations

from typing import Any

from ..trace import Tracer

__all__: list[str] = []

MODES = ("set", "add", "multiply", "min", "max")


def scatter(operand: Any, indices: tuple[Any, ...], updates: Any, mode: str) -> Tracer:
    """``operand`` with ``updates`` combined into it at ``indices``: one integer index array per
    axis of ``operand`` (len(indices) == operand.ndim), all broadcasting with ``updates`` to one
    shape S; for each position p of S, ``out[i_0[p], ..., i_{n-1}[p]] (mode)= updates[p]``.
    Negative indices count from the end; indices still outside the array are dropped (JAX's
    default for scatters). ``mode``: one of MODES; for "add" and "multiply" duplicate indices
    accumulate; for "set" one of the duplicates wins."""
    raise NotImplementedError("scatter")
