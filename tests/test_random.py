"""fusec.random: Threefry-2x32 against the Random123 known answers, the counter scheme against an
independent numpy Threefry, determinism (eager, jit, the numpy interpreter), distinct streams,
statistics with tolerances from the sample size, fusion into the consumer, and argument errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusec
import fusec.numpy as fnp
import fusec.random as fr
from fusec.jit import interpret_traced

N = 2**20
SIGMAS = 6.0  # a correct generator fails a 6-sigma check with probability ~2e-9 per check


# --- an independent reference: Threefry-2x32-20 in numpy uint32 arithmetic ------------------------


def _np_threefry(k0: np.ndarray, k1: np.ndarray, x0: np.ndarray, x1: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    rot = [13, 15, 26, 6, 17, 29, 16, 24]
    k = [np.uint32(k0), np.uint32(k1), np.uint32(k0) ^ np.uint32(k1) ^ np.uint32(0x1BD11BDA)]
    with np.errstate(over="ignore"):
        a = (x0 + k[0]).astype(np.uint32)
        b = (x1 + k[1]).astype(np.uint32)
        for rnd in range(20):
            r = rot[rnd % 8]
            a = (a + b).astype(np.uint32)
            b = ((b << np.uint32(r)) | (b >> np.uint32(32 - r))) ^ a
            if rnd % 4 == 3:
                s = rnd // 4 + 1
                a = (a + k[s % 3]).astype(np.uint32)
                b = (b + k[(s + 1) % 3] + np.uint32(s)).astype(np.uint32)
    return a, b


KAT = [  # Random123's kat_vectors for threefry2x32_20: (key, counter, expected)
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


def test_threefry_known_answers() -> None:
    keys = np.array([k for k, _, _ in KAT], np.uint32)
    ctrs = np.array([c for _, c, _ in KAT], np.uint32)
    want = np.array([w for _, _, w in KAT], np.uint32)
    np.testing.assert_array_equal(np.asarray(fr.threefry2x32(keys, ctrs)), want)
    jitted = fusec.gpu_jit(fr.threefry2x32)
    np.testing.assert_array_equal(np.asarray(jitted(keys, ctrs)), want)
    # the reference the other tests rely on agrees with the same vectors
    ref = np.stack(_np_threefry(keys[:, 0], keys[:, 1], ctrs[:, 0], ctrs[:, 1]), -1)
    np.testing.assert_array_equal(ref, want)


def test_counter_scheme_matches_reference(rng: np.random.Generator) -> None:
    k = rng.integers(0, 2**32, 2, dtype=np.uint32)
    shape = (3, 37)
    i = np.arange(math.prod(shape), dtype=np.uint32)
    y0, y1 = _np_threefry(k[0], k[1], np.zeros_like(i), i)
    np.testing.assert_array_equal(np.asarray(fr.bits(k, shape)), (y0 ^ y1).reshape(shape))
    j = np.arange(5, dtype=np.uint32)
    s0, s1 = _np_threefry(k[0], k[1], np.zeros_like(j), j)
    np.testing.assert_array_equal(np.asarray(fr.split(k, 5)), np.stack([s0, s1], -1))
    f0, f1 = _np_threefry(k[0], k[1], np.zeros(1, np.uint32), np.array([77], np.uint32))
    np.testing.assert_array_equal(np.asarray(fr.fold_in(k, 77)), [f0[0], f1[0]])
    np.testing.assert_array_equal(np.asarray(fr.key(2**32 + 5)), [0, 5])
    np.testing.assert_array_equal(np.asarray(fr.key(-1)), [0, 2**32 - 1])
    assert np.asarray(fr.PRNGKey(7)).dtype == np.uint32


def test_deterministic_eager_jit_and_interpreter(rng: np.random.Generator) -> None:
    k = np.asarray(fr.key(int(rng.integers(0, 2**31))))
    x = rng.standard_normal((7, 13)).astype(np.float32)

    def draw(key, x):
        return (fr.bits(key, x.shape), fr.uniform(key, x.shape, minval=-2.0, maxval=3.0),
                x + fr.normal(key, x.shape))

    f = fusec.gpu_jit(draw)
    got = [np.asarray(v) for v in f(k, x)]
    again = [np.asarray(v) for v in f(k, x)]
    eager = [np.asarray(fr.bits(k, x.shape)), np.asarray(fr.uniform(k, x.shape, minval=-2.0,
                                                                    maxval=3.0))]
    interp = interpret_traced(f.trace(k, x), [k, x])
    for a, b in zip(got, again):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(got[0], eager[0])
    np.testing.assert_array_equal(got[1], eager[1])
    np.testing.assert_array_equal(got[0], interp[0])  # integer ops: identical bits
    # the [0, 1) value is exact; scaling it to [minval, maxval) is a multiply and an add, which a
    # GPU compiler may contract into one fused multiply-add (the H100's did): one rounding in
    # place of two, so at most an ulp of the range apart
    np.testing.assert_allclose(got[1], interp[1], rtol=0, atol=5.0 * 2.0**-23)
    # log/sqrt/cos differ by a few ulps between WGSL and numpy
    np.testing.assert_allclose(got[2], interp[2], rtol=1e-5, atol=1e-5)


def test_streams_differ() -> None:
    k = fr.key(0)
    ks = np.asarray(fr.split(k, 4))
    assert len({tuple(r) for r in ks}) == 4
    draws = [np.asarray(fr.bits(s, (64,))) for s in ks]
    # by the documented scheme, fold_in(k, j) is split(k, n)[j] (both use counter (0, j))
    np.testing.assert_array_equal(np.asarray(fr.fold_in(k, 2)), ks[2])
    draws += [np.asarray(fr.bits(fr.fold_in(k, d), (64,))) for d in (4, 5, 1000)]
    draws.append(np.asarray(fr.bits(fr.key(1), (64,))))
    for a in range(len(draws)):
        for b in range(a):
            # two independent 64-word streams agree on a word with probability ~64 / 2**32
            assert np.sum(draws[a] == draws[b]) == 0


def _within(value: float, expected: float, sd: float) -> None:
    assert abs(value - expected) <= SIGMAS * sd, (value, expected, sd)


def test_uniform_and_bits_statistics() -> None:
    u = np.asarray(fr.uniform(fr.key(11), (N,))).astype(np.float64)
    assert u.dtype == np.float64 and u.min() >= 0.0 and u.max() < 1.0
    _within(u.mean(), 0.5, math.sqrt(1 / 12 / N))
    # var of the sample variance ~ (mu4 - sigma^4) / N with mu4 = 1/80 for U(0, 1)
    _within(u.var(), 1 / 12, math.sqrt((1 / 80 - 1 / 144) / N))
    lo, hi = -3.5, 1.25
    v = np.asarray(fr.uniform(fr.key(12), (1000, 3), minval=lo, maxval=hi))
    assert v.shape == (1000, 3) and v.min() >= lo and v.max() < hi
    b = np.asarray(fr.bits(fr.key(13), (N,)))
    assert b.dtype == np.uint32
    for bit in (0, 15, 31):  # each bit is a fair coin
        _within(((b >> bit) & 1).mean(), 0.5, math.sqrt(0.25 / N))


def test_normal_statistics_and_ks() -> None:
    z = np.asarray(fr.normal(fr.key(21), (N,))).astype(np.float64)
    assert np.all(np.isfinite(z))
    _within(z.mean(), 0.0, math.sqrt(1 / N))
    _within(z.var(), 1.0, math.sqrt(2 / N))
    zs = np.sort(z)
    cdf = 0.5 * (1.0 + np.frompyfunc(math.erf, 1, 1)(zs / math.sqrt(2.0)).astype(np.float64))
    i = np.arange(1, N + 1)
    d = max(np.max(i / N - cdf), np.max(cdf - (i - 1) / N))
    # Kolmogorov: P(sqrt(N) D > t) ~ 2 exp(-2 t^2); t = 2.6 makes that ~3e-6
    assert d < 2.6 / math.sqrt(N), d


def test_gumbel_mean() -> None:
    g = np.asarray(fr.gumbel(fr.key(22), (N,))).astype(np.float64)
    assert np.all(np.isfinite(g))
    _within(g.mean(), 0.5772156649, math.sqrt(math.pi**2 / 6 / N))


def test_bernoulli_rate(rng: np.random.Generator) -> None:
    p = 0.3
    s = np.asarray(fr.bernoulli(fr.key(31), p, (N,)))
    assert s.dtype == np.bool_
    _within(s.mean(), p, math.sqrt(p * (1 - p) / N))
    ps = rng.uniform(0.05, 0.95, 7).astype(np.float32)
    m = np.asarray(fr.bernoulli(fr.key(32), ps, (N // 8, 7))).mean(axis=0)
    for got, want in zip(m, ps):
        _within(got, want, math.sqrt(want * (1 - want) / (N // 8)))
    assert np.asarray(fr.bernoulli(fr.key(33), ps)).shape == (7,)


def test_randint_covers_range() -> None:
    lo, hi = -3, 10
    r = np.asarray(fr.randint(fr.key(41), (N,), lo, hi))
    assert r.dtype == np.int32 and r.min() == lo and r.max() == hi - 1
    counts = np.bincount(r - lo, minlength=hi - lo)
    q = 1 / (hi - lo)
    for c in counts:
        _within(c / N, q, math.sqrt(q * (1 - q) / N))
    big = np.asarray(fr.randint(fr.key(42), (4099,), -(2**31), 2**31 - 1))
    assert big.min() < -(2**30) and big.max() > 2**30  # the full int32 range is reachable
    traced = fusec.gpu_jit(lambda k, lo, hi: fr.randint(k, (N // 16,), lo, hi))
    t = np.asarray(traced(fr.key(44), np.int32(-7), np.int32(-2)))
    np.testing.assert_array_equal(np.unique(t), np.arange(-7, -2))
    u = np.asarray(fr.randint(fr.key(43), (17,), 5, 9, dtype=np.uint32))
    assert u.dtype == np.uint32 and u.min() >= 5 and u.max() < 9


def test_categorical_frequencies(rng: np.random.Generator) -> None:
    logits = rng.standard_normal(5).astype(np.float32)
    n = 2**18
    c = np.asarray(fr.categorical(fr.key(51), logits, shape=(n,)))
    assert c.dtype == np.int32 and c.shape == (n,)
    p = np.exp(logits.astype(np.float64))
    p /= p.sum()
    freq = np.bincount(c, minlength=5) / n
    for got, want in zip(freq, p):
        _within(got, want, math.sqrt(want * (1 - want) / n))
    # batched along axis 0: one draw per column
    batch = np.asarray(fr.categorical(fr.key(52), rng.standard_normal((4, 6)).astype(np.float32),
                                          axis=0))
    assert batch.shape == (6,) and batch.min() >= 0 and batch.max() < 4


def test_permutation_and_choice(rng: np.random.Generator) -> None:
    p = np.asarray(fr.permutation(fr.key(61), 1031))
    np.testing.assert_array_equal(np.sort(p), np.arange(1031))
    assert not np.array_equal(p, np.arange(1031))
    x = rng.standard_normal((3, 29)).astype(np.float32)
    px = np.asarray(fr.permutation(fr.key(62), x, axis=1))
    np.testing.assert_array_equal(np.sort(px, axis=1), np.sort(x, axis=1))
    # the same column order for every row
    cols = [int(np.flatnonzero(x[0] == v)[0]) for v in px[0]]
    np.testing.assert_array_equal(px, x[:, cols])
    c = np.asarray(fr.choice(fr.key(63), 50, (20,), replace=False))
    assert len(set(c.tolist())) == 20 and c.min() >= 0 and c.max() < 50
    w = np.asarray(fr.choice(fr.key(64), x[0], (4, 5)))
    assert w.shape == (4, 5) and set(w.ravel().tolist()) <= set(x[0].tolist())
    probs = np.array([0.0, 0.25, 0.75], np.float32)
    cp = np.asarray(fr.choice(fr.key(65), 3, (2000,), p=probs))
    assert 0 not in cp and 300 < np.sum(cp == 1) < 700


def test_fuses_into_consumer_one_kernel(rng: np.random.Generator) -> None:
    f = fusec.gpu_jit(lambda k, x: x + fr.normal(k, x.shape))
    k = np.asarray(fr.key(3))
    x = rng.standard_normal((33, 65)).astype(np.float32)
    assert len(f.lower(k, x).kernels) == 1
    got = np.asarray(f(k, x))
    np.testing.assert_allclose(got - x, np.asarray(fr.normal(k, x.shape)), rtol=1e-6, atol=1e-6)
    g = fusec.gpu_jit(lambda k, x: fnp.where(fr.bernoulli(k, 0.9, x.shape), x / 0.9, 0.0))
    assert len(g.lower(k, x).kernels) == 1


def test_errors() -> None:
    k = fr.key(0)
    with pytest.raises(fusec.ShapeError, match="key"):
        fr.uniform(np.zeros(3, np.uint32), (4,))
    with pytest.raises(fusec.ShapeError, match="key"):
        fr.normal(np.zeros(2, np.int32), (4,))
    with pytest.raises(fusec.ShapeError, match="maxval"):
        fr.randint(k, (4,), 5, 5)
    with pytest.raises(fusec.DTypeError, match="dtype"):
        fr.uniform(k, (4,), dtype=np.int32)
    with pytest.raises(fusec.DTypeError, match="dtype"):
        fr.randint(k, (4,), 0, 3, dtype=np.float32)
    with pytest.raises(fusec.TraceError, match="shape"):
        fusec.gpu_jit(lambda key, n: fr.normal(key, (n,)))(k, np.int32(3))
    with pytest.raises(fusec.ShapeError, match="shape"):
        fr.bits(k, (2, -1))
    with pytest.raises(fusec.DTypeError, match="seed"):
        fr.key(1.5)
    with pytest.raises(fusec.ShapeError, match="replacement"):
        fr.choice(k, 3, (5,), replace=False)


def test_numpy_backend_gives_the_same_bits() -> None:
    """FUSEC_BACKEND=cpu (the numpy interpreter, in a fresh process) draws the very same words
    and uniforms as the wgpu adapter here."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import json, numpy as np, fusec.random as fr; k = fr.fold_in(fr.key(9), 4); "
            "print(json.dumps([np.asarray(fr.bits(k, (5, 7))).tolist(), "
            "np.asarray(fr.uniform(k, (11,), minval=-1.0, maxval=2.0)).tolist(), "
            "np.asarray(fr.uniform(k, (11,))).tolist()]))")
    env = {**os.environ, "FUSEC_BACKEND": "cpu"}
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    cpu_bits, cpu_uniform, cpu_unit = json.loads(out.strip().splitlines()[-1])
    k = fr.fold_in(fr.key(9), 4)
    np.testing.assert_array_equal(np.asarray(fr.bits(k, (5, 7))), np.array(cpu_bits, np.uint32))
    # (the scaling may be a fused multiply-add on a GPU: within an ulp of the range; see above)
    np.testing.assert_allclose(np.asarray(fr.uniform(k, (11,), minval=-1.0, maxval=2.0)),
                               np.array(cpu_uniform, np.float32), rtol=0, atol=3.0 * 2.0**-23)
    np.testing.assert_array_equal(np.asarray(fr.uniform(k, (11,))), np.array(cpu_unit, np.float32))
