"""Kernels are compiled as trusted shader modules (no bounds checks or loop bounds added by wgpu):
fusec's own index tests must keep every access in range. With FUSEC_SHADER_CHECKS=1 wgpu's checks
come back, clamping any index that strays. So every kernel template, at sizes that leave partial
tiles, workgroups and vec4s, must give the same results both ways, and numpy's: an index that
strays reads a clamped element in one build and whatever lies beyond in the other."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import fusec
from fusec import codegen, nn


@pytest.fixture
def checks() -> Iterator[Callable[[bool], None]]:
    def set_checks(on: bool) -> None:
        fusec.config.set("shader_checks", 1 if on else 0)

    try:
        yield set_checks
    finally:
        fusec.config.set("shader_checks", None)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# (name, function, input shapes, numpy reference in float64, codegen settings, relative tolerance)
CASES: list[tuple[str, Callable[..., Any], list[tuple[int, ...]], Callable[..., Any],
                  dict[str, Any], float]] = [
    ("elementwise_vec4", lambda x, y: nn.gelu(x * y + x), [(1 << 18,), (1 << 18,)],
     lambda x, y: 0.5 * (x * y + x) * (1 + np.tanh(np.sqrt(2 / np.pi)
                                                  * ((x * y + x) + 0.044715 * (x * y + x) ** 3))),
     {}, 1e-5),
    ("elementwise_odd", lambda x, y: x * y - y, [(262147,), (1, 262147)], lambda x, y: x * y - y,
     {}, 1e-6),
    ("row_cached", lambda x: nn.softmax(x), [(5, 8193)], _softmax, {}, 1e-5),
    ("rows_shared", lambda x: nn.softmax(x), [(37, 300)], _softmax, {}, 1e-5),
    ("row_long", lambda x: x - x.max(axis=-1, keepdims=True), [(3, 20000)],
     lambda x: x - x.max(-1, keepdims=True), {}, 1e-6),
    ("columns", lambda x: x.sum(axis=0), [(70001, 5)], lambda x: x.sum(0), {}, 1e-4),
    ("columns_few", lambda x: x.sum(axis=0), [(70001, 2)], lambda x: x.sum(0), {}, 1e-4),
    ("full_sum", lambda x: x.sum(), [(1000003,)], lambda x: x.sum(), {}, 1e-4),
    ("matmul_16x16", lambda a, b: a @ b, [(20, 70), (70, 30)], lambda a, b: a @ b, {}, 1e-4),
    ("matmul_rb_staged", lambda a, b, c: nn.gelu(a @ b + c), [(2, 131, 45), (45, 257), (257,)],
     lambda a, b, c: 0.5 * (a @ b + c) * (1 + np.tanh(np.sqrt(2 / np.pi) * (
         (a @ b + c) + 0.044715 * (a @ b + c) ** 3))),
     {"MATMUL_BLOCK": (128, 128, 16, 8, 8), "MATMUL_EPILOGUE": "staged"}, 1e-4),
    ("matmul_rb_direct", lambda a, b, c: nn.relu(a @ b + c), [(131, 45), (45, 97), (97,)],
     lambda a, b, c: np.maximum(a @ b + c, 0),
     {"MATMUL_BLOCK": (64, 64, 16, 4, 4), "MATMUL_EPILOGUE": "direct"}, 1e-4),
    ("matmul_few_rows", lambda a, b: a @ b, [(5, 300), (300, 257)], lambda a, b: a @ b, {}, 1e-4),
    ("matmul_few_cols", lambda a, b: a @ b, [(1031, 300), (300, 9)], lambda a, b: a @ b, {}, 1e-4),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.usefixtures("gpu_target")
def test_trusted_and_checked_kernels_agree(case: Any, checks: Callable[[bool], None],
                                           rng: np.random.Generator,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _, fn, shapes, ref, settings, rtol = case
    for name, value in settings.items():
        monkeypatch.setattr(codegen, name, value)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    got = {}
    for on in (False, True):
        checks(on)
        got[on] = np.asarray(fusec.gpu_jit(fn)(*args))  # a new function: compiled afresh
    want = ref(*[a.astype(np.float64) for a in args])
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got[False], want, rtol=rtol, atol=rtol * scale)
    np.testing.assert_allclose(got[False], got[True], rtol=1e-6, atol=1e-6 * scale)


def test_kernels_are_compiled_trusted_unless_checks_are_asked_for(
        checks: Callable[[bool], None], monkeypatch: pytest.MonkeyPatch,
        rng: np.random.Generator) -> None:
    """The default build skips wgpu's runtime checks; FUSEC_SHADER_CHECKS=1 keeps them. Each
    compiles its own pipeline (a cached one of the other kind is not reused)."""
    from wgpu.backends.wgpu_native import _api

    calls = {"trusted": 0, "checked": 0}
    trusted = _api.libf.wgpuDeviceCreateShaderModuleTrusted
    checked = _api.GPUDevice.create_shader_module

    def spy_trusted(*a: Any) -> Any:
        calls["trusted"] += 1
        return trusted(*a)

    def spy_checked(self: Any, **kw: Any) -> Any:
        calls["checked"] += 1
        return checked(self, **kw)

    monkeypatch.setattr(_api.libf, "wgpuDeviceCreateShaderModuleTrusted", spy_trusted)
    monkeypatch.setattr(_api.GPUDevice, "create_shader_module", spy_checked)
    x = rng.standard_normal(1001).astype(np.float32)
    offset = float(rng.integers(1, 1 << 20))  # a constant no other test compiles
    # trusted, then checked, then trusted again (its pipeline compiled once, then reused)
    for on, want in ((False, (1, 0)), (True, (1, 1)), (False, (1, 1))):
        checks(on)
        y = np.asarray(fusec.gpu_jit(lambda v: v * 3.0 + offset)(x))
        np.testing.assert_allclose(y, x * 3.0 + offset, rtol=1e-6)
        assert (calls["trusted"], calls["checked"]) == want, (on, calls)
