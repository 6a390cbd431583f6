"""Calls recorded ahead (runtime.GpuExecutable.record_ahead): while the host waits for a large
call, the executable's next call is recorded for the same inputs' buffers, and the next call
submits it only if its inputs are bound to those buffers. Results must be what recording each
call afresh gives, whatever changes between the recording and the call."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from helpers import in_threads

import fusec
import fusec.numpy as fnp
from fusec import config, runtime
from fusec.errors import FusecError


@pytest.fixture()
def rt(monkeypatch: pytest.MonkeyPatch) -> Iterator[runtime.Runtime]:
    """The runtime, with every call large (none joins the batch) and every wait recording the
    last call's next one (the "auto" rule needs a GPU slower than the host's recording)."""
    got = runtime.get_runtime()
    assert got is not None and not got.info.is_cpu_fallback
    if got.native is None:
        pytest.fail("calls are recorded ahead through wgpu-native's recorder, which is missing")
    monkeypatch.setattr(runtime, "BATCH_CALLS", 0)
    config.set("record_ahead", "always")
    try:
        yield got
    finally:
        config.set("record_ahead", None)


def _mlp(x: object, w: object, b: object) -> object:
    h = fnp.tanh(x @ w + b)
    return h @ w.T, h.sum(axis=1)


def _ref(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = np.tanh(x.astype(np.float64) @ w + b)
    return h @ w.T, h.sum(axis=1)


def _check(got: tuple[object, object], want: tuple[np.ndarray, np.ndarray]) -> None:
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), r, rtol=2e-5, atol=2e-5)


def _data(rng: np.random.Generator, m: int = 37, k: int = 29
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (rng.standard_normal((m, k)).astype(np.float32),
            (rng.standard_normal((k, k)) / np.sqrt(k)).astype(np.float32),
            rng.standard_normal(k).astype(np.float32))


def test_repeated_calls_submit_the_call_recorded_ahead(rt: runtime.Runtime) -> None:
    f = fusec.gpu_jit(_mlp)
    x, w, b = _data(np.random.default_rng(0))
    dev = [fusec.device_put(v) for v in (x, w, b)]
    used, recorded = rt.ahead_used, rt.ahead_recorded
    kept = []
    for _ in range(6):
        out = f(*dev)
        out[0].block_until_ready()  # the wait records the next call
        kept.append(out)
    # the first call has no repeat yet; the second's wait records the third, and so on
    assert rt.ahead_recorded - recorded == 5
    assert rt.ahead_used - used == 4
    want = _ref(x, w, b)
    for out in kept:  # every call's results, held while later calls ran, are still right
        _check(out, want)
    assert len({id(o[0]._buffer.raw) for o in kept}) == len(kept)  # fresh buffers each


def test_other_inputs_are_not_given_a_call_recorded_for_these(rt: runtime.Runtime) -> None:
    rng = np.random.default_rng(1)
    f = fusec.gpu_jit(_mlp)
    x, w, b = _data(rng)
    x2 = rng.standard_normal(x.shape).astype(np.float32)
    dx, dx2, dw, db = (fusec.device_put(v) for v in (x, x2, w, b))
    for _ in range(3):
        f(dx, dw, db)[0].block_until_ready()
    assert f._cache  # (compiled)
    used = rt.ahead_used
    out = f(dx2, dw, db)  # recorded for dx's buffer: recorded afresh
    assert rt.ahead_used == used
    _check(out, _ref(x2, w, b))
    out[0].block_until_ready()
    out = f(dx2, dw, db)  # one call with dx2 before: no repeat, nothing recorded for it yet
    assert rt.ahead_used == used
    _check(out, _ref(x2, w, b))
    out = f(dx2, dw, db)
    assert rt.ahead_used == used + 1
    _check(out, _ref(x2, w, b))


def test_host_data_uploaded_into_the_same_buffer_is_read(rt: runtime.Runtime) -> None:
    """Host data is uploaded into a pooled buffer, the same one call after call: the call
    recorded ahead for it must read each call's new contents."""
    rng = np.random.default_rng(2)
    f = fusec.gpu_jit(lambda x, w: (fnp.exp(x @ w) * 0.5).sum(axis=0))
    w = (rng.standard_normal((300, 6)) / 20).astype(np.float32)
    dw = fusec.device_put(w)
    used = rt.ahead_used
    for _ in range(6):
        x = rng.standard_normal((211, 300)).astype(np.float32)
        out = f(x, dw)
        want = (np.exp(x.astype(np.float64) @ w) * 0.5).sum(axis=0)
        np.testing.assert_allclose(np.asarray(out), want, rtol=2e-5)
    assert rt.ahead_used - used >= 3


