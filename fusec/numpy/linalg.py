"""Products: matmul, dot, einsum."""

from __future__ import annotations

import math
from typing import Any

from ..errors import DTypeError, ShapeError, TraceError
from ..ir import Op
from ..ops import broadcast_shapes
from ..trace import Tracer
from ._base import (
    _as,
    _describe,
    _lift,
    _result_dtype,
    _traceable,
    _tracer,
)
from .elementwise import astype, multiply, not_equal
from .reductions import sum as _sum
from .shapes import broadcast_to, reshape, transpose

__all__ = [
    "matmul",
    "dot",
    "einsum",
]



# --- matmul ---------------------------------------------------------------------------------------


@_traceable
def matmul(x1: Any, x2: Any) -> Tracer:
    """Matrix product with numpy's rules: 1-D operands and broadcast batch dimensions."""
    a, b = _lift(x1), _lift(x2)
    if not isinstance(a, Tracer) or not isinstance(b, Tracer) or a.ndim == 0 or b.ndim == 0:
        raise ShapeError("matmul: operands must be arrays of at least 1 dimension (numpy refuses "
                         "scalars too); use multiply for scaling")
    dt = _result_dtype([a, b])
    if dt == "bool":
        raise DTypeError("matmul of bool arrays is not supported; cast to int32 or float32")
    a, b = _as(a, dt), _as(b, dt)  # type: ignore[assignment]
    assert isinstance(a, Tracer) and isinstance(b, Tracer)
    k1 = a.shape[-1]
    k2 = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    if k1 != k2:
        raise ShapeError(
            f"matmul: {_describe(a)} has shape {a.shape} and {_describe(b)} has shape {b.shape}; "
            f"the first's last dimension ({k1}) must equal the second's "
            f"{'second-to-last' if b.ndim >= 2 else 'only'} dimension ({k2})")
    aa = reshape(a, (1, k1)) if a.ndim == 1 else a
    bb = reshape(b, (k2, 1)) if b.ndim == 1 else b
    try:
        batch = broadcast_shapes(aa.shape[:-2], bb.shape[:-2])
    except ShapeError as exc:
        raise ShapeError(f"matmul: batch dimensions of {a.shape} and {b.shape} do not broadcast"
                         ) from exc
    aa = broadcast_to(aa, batch + aa.shape[-2:])
    bb = broadcast_to(bb, batch + bb.shape[-2:])
    out = aa.builder.bind(Op.MATMUL, [aa, bb])
    shape = (batch + ((a.shape[-2],) if a.ndim >= 2 else ())
             + ((b.shape[-1],) if b.ndim >= 2 else ()))
    return reshape(out, shape)


@_traceable
def dot(a: Any, b: Any) -> Tracer:
    """numpy's dot: matmul for 1-D and 2-D, a sum over the last axis of ``a`` and the second-to-last
    of ``b`` for N-D."""
    x, y = _lift(a), _lift(b)
    if not isinstance(x, Tracer) or not isinstance(y, Tracer) or x.ndim == 0 or y.ndim == 0:
        return multiply(x, y)
    if x.ndim <= 2 and y.ndim <= 2 or y.ndim == 1:
        return matmul(x, y)
    k = x.shape[-1]
    if y.shape[-2] != k:
        raise ShapeError(f"dot: shapes {x.shape} and {y.shape} not aligned: {k} (dim "
                         f"{x.ndim - 1}) != {y.shape[-2]} (dim {y.ndim - 2})")
    lhs = reshape(x, (-1, k))
    perm = (y.ndim - 2,) + tuple(i for i in range(y.ndim) if i != y.ndim - 2)
    rhs = reshape(transpose(y, perm), (k, -1))
    return reshape(matmul(lhs, rhs), x.shape[:-1] + y.shape[:-2] + y.shape[-1:])


# --- einsum ---------------------------------------------------------------------------------------

_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyz" "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _parse_term(term: str, where: str) -> tuple[list[str], bool]:
    """The letters of one subscript term, with "..." marked by a "." entry (at most one)."""
    if term.count("...") > 1:
        raise ShapeError(f"einsum: {where} {term!r} has more than one ellipsis ('...')")
    rest = term.replace("...", "")
    bad = [c for c in rest if c not in _LETTERS]
    if bad:
        raise ShapeError(f"einsum: {where} {term!r} holds {bad[0]!r}; subscripts are letters "
                         "a-z, A-Z and one '...'")
    if "..." not in term:
        return list(term), False
    head, tail = term.split("...")
    return [*head, ".", *tail], True


