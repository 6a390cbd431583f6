"""Wall-clock timing shared by the scripts in bench/ (run as ``python bench/<script>.py``)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def median_wall(fn: Callable[[], Any], reps: int, warmup: int = 3) -> float:
    """Median seconds of ``reps`` calls of ``fn`` (which waits for its own result), after
    ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)
