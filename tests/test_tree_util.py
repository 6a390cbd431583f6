"""fusec.tree_util: flatten/unflatten/map/reduce over nested containers and registered node types,
outside and inside @fusec.gpu_jit."""

from __future__ import annotations

import dataclasses
import operator
from collections import namedtuple
from typing import Any

import numpy as np
import pytest
from helpers import Delta

import fusec
from fusec import tree_util as tu

RNG = np.random.default_rng(17)
Pair = namedtuple("Pair", ["left", "right"])


def rand(*shape: int) -> np.ndarray:
    return RNG.uniform(-1, 1, shape).astype(np.float32)


@tu.register_pytree_node_class
class Linear:
    """A custom node: two array children and a hashable name as aux data."""

    def __init__(self, w: Any, b: Any, name: str = "lin") -> None:
        self.w, self.b, self.name = w, b, name

    def tree_flatten(self) -> tuple[tuple[Any, Any], str]:
        return (self.w, self.b), self.name

    @classmethod
    def tree_unflatten(cls, aux: str, children: Any) -> Linear:
        return cls(*children, name=aux)


class Box:
    """Registered with register_pytree_node (functions, not methods)."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items


tu.register_pytree_node(Box, lambda b: (b.items, len(b.items)), lambda n, ch: Box(list(ch)))


@tu.register_dataclass
@dataclasses.dataclass
class Adam:
    m: Any
    v: Any
    step: int = dataclasses.field(default=0, metadata={"static": True})


class Unhashable:
    def __init__(self, x: Any) -> None:
        self.x = x


tu.register_pytree_node(Unhashable, lambda u: ([u.x], [1, 2]), lambda aux, ch: Unhashable(ch[0]))


# --- flattening -----------------------------------------------------------------------------------


def test_flatten_nested_builtin_containers_in_order() -> None:
    tree = {"b": [1, (2, 3)], "a": Pair(4, None), "c": 5}
    leaves, td = tu.tree_flatten(tree)
    assert leaves == [4, 1, 2, 3, 5]  # keys sorted: a, b, c; None holds no leaf
    assert td.num_leaves == 5
    back = td.unflatten([10, 11, 12, 13, 14])
    assert back == {"a": Pair(10, None), "b": [11, (12, 13)], "c": 14}
    assert isinstance(back["a"], Pair) and isinstance(back["b"], list)
    assert isinstance(back["b"][1], tuple)
    assert tu.tree_unflatten(td, leaves) == tree


def test_none_is_an_empty_node_and_scalars_are_leaves() -> None:
    assert tu.tree_leaves(None) == []
    assert tu.tree_structure(None).num_leaves == 0
    assert tu.tree_leaves([None, 7, (None,)]) == [7]
    assert tu.tree_leaves(3.5) == [3.5]
    assert tu.tree_structure(3.5).num_leaves == 1
    assert tu.tree_unflatten(tu.tree_structure(None), []) is None
    assert tu.tree_leaves(((), [], {})) == []


def test_is_leaf_stops_the_descent() -> None:
    tree = [(1, 2), (3, (4, 5)), None]
    leaves = tu.tree_leaves(tree, is_leaf=lambda x: isinstance(x, tuple))
    assert leaves == [(1, 2), (3, (4, 5))]
    assert tu.tree_leaves(tree, is_leaf=lambda x: x is None) == [1, 2, 3, 4, 5, None]


def test_treedef_equality_and_hash() -> None:
    a = tu.tree_structure({"x": [1, 2], "y": None})
    b = tu.tree_structure({"y": None, "x": ["p", "q"]})
    assert a == b and hash(a) == hash(b)
    assert a != tu.tree_structure({"x": (1, 2), "y": None})  # list vs tuple
    assert a != tu.tree_structure({"x": [1, 2], "z": None})  # other key
    assert a != tu.tree_structure({"x": [1, 2, 3], "y": None})  # other length
    assert tu.tree_structure(Pair(1, 2)) != tu.tree_structure((1, 2))
    assert tu.tree_structure(Linear(1, 2, "a")) != tu.tree_structure(Linear(1, 2, "b"))  # aux
    assert repr(a) == "PyTreeDef({'x': [*, *], 'y': None})"
    assert [c.num_leaves for c in a.children()] == [2, 0]
    assert a.num_nodes == 5  # dict, list, two leaves, None


def test_custom_nodes_flatten_and_rebuild() -> None:
    tree = [Linear(1, (2, 3), "enc"), Box([4, {"k": 5}]), Adam(m=6, v=[7], step=3)]
    leaves, td = tu.tree_flatten(tree)
    assert leaves == [1, 2, 3, 4, 5, 6, 7]
    lin, box, adam = td.unflatten([x * 10 for x in leaves])
    assert isinstance(lin, Linear) and (lin.w, lin.b, lin.name) == (10, (20, 30), "enc")
    assert isinstance(box, Box) and box.items == [40, {"k": 50}]
    assert adam == Adam(m=60, v=[70], step=3)  # the static field rides along as aux data
    assert repr(tu.tree_structure(tree)).startswith("PyTreeDef([Linear(*, (*, *)), Box(*, {")


def test_a_subclass_of_a_registered_type_is_a_leaf() -> None:
    class Sub(Linear):
        pass

    # registration covers exactly the type, as in JAX: a subclass is a leaf
    assert tu.tree_leaves(Sub(1, 2)) != [1, 2]
    assert len(tu.tree_leaves(Sub(1, 2))) == 1


# --- map, reduce, transpose -----------------------------------------------------------------------


def test_tree_map_one_and_several_trees() -> None:
    t = {"a": [1, 2], "b": (3, None), "c": Linear(4, 5)}
    out = tu.tree_map(lambda x: x * 2, t)
    assert out["a"] == [2, 4] and out["b"] == (6, None)
    assert isinstance(out["c"], Linear) and (out["c"].w, out["c"].b) == (8, 10)
    u = tu.tree_map(lambda x: x + 100, t)
    v = tu.tree_map(lambda x: -x, t)
    s = tu.tree_map(lambda x, y, z: (x, y, z), t, u, v)
    assert s["a"] == [(1, 101, -1), (2, 102, -2)] and s["c"].b == (5, 105, -5)


def test_tree_map_other_trees_may_go_deeper_where_the_first_has_a_leaf() -> None:
    out = tu.tree_map(lambda n, sub: (n, tu.tree_leaves(sub)), [1, 2], [(3, 4), {"z": 5}])
    assert out == [(1, [3, 4]), (2, [5])]


def test_tree_map_is_leaf() -> None:
    out = tu.tree_map(lambda p: p[0] + p[1], [(1, 2), (3, 4)], is_leaf=lambda x:
                      isinstance(x, tuple))
    assert out == [3, 7]


def test_tree_reduce_and_tree_all() -> None:
    t = {"a": [1, 2], "b": (3, None, Box([4]))}
    assert tu.tree_reduce(operator.add, t) == 10
    assert tu.tree_reduce(operator.add, t, 100) == 110
    assert tu.tree_reduce(lambda acc, x: acc + [x], t, []) == [1, 2, 3, 4]
    assert tu.tree_reduce(operator.add, None, 5) == 5
    assert tu.tree_all({"a": [True, 1], "b": (3.0,)})
    assert not tu.tree_all({"a": [True, 0], "b": (3.0,)})
    assert tu.tree_all([None, ()])


def test_tree_transpose() -> None:
    outer = tu.tree_structure([0, 0, 0])
    inner = tu.tree_structure({"p": 0, "g": 0})
    tree = [{"p": 1, "g": 2}, {"p": 3, "g": 4}, {"p": 5, "g": 6}]
    assert tu.tree_transpose(outer, inner, tree) == {"p": [1, 3, 5], "g": [2, 4, 6]}
    with pytest.raises(fusec.ShapeError, match=r"at \[1\]"):
        tu.tree_transpose(outer, inner, [{"p": 1, "g": 2}, (3, 4), {"p": 5, "g": 6}])


# --- with fusec arrays, outside and inside jit ---------------------------------------------------


def _params() -> tuple[dict[str, Any], dict[str, Any]]:
    params = {"w": rand(7, 5), "b": rand(5), "layers": [rand(3), (rand(1, 13),)]}
    grads = tu.tree_map(lambda p: RNG.standard_normal(p.shape).astype(np.float32), params)
    return params, grads


def _sgd(p: Any, g: Any) -> Any:
    return p - 0.1 * g


def test_sgd_update_outside_jit_with_fusec_arrays() -> None:
    params, grads = _params()
    dparams = tu.tree_map(fusec.device_put, params)
    dgrads = tu.tree_map(fusec.device_put, grads)
    new = tu.tree_map(_sgd, dparams, dgrads)
    assert tu.tree_structure(new) == tu.tree_structure(params)
    want = tu.tree_map(lambda p, g: p.astype(np.float64) - 0.1 * g.astype(np.float64), params,
                       grads)
    for got, w in zip(tu.tree_leaves(new), tu.tree_leaves(want)):
        assert isinstance(got, fusec.Array)
        np.testing.assert_allclose(np.asarray(got), w, rtol=1e-6, atol=1e-6)


def test_sgd_update_inside_jit() -> None:
    params, grads = _params()
    step = fusec.gpu_jit(lambda p, g: tu.tree_map(_sgd, p, g))
    new = step(params, grads)
    assert tu.tree_structure(new) == tu.tree_structure(params)
    assert isinstance(new["layers"][1], tuple)
    for got, p, g in zip(tu.tree_leaves(new), tu.tree_leaves(params), tu.tree_leaves(grads)):
        np.testing.assert_allclose(np.asarray(got), p.astype(np.float64) - 0.1 * g, rtol=1e-6,
                                   atol=1e-6)


def test_custom_node_in_and_out_of_jit_compiles_once_per_structure() -> None:
    @fusec.gpu_jit
    def update(model: Linear, grads: Linear, opt: Adam) -> tuple[Linear, Adam]:
        new = tu.tree_map(_sgd, model, grads)
        m = tu.tree_map(lambda m, g: 0.9 * m + g, opt.m, grads)
        return new, Adam(m=m, v=opt.v, step=opt.step + 1)

    def args() -> tuple[Linear, Linear, Adam]:
        model = Linear(rand(4, 3), rand(3), "enc")
        grads = Linear(rand(4, 3), rand(3), "enc")
        opt = Adam(m=Linear(rand(4, 3), rand(3), "enc"), v=rand(2), step=2)
        return model, grads, opt

    model, grads, opt = args()
    with Delta() as first:
        new, opt2 = update(model, grads, opt)
    assert first.traces == 1
    assert isinstance(new, Linear) and new.name == "enc"
    assert isinstance(opt2, Adam) and opt2.step == 3 and isinstance(opt2.m, Linear)
    np.testing.assert_allclose(np.asarray(new.w), model.w - 0.1 * grads.w.astype(np.float64),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(new.b), model.b - 0.1 * grads.b.astype(np.float64),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(opt2.m.w), 0.9 * opt.m.w.astype(np.float64) + grads.w,
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(opt2.v), opt.v)

    model, grads, opt = args()  # fresh values, same structure: nothing new to compile
    with Delta() as second:
        new, _ = update(model, grads, opt)
    assert (second.traces, second.lowerings, second.misses, second.hits) == (0, 0, 0, 1)
    np.testing.assert_allclose(np.asarray(new.w), model.w - 0.1 * grads.w.astype(np.float64),
                               rtol=1e-6, atol=1e-6)

    # other aux data (a name, a static field) is another structure: a new trace
    with Delta() as third:
        update(Linear(model.w, model.b, "dec"), Linear(grads.w, grads.b, "dec"),
               Adam(m=Linear(opt.m.w, opt.m.b, "dec"), v=opt.v, step=2))
    assert third.traces == 1


def test_jit_error_paths_name_custom_children() -> None:
    f = fusec.gpu_jit(lambda opt, lin: opt.m + lin.b)
    with pytest.raises(fusec.FusecError, match=r"opt\.m"):
        f(Adam(m="oops", v=rand(2)), Linear(rand(2), rand(2)))
    with pytest.raises(fusec.FusecError, match=r"lin\[1\]"):
        f(Adam(m=rand(2), v=rand(2)), Linear(rand(2), "oops"))


# --- errors ---------------------------------------------------------------------------------------


def test_unflatten_with_the_wrong_number_of_leaves() -> None:
    td = tu.tree_structure({"a": [1, 2], "b": 3})
    with pytest.raises(fusec.ShapeError, match=r"holds 3 leaves, but 2 were given"):
        tu.tree_unflatten(td, [1, 2])
    with pytest.raises(fusec.ShapeError, match=r"holds 3 leaves, but 4 were given"):
        td.unflatten([1, 2, 3, 4])


def test_tree_map_over_trees_of_different_structure() -> None:
    with pytest.raises(fusec.ShapeError, match=r"tree 1 .*at \['a'\]: expected a list of 2 "
                                                r"children, got a list of 3 children"):
        tu.tree_map(operator.add, {"a": [1, 2]}, {"a": [1, 2, 3]})
    with pytest.raises(fusec.ShapeError, match=r"expected a dict with keys \('a', 'b'\), got a "
                                                r"dict with keys \('a', 'c'\)"):
        tu.tree_map(operator.add, {"a": 1, "b": 2}, {"a": 1, "c": 2})
    with pytest.raises(fusec.ShapeError, match=r"tree 2 .*at \[1\]: expected a tuple of 2 "
                                                r"children, got a leaf"):
        tu.tree_map(lambda *x: 0, [1, (2, 3)], [1, (2, 3)], [1, 2])
    with pytest.raises(fusec.ShapeError, match=r"at \[0\]: expected None, got int"):
        tu.tree_map(lambda *x: 0, [None, 1], [0, 1])
    with pytest.raises(fusec.ShapeError, match=r"expected a Linear of 2 children \(aux data "
                                                r"'a'\), got a Linear of 2 children \(aux"):
        tu.tree_map(operator.add, Linear(1, 2, "a"), Linear(1, 2, "b"))
    with pytest.raises(ValueError):  # ShapeError is a ValueError, as JAX's error is
        tu.tree_map(operator.add, (1, 2), [1, 2])


def test_tree_reduce_of_an_empty_tree_needs_an_initializer() -> None:
    with pytest.raises(fusec.ShapeError, match="no leaves and no initializer"):
        tu.tree_reduce(operator.add, [None, ()])


def test_unhashable_aux_data_and_double_registration() -> None:
    with pytest.raises(fusec.StaticArgumentError, match=r"Unhashable's flatten .* hashable"):
        tu.tree_leaves(Unhashable(1))
    with pytest.raises(fusec.FusecError, match="already a pytree node type"):
        tu.register_pytree_node(Box, lambda b: ((), None), lambda a, c: Box([]))
    with pytest.raises(fusec.FusecError, match="already a pytree node type"):
        tu.register_pytree_node(dict, lambda b: ((), None), lambda a, c: {})
    with pytest.raises(TypeError, match="PyTreeDef"):
        tu.tree_unflatten((1, 2), [1])  # type: ignore[arg-type]
