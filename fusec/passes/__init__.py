"""The pass pipeline: each pass is a pure function Program -> Program, run in the order listed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .. import config
from ..ir import Program
from .dce import dce, used_inputs
from .fuse import fuse
from .verify import VerifyError, verify


@dataclass(frozen=True)
class Options:
    """What the passes may depend on; part of every cache key."""

    fuse: bool = True
    max_bindings: int = 8  # storage buffers one kernel may bind (device limit)


Pass = Callable[[Program, Options], Program]

PIPELINE: list[tuple[str, Pass]] = [
    ("dce", lambda p, o: dce(p)),
    ("fuse", lambda p, o: fuse(p, enabled=o.fuse, max_bindings=o.max_bindings)),
]


def run_pipeline(prog: Program, opts: Options, check: bool | None = None) -> Program:
    """Run every pass; verify after each when ``check`` (default: FUSEC_VERIFY / under pytest)."""
    check = config.verify_passes() if check is None else check
    for name, fn in PIPELINE:
        prog = fn(prog, opts)
        if check:
            verify(prog, name)
        config.debug(5, f"IR after {name}:\n{prog}")
    return prog


__all__ = ["PIPELINE", "Options", "run_pipeline", "dce", "fuse", "verify", "VerifyError",
           "used_inputs"]
