"""Keeping an NVIDIA GPU at its full clocks while fusec works (``fusec.hold_gpu_clocks``).

An NVIDIA GPU that is not driven by CUDA manages its own clocks from its load: idle, its SMs run
at their lowest clock (345 MHz on an H200, against 1980 at full speed); under load they climb to
full speed in about a second (at once only when the GPU is fully busy), and fall back after
about a second idle. Work submitted through Vulkan counts as load, but short calls with waits in
between never raise the clock, so such calls ran up to 5x slower by their GPU time than in a
process that also holds a CUDA context: while one exists the driver keeps the clocks at full
speed (JAX and torch hold one by existing). Measured with ``bench/gpu_clocks.py``.

This module sits below everything else in fusec: it only talks to the NVIDIA driver's
``libcuda`` through ctypes (no CUDA toolkit, no Python package).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from typing import Any

_lock = threading.Lock()
_held: list[tuple[Any, int, ctypes.c_void_p]] = []


def hold_gpu_clocks() -> str:
    """Keep every NVIDIA GPU of this machine at its full clocks for the rest of the process.

    It retains a CUDA primary context on each CUDA device through the NVIDIA driver's
    ``libcuda``, as JAX and torch do by existing: while a context exists, the driver keeps the
    GPU's clocks at full speed, where otherwise it lowers them whenever the GPU idles for about a
    second and raises them only after about a second of load. Costs: each context holds a few
    hundred MiB of the GPU's memory and the GPU draws more power while idle (an H200: about 120
    W idle against 80). Call it once, before timing or serving calls; calling it again does
    nothing. Where there is no NVIDIA driver (another GPU, a machine without a GPU), it does
    nothing.

    Returns:
        What it did, in words: ``"held on 1 CUDA device"``, or why it held nothing.
    """
    with _lock:
        if _held:
            return _held_text()
        name = ctypes.util.find_library("cuda") or "libcuda.so.1"
        try:
            cuda = ctypes.CDLL(name)
        except OSError:
            return "nothing held: no NVIDIA driver (libcuda) on this machine"
        if cuda.cuInit(0) != 0:
            return "nothing held: the NVIDIA driver found no CUDA device"
        count = ctypes.c_int()
        if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
            return "nothing held: the NVIDIA driver found no CUDA device"
        for i in range(count.value):
            dev, ctx = ctypes.c_int(), ctypes.c_void_p()
            rc = cuda.cuDeviceGet(ctypes.byref(dev), i)
            if rc == 0:
                rc = cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
            if rc != 0:
                return (f"held on {len(_held)} of {count.value} CUDA devices: device {i} "
                        f"refused a context (CUresult {rc})")
            _held.append((cuda, dev.value, ctx))
        return _held_text()


def _held_text() -> str:
    return f"held on {len(_held)} CUDA device{'s' if len(_held) > 1 else ''}"


def clocks_held() -> int:
    """How many CUDA devices :func:`hold_gpu_clocks` holds in this process."""
    return len(_held)
