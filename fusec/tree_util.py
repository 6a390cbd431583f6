"""JAX-style pytree utilities for training code: map, flatten, reduce over nested parameters.

    params = {"w": w, "b": b}
    params = tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)

A pytree is a leaf or a container of pytrees: tuples, lists, dicts (children in sorted key order),
namedtuples, and types registered with :func:`register_pytree_node`,
:func:`register_pytree_node_class` or :func:`register_dataclass`. ``None`` is a container with no
children. Everything else is a leaf. Registered types work as arguments and results of
``@fusec.gpu_jit`` functions too: the jit flattens with the same registry.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Hashable, Iterable, Optional, Sequence, TypeVar

from . import tree as _tree
from .errors import ShapeError

__all__ = [
    "PyTreeDef", "register_dataclass", "register_pytree_node", "register_pytree_node_class",
    "tree_all", "tree_flatten", "tree_leaves", "tree_map", "tree_reduce", "tree_structure",
    "tree_transpose", "tree_unflatten",
]

IsLeaf = Optional[Callable[[Any], bool]]
T = TypeVar("T")
_NO_INITIALIZER = object()


@dataclasses.dataclass(frozen=True)
class PyTreeDef:
    """The structure of a pytree without its leaves. Hashable; equal for equal structures."""

    td: _tree.TreeDef

    @property
    def num_leaves(self) -> int:
        """How many leaves a tree of this structure holds."""
        return _tree.num_leaves(self.td)

    @property
    def num_nodes(self) -> int:
        """How many nodes (containers, None and leaves) the structure has."""
        def count(td: _tree.TreeDef) -> int:
            return 1 if td in (_tree.LEAF, _tree.NONE) else 1 + sum(count(c) for c in td[2])
        return count(self.td)

    def unflatten(self, leaves: Iterable[Any]) -> Any:
        """The tree of this structure holding ``leaves`` (in :func:`tree_leaves` order)."""
        return tree_unflatten(self, leaves)

    def children(self) -> list[PyTreeDef]:
        """The structures of the root node's children (none for a leaf or None)."""
        if self.td in (_tree.LEAF, _tree.NONE):
            return []
        return [PyTreeDef(c) for c in self.td[2]]

    def __repr__(self) -> str:
        return f"PyTreeDef({_tree.describe(self.td)})"


# --- flattening -----------------------------------------------------------------------------------


def tree_flatten(tree: Any, is_leaf: IsLeaf = None) -> tuple[list[Any], PyTreeDef]:
    """The leaves of ``tree`` (depth first, dict keys sorted) and its structure.

    ``is_leaf(x)`` returning True stops the descent at ``x``: it becomes one leaf.
    """
    leaves, td = _tree.flatten_with_paths(tree, is_leaf=is_leaf)
    return [v for _, v in leaves], PyTreeDef(td)


def tree_leaves(tree: Any, is_leaf: IsLeaf = None) -> list[Any]:
    """The leaves of ``tree`` in flattening order (``None`` holds none)."""
    return tree_flatten(tree, is_leaf)[0]


def tree_structure(tree: Any, is_leaf: IsLeaf = None) -> PyTreeDef:
    """The structure of ``tree``: what :func:`tree_unflatten` rebuilds it from."""
    return tree_flatten(tree, is_leaf)[1]


def tree_unflatten(treedef: PyTreeDef, leaves: Iterable[Any]) -> Any:
    """The tree of structure ``treedef`` holding ``leaves``; their number must match exactly."""
    if not isinstance(treedef, PyTreeDef):
        raise TypeError(f"tree_unflatten: expected a PyTreeDef (from tree_structure or "
                        f"tree_flatten), got {type(treedef).__name__}")
    try:
        return _tree.unflatten(treedef.td, leaves)
    except ShapeError as e:
        raise ShapeError(f"tree_unflatten: {e}") from None


def _flatten_up_to(td: _tree.TreeDef, tree: Any, path: str) -> list[tuple[str, Any]]:
    """``tree`` cut at the leaves of ``td``: one (path, value) per leaf of ``td``, the value a
    whole subtree where ``tree`` goes deeper.

    Raises ShapeError naming the first path where ``tree``'s containers differ from ``td``'s.
    """
    if td == _tree.LEAF:
        return [(path, tree)]
    where = path or "the root"
    if td == _tree.NONE:
        if tree is not None:
            raise ShapeError(f"at {where}: expected None, got {type(tree).__name__}")
        return []
    node = _tree.node_items(tree, path) if tree is not None else None
    got: _tree.TreeDef
    if tree is None:
        got = _tree.NONE
    elif node is None:
        got = _tree.LEAF
    else:
        got = (node[0], node[1], tuple(_tree.LEAF for _ in node[2]))
    kind, aux, children = td
    if node is None or node[0] != kind or node[1] != aux or len(node[2]) != len(children):
        raise ShapeError(f"at {where}: expected {_tree.kind_name(td)}, got {_tree.kind_name(got)}")
    out: list[tuple[str, Any]] = []
    for c, (p, v) in zip(children, node[2]):
        out.extend(_flatten_up_to(c, v, p))
    return out


