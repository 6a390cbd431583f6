"""Several devices in one process: fusec.devices(), placement (device_put, Array.to, a call on
its arguments' device, gpu_jit(device=...)), and data parallelism (shard, replicate, jitted calls
over Sharded arguments, all_reduce).

The tests that need two devices use devices 0 and 1. CI has two (lavapipe on Vulkan, llvmpipe on
OpenGL, both software); where there is only one they fail with a message saying so, unless
``FUSEC_SINGLE_DEVICE_OK=1`` says that such a machine is expected (then they are skipped).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers import pythonpath

import fusec
import fusec.numpy as fnp
from fusec import runtime
from fusec.runtime import runtime_for


def _usable() -> list[fusec.DeviceInfo]:
    """The devices that open for compute (wgpu may list an adapter that cannot: an NVIDIA
    OpenGL adapter beside the Vulkan one on the H100 machine)."""
    out = []
    for d in fusec.devices():
        try:
            runtime_for(d.index)
        except fusec.FusecError:
            continue
        out.append(d)
    return out


@pytest.fixture
def two() -> tuple[fusec.DeviceInfo, fusec.DeviceInfo]:
    devs = _usable()
    if len(devs) < 2:
        msg = (f"this test needs two devices; {len(devs)} of fusec.devices() open for compute "
               f"({', '.join(map(str, devs)) or 'none'}). On CI both lavapipe (Vulkan) and "
               "llvmpipe (OpenGL) are present (mesa-vulkan-drivers, libgl1-mesa-dri); set "
               "FUSEC_SINGLE_DEVICE_OK=1 where one device is expected")
        if os.environ.get("FUSEC_SINGLE_DEVICE_OK") == "1":
            pytest.skip(msg)
        pytest.fail(msg, pytrace=False)
    return devs[0], devs[1]


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Copies between devices and all_reduce in chunks of 4 KiB: several chunks per array."""
    monkeypatch.setattr(runtime, "COPY_CHUNK", 4096)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_devices_lists_every_adapter_with_its_facts() -> None:
    devs = fusec.devices()
    assert devs, "no device listed"
    for i, d in enumerate(devs):
        assert d.index == i
        assert isinstance(d.name, str) and d.name
        assert d.backend in ("Vulkan", "Metal", "D3D12", "OpenGL")
        assert d.adapter_type in ("DiscreteGPU", "IntegratedGPU", "VirtualGPU", "CPU", "Unknown")
        assert d.limits["max-storage-buffer-binding-size"] > 0
        assert isinstance(d.features, tuple)
        assert f"device {i}" in d.label()
    default = fusec.default_device()
    assert 0 <= default.index < len(devs)
    assert devs[default.index].name == default.name
    assert devs[default.index].backend == default.backend


def test_device_put_places_on_each_device(two: tuple[fusec.DeviceInfo, ...],
                                          rng: np.random.Generator) -> None:
    x = rng.standard_normal((3, 5)).astype(np.float32)
    for d in two:
        for spec in (d, d.index):
            a = fusec.device_put(x, spec)
            assert a.device.index == d.index
            assert _same_bits(np.asarray(a), x)
    # dtype by keyword, on device 1
    b = fusec.device_put(x, two[1].index, dtype=np.int32)
    assert b.dtype == np.int32 and b.device.index == two[1].index
    np.testing.assert_array_equal(np.asarray(b), x.astype(np.int32))
    # an Array to another device (a copy), or to its own (itself)
    a0 = fusec.device_put(x, two[0])
    assert fusec.device_put(a0) is a0 and fusec.device_put(a0, two[0]) is a0
    a1 = fusec.device_put(a0, two[1])
    assert a1.device.index == two[1].index and _same_bits(np.asarray(a1), x)
    # host data not uploaded yet: the default device's
    host = fusec.Array((2,), "float32", host=np.zeros(2, np.float32))
    assert host.device.index == fusec.default_device().index


