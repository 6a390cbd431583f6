"""Ahead-of-time warm-up: record the signatures a program compiles, compile them all later.

Set ``FUSEC_RECORD_SIGNATURES=manifest.jsonl`` (or ``fusec.config.set("record_signatures", path)``)
and every newly compiled signature of an importable function is appended to the manifest as one JSON
line: the function (``module:qualname``, or ``/path/file.py:qualname`` for a script), and its
arguments with arrays replaced by their shape and dtype. ``fusec.warmup_from(path)`` (or
``fusec warmup MANIFEST``) traces and lowers every entry, then compiles all their pipelines, in
threads, with a progress bar. In the same process the functions are then ready: their first calls
compile nothing. In another process, what lasts is the persistent cache of lowered programs.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from . import config
from .errors import FusecError
from .jit import JitFunction, gpu_jit
from .record import _decode
from .runtime import get_runtime

# --- replaying ------------------------------------------------------------------------------------


def _resolve(ref: str) -> Any:
    target, _, qualname = ref.rpartition(":")
    if target.endswith(".py"):
        main = sys.modules.get("__main__")
        main_file = getattr(main, "__file__", None)
        if main_file and os.path.abspath(str(main_file)) == target:
            module: Any = main
        else:
            name = f"_fusec_warmup_{abs(hash(target))}"
            module = sys.modules.get(name)
            if module is None:
                spec = importlib.util.spec_from_file_location(name, target)
                if spec is None or spec.loader is None:
                    raise FusecError(f"cannot import {target}")
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())  # as `python -m` would: the user's project modules
        module = importlib.import_module(target)
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


class _Progress:
    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total, self.label, self.enabled, self.done = total, label, enabled, 0

    def step(self, what: str = "") -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 30
        filled = width * self.done // max(self.total, 1)
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] "
                         f"{self.done}/{self.total} {what[:40]:40s}")
        if self.done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def warmup_from(path: str, threads: Optional[int] = None, progress: bool = True) -> dict[str, Any]:
    """Compile every signature recorded in the manifest at ``path`` without running anything.

    Returns counts and timings: signatures, pipelines compiled, seconds. ``threads`` compiles
    pipelines in parallel (default 1: measured, threads do not speed up wgpu-native's pipeline
    creation).
    """

    t0 = time.perf_counter()
    lines = []
    with open(path) as fh:
        for n, raw in enumerate(fh, 1):
            if raw.strip() and raw not in lines:
                lines.append(raw)
    records = []
    for raw in lines:
        try:
            records.append(json.loads(raw))
        except json.JSONDecodeError:
            config.log(f"warmup: skipping a malformed line of {path}")
    bar = _Progress(len(records), "fusec warmup: tracing ", progress)
    pending = []  # (jitted function, signature key, lowered program)
    failed: list[str] = []
    for rec in records:
        try:
            obj = _resolve(rec["function"])
        except (ImportError, AttributeError, OSError) as exc:
            failed.append(f"{rec.get('function')}: {type(exc).__name__}: {exc}")
            bar.step()
            continue
        opts = rec.get("options", {})
        jf = obj if isinstance(obj, JitFunction) else gpu_jit(
            obj, static_argnames=tuple(opts.get("static_argnames", ())),
            donate_argnames=tuple(opts.get("donate_argnames", ())),
            fuse=opts.get("fuse", True))
        try:
            args, kwargs = _call_args(jf, {k: _decode(v) for k, v in rec["arguments"].items()})
            key, leaves, td, static = jf._signature(args, kwargs)
            if key not in jf._cache:
                pending.append((jf, key, jf._trace(key, leaves, td, static).lower()))
        except Exception as exc:  # one stale entry must not stop the warm-up of the others
            failed.append(f"{rec.get('function')}: {type(exc).__name__}: {exc}")
        bar.step(jf.name)
    rt = get_runtime()
    kernels = {}
    if rt is not None:
        for _, _, lowered in pending:
            for k in lowered.kernels:
                if k.key not in rt.pipelines:
                    kernels[k.key] = k
    bar = _Progress(len(kernels), "fusec warmup: compiling", progress)
    t1 = time.perf_counter()
    # Measured: creating pipelines from several threads is no faster with wgpu-native (H200:
    # 178 ms with 1 thread, 224 ms with 8, for 20 pipelines; lavapipe: the same): default 1.
    workers = threads or 1

    def build(k: Any) -> None:
        assert rt is not None
        rt.pipeline(k.key, k.wgsl, k.n_inputs, k.n_outputs, k.name)
        bar.step(k.name)

    if workers > 1 and len(kernels) > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(build, kernels.values()))
    else:
        for k in kernels.values():
            build(k)
    t2 = time.perf_counter()
    for jf, key, lowered in pending:
        jf._cache[key] = lowered.compile()  # every pipeline is cached now: nothing compiles
    for msg in failed:
        config.log(f"warmup: skipped {msg}")
    return {"signatures": len(pending), "pipelines": len(kernels), "threads": workers,
            "failed": failed, "compile_seconds": t2 - t1,
            "total_seconds": time.perf_counter() - t0}


def _call_args(jf: Any, arguments: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Positional and keyword arguments for recorded ones, following the function's signature
    (positional-only parameters, ``*args`` and ``**kwargs`` included)."""
    import inspect

    try:
        sig = inspect.signature(jf.fun)
    except (TypeError, ValueError):
        return (), arguments
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for name, p in sig.parameters.items():
        if name not in arguments:
            continue
        value = arguments[name]
        if p.kind is p.POSITIONAL_ONLY:
            args.append(value)
        elif p.kind is p.VAR_POSITIONAL:
            args.extend(value)
        elif p.kind is p.VAR_KEYWORD:
            kwargs.update(value)
        elif args:  # after a positional-only one, keep passing positionally
            args.append(value)
        else:
            kwargs[name] = value
    return tuple(args), kwargs
