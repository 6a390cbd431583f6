"""Minimal pytrees: tuples, lists, dicts (by sorted key), namedtuples and None hold leaves."""

from __future__ import annotations

from typing import Any

# A treedef is a hashable nested tuple: ("leaf",) | ("none",) | (kind, aux, (child treedefs...)).
TreeDef = tuple[Any, ...]
LEAF: TreeDef = ("leaf",)


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields")


def flatten_with_paths(tree: Any, path: str = "") -> tuple[list[tuple[str, Any]], TreeDef]:
    """Leaves in a fixed order, each with a readable path such as ``x`` or ``params['w'][0]``."""
    if tree is None:
        return [], ("none",)
    if _is_namedtuple(tree):
        items = [(f"{path}.{f}", getattr(tree, f)) for f in tree._fields]
        kind: Any = ("namedtuple", type(tree))
        aux: Any = None
    elif isinstance(tree, (tuple, list)):
        items = [(f"{path}[{i}]", v) for i, v in enumerate(tree)]
        kind, aux = type(tree).__name__ if type(tree) in (tuple, list) else "tuple", None
    elif isinstance(tree, dict):
        keys = sorted(tree, key=repr)
        items = [(f"{path}[{k!r}]", tree[k]) for k in keys]
        kind, aux = "dict", tuple(keys)
    else:
        return [(path, tree)], LEAF
    leaves: list[tuple[str, Any]] = []
    children = []
    for p, v in items:
        sub, td = flatten_with_paths(v, p)
        leaves.extend(sub)
        children.append(td)
    return leaves, (kind, aux, tuple(children))


def flatten(tree: Any) -> tuple[list[Any], TreeDef]:
    leaves, td = flatten_with_paths(tree)
    return [v for _, v in leaves], td


def unflatten(td: TreeDef, leaves: list[Any]) -> Any:
    it = iter(leaves)
    out = _build(td, it)
    rest = list(it)
    if rest:
        raise ValueError(f"{len(rest)} leaves left over when unflattening")
    return out


def _build(td: TreeDef, it: Any) -> Any:
    if td == LEAF:
        return next(it)
    if td == ("none",):
        return None
    kind, aux, children = td
    vals = [_build(c, it) for c in children]
    if kind == "tuple":
        return tuple(vals)
    if kind == "list":
        return vals
    if kind == "dict":
        return dict(zip(aux, vals))
    return kind[1](*vals)  # namedtuple


def describe(td: TreeDef) -> str:
    """Readable structure for error messages, e.g. ``(*, [*, *], {'a': *})``."""
    if td == LEAF:
        return "*"
    if td == ("none",):
        return "None"
    kind, aux, children = td
    inner = [describe(c) for c in children]
    if kind == "dict":
        return "{" + ", ".join(f"{k!r}: {v}" for k, v in zip(aux, inner)) + "}"
    if kind == "list":
        return "[" + ", ".join(inner) + "]"
    return "(" + ", ".join(inner) + ("," if len(inner) == 1 else "") + ")"