def _ellipsis_labels(n: int) -> list[str]:
    """Labels of the ``n`` axes an ellipsis stands for: ".1", ".0" for n = 2 (counted from the
    right, so that ellipses of different lengths broadcast against each other)."""
    return [f".{k}" for k in range(n - 1, -1, -1)]


def _expand(term: list[str], ndim: int, k: int) -> list[str]:
    """One operand's labels, one per axis, the ellipsis replaced by labels of its own axes."""
    named = [c for c in term if c != "."]
    if "." not in term:
        if len(named) != ndim:
            raise ShapeError(f"einsum: operand {k} has {ndim} dimension(s) but its subscripts "
                             f"{''.join(term)!r} name {len(named)}")
        return named
    extra = ndim - len(named)
    if extra < 0:
        raise ShapeError(f"einsum: operand {k} has {ndim} dimension(s), fewer than the "
                         f"{len(named)} its subscripts name")
    i = term.index(".")
    return term[:i] + _ellipsis_labels(extra) + term[i + 1:]


def _diagonal(t: Tracer, labels: list[str]) -> tuple[Tracer, list[str]]:
    """A label repeated within one operand takes its diagonal (``ii->i``): a gather whose index
    along each repeated axis is the coordinate of the label's one axis in the result."""
    unique = list(dict.fromkeys(labels))
    if len(unique) == len(labels):
        return t, labels
    sizes: dict[str, int] = {}
    for lab, d in zip(labels, t.shape):
        if sizes.setdefault(lab, d) != d:
            raise ShapeError(f"einsum: subscript {lab!r} is repeated in one operand over axes of "
                             f"different lengths ({sizes[lab]} and {d}, shape {t.shape})")
    shape = tuple(sizes[lab] for lab in unique)
    b = t.builder
    idx = [b.bind(Op.IOTA, [], {"shape": shape, "axis": unique.index(lab), "dtype": "int32"})
           for lab in labels]
    return b.bind(Op.GATHER, [t, *idx]), unique


def _sum_out(t: Tracer, labels: list[str], keep: set[str]) -> tuple[Tracer, list[str]]:
    """Sum over the axes whose labels are not in ``keep``."""
    axes = tuple(k for k, lab in enumerate(labels) if lab not in keep)
    if not axes:
        return t, labels
    return _sum(t, axis=axes), [lab for lab in labels if lab in keep]


def _arrange(t: Tracer, labels: list[str], order: list[str],
             sizes: dict[str, int]) -> Tracer:
    """``t`` with its axes in ``order`` (every label of ``t`` must be in it), a length-1 axis for
    each label of ``order`` it lacks, and its length-1 axes broadcast to the labels' sizes where
    they meet longer ones (numpy's einsum broadcasts them)."""
    present = [lab for lab in order if lab in labels]
    t = transpose(t, tuple(labels.index(lab) for lab in present))
    t = reshape(t, tuple(t.shape[present.index(lab)] if lab in labels else 1 for lab in order))
    target = tuple(sizes[lab] if lab in labels else 1 for lab in order)
    return broadcast_to(t, target) if target != t.shape else t


def _contract(a: Tracer, la: list[str], b: Tracer, lb: list[str], keep: set[str],
              sizes: dict[str, int]) -> tuple[Tracer, list[str]]:
    """The product of two operands, summed over the labels both hold that are not in ``keep``:
    a batched matmul (batch: labels both hold and keep; K: those summed), or an elementwise
    product when nothing is summed."""
    a, la = _sum_out(a, la, keep | set(lb))
    b, lb = _sum_out(b, lb, keep | set(la))
    batch = [lab for lab in la if lab in lb and lab in keep]
    summed = [lab for lab in la if lab in lb and lab not in keep]
    a_free = [lab for lab in la if lab not in lb]
    b_free = [lab for lab in lb if lab not in la]
    out = batch + a_free + b_free
    if not summed:
        return multiply(_arrange(a, la, out, sizes), _arrange(b, lb, out, sizes)), out
    nb = math.prod(sizes[lab] for lab in batch)
    m = math.prod(sizes[lab] for lab in a_free)
    k = math.prod(sizes[lab] for lab in summed)
    n = math.prod(sizes[lab] for lab in b_free)
    aa = reshape(_arrange(a, la, batch + a_free + summed, sizes), (nb, m, k))
    bb = reshape(_arrange(b, lb, batch + summed + b_free, sizes), (nb, k, n))
    prod = matmul(aa, bb)
    return reshape(prod, tuple(sizes[lab] for lab in out)), out


