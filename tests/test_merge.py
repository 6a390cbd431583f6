"""Products that share their left operand merge into one product (fusec.passes.merge): against
float64 numpy, with and without biases and batches, odd sizes, NaN, and the cases left alone."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fusec
from fusec.ir import Op
from fusec.passes import merge


def _data(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _kinds(f: Any, *args: Any) -> list[str]:
    return [k.kind for k in f.lower(*args).kernels]


def _projections(x: Any, wq: Any, bq: Any, wk: Any, bk: Any, wv: Any, bv: Any) -> Any:
    # an attention block's projections, each read by more work (as heads would be)
    return (x @ wq + bq) * 2.0 - (x @ wk + bk), (x @ wv + bv) ** 2


def _reference(x: np.ndarray, wq: np.ndarray, bq: np.ndarray, wk: np.ndarray, bk: np.ndarray,
               wv: np.ndarray, bv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x64 = x.astype(np.float64)
    q, k, v = x64 @ wq + bq, x64 @ wk + bk, x64 @ wv + bv
    return q * 2.0 - k, v ** 2


@pytest.mark.parametrize("lead,d,n", [((37,), 24, 13), ((3, 37), 24, 13), ((1,), 5, 1),
                                      ((2, 3, 17), 33, 7)])
def test_projections_merge_into_one_product(rng: np.random.Generator, lead: tuple[int, ...],
                                            d: int, n: int) -> None:
    x = _data(rng, *lead, d)
    ws = [_data(rng, d, n), _data(rng, n), _data(rng, d, n), _data(rng, n),
          _data(rng, d, n + 3), _data(rng, n + 3)]
    f = fusec.gpu_jit(_projections)
    merged = merge.merge_products(f.trace(x, *ws).program)
    assert sum(e.op is Op.MATMUL for e in merged.eqns) == 1
    if x.size // d * n > 64:  # (the GPU target computes tinier products as sums over K)
        assert _kinds(f, x, *ws).count("matmul") == 1
    for got, want in zip(f(x, *ws), _reference(x, *ws)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)
    # the unfused plan keeps one kernel per product
    u = fusec.gpu_jit(_projections, fuse=False)
    assert _kinds(u, x, *ws).count("matmul") == 3


def test_products_without_biases_and_nan_stay_in_their_columns(rng: np.random.Generator) -> None:
    x = _data(rng, 29, 11)
    a, b = _data(rng, 11, 6), _data(rng, 11, 9)
    b[3, 4] = np.nan  # column 4 of x @ b is NaN; x @ a must stay finite
    a[0, 0] = np.inf
    f = fusec.gpu_jit(lambda x, a, b: (x @ a) + (x @ b)[:, :6])
    assert _kinds(f, x, a, b).count("matmul") == 1
    with np.errstate(invalid="ignore"):
        want = x.astype(np.float64) @ a + (x.astype(np.float64) @ b)[:, :6]
    got = np.asarray(f(x, a, b))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    assert np.isnan(got[:, 4]).all() and fin[:, 1:4].all()
    np.testing.assert_allclose(got[fin], want[fin], rtol=2e-5, atol=2e-5)


def test_cases_left_alone(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    x = _data(rng, 40, 8)
    ws = [_data(rng, 8, 5), _data(rng, 5), _data(rng, 8, 5), _data(rng, 5),
          _data(rng, 8, 4), _data(rng, 4)]
    # more rows than MAX_ROWS and more tiles than MAX_TILES: each product fills the GPU on its own
    monkeypatch.setattr(merge, "MAX_ROWS", 39)
    monkeypatch.setattr(merge, "MAX_TILES", 0)
    f = fusec.gpu_jit(_projections)
    assert _kinds(f, x, *ws).count("matmul") == 3
    monkeypatch.setattr(merge, "MAX_TILES", 1)  # 40 rows of 5 columns: one tile
    g = fusec.gpu_jit(_projections)
    assert _kinds(g, x, *ws).count("matmul") == 1
    monkeypatch.setattr(merge, "MAX_TILES", 0)
    monkeypatch.setattr(merge, "MAX_ROWS", 40)
    g = fusec.gpu_jit(_projections)
    assert _kinds(g, x, *ws).count("matmul") == 1

    # a product the program returns, and a weight computed in the program, are not merged
    def returned(x: Any, a: Any, b: Any, c: Any) -> Any:
        return x @ a, (x @ b) * 2.0, x @ (c * 3.0)

    a, b, c = _data(rng, 8, 5), _data(rng, 8, 6), _data(rng, 8, 7)
    h = fusec.gpu_jit(returned)
    assert _kinds(h, x, a, b, c).count("matmul") == 3
    x64 = x.astype(np.float64)
    for got, want in zip(h(x, a, b, c), (x64 @ a, (x64 @ b) * 2.0, x64 @ (c * 3.0))):
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)

    # a bias of one value (broadcast over the columns) is no bias vector: those products stay
    def scalar_bias(x: Any, a: Any, b: Any, c: Any, d: Any) -> Any:
        return (x @ a + c) * (x @ b + d)

    sb = [x, _data(rng, 8, 5), _data(rng, 8, 5), _data(rng, 1), _data(rng, 5)]
    s = fusec.gpu_jit(scalar_bias)
    assert sum(e.op is Op.MATMUL for e in merge.merge_products(s.trace(*sb).program).eqns) == 2
    xs, as_, bs, cs, ds = (np.asarray(v, np.float64) for v in sb)
    np.testing.assert_allclose(np.asarray(s(*sb)), (xs @ as_ + cs) * (xs @ bs + ds), rtol=2e-5,
                               atol=2e-5)

    # a weight of no columns joins nothing (its product is empty); the others still merge
    def empty(x: Any, a: Any, b: Any, c: Any) -> Any:
        return (x @ a) * 2.0, (x @ b).sum(), x @ c + 1.0

    ea = [x, _data(rng, 8, 5), _data(rng, 8, 0), _data(rng, 8, 3)]
    e = fusec.gpu_jit(empty)
    assert sum(op.op is Op.MATMUL for op in merge.merge_products(e.trace(*ea).program).eqns) == 2
    xe, ae, be, ce = (np.asarray(v, np.float64) for v in ea)
    got = e(*ea)
    np.testing.assert_allclose(np.asarray(got[0]), (xe @ ae) * 2.0, rtol=2e-5, atol=2e-5)
    assert float(np.asarray(got[1])) == 0.0
    np.testing.assert_allclose(np.asarray(got[2]), xe @ ce + 1.0, rtol=2e-5, atol=2e-5)

    # products with a bias and products without form groups of their own
    def mixed(x: Any, a: Any, ba: Any, b: Any, bb: Any, c: Any, d: Any) -> Any:
        return (x @ a + ba) * (x @ b + bb) - (x @ c) * (x @ d)

    args = [x, _data(rng, 8, 5), _data(rng, 5), _data(rng, 8, 5), _data(rng, 5),
            _data(rng, 8, 5), _data(rng, 8, 5)]
    m = fusec.gpu_jit(mixed)
    assert _kinds(m, *args).count("matmul") == 2
    xa, a_, ba, b_, bb, c_, d_ = (np.asarray(v, np.float64) for v in args)
    want = (xa @ a_ + ba) * (xa @ b_ + bb) - (xa @ c_) * (xa @ d_)
    np.testing.assert_allclose(np.asarray(m(*args)), want, rtol=2e-5, atol=2e-5)


def test_gradient_through_merged_projections(rng: np.random.Generator) -> None:
    x = _data(rng, 3, 10, 6)
    ws = [_data(rng, 6, 4), _data(rng, 4), _data(rng, 6, 4), _data(rng, 4),
          _data(rng, 6, 5), _data(rng, 5)]

    def loss(x: Any, *ws: Any) -> Any:
        a, b = _projections(x, *ws)
        return fusec.numpy.sum(a * a) + fusec.numpy.sum(b)

    got = np.asarray(fusec.gpu_jit(fusec.grad(loss))(x, *ws))
    wq, bq, wk, bk, wv, bv = (w.astype(np.float64) for w in ws)
    x64 = x.astype(np.float64)
    a = (x64 @ wq + bq) * 2.0 - (x64 @ wk + bk)
    v = x64 @ wv + bv
    want = (2 * a) @ (2.0 * wq - wk).T + (2 * v) @ wv.T
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
