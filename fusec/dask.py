"""fusec on a Dask cluster: one worker process per GPU, jitted functions over Dask arrays' blocks.

Data larger than one machine holds is Dask's job (``dask.distributed``): fusec adds a worker
plugin that pins each worker process to one adapter, and runs jitted functions over the blocks of
Dask arrays, compiled once per worker process rather than once per task::

    from distributed import Client, LocalCluster
    import dask.array as da
    import fusec.dask
    import fusec.numpy as fnp

    client = Client(LocalCluster(n_workers=2, threads_per_worker=1))
    fusec.dask.setup(client, adapters=[0, 1])          # worker 0 -> adapter 0, worker 1 -> 1
    x = da.random.random((40_000, 4096), chunks=(5_000, 4096)).astype("float32")
    y = fusec.dask.map_blocks(lambda b: fnp.tanh(b) * 2.0, x, dtype="float32")
    s = fusec.dask.reduction(lambda b: fnp.sum(fnp.exp(b) * b), x).compute()

Needs the ``dask`` extra (``pip install fusec[dask]``, i.e. ``dask[distributed]``).

Adapters (``fusec.devices()`` indices) are assigned per worker by :class:`FusecPlugin`: an
explicit ``{worker name: index}`` mapping, else round robin over ``adapters`` by the worker's
ordinal: its name when that is an integer (``LocalCluster`` names its workers 0, 1, ...; ``dask
worker --name 3``) or ends in ``-<integer>`` (``dask worker --name gpu --nworkers 2`` gives
``gpu-0``, ``gpu-1``), else its position among the workers of its host sorted by address. Workers
started by hand can instead preload this module (``dask worker --preload fusec.dask``), which
reads ``FUSEC_DASK_ADAPTERS`` (see :func:`dask_setup`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import threading
from collections.abc import Mapping, Sequence
from itertools import product
from typing import Any, Callable, Optional, Union

import cloudpickle
import numpy as np
from dask import array as da
from distributed import WorkerPlugin

from . import config, runtime
from . import dtypes as _dtypes
from .cache import cache_info
from .errors import FusecError
from .jit import JitFunction, gpu_jit
from .trace import Aval, trace_function
from .tree import LEAF, flatten_with_paths

__all__ = ["FusecPlugin", "setup", "dask_setup", "map_blocks", "reduction", "worker_info"]

PLUGIN_NAME = "fusec"
_COMBINE = ("sum", "max", "min")
_BACKEND_NAMES = ("auto", "gpu", "cpu", *runtime._BACKENDS)

# -- which adapter a worker uses ------------------------------------------------------------------

# the adapter index (and backend) this process was pinned to by the plugin or the preload
_PINNED: Optional[tuple[int, str]] = None


def _ordinal_from_name(name: Any) -> Optional[int]:
    """A worker's ordinal from its name: ``3`` or ``"3"``, or a ``-3`` suffix; None otherwise."""
    if isinstance(name, int) and not isinstance(name, bool):
        return name if name >= 0 else None
    m = re.fullmatch(r"(?:.*-)?(\d+)", str(name))
    return int(m.group(1)) if m else None


def _check_index(index: int, what: str) -> None:
    """Refuse an adapter index this process has no adapter for (enumerating adapters does not
    create fusec's runtime)."""
    found = runtime.devices()
    if not 0 <= index < len(found):
        listed = ", ".join(f"{d.index}: {d.adapter} ({d.backend})" for d in found) or "none"
        raise FusecError(f"{what}: adapter index {index} is not an index of fusec.devices() on "
                         f"this worker, which has {len(found)} adapter(s) ({listed})")


