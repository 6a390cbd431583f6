"""Export a compiled program: ``fusec.export(f, *specs)`` lowers ``f`` once for those argument
shapes and gives an :class:`Exported`, whose ``save(dir)`` writes a versioned artifact (a manifest,
one WGSL file per kernel and the captured constants in safetensors) that
:func:`load_exported` runs again from Python without the function or any tracing, and that
``save(dir, target="web")`` turns into a dependency-free ES module for the browser (WebGPU).

The artifact holds exactly the kernels fusec would run: the lowered program (for Python) and a
flat dispatch list over a fixed set of buffers (for the web module), both made here from the same
lowering. Exports are lowered for what every WebGPU device offers (8 storage buffers per kernel,
16 KiB of workgroup memory), so an artifact made on one machine runs on another; anything beyond
WebGPU's default limits that it does need is written into the manifest and checked at load.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from . import dtypes
from .emit import KernelCode
from .errors import FusecError, SignatureError
from .ir import Lit, Op, Program, Var, from_json, to_json
from .jit import JitFunction, Traced, _aval, _to_array, gpu_jit, lower
from .passes.dce import used_inputs
from .runtime import Array, GpuExecutable, device_label, get_runtime, to_storage
from .trace import Aval
from .tree import LEAF, NONE, TreeDef, flatten_with_paths, unflatten

FORMAT = "fusec-export"
VERSION = 1  # bump when the manifest changes incompatibly; load_exported refuses other versions
TARGETS = ("python", "web")

# WebGPU's default limits (what a device gives without asking): the export is lowered within the
# first two, and asks for more of the others only where a buffer or kernel needs it.
WEB_BINDINGS = 8
WEB_WORKGROUP_STORAGE = 16384
WEB_DEFAULT_LIMITS = {
    "maxStorageBuffersPerShaderStage": 8,
    "maxComputeWorkgroupStorageSize": 16384,
    "maxStorageBufferBindingSize": 134217728,
    "maxBufferSize": 268435456,
    "maxComputeInvocationsPerWorkgroup": 256,
    "maxComputeWorkgroupSizeX": 256,
    "maxComputeWorkgroupSizeY": 256,
    "maxComputeWorkgroupSizeZ": 64,
    "maxComputeWorkgroupsPerDimension": 65535,
}
_WEB_DIR = Path(__file__).resolve().parent / "web"


class ExportError(FusecError, ValueError):
    """An export that cannot be made, saved or loaded as asked."""


# --- the plan: buffers and dispatches ------------------------------------------------------------


@dataclasses.dataclass
class Plan:
    """A lowered program as the web module runs it: a fixed set of buffers (allocated once and
    reused by every call) and the dispatches in order, each binding buffers by index."""

    buffers: list[dict[str, Any]]  # {"size": bytes, "role": input|constant|work, "zero": bool}
    dispatches: list[dict[str, Any]]  # {"kernel": i, "bindings": [buffer...], "grid": [x,y,z]}
    inputs: list[int]  # buffer of each program input (arguments, then constants)
    outputs: list[dict[str, Any]]  # {"buffer": b} or {"literal": value}, per program output
    # why the web target cannot run this program (None: it can)
    unsupported: Optional[str] = None


def make_plan(prog: Program, kernels: Sequence[KernelCode], n_args: int) -> Plan:
    """Assign every value of ``prog`` a buffer, following the slots the memory pass chose:
    pooled values share their pool's buffer, in-place results their input's, reshapes their
    source's; every other value gets its own."""
    buffers: list[dict[str, Any]] = []
    buf_of: dict[int, int] = {}  # id(var) -> buffer
    pools: dict[str, int] = {}

    def padded(nbytes: int) -> int:
        # at least 16 bytes, whole 16-byte units: vec4 access never reads past the end
        return max(16, -(-nbytes // 16) * 16)

    def new(nbytes: int, role: str, zero: bool = False) -> int:
        buffers.append({"size": padded(nbytes), "role": role, "zero": zero})
        return len(buffers) - 1

    inputs = []
    for i, v in enumerate(prog.inputs):
        b = new(v.nbytes, "input" if i < n_args else "constant")
        buf_of[id(v)] = b
        inputs.append(b)
    dispatches: list[dict[str, Any]] = []
    unsupported = None
    ki = -1  # the kernel of each KERNEL equation, in order
    for e in prog.eqns:
        if e.op is Op.RESHAPE:
            src = e.inputs[0]
            assert isinstance(src, Var)
            buf_of[id(e.out)] = buf_of[id(src)]
            continue
        if e.op is not Op.KERNEL:
            unsupported = (f"it has a compiled loop ({e.op.value}); the web module runs straight "
                           "dispatch lists only (write the loop with a static trip count small "
                           "enough to unroll, or export the loop's body)")
            break
        ki += 1
        code = kernels[ki]
        aliased = {j for j, _ in e.params.get("inplace", ())}
        reads = [buf_of[id(a)] for j, a in enumerate(e.inputs)
                 if isinstance(a, Var) and j not in aliased]
        slots = e.params.get("slots", ("new",) * len(e.outs))
        writes = []
        for o, sl in zip(e.outs, slots):
            if sl == "new":
                b = new(o.nbytes, "work")
            elif sl[0] in "pz":
                b = pools.get(sl[1:], -1)
                if b < 0:
                    b = pools[sl[1:]] = new(o.nbytes, "work", zero=sl[0] == "z")
                buffers[b]["size"] = max(buffers[b]["size"], padded(o.nbytes))
            elif sl.startswith("="):
                b = buf_of[id(e.inputs[int(sl[1:])])]
            else:  # "inK": a donated input's buffer
                b = inputs[int(sl[2:])]
            buf_of[id(o)] = b
            writes.append(b)
        if code.grid[0] == 0:
            continue  # nothing to compute (an empty array)
        dispatches.append({"kernel": ki, "bindings": reads + writes, "grid": list(code.grid)})
    outputs: list[dict[str, Any]] = []
    for a in prog.outputs:
        if isinstance(a, Lit):
            outputs.append({"literal": a.value})
        elif unsupported is None:
            outputs.append({"buffer": buf_of[id(a)]})
        else:
            outputs.append({"buffer": -1})
    return Plan(buffers, dispatches, inputs, outputs, unsupported)


_WG = re.compile(r"@workgroup_size\(\s*([0-9]+)\s*(?:,\s*([0-9]+)\s*)?(?:,\s*([0-9]+)\s*)?\)")
_WG_CONST = re.compile(r"const\s+(\w+)\s*(?::\s*\w+)?\s*=\s*([0-9]+)u?\s*;")


def workgroup_size(wgsl: str) -> tuple[int, int, int]:
    """A kernel's ``@workgroup_size`` (resolving named constants)."""
    consts = {m.group(1): int(m.group(2)) for m in _WG_CONST.finditer(wgsl)}
    m = _WG.search(wgsl)
    if m is None:
        return (1, 1, 1)
    dims = []
    for g in m.groups():
        dims.append(1 if g is None else int(g) if g.isdigit() else consts.get(g, 1))
    return (dims[0], dims[1], dims[2])


def requirements(kernels: Sequence[KernelCode], plan: Plan) -> dict[str, Any]:
    """The WebGPU features and limits the artifact needs beyond WebGPU's defaults."""
    features = ["shader-f16"] if any("enable f16;" in k.wgsl for k in kernels) else []
    largest = max((b["size"] for b in plan.buffers), default=16)
    bindings = max((k.n_inputs + k.n_outputs for k in kernels), default=1)
    sizes = [workgroup_size(k.wgsl) for k in kernels] or [(1, 1, 1)]
    grids = [d["grid"] for d in plan.dispatches] or [[1, 1, 1]]
    need = {
        "maxStorageBuffersPerShaderStage": bindings,
        "maxStorageBufferBindingSize": largest,
        "maxBufferSize": largest,
        "maxComputeInvocationsPerWorkgroup": max(x * y * z for x, y, z in sizes),
        "maxComputeWorkgroupSizeX": max(s[0] for s in sizes),
        "maxComputeWorkgroupSizeY": max(s[1] for s in sizes),
        "maxComputeWorkgroupSizeZ": max(s[2] for s in sizes),
        "maxComputeWorkgroupsPerDimension": max(max(g) for g in grids),
    }
    return {"features": features,
            "limits": {k: v for k, v in need.items() if v > WEB_DEFAULT_LIMITS[k]},
            "needs": need}


# --- trees in the manifest -----------------------------------------------------------------------


def _tree_json(td: TreeDef, where: str) -> Any:
    """A JSON form of an output structure: 0 for a leaf, null for None, lists for tuples and
    lists, objects for dicts with string keys."""
    if td == LEAF:
        return 0
    if td == NONE:
        return None
    kind, aux, children = td
    if kind in ("tuple", "list"):
        return {kind: [_tree_json(c, where) for c in children]}
    if kind == "dict":
        if not all(isinstance(k, str) for k in aux):
            raise ExportError(f"{where}: an exported function's dicts need string keys; got "
                              f"{list(aux)!r}")
        return {"dict": [[k, _tree_json(c, where)] for k, c in zip(aux, children)]}
    name = kind[1].__qualname__ if isinstance(kind, tuple) else str(kind)
    raise ExportError(f"{where}: an exported function returns arrays in tuples, lists and dicts; "
                      f"a {name} cannot be rebuilt outside Python")


def _tree_from_json(j: Any) -> TreeDef:
    if j == 0:
        return LEAF
    if j is None:
        return NONE
    if "tuple" in j or "list" in j:
        kind = "tuple" if "tuple" in j else "list"
        return (kind, None, tuple(_tree_from_json(c) for c in j[kind]))
    keys = tuple(k for k, _ in j["dict"])
    return ("dict", keys, tuple(_tree_from_json(c) for _, c in j["dict"]))


# --- Exported ------------------------------------------------------------------------------------


class Exported:
    """A program lowered for fixed input shapes, with its kernels and constants; see
    :func:`export`. Call it like the original function (same arguments, same shapes), or
    ``save`` it."""

    def __init__(self, name: str, program: Program, kernels: list[KernelCode],
                 arg_names: list[str], in_paths: list[str], in_specs: list[tuple[tuple[int, ...],
                                                                                   str]],
                 out_tree: TreeDef, constants: list[np.ndarray], tuning: str) -> None:
        self.name = name
        self.program = program
        self.kernels = kernels
        self.arg_names = arg_names
        self.in_paths = in_paths
        self.in_specs = in_specs
        self.out_tree = out_tree
        self.constants = constants
        self.tuning = tuning
        self.plan = make_plan(program, kernels, len(in_paths))
        self._exe: Optional[GpuExecutable] = None
        self._consts: Optional[list[Array]] = None
        self._used = used_inputs(program)
        # arguments whose buffers the program writes its results into (donated ones): a caller's
        # Array passed there is used up, as with a jitted call
        self.donated = sorted({int(sl[2:]) for e in program.eqns if e.op is Op.KERNEL
                               for sl in e.params.get("slots", ()) if sl.startswith("in")})

    def __repr__(self) -> str:
        ins = ", ".join(f"{p}: {_spec_str(s)}" for p, s in zip(self.in_paths, self.in_specs))
        return f"<Exported {self.name}({ins}): {len(self.kernels)} kernel(s)>"

    @property
    def out_specs(self) -> list[tuple[tuple[int, ...], str]]:
        """(shape, dtype) of each output leaf."""
        return [(tuple(a.shape), a.dtype) if isinstance(a, Var) else ((), a.dtype)
                for a in self.program.outputs]

    # -- running from Python --

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the exported kernels on fusec's device; arguments as for the original function
        (by position or name), with exactly the exported shapes and dtypes."""
        rt = get_runtime()
        if rt is None:
            raise ExportError(f"{self.name}: running an exported program needs a GPU adapter; "
                              "fusec's device is its numpy interpreter (set FUSEC_BACKEND=gpu to "
                              "use a software adapter)")
        leaves = self._bind(args, kwargs)
        for path, x in zip(self.in_paths, leaves):
            if isinstance(x, Array) and x._rt is not None and x._rt is not rt:
                raise ExportError(f"{self.name}: argument '{path}' is on {device_label(x._rt)}; an "
                                  f"exported program runs on {device_label(rt)}: copy it there "
                                  f"with .to(fusec.devices()[{rt.info.index}])")
        if self._exe is None:
            self._exe = GpuExecutable(rt, self.program, self.kernels)
            self._consts = [
                Array(c.shape, dt, host=c.astype(bool) if dt == "bool" else c)
                for c, (_, dt) in zip(self.constants, self._const_specs())]
        arrays: list[Optional[Array]] = [
            (x if isinstance(x, Array) else _to_array(np.asarray(x), Aval(shape, dtype)))
            if used else None
            for x, (shape, dtype), used in zip(leaves, self.in_specs, self._used)]
        assert self._consts is not None
        arrays += [c if used else None
                   for c, used in zip(self._consts, self._used[len(leaves):])]
        for i in self.donated:
            x = arrays[i]
            if x is not None and x is leaves[i] and x._shared:
                arrays[i] = x.donation_copy(rt)  # another Array views its buffer: keep that one
        outs = self._exe.run(arrays)
        for i in self.donated:
            x = leaves[i]
            if isinstance(x, Array) and not any(o is x for o in outs):
                x.donate(self.name)
        return unflatten(self.out_tree, outs)

    def _const_specs(self) -> list[tuple[tuple[int, ...], str]]:
        return [(tuple(v.shape), v.dtype) for v in self.program.inputs[len(self.in_paths):]]

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        if len(args) > len(self.arg_names):
            raise SignatureError(f"{self.name} takes {len(self.arg_names)} argument(s) "
                                 f"({', '.join(self.arg_names)}); got {len(args)}")
        bound = dict(zip(self.arg_names, args))
        for k, v in kwargs.items():
            if k not in self.arg_names:
                raise SignatureError(f"{self.name} has no argument '{k}' (arguments: "
                                     f"{', '.join(self.arg_names)})")
            if k in bound:
                raise SignatureError(f"{self.name}: argument '{k}' given twice")
            bound[k] = v
        missing = [n for n in self.arg_names if n not in bound]
        if missing:
            raise SignatureError(f"{self.name}: missing argument(s) {', '.join(missing)}")
        leaves: list[tuple[str, Any]] = []
        for n in self.arg_names:
            leaves.extend(flatten_with_paths(bound[n], n)[0])
        paths = [p for p, _ in leaves]
        if paths != self.in_paths:
            raise SignatureError(f"{self.name} was exported for the arrays {self.in_paths}; the "
                                 f"arguments given hold {paths}")
        out = []
        for (p, x), (shape, dtype) in zip(leaves, self.in_specs):
            got = _aval(p, x, self.name)
            if tuple(got.shape) != shape or (got.dtype != dtype and not got.weak):
                raise SignatureError(
                    f"{self.name}: argument '{p}' was exported as {_spec_str((shape, dtype))}; "
                    f"got {_spec_str((tuple(got.shape), got.dtype))}")
            out.append(x)
        return out

    # -- saving --

    def manifest(self, target: str = "python") -> dict[str, Any]:
        """The artifact's manifest (what ``save`` writes as manifest.json)."""
        if target == "web" and self.plan.unsupported is not None:
            raise ExportError(f"{self.name} cannot be exported to the web target: "
                              f"{self.plan.unsupported}")
        req = requirements(self.kernels, self.plan)
        return {
            "format": FORMAT,
            "version": VERSION,
            "fusec_version": _fusec_version(),
            "name": self.name,
            "tuning": self.tuning,
            "args": self.arg_names,
            "donated": [self.in_paths[i] for i in self.donated],
            "inputs": [{"name": p, "shape": list(s), "dtype": d, "buffer": b, "used": u}
                       for p, (s, d), b, u in zip(self.in_paths, self.in_specs,
                                                   self.plan.inputs, self._used)],
            "constants": [{"tensor": f"c{i}", "shape": list(s), "dtype": d,
                           "buffer": self.plan.inputs[len(self.in_paths) + i]}
                          for i, (s, d) in enumerate(self._const_specs())],
            "outputs": [{**o, "shape": list(s), "dtype": d}
                        for o, (s, d) in zip(self.plan.outputs, self.out_specs)],
            "out_tree": _tree_json(self.out_tree, self.name),
            "kernels": [{"name": k.name, "kind": k.kind, "file": _kernel_file(i, k),
                         "n_inputs": k.n_inputs, "n_outputs": k.n_outputs, "grid": list(k.grid),
                         "key": k.key, "workgroup_size": list(workgroup_size(k.wgsl))}
                        for i, k in enumerate(self.kernels)],
            "buffers": self.plan.buffers,
            "dispatches": self.plan.dispatches,
            "requires": {"features": req["features"], "limits": req["limits"]},
            "weights": "weights.safetensors" if self.constants else None,
            "program": to_json(self.program),
        }

    def save(self, path: Union[str, Path], target: str = "python",
             sample_inputs: Optional[Sequence[Any]] = None,
             demo: Optional[dict[str, Any]] = None) -> Path:
        """Write the artifact into directory ``path`` (created; files of an earlier export there
        are replaced): ``manifest.json``, ``kernels/*.wgsl`` and ``weights.safetensors``.
        ``target="web"`` also writes ``model.js`` (an ES module), ``model.d.ts`` and a demo page
        ``index.html``. ``sample_inputs`` (positional arguments): saved with the outputs fusec
        computes for them (``samples.safetensors``); the demo page runs them and compares.
        ``demo``: settings of the demo page (``title``, ``description``, ``heatmap``: the output
        drawn, ``labels``: its rows' names, ``cell``: pixels per value, ``tolerance``)."""
        if target not in TARGETS:
            raise ExportError(f"save: target must be one of {TARGETS}; got {target!r}")
        manifest = self.manifest(target)
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        kdir = out / "kernels"
        if kdir.exists():
            shutil.rmtree(kdir)
        kdir.mkdir()
        # an earlier export's files that this one may not write again
        for name in ("weights.safetensors", "samples.safetensors", "model.js", "model.d.ts",
                     "index.html"):
            (out / name).unlink(missing_ok=True)
        for i, k in enumerate(self.kernels):
            (out / _kernel_file(i, k)).write_text(k.wgsl)
        if self.constants:
            _save_tensors(out / "weights.safetensors",
                          {f"c{i}": c for i, c in enumerate(self.constants)})
        if sample_inputs is not None:
            manifest["samples"] = self._save_samples(out, tuple(sample_inputs))
        if demo is not None:
            manifest["demo"] = dict(demo)
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        for name in ("weights.safetensors", "samples.safetensors"):
            if (out / name).exists():  # (the safetensors writer makes them private: 0600)
                (out / name).chmod(0o644)
        if target == "web":
            for name in ("model.js", "model.d.ts", "index.html"):
                shutil.copyfile(_WEB_DIR / name, out / name)
        return out

    def _save_samples(self, out: Path, args: tuple[Any, ...]) -> str:
        leaves = self._bind(args, {})
        outs, _ = flatten_with_paths(self(*args))
        tensors = {}
        for i, ((shape, dtype), x) in enumerate(zip(self.in_specs, leaves)):
            tensors[f"in{i}"] = to_storage(np.asarray(x, dtype=dtype).reshape(shape), dtype)
        for i, ((shape, dtype), (_, y)) in enumerate(zip(self.out_specs, outs)):
            tensors[f"out{i}"] = to_storage(np.asarray(y).reshape(shape), dtype)
        _save_tensors(out / "samples.safetensors", tensors)
        return "samples.safetensors"


def _spec_str(spec: tuple[tuple[int, ...], str]) -> str:
    return f"{spec[1]}[{','.join(map(str, spec[0]))}]"


def _kernel_file(i: int, k: KernelCode) -> str:
    return f"kernels/{i:03d}_{re.sub(r'[^A-Za-z0-9_]', '_', k.name)}.wgsl"


def _safetensors() -> Any:
    try:
        import safetensors.numpy
    except ImportError:
        raise ExportError("saving and loading exports needs the safetensors package: "
                          "pip install 'fusec[export]' (or pip install safetensors)") from None
    return safetensors.numpy


def _save_tensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    # 0-d tensors are saved as shape () (safetensors supports them); data as stored on the GPU
    # (np.asarray, not np.ascontiguousarray: that would make 0-d tensors 1-d)
    _safetensors().save_file({k: np.asarray(v, order="C") for k, v in tensors.items()}, str(path))


def _fusec_version() -> str:
    try:
        from importlib.metadata import version
        return version("fusec")
    except Exception:  # not installed as a distribution (a source checkout on sys.path)
        return "unknown"


# --- the public functions ------------------------------------------------------------------------


def export(f: Callable[..., Any], *args: Any, tuning: Optional[str] = None,
           **kwargs: Any) -> Exported:
    """Lower ``f`` (a function or a ``gpu_jit`` function) for these arguments: arrays or
    :class:`fusec.ShapeDtype` specs, in the pytree structure ``f`` takes. Arrays ``f`` captures
    (weights) become the export's constants. ``tuning``: "gpu" or "cpu", the kind of device the
    kernels are tuned for (default: that of fusec's device).

    The result runs only with arguments of these shapes and dtypes (no symbolic sizes)."""
    jf = f if isinstance(f, JitFunction) else gpu_jit(f)
    if jf._binder.static_names:
        raise ExportError(f"export: {jf.name} has static arguments; wrap it in a function "
                          "that fixes them (functools.partial)")
    traced = jf.trace(*args, **kwargs)
    rt = get_runtime()
    if tuning is None:
        tuning = rt.target if rt is not None else "gpu"
    if tuning not in ("gpu", "cpu"):
        raise ExportError(f"export: tuning must be 'gpu' or 'cpu'; got {tuning!r}")
    weak = [p for p, a in zip(traced.in_paths, traced.in_avals) if a.weak]
    if weak:
        raise ExportError(f"export: argument(s) {', '.join(weak)} are Python scalars; give an "
                          "array or ShapeDtype so that the exported input has a fixed dtype")
    opts = dataclasses.replace(traced.options, max_bindings=WEB_BINDINGS,
                               workgroup_storage=WEB_WORKGROUP_STORAGE, target=tuning,
                               subgroups=0)
    traced = dataclasses.replace(traced, options=opts)
    lowered = lower(traced)
    _tree_json(traced.out_tree, jf.name)  # refuses output structures that cannot be saved
    consts = [to_storage(np.asarray(c), str(c.dtype) if isinstance(c, Array) else
                         _const_dtype(traced, i))
              for i, c in enumerate(traced.const_values)]
    arg_names = [name for name, _ in traced.in_tree[1]]
    return Exported(jf.name, lowered.ir, list(lowered.kernels), arg_names,
                    list(traced.in_paths), [(tuple(a.shape), a.dtype) for a in traced.in_avals],
                    traced.out_tree, consts, tuning)


def _const_dtype(traced: Traced, i: int) -> str:
    return traced.program.inputs[len(traced.in_paths) + i].dtype


def load_exported(path: Union[str, Path]) -> Exported:
    """Load an artifact written by ``Exported.save``; call the result with arguments of the
    exported shapes. Needs no tracing and not the original function."""
    d = Path(path)
    mf = d / "manifest.json"
    if not mf.is_file():
        raise ExportError(f"load_exported: {d} has no manifest.json (not a fusec export)")
    m = json.loads(mf.read_text())
    if m.get("format") != FORMAT:
        raise ExportError(f"load_exported: {mf} is not a fusec export (format {m.get('format')!r})")
    if m.get("version") != VERSION:
        raise ExportError(f"load_exported: {d} is export format version {m.get('version')}; "
                          f"this fusec reads version {VERSION} (export it again)")
    prog = from_json(m["program"])
    kernels = []
    for k in m["kernels"]:
        wgsl = (d / k["file"]).read_text()
        kernels.append(KernelCode(k["name"], k["kind"], wgsl, tuple(k["grid"]), k["n_inputs"],
                                  k["n_outputs"], k["key"]))
    consts: list[np.ndarray] = []
    if m["constants"]:
        tensors = _safetensors().load_file(str(d / m["weights"]))
        for c in m["constants"]:
            t = tensors[c["tensor"]]
            want = (tuple(c["shape"]), np.dtype(dtypes.NUMPY_STORAGE[c["dtype"]]))
            if (t.shape, t.dtype) != want:
                raise ExportError(f"load_exported: tensor {c['tensor']} of {d / m['weights']} is "
                                  f"{t.dtype}{list(t.shape)}; the manifest says {c['dtype']}"
                                  f"{c['shape']}")
            consts.append(t)
    return Exported(m["name"], prog, kernels, list(m["args"]),
                    [i["name"] for i in m["inputs"]],
                    [(tuple(i["shape"]), i["dtype"]) for i in m["inputs"]],
                    _tree_from_json(m["out_tree"]), consts, m.get("tuning", "gpu"))


__all__ = ["Exported", "ExportError", "export", "load_exported", "FORMAT", "VERSION"]

