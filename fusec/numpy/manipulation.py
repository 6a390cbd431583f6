"""Rearranging arrays: concatenate, stack, split, flip, roll, tile, repeat, moveaxis, pad."""

from __future__ import annotations

__all__: list[str] = []
