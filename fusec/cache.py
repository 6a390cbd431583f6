"""Process-wide cache statistics (``fusec.cache_info()``) and the registry behind
``clear_cache()``."""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from typing import Any


@dataclass
class CacheInfo:
    """Counts since start (or the last ``clear_cache()``). Subtract two snapshots for a delta."""

    traces: int = 0  # functions traced (new signatures)
    lowerings: int = 0  # traced programs run through the pass pipeline and codegen
    pipelines_compiled: int = 0  # GPU compute pipelines created
    pipeline_hits: int = 0  # kernels whose pipeline was already compiled (shared across functions)
    hits: int = 0  # calls whose signature was already compiled
    misses: int = 0  # calls that needed a trace and compile
    disk_hits: int = 0  # lowerings loaded from the persistent cache
    readbacks: int = 0  # device-to-host copies

    def __sub__(self, other: CacheInfo) -> CacheInfo:
        return CacheInfo(**{f.name: getattr(self, f.name) - getattr(other, f.name)
                            for f in dataclasses.fields(self)})

    def snapshot(self) -> CacheInfo:
        return dataclasses.replace(self)


STATS = CacheInfo()

# Every object holding compiled state registers here so that clear_cache() can empty it.
_CLEARABLE: weakref.WeakSet[Any] = weakref.WeakSet()


def register(obj: Any) -> None:
    _CLEARABLE.add(obj)


def cache_info() -> CacheInfo:
    """A snapshot of the cache counters: traces, lowerings, pipelines compiled, hits, misses..."""
    return STATS.snapshot()


def clear_cache() -> None:
    """Forget every compiled signature and pipeline, and reset the counters."""
    for obj in list(_CLEARABLE):
        obj.clear()
    for f in dataclasses.fields(STATS):
        setattr(STATS, f.name, 0)
