"""Counter-based random numbers (``jax.random``'s API), generated where they are consumed.

A key is a uint32 array of shape ``(2,)`` (JAX's raw ``PRNGKey``). Every function here is written
with :mod:`fusec.numpy` uint32 operations (add, xor, shifts), so a call traces into ordinary
elementwise ops: the random numbers fuse into the kernel that consumes them, never touch memory,
and the numpy interpreter (``FUSEC_BACKEND=cpu``) produces the same bits as any GPU adapter, by
construction.

The generator is Threefry-2x32 with 20 rounds (Salmon et al., "Parallel random numbers: as easy
as 1, 2, 3", SC 2011), checked against the Random123 known-answer vectors in the tests.

How counters map to outputs (fusec's own scheme, documented here; it is not promised to match
``jax.random`` bit for bit):

- ``bits(key, shape)``: element ``i`` of the flattened (C-order) result is ``y0 ^ y1`` where
  ``(y0, y1) = threefry2x32(key, (0, i))``.
- ``split(key, num)``: new key ``j`` is ``threefry2x32(key, (0, j))``.
- ``fold_in(key, data)``: ``threefry2x32(key, (0, data))``, so ``fold_in(key, j)`` equals
  ``split(key, n)[j]``.
- ``key(seed)``: ``(0, seed mod 2**32)``.

As with JAX, a key should be used either to draw numbers or to derive keys, not both: ``bits``,
``split`` and ``fold_in`` of one key share counter blocks.
"""

from __future__ import annotations

import math
from typing import Any, Union

import numpy as np

from . import dtypes
from . import numpy as fnp
from .errors import DTypeError, ShapeError, TraceError
from .numpy._base import _lift, _traceable, _tracer
from .numpy.shapes import _iota
from .trace import Tracer

__all__ = ["PRNGKey", "bernoulli", "bits", "categorical", "choice", "fold_in", "gumbel", "key",
           "normal", "permutation", "randint", "split", "threefry2x32", "uniform"]

U32 = Union[Tracer, int]

# Threefry-2x32 rotation amounts: rounds 1-4 use the first row, rounds 5-8 the second, repeating.
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
# The key-schedule parity constant of Threefry.
_PARITY = 0x1BD11BDA
_MASK = 0xFFFFFFFF


# --- the generator ------------------------------------------------------------------------------


def _rotl(x: Tracer, r: int) -> Tracer:
    return fnp.bitwise_or(fnp.left_shift(x, r), fnp.right_shift(x, 32 - r))


def _u32(x: Any) -> Tracer:
    """``x`` as a traced uint32 value (Python ints become uint32 constants)."""
    t = _tracer(x % 2**32 if isinstance(x, (int, np.integer)) else x)
    return t if t.dtype == "uint32" else fnp.astype(t, "uint32")


def _threefry(k0: Tracer, k1: Tracer, x0: Tracer, x1: Tracer) -> tuple[Tracer, Tracer]:
    """Threefry-2x32, 20 rounds: 5 groups of 4 mix rounds, each followed by a key injection."""
    k2 = fnp.bitwise_xor(fnp.bitwise_xor(k0, k1), _PARITY)
    ks = (k0, k1, k2)
    x0 = fnp.add(x0, ks[0])
    x1 = fnp.add(x1, ks[1])
    for group in range(5):
        for r in _ROTATIONS[group % 2]:
            x0 = fnp.add(x0, x1)
            x1 = fnp.bitwise_xor(_rotl(x1, r), x0)
        # the injection adds the next key words and the injection count (1..5) to the second word
        x0 = fnp.add(x0, ks[(group + 1) % 3])
        x1 = fnp.add(fnp.add(x1, ks[(group + 2) % 3]), group + 1)
    return x0, x1


@_traceable
def threefry2x32(key_words: Any, counter: Any) -> Tracer:
    """The Threefry-2x32 (20 rounds) block function: ``key_words`` and ``counter`` are uint32
    arrays with a last axis of length 2 (they broadcast); the result has the same layout."""
    k, c = _tracer(key_words), _tracer(counter)
    for name, t in (("key_words", k), ("counter", c)):
        if t.dtype != "uint32" or not t.shape or t.shape[-1] != 2:
            raise DTypeError(f"threefry2x32: {name} must be a uint32 array with a last axis of "
                             f"length 2; got {t.dtype}{list(t.shape)}")
    y0, y1 = _threefry(k[..., 0], k[..., 1], c[..., 0], c[..., 1])
    return fnp.stack([y0, y1], axis=-1)