def test_zeroed_buffers_are_cleared_in_a_call_recorded_ahead(rt: runtime.Runtime) -> None:
    """A scatter-add accumulates into a buffer zeroed at the start of every call."""
    rng = np.random.default_rng(3)
    idx = rng.integers(0, 53, 4001).astype(np.int32)
    v = rng.standard_normal((4001, 7)).astype(np.float32)
    f = fusec.gpu_jit(lambda v, i: fnp.zeros((53, 7), np.float32).at[i].add(v * 2.0))
    dv, di = fusec.device_put(v), fusec.device_put(idx)
    want = np.zeros((53, 7))
    np.add.at(want, idx, v.astype(np.float64) * 2.0)
    used = rt.ahead_used
    for _ in range(5):
        np.testing.assert_allclose(np.asarray(f(dv, di)), want, rtol=1e-5, atol=1e-5)
    assert rt.ahead_used - used >= 2


def test_a_destroyed_buffer_voids_the_recording(rt: runtime.Runtime) -> None:
    f = fusec.gpu_jit(_mlp)
    x, w, b = _data(np.random.default_rng(4))
    dev = [fusec.device_put(v) for v in (x, w, b)]
    for _ in range(3):
        f(*dev)[0].block_until_ready()
    used = rt.ahead_used
    rt.destroyed += 1  # as if the pool had destroyed a buffer since the recording
    out = f(*dev)
    assert rt.ahead_used == used
    _check(out, _ref(x, w, b))


def test_calls_from_several_threads(rt: runtime.Runtime) -> None:
    f = fusec.gpu_jit(_mlp)
    rng = np.random.default_rng(5)
    _, w, b = _data(rng)
    dw, db = fusec.device_put(w), fusec.device_put(b)
    xs = [rng.standard_normal((37, 29)).astype(np.float32) for _ in range(4)]

    def worker(t: int) -> None:
        dx = fusec.device_put(xs[t])
        want = _ref(xs[t], w, b)
        for _ in range(8):
            out = f(dx, dw, db)
            out[0].block_until_ready()
            _check(out, want)

    in_threads(worker, 4)


