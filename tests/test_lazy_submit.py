"""Lazy submission: small calls are recorded into one batch and submitted together (on a read, a
wait, an upload, a large call, or every BATCH_CALLS calls). Results must be what one submit per
call gives, whatever the buffers in flight."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pytest
from helpers import REPO, in_threads, pythonpath

import fusec
import fusec.numpy as fnp
from fusec import runtime
from fusec.runtime import get_runtime


def _rt() -> runtime.Runtime:
    rt = runtime.get_runtime()
    assert rt is not None and not rt.info.is_cpu_fallback
    return rt


def test_a_loop_of_1000_calls_submits_once_per_batch(monkeypatch: object) -> None:
    rt = _rt()
    f = fusec.gpu_jit(lambda v: v + 1.0)
    x = fusec.device_put(np.arange(1000, dtype=np.float32))
    f(x).block_until_ready()  # compiled, nothing pending
    submits = []
    real = rt.submit

    def spy(enc: object) -> None:
        submits.append(1)
        real(enc)

    rt.submit = spy  # type: ignore[method-assign]
    try:
        monkey = runtime.BATCH_SECONDS
        runtime.BATCH_SECONDS = 1e9  # only the call count closes a batch here
        flushes0 = rt.flushes
        y = x
        for _ in range(1000):
            y = f(y)
        assert rt.batch_calls == 1000 % runtime.BATCH_CALLS  # the rest is still recorded
        out = np.asarray(y)  # the read submits it
    finally:
        del rt.submit  # back to the class's method
        runtime.BATCH_SECONDS = monkey
    batches = -(-1000 // runtime.BATCH_CALLS)
    assert rt.flushes - flushes0 == batches
    # one submit per batch: the read's copy to the staging buffer rides on the last one
    assert len(submits) == batches and all(n == 1 for n in submits)
    # each call read the one before: exact integers in float32
    np.testing.assert_array_equal(out, np.arange(1000) + 1000.0)


def test_buffers_reused_while_in_flight_keep_every_result_right() -> None:
    # results dropped at once go back to the pool and are rewritten by the next calls of the
    # same batch; the ones kept must still hold their own values
    _rt()
    rng = np.random.default_rng(3)
    f = fusec.gpu_jit(lambda a, b: fnp.tanh(a * b) + a)
    g = fusec.gpu_jit(lambda a: a[::-1] * 2.0)
    xs = [fusec.device_put(rng.standard_normal(333).astype(np.float32)) for _ in range(5)]
    kept = []
    for i in range(300):
        a, b = xs[i % 5], xs[(i + 1) % 5]
        y = f(a, b)
        z = g(y)  # reads y, which is dropped right after: its buffer is reused below
        if i % 37 == 0:
            kept.append((i, z))
    for i, z in kept:
        a = np.asarray(xs[i % 5], np.float64)
        b = np.asarray(xs[(i + 1) % 5], np.float64)
        np.testing.assert_allclose(np.asarray(z), ((np.tanh(a * b) + a)[::-1] * 2.0),
                                   rtol=1e-5, atol=1e-6)


def test_donated_inputs_in_a_batch() -> None:
    _rt()
    step = fusec.gpu_jit(lambda p, g: p - 0.5 * g, donate_argnums=(0,))
    g = fusec.device_put(np.arange(7, dtype=np.float32))
    p = fusec.device_put(np.full(7, 100.0, np.float32))
    for _ in range(150):
        p = step(p, g)
    np.testing.assert_allclose(np.asarray(p), 100.0 - 75.0 * np.arange(7), rtol=1e-6)


def test_an_upload_goes_after_the_calls_recorded_before_it() -> None:
    # host arrays are uploaded with queue.write_buffer, which would land before commands still
    # in the batch: the batch is submitted first
    _rt()
    f = fusec.gpu_jit(lambda a: a + 1.0)
    outs = []
    for k in range(200):
        outs.append(f(np.full(17, float(k), np.float32)))  # an upload per call
        if k % 3:
            outs.pop(0)  # free some results: their buffers get reused by later uploads
    for o in outs:
        v = np.asarray(o)
        assert np.all(v == v[0])
    assert float(np.asarray(outs[-1])[0]) == 200.0


def test_calls_from_several_threads() -> None:
    _rt()
    f = fusec.gpu_jit(lambda a, s: a * s + 1.0)

    def worker(t: int) -> None:
        a = fusec.device_put(np.full(64 + t, float(t), np.float32))
        for k in range(150):
            y = f(a, np.float32(k))
            if k % 50 == 49:
                np.testing.assert_array_equal(np.asarray(y), float(t) * k + 1.0)

    in_threads(worker, 4)


def test_a_large_call_is_submitted_at_once() -> None:
    rt = _rt()
    big = fusec.gpu_jit(lambda a: a * 2.0)
    x = fusec.device_put(np.ones(1 << 24, np.float32))
    big(x).block_until_ready()
    small = fusec.gpu_jit(lambda a: a + 1.0)
    s = fusec.device_put(np.ones(8, np.float32))
    keep = runtime.BATCH_SECONDS
    runtime.BATCH_SECONDS = 1e9  # the small call waits in the batch
    try:
        small(s)
    finally:
        runtime.BATCH_SECONDS = keep
    assert rt.batch_calls == 1
    flushes = rt.flushes
    y = big(x)  # too large for the batch: the batch (with the small call) and it go now
    assert rt.batch_calls == 0 and rt.flushes == flushes + 1
    np.testing.assert_array_equal(np.asarray(y)[:3], 2.0)


def test_a_call_slower_than_the_batch_window_is_submitted_at_once() -> None:
    rt = _rt()
    f = fusec.gpu_jit(lambda a: a - 1.0)
    s = fusec.device_put(np.ones(8, np.float32))
    f(s).block_until_ready()
    keep = runtime.BATCH_SECONDS
    runtime.BATCH_SECONDS = 0.0  # every call is "slow": none waits in the batch
    try:
        y = f(s)
    finally:
        runtime.BATCH_SECONDS = keep
    assert rt.batch_calls == 0
    np.testing.assert_array_equal(np.asarray(y), 0.0)


@pytest.mark.parametrize("wait", ["spin", "poll"])
def test_block_until_ready_returns_once_the_gpu_is_done(wait: str) -> None:
    # a kernel long enough on any adapter that an early return would find it still running:
    # right after the wait, wgpu-native must report its queue empty (a non-blocking poll; its
    # C bool is the low byte)
    from wgpu.backends.wgpu_native._api import ffi, lib

    rt = get_runtime()
    assert rt is not None
    f = fusec.gpu_jit(lambda a, b: fnp.tanh(a @ b) @ b)
    rng = np.random.default_rng(0)
    a = fusec.device_put(rng.standard_normal((384, 384)).astype(np.float32))
    b = fusec.device_put(rng.standard_normal((384, 384)).astype(np.float32) / 20)
    f(a, b).block_until_ready()
    fusec.config.set("wait", wait)
    try:
        for _ in range(3):
            r = f(a, b)
            r.block_until_ready()
            assert lib.wgpuDevicePoll(rt.device._internal, False, ffi.NULL) & 0xFF == 1
    finally:
        fusec.config.set("wait", None)
    want = np.tanh(np.asarray(a, np.float64) @ np.asarray(b, np.float64)) @ np.asarray(b)
    np.testing.assert_allclose(np.asarray(r), want, rtol=1e-4, atol=1e-4)


def test_an_unknown_wait_mode_is_a_clear_error() -> None:
    f = fusec.gpu_jit(lambda v: v * 3.0)
    x = fusec.device_put(np.arange(5, dtype=np.float32))
    fusec.config.set("wait", "spinn")
    try:
        with pytest.raises(fusec.FusecError, match="FUSEC_WAIT must be one of spin, poll, "
                                                  "thread; got 'spinn'"):
            f(x).block_until_ready()
    finally:
        fusec.config.set("wait", None)
    np.testing.assert_array_equal(np.asarray(f(x)), np.arange(5) * 3.0)


def _chain_submits(seed: int, monkeypatch: pytest.MonkeyPatch,
                   before: Optional[Callable[[], None]] = None) -> int:
    """Submits of one call of 40 dependent products (too large to join the batch), compiled and
    with nothing pending before it but what ``before`` (run just before the call) submits; its
    result is checked against float64."""
    rt = _rt()
    rng = np.random.default_rng(seed)
    q = np.linalg.qr(rng.standard_normal((8, 8)))[0].astype(np.float32)  # (no growth)
    x0 = rng.standard_normal((5, 8)).astype(np.float32)

    def chain(x: object, w: object) -> object:
        for _ in range(40):
            x = x @ w
        return x

    f = fusec.gpu_jit(chain)
    x, w = fusec.device_put(x0), fusec.device_put(q)
    assert len(f.lower(x, w).kernels) == 40
    f(x, w).block_until_ready()  # compiled, nothing pending
    if before is not None:
        before()
    seen = []
    real = rt.submit

    def spy(enc: object) -> None:
        seen.append(1)
        real(enc)

    monkeypatch.setattr(rt, "submit", spy)
    out = f(x, w)
    monkeypatch.setattr(rt, "submit", real)
    want = x0.astype(np.float64) @ np.linalg.matrix_power(q.astype(np.float64), 40)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-4, atol=1e-4)
    return len(seen)


@pytest.mark.parametrize("first,growth,submits", [(0, 2, 1), (1, 2, 7), (3, 2, 5), (3, 4, 3),
                                                  (5, 0, 2), (5, 1, 2), (1, 3, 5)])
def test_a_call_of_many_kernels_submits_in_growing_chunks(first: int, growth: int, submits: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A call too large to join the batch (40 dependent products) submits its first ``first``
    dispatches at once, then after ``growth`` times as many each time (FUSEC_SUBMIT_FIRST, 0:
    one submit; FUSEC_SUBMIT_GROWTH, 1 or less: the rest in one chunk): the results are those of
    one submit, and the submits are as many as the rule says (1, 2: after dispatches 1, 2, 4, 8,
    16 and 32, then the rest; 3, 2: after 3, 6, 12 and 24; 3, 4: after 3 and 12; 5, 0 and 5, 1:
    after 5; 1, 3: after 1, 3, 9 and 27)."""
    monkeypatch.setitem(fusec.config._overrides, "submit_first", first)
    monkeypatch.setitem(fusec.config._overrides, "submit_growth", growth)
    assert _chain_submits(first, monkeypatch) == submits


