"""Fused vs unfused (`fuse=False`: one kernel per op, same single submit), side by side in one run.

Each benchmark also records the bytes each plan moves (``cost_analysis``), so the speed-up can be
compared with the ratio of bytes moved."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from workloads import WORKLOADS, Workload, is_software_adapter

import fusec


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("w", WORKLOADS, ids=lambda w: w.name)
def test_fusion(benchmark: Any, w: Workload, fused: bool) -> None:
    rng = np.random.default_rng(0)
    args = w.make_inputs(rng, is_software_adapter())
    f = fusec.gpu_jit(w.fn, fuse=fused)
    f(*args).block_until_ready()  # compile and warm up outside the timing
    cost = f.lower(*args).cost_analysis()
    benchmark.extra_info.update({"bytes": cost["bytes accessed"], "kernels": cost["kernels"]})
    benchmark.pedantic(lambda: f(*args).block_until_ready(), rounds=10, iterations=1,
                       warmup_rounds=1)
