"""Data parallelism over the adapters of one host: :class:`Sharded` values, :func:`shard`,
:func:`replicate` and :func:`all_reduce`.

fusec chooses an explicit sharding API over a ``pmap``-style transform:

- It is explicit: ``fusec.shard(x, devices)`` says which rows go to which device, and a jitted
  function called with Sharded arguments runs once per device on that device's piece (each
  device's call in a thread of its own, so that the devices work at the same time). Nothing in
  the traced program knows about devices: the same function runs on one device or on eight.
- It composes with ``gpu_jit`` and ``grad`` as they are: a training step is ``grad`` inside a
  jitted function, called on a Sharded batch, followed by ``all_reduce`` of the gradients.
  There is no collective inside the traced program.
- WebGPU has no communication between devices (no peer copies, no shared memory): a collective
  inside a program would have to split it at that point anyway, into a part before, a copy
  through the host and a part after. ``all_reduce`` *is* that copy through the host, between
  two jitted calls, where the user can see what it costs.

``all_reduce`` reads each device's shard back (in parallel threads), reduces on the host and
uploads the result to every device, in chunks so that reading the next chunk overlaps reducing
and uploading the last one.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Optional

import numpy as np

from . import dtypes, runtime
from .errors import FusecError
from .runtime import (
    Array,
    DeviceInfo,
    Runtime,
    _chunks,
    device_put,
    on_device,
    on_devices,
    resolve_device,
)
from .tree import flatten_with_paths, unflatten


class Sharded:
    """A value spread over several devices: one :class:`fusec.Array` per device (``shards``).

    Made by :func:`shard` (pieces of an array along ``axis``), :func:`replicate` (the same value
    on each device: ``axis`` None), a jitted call with Sharded arguments (one result per device:
    ``axis`` 0, or None where every Sharded argument was replicated) and :func:`all_reduce`.
    ``np.asarray(s)`` is the global value: the shards concatenated along ``axis`` (stacked, where
    they are 0-d: per-device scalars), or shard 0 of a replicated value. ``shape``, ``dtype``,
    ``ndim`` and ``size`` are the global value's. In pytrees a Sharded is a leaf."""

    __slots__ = ("shards", "_rts", "axis")

    def __init__(self, shards: Sequence[Array], rts: Sequence[Runtime], axis: Optional[int]
                 ) -> None:
        self.shards = tuple(shards)
        self._rts = tuple(rts)
        self.axis = axis

    @property
    def devices(self) -> tuple[DeviceInfo, ...]:
        """The devices, in the order of ``shards``."""
        return tuple(rt.info for rt in self._rts)

    @property
    def dtype(self) -> np.dtype:  # type: ignore[type-arg]
        return self.shards[0].dtype

    @property
    def shape(self) -> tuple[int, ...]:
        first = self.shards[0].shape
        if self.axis is None:
            return first
        if not first:  # per-device scalars: stacked
            return (len(self.shards),)
        ax = self.axis
        return first[:ax] + (sum(s.shape[ax] for s in self.shards),) + first[ax + 1:]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def _shard_values(self) -> list[np.ndarray]:
        """Every shard read back, the devices in parallel."""
        return on_devices(self._rts, [functools.partial(np.asarray, s) for s in self.shards])

    def numpy(self) -> np.ndarray:
        """A numpy copy of the global value (waits for the computations)."""
        return np.array(self.__array__())

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if self.axis is None:
            out = np.asarray(self.shards[0])
        else:
            parts = self._shard_values()
            out = (np.stack(parts) if parts[0].ndim == 0
                   else np.concatenate(parts, axis=self.axis))
        if dtype is not None and np.dtype(dtype) != out.dtype:
            return out.astype(dtype)
        return np.array(out) if copy else out

    def block_until_ready(self) -> Sharded:
        """Wait until every shard's computation has finished; returns self."""
        for s in self.shards:
            if s._rt is not None:
                s._rt.flush()  # every device's batch starts before any device is waited for
        for s in self.shards:
            s.block_until_ready()
        return self

    def __repr__(self) -> str:
        where = ", ".join(str(rt.info.index) for rt in self._rts)
        how = "replicated" if self.axis is None else f"axis {self.axis}"
        return (f"fusec.Sharded(shape={self.shape}, dtype={self.dtype}, {how}, "
                f"devices [{where}])")


