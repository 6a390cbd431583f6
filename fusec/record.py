"""Recording signatures for ahead-of-time warm-up (see :mod:`fusec.warmup`, which replays them).

Set ``FUSEC_RECORD_SIGNATURES=manifest.jsonl`` and every newly compiled signature of an importable
function is appended to the manifest as one JSON line. This module sits below :mod:`fusec.jit`
(which calls :func:`record` on each cache miss); replaying sits above it.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Optional

import numpy as np

from . import config
from .runtime import Array
from .trace import ShapeDtype

# --- recording ------------------------------------------------------------------------------------


def function_ref(fun: Any) -> Optional[str]:
    """``module:qualname`` (or ``/abs/path.py:qualname`` for a script) if importable, else None."""
    qualname = getattr(fun, "__qualname__", "")
    module = getattr(fun, "__module__", None)
    if not qualname or "<" in qualname or module is None:  # lambdas and local functions
        return None
    if module == "__main__":
        path = getattr(sys.modules.get("__main__"), "__file__", None)
        return f"{os.path.abspath(path)}:{qualname}" if path else None
    return f"{module}:{qualname}"


def _encode(x: Any, static: bool) -> Any:
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return {"tuple": [_encode(v, static) for v in x]}
    if isinstance(x, list):
        return [_encode(v, static) for v in x]
    if isinstance(x, dict):
        if not all(isinstance(k, str) for k in x):
            raise TypeError("only string dict keys can be recorded")
        return {"dict": {k: _encode(v, static) for k, v in x.items()}}
    if x is None or (static and isinstance(x, (bool, int, float, str))):
        return x
    if not static:
        if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
            return {"scalar": type(x).__name__}
        if isinstance(x, (np.ndarray, np.generic, Array, ShapeDtype)):
            return {"spec": [list(np.shape(x) if not isinstance(x, ShapeDtype) else x.shape),
                             str(np.dtype(x.dtype)) if not isinstance(x, ShapeDtype)
                             else x.dtype]}
    raise TypeError(f"cannot record a {type(x).__name__}")


def _decode(x: Any) -> Any:
    if isinstance(x, list):
        return [_decode(v) for v in x]
    if isinstance(x, dict):
        if "tuple" in x:
            return tuple(_decode(v) for v in x["tuple"])
        if "dict" in x:
            return {k: _decode(v) for k, v in x["dict"].items()}
        if "scalar" in x:
            return {"float": 0.0, "int": 0, "bool": False}[x["scalar"]]
        if "spec" in x:
            return ShapeDtype(tuple(x["spec"][0]), x["spec"][1])
    return x


def record(jf: Any, dyn: dict[str, Any], static: tuple[tuple[str, Any], ...]) -> None:
    """Append this signature of ``jf`` to the manifest named by FUSEC_RECORD_SIGNATURES."""
    path = config.get("record_signatures")
    if not path:
        return
    ref = function_ref(jf.fun)
    if ref is None:
        config.debug(1, f"not recording {jf.name}: it cannot be imported by name (a lambda or "
                        "a local function)")
        return
    try:
        arguments = {k: _encode(v, False) for k, v in dyn.items()}
        arguments.update({k: _encode(v, True) for k, v in static})
    except TypeError as exc:
        config.debug(1, f"not recording {jf.name}: {exc}")
        return
    line = json.dumps({"function": ref, "arguments": arguments,
                       "options": {"fuse": jf.fuse,
                                   "static_argnames": sorted(jf._binder.static_names),
                                   "donate_argnames": sorted(jf._donated_names)}},
                      sort_keys=True)
    # one write of one line with O_APPEND: concurrent recorders never interleave within a line
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


