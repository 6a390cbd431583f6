"""Wall-clock timing shared by the scripts in bench/ (run as ``python bench/<script>.py``)."""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Optional


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


def submit_setting(setting: Optional[str]) -> None:
    """Set how a long call submits: ``F`` (FUSEC_SUBMIT_FIRST), ``F/G`` (and
    FUSEC_SUBMIT_GROWTH G, else its default) or ``F/G/P`` (and FUSEC_SUBMIT_PLAN P); None goes
    back to the environment's settings."""
    import fusec

    first, _, rest = (setting or "").partition("/")
    growth, _, plan = rest.partition("/")
    fusec.config.set("submit_first", int(first) if setting is not None else None)
    fusec.config.set("submit_growth", int(growth) if growth else None)
    fusec.config.set("submit_plan", int(plan) if plan else None)


def torch_kernels(torch: Any, fn: Callable[[], Any], calls: int = 1,
                  warmup: int = 1) -> list[dict[str, Any]]:
    """The CUDA kernels of ``calls`` calls of ``fn`` by torch.profiler (CUPTI: the kernels' own
    time, no launch gaps), by name: its runs in all and its time per call, largest first; after
    ``warmup`` untimed calls."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = [{"kernel": e.key, "runs": e.count, "gpu_us": e.device_time_total / calls}
            for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r["gpu_us"])


def write_json(res: Any, out: str) -> None:
    """Write ``res`` as JSON to the path ``out`` (nothing when it is empty)."""
    if out:
        with open(out, "w") as fh:
            json.dump(res, fh, indent=1)


def report(res: Any, out: str = "") -> None:
    """Print ``res`` as JSON and, with ``out``, write it there too."""
    print(json.dumps(res, indent=1))
    write_json(res, out)


class ConfigSettings:
    """fusec's settings (``fusec.config``) as a module of constants for :func:`setting_changes`
    and :func:`overridden`: ``config.record_ahead=off`` sets one for the block; reading one gives
    its override (None: the environment's), which ``overridden`` restores after the block."""

    def __getattr__(self, name: str) -> Any:
        from fusec import config

        return config._overrides.get(name)

    def __setattr__(self, name: str, value: Any) -> None:
        from fusec import config

        config.set(name, value)


def setting_changes(setting: str, modules: dict[str, Any]) -> list[tuple[Any, str, Any]]:
    """The (module, name, value) changes a probe's setting names: ``default`` for none, else
    ``module.NAME=value`` overrides joined by commas, ``module`` a key of ``modules``, a value an
    int or a tuple of ints joined by colons (``codegen.MATMUL_BLOCK=64:192:16:4:12``)."""
    if setting == "default":
        return []
    out = []
    for item in setting.split(","):
        name, value = item.split("=")
        mod, attr = name.split(".")
        out.append((modules[mod], attr, _value(value)))
    return out


def _value(text: str) -> Any:
    try:
        return tuple(int(v) for v in text.split(":")) if ":" in text else int(text)
    except ValueError:
        return text


@contextlib.contextmanager
def overridden(changes: Sequence[tuple[Any, str, Any]]) -> Iterator[None]:
    """Module constants set to other values for the ``with`` block, restored after it."""
    saved = [(mod, attr, getattr(mod, attr)) for mod, attr, _ in changes]
    for mod, attr, value in changes:
        setattr(mod, attr, value)
    try:
        yield
    finally:
        for mod, attr, value in reversed(saved):
            setattr(mod, attr, value)
