"""The benchmark workloads: each is a function, its inputs, and the bytes a perfect plan moves."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import fusec
import fusec.numpy as fnp
from fusec import nn


@dataclass
class Workload:
    name: str
    fn: Callable[..., Any]
    make_inputs: Callable[[np.random.Generator, bool], tuple[Any, ...]]


def _chain(n_ops: int) -> Callable[..., Any]:
    def f(x: Any, y: Any) -> Any:
        v = x
        for i in range(n_ops):
            v = [lambda a: a * y, lambda a: a + 0.5, lambda a: fnp.maximum(a, -1.0),
                 lambda a: a - y, lambda a: fnp.tanh(a)][i % 5](v)
        return v

    f.__name__ = f"chain{n_ops}"
    return f


def _rows(rng: np.random.Generator, small: bool) -> tuple[Any, ...]:
    shape = (1024, 1024) if small else (8192, 8192)
    return (fusec.device_put(rng.standard_normal(shape).astype(np.float32)),)


def _ln_inputs(rng: np.random.Generator, small: bool) -> tuple[Any, ...]:
    (x,) = _rows(rng, small)
    n = x.shape[-1]
    return (x, fusec.device_put(rng.standard_normal(n).astype(np.float32)),
            fusec.device_put(rng.standard_normal(n).astype(np.float32)))


def _chain_inputs(rng: np.random.Generator, small: bool) -> tuple[Any, ...]:
    n = 1 << (20 if small else 26)
    return (fusec.device_put(rng.standard_normal(n).astype(np.float32)),
            fusec.device_put(rng.standard_normal(n).astype(np.float32)))


WORKLOADS = [
    Workload("chain10", _chain(10), _chain_inputs),
    Workload("softmax", lambda x: nn.softmax(x, axis=-1), _rows),
    Workload("layer_norm", lambda x, g, b: nn.layer_norm(x, g, b), _ln_inputs),
]


def is_software_adapter() -> bool:
    return fusec.default_device().adapter_type in ("CPU", "cpu")
