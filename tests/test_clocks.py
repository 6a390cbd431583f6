"""fusec.hold_gpu_clocks: a CUDA primary context retained on each device through libcuda (the
clocks it holds are measured on the GPU machine: bench/gpu_clocks.py). Here: what it does with
no NVIDIA driver, and its calls against a stand-in libcuda."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

import fusec
from fusec import clocks


class FakeCuda:
    """libcuda's four calls: ``devices`` devices, the one at ``refuse`` refusing a context."""

    def __init__(self, devices: int, refuse: int = -1) -> None:
        self.devices, self.refuse, self.retained = devices, refuse, []

    def cuInit(self, flags: int) -> int:  # noqa: N802  (libcuda's names)
        return 0 if flags == 0 else 1

    def cuDeviceGetCount(self, count: Any) -> int:  # noqa: N802
        count._obj.value = self.devices
        return 0

    def cuDeviceGet(self, dev: Any, ordinal: int) -> int:  # noqa: N802
        dev._obj.value = 100 + ordinal
        return 0

    def cuDevicePrimaryCtxRetain(self, ctx: Any, dev: ctypes.c_int) -> int:  # noqa: N802
        if dev.value == 100 + self.refuse:
            return 101  # CUDA_ERROR_INVALID_DEVICE
        ctx._obj.value = 0x1000 + dev.value
        self.retained.append(dev.value)
        return 0


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clocks, "_held", [])


def test_no_driver_holds_nothing(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> Any:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(clocks.ctypes, "CDLL", missing)
    assert fusec.hold_gpu_clocks() == "nothing held: no NVIDIA driver (libcuda) on this machine"
    assert clocks.clocks_held() == 0


def test_every_device_held_once(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCuda(2)
    monkeypatch.setattr(clocks.ctypes, "CDLL", lambda name: fake)
    assert fusec.hold_gpu_clocks() == "held on 2 CUDA devices"
    assert fake.retained == [100, 101] and clocks.clocks_held() == 2
    assert fusec.hold_gpu_clocks() == "held on 2 CUDA devices"  # again: nothing more
    assert fake.retained == [100, 101]


@pytest.mark.parametrize("devices,refuse,want", [
    (0, -1, "nothing held: the NVIDIA driver found no CUDA device"),
    (3, 1, "held on 1 of 3 CUDA devices: device 1 refused a context (CUresult 101)"),
])
def test_what_was_not_held_is_said(fresh: None, monkeypatch: pytest.MonkeyPatch, devices: int,
                                   refuse: int, want: str) -> None:
    monkeypatch.setattr(clocks.ctypes, "CDLL", lambda name: FakeCuda(devices, refuse))
    assert fusec.hold_gpu_clocks() == want
    assert clocks.clocks_held() == (1 if refuse == 1 else 0)
