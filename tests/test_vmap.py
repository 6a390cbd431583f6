"""fusec.vmap against a Python loop over the batch.

Every comparison runs the per-example function through ``gpu_jit`` once per example and stacks
the results (np.stack along out_axes): vmap must give what the loop gives, exactly for integers
and bools and to a few float32 roundings for floats (the batched program may fuse and reduce in
another order than the per-example one). To keep the file fast on a software adapter, the cases
of each family run as one jitted program (every case vmapped side by side) and the loop as one
jitted per-example program called once per batch index.

The op cases come from the elementwise tables the numeric tests use (valid-domain inputs, NaN
and infinities where an op must propagate them) and from fusec.numpy functions for the other
primitives; a test checks that together they call every batching rule with a batched operand.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from helpers import Delta
from test_elementwise_ext import FLOAT_CASES, INT_CASES, int_inputs
from test_numeric import TABLE

import fusec
import fusec.numpy as fnp
from fusec import ops, quant
from fusec.ir import Op
from fusec.tree import flatten

# ops that only the pass pipeline creates (stages of lowered reductions, scans, scatters and
# sorts, and fused kernels: fusec.ops.LOWERED_ONLY), and copy, which has no type rule to trace
# it with (a scatter's lowering makes its operand's buffer its own): a traced program never holds
# them, so vmap needs no rule for them
LOWERING_ONLY = ops.LOWERED_ONLY | {Op.COPY}

SIZES = (1, 3, 7)


def test_every_traced_op_has_a_batching_rule() -> None:
    """A new op in fusec.ir.Op needs a batching rule (or to be listed here as lowering-only)."""
    assert not LOWERING_ONLY & set(ops.BATCH_RULES)
    missing = set(Op) - set(ops.BATCH_RULES) - LOWERING_ONLY
    assert not missing, f"ops without a batching rule in fusec.ops.BATCH_RULES: {missing}"


ELEMENTWISE_OPS = frozenset(ops.ELEMENTWISE) | {Op.CAST, Op.IPOW}


@pytest.fixture
def rule_calls(monkeypatch: pytest.MonkeyPatch) -> set[Op]:
    """The ops whose batching rule ran (always with a batched operand) during the test."""
    called: set[Op] = set()
    for op, rule in list(ops.BATCH_RULES.items()):
        def recording(b: Any, args: Any, dims: Any, params: Any, _op: Op = op,
                      _rule: Any = rule) -> Any:
            assert any(d is not None for d in dims)
            called.add(_op)
            return _rule(b, args, dims, params)

        monkeypatch.setitem(ops.BATCH_RULES, op, recording)
    return called


# --- running cases side by side ------------------------------------------------------------------


@dataclass
class VCase:
    name: str
    fn: Callable[..., Any]  # one example
    args: list[Any]  # the batched arguments (unbatched where the axis is None)
    axes: tuple[Any, ...]  # in_axes, one int or None per argument
    size: int
    out_axes: Any = 0
    tol: tuple[float, float] = (0.0, 0.0)  # (rtol, atol) for float results; 0: equal
    kwargs: dict[str, Any] = field(default_factory=dict)


def _example(x: Any, axis: Any, b: int) -> Any:
    return x if axis is None else np.take(x, b, axis=axis)


def _check(name: str, got: Any, want: Any, tol: tuple[float, float]) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, loop gives {want.dtype}"
    assert got.shape == want.shape, f"{name}: shape {got.shape}, loop gives {want.shape}"
    if got.dtype.kind == "f" and tol != (0.0, 0.0):
        np.testing.assert_allclose(got, want, rtol=tol[0], atol=tol[1], err_msg=name)
    else:
        np.testing.assert_array_equal(got, want, err_msg=name)


def run_cases(cases: list[VCase]) -> None:
    """All ``cases`` vmapped in one jitted program, against a loop of one jitted per-example
    program (called for each batch index; cases with fewer examples repeat their last one)."""
    def batched(all_args: list[list[Any]]) -> list[Any]:
        outs = []
        for c, a in zip(cases, all_args):
            try:
                outs.append(fusec.vmap(c.fn, in_axes=c.axes, out_axes=c.out_axes)(*a))
            except Exception as exc:
                raise AssertionError(f"case {c.name}: {type(exc).__name__}: {exc}") from exc
        return outs

    for c in cases:
        sizes = {np.shape(x)[ax] for x, ax in zip(c.args, c.axes) if ax is not None}
        assert sizes == {c.size}, f"case {c.name}: batch sizes {sizes}, not {c.size}"
    got = fusec.gpu_jit(batched)([c.args for c in cases])
    loop = fusec.gpu_jit(lambda all_args: [c.fn(*a) for c, a in zip(cases, all_args)])
    per_index = [loop([[_example(x, ax, min(b, c.size - 1)) for x, ax in zip(c.args, c.axes)]
                       for c in cases]) for b in range(max(c.size for c in cases))]
    for i, c in enumerate(cases):
        got_leaves, _ = flatten(got[i])
        examples = [flatten(per_index[b][i])[0] for b in range(c.size)]
        for k, g in enumerate(got_leaves):
            axis = c.out_axes if not isinstance(c.out_axes, (tuple, list)) else c.out_axes[k]
            if axis is None:  # an output the same for every example, not stacked
                for e in examples[1:]:
                    _check(f"{c.name} (output {k}, unbatched)", e[k], examples[0][k], c.tol)
                want = np.asarray(examples[0][k])
            else:
                want = np.stack([np.asarray(e[k]) for e in examples], axis=axis)
            _check(f"{c.name} (output {k})", g, want, c.tol)


def _batched(rng: np.random.Generator, gen: Callable[[np.random.Generator, Any], np.ndarray],
             shape: tuple[int, ...], axis: Any, size: int) -> np.ndarray:
    """Random values of one example's ``shape`` with a batch axis of ``size`` at ``axis``."""
    full = list(shape)
    if axis is not None:
        full.insert(axis if axis >= 0 else len(full) + 1 + axis, size)
    return np.asarray(gen(rng, tuple(full)))