# --- argument checks ----------------------------------------------------------------------------


def _key_words(key: Any, fn: str) -> tuple[Tracer, Tracer]:
    """The two words of a key, checked: a uint32 array of shape (2,)."""
    k = _lift(key)
    if not isinstance(k, Tracer):
        raise TraceError(f"{fn}: key must be a uint32 array of shape (2,) (from fusec.random.key); "
                         f"got the scalar {key!r}")
    if k.dtype != "uint32" or tuple(k.shape) != (2,):
        raise ShapeError(f"{fn}: key must be a uint32 array of shape (2,) (from "
                         f"fusec.random.key); got {k.dtype}{list(k.shape)}")
    return k[0], k[1]


def _static_shape(shape: Any, fn: str, what: str = "shape") -> tuple[int, ...]:
    """A shape known at trace time: an int or a sequence of non-negative ints."""
    items = (shape,) if isinstance(shape, (int, np.integer)) else shape
    try:
        dims = tuple(items)
    except TypeError:
        dims = None
    if dims is None or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in dims):
        raise TraceError(f"{fn}: {what} must be a tuple of ints known at trace time; got "
                         f"{shape!r}. Pass it as a static argument (e.g. x.shape)")
    out = tuple(int(d) for d in dims)
    if any(d < 0 for d in out):
        raise ShapeError(f"{fn}: {what} must not have negative dimensions; got {out}")
    return out


def _float_dtype(dtype: Any, fn: str) -> str:
    """The samplers' floating dtype. float16 values are drawn in float32 and rounded."""
    dt = dtypes.canonicalize(dtype, f"{fn}'s dtype")
    if not dtypes.is_float(dt):
        raise DTypeError(f"{fn}: dtype must be a floating dtype (float32 or float16); got {dt}")
    return dt


def _blocks(key: Any, shape: tuple[int, ...], fn: str) -> tuple[Tracer, Tracer]:
    """Both Threefry output words for every element of ``shape``: element ``i`` (C order) uses
    counter ``(0, i)``."""
    k0, k1 = _key_words(key, fn)
    n = math.prod(shape)
    if n > 2**32:
        raise ShapeError(f"{fn}: at most 2**32 random values per call; shape {shape} has {n}")
    counter = fnp.reshape(_iota((n,), 0, "uint32"), shape)
    y0, y1 = _threefry(k0, k1, fnp.zeros(shape, "uint32"), counter)
    return y0, y1


def _unit(word: Tracer, open_low: bool = False) -> Tracer:
    """float32 in [0, 1) from the top 23 bits of ``word`` (exact: 23-bit integers are exact in
    float32); ``open_low`` shifts by half a step, giving the open interval (0, 1)."""
    m = fnp.astype(fnp.right_shift(word, 9), "float32")
    if open_low:
        m = fnp.add(m, 0.5)
    return fnp.multiply(m, 2.0**-23)


# --- keys ---------------------------------------------------------------------------------------


@_traceable
def _key_from(seed: Any) -> Tracer:
    s = _tracer(seed)
    if not dtypes.is_int(s.dtype) or s.shape:
        raise DTypeError(f"key: seed must be a scalar integer; got {s.dtype}{list(s.shape)}")
    return fnp.stack([fnp.zeros((), "uint32"), _u32(s)])


def key(seed: Any) -> Any:
    """A PRNG key from an integer seed: the uint32 array ``[0, seed mod 2**32]`` of shape (2,)
    (JAX's raw ``PRNGKey``). ``seed`` may be a Python int or a traced integer scalar."""
    if isinstance(seed, (bool, np.bool_)) or isinstance(seed, float):
        raise DTypeError(f"key: seed must be an integer; got {seed!r}")
    if isinstance(seed, (int, np.integer)):
        s = int(seed)
        if not -(2**63) <= s < 2**64:
            raise DTypeError(f"key: seed {s} does not fit in 64 bits")
        # an array, not a static: one compiled kernel serves every seed outside jit
        return _key_from(np.asarray(s % 2**32, dtype=np.uint32))
    return _key_from(seed)


