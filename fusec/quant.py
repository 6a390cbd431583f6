"""Quantized weights in GGUF's Q4_1 and Q8_0 block formats, and products with them whose
dequantisation happens in the product's kernel.

    import fusec
    from fusec import quant

    q = quant.from_gguf(tensor.data, "q4_1", (n, k))      # or quant.quantize(w, "q4_1")
    q = fusec.tree_util.tree_map(fusec.device_put, q)     # upload the words once

    @fusec.gpu_jit
    def step(x, q):
        return quant.matmul(x, q)                         # x @ dequantize(q).T

A :class:`QuantizedMatrix` of shape (N, K) holds N rows of K values (a GGUF 2-D tensor's rows;
K a multiple of 32) as uint32 words, each row its K // 32 blocks of 32 values in order:

- ``q4_1``, 5 words a block: word 0 = the f16 scale d (low 16 bits) and the f16 minimum m (high
  16 bits); words 1..4 = 16 bytes, little-endian, byte j holding value j in its low nibble and
  value j + 16 in its high nibble. Value = d * q + m, q in 0..15 (GGUF's 20 bytes as they are).
- ``q8_0``, 9 words a block: word 0 = the f16 scale d (low 16 bits, the high ones 0); words
  1..8 = the 32 int8 values, little-endian. Value = d * q (GGUF's 34 bytes, the scale padded to a
  word).

It is a pytree (one leaf, ``data``; ``fmt`` and ``shape`` are static), so it can be an argument
of a jitted function, be mapped over with :mod:`fusec.tree_util` and be captured by a trace.

:func:`matmul` traces ``matmul(x, transpose(dequantize(q)))``. The pass pipeline turns it into one
kernel that reads the words once and never writes the dequantised matrix when x has at most
:data:`fusec.kernels.quant.QMATMUL_M` rows (a decode step); with more rows (a prompt's prefill) a
dequantize kernel writes the float32 matrix and the tiled matmul runs on it. ``x @
quant.dequantize(q).T`` written out is rewritten the same way.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import tree as _tree
from .errors import DTypeError, FusecError, ShapeError
from .ir import Op
from .numpy import matmul as _matmul
from .numpy import reshape, transpose, zeros
from .numpy import take as _take
from .numpy._base import _lift, _traceable
from .ops import QMATMUL_M, QUANT_BLOCK, QUANT_WORDS, dequant_numpy, quant_words_shape
from .trace import Tracer

__all__ = ["QuantizedMatrix", "WORDS", "BLOCK", "FORMATS", "FormatError", "from_gguf",
           "quantize", "dequantize_numpy", "dequantize", "matmul", "take"]

WORDS = dict(QUANT_WORDS)  # uint32 words per block of 32 values
BLOCK = QUANT_BLOCK  # values per block
FORMATS = tuple(sorted(QUANT_WORDS))
# bytes per block in GGUF's own layout
GGUF_BYTES = {"q4_1": 20, "q8_0": 34}


class FormatError(FusecError, ValueError):
    """An unknown quantization format."""


def _check_fmt(fmt: Any, what: str) -> str:
    if not isinstance(fmt, str) or fmt not in QUANT_WORDS:
        raise FormatError(f"{what}: unknown quantization format {fmt!r}; expected one of "
                          f"{', '.join(repr(f) for f in FORMATS)}")
    return fmt


def _check_shape(shape: Any, what: str) -> tuple[int, int]:
    try:
        n, k = (int(d) for d in shape)
    except (TypeError, ValueError):
        raise ShapeError(f"{what}: shape must be a pair (N, K) of ints; got {shape!r}") from None
    if n < 1 or k < QUANT_BLOCK or k % QUANT_BLOCK:
        raise ShapeError(f"{what}: shape (N, K) = ({n}, {k}) needs N >= 1 and K a positive "
                         f"multiple of {QUANT_BLOCK} (the block size)")
    return n, k


def _check_data(data: Any, fmt: str, shape: tuple[int, int], what: str) -> None:
    """The words: uint32 of shape (N, K // 32 * WORDS[fmt])."""
    dt = getattr(data, "dtype", None)
    shp = getattr(data, "shape", None)
    if dt is None or shp is None:
        raise DTypeError(f"{what}: data must be an array of uint32 words (numpy, fusec.Array or "
                         f"a traced value); got {type(data).__name__}")
    name = np.dtype(dt).name if not isinstance(dt, str) else dt
    want = quant_words_shape(fmt, shape)
    if name != "uint32":
        raise DTypeError(f"{what}: data must hold uint32 words; got {name}")
    if tuple(shp) != want:
        raise ShapeError(f"{what}: the {fmt} words of a {shape} matrix have shape {want} "
                         f"({WORDS[fmt]} words per block of {BLOCK}); got data of shape "
                         f"{tuple(shp)}")


class QuantizedMatrix:
    """An (N, K) matrix in a quantized block format: ``fmt`` ("q4_1" or "q8_0"), ``shape``
    (N, K) and ``data``, uint32 words of shape (N, K // 32 * WORDS[fmt]) (numpy, a
    :class:`fusec.Array`, or a traced value inside a jitted function). See the module's
    docstring for the layout."""

    __slots__ = ("fmt", "shape", "data")

    fmt: str
    shape: tuple[int, int]
    data: Any

    def __init__(self, fmt: str, shape: tuple[int, int], data: Any) -> None:
        self.fmt = _check_fmt(fmt, "QuantizedMatrix")
        self.shape = _check_shape(shape, "QuantizedMatrix")
        _check_data(data, self.fmt, self.shape, "QuantizedMatrix")
        self.data = data

    @classmethod
    def _unchecked(cls, fmt: str, shape: tuple[int, int], data: Any) -> QuantizedMatrix:
        # pytree unflattening: leaves may be placeholders (tree_util, transforms)
        q = cls.__new__(cls)
        q.fmt, q.shape, q.data = fmt, shape, data
        return q

    @property
    def nbytes(self) -> int:
        """Bytes of the words."""
        n, w = quant_words_shape(self.fmt, self.shape)
        return n * w * 4

    def __repr__(self) -> str:
        return (f"QuantizedMatrix(fmt={self.fmt!r}, shape={self.shape}, "
                f"data={type(self.data).__name__})")


_tree.register_node(QuantizedMatrix, lambda q: ((q.data,), (q.fmt, q.shape)),
                    lambda aux, ch: QuantizedMatrix._unchecked(aux[0], aux[1], ch[0]),
                    field_names=("data",))


def _as_matrix(q: Any, what: str) -> QuantizedMatrix:
    if not isinstance(q, QuantizedMatrix):
        raise TypeError(f"{what}: q must be a fusec.quant.QuantizedMatrix; got "
                        f"{type(q).__name__}")
    _check_fmt(q.fmt, what)
    _check_shape(q.shape, what)
    _check_data(q.data, q.fmt, q.shape, f"{what}: q")
    return q


# --- numpy: GGUF bytes, quantization, reference dequantisation ----------------------------------


def from_gguf(raw: np.ndarray, fmt: str, shape: tuple[int, int]) -> QuantizedMatrix:
    """The matrix of ``shape`` (N, K) from GGUF's block bytes (uint8, as ``gguf.GGUFReader``
    gives a tensor's data: N rows of K // 32 blocks; any shape with that many bytes), repacked
    into words (q4_1: the bytes as they are; q8_0: the scale padded to a word)."""
    fmt = _check_fmt(fmt, "from_gguf")
    n, k = _check_shape(shape, "from_gguf")
    arr = np.asarray(raw)
    if arr.dtype != np.uint8:
        raise DTypeError(f"from_gguf: raw must be the uint8 block bytes; got {arr.dtype}")
    nb = k // QUANT_BLOCK
    size = GGUF_BYTES[fmt]
    if arr.size != n * nb * size:
        raise ShapeError(f"from_gguf: a {fmt} matrix of shape ({n}, {k}) has {n * nb * size} "
                         f"bytes ({nb} blocks of {size} bytes per row); raw has {arr.size} "
                         f"(shape {arr.shape})")
    blocks = np.ascontiguousarray(arr).reshape(n, nb, size)
    if fmt == "q4_1":
        words = blocks.view("<u4").astype(np.uint32)
    else:
        words = np.zeros((n, nb, 9), dtype=np.uint32)
        words[..., 0] = blocks[..., 0].astype(np.uint32) | (blocks[..., 1].astype(np.uint32) << 8)
        words[..., 1:] = np.ascontiguousarray(blocks[..., 2:]).view("<u4")
    return QuantizedMatrix(fmt, (n, k), words.reshape(n, nb * WORDS[fmt]))


def _f16_bits(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint16).astype(np.uint32)


def _pack_bytes(b: np.ndarray) -> np.ndarray:
    """(..., 4j) uint8 -> (..., j) uint32, little-endian."""
    return np.ascontiguousarray(b, dtype=np.uint8).view("<u4").astype(np.uint32)


def quantize(w: np.ndarray, fmt: str) -> QuantizedMatrix:
    """``w`` (N, K) quantized to ``fmt`` with round to nearest, as GGUF's reference quantizers
    do, in float32. q4_1: per block the minimum m and d = (max - m) / 15, q = round((x - m) / d)
    clipped to 0..15; q8_0: d = max|x| / 127, q = round(x / d) (halves away from zero). The
    scales are stored as float16."""
    fmt = _check_fmt(fmt, "quantize")
    arr = np.asarray(w)
    if arr.ndim != 2:
        raise ShapeError(f"quantize: w must be a matrix (N, K); got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.floating) and not np.issubdtype(arr.dtype, np.integer):
        raise DTypeError(f"quantize: w must hold real numbers; got {arr.dtype}")
    n, k = _check_shape(arr.shape, "quantize: w")
    x = arr.astype(np.float32).reshape(n, k // QUANT_BLOCK, QUANT_BLOCK)
    if not np.isfinite(x).all():
        raise ShapeError("quantize: w holds NaN or infinity, which the block formats cannot hold")
    with np.errstate(divide="ignore"):
        if fmt == "q4_1":
            lo, hi = x.min(axis=-1), x.max(axis=-1)
            d = (hi - lo) / np.float32(15)
            inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
            q = np.floor((x - lo[..., None]) * inv[..., None] + np.float32(0.5))
            q = np.clip(q, 0, 15).astype(np.uint8)
            nib = q[..., :16] | (q[..., 16:] << np.uint8(4))  # byte j: values j and j + 16
            head = _f16_bits(d) | (_f16_bits(lo) << np.uint32(16))
            words = np.concatenate([head[..., None], _pack_bytes(nib)], axis=-1)
        else:
            d = np.abs(x).max(axis=-1) / np.float32(127)
            inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
            v = x * inv[..., None]
            q = np.clip(np.sign(v) * np.floor(np.abs(v) + np.float32(0.5)), -127, 127)
            words = np.concatenate([_f16_bits(d)[..., None],
                                    _pack_bytes(q.astype(np.int8).view(np.uint8))], axis=-1)
    return QuantizedMatrix(fmt, (n, k), words.reshape(n, -1).astype(np.uint32))


def dequantize_numpy(q: QuantizedMatrix) -> np.ndarray:
    """The float32 (N, K) matrix ``q`` holds, on the host (the reference: each value d * q (+ m)
    in float32, as GGUF's dequantisation gives it)."""
    q = _as_matrix(q, "dequantize_numpy")
    if isinstance(q.data, Tracer):
        raise TypeError("dequantize_numpy: q holds a traced value; inside a jitted function use "
                        "fusec.quant.dequantize")
    return dequant_numpy(np.asarray(q.data), q.fmt, q.shape)


# --- traced ---------------------------------------------------------------------------------------


def _words(q: QuantizedMatrix) -> Tracer:
    t = _lift(q.data)
    assert isinstance(t, Tracer)
    return t


@_traceable
def dequantize(q: QuantizedMatrix) -> Tracer:
    """The float32 (N, K) matrix ``q`` holds, as a traced value (a ``dequant`` op; eagerly
    outside a jitted function, like fusec.numpy's functions)."""
    q = _as_matrix(q, "dequantize")
    words = _words(q)
    return words.builder.bind(Op.DEQUANT, [words], {"fmt": q.fmt, "shape": q.shape})


@_traceable
def matmul(x: Any, q: QuantizedMatrix) -> Tracer:
    """``x @ dequantize(q).T``: x float32 (..., K) -> (..., N). With few rows of x (all leading
    axes together, at most fusec.kernels.quant.QMATMUL_M) one kernel dequantises the weights in
    registers as it multiplies; with more, the matrix is dequantised and a tiled matmul runs."""
    q = _as_matrix(q, "quant.matmul")
    n, k = q.shape
    xt = _lift(x)
    if not isinstance(xt, Tracer):
        raise ShapeError(f"quant.matmul: x must be an array of shape (..., {k}); got a scalar")
    if xt.var.dtype != "float32":
        raise DTypeError(f"quant.matmul: x must be float32; got {xt.var.dtype}")
    if xt.ndim < 1 or xt.shape[-1] != k:
        raise ShapeError(f"quant.matmul: x has shape {tuple(xt.shape)}; its last dimension must "
                         f"be the matrix's K = {k} (q has shape ({n}, {k}))")
    lead = tuple(xt.shape[:-1])
    if xt.ndim == 2 or math.prod(lead) <= QMATMUL_M:
        # few rows (the quantized product's kernel): x keeps its shape, so that elementwise work
        # on the result (a residual add) reads the product as it is and fuses into its kernel
        return _matmul(xt, transpose(dequantize(q)))
    y = _matmul(reshape(xt, (-1, k)), transpose(dequantize(q)))
    return reshape(y, lead + (n,))


@_traceable
def take(q: QuantizedMatrix, ids: Any) -> Tracer:
    """Rows ``ids`` of the dequantised matrix, ``dequantize(q)[ids]`` (an embedding lookup),
    dequantising only those rows: the words of the rows are gathered, then dequantised. ids:
    integers of any shape (negative ones count from the end, then indices are clamped into
    the rows, as ``x[ids]`` does); the result has shape ``ids.shape + (K,)``."""
    q = _as_matrix(q, "quant.take")
    n, k = q.shape
    words = _words(q)
    rows = _take(words, ids, axis=0, mode="promise_in_bounds")  # ids.shape + (words a row,)
    lead = tuple(rows.shape[:-1])
    flat = reshape(rows, (-1, rows.shape[-1]))
    m = int(flat.shape[0])
    if m == 0:  # no rows: nothing to dequantise (a dequant of zero rows is not a matrix)
        return zeros(lead + (k,), dtype="float32")
    out = flat.builder.bind(Op.DEQUANT, [flat], {"fmt": q.fmt, "shape": (m, k)})
    return reshape(out, lead + (k,))