def test_device_put_refuses_what_is_not_a_device() -> None:
    x = np.ones(3, np.float32)
    with pytest.raises(fusec.FusecError, match="dtype="):
        fusec.device_put(x, np.float32)  # the old positional dtype
    with pytest.raises(fusec.FusecError, match="dtype="):
        fusec.device_put(x, "float16")
    with pytest.raises(fusec.FusecError, match="DeviceInfo"):
        fusec.device_put(x, True)
    with pytest.raises(fusec.FusecError, match="DeviceInfo"):
        fusec.device_put(x, "cuda:0")
    n = len(fusec.devices())
    with pytest.raises(fusec.FusecError, match=f"device {n} is not one of fusec.devices"):
        fusec.device_put(x, n)
    with pytest.raises(fusec.FusecError, match="Array.to"):
        fusec.device_put(x).to(-1)


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool", "float16"])
@pytest.mark.parametrize("size", [1, 7, 1031, 5003])
def test_to_round_trips_exactly(two: tuple[fusec.DeviceInfo, ...], rng: np.random.Generator,
                                dtype: str, size: int, small_chunks: None) -> None:
    if dtype == "bool":
        x = rng.random(size) < 0.5
    elif dtype == "int32":
        x = rng.integers(-2**31, 2**31 - 1, size, dtype=np.int64).astype(np.int32)
    else:
        x = (rng.standard_normal(size) * 100).astype(dtype)
        specials = np.array([np.nan, np.inf, -np.inf, -0.0], dtype)[:size]
        x[:len(specials)] = specials
    d0, d1 = two
    src = fusec.device_put(x, d0)
    assert src._host is None  # (no host copy to take a shortcut through)
    there = src.to(d1)
    assert there.device.index == d1.index and there.shape == x.shape and there.dtype == x.dtype
    back = there.to(d0)
    assert back.device.index == d0.index
    assert _same_bits(np.asarray(there), x) and _same_bits(np.asarray(back), x)
    assert there.to(d1) is there


def test_copy_is_read_in_chunks(two: tuple[fusec.DeviceInfo, ...], rng: np.random.Generator,
                                small_chunks: None) -> None:
    x = rng.standard_normal(3 * 1024 + 5).astype(np.float32)  # four 4 KiB chunks, the last short
    src = -(-fusec.device_put(x, two[0]))
    before = fusec.cache_info().readbacks
    out = src.to(two[1])
    assert fusec.cache_info().readbacks - before == 4
    assert _same_bits(np.asarray(out), x)


def test_a_call_runs_on_the_device_of_its_arrays(two: tuple[fusec.DeviceInfo, ...],
                                                 rng: np.random.Generator) -> None:
    x = rng.standard_normal((9, 13)).astype(np.float32)
    w = rng.standard_normal((13, 5)).astype(np.float32)
    f = fusec.gpu_jit(lambda a, b: fnp.tanh(a @ b) + 1.0)
    want = np.tanh(x.astype(np.float64) @ w) + 1.0
    for d in two:
        xd = fusec.device_put(x, d)
        out = f(xd, w)  # w (numpy) is uploaded to xd's device
        assert out.device.index == d.index
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)
        out2 = f(xd, fusec.device_put(w, d))  # cached call with both on d
        assert out2.device.index == d.index
        np.testing.assert_allclose(np.asarray(out2), want, rtol=1e-5, atol=1e-5)
    assert runtime_for(two[1].index).pipelines, "device 1 compiled nothing"
    # one executable per device
    assert len({k[3] for k in f._cache}) == 2
    # eager operations run on their inputs' device
    x1 = fusec.device_put(x, two[1])
    s = (x1 * 2.0).sum(axis=0)
    assert s.device.index == two[1].index
    np.testing.assert_allclose(np.asarray(s), 2 * x.sum(0), rtol=1e-5, atol=1e-4)
    assert fnp.exp(x1).device.index == two[1].index
    # no device arrays: the default device
    assert f(x, w).device.index == fusec.default_device().index
    # donation on device 1: the output takes the donated buffer there
    g = fusec.gpu_jit(lambda a: a * 2.0 + 1.0, donate_argnums=0)
    y1 = g(x1)
    assert y1.device.index == two[1].index and x1.is_deleted
    np.testing.assert_allclose(np.asarray(y1), 2 * x + 1, rtol=1e-6)


