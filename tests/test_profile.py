"""fusec.profile(): each kernel's GPU time, from timestamp queries on the real adapter."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import requires_wgpu

import fusec
from fusec import nn


@requires_wgpu
def test_profile_times_every_kernel_of_every_call(capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    w = rng.standard_normal((96, 48)).astype(np.float32)
    f = fusec.gpu_jit(lambda x, w: nn.softmax(x @ w) @ w.T)
    names = [k.name for k in f.lower(x, w).kernels]
    want = np.asarray(f(x, w))
    with fusec.profile() as p:
        for _ in range(3):
            got = f(x, w)
    np.testing.assert_array_equal(np.asarray(got), want)  # profiling changes no result
    assert [n for n, _ in p.kernels] == names * 3
    assert all(us > 0 for _, us in p.kernels)
    assert sorted(r[0] for r in p.rows) == sorted(names) and all(r[1] == 3 for r in p.rows)
    assert p.wall_ms > 0
    out = capsys.readouterr().out
    assert f"fusec.profile: {3 * len(names)} kernel runs" in out and all(n in out for n in names)
    # off again after the block: calls are not timed
    f(x, w).block_until_ready()
    assert len(p.kernels) == 3 * len(names)
