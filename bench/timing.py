"""Wall-clock timing shared by the scripts in bench/ (run as ``python bench/<script>.py``)."""

from __future__ import annotations

import json
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


def back_to_back(fn: Callable[[], Any], sync: Callable[[], Any], calls: int, reps: int,
                 budget_s: float = float("inf")) -> float:
    """Seconds per call of ``calls`` calls of ``fn`` (which does not wait) issued back to back,
    then one ``sync``: the host's work for a call overlaps the device's work on the calls before,
    so this is a throughput where ``median_wall`` is a round trip. Median over ``reps`` such runs
    (fewer once ``budget_s`` seconds have gone, but at least one), after one warm-up call."""
    fn()
    sync()
    ts: list[float] = []
    start = time.perf_counter()
    while len(ts) < reps and (not ts or time.perf_counter() - start < budget_s):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        ts.append((time.perf_counter() - t) / calls)
    return statistics.median(ts)


def write_json(res: Any, out: str) -> None:
    """Write ``res`` as JSON to the path ``out`` (nothing when it is empty)."""
    if out:
        with open(out, "w") as fh:
            json.dump(res, fh, indent=1)


def report(res: Any, out: str = "") -> None:
    """Print ``res`` as JSON and, with ``out``, write it there too."""
    print(json.dumps(res, indent=1))
    write_json(res, out)
