"""Indexing traced values: basic and advanced indexing (gathers), ``take``, ``take_along_axis``,
and the ``.at[]`` updates (scatters)."""

from __future__ import annotations

from typing import Any

__all__: list[str] = []

# attributes attach_operators gives Tracer and fusec.Array (__getitem__, at)
ATTACH: dict[str, Any] = {}
