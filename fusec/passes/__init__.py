"""The pass pipeline: each pass is a pure function Program -> Program, run in the order listed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from .. import codegen, config
from ..ir import Program
from .attention import fold_cache_update, rewrite_attention
from .cse import cse
from .dce import dce, used_inputs
from .fuse import fuse
from .loops import prepare_loops
from .memory import MemoryAnalysis, analyse, plan_memory
from .merge import merge_products
from .quant import fold_rms_norm, rewrite_quant
from .scan import lower_scan
from .scatter import lower_scatter
from .simplify import simplify
from .sort import lower_sort
from .split import split_reductions
from .splitk import split_k
from .verify import VerifyError, verify
from .widen import widen_float16


@dataclass(frozen=True)
class Options:
    """What the passes may depend on; part of every cache key."""

    fuse: bool = True
    max_bindings: int = 8  # storage buffers one kernel may bind (device limit)
    donated: tuple[int, ...] = ()  # program inputs whose buffers the caller donates
    target: str = "gpu"  # "cpu" for a software adapter: codegen picks other strategies
    # bytes of workgroup memory a kernel may use (device limit; at least WebGPU's minimum)
    workgroup_storage: int = codegen.WORKGROUP_STORAGE
    # subgroup operations of the device: 0 none, 1 WGSL's subgroup builtins (wgpu-native's
    # "subgroup"), 2 those and subgroupBarrier(), 3 those with subgroups of at most 32 lanes
    # (Runtime.subgroups)
    subgroups: int = 0
    # >= 0: the program is the body of a loop with this many carries (passes/loops.py), of which
    # those in loop_inplace are updated in place
    loop_carries: int = -1
    loop_inplace: tuple[int, ...] = ()

    def for_loop_body(self, carries: int, inplace: tuple[int, ...]) -> Options:
        """The options a loop's body is lowered with (nothing of it is donated)."""
        return replace(self, donated=(), loop_carries=carries, loop_inplace=inplace)


Pass = Callable[[Program, Options], Program]

PIPELINE: list[tuple[str, Pass]] = [
    ("simplify", lambda p, o: simplify(p)),
    ("cse", lambda p, o: cse(p)),
    ("dce", lambda p, o: dce(p)),
    # float16 operands of the kernels that compute on 32-bit words, and of sums, widened
    ("widen_float16", lambda p, o: widen_float16(p)),
    # products sharing their left operand (a transformer's Q, K and V projections) become one
    # product with the weights joined (a fusion too: not in unfused plans)
    ("merge_products", lambda p, o: merge_products(p) if o.fuse else p),
    # attention written out becomes one op of its own kernel (a fusion: not in unfused plans)
    ("attention", lambda p, o: rewrite_attention(p, o.target, o.subgroups, o.workgroup_storage)
     if o.fuse else p),
    # products with a quantized matrix and few rows become one op whose kernel dequantises the
    # weights in registers (a fusion too)
    ("quant", lambda p, o: rewrite_quant(p, o.target, o.subgroups) if o.fuse else p),
    # a root-mean-square normalisation only a quantized product reads is computed by its kernel
    # (GPUs; a fusion too)
    ("fold_rms_norm", lambda p, o: fold_rms_norm(p, o.target) if o.fuse else p),
    # primitives computed by kernels of their own kind become the ops those kernels compute
    ("lower_scatter", lambda p, o: lower_scatter(p, o.target, in_loop=o.loop_carries >= 0)),
    ("lower_scan", lambda p, o: lower_scan(p, o.target)),
    ("lower_sort", lambda p, o: lower_sort(p, o.target, o.workgroup_storage, o.subgroups)),
    ("split_reductions", lambda p, o: split_reductions(p, o.target)),
    ("split_k", lambda p, o: split_k(p, o.target, sums=o.fuse)),
    # loops' bodies lowered on their own, loops' inputs and bodies' results made buffers
    ("prepare_loops", lambda p, o: prepare_loops(p, o, run_pipeline)),
    ("fuse", lambda p, o: fuse(p, enabled=o.fuse, max_bindings=o.max_bindings,
                                target=o.target, scalar_sides=o.loop_carries >= 0,
                                subgroups=o.subgroups)),
    ("plan_memory", lambda p, o: plan_memory(p, o.donated)),
    # a decode step's in-place cache update done by the attention kernel that reads it (GPUs;
    # after memory planning, which decides what is written in place; a fusion: not in unfused
    # plans)
    ("fold_cache_update", lambda p, o: fold_cache_update(p, o.target, o.max_bindings)
     if o.fuse else p),
]


