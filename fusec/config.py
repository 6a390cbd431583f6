"""Settings, read from the environment and settable from Python (``fusec.config.set("debug", 4)``).

FUSEC_DEBUG    1: kernel counts and compile events; 2: + timings; 3: + traced IR; 4: + WGSL;
               5: + IR after every pass
FUSEC_BACKEND  auto (default) | gpu | vulkan | metal | dx12 | gl | cpu. auto: the best hardware
               adapter, or the numpy interpreter where the only adapters are software ones
               (lavapipe: numpy is faster there); gpu: the best wgpu adapter, software too (the
               tests set it); vulkan...gl: an adapter of that backend; cpu: the interpreter
FUSEC_VERIFY   1: run the IR verifier after every pass (the test suite turns it on)
FUSEC_LOG_COMPILES  1: log every trace and pipeline compile with its time
FUSEC_EXPLAIN_CACHE_MISSES  1: say why a call missed the cache (which argument changed how)
FUSEC_RECORD_SIGNATURES     path: append every newly compiled signature to this warm-up manifest
FUSEC_RETRACE_WARN          warn once when one function has been traced this many times (10)
FUSEC_TARGET   gpu | cpu: which kernel strategies codegen picks (default: cpu on a software
               adapter such as lavapipe, gpu otherwise); the tests use it to run GPU kernels on
               lavapipe
FUSEC_STRICT_DTYPES  1: refuse 64-bit (and 8/16-bit integer) inputs instead of converting them to
               the 32-bit type of their kind with a one-time warning (JAX's default with x64 off)
FUSEC_SHADER_CHECKS  1: compile kernels with wgpu's runtime checks (every array index clamped,
               every loop bounded); default 0: fusec's kernels are compiled as trusted modules
FUSEC_RECORD_AHEAD  auto (default) | always | off: while the host waits for a large call, record
               the executable's next call with the same argument buffers, so that the next call
               only submits it (see the user guide, "Calls recorded ahead")
FUSEC_DEQUANT_CACHE_MB  the numpy interpreter keeps quantized weights dequantised between calls,
               up to this many MiB in all (default 1024; 0: dequantise at every call)
FUSEC_WHILE_CHUNK_MAX  the most iterations of a while_loop run between two reads of its flag
               (default 64; chunks grow 2, 4, 8, ... up to it; rounded up to an even number)
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .errors import FusecError

_overrides: dict[str, Any] = {}

_ENV = {
    "debug": ("FUSEC_DEBUG", 0),
    "backend": ("FUSEC_BACKEND", ""),
    # an index into fusec.devices(): the adapter the default device uses ("": fusec chooses)
    "adapter": ("FUSEC_ADAPTER", ""),
    "verify": ("FUSEC_VERIFY", 0),
    "log_compiles": ("FUSEC_LOG_COMPILES", 0),
    "target": ("FUSEC_TARGET", ""),
    "explain_cache_misses": ("FUSEC_EXPLAIN_CACHE_MISSES", 0),
    "record_signatures": ("FUSEC_RECORD_SIGNATURES", None),
    "retrace_warn": ("FUSEC_RETRACE_WARN", 10),
    "shader_checks": ("FUSEC_SHADER_CHECKS", 0),
    "strict_dtypes": ("FUSEC_STRICT_DTYPES", 0),
    # how a wait or readback waits for the GPU: "spin" (the calling thread polls wgpu-native
    # without blocking, up to FUSEC_SPIN_US microseconds, then blocks), "poll" (it blocks in
    # wgpu-native's poll at once) or "thread" (wgpu-py's map_sync, through its poller thread)
    "wait": ("FUSEC_WAIT", "spin"),
    "spin_us": ("FUSEC_SPIN_US", 20000),
    # 1: calls record and submit through wgpu-native's C functions (fusec.native); 0: wgpu-py's
    "native": ("FUSEC_NATIVE", 1),
    # 1: kernels that gain from subgroup operations use them where the adapter has the
    # "subgroup" feature (the radix sort, quantized products, few-rows attention); 0: never (read
    # when the device opens)
    "subgroups": ("FUSEC_SUBGROUPS", 1),
    # lazy submission: small calls submitted together, this many at most (0: each call at once)
    "batch_calls": ("FUSEC_BATCH_CALLS", 64),
    # dispatches encoded before the first submit of a call with many kernels (0: one submit):
    # the GPU starts on them while the host encodes the rest; later chunks grow (submit_growth)
    "submit_first": ("FUSEC_SUBMIT_FIRST", 4),  # read at each call that is not batched
    # ...then submits after this many times as many dispatches each time (2: after 4, 8, 16, ...;
    # 1 or less: the rest of the call in one submit)
    "submit_growth": ("FUSEC_SUBMIT_GROWTH", 2),
    # ...or later, on GPUs, while the GPU is estimated to have work queued (runtime.submit_cuts;
    # 0: the doubling rule alone)
    "submit_plan": ("FUSEC_SUBMIT_PLAN", 1),
    # 1: a call that finds the GPU still running earlier work submits once, at its end (the
    # queue keeps the GPU busy meanwhile; each submit costs host and GPU time); 0: in chunks
    # as above all the same (runtime.GpuExecutable._run)
    "submit_busy": ("FUSEC_SUBMIT_BUSY", 1),
    # a large call's next call recorded while the host waits for the GPU (runtime.record_ahead):
    # "auto" (where the wait is long enough to hide it), "always", or "off"
    "record_ahead": ("FUSEC_RECORD_AHEAD", "auto"),
    # a while_loop's chunks of iterations between reads of its flag grow up to this (runtime)
    "while_chunk_max": ("FUSEC_WHILE_CHUNK_MAX", 0),
    # the numpy interpreter keeps quantized weights' dequantised matrices between calls, up to
    # this many MiB in all (fusec.interpret.dequantized; 0: dequantise at every call)
    "dequant_cache_mb": ("FUSEC_DEQUANT_CACHE_MB", 1024),
}
_CASE_INSENSITIVE = {"backend", "target", "record_ahead"}


def get(name: str) -> Any:
    if name in _overrides:
        return _overrides[name]
    env, default = _ENV[name]
    raw = os.environ.get(env)
    if raw is None or raw == "":
        return default
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            return 1 if raw.lower() in ("true", "yes", "on") else 0
    return raw.strip().lower() if name in _CASE_INSENSITIVE else raw


def env_int(env: str, default: int) -> int:
    """An integer tuning constant from environment variable ``env`` (``default`` where it is unset
    or empty), read where a module defines the constant; anything but an integer is an error
    that names the variable."""
    raw = os.environ.get(env, "")
    if not raw.strip():
        return default
    try:
        return int(raw)
    except ValueError:
        raise FusecError(f"{env} must be an integer; got {raw!r}") from None


def set(name: str, value: Any) -> None:  # noqa: A001 - mirrors get()
    """Override a setting for this process (``None`` goes back to the environment)."""
    if name not in _ENV:
        raise KeyError(f"unknown fusec setting {name!r}; known: {', '.join(_ENV)}")
    if value is None:
        _overrides.pop(name, None)
    else:
        _overrides[name] = value


def debug_level() -> int:
    return int(get("debug"))


def verify_passes() -> bool:
    return bool(get("verify"))


def debug(level: int, msg: str) -> None:
    """Print ``msg`` to stderr when FUSEC_DEBUG >= level."""
    if debug_level() >= level:
        print(f"fusec: {msg}", file=sys.stderr, flush=True)


def log(msg: str) -> None:
    print(f"fusec: {msg}", file=sys.stderr, flush=True)


def log_compile(msg: str) -> None:
    if get("log_compiles") or debug_level() >= 1:
        print(f"fusec: {msg}", file=sys.stderr, flush=True)
