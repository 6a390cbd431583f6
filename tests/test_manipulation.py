"""Rearranging arrays (fusec.numpy.manipulation and the axis functions of fusec.numpy.shapes)
against numpy, inside gpu_jit and eagerly, on random inputs of odd sizes (1, 2, 7, 33) and
several axes, negative ones included.

These functions only move values, so every result must equal numpy's bit for bit (NaN included,
which ``assert_array_equal`` treats as equal to NaN). Many cases share one jitted function to keep
the number of compiles, and the run time, small.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fusec
import fusec.numpy as fnp
from fusec import ShapeDtype as S
from fusec import nn
from fusec.errors import DTypeError, ShapeError, TraceError

pytestmark = pytest.mark.filterwarnings("ignore:fusec.*has been traced:RuntimeWarning")


def rand(rng: np.random.Generator, shape: tuple[int, ...], dt: Any = np.float32,
         special: bool = True) -> np.ndarray:
    """Random values of ``dt``; float arrays of 4 or more elements hold a NaN and a -inf (unless
    ``special`` is False)."""
    x = rng.standard_normal(shape) * 9
    if np.dtype(dt) == np.bool_:
        return x > 0
    x = x.astype(dt)
    if special and np.dtype(dt) == np.float32 and x.size > 3:
        x.flat[1], x.flat[-2] = np.nan, -np.inf  # values are moved, never computed
    return x


def check(got: Any, ref: np.ndarray, what: str = "") -> None:
    got_np = np.asarray(got)
    assert got_np.dtype == ref.dtype, (what, got_np.dtype, ref.dtype)
    assert got_np.shape == np.shape(ref), (what, got_np.shape, np.shape(ref))
    np.testing.assert_array_equal(got_np, ref, err_msg=what)


def check_all(gots: Any, refs: list[np.ndarray], whats: list[str]) -> None:
    gots = list(gots)
    assert len(gots) == len(refs)
    for g, r, w in zip(gots, refs, whats):
        check(g, r, w)


def n_kernels(fn: Callable[..., Any], *specs: S) -> int:
    return len(fusec.gpu_jit(fn).lower(*specs).kernels)


# --- concatenate, stack ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(7,), (2, 33), (33, 1, 7)])
def test_concatenate_every_axis(rng, shape):
    nd = len(shape)
    cases = []  # (axis, pieces)
    for axis in list(range(-nd, nd)):
        pieces = []
        for n in (1, 2, 7):
            s = list(shape)
            s[axis] = n
            pieces.append(rand(rng, tuple(s)))
        cases.append((axis, pieces))
    flat = [a for _, ps in cases for a in ps]

    def f(*arrays):
        it = iter(arrays)
        return [fnp.concatenate([next(it) for _ in range(3)], axis=axis) for axis, _ in cases]

    refs = [np.concatenate(ps, axis=axis) for axis, ps in cases]
    whats = [f"axis {axis}" for axis, _ in cases]
    check_all(fusec.gpu_jit(f)(*flat), refs, whats)
    axis, pieces = cases[-1]
    check(fnp.concatenate(pieces, axis=axis), refs[-1], "eager")


def test_concatenate_dtypes_none_axis_and_edge_cases(rng):
    f32, i32, u32, b = (rand(rng, (2, 7), dt, special=False)
                        for dt in (np.float32, np.int32, np.uint32, bool))
    empty = np.zeros((2, 0), np.float32)

    def f(f32, i32, u32, b, empty):
        return (fnp.concatenate([i32, f32], axis=1),  # int with float -> float32
                fnp.concatenate([b, i32]),  # bool with int -> int32
                fnp.concatenate([u32, i32], axis=-1),  # JAX: int32 (numpy would give int64)
                fnp.concatenate([b, b]),
                fnp.concatenate([f32, i32.T], axis=None),
                fnp.concatenate([f32, empty, f32], axis=1),
                fnp.concatenate([f32]),
                fnp.concatenate([f32, i32], dtype=np.int32),
                fnp.concatenate([empty, empty], axis=1))

    refs = [np.concatenate([i32, f32], axis=1).astype(np.float32),  # numpy: float64
            np.concatenate([b, i32]),
            np.concatenate([u32, i32], axis=-1).astype(np.int32),
            np.concatenate([b, b]),
            np.concatenate([f32, i32.T], axis=None).astype(np.float32),
            np.concatenate([f32, empty, f32], axis=1),
            f32,
            np.concatenate([f32.astype(np.int32), i32]),
            np.zeros((2, 0), np.float32)]
    check_all(fusec.gpu_jit(f)(f32, i32, u32, b, empty), refs, [str(i) for i in range(9)])
    check(fnp.concatenate((i32, u32, f32), axis=0),
          np.concatenate((i32, u32, f32)).astype(np.float32), "eager, three dtypes")


def test_concatenate_then_relu_is_one_kernel(rng):
    f = lambda a, b, c: nn.relu(fnp.concatenate([a, b, c], axis=-1))  # noqa: E731
    assert n_kernels(f, S((7, 2)), S((7, 1)), S((7, 33))) == 1
    # (no NaN: relu's NaN handling is not what this test is about)
    a, b, c = (rand(rng, (7, n), special=False) for n in (2, 1, 33))
    check(fusec.gpu_jit(f)(a, b, c), np.maximum(np.concatenate([a, b, c], -1), 0))


def test_concatenate_of_many_pieces(rng):
    # more pieces than a kernel may bind buffers on some devices: the planner splits it
    pieces = [rand(rng, (2, 3)) for _ in range(40)]
    got = fusec.gpu_jit(lambda *a: fnp.concatenate(a, axis=1) * 2)(*pieces)
    check(got, np.concatenate(pieces, axis=1) * 2)


def test_concatenate_errors():
    a, b = np.zeros((2, 3), np.float32), np.zeros((4, 5), np.float32)
    with pytest.raises(ShapeError, match=r"concatenate along axis 0: array 0 has shape \(2, 3\) "
                                         r"and array 1 has shape \(4, 5\).*dimension 1: 3 vs 5"):
        fnp.concatenate([a, b])
    with pytest.raises(ShapeError, match=r"along axis 1: .*dimension 0: 2 vs 4"):
        fusec.gpu_jit(lambda x, y: fnp.concatenate([x, y], axis=-1))(a, b)
    with pytest.raises(ShapeError, match="same number of dimensions"):
        fnp.concatenate([a, np.zeros(3, np.float32)])
    with pytest.raises(ShapeError, match="0-d; zero-dimensional arrays cannot be concatenated"):
        fnp.concatenate([np.float32(1), np.float32(2)])
    with pytest.raises(ShapeError, match="need at least one array"):
        fusec.gpu_jit(lambda: fnp.concatenate([]))()
    with pytest.raises(ShapeError, match="concatenate's axis 2 is out of bounds"):
        fnp.concatenate([a, a], axis=2)


@pytest.mark.parametrize("shape", [(1,), (7, 2), (2, 33, 1)])
def test_stack_and_friends(rng, shape):
    xs = [rand(rng, shape) for _ in range(3)]
    nd = len(shape)
    axes = list(range(-nd - 1, nd + 1))
    v1 = [rand(rng, (7,)), rand(rng, (7,))]

    def f(*arrays):
        a = arrays[:3]
        return ([fnp.stack(a, axis=k) for k in axes]
                + [fnp.hstack(a), fnp.vstack(a), fnp.dstack(a), fnp.column_stack(a[:2]),
                   fnp.hstack(arrays[3:]), fnp.vstack(arrays[3:]), fnp.column_stack(arrays[3:])])

    refs = ([np.stack(xs, axis=k) for k in axes]
            + [np.hstack(xs), np.vstack(xs), np.dstack(xs), np.column_stack(xs[:2]),
               np.hstack(v1), np.vstack(v1), np.column_stack(v1)])
    whats = [f"stack axis {k}" for k in axes] + ["hstack", "vstack", "dstack", "column_stack",
                                                 "hstack 1-d", "vstack 1-d", "column_stack 1-d"]
    check_all(fusec.gpu_jit(f)(*xs, *v1), refs, whats)
    check(fnp.stack(xs, axis=-1), np.stack(xs, axis=-1), "eager")
    check(fnp.stack(np.stack(xs), axis=1), np.stack(xs, axis=1), "stack of an array's rows")


def test_stack_errors():
    with pytest.raises(ShapeError, match=r"stack: all arrays must have the same shape; array 0 "
                                         r"has shape \(2,\) and array 1 has shape \(3,\)"):
        fnp.stack([np.zeros(2, np.float32), np.zeros(3, np.float32)])
    with pytest.raises(ShapeError, match="stack's axis 3 is out of bounds"):
        fnp.stack([np.zeros(2, np.float32)] * 2, axis=3)


# --- split, unstack -------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(7,), (2, 33), (33, 1, 7)])
def test_split_array_split_unstack(rng, shape):
    x = rand(rng, shape)
    nd = len(shape)
    cases = []  # (name, indices_or_sections, axis)
    for axis in (0, -1, nd - 1):
        d = shape[axis]
        divisors = [n for n in (1, 2, 3, 7, 11, d) if d % n == 0]
        cases += [("split", n, axis) for n in divisors]
        cases += [("array_split", n, axis) for n in (2, 3, 5, d + 2)]
        cases += [(name, [1, 3, 40], axis) for name in ("split", "array_split")]
        cases += [("split", [4, 2], axis), ("split", (), axis), ("split", np.array([2]), axis)]

    def f(a):
        return ([getattr(fnp, n)(a, ios, axis=k) for n, ios, k in cases]
                + [fnp.unstack(a, axis=k) for k in range(-nd, nd)])

    got = fusec.gpu_jit(f)(x)
    refs = ([getattr(np, n)(x, ios, axis=k) for n, ios, k in cases]
            + [tuple(np.moveaxis(x, k, 0)) for k in range(-nd, nd)])
    assert len(got) == len(refs)
    for g, r, c in zip(got, refs, cases + [("unstack", None, k) for k in range(-nd, nd)]):
        assert len(g) == len(r), c
        for gi, ri in zip(g, r):
            check(gi, np.array(ri), str(c))
    eager = fnp.split(x, [1, 3], axis=-1)
    assert isinstance(eager, list) and all(isinstance(e, fusec.Array) for e in eager)
    for gi, ri in zip(eager, np.split(x, [1, 3], axis=-1)):
        check(gi, ri, "eager")
    assert isinstance(fnp.unstack(x), tuple)


def test_split_errors():
    x = np.zeros((7, 4), np.float32)
    with pytest.raises(ValueError, match="does not result in an equal division: axis 0 of length "
                                         "7 into 2 sections"):
        fnp.split(x, 2)
    with pytest.raises(ShapeError, match="number of sections must be positive"):
        fnp.array_split(x, 0)
    with pytest.raises(TraceError, match="indices_or_sections must be static"):
        fusec.gpu_jit(lambda a, i: fnp.split(a, i))(x, np.array([1, 2], np.int32))
    with pytest.raises(ShapeError, match="0-d"):
        fnp.unstack(np.float32(1))


# --- flip, roll -----------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1,), (7,), (2, 33), (33, 1, 7)])
def test_flip_and_roll(rng, shape):
    x = rand(rng, shape, np.int32)
    nd = len(shape)
    flips = [None, 0, -1, tuple(range(nd)), (0, -1) if nd > 1 else 0]
    rolls = [(1, None), (-3, None), (40, None), (0, 0), (2, -1), (-9, 0), (35, -1),
             ((1, 2), (0, 0)), ((1, -5), (0, -1)), (3, tuple(range(nd)))]

    def f(a):
        return ([fnp.flip(a, axis=k) for k in flips]
                + [fnp.roll(a, s, axis=k) for s, k in rolls])

    refs = [np.flip(x, axis=k) for k in flips] + [np.roll(x, s, axis=k) for s, k in rolls]
    whats = [f"flip {k}" for k in flips] + [f"roll {s} {k}" for s, k in rolls]
    check_all(fusec.gpu_jit(f)(x), refs, whats)
    check(fnp.roll(x, -2, axis=0), np.roll(x, -2, axis=0), "eager roll")
    check(fnp.flip(x), np.flip(x), "eager flip")


def test_roll_and_flip_fuse():
    assert n_kernels(lambda x: fnp.roll(fnp.flip(x, 0), 3, axis=1) * 2 + x, S((7, 33))) == 1


def test_roll_errors():
    with pytest.raises(ShapeError, match="roll: shift .* and axis .* must have the same length"):
        fnp.roll(np.zeros((2, 3), np.float32), (1, 2, 3), axis=(0, 1))
    with pytest.raises(TraceError, match="roll's shift must be a Python number known at trace"):
        fusec.gpu_jit(lambda a, s: fnp.roll(a, s))(np.zeros(3, np.float32), np.int32(1))


# --- tile, repeat ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(), (1,), (7,), (2, 33), (2, 1, 7)])
def test_tile_and_repeat(rng, shape):
    x = rand(rng, shape, np.float32 if len(shape) != 1 else np.bool_)
    nd = len(shape)
    tiles = [1, 2, 3, 0, (2, 1), (1, 1, 2), (2, 1, 1, 3)]
    repeats = [(1, None), (3, None), (0, None), (2, 0), (3, -1)] if nd else [(2, None), (3, 0)]
    if nd:
        d = shape[-1]
        repeats += [(list(rng.integers(0, 4, size=d)), -1), ([2], 0), (np.arange(shape[0]), 0)]

    def f(a):
        return ([fnp.tile(a, r) for r in tiles] + [fnp.repeat(a, r, axis=k) for r, k in repeats]
                + [a.repeat(2), a.flatten(), a.ravel()])

    refs = ([np.tile(x, r) for r in tiles] + [np.repeat(x, r, axis=k) for r, k in repeats]
            + [x.repeat(2), x.flatten(), x.ravel()])
    whats = ([f"tile {r}" for r in tiles] + [f"repeat {r} {k}" for r, k in repeats]
             + ["method repeat", "method flatten", "method ravel"])
    check_all(fusec.gpu_jit(f)(x), refs, whats)
    check(fnp.tile(x, (2, 2)), np.tile(x, (2, 2)), "eager tile")
    check(fnp.repeat(x, 2), np.repeat(x, 2), "eager repeat")


def test_tile_and_repeat_errors():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ShapeError, match=r"tile: reps \(2, -1\) has a negative entry"):
        fnp.tile(x, (2, -1))
    with pytest.raises(ShapeError, match=r"repeat: repeats has 2 entries; axis 1 of .* \(shape "
                                         r"\(2, 3\)\) has 3 elements"):
        fnp.repeat(x, [1, 2], axis=1)
    with pytest.raises(ShapeError, match="repeats must be non-negative"):
        fnp.repeat(x, -1)
    with pytest.raises(TraceError, match="repeat: repeats must be static"):
        fusec.gpu_jit(lambda a, r: fnp.repeat(a, r))(x, np.ones(6, np.int32))


# --- pad ------------------------------------------------------------------------------------------

MODES = ["constant", "edge", "reflect", "symmetric", "wrap"]


@pytest.mark.parametrize("shape", [(1,), (2,), (7,), (33,), (2, 7), (7, 1, 2)])
def test_pad_modes_match_numpy(rng, shape):
    x = rand(rng, shape)
    nd = len(shape)
    d0 = shape[0]
    # within one period of the mirror (index arithmetic) and much wider (a host-made table)
    widths = [1, (2, 0), (0, 3), (d0, d0 + 1), 40, [(5, 1)] + [(0, 2)] * (nd - 1)]
    cases = [(m, w) for m in MODES for w in widths]

    def f(a):
        return [fnp.pad(a, w, mode=m) for m, w in cases]

    refs = [np.pad(x, w, mode=m) for m, w in cases]
    check_all(fusec.gpu_jit(f)(x), refs, [f"{m} {w}" for m, w in cases])
    check(fnp.pad(x, 2, mode="reflect"), np.pad(x, 2, mode="reflect"), "eager")


@pytest.mark.parametrize("dt", [np.float32, np.int32, np.uint32, np.bool_])
def test_pad_constant_values(rng, dt):
    x = rand(rng, (2, 7), dt)
    consts = [0, 1, 3, ((1, 2), (3, 4)), ((5,), (6,)), (7, 8)]
    if dt == np.float32:
        consts += [2.5, np.inf]

    def f(a, c):
        return [fnp.pad(a, ((1, 2), (3, 1)), constant_values=v) for v in consts] + [
            fnp.pad(a, 2, constant_values=c)]

    c = np.asarray(5, dt)
    refs = [np.pad(x, ((1, 2), (3, 1)), constant_values=v) for v in consts] + [
        np.pad(x, 2, constant_values=c)]
    got = fusec.gpu_jit(f)(x, c)
    check_all(got, refs, [str(v) for v in consts] + ["traced"])
    if dt == np.float32:  # -0.0 is a value of its own (assert_array_equal sees 0.0 == -0.0)
        neg = fusec.gpu_jit(lambda a: fnp.pad(a, 1, constant_values=-0.0))(x)
        np.testing.assert_array_equal(np.signbit(np.asarray(neg)),
                                      np.signbit(np.pad(x, 1, constant_values=-0.0)))


def test_pad_reflect_plus_one_is_one_kernel(rng):
    f = lambda x: fnp.pad(x, 2, mode="reflect") + 1  # noqa: E731
    assert n_kernels(f, S((7, 9))) == 1
    assert n_kernels(lambda x: fnp.pad(x, ((0, 1), (3, 2)), mode="edge") * x.sum(), S((7, 9))) <= 2
    x = rand(rng, (7, 9))
    check(fusec.gpu_jit(f)(x), np.pad(x, 2, mode="reflect") + 1)


def test_pad_errors():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="pad: mode 'mean' is not supported; supported modes: "
                                         "constant, edge, reflect, symmetric, wrap"):
        fnp.pad(x, 1, mode="mean")
    with pytest.raises(ShapeError, match="pad_width .* has a negative entry"):
        fnp.pad(x, ((1, -1), (0, 0)))
    with pytest.raises(ShapeError, match="does not fit an array of 2 dimensions"):
        fnp.pad(x, ((1, 1), (0, 0), (2, 2)))
    with pytest.raises(TraceError, match="pad_width must be integers"):
        fnp.pad(x, 1.5)
    with pytest.raises(ShapeError, match="cannot extend the empty axis 0 .* in mode 'edge'"):
        fnp.pad(np.zeros((0, 2), np.float32), 1, mode="edge")
    with pytest.raises(ShapeError, match="traced constant_values must be a scalar"):
        fusec.gpu_jit(lambda a, c: fnp.pad(a, 1, constant_values=c))(x, x)


# --- axes, ranks, broadcasting --------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(7,), (2, 33), (33, 1, 7), (2, 7, 1, 2)])
def test_axis_functions(rng, shape):
    x = rand(rng, shape, np.int32)
    nd = len(shape)
    moves = [(0, -1), (-1, 0), ((0,), (nd - 1,))]
    if nd >= 3:
        moves += [((0, 1), (-1, -2)), ((2, 0), (0, 1))]
    swaps = [(0, -1), (-1, 0), (0, nd - 1)]

    def f(a):
        return ([fnp.moveaxis(a, s, d) for s, d in moves] + [fnp.swapaxes(a, i, j)
                                                             for i, j in swaps]
                + [fnp.ravel(a), a.swapaxes(0, -1), fnp.atleast_1d(a), fnp.atleast_2d(a),
                   fnp.atleast_3d(a)])

    refs = ([np.moveaxis(x, s, d) for s, d in moves] + [np.swapaxes(x, i, j) for i, j in swaps]
            + [np.ravel(x), x.swapaxes(0, -1), np.atleast_1d(x), np.atleast_2d(x),
               np.atleast_3d(x)])
    check_all(fusec.gpu_jit(f)(x), [np.ascontiguousarray(r) for r in refs],
              [str(i) for i in range(len(refs))])
    check(fnp.moveaxis(x, 0, -1), np.ascontiguousarray(np.moveaxis(x, 0, -1)), "eager")


def test_atleast_and_broadcast_arrays(rng):
    s, v, m = np.float32(2.5), rand(rng, (7,)), rand(rng, (2, 7))

    def f(s, v, m):
        return (fnp.atleast_1d(s, v, m), fnp.atleast_2d(s, v, m), fnp.atleast_3d(s, v, m),
                fnp.broadcast_arrays(v, m, s))

    got = fusec.gpu_jit(f)(s, v, m)
    refs = (np.atleast_1d(s, v, m), np.atleast_2d(s, v, m), np.atleast_3d(s, v, m),
            np.broadcast_arrays(v, m, s))
    for g, r in zip(got, refs):
        for gi, ri in zip(g, r):
            check(gi, np.ascontiguousarray(ri))
    eager = fnp.broadcast_arrays(v, m)
    assert isinstance(eager, list) and len(eager) == 2
    check(eager[0], np.broadcast_to(v, (2, 7)))


def test_axis_function_errors():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ShapeError, match="moveaxis: source .* and destination .* same number"):
        fnp.moveaxis(x, (0, 1), 0)
    with pytest.raises(ShapeError, match="moveaxis: repeated axis in source"):
        fnp.moveaxis(x, (0, 0), (0, 1))
    with pytest.raises(ShapeError, match="swapaxes axis2 2 is out of bounds"):
        fnp.swapaxes(x, 0, 2)
    with pytest.raises(ShapeError, match="do not broadcast"):
        fnp.broadcast_arrays(x, np.zeros(4, np.float32))
    with pytest.raises(DTypeError):
        fnp.concatenate([x, x], dtype=np.complex64)


def test_rearrangements_of_computed_values_compose(rng):
    # the index primitives read values computed in the same kernel (x * 2, a reduction's result)
    x = rand(rng, (7, 33), special=False)

    def f(x):
        a = fnp.pad(x * 2, ((1, 2), (40, 3)), mode="reflect")
        b = fnp.roll(fnp.concatenate([x + 1, fnp.flip(x, 1)], axis=0), 3, axis=0)
        c = fnp.tile(fnp.repeat(x.sum(axis=0), [1, 2] * 16 + [0]), 2)
        d = fnp.split(fnp.pad(x, 1, mode="wrap"), 3, axis=0)[1] * fnp.eye(3, 35)
        return a, b, c, d

    refs = (np.pad(x * 2, ((1, 2), (40, 3)), mode="reflect"),
            np.roll(np.concatenate([x + 1, np.flip(x, 1)]), 3, axis=0),
            np.tile(np.repeat(x.sum(axis=0), [1, 2] * 16 + [0]), 2),
            np.split(np.pad(x, 1, mode="wrap"), 3)[1] * np.eye(3, 35, dtype=np.float32))
    for got, ref in zip(fusec.gpu_jit(f)(x), refs, strict=True):
        assert got.shape == ref.shape and got.dtype == ref.dtype
        # exact but for the sum of 7 terms (float32, any order)
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-6,
                                   atol=1e-6 * 7 * float(np.abs(x).max()))