@pytest.mark.parametrize("busy,rule,submits", [(True, 1, 1), (True, 0, 7), (False, 1, 7)])
def test_a_call_that_finds_the_gpu_busy_submits_once(busy: bool, rule: int, submits: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A call of many kernels that finds the GPU still running earlier work submits once, at its
    end (FUSEC_SUBMIT_BUSY=1, the default); with the rule off, or the GPU idle, it submits in
    chunks (here after 1, 2, 4, 8, 16 and 32 of its 40 dispatches); the results are the same."""
    rt = _rt()
    monkeypatch.setitem(fusec.config._overrides, "submit_first", 1)
    monkeypatch.setitem(fusec.config._overrides, "submit_growth", 2)
    monkeypatch.setitem(fusec.config._overrides, "submit_busy", rule)
    asked = []

    def gpu_busy() -> bool:
        asked.append(1)
        return busy

    monkeypatch.setattr(rt, "gpu_busy", gpu_busy)
    assert _chain_submits(3, monkeypatch) == submits
    # asked once per call (the compiling call and the counted one), only where the rule is on
    assert len(asked) == 2 * rule


def test_gpu_busy_sees_work_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runtime.gpu_busy polls the queue: true while a long call runs (a 640^3 product on the
    software adapter takes tens of ms), false once it is done; a call of many kernels made
    right behind the long one submits once, and both results are right."""
    rt = _rt()
    rng = np.random.default_rng(11)
    a = rng.standard_normal((640, 640)).astype(np.float32)
    big = fusec.gpu_jit(lambda x, y: (x @ y) @ y)
    xa, xb = fusec.device_put(a), fusec.device_put(a.T.copy())
    big(xa, xb).block_until_ready()  # compiled
    assert not rt.gpu_busy()
    monkeypatch.setitem(fusec.config._overrides, "submit_first", 1)
    monkeypatch.setitem(fusec.config._overrides, "submit_growth", 2)
    long_call = []

    def start_long_call() -> None:
        long_call.append(big(xa, xb))
        rt.flush()  # (a call of two kernels joins the batch: submitted now)
        assert rt.gpu_busy()

    assert _chain_submits(12, monkeypatch, before=start_long_call) == 1
    assert not rt.gpu_busy()  # (the chain's result was read)
    a64 = a.astype(np.float64)
    np.testing.assert_allclose(np.asarray(long_call[0]), (a64 @ a64.T) @ a64.T, rtol=1e-3,
                               atol=1e-2)


@pytest.mark.parametrize("first,growth", [(1, 2), (4, 2), (3, 3), (4, 0), (2, 1)])
def test_submit_cuts_follow_the_doubling_rule_or_grow_past_it(first: int, growth: int) -> None:
    """Without the plan the cuts are the doubling rule's; with it, a chunk grows past the rule
    while the GPU is estimated to be busy: long kernels give fewer submits, kernels shorter than
    the host's recording give the rule's; never more submits than the rule, always in order."""
    rng = np.random.default_rng(first * 10 + growth)
    n = 60
    rule = runtime.submit_cuts([1.0] * n, first, growth, plan=False)
    want, nxt = [], first
    while nxt < n:
        want.append(nxt)
        if growth <= 1:
            break
        nxt *= growth
    assert rule == want
    short = runtime.submit_cuts([1.0] * n, first, growth, plan=True)
    assert short == rule  # the GPU outpaced: the host cannot get ahead, the rule decides
    long_ = rng.uniform(200.0, 400.0, n).tolist()  # each kernel outlasts many dispatches' recording
    planned = runtime.submit_cuts(long_, first, growth, plan=True)
    assert planned[:1] == rule[:1] and len(planned) <= len(rule)
    assert planned == sorted(set(planned)) and all(0 < c < n for c in planned)
    # the first chunk (if it holds 3 or more of these kernels, they cover the rest's recording),
    # then at most one more
    assert planned == [first] if first >= 3 else len(planned) <= 2
    if len(rule) > 2:
        assert len(planned) < len(rule)
    mixed = [1.0] * 20 + long_[20:]
    got = runtime.submit_cuts(mixed, first, growth, plan=True)
    assert len(got) <= len(rule) and got == sorted(set(got))
    assert runtime.submit_cuts(long_, 0, growth, plan=True) == []
    assert runtime.submit_cuts(long_[:first], first, growth, plan=True) == []


@pytest.mark.usefixtures("gpu_target")
@pytest.mark.parametrize("plan", [0, 1])
def test_a_planned_call_submits_where_its_cuts_say(plan: int, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """On the GPU target a call submits where submit_cuts plans, here with the cost estimates
    made slow (every product a long kernel): 2 submits in place of the rule's 5 for 40 products
    (FUSEC_SUBMIT_PLAN=0: the rule's), with the results of one submit; FUSEC_DEBUG=2 says so."""
    monkeypatch.setitem(fusec.config._overrides, "submit_first", 4)
    monkeypatch.setitem(fusec.config._overrides, "submit_growth", 2)
    monkeypatch.setitem(fusec.config._overrides, "submit_plan", plan)
    monkeypatch.setitem(fusec.config._overrides, "debug", 2)
    monkeypatch.setattr(runtime, "GPU_US_PER_KERNEL", 500.0)
    # after 4, then the rest; after 4, 8, 16 and 32, then the rest
    assert _chain_submits(plan, monkeypatch) == (2 if plan else 5)
    said = capsys.readouterr().err
    assert ("40 dispatches submitted after [4] (planned; the doubling rule: [4, 8, 16, 32];"
            if plan else "40 dispatches submitted after [4, 8, 16, 32] (the doubling rule;") in said


_CHUNKS_THROUGH_WGPU_PY = """
import json
import numpy as np
import fusec
from fusec import runtime

rt = runtime.get_runtime()
assert rt is not None and rt.native is None, "FUSEC_NATIVE=0: recorded through wgpu-py"
rng = np.random.default_rng(0)
q = np.linalg.qr(rng.standard_normal((8, 8)))[0].astype(np.float32)
x0 = rng.standard_normal((5, 8)).astype(np.float32)


def chain(x, w):
    for _ in range(40):
        x = x @ w
    return x


f = fusec.gpu_jit(chain)
x, w = fusec.device_put(x0), fusec.device_put(q)
f(x, w).block_until_ready()
seen = [0]
real = rt.submit


def spy(enc):
    seen[0] += 1
    real(enc)


rt.submit = spy
out = f(x, w)
submits = seen[0]
want = x0.astype(np.float64) @ np.linalg.matrix_power(q.astype(np.float64), 40)
print(json.dumps({"submits": submits, "err": float(np.abs(np.asarray(out) - want).max())}))
"""


def test_chunks_through_wgpu_py_recording() -> None:
    """The same rule where calls are recorded through wgpu-py's objects (FUSEC_NATIVE=0, the
    general loop): 7 submits for 40 kernels from the first dispatch on, the right result."""
    _rt()
    env = dict(os.environ, FUSEC_NATIVE="0", FUSEC_SUBMIT_FIRST="1", FUSEC_CACHE_DIR="off",
               XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR") or "/tmp")
    env["PYTHONPATH"] = pythonpath()
    p = subprocess.run([sys.executable, "-c", _CHUNKS_THROUGH_WGPU_PY], cwd=REPO, env=env,
                       text=True, capture_output=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["submits"] == 7 and got["err"] < 1e-4, got


def test_copy_to_host_async_reads_without_waiting_for_later_calls() -> None:
    """A copy started ahead goes behind the work submitted so far: the read gives the values
    the array had then (a later call donating its buffer writes over it after the copy), waits
    for that copy only, and tiny arrays (a token), batched calls and odd sizes read right."""
    rt = _rt()
    rng = np.random.default_rng(21)
    step = fusec.gpu_jit(lambda c, x: (c * 0.5 + x, fnp.tanh(c @ x[:7].T)),
                         donate_argnums=(0,))
    small = fusec.gpu_jit(lambda v: v * 3 - 1)  # joins the batch
    c0 = rng.standard_normal((257, 13)).astype(np.float32)
    x = rng.standard_normal((257, 13)).astype(np.float32)
    cache, first = step(fusec.device_put(c0), x)
    cache.copy_to_host_async()  # (the values before the next call overwrites its buffer)
    first.copy_to_host_async()
    tok = small(fusec.device_put(rng.integers(0, 50, 3).astype(np.int32)))
    tok.copy_to_host_async()
    cache2, second = step(cache, x)  # donates cache's buffer, submitted after the copies
    later = cache2._submission
    want1 = c0.astype(np.float64) * 0.5 + x
    np.testing.assert_allclose(np.asarray(first), np.tanh(c0.astype(np.float64) @ x[:7].T),
                               rtol=1e-5, atol=1e-5)
    assert rt.completed < later  # the reads above did not wait for the queue
    with pytest.raises(fusec.FusecError, match="donated"):
        np.asarray(cache)  # donated since: its values are the next call's
    np.testing.assert_array_equal(np.asarray(tok) % 3, np.full(3, 2))
    np.testing.assert_allclose(np.asarray(cache2), want1 * 0.5 + x, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(second), np.tanh(want1 @ x[:7].T),
                               rtol=1e-5, atol=1e-5)
    # an array dropped with its copy in flight, then reads that reuse the staging buffers
    for _ in range(3):
        gone, _ = step(fusec.device_put(c0), x)
        gone.copy_to_host_async()
        del gone
    again, _ = step(fusec.device_put(c0), x)
    again.copy_to_host_async()
    again.copy_to_host_async()  # (a second request is the first)
    np.testing.assert_allclose(np.asarray(again), want1, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(again), want1, rtol=1e-6, atol=1e-6)


def test_copy_to_host_async_from_several_threads() -> None:
    """Threads starting copies ahead and reading them while the others call and read: each
    read gives its own array's values."""
    _rt()
    f = fusec.gpu_jit(lambda a, s: fnp.sin(a) * s + 1.0)

    def worker(t: int) -> None:
        x = np.linspace(-3, 3, 97 + 13 * t, dtype=np.float32)
        a = fusec.device_put(x)
        prev = None
        for k in range(40):
            y = f(a, np.float32(k))
            y.copy_to_host_async()
            if prev is not None:
                kk, p = prev
                np.testing.assert_allclose(np.asarray(p), np.sin(x.astype(np.float64)) * kk + 1,
                                           rtol=1e-5, atol=1e-4)
            prev = (k, y)

    in_threads(worker, 4)


def test_the_user_guides_copy_to_host_async_example() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "user-guide.md").read_text()
    at = text.index("tok.copy_to_host_async()")
    block = text[text.rindex("```python\n", 0, at) + len("```python\n"):]
    block = block[:block.index("```")]
    ns: dict[str, object] = {}
    exec(compile(block, "user-guide.md#device-arrays", "exec"), ns)  # noqa: S102
    want, t = [], np.arange(4)
    for _ in range(3):
        t = (t * 7 + 3) % 1000
        want.append(t)
    np.testing.assert_array_equal(np.stack(ns["seen"]), np.stack(want))  # type: ignore[call-overload]


@pytest.mark.parametrize("wait", ["spin", "poll", "thread"])
def test_copy_to_host_async_under_each_wait_mode(wait: str) -> None:
    from fusec import config

    _rt()
    f = fusec.gpu_jit(lambda a: fnp.cumsum(a * 2.0))
    x = np.random.default_rng(22).standard_normal(1031).astype(np.float32)
    config.set("wait", wait)
    try:
        y = f(x)
        y.copy_to_host_async()
        z = f(y)
        np.testing.assert_allclose(np.asarray(y), np.cumsum(x.astype(np.float64) * 2),
                                   rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(np.asarray(z), np.cumsum(np.asarray(y, np.float64) * 2),
                                   rtol=1e-4, atol=1e-2)
    finally:
        config.set("wait", None)



def test_a_call_looks_up_only_the_bind_groups_whose_buffers_changed(
        rng: np.random.Generator) -> None:
    """_record_native keeps the last call's bind groups: a call looks up those of the
    dispatches whose slots hold other buffers than at the last call (new inputs, a fresh
    output), and every one after a buffer was destroyed. Each call must still get its own
    result: alternating inputs, while earlier outputs are alive."""
    rt = _rt()

    def chain(a: fusec.Array, b: fusec.Array) -> fusec.Array:
        h = fnp.tanh(a * 1.5)  # reads a only
        for i in range(4):  # kernels that bind neither input nor the output
            h = fnp.sin(h @ h.T * 0.05 + float(i))
        return h + b.sum()  # reads b, writes the output
    f = fusec.gpu_jit(chain)
    n = 37
    xs = [rng.standard_normal((n, n)).astype(np.float32) for _ in range(3)]
    ys = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]

    def ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        h = np.tanh(a.astype(np.float64) * 1.5)
        for i in range(4):
            h = np.sin(h @ h.T * 0.05 + i)
        return h + b.astype(np.float64).sum()
    dx = [fusec.device_put(x) for x in xs]
    dy = [fusec.device_put(y) for y in ys]
    seen: list[runtime.GpuExecutable] = []
    real_run = runtime.GpuExecutable.run

    def run_spy(self: runtime.GpuExecutable, inputs: list[object]) -> list[object]:
        seen.append(self)
        return real_run(self, inputs)
    runtime.GpuExecutable.run = run_spy  # type: ignore[method-assign]
    try:
        f(dx[0], dy[0]).block_until_ready()
    finally:
        runtime.GpuExecutable.run = real_run  # type: ignore[method-assign]
    launches = seen[-1]._native.launches  # type: ignore[union-attr]
    assert len(launches) >= 6
    looked: list[int] = []
    for k, st in enumerate(launches):
        st.gather = (lambda g, k: lambda raws: (looked.append(k), g(raws))[1])(st.gather, k)
    outs = []
    order = [(0, 0), (0, 0), (1, 0), (1, 2), (2, 2), (0, 1)]
    lookups = []
    for k, (i, j) in enumerate(order):
        if k == 4:
            rt.destroyed += 1  # as if the pool had destroyed a buffer: every group anew
        looked.clear()
        outs.append((i, j, f(dx[i], dy[j])))
        lookups.append(sorted(looked))
    last = len(launches) - 1
    assert lookups[1] == [last]  # the same inputs: the fresh output's dispatch only
    assert 0 in lookups[2] and last in lookups[2]  # a new a: its reader's, and the output's
    assert 0 not in lookups[3] and last in lookups[3]  # a new b only
    assert lookups[4] == list(range(len(launches)))  # after a destroyed buffer: all
    middle = set(range(1, last - 1))
    assert not middle & set(lookups[1] + lookups[2] + lookups[3] + lookups[5])
    for i, j, o in outs:
        np.testing.assert_allclose(np.asarray(o), ref(xs[i], ys[j]), rtol=2e-5, atol=2e-5)