# --- elementwise ---------------------------------------------------------------------------------

# (per-example shapes, in_axes) per arity: the batch axis kept in place (equal shapes, equal
# axes), moved (an unbatched operand of several axes, operands of other ranks), scalars
Layout = tuple[tuple[tuple[int, ...], ...], tuple[Any, ...]]
LAYOUTS: dict[int, list[Layout]] = {
    1: [(((7,),), (0,)), (((3, 5),), (1,)), (((2, 3),), (-1,)), (((),), (0,))],
    2: [(((3, 5), (3, 5)), (0, 0)), (((3, 5), (5,)), (1, None)), (((5,), (2, 5)), (0, -1)),
        (((), (4,)), (None, 0)), (((3, 1), (1, 4)), (-1, 1)), (((2, 3), ()), (2, None))],
    3: [(((3, 5), (3, 5), (3, 5)), (0, 0, 0)), (((3, 1), (5,), ()), (1, None, 0)),
        (((), (4,), (2, 4)), (0, 0, None))],
}


def _flat_gen(gen: Callable[[np.random.Generator, int], np.ndarray]
              ) -> Callable[[np.random.Generator, Any], np.ndarray]:
    """A generator of n values as one of shapes."""
    return lambda rng, shape: gen(rng, int(np.prod(shape, dtype=np.int64))).reshape(shape)


def _int_gen(dtype: str) -> Callable[[np.random.Generator, Any], np.ndarray]:
    def g(rng: np.random.Generator, shape: Any) -> np.ndarray:
        n = int(np.prod(shape, dtype=np.int64))
        x, _ = int_inputs(dtype, rng, n)
        return rng.permutation(x)[:n].reshape(shape)

    return g


def _elementwise_funcs() -> list[tuple[str, Callable[..., Any], tuple[Any, ...]]]:
    """(name, fusec.numpy function, a generator per operand) for every elementwise table row."""
    out: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = []
    for op, (fn, _, gens) in TABLE.items():
        out.append((op.value, fn, gens))
    for name, case in FLOAT_CASES.items():
        out.append((name, case.fn, tuple(_flat_gen(g) for g in case.gens)))
    for dt in ("int32", "uint32"):
        for name, (fn, _) in INT_CASES.items():
            out.append((f"{name}_{dt}", fn, (_int_gen(dt), _int_gen(dt))))
        out.append((f"invert_{dt}", fnp.invert, (_int_gen(dt),)))
    floats = TABLE[Op.ADD][2][0]
    out += [
        ("astype_int32", lambda x: x.astype("int32"), (floats,)),
        ("astype_float32", lambda x: x.astype("float32"), (_int_gen("int32"),)),
        ("astype_bool", lambda x: x.astype("bool"), (_flat_gen(FLOAT_CASES["isnan"].gens[0]),)),
        ("ipow_3", lambda x: x ** 3, (floats,)),
        ("ipow_-2", lambda x: x ** -2, (floats,)),
        ("ipow_int", lambda x: x ** 5, (_int_gen("int32"),)),
        ("clip", lambda x, lo: fnp.clip(x, lo, 2.0), (floats, floats)),
        ("stop_gradient", fusec.stop_gradient, (floats,)),
    ]
    return out


def test_elementwise_ops_match_loop(rng: np.random.Generator, rule_calls: set[Op]) -> None:
    """Every elementwise row (and cast, integer powers) under each layout of the batch axes."""
    cases = []
    for i, (name, fn, gens) in enumerate(_elementwise_funcs()):
        layouts = LAYOUTS[len(gens)]
        shapes, axes = layouts[i % len(layouts)]
        size = SIZES[i % len(SIZES)]
        args = [_batched(rng, g, s, ax, size) for g, s, ax in zip(gens, shapes, axes)]
        cases.append(VCase(name, fn, args, axes, size))
    run_cases(cases)
    assert ELEMENTWISE_OPS <= rule_calls, ELEMENTWISE_OPS - rule_calls


# --- the other primitives -------------------------------------------------------------------------