def test_lower_and_compile_for_a_device(two: tuple[fusec.DeviceInfo, ...],
                                        rng: np.random.Generator) -> None:
    x = rng.standard_normal(6).astype(np.float32)
    f = fusec.gpu_jit(lambda a: a * a)
    x1 = fusec.device_put(x, two[1])
    compiled = f.lower(x1).compile()
    assert compiled.rt is runtime_for(two[1].index)
    out = compiled(x1)
    assert out.device.index == two[1].index
    np.testing.assert_allclose(np.asarray(out), x * x, rtol=1e-6)
    assert compiled(x).device.index == two[1].index  # host data goes to its device
    with pytest.raises(fusec.FusecError, match="'a' is on device 0"):
        compiled(fusec.device_put(x, two[0]))
    assert f.warmup(x1).rt is compiled.rt


def test_devices_of_one_kind_share_the_lowering(two: tuple[fusec.DeviceInfo, ...],
                                                rng: np.random.Generator,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Two GPUs of one model trace and lower once; each compiles its own pipelines (here the two
    software devices are made to look alike)."""
    monkeypatch.setattr(runtime.Runtime, "lowering_key", property(lambda self: ("alike",)))
    x = rng.standard_normal((5, 3)).astype(np.float32)
    f = fusec.gpu_jit(lambda a, b: fnp.exp(a) * b - a.sum(0))
    before = fusec.cache_info()
    outs = [f(fusec.device_put(x, d), 2.0) for d in two]
    delta = fusec.cache_info() - before
    assert delta.traces == 1 and delta.lowerings == 1 and delta.misses == 2
    for d, out in zip(two, outs):
        assert out.device.index == d.index
        np.testing.assert_allclose(np.asarray(out), np.exp(x) * 2 - x.sum(0), rtol=1e-5,
                                   atol=1e-5)


def test_mixing_devices_is_a_clear_error(two: tuple[fusec.DeviceInfo, ...]) -> None:
    a = fusec.device_put(np.ones(4, np.float32), two[0])
    b = fusec.device_put(np.ones(4, np.float32), two[1])

    @fusec.gpu_jit
    def add(x, y):
        return x + y

    with pytest.raises(fusec.FusecError) as e:
        add(a, b)
    msg = str(e.value)
    assert "'x' on device 0" in msg and "'y' on device 1" in msg and ".to(device)" in msg
    with pytest.raises(fusec.FusecError, match="different devices"):
        a + b  # eager operations too
    np.testing.assert_array_equal(np.asarray(add(a, b.to(two[0]))), np.full(4, 2, np.float32))


def test_gpu_jit_device_pins_a_function(two: tuple[fusec.DeviceInfo, ...],
                                        rng: np.random.Generator) -> None:
    x = rng.standard_normal(11).astype(np.float32)
    for spec in (two[1], two[1].index):
        f = fusec.gpu_jit(lambda v: v * 3.0, device=spec)
        out = f(x)
        assert out.device.index == two[1].index
        np.testing.assert_allclose(np.asarray(out), 3 * x, rtol=1e-6)
        assert f(fusec.device_put(x, two[1])).device.index == two[1].index
        with pytest.raises(fusec.FusecError, match=r"gpu_jit\(device=...\).*'v' is on device 0"):
            f(fusec.device_put(x, two[0]))
        with pytest.raises(fusec.FusecError, match="pinned"):
            f(fusec.shard(x, two))
    with pytest.raises(fusec.FusecError, match="gpu_jit"):
        fusec.gpu_jit(lambda v: v, device="gpu")
    g = fusec.gpu_jit(lambda v: v, device=len(fusec.devices()))
    with pytest.raises(fusec.FusecError, match="not one of fusec.devices"):
        g(x)


def test_threads_drive_devices_independently(two: tuple[fusec.DeviceInfo, ...],
                                             rng: np.random.Generator) -> None:
    """One thread per device, tracing, compiling and running at the same time."""
    x = rng.standard_normal(37).astype(np.float32)
    barrier = threading.Barrier(2)
    results: dict[int, list[tuple[int, np.ndarray]]] = {}
    errors: list[BaseException] = []

    def work(d: fusec.DeviceInfo) -> None:
        try:
            xd = fusec.device_put(x, d)
            barrier.wait()
            out = []
            for k in range(4):  # a new function each time: each call traces
                f = fusec.gpu_jit(lambda v, k=k: fnp.sin(v) * k + v.sum())
                r = f(xd)
                out.append((r.device.index, np.asarray(r)))
            results[d.index] = out
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(d,)) for d in two]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for d in two:
        for k, (where, got) in enumerate(results[d.index]):
            assert where == d.index
            np.testing.assert_allclose(got, np.sin(x) * k + x.sum(), rtol=1e-5, atol=1e-5)


def test_shard_and_replicate_round_trip(two: tuple[fusec.DeviceInfo, ...],
                                        rng: np.random.Generator) -> None:
    x = rng.standard_normal((7, 5)).astype(np.float32)
    s = fusec.shard(x, two)
    assert [sh.shape for sh in s.shards] == [(4, 5), (3, 5)]  # as numpy.array_split
    assert [sh.device.index for sh in s.shards] == [d.index for d in two]
    assert s.shape == (7, 5) and s.dtype == np.float32 and s.axis == 0 and len(s) == 7
    assert [d.index for d in s.devices] == [d.index for d in two]
    assert _same_bits(np.asarray(s), x)
    s1 = fusec.shard(fusec.device_put(x, two[1]), [d.index for d in two], axis=-1)
    assert [sh.shape for sh in s1.shards] == [(7, 3), (7, 2)] and s1.axis == 1
    assert _same_bits(np.asarray(s1), x)
    r = fusec.replicate(x, two)
    assert r.axis is None and r.shape == x.shape
    assert all(_same_bits(np.asarray(sh), x) for sh in r.shards)
    assert _same_bits(np.asarray(r), x)
    a1 = fusec.device_put(x, two[1])
    r1 = fusec.replicate(a1, two)
    assert r1.shards[1] is a1 and r1.shards[0].device.index == two[0].index
    assert _same_bits(np.asarray(r1.shards[0]), x)
    # a leaf of pytrees
    assert fusec.tree_util.tree_leaves({"a": s, "b": [r]}) == [s, r]
    with pytest.raises(fusec.FusecError, match="0-d"):
        fusec.shard(np.float32(1), two)
    with pytest.raises(fusec.FusecError, match="fewer than the 2 devices"):
        fusec.shard(np.ones((1, 3), np.float32), two)
    with pytest.raises(fusec.FusecError, match="appears twice"):
        fusec.shard(x, [two[0], two[0]])
    with pytest.raises(fusec.FusecError, match="axis"):
        fusec.shard(x, two, axis=2)
    with pytest.raises(fusec.FusecError, match="list of devices"):
        fusec.shard(x, two[0])


def test_jit_over_sharded_arguments(two: tuple[fusec.DeviceInfo, ...],
                                    rng: np.random.Generator) -> None:
    x = rng.standard_normal((11, 6)).astype(np.float32)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)

    @fusec.gpu_jit
    def f(x, p):
        h = fnp.tanh(x @ p["w"] + p["b"])
        return {"h": h, "total": h.sum()}

    params = {"w": fusec.replicate(w, two), "b": b}  # a plain array counts as replicated
    out = f(fusec.shard(x, two), params)
    assert isinstance(out["h"], fusec.Sharded) and out["h"].axis == 0
    assert [sh.device.index for sh in out["h"].shards] == [d.index for d in two]
    single = f(x, {"w": w, "b": b})
    want = np.tanh(x.astype(np.float64) @ w + b)
    np.testing.assert_allclose(np.asarray(out["h"]), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out["h"]), np.asarray(single["h"]), rtol=1e-6,
                               atol=1e-6)
    # per-device scalars: one per device, stacked
    totals = np.asarray(out["total"])
    assert totals.shape == (2,)
    np.testing.assert_allclose(totals, [want[:6].sum(), want[6:].sum()], rtol=1e-4, atol=1e-4)
    # only replicated arguments: replicated results
    g = fusec.gpu_jit(lambda w: w * 2.0)
    rep = g(params["w"])
    assert rep.axis is None and all(_same_bits(np.asarray(s), 2 * w) for s in rep.shards)
    # Sharded arguments over other devices: a clear error
    with pytest.raises(fusec.FusecError, match="different devices"):
        f(fusec.shard(x, two), {"w": fusec.replicate(w, [two[1], two[0]]), "b": b})
    with pytest.raises(fusec.TraceError, match="Sharded"):
        f.lower(fusec.shard(x, two), params)


def test_grad_of_a_sharded_step_equals_the_single_device_gradient(
        two: tuple[fusec.DeviceInfo, ...], rng: np.random.Generator) -> None:
    x = rng.standard_normal((8, 5)).astype(np.float32)
    y = rng.standard_normal((8, 3)).astype(np.float32)
    params = {"w": rng.standard_normal((5, 3)).astype(np.float32) / 2,
              "b": rng.standard_normal(3).astype(np.float32)}

    def loss(p, x, y):
        return fnp.mean((fnp.tanh(x @ p["w"] + p["b"]) - y) ** 2)

    grad_step = fusec.gpu_jit(fusec.grad(loss))
    sgd = fusec.gpu_jit(lambda p, g: {k: p[k] - 0.1 * g[k] for k in p})
    full = grad_step(params, x, y)  # the whole batch on one device
    rp = {k: fusec.replicate(v, two) for k, v in params.items()}
    per_device = grad_step(rp, fusec.shard(x, two), fusec.shard(y, two))
    g = fusec.all_reduce(per_device, op="mean")
    for k in params:
        assert g[k].axis is None
        for sh in g[k].shards:
            np.testing.assert_allclose(np.asarray(sh), np.asarray(full[k]), rtol=2e-6, atol=2e-7)
    new = sgd(rp, g)
    for k in params:
        want = params[k] - np.float32(0.1) * np.asarray(full[k])
        assert new[k].axis is None
        for sh in new[k].shards:
            np.testing.assert_allclose(np.asarray(sh), want, rtol=1e-6, atol=1e-6)


def test_all_reduce_sum_and_mean(two: tuple[fusec.DeviceInfo, ...], rng: np.random.Generator,
                                 small_chunks: None) -> None:
    a = rng.standard_normal((2, 1500)).astype(np.float32)  # 6000 bytes per shard: two chunks
    a[0, :4] = [np.nan, np.inf, 1.0, 3e38]
    a[1, :4] = [1.0, 1.0, -np.inf, 3e38]  # the sum overflows, the mean does not
    i = rng.integers(-2**31, 2**31 - 1, (2, 13), dtype=np.int64).astype(np.int32)
    h = rng.standard_normal((2, 7)).astype(np.float16)
    tree = {"a": fusec.shard(a, two), "i": fusec.shard(i, two), "h": fusec.shard(h, two),
            "s": fusec.shard(np.float32([2.5, -1.0]), two)}
    tree["s"] = fusec.gpu_jit(lambda v: v.sum())(tree["s"])  # per-device 0-d values
    with np.errstate(invalid="ignore", over="ignore"):
        out = fusec.all_reduce(tree, "sum")
        for k, want in (("a", a[:1] + a[1:]), ("i", i[:1] + i[1:]), ("h", h[:1] + h[1:]),
                        ("s", np.float32(1.5))):
            assert out[k].axis is None and out[k].devices == tree[k].devices
            for sh in out[k].shards:
                got = np.asarray(sh)
                assert got.dtype == want.dtype and got.shape == np.shape(want), k
                np.testing.assert_array_equal(got, want, err_msg=k)  # (NaN where numpy's)
        mean = fusec.all_reduce({"a": tree["a"], "h": tree["h"]}, "mean")
        for k, x in (("a", a), ("h", h)):
            want = x.astype(np.float64).mean(0, keepdims=True).astype(x.dtype)  # rounded once
            for sh in mean[k].shards:
                got = np.asarray(sh)
                assert got.dtype == want.dtype and got.shape == want.shape, k
                np.testing.assert_array_equal(got, want, err_msg=k)
    with pytest.raises(fusec.FusecError, match="floating-point"):
        fusec.all_reduce(tree["i"], "mean")
    with pytest.raises(fusec.FusecError, match="op must be"):
        fusec.all_reduce(tree["a"], "max")
    with pytest.raises(fusec.FusecError, match="not a fusec.Sharded"):
        fusec.all_reduce({"x": np.ones(3)})
    with pytest.raises(fusec.FusecError, match="shards of tree differ"):
        fusec.all_reduce(fusec.shard(np.ones(5, np.float32), two))
    with pytest.raises(fusec.FusecError, match="bool"):
        fusec.all_reduce(fusec.shard(np.ones(4, bool), two))


def test_all_reduce_on_one_device_is_the_value(rng: np.random.Generator) -> None:
    d = fusec.default_device()
    x = rng.standard_normal((3, 4)).astype(np.float32)
    s = fusec.shard(x, [d])
    out = fusec.all_reduce(s, "mean")
    assert out.shards[0] is s.shards[0] and out.axis is None
    assert math.isclose(float(np.asarray(out).sum()), float(x.sum()), rel_tol=1e-6, abs_tol=1e-6)


def test_an_adapter_that_cannot_compute_is_a_clear_error() -> None:
    """wgpu may list an adapter whose device cannot run compute shaders (the H100 machine's
    NVIDIA OpenGL adapter: "The selected version doesn't support ... COMPUTE_SHADER"): opening
    it is a FusecError naming the adapter, not a crash inside wgpu."""

    class NoCompute:
        info = {"device": "Some GPU", "backend_type": "OpenGL", "adapter_type": "Unknown"}
        features: set[str] = set()

        def request_device_sync(self, **kw: object) -> None:
            raise RuntimeError("Validation Error\n\nThe selected version doesn't support "
                               "Features(COMPUTE_SHADER)")

    with pytest.raises(fusec.FusecError, match=r"Some GPU.*cannot be used for compute.*"
                                               r"COMPUTE_SHADER.*fusec.devices\(\)"):
        runtime.Runtime(NoCompute())


EXIT_SCRIPT = '''
import atexit
import json

import numpy as np

pollers = {}


def report():
    # registered before fusec opens a device, so it runs after fusec's exit functions
    print(json.dumps({"alive": {str(i): t.is_alive() for i, t in pollers.items()}}), flush=True)


atexit.register(report)

import fusec
from fusec.runtime import runtime_for

for d in fusec.devices():
    try:
        rt = runtime_for(d.index)
    except fusec.FusecError:
        continue
    pollers[d.index] = rt.device._poller
    x = fusec.device_put(np.arange(5, dtype=np.float32), d)
    assert np.asarray(fusec.gpu_jit(lambda a: a * 2.0)(x)).tolist() == [0, 2, 4, 6, 8]
'''


def test_device_threads_end_before_the_interpreter_finalises(tmp_path: Path) -> None:
    """wgpu-py's per-device poller is a daemon thread. Left running into finalisation, it can
    be frozen holding its event's lock, and the device's ``__del__`` then waits on that lock for
    ever: a process that finished its work and never exits. fusec's exit function stops and
    joins it while threads still run; this checks, in a fresh process, that every opened
    device's poller has ended by the time later exit functions run, and that the process exits."""
    script = tmp_path / "exit_script.py"
    script.write_text(EXIT_SCRIPT)
    env = dict(os.environ, FUSEC_BACKEND="gpu", FUSEC_CACHE_DIR="off")
    env["PYTHONPATH"] = pythonpath()
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    alive = json.loads(p.stdout.strip().splitlines()[-1])["alive"]
    assert alive, "no device opened"
    assert not any(alive.values()), alive
