"""fusec's modules import one way, bottom to top; no import circle, not even through imports
inside functions. Each module belongs to one layer and may import only from its own layer or
lower ones (a module of its own layer only if that creates no circle, checked separately)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "fusec"

# Bottom to top. A module's layer is that of the longest prefix listed.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "config", "ir", "tree", "tree_util", "cache", "diskcache", "native", "clocks"),
    ("dtypes",),
    ("ops",),
    ("interpret", "trace"),
    ("numpy", "nn", "lax", "random", "control_flow", "quant"),
    ("emit", "kernels", "codegen"),
    ("passes",),
    ("runtime",),
    ("sharding",),
    ("record", "jit"),
    ("warmup", "transforms", "autodiff", "vmap", "control_flow_ad"),
    ("models", "exported", "web"),
    ("bench", "cli", "demo", "dask", "__main__", "__init__"),
]


def _layer(module: str) -> int:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        for k, names in enumerate(LAYERS):
            if name in names:
                return k
    raise AssertionError(f"module fusec.{module} is in no layer: add it to LAYERS")


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """fusec modules imported anywhere in ``path`` (top level and inside functions)."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    here = module.split(".") if is_pkg else module.split(".")[:-1]
    if module == "__init__":
        here = []
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
            elif node.module and node.module.split(".")[0] == "fusec":
                base = []
                node_mod = node.module.split(".")[1:]
                base = node_mod
                for alias in node.names:
                    cand = ".".join(base + [alias.name])
                    found.add(cand if cand in known else ".".join(base))
                continue
            else:
                continue
            mod = base + (node.module.split(".") if node.module else [])
            for alias in node.names:
                cand = ".".join(mod + [alias.name])
                found.add(cand if cand in known else ".".join(mod))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "fusec":
                    found.add(".".join(alias.name.split(".")[1:]))
    return {f for f in found if f and f in known and f != module}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {m: _imports(m, p, known) for m, p in mods.items()}


def test_every_import_points_down_or_sideways() -> None:
    bad = []
    for mod, deps in _graph().items():
        for d in sorted(deps):
            if _layer(d) > _layer(mod):
                bad.append(f"fusec.{mod} (layer {_layer(mod)}) imports fusec.{d} "
                           f"(layer {_layer(d)})")
    assert not bad, "\n".join(bad)


def test_no_import_circle() -> None:
    graph = _graph()
    # a package's __init__ importing its own submodules is how packages work; a submodule
    # importing its package (or a sibling) must not close a loop
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if d.startswith(m + ".") :
                continue  # a package and its submodules
            if state.get(d) == 1:
                cycle = stack[stack.index(d):] + [d]
                pytest.fail("import circle: " + " -> ".join(f"fusec.{c}" for c in cycle))
            if state.get(d) is None:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if state.get(m) is None:
            visit(m)


def test_the_checker_sees_imports_inside_functions(tmp_path: Path) -> None:
    src = "def f():\n    from .jit import gpu_jit\n    return gpu_jit\n"
    p = tmp_path / "trace.py"
    p.write_text(src)
    assert _imports("trace", p, {"trace", "jit"}) == {"jit"}