def _f(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _i(rng: np.random.Generator, hi: int, *shape: int, lo: int = 0) -> np.ndarray:
    return rng.integers(lo, hi, shape).astype(np.int32)


def _special(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Floats with NaN, infinities and signed zeros among them, and repeated values."""
    x = np.round(_f(rng, *shape) * 2) / 2
    pick = rng.random(shape)
    x[pick < 0.1] = np.nan
    x[(pick >= 0.1) & (pick < 0.15)] = np.inf
    x[(pick >= 0.15) & (pick < 0.2)] = -np.inf
    x[(pick >= 0.2) & (pick < 0.25)] = -0.0
    return x.astype(np.float32)


def _perm_rows(rng: np.random.Generator, n: int, *shape: int) -> np.ndarray:
    """Distinct int32 indices into an axis of length n (a "set" scatter without duplicates)."""
    return np.stack([rng.permutation(n)[:shape[-1]] for _ in range(int(np.prod(shape[:-1])))]
                    ).reshape(shape).astype(np.int32)


SUM_TOL = (1e-5, 1e-5)


@fusec.custom_vjp
def _straight_round(x: Any, w: Any) -> Any:
    """round(x * w), differentiated as if it were x * w (a straight-through estimator)."""
    return fnp.round(x * w)


def _straight_round_bwd(res: Any, g: Any) -> tuple[Any, Any]:
    x, w = res
    gw = g * x
    return g * w, (gw.sum() if np.ndim(w) == 0 else gw)


_straight_round.defvjp(lambda x, w: (fnp.round(x * w), (x, w)), _straight_round_bwd)


def _structural_cases(rng: np.random.Generator) -> list[VCase]:
    f, i = functools.partial(_f, rng), functools.partial(_i, rng)
    C = VCase
    return [
        # reductions: the batch axis before, between and after the reduced ones
        C("sum_axis1", lambda x: fnp.sum(x, axis=1), [f(3, 4, 5)], (0,), 3, tol=SUM_TOL),
        C("sum_all", lambda x: x.sum(), [f(4, 3, 5)], (1,), 3, tol=SUM_TOL),
        C("mean_keepdims", lambda x: x.mean(axis=0, keepdims=True), [f(4, 5, 7)], (2,), 7,
          tol=SUM_TOL),
        C("max_axis0", lambda x: fnp.max(x, axis=0), [_special(rng, 4, 5, 1)], (-1,), 1),
        C("min_neg", lambda x: fnp.min(x, axis=-1), [_special(rng, 3, 4, 5)], (1,), 4),
        C("prod_int", lambda x: fnp.prod(x, axis=(0, 2)), [i(5, 2, 3, 3, 3, lo=-4)], (2,), 3),
        C("sum_int", lambda x: x.sum(axis=1), [i(100, 7, 2, 9, lo=-100)], (0,), 7),
        C("argmax", lambda x: fnp.argmax(x, axis=1), [f(3, 5, 7)], (0,), 3),
        C("all_any", lambda x: (fnp.all(x > 0, axis=0), fnp.any(x > 1)), [f(4, 3, 1)], (2,), 1),
        C("logsumexp", lambda x: fnp.logsumexp(x, axis=-1), [f(3, 7)], (0,), 3, tol=SUM_TOL),
        # matmul: batched @ unbatched (one matmul of batch x rows), both, vector forms, batched
        # per-example matmuls
        C("matmul_w", lambda x, w: x @ w, [f(3, 4, 5), f(5, 2)], (0, None), 3, tol=SUM_TOL),
        C("matmul_w_mid", lambda x, w: x @ w, [f(4, 7, 5), f(5, 3)], (1, None), 7, tol=SUM_TOL),
        C("matmul_w_last", lambda x, w: x @ w, [f(4, 5, 3), f(5, 2)], (2, None), 3,
          tol=SUM_TOL),
        C("matmul_x", lambda x, w: x @ w, [f(4, 5), f(5, 3, 2)], (None, 1), 3, tol=SUM_TOL),
        C("matmul_both", lambda x, w: x @ w, [f(1, 4, 5), f(5, 1, 3)], (0, 1), 1, tol=SUM_TOL),
        C("matvec", lambda x, v: x @ v, [f(4, 5), f(7, 5)], (None, 0), 7, tol=SUM_TOL),
        C("vecmat", lambda v, x: v @ x, [f(3, 4), f(4, 5)], (0, None), 3, tol=SUM_TOL),
        C("dot_vv", fnp.dot, [f(3, 6), f(6, 3)], (0, 1), 3, tol=SUM_TOL),
        C("matmul_batch", lambda x, w: x @ w, [f(2, 3, 3, 4), f(2, 4, 5)], (1, None), 3,
          tol=SUM_TOL),
        C("einsum", lambda x, w: fnp.einsum("ij,jk->ki", x, w), [f(3, 2, 4), f(4, 5)],
          (0, None), 3, tol=SUM_TOL),
        # movement
        C("reshape", lambda x: x.reshape(5, 3), [f(3, 7, 5)], (1,), 7),
        C("ravel", lambda x: fnp.ravel(x), [f(3, 2, 1)], (-1,), 1),
        C("transpose", lambda x: x.T, [f(3, 4, 5)], (1,), 4),
        C("transpose_perm", lambda x: fnp.transpose(x, (2, 0, 1)), [f(2, 3, 4, 3)], (2,), 4),
        C("moveaxis", lambda x: fnp.moveaxis(x, 0, -1), [f(3, 3, 5)], (0,), 3),
        C("broadcast_to", lambda x: fnp.broadcast_to(x, (4, 3, 5)), [f(3, 7, 1)], (1,), 7),
        C("broadcast_scalar", lambda x: fnp.broadcast_to(x, (2, 3)), [f(3)], (0,), 3),
        C("expand_squeeze", lambda x: fnp.squeeze(fnp.expand_dims(x, 0), 0) + x[None],
          [f(4, 1)], (1,), 1),
        C("pad", lambda x: fnp.pad(x, ((1, 2), (0, 1))), [f(3, 7, 4)], (1,), 7),
        C("pad_value", lambda x: fnp.pad(x, 2, constant_values=-1.5), [f(5, 3)], (-1,), 3),
        C("slice", lambda x: x[1:5:2, ::-1], [f(6, 3, 4)], (1,), 3),
        C("slice_int", lambda x: x[2, 1:], [i(9, 7, 3, 4)], (0,), 7),
        C("concatenate", lambda x, y: fnp.concatenate([x, y], axis=0), [f(3, 2, 4), f(3, 4)],
          (0, None), 3),
        C("stack_split", lambda x: fnp.stack(fnp.split(x, 2, axis=0), axis=1), [f(4, 1, 3)],
          (1,), 1),
        C("flip_roll", lambda x: fnp.roll(fnp.flip(x, 0), 2, axis=1), [f(3, 5, 3)], (2,), 3),
        C("tile_repeat", lambda x: fnp.repeat(fnp.tile(x, (2, 1)), 2, axis=1), [f(7, 2, 3)],
          (0,), 7),
        C("iota", lambda x: x + fnp.arange(5, dtype="float32"), [f(3, 5)], (0,), 3),
        C("tril_eye", lambda x: fnp.tril(x) + fnp.eye(4, dtype="float32"), [f(4, 4, 7)], (2,), 7),
        # gather: batched operand, batched indices, both; negative and out-of-range indices
        C("gather_x", lambda x, j: x[j], [f(3, 6, 2), i(6, 4)], (0, None), 3),
        C("gather_j", lambda x, j: x[j], [f(6, 2), i(6, 4, 7, lo=-6)], (None, 1), 7),
        C("gather_both", lambda x, j: x[:, j], [f(4, 3, 5), i(5, 2, 3, lo=-9)], (1, -1), 3),
        C("take", lambda x, j: fnp.take(x, j, axis=1), [f(3, 4, 5), i(5, 3, 2)], (0, 0), 3),
        C("take_along_axis", lambda x, j: fnp.take_along_axis(x, j, axis=0),
          [f(1, 4, 3), i(4, 1, 2, 3)], (0, 0), 1),
        C("gather_scalar", lambda x, j: x[j], [f(7, 5), i(5, 7)], (0, 0), 7),
        C("diagonal", lambda x: fnp.diagonal(x), [f(3, 3, 4)], (-1,), 4),
        # scatter: each of operand, updates and indices batched alone, and all together
        C("scatter_add_x", lambda x, j, v: x.at[j].add(v), [f(3, 5), i(5, 4), f(4)],
          (0, None, None), 3, tol=SUM_TOL),
        C("scatter_add_v", lambda x, j, v: x.at[j].add(v), [f(5), i(5, 6), f(6, 3)],
          (None, None, 1), 3, tol=SUM_TOL),
        C("scatter_add_j", lambda x, j, v: x.at[j].add(v), [f(5, 2), i(5, 7, 3), f(3, 2)],
          (None, 0, None), 7, tol=SUM_TOL),
        C("scatter_set_all", lambda x, j, v: x.at[j].set(v),
          [f(3, 6, 2), _perm_rows(rng, 6, 3, 4), f(4, 3, 2)], (0, 0, 1), 3),
        C("scatter_mul", lambda x, j, v: x.at[j, 1].multiply(v), [f(4, 3, 7), i(4, 2, 7), f(2)],
          (2, 1, None), 7, tol=SUM_TOL),
        C("scatter_minmax", lambda x, j, v: (x.at[j].min(v), x.at[j].max(v)),
          [_special(rng, 1, 6), i(6, 1, 8, lo=-8), _special(rng, 1, 8)], (0, 0, 0), 1),
        C("scatter_scalar", lambda x, j: x.at[j].add(1.0), [f(3, 5), i(5, 3)], (0, 0), 3),
        C("scatter_int", lambda x, j, v: x.at[j].add(v), [i(9, 7, 4), i(4, 7, 6), i(9, 7, 6)],
          (0, 0, 0), 7),
        # scans: the batch axis before and after the scanned one
        C("cumsum", lambda x: fnp.cumsum(x, axis=0), [f(3, 9)], (0,), 3, tol=SUM_TOL),
        C("cumsum_mid", lambda x: fnp.cumsum(x, axis=1), [f(4, 7, 5)], (1,), 7, tol=SUM_TOL),
        C("cumprod", lambda x: fnp.cumprod(x, axis=0), [f(6, 3)], (1,), 3, tol=SUM_TOL),
        C("cummax_rev", lambda x: fnp.flip(fnp.cummax(fnp.flip(x, -1), axis=-1), -1),
          [_special(rng, 2, 5, 1)], (-1,), 1),
        C("cummin_int", lambda x: fnp.cummin(x, axis=0), [i(50, 3, 8, lo=-50)], (0,), 3),
        # sorts: the batch axis last (moved) and elsewhere (kept)
        C("sort_last", fnp.sort, [_special(rng, 6, 7)], (-1,), 7),
        C("sort_first", fnp.sort, [_special(rng, 3, 5)], (0,), 3),
        C("sort_axis0", lambda x: fnp.sort(x, axis=0), [f(4, 3, 5)], (1,), 3),
        C("sort_desc", lambda x: fnp.sort(x, descending=True), [i(9, 3, 7, lo=-9)], (0,), 3),
        C("argsort", fnp.argsort, [_special(rng, 5, 7)], (1,), 7),
        C("argsort_first", fnp.argsort, [i(4, 3, 6)], (0,), 3),
        C("top_k", lambda x: fusec.lax.top_k(x, 3), [f(1, 6)], (0,), 1),
        # searchsorted: the sorted array batched (a count per row) or shared; NaN, infinities,
        # signed zeros and ties in both
        C("searchsorted_v", lambda a, v: fnp.searchsorted(a, v), [np.sort(_special(rng, 9)),
                                                                  _special(rng, 3, 4)],
          (None, 0), 3),
        C("searchsorted_a", lambda a, v: fnp.searchsorted(a, v, side="right"),
          [np.sort(_special(rng, 7, 9), axis=1), _special(rng, 5)], (0, None), 7),
        C("searchsorted_both", lambda a, v: (fnp.searchsorted(a, v),
                                             fnp.searchsorted(a, v, side="right")),
          [np.sort(_special(rng, 8, 3), axis=0), _special(rng, 2, 3, 4)], (1, 1), 3),
        C("searchsorted_int", lambda a, v: fnp.searchsorted(a, v, side="right"),
          [np.sort(i(9, 3, 11), axis=1), i(11, 3, 5)], (0, 0), 3),
        C("searchsorted_bool", lambda a, v: fnp.searchsorted(a, v),
          [np.sort(rng.random((3, 6)) < 0.5, axis=1), rng.random((3, 2)) < 0.5], (0, 0), 3),
        # a custom_vjp function's marker (its derivative: test_custom_vjp_under_vmap_and_grad)
        C("custom_vjp", lambda x: _straight_round(x, 2.0) - x, [f(3, 4)], (0,), 3),
        # quantized weights: a stack of matrices' words (the batch axis between their rows and
        # their words), each dequantised
        C("dequant", lambda d: quant.dequantize(quant.QuantizedMatrix("q8_0", (3, 64), d)),
          [np.stack([quant.quantize(f(3, 64), "q8_0").data for _ in range(4)], axis=1)],
          (1,), 4),
        # compiled loops (fusec.lax): the batch axis moved to the front of the carries; a carry
        # that only an invariant batches; a while loop whose examples stop at different times
        C("fori_loop", lambda x, w: fusec.lax.fori_loop(0, 6, lambda k, c: c * w + k, x),
          [f(4, 3), f(4)], (1, None), 3, tol=SUM_TOL),
        C("scan_xs", lambda x: fusec.lax.scan(lambda c, r: (c + r, c * r), 0.0, x),
          [f(7, 3)], (1,), 3, tol=SUM_TOL),
        C("while_loop", lambda n: fusec.lax.while_loop(
            lambda s: s[0] < n, lambda s: (s[0] + 1, s[1] * 2), (0, 1)), [i(9, 3)], (0,), 3),
        # where, an elementwise op of three operands, under movement
        C("where_mixed", lambda c, x: fnp.where(c, x.T, 0.0), [rng.random((3, 4)) < 0.5,
                                                                f(4, 3, 3)], (None, 2), 3),
    ]


def test_other_primitives_match_loop(rng: np.random.Generator,
                                     rule_calls: set[Op]) -> None:
    """Reductions, matmul, movement, gather, scatter, scans, sorts and searchsorted, each rule
    along the paths it takes (batch axis kept or moved, unbatched operands broadcast)."""
    run_cases(_structural_cases(rng))
    untested = set(ops.BATCH_RULES) - rule_calls - ELEMENTWISE_OPS - {Op.IOTA}
    # iota has no operand, so it is never batched
    assert not untested, f"batching rules no case ran: {untested}"


# --- axes, pytrees, composition -------------------------------------------------------------------


def test_in_axes_and_out_axes(rng: np.random.Generator) -> None:
    """Negative axes, None, and out_axes moving the batch axis anywhere in each output."""
    f = functools.partial(_f, rng)

    def two(x: Any, y: Any) -> Any:
        return x * y.sum(), fnp.tanh(x).T

    def unbatched_out(x: Any, w: Any) -> Any:
        return x @ w, w * 2.0

    C = VCase
    run_cases([
        C("out_1", lambda x: x * 2.0, [f(3, 4, 5)], (0,), 3, out_axes=1),
        C("out_-1", lambda x: fnp.exp(x), [f(4, 7, 5)], (1,), 7, out_axes=-1),
        C("out_-2", lambda x: x[::-1], [f(4, 5, 3)], (-1,), 3, out_axes=-2),
        C("out_tuple", two, [f(3, 4, 3), f(4, 3)], (-1, 1), 3, out_axes=(1, 0)),
        C("out_none", unbatched_out, [f(3, 2, 4), f(4, 5)], (0, None), 3, out_axes=(2, None)),
        C("in_none_first", lambda w, x: w - x, [f(5), f(1, 5)], (None, 0), 1, out_axes=-1),
        C("out_broadcast", lambda x, w: (x + 1.0, w), [f(7, 2), f(2, 3)], (0, None), 7,
          out_axes=(0, 1)),
        C("identity", lambda x: x, [f(3, 7, 2)], (1,), 7, out_axes=2),
    ])


def test_pytree_arguments_and_outputs(rng: np.random.Generator) -> None:
    """in_axes and out_axes as pytree prefixes: a dict of axes for a dict argument, one axis for
    a whole subtree; outputs in dicts and tuples."""
    w, bias = _f(rng, 4, 3), _f(rng, 7, 3)
    xs, ts = _f(rng, 7, 4), _f(rng, 3, 7)

    def layer(params: Any, batch: Any) -> Any:
        x, t = batch
        y = fnp.tanh(x @ params["w"] + params["b"])
        return {"y": y, "err": ((y - t) ** 2).sum(), "w": params["w"]}

    f = fusec.vmap(layer, in_axes=({"w": None, "b": 0}, (0, 1)),
                   out_axes={"y": 1, "err": 0, "w": None})
    for run in (f, fusec.gpu_jit(f)):
        got = run({"w": w, "b": bias}, (xs, ts))
        assert sorted(got) == ["err", "w", "y"]
        per = [fusec.gpu_jit(layer)({"w": w, "b": bias[k]}, (xs[k], ts[:, k])) for k in range(7)]
        _check("y", got["y"], np.stack([np.asarray(p["y"]) for p in per], axis=1), SUM_TOL)
        _check("err", got["err"], np.stack([np.asarray(p["err"]) for p in per]), SUM_TOL)
        _check("w", got["w"], w, (0.0, 0.0))
    # one axis for a whole argument tree; a list of axes for a list argument
    g = fusec.vmap(lambda ps, qs: ps[0] * ps[1] + qs[0], in_axes=[0, [None]])
    a, b, c = _f(rng, 3, 2), _f(rng, 3, 2), _f(rng, 2)
    _check("prefix", g((a, b), [c]), a * b + c, (1e-6, 1e-6))


def test_keyword_arguments_and_scalars(rng: np.random.Generator) -> None:
    """Keyword arguments are batched along axis 0 (as in JAX); Python scalars with in_axes None
    stay weakly typed."""
    x, s = _f(rng, 3, 4), _f(rng, 3)
    f = fusec.vmap(lambda x, scale: x * scale)
    _check("kwargs", f(x, scale=s), x * s[:, None], (1e-6, 0.0))
    g = fusec.vmap(lambda x, k: x * k, in_axes=(0, None))
    ints = np.arange(6, dtype=np.int32).reshape(3, 2)
    out = g(ints, 3)
    _check("weak int", out, ints * np.int32(3), (0.0, 0.0))
    _check("weak float", g(x, 0.5), x * np.float32(0.5), (0.0, 0.0))
    # a Python scalar output broadcast along the batch, weakly typed like the scalar
    h = fusec.gpu_jit(lambda x: fusec.vmap(lambda r: 2)(x) + np.zeros(3, np.uint32))
    got = np.asarray(h(x))
    assert got.dtype == np.uint32 and got.tolist() == [2, 2, 2]


def test_axis_size_without_batched_arguments(rng: np.random.Generator) -> None:
    w = _f(rng, 2, 3)
    f = fusec.vmap(lambda w: fnp.sin(w), in_axes=None, axis_size=5)
    _check("broadcast", f(w), np.broadcast_to(np.asarray(fusec.gpu_jit(fnp.sin)(w)), (5, 2, 3)),
           (0.0, 0.0))
    g = fusec.vmap(lambda: fnp.arange(4), axis_size=3, out_axes=1)
    _check("no args", g(), np.broadcast_to(np.arange(4, dtype=np.int32)[:, None], (4, 3)),
           (0.0, 0.0))
    # axis_size that agrees with the arguments is allowed
    x = _f(rng, 3, 2)
    _check("agrees", fusec.vmap(lambda x: -x, axis_size=3)(x), -x, (0.0, 0.0))


def test_empty_batch() -> None:
    """A batch of no examples gives results with a batch axis of length 0."""
    x = np.zeros((0, 3), np.float32)
    w = np.ones((3, 2), np.float32)
    outs = fusec.vmap(lambda r: (fnp.tanh(r), r.sum(), r @ w, fnp.sort(r), r[np.array([2, 0])]))(x)
    assert [np.asarray(o).shape for o in outs] == [(0, 3), (0,), (0, 2), (0, 3), (0, 2)]


def test_nested_vmap(rng: np.random.Generator) -> None:
    """vmap(vmap(f)) over two axes: every (i, j) pair, as a double loop gives."""
    xs, ys = _f(rng, 3, 4), _f(rng, 7, 4)

    def f(x: Any, y: Any) -> Any:
        return fnp.dot(x, y) + fnp.sin(x).sum() * y[0]

    inner = fusec.vmap(f, in_axes=(None, 0))          # one x, every y
    outer = fusec.vmap(inner, in_axes=(0, None))      # every x
    one = fusec.gpu_jit(f)
    want = np.array([[np.asarray(one(x, y)) for y in ys] for x in xs])
    got = outer(xs, ys)
    _check("nested", got, want, SUM_TOL)
    # the other nesting order, the outer batch axis placed second: out[i, j] again
    swapped = fusec.vmap(fusec.vmap(f, in_axes=(0, None), out_axes=0), in_axes=(None, 0),
                         out_axes=1)
    _check("nested, out_axes", swapped(xs, ys), want, SUM_TOL)
    # three levels: a batch of batches of batches
    zs = _f(rng, 2, 3, 1, 4)
    triple = fusec.vmap(fusec.vmap(fusec.vmap(lambda z: fnp.cumsum(z) * z[-1])))
    zw = np.asarray(fusec.gpu_jit(lambda z: fnp.cumsum(z) * z[-1])(zs.reshape(-1, 4)[0]))
    got3 = np.asarray(triple(zs))
    assert got3.shape == (2, 3, 1, 4)
    np.testing.assert_allclose(got3[0, 0, 0], zw, rtol=1e-6)
    want3 = np.cumsum(zs, axis=-1) * zs[..., -1:]
    np.testing.assert_allclose(got3, want3, rtol=1e-5, atol=1e-6)


def test_jit_of_vmap_and_vmap_of_jit(rng: np.random.Generator) -> None:
    """gpu_jit(vmap(f)), vmap(gpu_jit(f)) (the inner jit inlines) and eager vmap agree; eager
    vmap compiles once per signature."""
    x, w = _f(rng, 7, 5), _f(rng, 5, 3)

    def f(x: Any, w: Any) -> Any:
        return fnp.maximum(x @ w, 0.0).sum() + fnp.sort(x)[0]

    want = np.stack([np.asarray(fusec.gpu_jit(f)(r, w)) for r in x])
    jf = fusec.gpu_jit(f)
    variants = {
        "eager": fusec.vmap(f, in_axes=(0, None)),
        "jit(vmap)": fusec.gpu_jit(fusec.vmap(f, in_axes=(0, None))),
        "vmap(jit)": fusec.vmap(jf, in_axes=(0, None)),
        "jit(vmap(jit))": fusec.gpu_jit(fusec.vmap(jf, in_axes=(0, None))),
    }
    for name, g in variants.items():
        out = g(x, w)
        assert isinstance(out, fusec.Array), name
        _check(name, out, want, SUM_TOL)
    assert jf._traces == 0  # inlined into the vmapped trace, never compiled on its own
    eager = variants["eager"]
    with Delta() as d:
        eager(x, w)
        fusec.vmap(f, in_axes=(0, None))(fusec.device_put(x), w)  # a new vmap of the same f
    assert (d.traces, d.lowerings, d.pipelines_compiled) == (0, 0, 0)


def test_batched_program_fuses(rng: np.random.Generator) -> None:
    """An elementwise chain vmapped over axis 1 is one kernel, as the chain itself is."""
    x = _f(rng, 4, 7, 5)

    def chain(v: Any) -> Any:
        return fnp.tanh(v * 2.0 + 1.0) - fnp.exp(-v)

    lowered = fusec.gpu_jit(fusec.vmap(chain, in_axes=1)).lower(x)
    assert len(lowered.kernels) == 1
    # a row reduction vmapped over rows is one reduction kernel
    red = fusec.gpu_jit(fusec.vmap(lambda r: fnp.exp(r - r.max()).sum())).lower(_f(rng, 9, 33))
    assert len(red.kernels) <= len(fusec.gpu_jit(lambda r: fnp.exp(r - r.max()).sum())
                                   .lower(_f(rng, 33)).kernels)


def test_closing_over_outer_values(rng: np.random.Generator) -> None:
    """A vmapped function may use values of the enclosing trace (unbatched there), values of an
    enclosing vmap (batched by it), and concrete arrays."""
    x, ys, c = _f(rng, 4), _f(rng, 3, 4), _f(rng, 4)
    dev = fusec.device_put(_f(rng, 4))

    @fusec.gpu_jit
    def g(x: Any, ys: Any) -> Any:
        s = fnp.sin(x)
        return fusec.vmap(lambda y: y * s + x.sum() + c - dev)(ys)

    want = ys * np.sin(x.astype(np.float64)) + x.sum() + c - np.asarray(dev)
    _check("outer tracer", g(x, ys), want.astype(np.float32), (1e-5, 1e-5))

    # the inner function closes over the outer vmap's per-example value
    xs, zs = _f(rng, 7, 4), _f(rng, 3, 4)
    h = fusec.vmap(lambda x: fusec.vmap(lambda z: fnp.dot(x, z))(zs))
    _check("outer vmap value", h(xs), xs @ zs.T, SUM_TOL)
    h2 = fusec.vmap(lambda z: fusec.vmap(lambda x: fnp.dot(x, z))(xs), in_axes=0, out_axes=1)
    _check("outer vmap value, out_axes", h2(zs), xs @ zs.T, SUM_TOL)


# --- errors ---------------------------------------------------------------------------------------


def _raises(exc: type[Exception], *words: str) -> Any:
    class Check:
        def __enter__(self) -> None:
            self.ctx = pytest.raises(exc)
            self.info = self.ctx.__enter__()

        def __exit__(self, *a: Any) -> bool:
            handled = self.ctx.__exit__(*a)
            msg = str(self.info.value)
            for w in words:
                assert w in msg, f"{w!r} not in: {msg}"
            assert isinstance(self.info.value, fusec.FusecError)
            return bool(handled)

    return Check()


def test_errors_name_the_argument() -> None:
    x, y = np.zeros((3, 4), np.float32), np.zeros((5, 4), np.float32)
    two = lambda x, y: x + y  # noqa: E731
    for wrap in (lambda f: f, fusec.gpu_jit):  # eagerly and inside a trace
        with _raises(fusec.ShapeError, "'x'", "'y'", "3", "5"):
            wrap(fusec.vmap(two))(x, y)
        with _raises(fusec.ShapeError, "'y'", "axis 2", "(3, 4)"):
            wrap(fusec.vmap(two, in_axes=(0, 2)))(x, y[:3])
        with _raises(fusec.ShapeError, "in_axes has 3 entries", "2 positional"):
            wrap(fusec.vmap(two, in_axes=(0, 0, 0)))(x, x)
        with _raises(fusec.ShapeError, "no argument is batched", "axis_size"):
            wrap(fusec.vmap(two, in_axes=None))(x, x)
        with _raises(fusec.ShapeError, "axis_size is 4", "'x'", "3"):
            wrap(fusec.vmap(two, axis_size=4))(x, x)
        with _raises(fusec.ShapeError, "'p'", "{'a': 0}", "{'b': *}"):
            wrap(fusec.vmap(lambda p: p["b"], in_axes=({"a": 0},)))({"b": x})
        with _raises(fusec.ShapeError, "argument 'x'", "not a container"):
            wrap(fusec.vmap(lambda x: x, in_axes=((0, 1),)))(x)
        with _raises(fusec.ShapeError, "'p['w']'", "axis -3"):
            wrap(fusec.vmap(lambda p: p["w"], in_axes=({"w": -3},)))({"w": x})
        with _raises(fusec.ShapeError, "'s'", "0 axes"):
            wrap(fusec.vmap(lambda x, s: x * s))(x, 2.0)
        with _raises(fusec.ShapeError, "out_axes is None", "output"):
            wrap(fusec.vmap(lambda x: x * 2, out_axes=None))(x)
        with _raises(fusec.ShapeError, "out_axes gives axis 2", "output"):
            wrap(fusec.vmap(lambda x: x.sum(), out_axes=2))(x)
        with _raises(fusec.ShapeError, "out_axes", "(*, *)"):
            wrap(fusec.vmap(lambda x: (x, x), out_axes=(0, 0, 0)))(x)
    with _raises(fusec.TraceError, "in_axes"):
        fusec.vmap(two, in_axes="x")
    with _raises(fusec.TraceError, "out_axes"):
        fusec.vmap(two, out_axes=(0, 1.5))
    with _raises(fusec.TraceError, "axis_size"):
        fusec.vmap(two, axis_size=-1)


# --- with autodiff --------------------------------------------------------------------------------


def _loss(params: Any, x: Any, y: Any) -> Any:
    """Softmax cross-entropy of a one-layer tanh network on one example."""
    h = fnp.tanh(x @ params["w"] + params["b"])
    logits = h @ params["v"]
    return fnp.logsumexp(logits) - logits[y]


def _params(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"w": _f(rng, 5, 4) * 0.5, "b": _f(rng, 4) * 0.1, "v": _f(rng, 4, 3) * 0.5}


def test_per_example_gradients(rng: np.random.Generator) -> None:
    """jit(vmap(grad(loss))): one gradient per example, as a loop of jit(grad(loss)) gives."""
    params, xs, ys = _params(rng), _f(rng, 7, 5), _i(rng, 3, 7)
    per_example = fusec.gpu_jit(fusec.vmap(fusec.grad(_loss), in_axes=(None, 0, 0)))
    got = per_example(params, xs, ys)
    one = fusec.gpu_jit(fusec.grad(_loss))
    loop = [one(params, xs[k], ys[k]) for k in range(7)]
    for name in params:
        want = np.stack([np.asarray(g[name]) for g in loop])
        _check(f"grad {name}", got[name], want, SUM_TOL)
    # value_and_grad under vmap, eagerly, batched along another axis
    vg = fusec.vmap(fusec.value_and_grad(_loss), in_axes=(None, 1, 0), out_axes=(0, -1))
    values, grads = vg(params, xs.T.copy(), ys)
    for k in range(7):
        v, g = fusec.gpu_jit(fusec.value_and_grad(_loss))(params, xs[k], ys[k])
        _check("value", np.asarray(values)[k], np.asarray(v), SUM_TOL)
        _check("grad w, out_axes -1", np.asarray(grads["w"])[..., k], np.asarray(g["w"]),
               SUM_TOL)


def test_grad_of_a_function_using_vmap(rng: np.random.Generator) -> None:
    """grad through vmap: the batched equations are differentiated like any others. The mean
    loss's gradient is the mean of the per-example ones."""
    params, xs, ys = _params(rng), _f(rng, 3, 5), _i(rng, 3, 3)

    def mean_loss(p: Any, xs: Any, ys: Any) -> Any:
        return fusec.vmap(_loss, in_axes=(None, 0, 0))(p, xs, ys).mean()

    got = fusec.gpu_jit(fusec.grad(mean_loss))(params, xs, ys)
    eager = fusec.grad(mean_loss)(params, xs, ys)
    one = fusec.gpu_jit(fusec.grad(_loss))
    loop = [one(params, xs[k], ys[k]) for k in range(3)]
    for name in params:
        want = np.mean([np.asarray(g[name]) for g in loop], axis=0)
        _check(f"grad {name}", got[name], want, SUM_TOL)
        _check(f"eager grad {name}", eager[name], want, SUM_TOL)
    # the gradient with respect to the batched argument: each example's own
    gx = fusec.gpu_jit(fusec.grad(mean_loss, argnums=1))(params, xs, ys)
    want_x = np.stack([np.asarray(fusec.gpu_jit(fusec.grad(_loss, argnums=1))(
        params, xs[k], ys[k])) / 3 for k in range(3)])
    _check("grad xs", gx, want_x, SUM_TOL)


def test_custom_vjp_under_vmap_and_grad(rng: np.random.Generator) -> None:
    """A custom_vjp function inside vmap keeps its own derivative under grad (here a
    straight-through round, whose true derivative is zero almost everywhere): batched
    arguments get their examples' cotangents, a shared one their sum; and vmap of grad."""
    xs, w = _f(rng, 7, 3), np.float32(1.7)
    w_arr = np.full((3,), w, np.float32)

    def total(xs: Any, w: Any) -> Any:
        return fusec.vmap(_straight_round, in_axes=(0, None))(xs, w).sum()

    gx, gw = fusec.gpu_jit(fusec.grad(total, argnums=(0, 1)))(xs, w_arr)
    _check("custom grad x", gx, np.broadcast_to(w_arr, xs.shape), (1e-6, 0.0))
    _check("custom grad w (summed over the batch)", gw, xs.sum(axis=0), SUM_TOL)
    # nested: the backward function vmapped twice
    xs3 = _f(rng, 2, 3, 3)
    nested = fusec.grad(lambda x: fusec.vmap(fusec.vmap(
        lambda r: _straight_round(r, 3.0)))(x).sum())
    _check("custom grad, nested vmap", fusec.gpu_jit(nested)(xs3),
           np.full(xs3.shape, 3.0, np.float32), (0.0, 0.0))
    # vmap of grad: the custom backward function runs per example
    per = fusec.gpu_jit(fusec.vmap(fusec.grad(lambda x, w: (_straight_round(x, w) ** 2).sum(),
                                              argnums=1), in_axes=(0, None)))(xs, w_arr)
    want = np.stack([np.asarray(fusec.gpu_jit(fusec.grad(
        lambda x, w: (_straight_round(x, w) ** 2).sum(), argnums=1))(r, w_arr)) for r in xs])
    _check("vmap(grad) through custom_vjp", per, want, SUM_TOL)
    # values: the forward function as written
    _check("custom value", fusec.vmap(_straight_round, in_axes=(0, None))(xs, w_arr),
           np.round(xs * w_arr), (0.0, 0.0))