def runtimes(devices: Any, what: str) -> tuple[Runtime, ...]:
    """The runtimes of a sequence of devices (DeviceInfo or indices), at least one, distinct."""
    if isinstance(devices, (DeviceInfo, int, np.integer)) or not isinstance(devices, Sequence):
        raise FusecError(f"{what}: devices must be a list of devices (fusec.devices(), or some "
                         f"of them, or their indices); got {type(devices).__name__} {devices!r}")
    if not devices:
        raise FusecError(f"{what}: devices is empty; pass at least one device")
    rts = []
    for d in devices:
        rt = resolve_device(d, what)
        if rt is None:
            raise FusecError(f"{what}: the numpy interpreter is not a device to shard over; pass "
                             "devices from fusec.devices()")
        if rt in rts:
            raise FusecError(f"{what}: device {rt.info.index} appears twice in devices")
        rts.append(rt)
    return tuple(rts)


def shard(x: Any, devices: Any, axis: int = 0) -> Sharded:
    """Split ``x`` (a numpy array or :class:`fusec.Array`) along ``axis`` into ``len(devices)``
    pieces, piece i on ``devices[i]`` (a list of :class:`DeviceInfo` from ``fusec.devices()`` or
    their indices). Sizes that do not divide split as ``numpy.array_split`` does: the first
    pieces one row longer. Pass the result to jitted functions to run them on every device."""
    rts = runtimes(devices, "shard")
    if isinstance(x, Sharded):
        raise FusecError("shard: x is Sharded already; np.asarray(x) is its global value")
    dtype = x._dtype if isinstance(x, Array) else None
    host = np.asarray(x)
    if host.ndim == 0:
        raise FusecError("shard: x is 0-d, with no axis to split; replicate() puts the same value "
                         "on each device")
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool) or \
            not -host.ndim <= axis < host.ndim:
        raise FusecError(f"shard: axis must be an int in [{-host.ndim}, {host.ndim}) for an array "
                         f"of shape {host.shape}; got {axis!r}")
    ax = int(axis) % host.ndim
    if host.shape[ax] < len(rts):
        raise FusecError(f"shard: axis {ax} of x has {host.shape[ax]} entries, fewer than the "
                         f"{len(rts)} devices; every device needs at least one")
    pieces = np.array_split(host, len(rts), axis=ax)
    shards = on_devices(rts, [functools.partial(device_put, p, rt.info, dtype)
                              for p, rt in zip(pieces, rts)])
    return Sharded(shards, rts, ax)


def replicate(x: Any, devices: Any) -> Sharded:
    """The same value (a numpy array, scalar or :class:`fusec.Array`) on each of ``devices``:
    a Sharded with ``axis`` None. An Array keeps its own buffer on its own device; the others
    get copies (read back once)."""
    rts = runtimes(devices, "replicate")
    if isinstance(x, Sharded):
        raise FusecError("replicate: x is Sharded already")
    own = x._rt if isinstance(x, Array) and x._host is None else None
    dtype = x._dtype if isinstance(x, Array) else None
    host = np.asarray(x) if own is None or any(rt is not own for rt in rts) else None

    def put(rt: Runtime) -> Array:
        if rt is own:
            return x  # type: ignore[no-any-return]
        return device_put(host, rt.info, dtype)

    return Sharded(on_devices(rts, [functools.partial(put, rt) for rt in rts]), rts, None)


_OPS = ("sum", "mean")


def all_reduce(tree: Any, op: str = "sum") -> Any:
    """The element-wise ``op`` ("sum" or "mean") over the shards of every Sharded leaf of
    ``tree``, as a replicated Sharded on the same devices (each shard of a leaf the same shape).

    It goes through the host (WebGPU devices cannot reach each other): per chunk of at most
    ``fusec.runtime.COPY_CHUNK`` bytes, each device's worker thread reads its shards' bytes back
    (small leaves share a chunk: one submit and one map for many), this thread reduces them, and
    the workers upload the result to every device; reading chunk k + 1 overlaps reducing and
    uploading chunk k.

    The reduction: over two devices, float32 leaves are reduced in float32 (a sum is one
    addition, a mean a/2 + b/2: one rounding either way, as in float64); otherwise floats
    accumulate in float64 and are rounded once to their dtype (float32 or float16); integers add
    in their dtype, wrapping as on the device.
    "mean" takes floating-point leaves only; bool leaves are refused."""
    if op not in _OPS:
        raise FusecError(f"all_reduce: op must be one of {', '.join(_OPS)}; got {op!r}")
    leaves, td = flatten_with_paths(tree, "tree")
    if not leaves:
        return tree
    values: list[Sharded] = []
    for path, x in leaves:
        if type(x) is not Sharded:
            raise FusecError(f"all_reduce: {path} is a {type(x).__name__}, not a fusec.Sharded; "
                             "all_reduce combines the per-device values of a call on Sharded "
                             "arguments (or of fusec.shard / fusec.replicate)")
        values.append(x)
    rts = values[0]._rts
    for (path, _), x in zip(leaves, values):
        if x._rts != rts:
            raise FusecError(
                f"all_reduce: {path} is on devices {[rt.info.index for rt in x._rts]}, "
                f"{leaves[0][0]} on {[rt.info.index for rt in rts]}; every leaf must be on the "
                "same devices")
        first = x.shards[0]
        for i, s in enumerate(x.shards):
            if s.shape != first.shape or s._dtype != first._dtype:
                raise FusecError(
                    f"all_reduce: the shards of {path} differ: shard 0 is {first._dtype}"
                    f"{list(first.shape)}, shard {i} {s._dtype}{list(s.shape)}; all_reduce "
                    "combines values of one shape (per-device gradients, sums)")
        kind = np.dtype(first._dtype).kind
        if kind == "b" or (op == "mean" and kind != "f"):
            raise FusecError(f"all_reduce: {path} has dtype {first._dtype}; op {op!r} takes "
                             f"{'floating-point' if op == 'mean' else 'numeric'} arrays")
    if len(rts) == 1:  # nothing to combine: the value is its own sum and mean
        return unflatten(td, [Sharded(x.shards, rts, None) for x in values])
    return unflatten(td, _reduce(values, rts, op))