PRNGKey = key


@_traceable
def split(key: Any, num: int = 2) -> Tracer:
    """``num`` new keys, shape ``(num, 2)``: key ``j`` is ``threefry2x32(key, (0, j))``."""
    (n,) = _static_shape((num,), "split", "num")
    y0, y1 = _blocks(key, (n,), "split")
    return fnp.stack([y0, y1], axis=-1)


@_traceable
def _fold_in(key: Any, data: Any) -> Tracer:
    k0, k1 = _key_words(key, "fold_in")
    d = _tracer(data)
    if not dtypes.is_int(d.dtype) or d.shape:
        raise DTypeError(f"fold_in: data must be a scalar integer; got {d.dtype}{list(d.shape)}")
    y0, y1 = _threefry(k0, k1, fnp.zeros((), "uint32"), _u32(d))
    return fnp.stack([y0, y1])


def fold_in(key: Any, data: Any) -> Any:
    """A new key from ``key`` and an integer ``data``: ``threefry2x32(key, (0, data))``."""
    if isinstance(data, (bool, np.bool_, float)):
        raise DTypeError(f"fold_in: data must be an integer; got {data!r}")
    if isinstance(data, (int, np.integer)):
        if not -(2**31) <= int(data) < 2**32:
            raise DTypeError(f"fold_in: data {int(data)} does not fit in 32 bits")
        data = np.asarray(int(data) % 2**32, dtype=np.uint32)
    return _fold_in(key, data)


# --- samplers -----------------------------------------------------------------------------------


@_traceable
def bits(key: Any, shape: Any = ()) -> Tracer:
    """Uniformly distributed uint32 words of ``shape``."""
    y0, y1 = _blocks(key, _static_shape(shape, "bits"), "bits")
    return fnp.bitwise_xor(y0, y1)


@_traceable
def uniform(key: Any, shape: Any = (), dtype: Any = "float32", minval: Any = 0.0,
            maxval: Any = 1.0) -> Tracer:
    """Values of ``dtype`` (float32 or float16) uniform in ``[minval, maxval)`` (23 random
    mantissa bits, then rounded to float16 for float16)."""
    shp = _static_shape(shape, "uniform")
    dt = _float_dtype(dtype, "uniform")
    u = _unit(bits(key, shp))
    if isinstance(minval, (int, float)) and isinstance(maxval, (int, float)):
        lo, hi = float(minval), float(maxval)
        out = fnp.astype(fnp.add(fnp.multiply(u, hi - lo), lo), dt)
        # rounding can land on maxval itself; the half-open interval is a promise
        ndt = np.dtype(dt).type
        top = float(np.nextafter(ndt(hi), ndt(-np.inf)))
        return fnp.minimum(fnp.maximum(out, lo), top)
    lo_t, hi_t = _lift(minval), _lift(maxval)
    out = fnp.add(fnp.multiply(u, fnp.subtract(hi_t, lo_t)), lo_t)
    out = fnp.astype(fnp.maximum(out, lo_t), dt)
    low = fnp.astype(lo_t, dt) if isinstance(lo_t, Tracer) else lo_t
    return fnp.broadcast_to(fnp.where(fnp.less(out, hi_t), out, low), shp)


@_traceable
def normal(key: Any, shape: Any = (), dtype: Any = "float32") -> Tracer:
    """Standard normal values of ``dtype`` (float32, or float16: drawn in float32 and rounded)
    (Box-Muller on the two Threefry words of each element; |value| <= sqrt(2 ln 2**24) ~ 5.77,
    a tail of probability ~1e-8 is cut off)."""
    shp = _static_shape(shape, "normal")
    dt = _float_dtype(dtype, "normal")
    y0, y1 = _blocks(key, shp, "normal")
    # radius from u1 in (0, 1] (never log(0)); angle from u2 in [0, 1); 24 bits each
    u1 = fnp.multiply(fnp.add(fnp.astype(fnp.right_shift(y0, 8), "float32"), 1.0), 2.0**-24)
    u2 = fnp.multiply(fnp.astype(fnp.right_shift(y1, 8), "float32"), 2.0**-24)
    r = fnp.sqrt(fnp.multiply(fnp.log(u1), -2.0))
    return fnp.astype(fnp.multiply(r, fnp.cos(fnp.multiply(u2, 2.0 * math.pi))), dt)