def _pin(index: int, backend: Optional[str], what: str) -> None:
    """Make fusec in this process use adapter ``index`` (and ``backend``, where given). Fusec
    reads both when it creates its runtime: once that exists with another adapter, say so."""
    global _PINNED
    _check_index(index, what)
    if runtime._RESOLVED:
        rt = runtime._RUNTIME
        current = rt.info.index if rt is not None else None
        if current != index:
            now = (f"adapter {current} ({rt.info.adapter}, {rt.info.backend})" if rt is not None
                   else f"the numpy interpreter ({runtime._REASON})")
            raise FusecError(
                f"{what}: this worker should use adapter {index}, but fusec's runtime already "
                f"runs here on {now}; the adapter is chosen once per process. Register the "
                "plugin before anything runs fusec on the workers (or restart them: "
                "client.restart()).")
    # os.environ too: processes the worker's tasks start use the same adapter
    os.environ["FUSEC_ADAPTER"] = str(index)
    config.set("adapter", str(index))
    if backend:
        os.environ["FUSEC_BACKEND"] = backend
        config.set("backend", backend)
    _PINNED = (index, backend or str(config.get("backend") or "auto"))


def _check_backend(backend: Optional[str]) -> Optional[str]:
    if backend is None:
        return None
    b = str(backend).strip().lower()
    if b not in _BACKEND_NAMES:
        raise FusecError(f"backend={backend!r} is not one of {', '.join(_BACKEND_NAMES)}")
    return b


def _check_indices(values: Sequence[Any], what: str) -> list[int]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise FusecError(f"{what}: {v!r} is not an adapter index (a non-negative integer "
                             "position in fusec.devices())")
        out.append(int(v))
    return out


class FusecPlugin(WorkerPlugin):
    """A Dask worker plugin that pins each worker process to one fusec adapter.

    ``adapters``: ``fusec.devices()`` indices to spread the workers over, round robin by the
    worker's ordinal (see the module's docstring); None: every adapter of the worker's machine.
    ``mapping``: ``{worker name: index}``, which comes first where it names the worker (names
    compare as strings); a worker it does not name uses ``adapters`` if given, else is an error.
    ``backend``: also set ``FUSEC_BACKEND`` on the workers (``"gpu"`` lets fusec use a software
    adapter such as lavapipe, which it otherwise leaves for its numpy interpreter).

    Setup must happen before fusec creates its runtime in the worker (the adapter is chosen once
    per process): a worker whose runtime already runs on another adapter raises a FusecError, as
    does an index the worker has no adapter for. Use one thread per worker
    (``threads_per_worker=1``): a process's GPU work goes through one queue anyway.
    """

    name = PLUGIN_NAME
    idempotent = False  # registering again replaces the plugin (and re-checks every worker)

    def __init__(self, adapters: Optional[Sequence[int]] = None, *,
                 mapping: Optional[Mapping[Any, int]] = None,
                 backend: Optional[str] = None) -> None:
        if adapters is not None:
            if isinstance(adapters, (str, bytes)) or not isinstance(adapters, Sequence):
                raise FusecError(f"adapters={adapters!r}: expected a list of adapter indices, "
                                 "e.g. [0, 1]")
            if not adapters:
                raise FusecError("adapters=[]: give at least one adapter index, or None for "
                                 "every adapter of each worker's machine")
        self.adapters = None if adapters is None else _check_indices(adapters, "adapters")
        if mapping is not None and not isinstance(mapping, Mapping):
            raise FusecError(f"mapping={mapping!r}: expected a dict {{worker name: index}}")
        self.mapping = {str(k): i for k, i in zip(
            (mapping or {}).keys(), _check_indices(list((mapping or {}).values()), "mapping"))}
        self.backend = _check_backend(backend)

    async def _ordinal(self, worker: Any) -> int:
        found = _ordinal_from_name(worker.name)
        if found is not None:
            return found
        # no number in the name: the worker's position among its host's workers by address
        ident = await worker.scheduler.identity()
        host = worker.address.rsplit(":", 1)[0]
        same = sorted(a for a in ident.get("workers", {}) if a.rsplit(":", 1)[0] == host)
        if worker.address not in same:
            same = sorted([*same, worker.address])
        return same.index(worker.address)

    async def choose(self, worker: Any) -> int:
        """The adapter index for ``worker``."""
        key = str(worker.name)
        if key in self.mapping:
            return self.mapping[key]
        if self.mapping and self.adapters is None:
            raise FusecError(f"FusecPlugin: worker {worker.name!r} ({worker.address}) is not in "
                             f"mapping (names: {', '.join(sorted(self.mapping))}); name it, or "
                             "pass adapters=[...] for the workers it does not name")
        pool = self.adapters if self.adapters is not None else list(range(len(runtime.devices())))
        if not pool:
            raise FusecError(f"FusecPlugin: worker {worker.name!r} has no adapter "
                             "(fusec.devices() is empty there)")
        return pool[await self._ordinal(worker) % len(pool)]

    async def setup(self, worker: Any) -> None:  # type: ignore[override]
        index = await self.choose(worker)
        _pin(index, self.backend, f"FusecPlugin (worker {worker.name!r})")


