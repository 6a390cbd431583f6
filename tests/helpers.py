"""Helpers more than one test module uses (tests/ is on sys.path under pytest's default import
mode, so test modules import this as ``helpers``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import pytest

import fusec
from fusec.runtime import get_runtime

# Tests of what only a wgpu device does (its kernels' bits, the lowering's disk cache): with
# FUSEC_BACKEND=cpu the interpreter runs the traced program, lowers nothing and caches nothing.
requires_wgpu = pytest.mark.skipif(
    fusec.default_device().is_cpu_fallback,
    reason="tests the lowered program on a wgpu device (FUSEC_BACKEND=cpu runs the interpreter "
           "on the traced program)")


REPO = Path(__file__).resolve().parent.parent


def pythonpath(*first: str) -> str:
    """PYTHONPATH for a child process: the repository (then ``first``) ahead of the parent's
    own, which is kept (on the GPU machine wgpu is installed on it)."""
    rest = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    return os.pathsep.join([str(REPO), *first, *rest])


class Delta:
    """cache_info() change over a block."""

    def __enter__(self) -> Delta:
        self.start = fusec.cache_info()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.d = fusec.cache_info() - self.start

    def __getattr__(self, name: str) -> int:
        return getattr(self.__dict__["d"], name)


def spy_sizes(monkeypatch: pytest.MonkeyPatch, method: str, size: Callable[..., int],
              why: str) -> list[int]:
    """The size (``size`` of its arguments) of every call of the runtime's ``method`` while the
    test runs; skips, saying ``why``, without a wgpu adapter."""
    rt = get_runtime()
    if rt is None:
        pytest.skip(why)
    seen: list[int] = []
    real = getattr(rt, method)

    def counting(*args: Any) -> Any:
        seen.append(size(*args))
        return real(*args)

    monkeypatch.setattr(rt, method, counting)
    return seen


@contextmanager
def forced_target(name: str) -> Iterator[None]:
    """Code generation for target ``name`` ("gpu" or "cpu") whatever the adapter, reset after."""
    fusec.config.set("target", name)
    try:
        yield
    finally:
        fusec.config.set("target", None)


def subgroup_level(monkeypatch: pytest.MonkeyPatch, level: int,
                   need: Optional[int] = None) -> None:
    """Lower as if the device's subgroup operations were ``level`` (Runtime.subgroups: 0 none, 1
    the builtins, 2 those and subgroupBarrier(), 3 those with subgroups of at most 32 lanes),
    failing where the device has fewer than ``need`` (default: ``level``): a case that cannot
    run here must not pass by testing nothing."""
    rt = get_runtime()
    assert rt is not None
    if rt.subgroups < (level if need is None else need):
        pytest.fail(f"{rt.info.adapter} lacks subgroup operations: this case cannot run here")
    from fusec.runtime import Runtime

    monkeypatch.setattr(Runtime, "subgroups", property(lambda self: level))


def in_threads(worker: Callable[[int], None], n: int) -> None:
    """Run ``worker(t)`` for t in 0 .. n-1, each in a thread of its own, and fail with what any
    of them raised."""
    import threading

    errors: list[BaseException] = []

    def run(t: int) -> None:
        try:
            worker(t)
        except BaseException as exc:  # noqa: BLE001 - reported by the calling thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