@_traceable
def gumbel(key: Any, shape: Any = (), dtype: Any = "float32") -> Tracer:
    """Standard Gumbel values of ``dtype`` (float32 or float16), ``-log(-log(u))`` with ``u`` in
    the open interval (0, 1)."""
    shp = _static_shape(shape, "gumbel")
    dt = _float_dtype(dtype, "gumbel")
    u = _unit(bits(key, shp), open_low=True)
    return fnp.astype(fnp.negative(fnp.log(fnp.negative(fnp.log(u)))), dt)


@_traceable
def bernoulli(key: Any, p: Any = 0.5, shape: Any = None) -> Tracer:
    """bool values, True with probability ``p`` (a scalar or an array broadcasting to
    ``shape``; ``shape`` defaults to ``p``'s shape)."""
    pv = _lift(p)
    p_shape = tuple(pv.shape) if isinstance(pv, Tracer) else ()
    shp = p_shape if shape is None else _static_shape(shape, "bernoulli")
    if isinstance(pv, Tracer) and not dtypes.is_float(pv.dtype):
        pv = fnp.astype(pv, "float32")
    return fnp.less(uniform(key, shp), pv)


@_traceable
def randint(key: Any, shape: Any, minval: Any, maxval: Any, dtype: Any = "int32") -> Tracer:
    """Integers uniform in ``[minval, maxval)``. The offset is ``bits % (maxval - minval)``: its
    bias is below ``(maxval - minval) / 2**32``."""
    shp = _static_shape(shape, "randint")
    dt = dtypes.canonicalize(dtype, "randint's dtype")
    if dt not in dtypes.INTS:
        raise DTypeError(f"randint: dtype must be int32 or uint32; got {dt}")
    lo, hi = _lift(minval), _lift(maxval)
    for name, v in (("minval", lo), ("maxval", hi)):
        if isinstance(v, float) or (isinstance(v, Tracer) and not dtypes.is_int(v.dtype)):
            raise DTypeError(f"randint: {name} must be an integer; got {v!r}")
    if not isinstance(lo, Tracer) and not isinstance(hi, Tracer):
        ilo, ihi = int(lo), int(hi)
        bounds = (-(2**31), 2**31) if dt == "int32" else (0, 2**32)
        if not (bounds[0] <= ilo < bounds[1] and bounds[0] < ihi <= bounds[1]):
            raise DTypeError(f"randint: minval {ilo} and maxval {ihi} must lie in {dt}'s range")
        if ihi <= ilo:
            raise ShapeError(f"randint: maxval ({ihi}) must be greater than minval ({ilo})")
        span = ihi - ilo
        r = bits(key, shp)
        if span < 2**32:
            r = fnp.remainder(r, span)
        out = fnp.add(r, ilo % 2**32)  # uint32 arithmetic wraps: minval + offset, mod 2**32
        return out if dt == "uint32" else fnp.astype(out, dt)
    # traced bounds: the span in uint32; an empty range (maxval <= minval) gives minval
    lo_u, hi_u = _u32(lo), _u32(hi)
    span_u = fnp.subtract(hi_u, lo_u)
    empty = fnp.less_equal(hi, lo)
    r = fnp.remainder(bits(key, shp), fnp.where(empty, 1, span_u))
    out = fnp.add(r, lo_u)
    return out if dt == "uint32" else fnp.astype(out, dt)