def setup(client: Any, adapters: Optional[Sequence[int]] = None,
          backend: Optional[str] = None, mapping: Optional[Mapping[Any, int]] = None
          ) -> dict[str, int]:
    """Register a :class:`FusecPlugin` on ``client``'s cluster (its current workers and those
    that join later) and return ``{worker address: adapter index}``. Errors of the plugin on any
    worker (a bad index, a runtime already on another adapter) are raised here."""
    client.register_plugin(FusecPlugin(adapters, mapping=mapping, backend=backend))
    pinned: dict[str, Optional[tuple[int, str]]] = client.run(_pinned)
    return {addr: p[0] for addr, p in pinned.items() if p is not None}


def _pinned() -> Optional[tuple[int, str]]:
    return _PINNED


def dask_setup(worker: Any) -> None:
    """The preload hook: ``dask worker SCHEDULER --preload fusec.dask``.

    ``FUSEC_DASK_ADAPTERS=0,1`` spreads such workers over those adapters, round robin by the
    worker's ordinal from its name (``--name 0``, ``--name 1``; or ``--name gpu --nworkers 2``);
    ``FUSEC_DASK_BACKEND`` sets ``FUSEC_BACKEND`` with them. Unset, the worker keeps fusec's own
    choice (``FUSEC_ADAPTER`` and ``FUSEC_BACKEND`` in its environment still apply).
    """
    spec = os.environ.get("FUSEC_DASK_ADAPTERS", "").strip()
    backend = _check_backend(os.environ.get("FUSEC_DASK_BACKEND") or None)
    what = f"fusec.dask preload (worker {worker.name!r}, FUSEC_DASK_ADAPTERS={spec!r})"
    if not spec:
        if backend:
            os.environ["FUSEC_BACKEND"] = backend
            config.set("backend", backend)
        return
    try:
        pool = [int(s) for s in spec.split(",") if s.strip()]
    except ValueError:
        raise FusecError(f"{what}: expected comma-separated adapter indices, e.g. 0,1") from None
    pool = _check_indices(pool, what)
    if not pool:
        raise FusecError(f"{what}: expected comma-separated adapter indices, e.g. 0,1")
    ordinal = _ordinal_from_name(worker.name) if len(pool) > 1 else 0
    if ordinal is None:
        raise FusecError(f"{what}: cannot tell this worker's position from its name; start it "
                         "with --name <integer> (or --name <prefix> --nworkers N), or set "
                         "FUSEC_ADAPTER for it instead")
    _pin(pool[ordinal % len(pool)], backend, what)


def worker_info() -> dict[str, Any]:
    """What fusec does in this process: the device (creating fusec's runtime if nothing has
    yet), the adapter it was pinned to, how many functions the block registry holds, and the
    cache counters. Run it on every worker with ``client.run(fusec.dask.worker_info)``."""
    dev = runtime.default_device()
    return {"pinned": None if _PINNED is None else _PINNED[0], "index": dev.index,
            "adapter": dev.adapter, "backend": dev.backend, "adapter_type": dev.adapter_type,
            "functions": len(_REGISTRY), "cache": vars(cache_info()), "pid": os.getpid()}


# -- jitted functions over blocks -----------------------------------------------------------------

# key (sha256 of the cloudpickled function and its jit options) -> the process's JitFunction:
# every task of every map_blocks over the same function finds the same compiled pipelines
_REGISTRY: dict[str, JitFunction] = {}
_REGISTRY_LOCK = threading.Lock()


def _unwrap(f: Any) -> tuple[Callable[..., Any], tuple[str, ...], bool]:
    """The Python function under ``f`` and the jit options to re-create it with on a worker (a
    JitFunction itself holds compiled state and wgpu objects, which do not travel)."""
    if isinstance(f, JitFunction):
        return f.fun, tuple(sorted(f._binder.static_names)), f.fuse
    if not callable(f):
        raise TypeError(f"fusec.dask: expected a function (plain or gpu_jit); got "
                        f"{type(f).__name__}")
    return f, (), True


