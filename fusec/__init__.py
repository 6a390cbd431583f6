"""fusec: trace numpy-style Python into fused WGSL compute shaders and run them through wgpu.

    import fusec, fusec.numpy as fnp
    from fusec import nn

    @fusec.gpu_jit
    def block(x, w, b):
        return nn.gelu(x @ w + b)
"""

from __future__ import annotations

__version__ = "0.1.0"

from . import (  # noqa: E402
    config,
    control_flow_ad,  # noqa: F401,E402  (registers the loop op's autodiff rules)
    lax,
    nn,
    numpy,
    quant,
    random,
    tree_util,
)
from .autodiff import custom_vjp, grad, jacfwd, jacrev, jvp, stop_gradient, value_and_grad, vjp
from .cache import CacheInfo, cache_info, clear_cache
from .clocks import hold_gpu_clocks
from .errors import (
    CarryError,
    DeviceLimitError,
    DTypeError,
    FusecError,
    IndexingError,
    ShapeError,
    SignatureError,
    StaticArgumentError,
    TraceError,
    TracerBoolConversionError,
)
from .exported import Exported, ExportError, export, load_exported
from .jit import Compiled, JitFunction, Lowered, Traced, gpu_jit
from .runtime import Array, DeviceInfo, default_device, device_put, devices, profile
from .sharding import Sharded, all_reduce, replicate, shard
from .trace import ShapeDtype
from .vmap import vmap
from .warmup import warmup_from

__all__ = [
    "Array", "CacheInfo", "CarryError", "Compiled", "DTypeError", "DeviceInfo", "DeviceLimitError",
    "FusecError",
    "IndexingError", "JitFunction", "Lowered", "ShapeDtype", "ShapeError", "SignatureError",
    "StaticArgumentError", "TraceError", "Traced", "TracerBoolConversionError", "cache_info",
    "clear_cache", "config", "default_device", "device_put", "devices", "gpu_jit", "lax", "nn",
    "numpy",
    "quant", "random", "tree_util", "vmap", "warmup_from", "grad", "value_and_grad", "vjp", "jvp",
    "jacrev", "jacfwd", "custom_vjp", "stop_gradient", "profile", "export", "load_exported",
    "Exported", "ExportError", "Sharded", "shard", "replicate", "all_reduce", "hold_gpu_clocks",
]
