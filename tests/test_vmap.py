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
import itertools
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
from fusec import ops
from fusec.ir import Op
from fusec.tree import flatten

# ops that only the pass pipeline creates (stages of lowered reductions, scans, scatters and
# sorts, copies, and fused kernels): a traced program never holds them (they have no type rule
# for tracing, or no fusec function binds them), so vmap needs no rule for them
LOWERING_ONLY = frozenset({Op.COPY, Op.PARTIAL, Op.SCAN_REDUCE, Op.SCAN, Op.SCATTER_ADD, Op.SCATTER_INTO,
                           Op.RADIX_HIST, Op.RADIX_SCAN, Op.RADIX_SCATTER, Op.SORT_BLOCKS,
                           Op.SORT_MERGE, Op.KERNEL})

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
            axis = c.out_axes if isinstance(c.out_axes, int) else c.out_axes[k]
            want = np.stack([np.asarray(e[k]) for e in examples], axis=axis)
            _check(f"{c.name} (output {k})", g, want, c.tol)


def _batched(rng: np.random.Generator, gen: Callable[[np.random.Generator, Any], np.ndarray],
             shape: tuple[int, ...], axis: Any, size: int) -> np.ndarray:
    """Random values of one example's ``shape`` with a batch axis of ``size`` at ``axis``."""
    if axis is not None:
        shape = list(shape)
        shape.insert(axis if axis >= 0 else len(shape) + 1 + axis, size)
    return np.asarray(gen(rng, tuple(shape)))


# --- elementwise ---------------------------------------------------------------------------------

# (per-example shapes, in_axes) per arity: the batch axis kept in place (equal shapes, equal
# axes), moved (an unbatched operand of several axes, operands of other ranks), scalars
LAYOUTS = {
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