class _Kernel:
    """A picklable stand-in for a jitted function: its cloudpickled form and that form's hash.
    Called on a worker, it finds (or creates, once per process) the JitFunction and runs it."""

    def __init__(self, f: Any) -> None:
        fun, static, fuse = _unwrap(f)
        self.name = str(getattr(fun, "__name__", "f"))
        self.payload = cloudpickle.dumps((fun, static, fuse))
        self.key = hashlib.sha256(self.payload).hexdigest()
        # the client's own function (not pickled), traced for its output's shape and dtype
        self._fun: Optional[Callable[..., Any]] = fun

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "payload": self.payload, "key": self.key}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _fun=None)

    def __dask_tokenize__(self) -> tuple[str, str]:
        return ("fusec.dask", self.key)

    @property
    def __name__(self) -> str:  # dask names the graph's layers after it
        return self.name

    def jitted(self) -> JitFunction:
        """This process's JitFunction for the function (the registry's, else a new one)."""
        jf = _REGISTRY.get(self.key)
        if jf is None:
            with _REGISTRY_LOCK:
                jf = _REGISTRY.get(self.key)
                if jf is None:
                    fun, static, fuse = cloudpickle.loads(self.payload)
                    jf = gpu_jit(fun, static_argnames=static, fuse=fuse)
                    _REGISTRY[self.key] = jf
        return jf

    def out_aval(self, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[Any],
                 kwargs: Mapping[str, Any]) -> tuple[tuple[int, ...], np.dtype[Any]]:
        """The shape and dtype of the one array the function returns for blocks of these shapes:
        a trace on the client, which compiles nothing and needs no device (fusec's runtime is
        not created in the client process)."""
        avals = [Aval(tuple(int(d) for d in s), _dtypes.canonicalize(dt, "a Dask array's dtype"))
                 for s, dt in zip(shapes, dtypes)]
        _, in_tree = flatten_with_paths(tuple(range(len(avals))))
        fun = self._fun if self._fun is not None else cloudpickle.loads(self.payload)[0]
        closed = trace_function(functools.partial(fun, **kwargs), in_tree, avals, self.name)
        outs = closed.program.outputs
        if closed.out_tree != LEAF:
            raise FusecError(f"fusec.dask: {self.name} must return one array per block; it "
                             f"returns {len(outs)} in a container")
        return tuple(outs[0].shape), np.dtype(outs[0].dtype)

    def __call__(self, *blocks: Any, **kwargs: Any) -> np.ndarray:
        out = self.jitted()(*blocks, **kwargs)
        if isinstance(out, (tuple, list, dict)):
            raise FusecError(f"fusec.dask: {self.name} must return one array per block; it "
                             f"returned a {type(out).__name__}")
        return np.asarray(out)


class _PerBlock:
    """A reduction's per-block step: ``f(block)`` with a leading length-1 axis per axis of the
    input, so that Dask's own reductions combine the blocks' results."""

    def __init__(self, kernel: _Kernel, ndim: int) -> None:
        self.kernel = kernel
        self.ndim = ndim
        self.__name__ = kernel.name

    def __dask_tokenize__(self) -> tuple[str, str, int]:
        return ("fusec.dask.reduction", self.kernel.key, self.ndim)

    def __call__(self, block: Any) -> np.ndarray:
        out = self.kernel(block)
        return out.reshape((1,) * self.ndim + out.shape)


def _dask_arrays(arrays: Sequence[Any], what: str, names: Sequence[str] = ()) -> list[Any]:
    if not arrays:
        raise TypeError(f"{what}: give at least one Dask array")
    for i, a in enumerate(arrays):
        if not isinstance(a, da.Array):
            arg = names[i] if i < len(names) else f"array argument {i}"
            raise TypeError(f"{what}: {arg} is a {type(a).__name__}, expected a "
                            "dask.array.Array (da.from_array(x, chunks=...) makes one)")
    return list(arrays)