@_traceable
def categorical(key: Any, logits: Any, axis: int = -1, shape: Any = None) -> Tracer:
    """int32 category indices drawn with probabilities ``softmax(logits)`` along ``axis``
    (Gumbel-max: the argmax of ``logits + gumbel noise``). ``shape`` defaults to the batch shape
    (``logits``' shape without ``axis``); the batch shape must broadcast to it."""
    lg = _tracer(logits)
    if not lg.shape:
        raise ShapeError("categorical: logits must have at least one axis")
    ax = axis % len(lg.shape) if isinstance(axis, int) and -len(lg.shape) <= axis < len(
        lg.shape) else None
    if ax is None:
        raise ShapeError(f"categorical: axis {axis!r} is out of bounds for logits of shape "
                         f"{tuple(lg.shape)}")
    n = lg.shape[ax]
    batch = tuple(d for i, d in enumerate(lg.shape) if i != ax)
    shp = batch if shape is None else _static_shape(shape, "categorical")
    try:
        np.broadcast_shapes(batch, shp)
        ok = np.broadcast_shapes(batch, shp) == shp
    except ValueError:
        ok = False
    if not ok:
        raise ShapeError(f"categorical: shape {shp} is not broadcast-compatible with the batch "
                         f"shape {batch} of logits")
    if not dtypes.is_float(lg.dtype):
        lg = fnp.astype(lg, "float32")
    moved = fnp.broadcast_to(fnp.moveaxis(lg, ax, -1), shp + (n,))
    noisy = fnp.add(moved, gumbel(key, shp + (n,)))
    return fnp.argmax(noisy, axis=-1)


@_traceable
def permutation(key: Any, x: Any, axis: int = 0) -> Tracer:
    """A random permutation of ``range(x)`` (an int ``x``), or of ``x``'s entries along ``axis``
    (the argsort of random words)."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        n = _static_shape((x,), "permutation", "n")[0]
        return fnp.argsort(bits(key, (n,)))
    xt = _tracer(x)
    if not xt.shape:
        raise ShapeError("permutation: x must be an int or an array with at least one axis")
    ax = _axis(axis, len(xt.shape), "permutation")
    perm = fnp.argsort(bits(key, (xt.shape[ax],)))
    return fnp.take(xt, perm, axis=ax)


def _axis(axis: Any, ndim: int, fn: str) -> int:
    if not isinstance(axis, (int, np.integer)) or not -ndim <= int(axis) < ndim:
        raise ShapeError(f"{fn}: axis {axis!r} is out of bounds for {ndim} dimensions")
    return int(axis) % ndim


@_traceable
def choice(key: Any, a: Any, shape: Any = (), replace: bool = True, p: Any = None,
           axis: int = 0) -> Tracer:
    """Entries of ``a`` (or of ``range(a)`` for an int) drawn along ``axis``: uniformly, or with
    probabilities ``p``; without replacement through a random ordering (Gumbel top-k with
    ``p``)."""
    shp = _static_shape(shape, "choice")
    k = math.prod(shp)
    if isinstance(a, (int, np.integer)) and not isinstance(a, bool):
        n = int(a)
        arr = None
        ax = 0
    else:
        arr = _tracer(a)
        if not arr.shape:
            raise ShapeError("choice: a must be an int or an array with at least one axis")
        ax = _axis(axis, len(arr.shape), "choice")
        n = arr.shape[ax]
    if n <= 0:
        raise ShapeError("choice: a must have at least one entry to choose from")
    if not replace and k > n:
        raise ShapeError(f"choice: cannot take {k} entries without replacement from {n}")
    if p is not None:
        pt = _tracer(p)
        if tuple(pt.shape) != (n,):
            raise ShapeError(f"choice: p must have shape ({n},); got {tuple(pt.shape)}")
        logp = fnp.log(fnp.astype(pt, "float32"))
        if replace:
            idx = categorical(key, logp, shape=(k,))
        else:
            idx = fnp.argsort(fnp.negative(fnp.add(logp, gumbel(key, (n,)))))[:k]
    elif replace:
        idx = randint(key, (k,), 0, n)
    else:
        idx = permutation(key, n)[:k]
    if arr is None:
        return fnp.reshape(idx, shp)
    taken = fnp.take(arr, idx, axis=ax)
    out_shape = tuple(arr.shape[:ax]) + shp + tuple(arr.shape[ax + 1:])
    return fnp.reshape(taken, out_shape)