@_traceable
def einsum(subscripts: Any, *operands: Any) -> Tracer:
    """Einstein summation, as numpy's ``einsum``: ``einsum("ij,jk->ik", a, b)`` is ``a @ b``.

    Subscripts name each operand's axes with letters; an explicit output after ``->`` (else the
    letters that occur once, in alphabetical order); ``...`` for leading axes that broadcast.
    A letter repeated within one operand takes a diagonal (``"ii->i"``; ``"ii"`` is the trace).
    Length-1 axes broadcast against their label's length. Operands are combined pairwise from
    left to right: each pair is a batched matmul over the labels it sums (or an elementwise
    product when it sums none), and labels found in one operand only are summed first. The
    result dtype is the operands' promoted dtype; bool operands give bool (any product true)."""
    if not isinstance(subscripts, str):
        raise TraceError("einsum: the first argument must be a subscripts string such as "
                         f"'ij,jk->ik' (the interleaved operand/sublist form is not supported); "
                         f"got {type(subscripts).__name__}")
    if not operands:
        raise TraceError("einsum: no operands given")
    spec = subscripts.replace(" ", "")
    if spec.count("->") > 1:
        raise ShapeError(f"einsum: subscripts {subscripts!r} have more than one '->'")
    lhs, arrow, rhs = spec.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ShapeError(f"einsum: subscripts {subscripts!r} name {len(terms)} operand(s) but "
                         f"{len(operands)} were given")
    ts = [_tracer(x) for x in operands]
    dt = _result_dtype(ts)
    # bools: products and sums in int32, then compared with zero (numpy's logical and/or)
    work = "int32" if dt == "bool" else dt
    ts = [astype(t, work) for t in ts]
    labels = [_expand(_parse_term(term, f"operand {k}'s subscripts")[0], t.ndim, k)
              for k, (term, t) in enumerate(zip(terms, ts))]
    n_ell = max((sum(lab.startswith(".") for lab in ls) for ls in labels), default=0)

    sizes: dict[str, int] = {}
    for k, (t, ls) in enumerate(zip(ts, labels)):
        for lab, d in zip(ls, t.shape):
            old = sizes.get(lab, 1)
            if d != 1 and old != 1 and d != old:
                name = "the ellipsis ('...')" if lab.startswith(".") else f"subscript {lab!r}"
                raise ShapeError(f"einsum: {name} has length {old} in one operand and {d} in "
                                 f"operand {k} (shape {t.shape}); they must be equal or 1")
            sizes[lab] = max(old, d) if d != 1 else old

    if arrow:
        out_term, has_ell = _parse_term(rhs, "the output")
        if not has_ell and n_ell:
            raise ShapeError(f"einsum: the operands' ellipsis ('...') stands for {n_ell} "
                             f"axes, but the output {rhs!r} has no '...' to hold them")
        i = out_term.index(".") if has_ell else len(out_term)
        out = out_term[:i] + (_ellipsis_labels(n_ell) if has_ell else []) + out_term[i + 1:]
        if len(set(out)) != len(out):
            raise ShapeError(f"einsum: output subscripts {rhs!r} repeat a letter")
        for lab in out:
            if lab not in sizes:
                raise ShapeError(f"einsum: output subscript {lab!r} is in no operand's "
                                 "subscripts")
    else:
        counts: dict[str, int] = {}
        for ls in labels:
            for lab in ls:
                counts[lab] = counts.get(lab, 0) + 1
        out = _ellipsis_labels(n_ell) + sorted(
            lab for lab, c in counts.items() if c == 1 and not lab.startswith("."))

    pairs = [_diagonal(t, ls) for t, ls in zip(ts, labels)]
    # labels each operand holds alone, and the output lacks, are summed before any product
    for k, (t, ls) in enumerate(pairs):
        others = {lab for j, (_, lj) in enumerate(pairs) if j != k for lab in lj}
        pairs[k] = _sum_out(t, ls, others | set(out))
    acc, la = pairs[0]
    for k in range(1, len(pairs)):
        later = {lab for _, lj in pairs[k + 1:] for lab in lj}
        acc, la = _contract(acc, la, pairs[k][0], pairs[k][1], later | set(out), sizes)
    acc, la = _sum_out(acc, la, set(out))
    res = _arrange(acc, la, out, sizes)
    return not_equal(res, 0) if dt == "bool" else res
