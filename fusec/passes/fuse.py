"""Fusion: turn a program of primitives into a program of ``kernel`` equations.

The plan is decided by which values are *materialised* (written to a buffer). Program inputs and
outputs, reduction and matmul results, and matmul operands are always materialised. Every other
value is computed inside each kernel that needs it. Each materialised value produced by an equation
is a *root*; a kernel computes its roots from materialised values through its *cone*: the
non-materialised elementwise and movement equations between them.

* Elementwise roots of one shape whose cones overlap (or that feed each other) merge into one
  multi-output kernel, unless merging would create a cycle between kernels.
* A value in the cones of k >= 2 kernels is either recomputed in each or materialised once, whichever
  moves fewer bytes: materialise when ``V * (1 + k) < (k - 1) * L`` where V is its size and L the
  bytes of the materialised values its own cone reads.
* A kernel never binds more storage buffers than the device allows: an intermediate of its cone is
  materialised to split it.
* ``reshape`` of a materialised value is an alias of its buffer, not a kernel.

With ``enabled=False`` every compute equation is materialised: one kernel per op (movement ops still
fold into the index arithmetic of the kernel that reads them), the baseline of benchmark reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import DeviceLimitError
from ..ir import MOVEMENT, REDUCE, Eqn, Op, Program, Var

KIND_ABBR = {"elementwise": "ew", "reduce": "red", "matmul": "mm"}


@dataclass(eq=False)
class _Group:
    roots: list[Eqn]
    kind: str
    eqns: dict[int, Eqn] = field(default_factory=dict)  # cone and roots, by id

    def outs(self) -> list[Var]:
        return [e.out for e in self.roots]


def fuse(prog: Program, enabled: bool = True, max_bindings: int = 8) -> Program:
    order = {id(e): i for i, e in enumerate(prog.eqns)}
    producer = {id(o): e for e in prog.eqns for o in e.outs}
    input_pos = {id(v): i for i, v in enumerate(prog.inputs)}

    mat: set[int] = set(input_pos)
    mat.update(id(a) for a in prog.outputs if isinstance(a, Var))
    for e in prog.eqns:
        if e.op in REDUCE or e.op is Op.MATMUL or (not enabled and e.op not in MOVEMENT):
            mat.add(id(e.out))
        if e.op is Op.MATMUL:
            # operands: only movement ops are recomputed per tile load; arithmetic is materialised
            for a in e.inputs:
                v = a
                while isinstance(v, Var) and id(v) in producer and producer[id(v)].op in MOVEMENT:
                    v = producer[id(v)].inputs[0]
                if isinstance(v, Var):
                    mat.add(id(v))

    def cone(root: Eqn) -> dict[int, Eqn]:
        found: dict[int, Eqn] = {}
        stack = [a for a in root.inputs if isinstance(a, Var)]
        while stack:
            v = stack.pop()
            if id(v) in mat:
                continue
            p = producer[id(v)]
            if id(p) not in found:
                found[id(p)] = p
                stack.extend(a for a in p.inputs if isinstance(a, Var))
        return found

    def leaves(eqns: dict[int, Eqn], outs: set[int]) -> list[Var]:
        seen: dict[int, Var] = {}
        for e in sorted(eqns.values(), key=lambda e: order[id(e)]):
            for a in e.inputs:
                if isinstance(a, Var) and id(a) in mat and id(a) not in outs and id(a) not in seen:
                    seen[id(a)] = a
        return sorted(seen.values(), key=lambda v: (
            input_pos.get(id(v), len(input_pos)), order.get(id(producer.get(id(v))), -1)))

    def n_bindings(g: _Group) -> int:
        return len(leaves(g.eqns, {id(o) for o in g.outs()})) + len(g.roots)

    while True:
        groups: list[_Group] = []
        aliases: list[Eqn] = []
        for e in prog.eqns:
            if id(e.out) not in mat:
                continue
            if e.op is Op.RESHAPE and isinstance(e.inputs[0], Var) and id(e.inputs[0]) in mat:
                aliases.append(e)
                continue
            kind = "reduce" if e.op in REDUCE else "matmul" if e.op is Op.MATMUL else "elementwise"
            g = _Group([e], kind, {id(e): e, **cone(e)})
            groups.append(g)
        groups = _merge(groups, n_bindings, max_bindings)

        # the binding limit: split an oversized kernel by materialising part of its cone
        too_big = next((g for g in groups if n_bindings(g) > max_bindings), None)
        if too_big is not None:
            mat.add(id(_split_point(too_big, cone, leaves, max_bindings).out))
            continue

        # values in several kernels: recompute or materialise, by bytes moved
        owners: dict[int, int] = {}
        for g in groups:
            for k in g.eqns:
                if id(g.eqns[k].out) not in mat:
                    owners[k] = owners.get(k, 0) + 1
        decided = False
        for e in reversed(prog.eqns):
            k = owners.get(id(e), 0)
            if k < 2:
                continue
            c = cone(e)
            c[id(e)] = e
            leaf_bytes = sum(v.nbytes for v in leaves(c, set()))
            if e.out.nbytes * (1 + k) < (k - 1) * leaf_bytes:
                mat.add(id(e.out))
                decided = True
                break
        if not decided:
            break

    return _emit(prog, groups, aliases, order, producer, leaves)


def _reads(g: _Group, by_var: dict[int, _Group]) -> list[_Group]:
    """The kernels whose outputs ``g`` reads."""
    own = {id(o) for o in g.outs()}
    found: dict[int, _Group] = {}
    for e in g.eqns.values():
        for v in e.inputs:
            if isinstance(v, Var) and id(v) not in own and id(v) in by_var:
                src = by_var[id(v)]
                if src is not g:
                    found[id(src)] = src
    return list(found.values())


def _reaches(starts: list[_Group], target: _Group, by_var: dict[int, _Group]) -> bool:
    """Does any of ``starts`` depend, directly or through other kernels, on ``target``?"""
    seen: set[int] = set()
    stack = list(starts)
    while stack:
        g = stack.pop()
        if g is target:
            return True
        if id(g) in seen:
            continue
        seen.add(id(g))
        stack.extend(_reads(g, by_var))
    return False


def _merge(groups: list[_Group], n_bindings: Callable[[_Group], int],
           max_bindings: int) -> list[_Group]:
    """Merge elementwise groups of one shape that share work or feed each other."""
    changed = True
    while changed:
        changed = False
        by_var = {id(o): g for g in groups for o in g.outs()}
        ew = [g for g in groups if g.kind == "elementwise"]
        for i, a in enumerate(ew):
            for b in ew[i + 1:]:
                if a.roots[0].out.shape != b.roots[0].out.shape:
                    continue
                ra, rb = _reads(a, by_var), _reads(b, by_var)
                feeds = any(g is a for g in rb) or any(g is b for g in ra)
                if not (feeds or set(a.eqns) & set(b.eqns)):
                    continue
                merged = _Group(a.roots + b.roots, "elementwise", {**a.eqns, **b.eqns})
                if n_bindings(merged) > max_bindings:
                    continue
                # a path a -> other kernel -> b (or back) would become a cycle
                if _reaches([g for g in rb if g is not a], a, by_var) or _reaches(
                        [g for g in ra if g is not b], b, by_var):
                    continue
                groups = [g for g in groups if g is not a and g is not b] + [merged]
                changed = True
                break
            if changed:
                break
    return groups


def _split_point(g: _Group, cone: object, leaves: object, max_bindings: int) -> Eqn:
    """The cone equation with the most inputs that still fits in a kernel of its own."""
    best: Eqn | None = None
    best_n = -1
    roots = {id(r) for r in g.roots}
    for e in g.eqns.values():
        if id(e) in roots:
            continue
        c = cone(e)  # type: ignore[operator]
        c[id(e)] = e
        n = len(leaves(c, set()))  # type: ignore[operator]
        if n + 1 <= max_bindings and n > best_n:
            best, best_n = e, n
    if best is None:
        raise DeviceLimitError(
            f"a kernel needs more storage buffers than the device allows ({max_bindings}) and "
            "cannot be split further")
    return best


def _emit(prog: Program, groups: list[_Group], aliases: list[Eqn], order: dict[int, int],
          producer: dict[int, Eqn], leaves: object) -> Program:
    items: list[tuple[str, object]] = [("group", g) for g in groups] + [("alias", a) for a in aliases]
    made_by: dict[int, int] = {}
    for i, (kind, it) in enumerate(items):
        outs = it.outs() if isinstance(it, _Group) else [it.out]  # type: ignore[attr-defined]
        for o in outs:
            made_by[id(o)] = i

    def reads(i: int) -> set[int]:
        kind, it = items[i]
        if isinstance(it, _Group):
            own = {id(o) for o in it.outs()}
            vs = leaves(it.eqns, own)  # type: ignore[operator]
        else:
            vs = [it.inputs[0]]  # type: ignore[attr-defined]
        return {made_by[id(v)] for v in vs if id(v) in made_by}

    def position(i: int) -> int:
        it = items[i][1]
        roots = it.roots if isinstance(it, _Group) else [it]
        return max(order[id(r)] for r in roots)  # type: ignore[union-attr]

    deps = {i: reads(i) for i in range(len(items))}
    done: set[int] = set()
    sequence: list[int] = []
    while len(sequence) < len(items):
        ready = [i for i in range(len(items)) if i not in done and deps[i] <= done]
        if not ready:
            raise AssertionError("fusion produced a cycle between kernels")
        i = min(ready, key=position)
        done.add(i)
        sequence.append(i)

    eqns: list[Eqn] = []
    counter = 0
    for i in sequence:
        _, it = items[i]
        if not isinstance(it, _Group):
            eqns.append(it)  # type: ignore[arg-type]
            continue
        own = {id(o) for o in it.outs()}
        ins = leaves(it.eqns, own)  # type: ignore[operator]
        body_eqns = sorted(it.eqns.values(), key=lambda e: order[id(e)])
        outs = [r.out for r in sorted(it.roots, key=lambda e: order[id(e)])]
        body = Program(list(ins), body_eqns, outs)
        ops = []
        for e in body_eqns:
            if e.op not in MOVEMENT and e.op.value not in ops:
                ops.append(e.op.value)
        name = f"k{counter}_{KIND_ABBR[it.kind]}" + "".join(f"_{o}" for o in ops[:4])
        counter += 1
        eqns.append(Eqn(Op.KERNEL, tuple(ins), tuple(outs),
                        {"kind": it.kind, "name": name, "body": body}))
    return Program(list(prog.inputs), eqns, list(prog.outputs))