def _reduce(values: list[Sharded], rts: tuple[Runtime, ...], op: str) -> list[Sharded]:
    n = len(rts)
    for x in values:
        for s, rt in zip(x.shards, rts):
            s.device_buffer(rt)  # host data (a literal output) goes up first: read like the rest
    sizes = [x.shards[0].nbytes for x in values]
    outs = [[rt.buffer(nb) for rt in rts] for nb in sizes]  # [leaf][device]
    # the chunks: lists of pieces (leaf, offset, bytes); small leaves share a chunk
    chunks: list[list[tuple[int, int, int]]] = [[]]
    fill = 0
    for j, nb in enumerate(sizes):
        for off, size in _chunks(nb):
            if fill + size > runtime.COPY_CHUNK and chunks[-1]:
                chunks.append([])
                fill = 0
            chunks[-1].append((j, off, size))
            fill += size
    storage = [np.dtype(dtypes.NUMPY_STORAGE[x.shards[0]._dtype]) for x in values]

    def read(d: int, chunk: list[tuple[int, int, int]]) -> memoryview:
        return rts[d].read_pieces([(values[j].shards[d]._buffer, off, size)
                                   for j, off, size in chunk])

    def write(d: int, chunk: list[tuple[int, int, int]], data: np.ndarray) -> int:
        pieces = []
        pos = 0
        for j, off, size in chunk:
            pieces.append((outs[j][d], off, data[pos:pos + size]))
            pos += size
        return rts[d].write_pieces(pieces)

    def reduce(chunk: list[tuple[int, int, int]], parts: list[memoryview]) -> np.ndarray:
        out = np.empty(sum(size for _, _, size in chunk), np.uint8)
        pos = 0
        for j, _, size in chunk:
            dt = storage[j]
            count = size // dt.itemsize
            views = [np.frombuffer(p, dt, count, pos) for p in parts]
            res = out[pos:pos + size].view(dt)
            if dt.kind != "f":
                np.add(views[0], views[1], out=res)  # integers: wrap, in any order alike
                for v in views[2:]:
                    np.add(res, v, out=res)
            elif n == 2 and dt == np.float32:
                # one rounding, as the float64 detour would give, at a fraction of its cost: a
                # sum is one addition; a mean a/2 + b/2 (halving is exact but for subnormals)
                if op == "sum":
                    np.add(views[0], views[1], out=res)
                else:
                    np.multiply(views[0], np.float32(0.5), out=res)
                    res += views[1] * np.float32(0.5)
            else:
                acc = views[0].astype(np.float64)
                for v in views[1:]:
                    acc += v
                if op == "mean":
                    acc /= n
                res[...] = acc
            pos += size
        return out

    def reads(chunk: list[tuple[int, int, int]]) -> list[Future[Any]]:
        return [on_device(rt, read, d, chunk) for d, rt in enumerate(rts)]

    uploads: list[Future[Any]] = []
    nxt = reads(chunks[0])
    for k, chunk in enumerate(chunks):
        cur = nxt
        if k + 1 < len(chunks):
            nxt = reads(chunks[k + 1])  # queued before this chunk's uploads: read meanwhile
        data = reduce(chunk, [f.result() for f in cur])
        uploads += [on_device(rt, write, d, chunk, data) for d, rt in enumerate(rts)]
    last = [0] * n
    for i, f in enumerate(uploads):
        last[i % n] = max(last[i % n], f.result())
    return [Sharded([Array(x.shards[0].shape, x.shards[0]._dtype, buffer=outs[j][d],
                           submission=last[d]) for d in range(n)], rts, None)
            for j, x in enumerate(values)]
