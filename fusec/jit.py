"""``gpu_jit`` and its stages: trace -> lower (passes + codegen) -> compile (pipelines) -> run.

One executable is cached per *signature*: the pytree structure of the dynamic arguments, each leaf's
shape and dtype (Python scalars are weakly typed, so their values do not matter), the values of
static arguments, and the device the call runs on (that of its Array arguments; see
``_placement``). A repeated signature neither traces nor compiles. Devices whose lowering is the
same (two GPUs of one model) share one trace and lowering; each compiles its own pipelines.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import hashlib
import inspect
import os
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union, cast

import numpy as np

from . import __version__, cache, codegen, config, diskcache, dtypes
from .errors import (
    DeviceLimitError,
    DTypeError,
    FusecError,
    SignatureError,
    StaticArgumentError,
    TraceError,
)
from .interpret import evaluate
from .ir import Lit, Op, Program, from_json, kernel_cost, kernel_eqns, to_json
from .passes import MemoryAnalysis, Options, analyse, run_pipeline, used_inputs
from .passes import tuning as passes_tuning
from .record import record
from .runtime import (
    Array,
    CpuExecutable,
    DeviceInfo,
    GpuExecutable,
    Runtime,
    _user_stacklevel,
    check_float16,
    device_label,
    get_runtime,
    on_devices,
    on_runtime,
    resolve_device,
)
from .sharding import Sharded
from .trace import Aval, Builder, ShapeDtype, Tracer, current_builder, set_eager_runner, tracing
from .tree import TreeDef, describe, flatten, flatten_with_paths, node_type, unflatten

Signature = tuple[Any, ...]


# --- arguments ------------------------------------------------------------------------------------


def _aval(path: str, x: Any, fname: str) -> Aval:
    if type(x) is Array:  # the common case of a cached call: no dtype conversions
        return Aval(x._shape, str(x._dtype))
    if isinstance(x, (Array, ShapeDtype)):
        return Aval(tuple(x.shape), str(np.dtype(x.dtype)) if isinstance(x, Array) else x.dtype)
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        if isinstance(x, int) and not isinstance(x, bool) and not -(2**31) <= x < 2**32:
            raise DTypeError(f"argument '{path}' of {fname} is the Python int {x}, which does not "
                             "fit in 32 bits (fusec computes in int32/uint32/float32); pass a "
                             "float, or a numpy array of a supported dtype")
        return Aval((), dtypes.weak_dtype(x), weak=True)
    if isinstance(x, np.generic) and not isinstance(x, np.ndarray):
        if x.dtype.name in dtypes.SUPPORTED:
            return Aval((), x.dtype.name)
        if x.dtype.kind in "biuf":
            return Aval((), dtypes.weak_dtype(x.item()), weak=True)
    if isinstance(x, np.ndarray):
        return Aval(x.shape, dtypes.canonicalize(x.dtype, f"argument '{path}' of {fname}"))
    if isinstance(x, complex) or (hasattr(x, "dtype") and np.dtype(x.dtype).kind == "c"):
        dtypes.canonicalize(np.complex64, f"argument '{path}' of {fname}")
    if hasattr(x, "__array__"):
        return _aval(path, np.asarray(x), fname)
    raise TraceError(
        f"argument '{path}' of {fname} is a {type(x).__name__}; jitted functions take arrays, "
        f"Python scalars, or tuples/lists/dicts of them. To pass other values, mark the argument "
        f"static: @gpu_jit(static_argnames=('{path.split('[')[0].split('.')[0]}',))")


def _to_array(x: Any, aval: Aval) -> Array:
    if isinstance(x, Array):
        return x
    value = x.item() if isinstance(x, np.generic) else x
    if aval.weak and aval.dtype == "int32" and value >= 2**31:
        value -= 2**32  # a weak int in [2**31, 2**32) only ever meets uint32 arrays: same bits
    host = np.asarray(value, dtype=aval.dtype)
    return Array(aval.shape, aval.dtype, host=host)


def _quick_leaves(args: tuple[Any, ...], orders: dict[tuple[Any, ...], tuple[Any, ...]]
                  ) -> Optional[tuple[list[Any], tuple[Any, ...], bool]]:
    """The leaves of positional arguments that are Arrays, numpy arrays and numpy scalars of
    supported dtypes in plain dicts, lists, tuples and registered pytree nodes, in the order of
    ``_flatten_args``, and a key of their structure, shapes, dtypes and devices; None where
    anything else is in them (the full signature handles it); and whether the leaves are all
    Arrays. ``orders`` keeps each dict's keys (in insertion order) sorted as the pytree order
    sorts them."""
    leaves: list[Any] = []
    # [a leaf on no device yet (the call's device is then the current default), a numpy leaf]
    hosted = [False, False]
    # a flat key, items appended one by one (no tuple per leaf: a call of a few hundred leaves
    # would otherwise allocate enough to set off the garbage collector). Each kind of item
    # (a container's type, then its length, or a registered node's aux data and length; a
    # dict's sorted keys behind ``dict``; a leaf's shape, dtype name and device) comes where
    # the ones before it say, so one key has one structure
    key: list[Any] = ["tree", len(args)]
    add = key.append

    def walk(x: Any) -> bool:
        t = type(x)
        if t is Array:
            leaves.append(x)
            add(x._shape)
            add(x._dtype)
            add(x._rt)
            if x._rt is None:
                hosted[0] = True
            return True
        if t is np.ndarray or isinstance(x, np.generic):
            # (host data of a dtype fusec computes in as it is: uploaded by the call; other
            # dtypes, narrowed or refused, take the full path and its messages)
            name = x.dtype.name
            if name not in dtypes.SUPPORTED:
                return False
            leaves.append(x)
            add(x.shape)
            add(name)
            add(None)
            hosted[0] = hosted[1] = True
            return True
        if t is dict:
            keys = tuple(x)
            order = orders.get(keys)
            if order is None:
                try:
                    order = orders[keys] = (dict, *sorted(x, key=repr))
                except TypeError:  # (unorderable reprs cannot happen; the full path decides)
                    return False
            add(order)
            return walk_all(map(x.__getitem__, order[1:]))
        if t is list or t is tuple:
            add(t)
            add(len(x))
            return walk_all(x)
        node = node_type(t)
        if node is not None:  # a registered type: its aux data is part of its structure
            kids, aux = node.flatten(x)
            children = list(kids)
            add(t)
            add(aux)
            add(len(children))
            return walk_all(children)
        return False

    def walk_all(xs: Iterable[Any]) -> bool:
        # an Array inline (most leaves are): no call of walk per leaf
        for v in xs:
            if type(v) is Array:
                leaves.append(v)
                rt = v._rt
                add(v._shape)
                add(v._dtype)
                add(rt)
                if rt is None:
                    hosted[0] = True
            elif not walk(v):
                return False
        return True

    try:
        if not walk_all(args):
            return None
    finally:
        # walk and walk_all refer to each other through their closures' cells: a reference
        # cycle that would keep this call's leaves (the arguments' Arrays) alive until the
        # garbage collector's next pass, and their buffers out of the pool meanwhile (a decode
        # loop then made a new buffer and a new bind group for its token on every step).
        # Emptying the cells breaks it.
        walk = walk_all = None  # type: ignore[assignment]
    if hosted[0]:
        add(get_runtime())
    return leaves, tuple(key), not hosted[1]


class _ShardedArgs(Exception):
    """A call has Sharded arguments: it runs once per device (JitFunction._call_sharded)."""


def _placement(name: str, leaves: Sequence[tuple[str, Any]], where: Optional[Runtime] = None,
               why: str = "") -> tuple[tuple[Aval, ...], Optional[Runtime]]:
    """The leaves' avals, and the device (runtime) the call runs on: ``where`` if given (a
    pinned device, a shard's device, a Compiled's: ``why`` says which), else that of the Array
    arguments, else the current default. Arrays on two devices are an error (a call runs on
    one); host data (numpy, scalars, Arrays not uploaded yet) goes to the call's device.
    Raises _ShardedArgs for a Sharded argument."""
    avals = []
    found: Optional[Runtime] = None
    for p, x in leaves:
        if type(x) is Sharded:
            raise _ShardedArgs
        avals.append(_aval(p, x, name))
        if isinstance(x, Array):
            r = x._rt
            if r is not None and r is not found:
                if found is not None:
                    raise _mixed_devices(name, leaves)
                found = r
    if where is not None:
        if found is not None and found is not where:
            p = next(p for p, x in leaves if isinstance(x, Array) and x._rt is found)
            raise FusecError(f"{name} runs on {device_label(where)} ({why}), but argument '{p}' "
                             f"is on {device_label(found)}; copy it there first: "
                             f"{p}.to(fusec.devices()[{where.info.index}])")
        return tuple(avals), where
    return tuple(avals), found if found is not None else get_runtime()


def _mixed_devices(name: str, leaves: Sequence[tuple[str, Any]]) -> FusecError:
    by: dict[Runtime, list[str]] = {}
    for p, x in leaves:
        if isinstance(x, Array) and x._rt is not None:
            by.setdefault(x._rt, []).append(f"'{p}'")
    parts = "; ".join(f"{', '.join(ps)} on {device_label(rt)}" for rt, ps in by.items())
    return FusecError(f"{name}: its array arguments are on different devices: {parts}. A call "
                      "runs on one device: copy the arguments to one with x.to(device), or "
                      "use fusec.shard / fusec.replicate to run on several")


class _Binder:
    """Splits a call's arguments into dynamic (pytrees of arrays) and static parts."""

    def __init__(self, fun: Callable[..., Any], name: str, static_argnums: Sequence[int],
                 static_argnames: Sequence[str]) -> None:
        self.name = name
        try:
            self.sig: Optional[inspect.Signature] = inspect.signature(fun)
        except (TypeError, ValueError):
            self.sig = None
        names = set(static_argnames)
        if self.sig is not None:
            params = list(self.sig.parameters.values())
            positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY,
                                                           p.POSITIONAL_OR_KEYWORD)]
            for i in static_argnums:
                if not -len(positional) <= i < len(positional):
                    raise StaticArgumentError(
                        f"static_argnums={tuple(static_argnums)}: {name} has only "
                        f"{len(positional)} positional parameters")
                names.add(positional[i].name)
            has_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
            for n in static_argnames:
                if n not in self.sig.parameters and not has_kwargs:
                    raise StaticArgumentError(
                        f"static_argnames names '{n}', but {name} has no parameter of that name "
                        f"(parameters: {', '.join(self.sig.parameters)})")
        self.static_names = names
        self.static_nums = tuple(static_argnums)

    def leading_dynamic(self) -> int:
        """How many leading positional arguments are dynamic for sure: those before the first
        static parameter, ``*args`` or keyword-only one (all of them with no static ones and
        no signature)."""
        if self.sig is None:
            return 0 if self.static_names or self.static_nums else 1 << 30
        n = 0
        for p in self.sig.parameters.values():
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) or \
                    p.name in self.static_names:
                break
            n += 1
        return n

    def names_of(self, argnums: Sequence[int], argnames: Sequence[str]) -> set[str]:
        """Parameter names for positional indices and names (for donate_argnums/argnames)."""
        names = set(argnames)
        if self.sig is None:
            return names | {f"arg{i}" for i in argnums}
        positional = [p.name for p in self.sig.parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        for i in argnums:
            if not -len(positional) <= i < len(positional):
                raise StaticArgumentError(f"donate_argnums: {self.name} has only "
                                          f"{len(positional)} positional parameters")
            names.add(positional[i])
        return names

    def split(self, args: tuple[Any, ...], kwargs: dict[str, Any]
              ) -> tuple[dict[str, Any], tuple[tuple[str, Any], ...]]:
        if self.sig is None:
            dyn = {f"arg{i}": a for i, a in enumerate(args) if i not in self.static_nums}
            static = tuple((f"arg{i}", a) for i, a in enumerate(args) if i in self.static_nums)
            return dyn, static
        try:
            ba = self.sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.name}: {exc}") from None
        # defaults the caller did not pass stay Python values, as in a plain call
        dyn = {}
        static_items: list[tuple[str, Any]] = []
        for k, v in ba.arguments.items():
            if k in self.static_names:
                static_items.append((k, v))
            else:
                dyn[k] = v
        for k, v in static_items:
            try:
                hash(v)
            except TypeError:
                raise StaticArgumentError(
                    f"static argument '{k}' of {self.name} must be hashable (its value is part of "
                    f"the cache key); got {type(v).__name__} {v!r}. Pass a tuple instead of a "
                    "list, or make it a dynamic argument.") from None
        return dyn, tuple(static_items)

    def call(self, fun: Callable[..., Any], dyn: dict[str, Any],
             static: tuple[tuple[str, Any], ...]) -> Any:
        if self.sig is None:
            merged = {**dyn, **dict(static)}
            return fun(*(merged[f"arg{i}"] for i in range(len(merged))))
        arguments = {}
        for name in self.sig.parameters:
            if name in dyn:
                arguments[name] = dyn[name]
            elif name in dict(static):
                arguments[name] = dict(static)[name]
        ba = inspect.BoundArguments(self.sig, arguments)  # type: ignore[arg-type]
        return fun(*ba.args, **ba.kwargs)


