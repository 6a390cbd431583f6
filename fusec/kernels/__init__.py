"""Code generation for the kernel kinds that are not elementwise, reduction or matmul kernels:
one module per kind, each with ``generate(kernel, target, workgroup_storage) -> KernelCode`` and
its own template in ``templates/``. :func:`fusec.codegen.generate` dispatches here by the
kernel's ``kind``; the IR ops of each kind are listed in :data:`fusec.ir.KERNEL_KIND`."""

from __future__ import annotations

from collections.abc import Callable

from ..emit import KernelCode
from ..ir import Eqn
from . import attention, quant, scan, scatter, sort

GENERATORS: dict[str, Callable[[Eqn, str, int], KernelCode]] = {
    "scatter": scatter.generate,
    "scan": scan.generate,
    "sort": sort.generate,
    "attention": attention.generate,
    "quant": quant.generate,
}
