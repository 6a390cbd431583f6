"""Kernels of kind "sort" (not written yet)."""

from __future__ import annotations

from ..emit import KernelCode
from ..ir import Eqn


def generate(kernel: Eqn, target: str = "gpu", workgroup_storage: int = 16384) -> KernelCode:
    raise NotImplementedError("sort kernels")