def map_blocks(f: Union[JitFunction, Callable[..., Any]], *arrays: Any, dtype: Any = None,
               chunks: Any = None, drop_axis: Any = None, new_axis: Any = None,
               **kwargs: Any) -> Any:
    """``f`` over the blocks of Dask arrays, jitted on the workers: a lazy Dask array of its
    outputs (numpy blocks). Like ``dask.array.map_blocks``: blocks of several arrays are paired
    by position; ``chunks``, ``drop_axis`` and ``new_axis`` describe an output whose blocks have
    another shape; ``kwargs`` go to every call of ``f`` (static arguments of a gpu_jit function,
    or scalars).

    ``f``: a ``gpu_jit`` function (its static arguments and ``fuse`` are kept) or a plain one
    written with ``fusec.numpy``; it is compiled once per worker process and signature, and
    reused by every later task and ``map_blocks`` over the same function (a per-process registry
    keyed by a hash of the cloudpickled function). It must return one array. ``dtype``: the
    output dtype; None finds it by tracing ``f`` on the client for the first block's shapes
    (nothing is compiled, no device opened there). ``block_info``/``block_id`` are not passed
    to ``f``.
    """
    xs = _dask_arrays(arrays, "fusec.dask.map_blocks")
    kern = _Kernel(f)
    if dtype is None:
        first = [tuple(c[0] for c in a.chunks) for a in xs]
        shape, dt = kern.out_aval(first, [a.dtype for a in xs], kwargs)
        ndim = len(shape)
    else:
        dt = np.dtype(dtype)
        drop = [drop_axis] if isinstance(drop_axis, int) else list(drop_axis or ())
        new = [new_axis] if isinstance(new_axis, int) else list(new_axis or ())
        ndim = max(a.ndim for a in xs) - len(drop) + len(new)
        if not new and chunks is not None and isinstance(chunks, (tuple, list)):
            ndim = max(ndim, len(chunks))
    # meta: dask would otherwise call f on empty arrays in the client to find the output type
    return da.map_blocks(kern, *xs, dtype=dt, chunks=chunks, drop_axis=drop_axis,
                         new_axis=new_axis, meta=np.empty((0,) * ndim, dt), **kwargs)


def reduction(f: Union[JitFunction, Callable[..., Any]], x: Any, combine: str = "sum",
              split_every: Optional[int] = None) -> Any:
    """A jitted per-block reduction: ``f(block)`` (a scalar or small array, the same shape for
    every block) on the workers, the blocks' results combined by ``combine`` ("sum", "max" or
    "min") through Dask's own tree reduction (``split_every`` as in ``dask.array.sum``). Returns
    a lazy Dask array of ``f``'s output shape: ``.compute()`` it.

    For example the sum of ``exp(x) * x`` over every element:
    ``fusec.dask.reduction(lambda b: fnp.sum(fnp.exp(b) * b), x).compute()``. ``f`` is compiled
    once per worker process as with :func:`map_blocks`; the client traces it once per distinct
    block shape to learn its output shape (nothing is compiled, no device opened there)."""
    (x,) = _dask_arrays([x], "fusec.dask.reduction", ["x"])
    if combine not in _COMBINE:
        raise FusecError(f"fusec.dask.reduction: combine={combine!r} is not one of "
                         f"{', '.join(_COMBINE)}")
    kern = _Kernel(f)
    avals = {kern.out_aval([shape], [x.dtype], {}) for shape in product(*map(set, x.chunks))}
    if len(avals) != 1:
        listed = "; ".join(f"{s} {d}" for s, d in sorted(avals, key=str))
        raise FusecError(f"fusec.dask.reduction: {kern.name} returns arrays of different "
                         f"shapes or dtypes for the blocks of x ({listed}); its result must "
                         "be the same for every block shape")
    ((shape, dt),) = avals
    nd = x.ndim
    out = da.map_blocks(_PerBlock(kern, nd), x, dtype=dt,
                        chunks=tuple((1,) * n for n in x.numblocks) + tuple((d,) for d in shape),
                        new_axis=list(range(nd, nd + len(shape))) or None,
                        meta=np.empty((0,) * (nd + len(shape)), dt))
    return getattr(out, combine)(axis=tuple(range(nd)), split_every=split_every)
