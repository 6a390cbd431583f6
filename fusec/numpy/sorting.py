"""Sorting and searching: sort, argsort, top_k, searchsorted."""

from __future__ import annotations

__all__: list[str] = []
