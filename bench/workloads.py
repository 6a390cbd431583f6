"""The benchmark workloads for pytest-benchmark (``bench/test_fusion.py``): the suite of
:mod:`fusec.bench` (the same set ``fusec bench`` reports on), with inputs already on the device."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import fusec
from fusec import bench


@dataclass
class Workload:
    name: str
    fn: Callable[..., Any]
    make_inputs: Callable[[np.random.Generator, bool], tuple[Any, ...]]


def _inputs_of(name: str) -> Callable[[np.random.Generator, bool], tuple[Any, ...]]:
    def make(rng: np.random.Generator, small: bool) -> tuple[Any, ...]:
        (w,) = bench.select(bench.workloads(quick=small), [name])
        return tuple(fusec.device_put(a) for a in w.make_inputs(rng))

    return make


WORKLOADS = [Workload(w.name, w.bind(bench.FusecOps), _inputs_of(w.name))
             for w in bench.workloads(quick=True)]


def is_software_adapter() -> bool:
    return fusec.default_device().adapter_type in ("CPU", "cpu")