def tuning() -> dict[str, object]:
    """The passes' settings that change a lowered program (beside codegen.tuning()): part of the
    persistent cache's key, so that a process with other settings never loads another plan."""
    import importlib

    from . import attention as attention_module
    from . import merge, quant, split, splitk

    # (the attribute fusec.passes.fuse is the pass's function: the module by its name)
    fuse_module = importlib.import_module(__name__ + ".fuse")

    return {"fuse": (fuse_module.ROW_MAX, fuse_module.CONE_MAX, fuse_module.PROLOGUE_MAX,
                     fuse_module.PROLOGUE_ROWS, fuse_module.PROLOGUE_QUERY_ROWS,
                     fuse_module.COMBINE_PROLOGUE, fuse_module.COMBINE_MAX_PARTS),
            "merge": (merge.MAX_ROWS, merge.MAX_TILES),
            "attention": (attention_module.PROBS_IN_PRODUCT, attention_module.FOLD_CACHE_UPDATE,
                          attention_module.FOLD_WINDOW_MAX),
            "quant": (quant.FOLD_RMS_NORM,),
            "split": (split.SPLIT_MIN, split.SPLIT_MAX_OUTPUTS, split.CHUNK, split.MAX_CHUNKS,
                      split.COLUMN_THREADS, split.COLUMN_MIN),
            "splitk": (splitk.TILE_LIMIT, splitk.GROUPS, splitk.MIN_CHUNK, splitk.RB_GROUPS,
                       splitk.RB_WAVE, splitk.RB_MIN_K, splitk.RB_MIN_CHUNK, splitk.REDUCE_OUTPUTS,
                       splitk.REDUCE_COLUMNS, splitk.REDUCE_WORK)}


# What the numpy interpreter runs as the backend (runtime.CpuExecutable): the traced program
# cleaned up, not lowered. numpy sorts, scans, scatters and reduces in one call each, so the
# GPU's forms of those (radix passes, tiled scans, split reductions and split-k matmuls), fusion
# and memory planning only add work there.
INTERPRETER_PASSES = ("simplify", "cse", "dce")


def run_interpreter_pipeline(prog: Program, check: bool | None = None) -> Program:
    """The passes of INTERPRETER_PASSES, in PIPELINE's order (none of them reads the options)."""
    check = config.verify_passes() if check is None else check
    for name, fn in PIPELINE:
        if name in INTERPRETER_PASSES:
            prog = fn(prog, Options())
            if check:
                verify(prog, name)
    return prog


def run_pipeline(prog: Program, opts: Options, check: bool | None = None) -> Program:
    """Run every pass; verify after each when ``check`` (default: FUSEC_VERIFY / under pytest)."""
    check = config.verify_passes() if check is None else check
    for name, fn in PIPELINE:
        prog = fn(prog, opts)
        if check:
            verify(prog, name)
        if config.debug_level() >= 5:  # (printing a long program costs as much as a pass)
            config.debug(5, f"IR after {name}:\n{prog}")
    return prog


__all__ = ["PIPELINE", "Options", "run_pipeline", "INTERPRETER_PASSES", "run_interpreter_pipeline",
           "simplify", "cse", "dce", "split_reductions",
           "split_k", "fuse", "plan_memory", "lower_scatter", "lower_scan", "lower_sort",
           "analyse", "MemoryAnalysis", "merge_products", "rewrite_attention", "rewrite_quant",
           "verify", "VerifyError", "used_inputs", "prepare_loops", "widen_float16", "tuning",
           "fold_cache_update"]
