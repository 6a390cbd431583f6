"""Pytrees: tuples, lists, dicts (by sorted key), namedtuples and None hold leaves, and so does any
type registered with :func:`register_node` (``fusec.tree_util.register_pytree_node`` and friends).

The jit flattens its arguments and rebuilds its results here; ``fusec.tree_util`` is the user-facing
API over the same code, so a node type registered once works in both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Optional

from .errors import FusecError, ShapeError, StaticArgumentError

# A treedef is a hashable nested tuple: ("leaf",) | ("none",) | (kind, aux, (child treedefs...)).
# kind is "tuple", "list", "dict", ("namedtuple", type) or ("node", type) for a registered type.
# Treedefs are part of the jit's cache keys, so everything in them must be hashable.
TreeDef = tuple[Any, ...]
LEAF: TreeDef = ("leaf",)
NONE: TreeDef = ("none",)


@dataclass(frozen=True)
class NodeType:
    """How a registered container type comes apart and goes back together."""

    flatten: Callable[[Any], tuple[Iterable[Any], Hashable]]  # node -> (children, aux data)
    unflatten: Callable[[Any, list[Any]], Any]  # (aux data, children) -> node
    # names for the children's paths (``.w``), or None for positions (``[0]``)
    field_names: Optional[tuple[str, ...]] = None


_REGISTRY: dict[type, NodeType] = {}


def register_node(nodetype: type, flatten: Callable[[Any], tuple[Iterable[Any], Hashable]],
                  unflatten: Callable[[Any, list[Any]], Any],
                  field_names: Optional[tuple[str, ...]] = None) -> None:
    """Make instances of exactly ``nodetype`` (not subclasses) pytree nodes.

    ``flatten(node)`` returns ``(children, aux)``, where ``aux`` is hashable data kept in the
    treedef (it is part of the jit's cache key); ``unflatten(aux, children)`` rebuilds the node.
    """
    if not isinstance(nodetype, type):
        raise FusecError(f"register_node: expected a type, got {nodetype!r}")
    if nodetype in _REGISTRY or nodetype in (tuple, list, dict, type(None)):
        raise FusecError(f"register_node: {nodetype.__qualname__} is already a pytree node type")
    _REGISTRY[nodetype] = NodeType(flatten, unflatten, field_names)


def node_type(nodetype: type) -> Optional[NodeType]:
    """How instances of exactly ``nodetype`` come apart, if it was registered (None otherwise)."""
    return _REGISTRY.get(nodetype)


def is_registered(nodetype: type) -> bool:
    """Whether ``nodetype`` was registered with :func:`register_node`."""
    return node_type(nodetype) is not None


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields")


def node_items(tree: Any, path: str = "") -> Optional[tuple[Any, Any, list[tuple[str, Any]]]]:
    """``(kind, aux, [(child path, child), ...])`` for a container, None for a leaf or None."""
    entry = _REGISTRY.get(type(tree))
    if entry is not None:
        children, aux = entry.flatten(tree)
        children = list(children)
        try:
            hash(aux)
        except TypeError:
            raise StaticArgumentError(
                f"{path or 'tree'}: the aux data that {type(tree).__qualname__}'s flatten "
                f"function returned must be hashable, got {type(aux).__name__}") from None
        names = entry.field_names
        if names is not None and len(names) == len(children):
            paths = [f"{path}.{n}" for n in names]
        else:
            paths = [f"{path}[{i}]" for i in range(len(children))]
        return ("node", type(tree)), aux, list(zip(paths, children))
    if _is_namedtuple(tree):
        return (("namedtuple", type(tree)), None,
                [(f"{path}.{f}", getattr(tree, f)) for f in tree._fields])
    if isinstance(tree, (tuple, list)):
        kind = type(tree).__name__ if type(tree) in (tuple, list) else "tuple"
        return kind, None, [(f"{path}[{i}]", v) for i, v in enumerate(tree)]
    if isinstance(tree, dict):
        keys = sorted(tree, key=repr)
        return "dict", tuple(keys), [(f"{path}[{k!r}]", tree[k]) for k in keys]
    return None


def flatten_with_paths(tree: Any, path: str = "",
                       is_leaf: Optional[Callable[[Any], bool]] = None,
                       ) -> tuple[list[tuple[str, Any]], TreeDef]:
    """Leaves in a fixed order, each with a readable path such as ``x`` or ``params['w'][0]``.

    ``is_leaf(x)`` returning True makes ``x`` a leaf even if it is a container (or None).
    """
    if is_leaf is not None and is_leaf(tree):
        return [(path, tree)], LEAF
    if tree is None:
        return [], NONE
    node = node_items(tree, path)
    if node is None:
        return [(path, tree)], LEAF
    kind, aux, items = node
    leaves: list[tuple[str, Any]] = []
    children = []
    for p, v in items:
        sub, td = flatten_with_paths(v, p, is_leaf)
        leaves.extend(sub)
        children.append(td)
    return leaves, (kind, aux, tuple(children))


def flatten(tree: Any) -> tuple[list[Any], TreeDef]:
    """Leaves in a fixed order and the treedef that :func:`unflatten` rebuilds the tree from."""
    leaves, td = flatten_with_paths(tree)
    return [v for _, v in leaves], td


def num_leaves(td: TreeDef) -> int:
    """How many leaves a tree of structure ``td`` holds."""
    if td == LEAF:
        return 1
    if td == NONE:
        return 0
    return sum(num_leaves(c) for c in td[2])


def unflatten(td: TreeDef, leaves: Iterable[Any]) -> Any:
    """The tree of structure ``td`` holding ``leaves`` (in :func:`flatten`'s order)."""
    leaves = list(leaves)
    want = num_leaves(td)
    if len(leaves) != want:
        raise ShapeError(f"the structure {describe(td)} holds {want} leaves, "
                         f"but {len(leaves)} were given")
    return _build(td, iter(leaves))


def _build(td: TreeDef, it: Any) -> Any:
    if td == LEAF:
        return next(it)
    if td == NONE:
        return None
    kind, aux, children = td
    vals = [_build(c, it) for c in children]
    if kind == "tuple":
        return tuple(vals)
    if kind == "list":
        return vals
    if kind == "dict":
        return dict(zip(aux, vals))
    if kind[0] == "node":
        return _REGISTRY[kind[1]].unflatten(aux, vals)
    return kind[1](*vals)  # namedtuple


def kind_name(td: TreeDef) -> str:
    """What kind of node ``td`` is, in words: ``a leaf``, ``a dict with keys ('a', 'b')``..."""
    if td == LEAF:
        return "a leaf"
    if td == NONE:
        return "None"
    kind, aux, children = td
    if kind == "dict":
        return f"a dict with keys {aux!r}"
    if isinstance(kind, tuple):
        extra = f" (aux data {aux!r})" if kind[0] == "node" and aux is not None else ""
        return f"a {kind[1].__qualname__} of {len(children)} children{extra}"
    return f"a {kind} of {len(children)} children"


def describe(td: TreeDef) -> str:
    """Readable structure for error messages, e.g. ``(*, [*, *], {'a': *}, Params(*, *))``."""
    if td == LEAF:
        return "*"
    if td == NONE:
        return "None"
    kind, aux, children = td
    inner = [describe(c) for c in children]
    if kind == "dict":
        return "{" + ", ".join(f"{k!r}: {v}" for k, v in zip(aux, inner)) + "}"
    if kind == "list":
        return "[" + ", ".join(inner) + "]"
    if isinstance(kind, tuple) and kind[0] == "node":
        return f"{kind[1].__qualname__}(" + ", ".join(inner) + ")"
    return "(" + ", ".join(inner) + ("," if len(inner) == 1 else "") + ")"