def tree_map(f: Callable[..., Any], tree: Any, *rest: Any, is_leaf: IsLeaf = None) -> Any:
    """``f`` applied to each leaf of ``tree`` (and the matching leaves of ``rest``), as a tree.

    Each tree in ``rest`` must have ``tree``'s structure, or have it as a prefix: where ``tree``
    has a leaf, the other tree's whole subtree there is passed to ``f``. A mismatch raises
    ShapeError saying where the trees differ.
    """
    leaves, treedef = tree_flatten(tree, is_leaf)
    columns = [leaves]
    for i, other in enumerate(rest, start=1):
        try:
            columns.append([v for _, v in _flatten_up_to(treedef.td, other, "")])
        except ShapeError as e:
            raise ShapeError(f"tree_map: tree {i} does not have the structure of tree 0 "
                             f"{_tree.describe(treedef.td)}: {e}") from None
    return treedef.unflatten(f(*xs) for xs in zip(*columns))


def tree_reduce(f: Callable[[Any, Any], Any], tree: Any, initializer: Any = _NO_INITIALIZER,
                is_leaf: IsLeaf = None) -> Any:
    """The leaves of ``tree`` folded with ``f`` from the left, starting at ``initializer`` if given.

    Without an initializer, an empty tree raises ShapeError.
    """
    leaves = tree_leaves(tree, is_leaf)
    if initializer is _NO_INITIALIZER:
        if not leaves:
            raise ShapeError("tree_reduce: the tree has no leaves and no initializer was given")
        return functools.reduce(f, leaves)
    return functools.reduce(f, leaves, initializer)


def tree_all(tree: Any, is_leaf: IsLeaf = None) -> bool:
    """Whether every leaf of ``tree`` is true (True for a tree without leaves)."""
    return all(tree_leaves(tree, is_leaf))


def tree_transpose(outer_treedef: PyTreeDef, inner_treedef: PyTreeDef,
                   pytree_to_transpose: Any) -> Any:
    """Turn a tree of structure outer-of-inner into one of inner-of-outer.

    ``tree_transpose(tree_structure([0, 0]), tree_structure((0, 0)), [(1, 2), (3, 4)])`` is
    ``([1, 3], [2, 4])``.
    """
    try:
        inners = _flatten_up_to(outer_treedef.td, pytree_to_transpose, "")
        columns = [[v for _, v in _flatten_up_to(inner_treedef.td, t, p)] for p, t in inners]
    except ShapeError as e:
        raise ShapeError(f"tree_transpose: the tree is not {outer_treedef} of "
                         f"{inner_treedef}: {e}") from None
    rows = [outer_treedef.unflatten([col[j] for col in columns])
            for j in range(inner_treedef.num_leaves)]
    return inner_treedef.unflatten(rows)


# --- registering node types -----------------------------------------------------------------------


def register_pytree_node(nodetype: type, flatten_func: Callable[[Any], tuple[Iterable[Any], Any]],
                         unflatten_func: Callable[[Any, Any], Any]) -> None:
    """Make instances of ``nodetype`` pytree nodes (in tree_util and ``@fusec.gpu_jit`` alike).

    ``flatten_func(node)`` returns ``(children, aux_data)``; ``aux_data`` must be hashable (it is
    part of the structure, and of the jit's cache key). ``unflatten_func(aux_data, children)``
    rebuilds the node. Children's paths in jit error messages are ``name[i]``.
    """
    _tree.register_node(nodetype, flatten_func, unflatten_func)


def register_pytree_node_class(cls: type[T]) -> type[T]:
    """Class decorator: register ``cls`` using its ``tree_flatten()`` method (returning
    ``(children, aux_data)``) and its ``tree_unflatten(aux_data, children)`` classmethod."""
    _tree.register_node(cls, lambda node: node.tree_flatten(),
                        lambda aux, children: cls.tree_unflatten(aux, children))  # type: ignore
    return cls


def register_dataclass(nodetype: type[T], data_fields: Optional[Sequence[str]] = None,
                       meta_fields: Optional[Sequence[str]] = None) -> type[T]:
    """Register a dataclass: ``data_fields`` are children, ``meta_fields`` hashable aux data.

    Without field lists, every field is a child except those declared with
    ``field(metadata={"static": True})``. Usable as a class decorator. Children's paths in jit
    error messages are ``name.field``.
    """
    if data_fields is None and meta_fields is None:
        if not dataclasses.is_dataclass(nodetype):
            raise TypeError(f"register_dataclass: {nodetype.__qualname__} is not a dataclass; "
                            "pass data_fields and meta_fields")
        fields = [f for f in dataclasses.fields(nodetype) if f.init]
        meta_fields = [f.name for f in fields if f.metadata.get("static", False)]
        data_fields = [f.name for f in fields if not f.metadata.get("static", False)]
    data = tuple(data_fields or ())
    meta = tuple(meta_fields or ())

    def flatten(node: Any) -> tuple[list[Any], Hashable]:
        return [getattr(node, n) for n in data], tuple(getattr(node, n) for n in meta)

    def unflatten(aux: Any, children: list[Any]) -> Any:
        return nodetype(**dict(zip(data, children)), **dict(zip(meta, aux)))

    _tree.register_node(nodetype, flatten, unflatten, field_names=data)
    return nodetype
