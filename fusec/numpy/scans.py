"""Cumulative operations along an axis: cumsum, cumprod, cumulative_sum."""

from __future__ import annotations

__all__: list[str] = []