def test_a_pending_batch_goes_before_a_call_recorded_ahead(rt: runtime.Runtime,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    f = fusec.gpu_jit(_mlp)
    x, w, b = _data(np.random.default_rng(6))
    dev = [fusec.device_put(v) for v in (x, w, b)]
    for _ in range(3):
        prev = f(*dev)
        prev[0].block_until_ready()
    monkeypatch.setattr(runtime, "BATCH_CALLS", 64)
    monkeypatch.setattr(runtime, "BATCH_SECONDS", 1e9)  # only a flush closes the batch
    g = fusec.gpu_jit(lambda y: y * 3.0 + 1.0)  # small: joins the batch
    pending = g(prev[1])
    assert rt.batch_calls == 1
    used = rt.ahead_used
    out = f(*dev)  # submits the batch, then the call recorded ahead
    assert rt.ahead_used == used + 1 and rt.batch_calls == 0
    want = _ref(x, w, b)
    _check(out, want)
    np.testing.assert_allclose(np.asarray(pending), want[1] * 3.0 + 1.0, rtol=2e-5)


def test_a_donated_carry_written_in_place_is_recorded_ahead(rt: runtime.Runtime) -> None:
    """A call that writes into its donated input's buffer: the next call passes the output,
    over the same buffer, so the call recorded ahead for that buffer is submitted."""
    x = np.random.default_rng(7).standard_normal((301, 67)).astype(np.float32)
    f = fusec.gpu_jit(lambda x: fnp.tanh(x) * 2.0 - 0.5, donate_argnums=(0,))
    y = fusec.device_put(x)
    want = x.astype(np.float64)
    used = rt.ahead_used
    for _ in range(6):
        raw = y._buffer.raw
        y = f(y)
        assert y._buffer.raw is raw  # written in place
        want = np.tanh(want) * 2.0 - 0.5
        np.testing.assert_allclose(np.asarray(y), want, rtol=2e-5, atol=2e-5)
    assert rt.ahead_used - used >= 3


def _decode_like(cache: object, tok: object, pos: object, a: object, b: object, c: object
                 ) -> tuple[object, object]:
    """A model step's shape: a donated cache written at ``pos``, the last output fed back
    (``tok``), small host inputs of one size class (``pos``, ``a``, ``b``, ``c``)."""
    row = fnp.tanh(tok * a + b) - c  # [1, 8]
    cache = fusec.lax.dynamic_update_slice(cache, row, (pos, 0))
    nxt = (cache.sum(axis=0, keepdims=True) * 0.25 + row) / 3.0
    return nxt, cache


def _decode_ref(steps: int, rng: np.random.Generator) -> tuple[list[Any], np.ndarray]:
    """The host inputs of ``steps`` steps and each step's output, in float64."""
    cache = np.zeros((64, 8))
    tok = np.full((1, 8), 0.5)
    ins, outs = [], []
    for s in range(steps):
        a = rng.standard_normal((1, 8)).astype(np.float32)
        b = rng.standard_normal((1, 8)).astype(np.float32)
        c = rng.standard_normal((1, 8)).astype(np.float32)
        ins.append((np.int32(s * 3 % 61), a, b, c))
        row = np.tanh(tok * a + b) - c
        cache[s * 3 % 61] = row[0]
        tok = (cache.sum(axis=0, keepdims=True) * 0.25 + row) / 3.0
        outs.append(tok)
    return ins, np.array(outs)


def test_an_output_fed_back_and_host_inputs_are_predicted(rt: runtime.Runtime) -> None:
    """A decode loop: each call takes the last call's output (a fresh buffer each time), writes
    a donated cache in place and uploads new host data. The call recorded ahead binds the last
    output and the buffers the host data is then uploaded into; every step's result is what
    recording afresh gives."""
    ins, want = _decode_ref(12, np.random.default_rng(8))
    f = fusec.gpu_jit(_decode_like, donate_argnums=(0,))
    cache = fusec.device_put(np.zeros((64, 8), np.float32))
    tok = fusec.device_put(np.full((1, 8), 0.5, np.float32))
    used = rt.ahead_used
    got = []
    for pos, a, b, c in ins:
        tok, cache = f(cache, tok, pos, a, b, c)
        got.append(tok)
        np.asarray(tok)  # a streaming loop reads each step's output: the wait records the next
    for g, w in zip(got, want):  # each step's output, held while later steps ran
        np.testing.assert_allclose(np.asarray(g), w, rtol=2e-5, atol=2e-5)
    # the second call learns which input is fed back; the third's wait records the fourth
    assert rt.ahead_used - used >= 8
    assert len({id(g._buffer.raw) for g in got[-3:]}) == 3  # fresh outputs: not overwritten


def test_a_carry_not_fed_back_is_recorded_afresh(rt: runtime.Runtime) -> None:
    """After a loop's calls were predicted, a call given another array than the last output
    (a restart from the first state) is recorded afresh and right."""
    ins, want = _decode_ref(6, np.random.default_rng(9))
    f = fusec.gpu_jit(_decode_like, donate_argnums=(0,))
    for _ in range(2):
        cache = fusec.device_put(np.zeros((64, 8), np.float32))
        tok = fusec.device_put(np.full((1, 8), 0.5, np.float32))
        first = tok
        for (pos, a, b, c), w in zip(ins, want):
            tok, cache = f(cache, tok, pos, a, b, c)
            np.testing.assert_allclose(np.asarray(tok), w, rtol=2e-5, atol=2e-5)
        used = rt.ahead_used
        cache = fusec.device_put(np.zeros((64, 8), np.float32))
        again, cache = f(cache, first, *ins[0])  # not the last output: recorded afresh
        assert rt.ahead_used == used
        np.testing.assert_allclose(np.asarray(again), want[0], rtol=2e-5, atol=2e-5)


def test_a_donated_array_shared_with_another_is_copied_not_given_the_recording(
        rt: runtime.Runtime) -> None:
    """A donated array whose buffer another Array views is copied first (donation_copy): the
    call binds the copy, not the buffer the call recorded ahead binds, and the view keeps its
    values."""
    x = np.random.default_rng(10).standard_normal((301, 67)).astype(np.float32)
    f = fusec.gpu_jit(lambda x: fnp.tanh(x) * 2.0 - 0.5, donate_argnums=(0,))
    y = fusec.device_put(x)
    want = x.astype(np.float64)
    for _ in range(4):
        y = f(y)
        want = np.tanh(want) * 2.0 - 0.5
        np.asarray(y)
    view = y.reshape(67, 301)  # shares y's buffer
    used = rt.ahead_used
    z = f(y)
    assert rt.ahead_used == used
    np.testing.assert_allclose(np.asarray(z), np.tanh(want) * 2.0 - 0.5, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(view), want.reshape(67, 301), rtol=2e-5, atol=2e-5)


def test_off_records_nothing(rt: runtime.Runtime) -> None:
    x, w, b = _data(np.random.default_rng(11))
    recorded = rt.ahead_recorded
    config.set("record_ahead", "off")
    g = fusec.gpu_jit(_mlp)
    dev = [fusec.device_put(v) for v in (x, w, b)]
    for _ in range(3):
        g(*dev)[0].block_until_ready()
    assert rt.ahead_recorded == recorded


def test_the_auto_rule_and_a_bad_setting(rt: runtime.Runtime) -> None:
    f = fusec.gpu_jit(_mlp)
    dev = [fusec.device_put(v) for v in _data(np.random.default_rng(8))]
    f(*dev)
    f(*dev)  # a repeat
    exe, _ = rt.ahead
    assert exe.ahead_ok and exe.wants_ahead()  # "always"
    config.set("record_ahead", "auto")
    assert exe.wants_ahead()  # a wait that finds the GPU busy records
    assert not exe.wants_ahead(idle=True)  # (a wait that finds the GPU done records nothing)
    config.set("record_ahead", "sometimes")
    with pytest.raises(FusecError, match="FUSEC_RECORD_AHEAD must be one of auto, always, off"):
        exe.wants_ahead()
    config.set("record_ahead", "always")
    f(*dev)[0].block_until_ready()


def test_auto_records_again_where_a_recording_outlasted_the_gpu(
        rt: runtime.Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """With "auto", every wait that finds the GPU busy records the next call, also right after
    a wait whose recording went on after the GPU was done."""
    rng = np.random.default_rng(10)
    w = (rng.standard_normal((256, 256)) / 16).astype(np.float32)

    def chain(x: object, w: object) -> object:
        for _ in range(12):
            x = fnp.tanh(x @ w)
        return x

    f = fusec.gpu_jit(chain)
    dev = [fusec.device_put(rng.standard_normal((512, 256)).astype(np.float32)),
           fusec.device_put(w)]
    f(*dev).block_until_ready()
    f(*dev)
    exe, _ = rt.ahead
    config.set("record_ahead", "auto")
    waits = []

    def slow(inputs: list[object]) -> bool:
        busy = False
        while not rt._poll[0](rt.device._internal, False, rt._poll[1]) & 0xFF:
            busy = True  # outlast the GPU
        waits.append(busy)
        return True  # (as if recorded; nothing is, so the next call records as usual)

    monkeypatch.setattr(exe, "_record_ahead", slow)
    for _ in range(3):
        f(*dev).block_until_ready()
    # each call's wait found the GPU busy and recorded, though the one before had outlasted
    # the GPU
    assert len(waits) == 3 and all(waits)
    want = np.asarray(dev[0]).astype(np.float64)
    for _ in range(12):
        want = np.tanh(want @ w)
    np.testing.assert_allclose(np.asarray(f(*dev)), want, rtol=1e-4, atol=1e-5)


def test_the_profiler_never_runs_a_call_recorded_ahead(rt: runtime.Runtime) -> None:
    f = fusec.gpu_jit(_mlp)
    x, w, b = _data(np.random.default_rng(11))
    dev = [fusec.device_put(v) for v in (x, w, b)]
    for _ in range(3):
        out = f(*dev)
        exe, _ = rt.ahead
        out[0].block_until_ready()
    assert exe._ahead is not None  # recorded for the next call...
    used = rt.ahead_used
    with fusec.profile(print_report=False) as prof:
        out = f(*dev)  # ...which the profiler times kernel by kernel instead
        out[0].block_until_ready()
    assert rt.ahead_used == used and exe._ahead is None
    assert len(prof.rows) >= 2 and all(r[2] > 0 for r in prof.rows)
    _check(out, _ref(x, w, b))


def test_outputs_that_are_inputs_or_views_of_them(rt: runtime.Runtime) -> None:
    """Outputs that are an input itself or a view of its buffer are this call's, whether the
    call was recorded ahead or not."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((24, 10)).astype(np.float32)
    w = rng.standard_normal((10, 10)).astype(np.float32)
    f = fusec.gpu_jit(lambda x, w: (x, x.reshape(-1), fnp.tanh(x @ w)))
    dx, dw = fusec.device_put(x), fusec.device_put(w)
    used = rt.ahead_used
    for _ in range(4):
        same, flat, y = f(dx, dw)
        y.block_until_ready()
        assert same is dx
        np.testing.assert_array_equal(np.asarray(flat), x.reshape(-1))
        np.testing.assert_allclose(np.asarray(y), np.tanh(x.astype(np.float64) @ w), rtol=2e-5,
                                   atol=2e-5)
    assert rt.ahead_used - used >= 1


def test_the_user_guide_snippet_runs(rt: runtime.Runtime) -> None:
    """The user guide's example of calls recorded ahead (Device arrays): it runs, its last calls
    submit what their waits recorded, and the result is right."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "user-guide.md").read_text()
    after = text[text.index("**Calls recorded ahead.**"):]
    block = after[after.index("```python\n") + len("```python\n"):]
    block = block[:block.index("```")]
    used = rt.ahead_used
    ns: dict[str, object] = {}
    try:
        exec(compile(block, "user-guide.md#calls-recorded-ahead", "exec"), ns)  # noqa: S102
    finally:
        config.set("record_ahead", "always")  # (the snippet turns it off last)
    assert rt.ahead_used - used == 3
    x, w = np.asarray(ns["x"]).astype(np.float64), np.asarray(ns["w"]).astype(np.float64)
    for _ in range(40):
        x = np.tanh(x @ w)
    np.testing.assert_allclose(np.asarray(ns["y"]), x, rtol=1e-4, atol=1e-5)


def test_donated_carries_from_several_threads(rt: runtime.Runtime) -> None:
    """Threads each running a loop of their own over one donating function: the predictions of
    the next call's inputs (each thread's carry) are wrong as often as not, and every thread's
    results stay right."""
    f = fusec.gpu_jit(_decode_like, donate_argnums=(0,))

    def worker(t: int) -> None:
        ins, want = _decode_ref(8, np.random.default_rng(20 + t))
        cache = fusec.device_put(np.zeros((64, 8), np.float32))
        tok = fusec.device_put(np.full((1, 8), 0.5, np.float32))
        for (pos, a, b, c), w in zip(ins, want):
            tok, cache = f(cache, tok, pos, a, b, c)
            np.testing.assert_allclose(np.asarray(tok), w, rtol=2e-5, atol=2e-5)

    in_threads(worker, 4)