def _flatten_args(dyn: dict[str, Any]) -> tuple[list[tuple[str, Any]], TreeDef]:
    leaves: list[tuple[str, Any]] = []
    tds = []
    for name, value in dyn.items():
        sub, td = flatten_with_paths(value, name)
        leaves.extend(sub)
        tds.append((name, td))
    return leaves, ("args", tuple(tds))


def _unflatten_args(td: TreeDef, leaves: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pos = 0
    for name, sub in td[1]:
        n = _count(sub)
        out[name] = unflatten(sub, leaves[pos:pos + n])
        pos += n
    return out


def _count(td: TreeDef) -> int:
    if td == ("leaf",):
        return 1
    if td == ("none",):
        return 0
    return sum(_count(c) for c in td[2])


# --- stages ---------------------------------------------------------------------------------------


@dataclass
class Traced:
    """The result of ``f.trace(...)``: the program as traced, before any pass."""

    name: str
    program: Program
    in_tree: TreeDef
    in_avals: tuple[Aval, ...]
    in_paths: tuple[str, ...]
    out_tree: TreeDef
    const_values: list[Any]
    options: Options
    binder: Optional[_Binder] = None
    key: Optional[Signature] = None

    @property
    def ir(self) -> Program:
        return self.program

    def lower(self) -> Lowered:
        with on_runtime(_key_runtime(self.key)):
            return lower(self)


class Lowered:
    """The result of ``f.lower(...)``: the program after the pass pipeline, with kernels' WGSL.

    With the numpy interpreter as the backend nothing runs the lowered program: a jitted call's
    own Lowered runs the passes and code generation only when ``ir`` or ``kernels`` is read."""

    def __init__(self, traced: Traced, ir: Optional[Program] = None,
                 kernels: Optional[list[codegen.KernelCode]] = None) -> None:
        self.traced = traced
        self._ir = ir
        self._kernels = kernels

    def _lowered(self) -> tuple[Program, list[codegen.KernelCode]]:
        if self._ir is None or self._kernels is None:
            with on_runtime(_key_runtime(self.traced.key)):
                self._ir, self._kernels = _lower_program(self.traced)
        return self._ir, self._kernels

    @property
    def ir(self) -> Program:
        return self._lowered()[0]

    @property
    def kernels(self) -> list[codegen.KernelCode]:
        return self._lowered()[1]

    def __repr__(self) -> str:
        return f"<Lowered {self.traced.name}>"

    def as_text(self, what: str = "ir") -> str:
        """``"ir"``: the lowered program, kernel by kernel; ``"wgsl"``: every kernel's WGSL."""
        if what == "ir":
            return str(self.ir)
        if what == "wgsl":
            return "\n".join(str(k) for k in self.kernels)
        raise ValueError(f"as_text: what must be 'ir' or 'wgsl'; got {what!r}")

    def cost_analysis(self) -> dict[str, float]:
        """Estimated flops and bytes moved through device memory by the kernels. A loop's body
        counts once per iteration (a while loop's once: its trip count is not known)."""
        flops, nbytes = _cost(self.ir)
        return {"flops": float(flops), "bytes accessed": float(nbytes),
                "kernels": float(len(self.kernels))}

    def memory_analysis(self) -> MemoryAnalysis:
        """Bytes allocated for intermediates (pooled by liveness), outputs and donated reuse."""
        return analyse(self.ir)

    def compile(self) -> Compiled:
        """Build the GPU pipelines; the result is callable with arguments of this signature."""
        return compile_lowered(self, self.traced.binder, self.traced.key)


class Compiled:
    """A callable executable for one signature."""

    def __init__(self, lowered: Lowered, executable: Any, binder: Optional[_Binder] = None,
                 key: Optional[Signature] = None) -> None:
        self.lowered = lowered
        self.binder = binder
        self.key = key
        self.traced = lowered.traced
        self.executable = executable
        # the device it runs on (None: the numpy interpreter)
        self.rt: Optional[Runtime] = getattr(executable, "rt", None)
        self.used = (executable.used if isinstance(executable, CpuExecutable)
                     else used_inputs(lowered.ir))
        self._consts: Optional[list[Array]] = None
        self._const_ins: Optional[list[Optional[Array]]] = None
        # the leaves passed on where arguments are donated: the used ones and the donated ones
        # (a donated buffer may hold an output); unused inputs are never uploaded
        donated = set(self.traced.options.donated)
        self._kept = [used or i in donated for i, used in enumerate(self.used)]
        # no donation: the common cached call (captured constants ride along, made once)
        self._lean = not self.traced.options.donated
        # every input used too, and no constants: Array arguments go to the executable as they are
        self._fast_ok = self._lean and all(self.used) and not self.traced.const_values
        td = self.traced.out_tree
        # output structure fast paths: None = a single array, True = a flat tuple of arrays
        self._out_flat: Optional[bool] = (
            None if td == ("leaf",) else
            True if td[0] == "tuple" and all(c == ("leaf",) for c in td[2]) else False)

    def _const_arrays(self) -> list[Array]:
        if self._consts is None:
            consts = []
            for v in self.traced.const_values:
                if not isinstance(v, Array):
                    v = Array(np.shape(v), str(np.asarray(v).dtype), host=np.asarray(v))
                elif v._buffer is None and v._host is not None:
                    # host data: an Array of its own per executable (devices may share the
                    # lowering, and uploading commits an Array to one device)
                    v = Array(v._shape, v._dtype, host=v._host)
                elif self.rt is not None and v._rt is not self.rt:
                    v = v.to(self.rt.info)  # captured from another device: a copy here, once
                consts.append(v)
            self._consts = consts
        return self._consts

    def _const_inputs(self) -> list[Optional[Array]]:
        """The executable's inputs after the arguments: the captured constants it uses."""
        if self._const_ins is None:
            n = len(self.traced.in_avals)
            self._const_ins = [c if used else None
                               for c, used in zip(self._const_arrays(), self.used[n:])]
        return self._const_ins

    def run_arrays(self, arrays: Sequence[Array]) -> Any:
        """``run_leaves`` for leaves that are all Arrays (the jitted call's fast path)."""
        if not self._fast_ok:
            return self.run_leaves(arrays)
        return self._structured(self.executable.run(arrays))

    def _structured(self, outs: list[Any]) -> Any:
        """The outputs in the function's output structure."""
        if self._out_flat is None:
            return outs[0]
        return tuple(outs) if self._out_flat else unflatten(self.traced.out_tree, outs)

    def run_leaves(self, leaves: Sequence[Any]) -> Any:
        if self._lean:  # no donation: the common cached call
            # (unused inputs are passed as None: never uploaded, nor checked for being alive)
            ins: list[Optional[Array]] = [
                (x if type(x) is Array else _to_array(x, aval)) if used else None
                for x, aval, used in zip(leaves, self.traced.in_avals, self.used)]
            if self.traced.const_values:
                ins += self._const_inputs()
            return self._structured(self.executable.run(ins))
        t = self.traced
        donated = set(t.options.donated)
        inputs: list[Optional[Array]] = [
            (x if type(x) is Array else _to_array(x, aval)) if kept else None
            for x, aval, kept in zip(leaves, t.in_avals, self._kept)]
        if donated:
            # a donated array passed as another argument too: each donated array's id must
            # come up once among the leaves' (counted in one pass: a model's step donates
            # dozens of cache arrays among hundreds of leaves)
            arrays = [id(leaves[i]) for i in donated if isinstance(leaves[i], Array)]
            ids = set(arrays)
            if len(ids) < len(arrays) or sum(map(ids.__contains__, map(id, leaves))) > len(ids):
                seen: dict[int, int] = {}
                for y in leaves:
                    if isinstance(y, Array):
                        seen[id(y)] = seen.get(id(y), 0) + 1
                for i in sorted(donated):
                    x = leaves[i]
                    if isinstance(x, Array) and seen[id(x)] > 1:
                        raise FusecError(f"{t.name}: argument '{t.in_paths[i]}' is donated but "
                                         "the same array is also passed as another argument")
        rt = self.rt
        for i in donated:
            x = inputs[i]
            if x is not None and x._shared and rt is not None:
                inputs[i] = x.donation_copy(rt)  # another Array views its buffer: keep that one
        consts = self._const_arrays()
        for c, used in zip(consts, self.used[len(leaves):]):
            inputs.append(c if used else None)
        outs = self.executable.run(inputs)
        returned = {id(o) for o in outs} if donated else set()
        for i in donated:
            x = leaves[i]
            if isinstance(x, Array) and id(x) not in returned:
                x.donate(t.name)
        return self._structured(outs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run with arguments of exactly the signature this was compiled for."""
        if self.binder is None:
            raise SignatureError("this Compiled object has no argument binder; call it through "
                                 "its jitted function")
        dyn, static = self.binder.split(args, kwargs)
        leaves, td = _flatten_args(dyn)
        try:
            avals, rt = _placement(self.traced.name, leaves, self.rt, "compiled for it")
        except _ShardedArgs:
            raise SignatureError(f"{self.traced.name}: a Compiled runs on one device; call the "
                                 "jitted function with Sharded arguments") from None
        if (td, avals, static, rt) != self.key:
            # a Compiled with a binder always has a key (both come from the same Traced)
            want = cast(Signature, self.key)
            raise SignatureError(_explain_mismatch(self.traced.name, want,
                                                   (td, avals, static), [p for p, _ in leaves]))
        return self.run_leaves([x for _, x in leaves])

    @property
    def ir(self) -> Program:
        return self.lowered.ir


def _cost(prog: Program) -> tuple[int, int]:
    """(flops, bytes) of a lowered program's kernels; loops' bodies times their trip counts."""
    flops = 0
    nbytes = 0
    for e in prog.eqns:
        if e.op is Op.LOOP:
            f, n = _cost(e.params["body"])
            trips = e.params["trips"] if e.params["trips"] is not None else 1
            flops += trips * f
            nbytes += trips * n
        elif e.op is Op.KERNEL:
            f, n = kernel_cost(e)
            flops += f
            nbytes += n
    return flops, nbytes


def lower(traced: Traced, lazy: bool = False) -> Lowered:
    """The pass pipeline and codegen for ``traced``. ``lazy`` (a jitted call's own lowering):
    where the numpy interpreter is the backend, which runs the traced program, both wait until
    the result's ``ir`` or ``kernels`` is read."""
    if lazy and get_runtime() is None:
        return Lowered(traced)
    # Python's cycle collector would walk the lowering's many young objects (equations, kernel
    # bodies, the emitter's suspended generators) again and again: it made lowering a 10,000-op
    # program grow faster than the program. Nothing here makes cycles that must be freed early.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _lower(traced)
    finally:
        if enabled:
            gc.enable()


def _lower(traced: Traced) -> Lowered:
    return Lowered(traced, *_lower_program_now(traced))


def _lower_program(traced: Traced) -> tuple[Program, list[codegen.KernelCode]]:
    enabled = gc.isenabled()
    gc.disable()  # (see lower)
    try:
        return _lower_program_now(traced)
    finally:
        if enabled:
            gc.enable()


def _lower_program_now(traced: Traced) -> tuple[Program, list[codegen.KernelCode]]:
    t0 = time.perf_counter()
    rt = get_runtime()
    if rt is not None:
        check_float16(traced.program, rt.info.features, rt.info.adapter, traced.name)
    key = _disk_key(traced)
    entry = diskcache.load(key) if key else None
    if entry is not None:
        prog = from_json(entry["ir"])
        kernels = [codegen.KernelCode(**{**k, "grid": tuple(k["grid"])}) for k in entry["kernels"]]
        cache.STATS.disk_hits += 1
        config.log_compile(f"loaded {traced.name} from the persistent cache in "
                           f"{1e3 * (time.perf_counter() - t0):.1f} ms")
    else:
        prog = run_pipeline(traced.program, traced.options)
        kernels = [codegen.generate(e, traced.options.target, traced.options.workgroup_storage)
                   for e in kernel_eqns(prog)]
        cache.STATS.lowerings += 1
        if key:
            diskcache.store(key, {"ir": to_json(prog),
                                  "kernels": [dataclasses.asdict(k) for k in kernels]})
    if rt is not None:
        _check_sizes(traced, prog, rt.max_binding_size, rt.info.adapter)
    config.debug(1, f"{traced.name}: {len(kernels)} kernel(s) "
                    f"[{', '.join(k.name for k in kernels)}]")
    config.debug(2, f"{traced.name}: lowered in {1e3 * (time.perf_counter() - t0):.1f} ms")
    for k in kernels:
        config.debug(4, f"WGSL of {k.name}:\n{k.wgsl}")
    return prog, kernels


@functools.lru_cache(maxsize=1)
def _source_hash() -> str:
    """Hash of fusec's own code and templates: a changed compiler never reuses old entries."""
    h = hashlib.sha256()
    for root in (Path(__file__).parent, codegen._template_dir()):
        for p in sorted(root.rglob("*")):
            if p.suffix in (".py", ".j2") and "__pycache__" not in p.parts:
                h.update(p.name.encode())
                h.update(p.read_bytes())
    return h.hexdigest()


def _disk_key(traced: Traced) -> Optional[str]:
    """Everything that changes the lowered program: the IR, fusec, the device, the options."""
    if diskcache.cache_dir() is None:
        return None
    rt = get_runtime()
    device = ("cpu", "", 0) if rt is None else (rt.info.backend, rt.info.adapter,
                                                rt.max_binding_size)
    return diskcache.key_of(traced.program.hash(), __version__, _source_hash(), device,
                            dataclasses.asdict(traced.options), codegen.tuning(),
                            passes_tuning())


def _check_sizes(traced: Traced, prog: Program, limit: int, adapter: str) -> None:
    names = dict(zip(map(id, prog.inputs), traced.in_paths))
    for v in prog.vars():
        if v.nbytes > limit:
            what = (f"argument '{names[id(v)]}'" if id(v) in names
                    else f"an intermediate value of shape {v.shape}")
            raise DeviceLimitError(
                f"{traced.name}: {what} needs {v.nbytes} bytes, more than the device's maximum "
                f"storage buffer binding size of {limit} bytes ({adapter}); use smaller arrays "
                "or split the work")


def _explain_mismatch(name: str, want: Signature, got: Signature, paths: list[str]) -> str:
    if want[0] != got[0]:
        return (f"{name} was compiled for arguments structured as {_describe_args(want[0])}, "
                f"but was called with {_describe_args(got[0])}")
    for p, a, b in zip(paths, want[1], got[1]):
        if a != b:
            return (f"{name} was compiled for argument '{p}' as {a}, but was called with {b}; "
                    "call the jitted function instead to compile the new signature")
    if want[2] == got[2]:
        return (f"{name} was compiled for {device_label(want[3])}, but its arguments are on "
                f"{device_label(got[3])}; call the jitted function instead (it compiles for "
                "each device)")
    return f"{name} was compiled for static arguments {want[2]}, but was called with {got[2]}"


def _key_runtime(key: Optional[Signature]) -> Optional[Runtime]:
    """The device of a signature (its last element); None where there is no key."""
    return key[3] if key is not None else None


def compile_lowered(lowered: Lowered, binder: Optional[_Binder] = None,
                    key: Optional[Signature] = None) -> Compiled:
    """The executable of ``lowered`` on the device of ``key`` (else the current device)."""
    with on_runtime(_key_runtime(key)):
        rt = get_runtime()
        t0 = time.perf_counter()
        if rt is None:
            exe: Any = CpuExecutable(lowered.traced.program, lowered.traced.options.donated)
        else:
            exe = GpuExecutable(rt, lowered.ir, lowered.kernels)
    config.debug(2, f"{lowered.traced.name}: compiled in {1e3 * (time.perf_counter() - t0):.1f} ms")
    return Compiled(lowered, exe, binder, key)


# --- the decorator --------------------------------------------------------------------------------


class JitFunction:
    """A function compiled for the GPU on first call with each new signature. See
    :func:`gpu_jit`."""

    def __init__(self, fun: Callable[..., Any], static_argnums: Sequence[int] = (),
                 static_argnames: Sequence[str] = (), donate_argnums: Sequence[int] = (),
                 fuse: bool = True, donate_argnames: Sequence[str] = (), device: Any = None
                 ) -> None:
        if not callable(fun):
            raise TypeError(f"gpu_jit needs a callable; got {type(fun).__name__}")
        self.fun = fun
        self.name = getattr(fun, "__qualname__", getattr(fun, "__name__", repr(fun)))
        if device is not None and not (
                isinstance(device, DeviceInfo) and device.index >= 0
                or isinstance(device, (int, np.integer)) and not isinstance(device, bool)):
            raise FusecError(f"gpu_jit(device=...) of {self.name}: expected a device of "
                             "fusec.devices() (a DeviceInfo) or its index; got "
                             f"{type(device).__name__} {device!r}")
        self.device = device  # the device the function is pinned to (None: its arguments')
        self._pin: Optional[Runtime] = None
        if isinstance(static_argnums, int):
            static_argnums = (static_argnums,)
        if isinstance(static_argnames, str):
            static_argnames = (static_argnames,)
        self._binder = _Binder(fun, self.name, tuple(static_argnums), tuple(static_argnames))
        if isinstance(donate_argnums, int):
            donate_argnums = (donate_argnums,)
        self.donate_argnums = tuple(donate_argnums)
        self._donated_names = self._binder.names_of(self.donate_argnums, donate_argnames)
        self.fuse = fuse
        self._cache: dict[Signature, Compiled] = {}
        # the lowering of a signature (without its device) per kind of device (lowering_key):
        # another device of the same kind compiles it without tracing again
        self._lowerings: dict[tuple[Any, ...], Lowered] = {}
        # calls whose arguments are all device Arrays, positional, with no static arguments: the
        # signature is just their shapes, dtypes and devices (the common cached call; skips
        # binding)
        self._fast: dict[tuple[Any, ...], Compiled] = {}
        self._positional = not self._binder.static_names
        self._dict_orders: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # keys -> sorted keys
        self._quick_args = self._binder.leading_dynamic()  # positional arguments it may take
        self._traces = 0
        self._warned_retrace = False
        # the code object: a lambda re-created in a loop shares it, two lambdas on a line do not
        self._code_id = getattr(fun, "__code__", None)
        # (not the __dict__: a callable object's attributes, such as a transform's .fun, would
        # overwrite this object's own)
        functools.update_wrapper(self, fun, updated=())  # type: ignore[arg-type]
        cache.register(self)

    def clear(self) -> None:
        self._cache.clear()
        self._fast.clear()
        self._lowerings.clear()

    def _pinned(self) -> Optional[Runtime]:
        """The runtime of ``device`` (resolved on first use: no device opens at decoration)."""
        if self.device is not None and self._pin is None:
            self._pin = resolve_device(self.device, f"gpu_jit(device=...) of {self.name}")
        return self._pin

    def _placed(self, leaves: Sequence[tuple[str, Any]]) -> tuple[tuple[Aval, ...],
                                                                   Optional[Runtime]]:
        pin = self._pinned()
        return _placement(self.name, leaves, pin, "gpu_jit(device=...)")

    def _options(self, paths: Sequence[str] = ()) -> Options:
        rt = get_runtime()
        donated = tuple(i for i, p in enumerate(paths)
                        if p.split("[")[0].split(".")[0] in self._donated_names)
        return Options(fuse=self.fuse, max_bindings=rt.max_bindings if rt is not None else 8,
                       donated=donated, target=rt.target if rt is not None else "gpu",
                       workgroup_storage=(rt.max_workgroup_storage if rt is not None
                                          else codegen.WORKGROUP_STORAGE),
                       subgroups=rt.subgroups if rt is not None else 0)

    def _signature(self, args: tuple[Any, ...], kwargs: dict[str, Any]
                   ) -> tuple[Signature, list[tuple[str, Any]], TreeDef, tuple[Any, ...]]:
        """(td, avals, static, runtime): the cache key; and the leaves, td and static parts."""
        dyn, static = self._binder.split(args, kwargs)
        leaves, td = _flatten_args(dyn)
        try:
            avals, rt = self._placed(leaves)
        except _ShardedArgs:
            p = next(p for p, x in leaves if type(x) is Sharded)
            raise TraceError(f"argument '{p}' of {self.name} is a fusec.Sharded: calling the "
                             "jitted function runs it on every device; trace, lower and warmup "
                             f"take the arrays of one device ({p}.shards[i])") from None
        return (td, avals, static, rt), leaves, td, static

    def trace(self, *args: Any, **kwargs: Any) -> Traced:
        """Trace for these arguments (arrays or :class:`ShapeDtype`); nothing is compiled."""
        key, leaves, td, static = self._signature(args, kwargs)
        with on_runtime(key[3]):
            return self._trace(key, leaves, td, static)

    def _trace(self, key: Signature, leaves: list[tuple[str, Any]], td: TreeDef,
               static: tuple[Any, ...]) -> Traced:
        t0 = time.perf_counter()
        avals: tuple[Aval, ...] = key[1]
        b = Builder(self.name)
        tracers = [b.new_input(a, p) for (p, _), a in zip(leaves, avals)]
        with tracing(b):
            out = self._binder.call(self.fun, _unflatten_args(td, tracers), static)
            out_leaves, out_tree = flatten_with_paths(out, "output")
            atoms: list[Union[Tracer, Lit]] = []
            for path, o in out_leaves:
                if isinstance(o, Tracer):
                    if o.builder is not b:
                        raise TraceError(f"{self.name} returned a traced value from another trace "
                                         f"at {path}")
                    atoms.append(o)
                elif isinstance(o, (bool, int, float)):
                    atoms.append(Lit(o, dtypes.weak_dtype(o)))
                elif isinstance(o, (np.ndarray, Array, np.generic)):
                    atoms.append(b.const(o if isinstance(o, Array) else np.asarray(o)))
                else:
                    raise TraceError(f"{self.name} returned a {type(o).__name__} at {path}; "
                                     "jitted functions return arrays, scalars, or "
                                     "tuples/lists/dicts of them")
        prog = b.program(atoms)
        cache.STATS.traces += 1
        if self._code_id is not None:
            _COMPILED_CODE.add(self._code_id)
        config.log_compile(f"traced {self.name} for {', '.join(map(str, avals)) or 'no arrays'} "
                           f"in {1e3 * (time.perf_counter() - t0):.1f} ms")
        if config.debug_level() >= 3:  # (printing a long program takes a while)
            config.debug(3, f"traced IR of {self.name}:\n{prog}")
        return Traced(self.name, prog, td, avals, tuple(p for p, _ in leaves), out_tree,
                      b.const_values, self._options([p for p, _ in leaves]), self._binder, key)

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Trace and run the pass pipeline and codegen; no pipeline is compiled."""
        traced = self.trace(*args, **kwargs)
        with on_runtime(_key_runtime(traced.key)):
            return lower(traced)

    def _on_miss(self, key: Signature, paths: list[str], leaves: list[tuple[str, Any]],
                 td: TreeDef, static: tuple[Any, ...]) -> None:
        if config.get("explain_cache_misses"):
            config.log(explain_miss(self, key, paths))
        limit = int(config.get("retrace_warn"))
        if limit and self._traces + 1 >= limit and not self._warned_retrace:
            self._warned_retrace = True
            warnings.warn(
                f"fusec: {self.name} has been traced {self._traces + 1} times (one per new "
                "signature). Set FUSEC_EXPLAIN_CACHE_MISSES=1 to see what changes between calls; "
                "make varying values static or keep shapes fixed.", RuntimeWarning,
                stacklevel=_user_stacklevel())
        if config.get("record_signatures"):
            record(self, _unflatten_args(td, [x for _, x in leaves]), static)

    def warmup(self, *args: Any, **kwargs: Any) -> Compiled:
        """Compile every pipeline of this signature (arrays or ShapeDtype) without running it."""
        key, leaves, td, static = self._signature(args, kwargs)
        compiled = self._cache.get(key)
        if compiled is None:
            with on_runtime(key[3]):
                compiled = lower(self._trace(key, leaves, td, static), lazy=True).compile()
            self._cache[key] = compiled
        return compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fast = None
        quick: Optional[tuple[list[Any], tuple[Any, ...], bool]] = None
        if not kwargs and self._positional:
            # (the device is part of the key: the executable is compiled for one)
            fast = tuple([(a._shape, a._dtype, a._rt) if type(a) is Array else None
                          for a in args])
            hit = self._fast.get(fast)
            if hit is not None:  # (only keys of all-Array calls are stored)
                cache.STATS.hits += 1
                return hit.run_arrays(args)
        if current_builder() is not None:
            return self.fun(*args, **kwargs)  # nested jit: inline into the outer trace
        if (fast is None or None in fast) and len(args) <= self._quick_args and (
                not kwargs or self._binder.static_names.issuperset(kwargs)):
            # pytrees of Arrays (a model's parameters) and numpy data, static arguments by
            # keyword: the leaves and a key without the paths, sorting and checks of the full
            # signature
            quick = _quick_leaves(args, self._dict_orders)
            if quick is not None:
                if kwargs:
                    quick = (quick[0], (*quick[1], *kwargs.items()), quick[2])
                try:
                    hit = self._fast.get(quick[1])
                except TypeError:  # an unhashable static value: the full path says so
                    hit = quick = None
                if hit is not None and quick is not None:
                    cache.STATS.hits += 1
                    if quick[2]:
                        return hit.run_arrays(quick[0])
                    return hit.run_leaves(quick[0])
        dyn, static = self._binder.split(args, kwargs)
        leaves, td = _flatten_args(dyn)
        try:
            avals, rt = self._placed(leaves)
        except _ShardedArgs:
            return self._call_sharded(leaves, td, static)
        compiled = self._cached(leaves, td, static, avals, rt)
        if fast is not None and None not in fast and len(leaves) == len(args):
            self._fast[fast] = compiled
        elif quick is not None and len(quick[0]) == len(leaves) and all(
                a is b for a, (_, b) in zip(quick[0], leaves)):
            self._fast[quick[1]] = compiled  # (the same leaves in the same order)
        return compiled.run_leaves([x for _, x in leaves])

    def _cached(self, leaves: list[tuple[str, Any]], td: TreeDef, static: tuple[Any, ...],
                avals: tuple[Aval, ...], rt: Optional[Runtime]) -> Compiled:
        """The executable of this signature on ``rt``: from the cache, else compiled."""
        key = (td, avals, static, rt)
        compiled = self._cache.get(key)
        if compiled is None:
            return self._compile(key, leaves, td, static)
        cache.STATS.hits += 1
        return compiled

    def _compile(self, key: Signature, leaves: list[tuple[str, Any]], td: TreeDef,
                 static: tuple[Any, ...]) -> Compiled:
        """A call's cache miss: trace and lower (unless a device of the same kind did), compile
        for the call's device."""
        cache.STATS.misses += 1
        for p, x in leaves:
            if isinstance(x, ShapeDtype):
                raise TraceError(f"{self.name}: argument '{p}' is a ShapeDtype; it has no "
                                 "values to compute with (use it with trace/lower/warmup)")
        rt = key[3]
        with on_runtime(rt):
            lkey = (key[:3], rt.lowering_key if rt is not None else None)
            lowered = self._lowerings.get(lkey)
            if lowered is None:
                self._on_miss(key, [p for p, _ in leaves], leaves, td, static)
                self._traces += 1  # (calls' traces, not trace/lower/warmup's, count for warning)
                lowered = lower(self._trace(key, leaves, td, static), lazy=True)
                self._lowerings[lkey] = lowered
            compiled = compile_lowered(lowered, self._binder, key)
        self._cache[key] = compiled
        return compiled

    def _call_sharded(self, leaves: list[tuple[str, Any]], td: TreeDef,
                      static: tuple[Any, ...]) -> Any:
        """A call with Sharded arguments: once per device, each on its shards (and on the other
        arguments, replicated), the devices at the same time; the outputs as Sharded."""
        name = self.name
        if self.device is not None:
            raise FusecError(f"{name} is pinned to one device (gpu_jit(device=...)); it cannot "
                             "take Sharded arguments, which run on several")
        sharded: list[tuple[str, Sharded]] = [(p, x) for p, x in leaves if type(x) is Sharded]
        p0, s0 = sharded[0]
        rts = s0._rts
        for p, s in sharded[1:]:
            if s._rts != rts:
                raise FusecError(
                    f"{name}: Sharded arguments '{p0}' and '{p}' are on different devices "
                    f"({[rt.info.index for rt in rts]} and {[rt.info.index for rt in s._rts]}); "
                    "shard them over the same devices")
        calls = []
        for i, rt in enumerate(rts):
            row: list[tuple[str, Any]] = []
            for p, v in leaves:
                x: Any = v
                if type(x) is Sharded:
                    x = x.shards[i]
                elif isinstance(x, Array):
                    if x._rt is None and x._host is not None:
                        x = Array(x._shape, x._dtype, host=x._host)  # uploaded by each device
                    elif x._rt is not rt:
                        # a plain device array is replicated: copied on every call (replicate()
                        # it once instead)
                        x = x.to(rt.info)
                row.append((p, x))
            avals, _ = _placement(name, row, rt, "the device of its Sharded arguments' shard")
            compiled = self._cached(row, td, static, avals, rt)
            if compiled.traced.const_values:
                compiled._const_arrays()  # here, not in the devices' threads (copies between them)
            calls.append(functools.partial(compiled.run_leaves, [x for _, x in row]))
        outs = on_devices(rts, calls)
        flat = [flatten(o) for o in outs]
        axis = 0 if any(s.axis is not None for _, s in sharded) else None
        return unflatten(flat[0][1], [Sharded([f[0][j] for f in flat], rts, axis)
                                      for j in range(len(flat[0][0]))])

    def __repr__(self) -> str:
        return f"<gpu_jit {self.name}>"


# the code object of every function traced so far: tells "a new function object with old code"
_COMPILED_CODE: set[Any] = set()


def explain_miss(jf: JitFunction, key: Signature, paths: list[str]) -> str:
    """Why ``key`` missed: the closest compiled signature and what differs from it."""
    where = f"{jf.name}"
    if jf._code_id is not None:
        where += f" ({os.path.basename(jf._code_id.co_filename)}:{jf._code_id.co_firstlineno})"
    if not jf._cache:
        if jf._code_id in _COMPILED_CODE:
            return (f"cache miss for {where}: this function object is new, but the same code was "
                    "compiled before through another function object (a lambda or closure "
                    "re-created in a loop, or gpu_jit applied inside a loop?): create the jitted "
                    "function once and reuse it")
        return f"cache miss for {where}: first call, tracing it"

    def differences(old: Signature) -> list[str]:
        if old[0] != key[0]:
            return [f"the arguments' pytree structure changed from {_describe_args(old[0])} to "
                    f"{_describe_args(key[0])}"]
        out = []
        if old[3] is not key[3]:
            out.append(f"the device changed from {device_label(old[3])} to "
                       f"{device_label(key[3])} (one compiled program per device)")
        for p, a, b in zip(paths, old[1], key[1]):
            if a.shape != b.shape:
                out.append(f"argument '{p}' changed shape from {a.shape} to {b.shape}")
            if a.dtype != b.dtype or a.weak != b.weak:
                kind = {True: "a Python scalar", False: "an array"}
                if a.weak != b.weak:
                    out.append(f"argument '{p}' changed from {kind[a.weak]} to {kind[b.weak]}")
                else:
                    out.append(f"argument '{p}' changed dtype from {a.dtype} to {b.dtype}")
        old_static, new_static = dict(old[2]), dict(key[2])

        def shown(d: dict[str, Any], name: str) -> str:
            return repr(d[name]) if name in d else "its default (not passed)"

        for name in sorted(set(old_static) | set(new_static)):
            if name not in old_static or name not in new_static or (
                    old_static[name] != new_static[name]):
                out.append(f"static argument '{name}' changed value from "
                           f"{shown(old_static, name)} to {shown(new_static, name)}")
        return out

    closest = min((differences(k) for k in jf._cache), key=len)
    n = len(jf._cache)
    return (f"cache miss for {where}: " + "; ".join(closest or ["no difference found"])
            + f" (compared with the closest of {n} compiled signature{'s' if n > 1 else ''})")


def _describe_args(td: TreeDef) -> str:
    return "(" + ", ".join(f"{name}={describe(sub)}" for name, sub in td[1]) + ")"


def gpu_jit(fun: Optional[Callable[..., Any]] = None, *, static_argnums: Sequence[int] = (),
            static_argnames: Sequence[str] = (), donate_argnums: Sequence[int] = (),
            donate_argnames: Sequence[str] = (), fuse: bool = True, device: Any = None) -> Any:
    """Compile ``fun`` to fused GPU kernels, once per argument signature.

    Use bare (``@gpu_jit``) or with options (``@gpu_jit(static_argnames=("axis",))``).
    ``static_argnums``/``static_argnames`` mark arguments whose *values* are baked in (they must be
    hashable); ``fuse=False`` runs one kernel per op (a baseline for benchmarks);
    ``donate_argnums``/``donate_argnames`` let outputs reuse those arguments' device buffers (a
    donated :class:`fusec.Array` raises an error if used afterwards). Calls take numpy arrays,
    :class:`fusec.Array`, Python scalars or pytrees of them and return :class:`fusec.Array`
    outputs that stay on the device.

    A call runs on the device of its Array arguments (arrays on two devices are an error; host
    data goes to that device, or to the default one where no argument is on a device), and is
    compiled once per device. ``device`` (a DeviceInfo from ``fusec.devices()`` or its index)
    pins the function to one device: host data goes there, Arrays elsewhere are an error. Called
    with :class:`fusec.Sharded` arguments (``fusec.shard``, ``fusec.replicate``) it runs once per
    device, the devices at the same time, and returns Sharded outputs.
    """
    if fun is None:
        return lambda f: JitFunction(f, static_argnums, static_argnames, donate_argnums, fuse,
                                     donate_argnames, device)
    return JitFunction(fun, static_argnums, static_argnames, donate_argnums, fuse,
                       donate_argnames, device)


# --- eager execution of fusec.numpy functions ----------------------------------------------------

_EAGER: dict[Any, JitFunction] = {}


def _is_array_leaf(x: Any) -> bool:
    return isinstance(x, (Array, np.ndarray))


def eager_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run a fusec.numpy function outside jit: compile it for these arrays (cached) and call it."""
    leaves, td = flatten_with_paths((args, kwargs))
    dyn = [x for _, x in leaves if _is_array_leaf(x)]
    for _, x in leaves:
        if isinstance(x, Tracer):
            raise TraceError("a traced value was used outside of its jitted function")
    # the type is part of the key: 1 == 1.0 == True, but they promote differently
    # (repr tells -0.0 from 0.0, which compare equal: x / -0.0 is -inf where x / 0.0 is inf)
    statics = tuple((i, type(x), x, repr(x) if isinstance(x, float) else None)
                    for i, (_, x) in enumerate(leaves) if not _is_array_leaf(x))
    try:
        key = (fn, td, statics)
        hash(key)
    except TypeError:
        raise StaticArgumentError(f"{fn.__name__}: non-array arguments must be hashable") from None
    jf = _EAGER.get(key)
    if jf is None:
        positions = [i for i, (_, x) in enumerate(leaves) if _is_array_leaf(x)]

        def run(*arrays: Any) -> Any:
            vals = [x for _, x in leaves]
            for i, a in zip(positions, arrays):
                vals[i] = a
            a2, k2 = unflatten(td, vals)
            return fn(*a2, **k2)

        run.__qualname__ = getattr(fn, "__name__", "op")
        jf = JitFunction(run)
        _EAGER[key] = jf
    return jf(*dyn)


def interpret_traced(traced: Traced, leaves: Sequence[Any]) -> list[np.ndarray]:
    """Run the unoptimised traced program on numpy (the oracle tests compare against)."""
    args = [np.asarray(x, dtype=a.dtype) for x, a in zip(leaves, traced.in_avals)]
    args += [np.asarray(c) for c in traced.const_values]
    return evaluate(traced.program, args)


set_eager_runner(eager_call)
