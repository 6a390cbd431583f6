"""fusec on Dask (fusec.dask): worker processes pinned to adapters by the plugin or the preload,
jitted reductions and map_blocks over Dask arrays equal to numpy, pipelines compiled once per
worker process, clear errors for bad adapter indices.

One LocalCluster (2 worker processes, one thread each) is shared by the module: starting one
costs seconds. Its workers get ``FUSEC_BACKEND=auto`` in their environment, so only the plugin's
``backend="gpu"`` and adapter pinning put them on wgpu (auto alone would pick the numpy
interpreter on these software adapters); the tests check that they did.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import dask.array as da
import numpy as np
import pytest
from distributed import Client, LocalCluster
from helpers import pythonpath

import fusec
import fusec.dask
import fusec.numpy as fnp
from fusec.errors import FusecError

TESTS = Path(__file__).resolve().parent

# odd block sizes: 4 x 4 = 16 blocks of 4 distinct shapes (each a compile per worker)
ROW_CHUNKS = (37, 37, 37, 29)
COL_CHUNKS = (13, 13, 13, 11)


def _fresh(rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((sum(ROW_CHUNKS), sum(COL_CHUNKS))).astype(np.float32)


@fusec.gpu_jit
def moments(b: Any) -> Any:
    """Per block: [sum x, sum x^2, sum exp(x) * x] (one small array: summed across blocks)."""
    return fnp.stack([fnp.sum(b), fnp.sum(b * b), fnp.sum(fnp.exp(b) * b)])


def block_max(b: Any) -> Any:  # a plain function: jitted on the workers
    return fnp.max(fnp.abs(b) * 3.0 - 1.0)


def _moments_reference(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return np.array([x64.sum(), (x64 * x64).sum(), (np.exp(x64) * x64).sum()])


def _check_moments(got: np.ndarray, x: np.ndarray) -> None:
    want = _moments_reference(x)
    # float32 sums of ~6000 terms per block (pairwise/tree-reduced on the GPU, then 16 block
    # partials): relative error ~1e-6 of the sum of magnitudes; sum x can cancel, so scale by it
    mags = np.array([np.abs(x).sum(), (x.astype(np.float64) ** 2).sum(),
                     np.abs(np.exp(x.astype(np.float64)) * x).sum()])
    assert got.shape == (3,) and got.dtype == np.float32
    np.testing.assert_array_less(np.abs(got - want), 2e-5 * mags + 1e-6)


def _names(client: Client) -> dict[str, Any]:
    return {addr: w["name"] for addr, w in client.scheduler_info()["workers"].items()}


def _assert_pinned(client: Client, expected: dict[Any, int]) -> dict[str, dict[str, Any]]:
    """Every worker runs fusec on wgpu (not the numpy interpreter) on the adapter its name maps
    to; returns worker_info by worker address."""
    infos: dict[str, dict[str, Any]] = client.run(fusec.dask.worker_info)
    names = _names(client)
    devs = fusec.devices()
    assert len(infos) == len(expected)
    for addr, info in infos.items():
        want = expected[str(names[addr])]
        assert info["backend"] != "cpu", info
        assert info["pinned"] == want and info["index"] == want, (names[addr], info)
        assert info["backend"] == devs[want].backend and info["adapter"] == devs[want].adapter
        assert info["pid"] != os.getpid()
    return infos


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    # FUSEC_BACKEND=auto: the workers must owe the wgpu device to the plugin, not to this
    # process's environment (the test session sets FUSEC_BACKEND=gpu)
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address=None, scheduler_port=0, silence_logs=logging.ERROR,
                           env={"FUSEC_BACKEND": "auto", "FUSEC_VERIFY": "1",
                                "FUSEC_CACHE_DIR": "off"})
    c = Client(cluster)
    try:
        pinned = fusec.dask.setup(c, adapters=[0, 1], backend="gpu")
        names = _names(c)
        # LocalCluster names its workers 0 and 1: round robin by name puts worker i on adapter i
        assert {names[a]: i for a, i in pinned.items()} == {0: 0, 1: 1}
        yield c
    finally:
        c.close()
        cluster.close()


def test_reduction_on_two_workers_pinned_to_two_adapters(client: Client,
                                                         rng: np.random.Generator) -> None:
    x = _fresh(rng)
    dx = da.from_array(x, chunks=(ROW_CHUNKS, COL_CHUNKS))
    assert dx.numblocks == (4, 4)
    before = client.run(fusec.dask.worker_info)
    got = fusec.dask.reduction(moments, dx).compute()
    _check_moments(got, x)
    x[rng.integers(0, x.shape[0]), rng.integers(0, x.shape[1])] = 7.5  # the max, in one block
    top = fusec.dask.reduction(block_max, da.from_array(x, chunks=(ROW_CHUNKS, COL_CHUNKS)),
                               combine="max").compute()
    assert top.shape == () and top == np.float32(7.5 * 3.0 - 1.0)
    low = fusec.dask.reduction(block_max, da.from_array(x, chunks=(ROW_CHUNKS, COL_CHUNKS)),
                               combine="min").compute()
    want_low = min(float(np.max(np.abs(x[r0:r0 + r, c0:c0 + c]) * 3.0 - 1.0))
                   for r0, r in zip(np.cumsum((0,) + ROW_CHUNKS[:-1]), ROW_CHUNKS)
                   for c0, c in zip(np.cumsum((0,) + COL_CHUNKS[:-1]), COL_CHUNKS))
    assert low == pytest.approx(want_low, rel=1e-6)
    infos = _assert_pinned(client, {"0": 0, "1": 1})
    # both workers computed blocks (each on its own adapter: Vulkan and OpenGL)
    for addr, info in infos.items():
        calls = info["cache"]["hits"] + info["cache"]["misses"]
        assert calls > before[addr]["cache"]["hits"] + before[addr]["cache"]["misses"], info
    assert {i["backend"] for i in infos.values()} == {fusec.devices()[0].backend,
                                                     fusec.devices()[1].backend}


def test_map_blocks_compiles_once_per_worker(client: Client, rng: np.random.Generator,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = ((31, 31, 31, 7), (23, 23))  # 8 blocks of 4 shapes

    @fusec.gpu_jit(static_argnames=("power",))
    def squash(b: Any, power: int) -> Any:
        return fnp.tanh(b) ** power * 2.0 + 1.0

    offset = float(rng.uniform(0.5, 1.5))
    shifted = lambda a, b: a * b - offset  # noqa: E731  (a closure: pickled by value)

    def no_device() -> None:
        raise AssertionError("the client opened fusec's device")

    def run(x: np.ndarray, y: np.ndarray, workers: Any = None) -> tuple[np.ndarray, np.ndarray]:
        dx, dy = (da.from_array(v, chunks=chunks) for v in (x, y))
        with monkeypatch.context() as m:  # building the graph (a trace for the dtype) in the
            for mod in (fusec.runtime, fusec.jit):  # client needs no device there
                m.setattr(mod, "get_runtime", no_device)
            out1 = fusec.dask.map_blocks(squash, dx, power=3)
            out2 = fusec.dask.map_blocks(shifted, dx, dy, dtype=np.float32)
            red = fusec.dask.reduction(moments, dx)
        assert red.shape == (3,) and red.dtype == np.float32
        assert out1.dtype == np.float32 and out1.chunks == dx.chunks
        r1, r2 = client.compute([out1, out2], workers=workers, sync=True)
        return r1, r2

    def check(x: np.ndarray, y: np.ndarray, r1: np.ndarray, r2: np.ndarray) -> None:
        np.testing.assert_allclose(r1, np.tanh(x.astype(np.float64)) ** 3 * 2 + 1,
                                   rtol=2e-6, atol=2e-6)
        np.testing.assert_allclose(r2, x.astype(np.float64) * y - offset, rtol=1e-6, atol=1e-6)

    shape = (sum(chunks[0]), sum(chunks[1]))
    # first: every worker computes every block (every signature), one worker at a time
    for addr in client.scheduler_info()["workers"]:
        x, y = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
        check(x, y, *run(x, y, workers=[addr]))
    before = client.run(fusec.dask.worker_info)
    # then: new map_blocks over the same functions (pickled again: the same hash), fresh data,
    # spread over both workers: nothing is traced or compiled
    x, y = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    x[0, 0], x[-1, -1] = np.nan, np.inf
    check(x, y, *run(x, y))
    after = _assert_pinned(client, {"0": 0, "1": 1})
    for addr, info in after.items():
        old = before[addr]
        assert info["functions"] == old["functions"]
        for k in ("traces", "lowerings", "pipelines_compiled", "misses"):
            assert info["cache"][k] == old["cache"][k], (k, info["cache"], old["cache"])
    assert sum(i["cache"]["hits"] - before[a]["cache"]["hits"] for a, i in after.items()) >= 16


def test_bad_adapter_indices(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    # refused where the plugin is made
    for bad in ([-1], [0, 1.5], [True], []):
        with pytest.raises(FusecError, match="adapter"):
            fusec.dask.FusecPlugin(bad)
    with pytest.raises(FusecError, match="list of adapter indices"):
        fusec.dask.FusecPlugin("0,1")  # type: ignore[arg-type]
    with pytest.raises(FusecError, match="backend='cuda'"):
        fusec.dask.FusecPlugin([0], backend="cuda")
    with pytest.raises(FusecError, match="mapping"):
        fusec.dask.FusecPlugin(mapping={0: -2})
    try:
        # refused by the workers: an index they have no adapter for...
        with pytest.raises(FusecError, match=r"adapter index 7 is not an index of "
                           r"fusec.devices\(\) on this worker, which has 2 adapter"):
            fusec.dask.setup(client, adapters=[7], backend="gpu")
        # ...and another adapter than the one their runtime already runs on
        client.run(fusec.dask.worker_info)  # (creates the runtimes if nothing has)
        with pytest.raises(FusecError, match=r"should use adapter (1|0), but fusec's "
                           r"runtime already runs here on adapter (?!\1)[01] \(llvmpipe"):
            fusec.dask.setup(client, adapters=[1, 0], backend="gpu")
        with pytest.raises(FusecError, match="not in mapping"):
            fusec.dask.setup(client, mapping={"someone-else": 0}, backend="gpu")
    finally:
        # the same assignment again is fine: the runtimes already run where it puts them
        assert set(fusec.dask.setup(client, mapping={0: 0, 1: 1}, backend="gpu").values()) \
            == {0, 1}
    _assert_pinned(client, {"0": 0, "1": 1})

    # the preload: FUSEC_DASK_ADAPTERS needs indices and a worker name with a number in it
    monkeypatch.setenv("FUSEC_DASK_ADAPTERS", "0,x")
    with pytest.raises(FusecError, match="comma-separated adapter indices"):
        fusec.dask.dask_setup(SimpleNamespace(name="0"))
    monkeypatch.setenv("FUSEC_DASK_ADAPTERS", "0,1")
    with pytest.raises(FusecError, match="--name <integer>"):
        fusec.dask.dask_setup(SimpleNamespace(name="tcp://127.0.0.1:40000"))
    monkeypatch.setenv("FUSEC_DASK_ADAPTERS", "5")
    with pytest.raises(FusecError, match="adapter index 5"):
        fusec.dask.dask_setup(SimpleNamespace(name="0"))


def test_errors_building_graphs() -> None:
    """Found in the client, before anything runs: a function returning several arrays, results of
    different shapes per block, a numpy array for a Dask one, an unknown combine."""
    x = da.from_array(np.ones((10, 7), np.float32), chunks=(5, 4))
    with pytest.raises(FusecError, match="must return one array per block; it returns 2"):
        fusec.dask.map_blocks(lambda b: (b, b * 2.0), x)
    with pytest.raises(FusecError, match=r"different shapes .*\(3,\) float32; \(4,\) float32"):
        fusec.dask.reduction(lambda b: fnp.sum(b, axis=0), x)
    with pytest.raises(TypeError, match="x is a ndarray, expected a dask.array.Array"):
        fusec.dask.reduction(moments, np.ones(3, np.float32))
    with pytest.raises(TypeError, match="array argument 1 is a list"):
        fusec.dask.map_blocks(block_max, x, [1.0])
    with pytest.raises(FusecError, match="combine='mean' is not one of sum, max, min"):
        fusec.dask.reduction(moments, x, combine="mean")


def test_worker_order_without_numbered_names() -> None:
    """Names with a number: that number; without: the position among the host's workers sorted
    by address (asked of the scheduler)."""
    assert [fusec.dask._ordinal_from_name(n) for n in (0, "3", "gpu-12", "a-b-2")] == [0, 3, 12, 2]
    assert [fusec.dask._ordinal_from_name(n) for n in ("tcp://10.0.0.1:4000", "w1x", -1)] \
        == [None, None, None]
    addrs = ["tcp://10.0.0.2:5000", "tcp://10.0.0.1:7000", "tcp://10.0.0.1:4001",
             "tcp://10.0.0.1:6000"]

    async def identity() -> dict[str, Any]:
        return {"workers": {a: {} for a in addrs}}

    plugin = fusec.dask.FusecPlugin([0, 1])
    got = {a: asyncio.run(plugin.choose(SimpleNamespace(
        name=a, address=a, scheduler=SimpleNamespace(identity=identity)))) for a in addrs}
    # host 10.0.0.1: ports 4001, 6000, 7000 -> 0, 1, 0; host 10.0.0.2 alone -> 0
    assert got == {addrs[0]: 0, addrs[1]: 0, addrs[2]: 0, addrs[3]: 1}


def _wait_for(path: Path, procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{p.args} exited with {p.returncode}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.05)


def test_separate_scheduler_and_workers_with_the_preload(tmp_path: Path,
                                                        rng: np.random.Generator) -> None:
    """A scheduler and two workers started as commands (as on a cluster), the workers pinned by
    ``--preload fusec.dask`` with FUSEC_DASK_ADAPTERS and their names."""
    sched_file = tmp_path / "scheduler.json"
    env = {**os.environ, "PYTHONPATH": pythonpath(str(TESTS)),
           "FUSEC_BACKEND": "auto", "FUSEC_DASK_BACKEND": "gpu", "FUSEC_DASK_ADAPTERS": "0,1",
           "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp")}
    env.pop("FUSEC_ADAPTER", None)
    common = ["--scheduler-file", str(sched_file), "--no-dashboard"]
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        log = open(tmp_path / "scheduler.log", "wb")
        logs.append(log)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--port", "0",
             "--host", "127.0.0.1", *common], env=env, stdout=log, stderr=subprocess.STDOUT))
        # (started at once: a worker waits for the scheduler file; their imports overlap)
        for i in range(2):
            log = open(tmp_path / f"worker{i}.log", "wb")
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", *common, "--name",
                 f"gpu-{i}", "--nthreads", "1", "--no-nanny", "--host", "127.0.0.1",
                 "--local-directory", str(tmp_path / f"w{i}"), "--preload", "fusec.dask"],
                env=env, stdout=log, stderr=subprocess.STDOUT))
        _wait_for(sched_file, procs, 60)
        with Client(scheduler_file=str(sched_file), timeout=30) as c:
            try:
                c.wait_for_workers(2, timeout=60)
            except TimeoutError:
                raise AssertionError("workers did not start: " + "\n".join(
                    (tmp_path / f"worker{i}.log").read_text()[-2000:] for i in range(2))) \
                    from None
            x = _fresh(rng)
            got = fusec.dask.reduction(
                moments, da.from_array(x, chunks=(ROW_CHUNKS, COL_CHUNKS))).compute()
            _check_moments(got, x)
            infos = _assert_pinned(c, {"gpu-0": 0, "gpu-1": 1})
            assert all(i["cache"]["misses"] > 0 for i in infos.values())
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
