"""Fusion: turn a program of primitives into a program of ``kernel`` equations.

The plan is decided by which values are *materialised* (could be written to a buffer). Program
inputs and outputs, reduction and matmul results, and matmul operands start materialised. Every
other value is computed inside each kernel that needs it. Each materialised value produced by an
equation is a *root*; a kernel (a *group*) computes its roots from materialised values through its
*cone*: the non-materialised elementwise and movement equations between them. Reductions therefore
absorb their elementwise prologues from the start. Then groups merge:

* elementwise groups of one shape whose cones overlap, or that feed each other: one multi-output
  kernel;
* an elementwise group reading a reduction's result, whose outputs are either rows of the reduced
  array (rows up to ``ROW_MAX`` elements) or one value per row: the reduction's epilogue. This is
  how softmax, log_softmax, layer_norm and rms_norm become one kernel;
* two reductions over the same rows, one reading the other (max then sum of exp(x - max)) or both
  reading the same array: one kernel whose reductions run one after another; rows longer than
  ``ROW_MAX`` stop here, giving a two-kernel plan (statistics, then the elementwise pass);
* an elementwise group of the matmul's shape reading its result: the matmul's epilogue (bias,
  activation, residual), unless codegen says no (:func:`fusec.codegen.epilogue_fuses`: only
  under ``FUSEC_MATMUL_EPILOGUE=separate``); the same for a quantized product (``qmatmul``, a
  kernel of kind "quant"), whose other kernels of their own kind never merge;
* on GPUs, a quantized product's x of at most ``PROLOGUE_ROWS`` rows, where it is a little
  elementwise work over buffers (SwiGLU's ``silu(gate) * up`` in a decode step at batch 1), is
  not materialised: the product's kernel computes it as it loads x (its prologue;
  :func:`_prologue`); so are an attention kernel's queries, where a head has at most
  ``PROLOGUE_QUERY_ROWS`` of them (RoPE in a decode step).

A merge is made only if it creates no cycle between kernels, binds no more storage buffers than the
device allows, and codegen can index it (a register holding a row's reduction can only be read for
that row; :func:`fusec.codegen.check`). A value only its own kernel reads is never written.

A value in the cones of k >= 2 kernels is either recomputed in each or materialised once, whichever
moves fewer bytes: materialise when ``V * (1 + k) < (k - 1) * L`` where V is its size and L the
bytes of the materialised values its own cone reads. A kernel that would bind too many buffers is
split by materialising part of its cone. ``reshape`` of a materialised value is an alias of its
buffer, not a kernel. A ``loop`` equation is a group of its own kind "loop" that never merges:
its inputs and results are buffers, and it stays as it is (its body was lowered on its own).

With ``enabled=False`` every compute equation is materialised and nothing merges: one kernel per op
(movement ops still fold into the index arithmetic of the kernel that reads them), the baseline of
the benchmark reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from .. import codegen
from ..errors import DeviceLimitError
from ..ir import ELEMENTWISE, KERNEL_KIND, MOVEMENT, REDUCE, SOURCE, Eqn, Op, Program, Var

KIND_ABBR = {"elementwise": "ew", "reduce": "red", "matmul": "mm"}
ROW_MAX = 16384  # longest row whose elementwise pass fuses into its reductions' kernel
REDUCING = REDUCE | {Op.PARTIAL}
# A value read by several equations whose cone (the unmaterialised equations it is computed
# from) reads more than this many materialised values is materialised before planning: a model's
# residual stream (a matmul's result added per block) otherwise reaches back through every
# block, and planning grew with the cube of the blocks.
CONE_MAX = 8


def _free_in_loads(e: Eqn) -> bool:
    """Does ``e`` cost nothing where a matmul kernel loads its result from its operand's buffer?
    A movement op rewrites the index; a cast of float16 to float32 is what loading an f16
    element does anyway (a product of float16 with float32 reads the float16 operand as it is)."""
    return e.op in MOVEMENT or (e.op is Op.CAST and e.inputs[0].dtype == "float16"
                                and e.out.dtype == "float32")


@dataclass(eq=False)
class _Group:
    roots: list[Eqn]
    kind: str
    eqns: dict[int, Eqn] = field(default_factory=dict)  # cone and roots, by id

    def outs(self) -> list[Var]:
        return [o for e in self.roots for o in e.outs]


class _Planner:
    def __init__(self, prog: Program, enabled: bool, max_bindings: int, row_max: int,
                 target: str, scalar_sides: bool = False) -> None:
        self.prog = prog
        self.enabled = enabled
        self.scalar_sides = scalar_sides
        self.target = target
        self.max_bindings = max_bindings
        self.row_max = row_max
        self.order = {id(e): i for i, e in enumerate(prog.eqns)}
        self.producer = {id(o): e for e in prog.eqns for o in e.outs}
        self.input_pos = {id(v): i for i, v in enumerate(prog.inputs)}
        self.out_ids = {id(a) for a in prog.outputs if isinstance(a, Var)}
        self.readers: dict[int, int] = {}  # var id -> equations reading it (each once)
        for e in prog.eqns:
            for read in {id(a) for a in e.inputs if isinstance(a, Var)}:
                self.readers[read] = self.readers.get(read, 0) + 1
        # equations that compute no data of their own: views, scalars, iota and elementwise
        # ops of iota alone (the fusion planner does not relate kernels through them)
        index_only: set[int] = set()
        self.trivial: set[int] = set()
        for e in prog.eqns:
            made = [self.producer.get(id(v)) for v in e.inputs if isinstance(v, Var)]
            if e.op in SOURCE or (e.op in ELEMENTWISE and all(
                    m is not None and id(m) in index_only for m in made)):
                index_only.add(id(e))
            if id(e) in index_only or e.op in MOVEMENT or e.outs[0].size <= 1:
                self.trivial.add(id(e))
        mat: set[int] = set(self.input_pos) | self.out_ids
        for e in prog.eqns:
            if e.op in REDUCING or e.op is Op.MATMUL or (not enabled and e.op not in MOVEMENT):
                mat.update(id(o) for o in e.outs)
            if e.op is Op.LOOP:
                # a loop runs its own kernels: it reads and writes buffers (passes/loops.py)
                mat.update(id(o) for o in e.outs)
                mat.update(id(a) for a in e.inputs if isinstance(a, Var))
            if e.op in KERNEL_KIND:
                # a kernel of its own kind (scatter, scan, sort): it reads buffers, not cones,
                # unless the op lists the inputs that must be buffers (``buffer_inputs``, e.g. a
                # scatter's target); it computes its other inputs from their cones
                mat.update(id(o) for o in e.outs)
                must = e.params.get("buffer_inputs", range(len(e.inputs)))
                mat.update(id(e.inputs[j]) for j in must if isinstance(e.inputs[j], Var))
            if e.op in (Op.MATMUL, Op.ATTENTION, Op.ATTENTION_PARTS, Op.QMATMUL):
                # operands: only movement ops (and float16 -> float32 casts, which a load does
                # anyway) are recomputed per tile load; arithmetic is not, except on a quantized
                # product's few rows of x and on attention's queries (a prologue: see _prologue)
                for j, a in enumerate(e.inputs):
                    if j == 0 and e.op in (Op.QMATMUL, Op.ATTENTION, Op.ATTENTION_PARTS) \
                            and _few_rows(e, a) and _prologue(self, a, e.op is Op.QMATMUL):
                        if e.op is Op.QMATMUL and isinstance(a, Var):
                            # a combination of attention's parts computed there is no kernel
                            mat.difference_update(id(c.out) for c in _combines(self, a))
                        continue
                    if j == 0 and enabled and e.params.get("a_prologue"):
                        # attention's probabilities, computed where p @ v loads them
                        # (passes/attention.py: _probabilities_in_product)
                        continue
                    v = a
                    while isinstance(v, Var) and id(v) in self.producer and (
                            self.producer[id(v)].op in MOVEMENT or e.op is Op.MATMUL
                            and _free_in_loads(self.producer[id(v)])):
                        v = self.producer[id(v)].inputs[0]
                    if isinstance(v, Var):
                        mat.add(id(v))
        if enabled:
            _cap_cones(prog, mat)
        self.mat = mat

    # -- building blocks --
    def cone(self, root: Eqn) -> dict[int, Eqn]:
        found: dict[int, Eqn] = {}
        stack = [a for a in root.inputs if isinstance(a, Var)]
        while stack:
            v = stack.pop()
            if id(v) in self.mat:
                # a reshape alias is read through its source (free index arithmetic), so no
                # kernel depends on an alias: aliases exist only to hand buffers to the caller
                p = self.producer.get(id(v))
                if p is not None and self.is_alias(p) and id(p) not in found:
                    found[id(p)] = p
                continue
            p = self.producer[id(v)]
            if id(p) not in found:
                found[id(p)] = p
                stack.extend(a for a in p.inputs if isinstance(a, Var))
        return found

    def is_alias(self, e: Eqn) -> bool:
        return (e.op is Op.RESHAPE and isinstance(e.inputs[0], Var) and id(e.inputs[0]) in self.mat
                and id(e.out) in self.mat)

    def leaves(self, eqns: dict[int, Eqn], own: set[int]) -> list[Var]:
        seen: dict[int, Var] = {}
        inside = {id(o) for e in eqns.values() for o in e.outs}
        for e in sorted(eqns.values(), key=lambda e: self.order[id(e)]):
            for a in e.inputs:
                if isinstance(a, Var) and id(a) in self.mat and id(a) not in own and (
                        id(a) not in seen) and id(a) not in inside:
                    seen[id(a)] = a
        return sorted(seen.values(), key=lambda v: (
            self.input_pos.get(id(v), len(self.input_pos)),
            self.order.get(id(self.producer.get(id(v))), -1)))

    def needed(self, g: _Group, others: list[_Group], aliases: list[Eqn],
               read: Optional[set[int]] = None) -> list[Var]:
        """The roots of ``g`` that must be written: outputs, or read by another kernel or alias.
        ``read``: the ids of values other kernels and aliases read, when the caller knows."""
        if read is None:
            read = {id(a.inputs[0]) for a in aliases}
            for h in others:
                if h is g:
                    continue
                for e in h.eqns.values():
                    read.update(id(x) for x in e.inputs if isinstance(x, Var))
        roots = sorted(g.roots, key=lambda e: self.order[id(e)])
        return [r.out for r in roots if id(r.out) in self.out_ids or id(r.out) in read]

    def body(self, g: _Group, others: list[_Group], aliases: list[Eqn],
             read: Optional[set[int]] = None) -> Program:
        if g.kind not in KIND_ABBR and len(g.roots) == 1:
            # a kernel of its own kind: its buffer operands in the op's order, then what its
            # cone reads; every output written (a quantized product with its epilogue: below)
            e = g.roots[0]
            inside = {id(o) for x in g.eqns.values() for o in x.outs}
            first = {id(a): a for a in e.inputs
                     if isinstance(a, Var) and id(a) in self.mat and id(a) not in inside}
            rest = [v for v in self.leaves(g.eqns, inside) if id(v) not in first]
            eqns = sorted(g.eqns.values(), key=lambda x: self.order[id(x)])
            return Program([*first.values(), *rest], eqns, list(e.outs))
        own = {id(o) for o in g.outs()}
        ins = self.leaves(g.eqns, own)
        eqns = sorted(g.eqns.values(), key=lambda e: self.order[id(e)])
        return Program(list(ins), eqns, list(self.needed(g, others, aliases, read)))

    def n_bindings(self, g: _Group, others: list[_Group], aliases: list[Eqn],
                   read: Optional[set[int]] = None) -> int:
        b = self.body(g, others, aliases, read)
        return len(b.inputs) + len(b.outputs)

    # -- the plan --
    def base_groups(self) -> tuple[list[_Group], list[Eqn]]:
        groups: list[_Group] = []
        aliases: list[Eqn] = []
        for e in self.prog.eqns:
            if id(e.outs[0]) not in self.mat:
                continue
            if self.is_alias(e):
                aliases.append(e)
                continue
            if e.op is Op.LOOP:
                groups.append(_Group([e], "loop", {id(e): e}))
                continue
            if e.op in KERNEL_KIND:
                cone = self.cone(e) if "buffer_inputs" in e.params else {}
                groups.append(_Group([e], KERNEL_KIND[e.op], {id(e): e, **cone}))
                continue
            kind = ("reduce" if e.op in REDUCING else "matmul" if e.op is Op.MATMUL
                    else "elementwise")
            groups.append(_Group([e], kind, {id(e): e, **self.cone(e)}))
        return groups, aliases

    def plan(self) -> tuple[list[_Group], list[Eqn]]:
        while True:
            groups, aliases = self.base_groups()
            if self.enabled:
                groups = self.merge(groups, aliases)
            reads = _reads_by_others(groups, aliases)
            too_big = next((g for g in groups if g.kind != "loop"
                            and self.n_bindings(g, groups, aliases, reads[id(g)])
                            > self.max_bindings), None)
            if too_big is not None:
                self.mat.add(id(self.split_point(too_big).out))
                continue
            if not self.share(groups):
                return groups, aliases

    def share(self, groups: list[_Group]) -> bool:
        """Values in several kernels: recompute or materialise, by bytes moved. True if changed."""
        owners: dict[int, int] = {}
        for g in groups:
            for k, e in g.eqns.items():
                if id(e.outs[0]) not in self.mat:
                    owners[k] = owners.get(k, 0) + 1
        # Every value worth materialising is materialised in one round: each round costs a new
        # plan, and one value per round made a 30-layer model's plan take minutes. Materialising
        # a value computed in k kernels leaves its cone computed in one of them instead of k,
        # which the counts of the cone's equations are corrected for.
        changed = False
        for e in reversed(self.prog.eqns):
            k = owners.get(id(e), 0)
            if k < 2:
                continue
            c = self.cone(e)
            leaf_bytes = sum(v.nbytes for v in self.leaves({**c, id(e): e}, set()))
            if e.out.nbytes * (1 + k) < (k - 1) * leaf_bytes:
                self.mat.add(id(e.out))
                for x in c:
                    if x in owners:
                        owners[x] = max(1, owners[x] - (k - 1))
                changed = True
        return changed

    def split_point(self, g: _Group) -> Eqn:
        """The cone equation with the most inputs that still fits in a kernel of its own."""
        best: Eqn | None = None
        best_n = -1
        roots = {id(r) for r in g.roots}
        for e in g.eqns.values():
            if id(e) in roots or e.op in MOVEMENT:
                continue
            c = self.cone(e)
            c[id(e)] = e
            n = len(self.leaves(c, set()))
            if n + 1 <= self.max_bindings and n > best_n:
                best, best_n = e, n
        if best is None:
            raise DeviceLimitError(
                f"a kernel needs more storage buffers than the device allows ({self.max_bindings})"
                " and cannot be split further")
        return best

    def row_info(self, g: _Group) -> tuple[tuple[int, ...], tuple[int, ...], bool] | None:
        """(row-array shape, reduced axes, is partial) of a reduce group."""
        reds = [e for e in g.roots if e.op in REDUCING]
        if not reds:
            return None
        e = reds[0]
        return e.inputs[0].shape, tuple(e.params["axes"]), e.op is Op.PARTIAL

    def mergeable(self, a: _Group, b: _Group, by_var: dict[int, _Group]) -> str | None:
        """The kind of the merged kernel if ``a`` and ``b`` may merge (before the legality
        checks). ``by_var``: the kernel that writes each value, where known."""
        a_outs = {id(o) for o in a.outs()}
        b_outs = {id(o) for o in b.outs()}

        def reads(x: _Group, outs: set[int]) -> bool:
            return any(isinstance(v, Var) and id(v) in outs for e in x.eqns.values()
                       for v in e.inputs)

        qm = _qmatmul_epilogue(a, b) or _qmatmul_epilogue(b, a)
        if qm is not None:
            # a quantized product takes elementwise work of its shape on its result (a residual
            # add, an activation), as a matmul takes its epilogue
            q, ew = (a, b) if any(r is qm for r in a.roots) else (b, a)
            return "quant" if reads(ew, {id(o) for o in q.outs()}) else None
        if a.kind not in KIND_ABBR or b.kind not in KIND_ABBR:
            return None  # kernels of their own kind never merge

        if a.kind == b.kind == "elementwise":
            sa, sb = _ew_shape(a), _ew_shape(b)
            if sa != sb:
                # scalar side outputs (a loop's counter): written by one thread of another kernel
                return "elementwise" if self.scalar_sides and () in (sa, sb) else None
            if reads(a, b_outs) or reads(b, a_outs) or set(a.eqns) & set(b.eqns):
                return "elementwise"
            return None
        if a.kind == b.kind == "reduce":
            ia, ib = self.row_info(a), self.row_info(b)
            if ia is None or ib is None or ia != ib:
                return None
            # partial reductions share a kernel when cut into the same chunks (then each element
            # is read once for all of them)
            if ia[2] and len({e.params["chunks"] for e in a.roots + b.roots
                              if e.op is Op.PARTIAL}) != 1:
                return None
            la, lb = self.leaves(a.eqns, a_outs), self.leaves(b.eqns, b_outs)
            shared_input = {id(v) for v in la} & {id(v) for v in lb}
            # or inputs written by one kernel (the second stages of partial reductions that
            # shared a kernel): one launch instead of several
            same_writer = {id(by_var[id(v)]) for v in la if id(v) in by_var} & {
                id(by_var[id(v)]) for v in lb if id(v) in by_var}
            return ("reduce" if reads(a, b_outs) or reads(b, a_outs) or shared_input
                    or same_writer else None)
        red, ew = (a, b) if b.kind == "elementwise" else (b, a)
        if ew.kind != "elementwise" or not reads(ew, {id(o) for o in red.outs()}):
            return None
        if red.kind == "matmul":
            # the group's matmul: after an earlier merge, roots start with the first group's
            # (an elementwise root that comes before the product in program order, say)
            mm = next(r for r in red.roots if r.op is Op.MATMUL)
            if not codegen.epilogue_fuses(mm, self.target):
                return None
            return "matmul" if all(r.out.shape == mm.out.shape for r in ew.roots) else None
        info = self.row_info(red)
        if red.kind != "reduce" or info is None or info[2]:
            return None
        shape, axes, _ = info
        n_out = math.prod(d for k, d in enumerate(shape) if k not in axes)
        row = math.prod(shape[k] for k in axes)
        for r in ew.roots:
            if r.out.shape == shape and row <= self.row_max:
                continue
            if r.out.size != n_out:
                return None
        return "reduce"

    def merge(self, groups: list[_Group], aliases: list[Eqn]) -> list[_Group]:
        """Merge pairs of groups until none can. Only related pairs are tried (one reads the
        other, they share an equation; reductions also when they share an input or read values
        one kernel writes: :meth:`mergeable` refuses any other pair), found through indexes.
        After a merge only pairs with the new group are tried, in order of the groups'
        positions; when none merges, one full round over every related pair confirms (a merge
        can make another pair legal, e.g. by removing a path that made it a cycle). So the cost
        grows with the number of merges times the program's size, not with the square of the
        number of groups at every merge."""
        dirty = {id(g) for g in groups}  # groups whose pairs are still to be tried
        confirmed = False
        while True:
            merged = self._merge_one(groups, aliases, dirty)
            if merged is not None:
                groups, new = merged
                dirty.add(id(new))
                confirmed = False
            elif not confirmed:
                dirty = {id(g) for g in groups}  # the confirming full round
                confirmed = True
            else:
                return groups

    def _merge_one(self, groups: list[_Group], aliases: list[Eqn], dirty: set[int]
                   ) -> Optional[tuple[list[_Group], _Group]]:
        """Merge the first legal related pair that involves a group in ``dirty``, in order of
        the groups' positions: the new list of groups and the merged group; None if no pair
        merges. Groups whose every pair was tried and refused leave ``dirty``."""
        by_var = {id(o): g for g in groups for o in g.outs()}
        for alias in aliases:  # an alias is written by whoever writes its source
            if id(alias.inputs[0]) in by_var:
                by_var[id(alias.out)] = by_var[id(alias.inputs[0])]
        pos = {id(g): i for i, g in enumerate(groups)}
        readers: dict[int, dict[int, _Group]] = {}  # var id -> groups with an eqn reading it
        holders: dict[int, list[_Group]] = {}  # eqn id -> groups computing it
        for g in groups:
            for k, e in g.eqns.items():
                holders.setdefault(k, []).append(g)
                for v in e.inputs:
                    if isinstance(v, Var):
                        readers.setdefault(id(v), {})[id(g)] = g
        alias_reads = {id(al.inputs[0]) for al in aliases}
        deps = _Deps(groups, by_var)

        def related(a: _Group) -> dict[int, _Group]:
            found: dict[int, _Group] = {}
            read = {id(v): v for e in a.eqns.values() for v in e.inputs if isinstance(v, Var)}
            info = self.row_info(a) if a.kind == "reduce" else None
            row_size = math.prod(info[0]) if info is not None else 0
            for k in a.eqns:
                # (not through index arithmetic: views, iota and what is computed from them
                # alone, or scalars, such as the clamped start of a cache update, are shared by
                # every layer of a model, yet relate nothing)
                if k not in self.trivial:
                    found.update((id(g), g) for g in holders[k])
            for o in a.outs():
                found.update(readers.get(id(o), {}))
            for v in read:
                w = by_var.get(v)
                if w is not None:
                    found[id(w)] = w
                if a.kind != "reduce":
                    continue
                # reductions also merge when they share an input, or read values one kernel
                # writes. (Not through a small input broadcast into their rows, like an
                # attention mask every layer of a model adds: siblings share their rows, and
                # that relation made every layer's softmax try to merge with every other's.)
                if read[v].size >= row_size:
                    found.update((k, g) for k, g in readers.get(v, {}).items()
                                 if g.kind == "reduce")
                for o in (w.outs() if w is not None else ()):
                    found.update((k, g) for k, g in readers.get(id(o), {}).items()
                                 if g.kind == "reduce")
            if self.scalar_sides and a.kind == "elementwise" and _ew_shape(a) == ():
                # a scalar group may join any elementwise kernel, related or not
                found.update((id(g), g) for g in groups
                             if g.kind == "elementwise" and _ew_shape(g) != ())
            found.pop(id(a), None)
            return found

        for a in groups:
            if id(a) not in dirty:
                continue
            for b in sorted(related(a).values(), key=lambda g: pos[id(g)]):
                got = self._try_merge(groups, aliases, a, b, by_var, readers, alias_reads, deps)
                if got is not None:
                    return got
            dirty.discard(id(a))
        return None

    def _try_merge(self, groups: list[_Group], aliases: list[Eqn], a: _Group, b: _Group,
                   by_var: dict[int, _Group], readers: dict[int, dict[int, _Group]],
                   alias_reads: set[int], deps: _Deps) -> Optional[tuple[list[_Group], _Group]]:
        """Merge ``a`` and ``b`` if that is legal: the new groups and the merged one."""
        kind = self.mergeable(a, b, by_var)
        if kind is None:
            return None
        if _reads_own_alias(a, b, aliases, by_var):
            return None
        # a path a -> other kernel -> b (or back) would become a cycle
        if deps.through_other(b, a) or deps.through_other(a, b):
            return None
        first, second = (a, b) if groups.index(a) < groups.index(b) else (b, a)
        merged = _Group(first.roots + second.roots, kind, {**first.eqns, **second.eqns})
        rest = [g for g in groups if g is not a and g is not b]
        pair = {id(a), id(b)}
        read = alias_reads | {id(o) for o in merged.outs() if any(
            k not in pair for k in readers.get(id(o), ()))}
        body = self.body(merged, rest, aliases, read)
        if len(body.inputs) + len(body.outputs) > self.max_bindings:
            return None
        if not codegen.check(kind, body):
            return None
        out = rest + [merged]
        out.sort(key=lambda g: min(self.order[id(r)] for r in g.roots))
        return out, merged


# elementwise equations a quantized product or an attention kernel may compute where it loads x
# or its queries (a prologue; see _prologue), at most; 0: none. And the rows of x (a quantized
# product's, all leading axes) or of a head's queries, at most, for which it does: every weight
# row's team recomputes x's rows, so the cost grows with them. H200 at full clocks (a CUDA
# context held: bench/llama_synthetic.py --hold-clocks --settings "default;fuse.PROLOGUE_MAX=8",
# 30 layers, 4 interleaved rounds, medians of 30), prologues / none: at batch 1, 244 / 304
# kernels, GPU time 1.24-1.25 / 1.23 ms, step 2.38, 3.78, 2.50, 2.45 / 2.76, 2.76, 2.54, 2.53 ms
# (host 1.80-1.89 / 2.04-2.31 ms but for the one round, 3.24); at batch 8 (3 rounds), GPU time
# 2.98 / 2.33 ms and the step 3.82-4.57 / 3.25-4.34 ms: so only at one row. (Measured before
# at unknown clocks, in processes where the GPU ran at 345 MHz, it had seemed to lose.)
PROLOGUE_MAX = 8
PROLOGUE_ROWS = 1
# 1: a quantized product of PROLOGUE_ROWS rows whose x is attention's parts combined, of at most
# COMBINE_MAX_PARTS parts, computes the combination where it loads x (see _combines); 0: the
# combination is a kernel of its own. H100, clocks held, the synthetic SmolLM2 step at batch 1
# (bench/llama_synthetic.py --max-len 1024 --prompt P --settings
# "default;fuse.COMBINE_PROLOGUE=0", best of 2 interleaved rounds, medians of 30 steps), in the
# product / a kernel: 2 parts (128 keys) step 1.36 / 1.45 ms, GPU 0.94 / 0.93 ms; 4 parts
# 1.40 / 1.41, 0.94 / 0.93; 8 parts 1.53 / 1.41, 1.07 / 0.93; 16 parts 2.01 / 1.46, 1.53 /
# 1.00 (every team recomputes 3P loads and P exponentials per value of x: the host records
# 30 dispatches fewer, the GPU's time grows with P)
COMBINE_PROLOGUE = 1
COMBINE_MAX_PARTS = 2
# an attention kernel loads each query row once (per thread or per workgroup), so the rows cost
# nothing more there: a decode step's queries (a KV head's group of query heads, 3 rows in
# SmolLM2, at any batch), not a prefill's
PROLOGUE_QUERY_ROWS = 16


def _few_rows(e: Eqn, x: object) -> bool:
    """Has a quantized product's x (its leading axes) at most PROLOGUE_ROWS rows, or an
    attention kernel's queries (a head's) at most PROLOGUE_QUERY_ROWS, so that a prologue may
    compute them?"""
    if not isinstance(x, Var):
        return False
    if e.op is Op.QMATMUL:
        return math.prod(x.shape[:-1]) <= PROLOGUE_ROWS
    return len(x.shape) < 2 or x.shape[-2] <= PROLOGUE_QUERY_ROWS


def _prologue(planner: _Planner, x: object, combine: bool = False) -> bool:
    """May a quantized product compute its x, or an attention kernel its queries, where it loads
    them? Where they are elementwise work of at most PROLOGUE_MAX equations over values that are
    buffers anyway (through movement ops): SwiGLU's ``silu(gate) * up`` before the down
    projection, RoPE on a decode step's queries. A quantized product's weight rows' teams each
    recompute x's values as they load them (K x N evaluations; a decode step's x has a few
    thousand values, the weights a few hundred rows); an attention kernel loads each query row
    once (per thread or per workgroup). The elementwise kernel that wrote them is gone. On GPUs:
    a software adapter's thread walks a whole weight row, and recomputing x there made a 2-layer
    decode step 2.6x slower on lavapipe. With ``combine`` (a quantized product's x), x may also
    be attention's parts combined (:func:`_combines`)."""
    if not planner.enabled or planner.target != "gpu" or not isinstance(x, Var):
        return False
    combined = _combines(planner, x) if combine else []
    stack, seen, arith = [x], set(), 0
    while stack:
        v = stack.pop()
        e = planner.producer.get(id(v))
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if e.op in REDUCING:
            # a normalisation (x * rsqrt(mean(x * x) + eps) * w): its elementwise part is its
            # reduction's epilogue anyway, so computing it here saves no kernel, and every
            # weight row would recompute it (H200, the SmolLM2-shaped decode step: 4.50 ms of
            # GPU time against 3.99 without prologues, the LM head's 49152 rows included)
            return False
        if e.op in MOVEMENT or id(e) in planner.trivial:
            pass
        elif e.op in ELEMENTWISE:
            arith += 1
        elif any(c is e for c in combined):
            arith += 1  # a quantized product's x: attention's parts combined (see _combines)
        else:
            continue  # a kernel's result: a buffer the prologue reads
        if arith > PROLOGUE_MAX:
            return False
        stack += [a for a in e.inputs if isinstance(a, Var)]
    return arith > 0


def _combines(planner: _Planner, x: Var) -> list[Eqn]:
    """The attention_combine that a quantized product's x is, through movement ops alone, where
    the product may compute it as it loads x (COMBINE_PROLOGUE, up to COMBINE_MAX_PARTS parts):
    a decode step's attention over its keys in parts, then the output projection (x: the heads'
    outputs side by side). Each value from the combination to x is read once, by the next, and
    none is a program output. Each weight row's team recomputes the combination for the values
    of x it loads (3P loads and P exponentials a value, over P parts), and the combining kernel
    is gone. [] otherwise."""
    if not COMBINE_PROLOGUE:
        return []
    v = x
    while True:
        if id(v) in planner.out_ids or planner.readers.get(id(v), 0) != 1:
            return []
        e = planner.producer.get(id(v))
        if e is None:
            return []
        if e.op is Op.ATTENTION_COMBINE:
            parts = e.inputs[0].shape[-2] if isinstance(e.inputs[0], Var) else 0
            return [e] if parts <= COMBINE_MAX_PARTS else []
        if e.op not in MOVEMENT or not isinstance(e.inputs[0], Var):
            return []
        v = e.inputs[0]


def _qmatmul_epilogue(q: _Group, ew: _Group) -> Optional[Eqn]:
    """The quantized product of group ``q`` if ``ew`` is elementwise work that may become its
    epilogue (every root of ``ew`` of the product's shape), else None."""
    if q.kind != "quant" or ew.kind != "elementwise":
        return None
    qm = next((r for r in q.roots if r.op is Op.QMATMUL), None)
    if qm is None or not all(r.out.shape == qm.out.shape for r in ew.roots):
        return None
    return qm


def _cap_cones(prog: Program, mat: set[int]) -> None:
    """Materialise (add to ``mat``) values read by several equations whose cones read more than
    CONE_MAX materialised values (counted with repeats, a bound)."""
    n_readers: dict[int, int] = {}
    for e in prog.eqns:
        for v in {id(a) for a in e.inputs if isinstance(a, Var)}:
            n_readers[v] = n_readers.get(v, 0) + 1
    leaves: dict[int, int] = {}  # materialised values each unmaterialised value's cone reads
    for e in prog.eqns:
        n = sum(1 if id(a) in mat else leaves.get(id(a), 0) for a in e.inputs
                if isinstance(a, Var))
        for o in e.outs:
            if id(o) in mat:
                continue
            if n > CONE_MAX and n_readers.get(id(o), 0) > 1 and e.op not in MOVEMENT:
                mat.add(id(o))
            else:
                leaves[id(o)] = min(n, CONE_MAX + 1)


def _reads_by_others(groups: list[_Group], aliases: list[Eqn]) -> dict[int, set[int]]:
    """For each group, which of its roots' values other kernels or aliases read (``needed``'s
    ``read``), from one pass over the groups rather than one per group."""
    readers: dict[int, set[int]] = {}
    for h in groups:
        for e in h.eqns.values():
            for x in e.inputs:
                if isinstance(x, Var):
                    readers.setdefault(id(x), set()).add(id(h))
    alias_reads = {id(a.inputs[0]) for a in aliases}
    return {id(g): alias_reads | {id(o) for r in g.roots for o in r.outs
                                  if readers.get(id(o), set()) - {id(g)}}
            for g in groups}


def _ew_shape(g: _Group) -> tuple[int, ...]:
    """An elementwise group's shape: its roots', or, with scalar side outputs, the largest."""
    return max((r.out.shape for r in g.roots), key=lambda s: (math.prod(s), len(s)))


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


def _reads_own_alias(a: _Group, b: _Group, aliases: list[Eqn],
                     by_var: dict[int, _Group]) -> bool:
    """Would the merge of ``a`` and ``b`` read a reshape alias (kept outside kernels) of one of
    its own outputs? The kernel would then depend on itself through the alias: a cycle. (Found
    by hypothesis: ``d = sum(x); f = reshape(reshape(d, (1,)), ()); h = -f + d``, all outputs.)"""
    src = {id(e.out): e.inputs[0] for e in aliases}
    if not src:
        return False
    for g in (a, b):
        own = {id(o) for o in g.outs()}
        for e in g.eqns.values():
            for v in e.inputs:
                if not isinstance(v, Var) or id(v) in own or id(v) not in src:
                    continue
                root = v
                while id(root) in src and isinstance(src[id(root)], Var):
                    root = src[id(root)]  # type: ignore[assignment]
                maker = by_var.get(id(root))
                if maker is a or maker is b:
                    return True
    return False


class _Deps:
    """Which kernels each kernel depends on, directly or through others, for one round of
    merge attempts (the groups do not change within it). Each group's upstream set is a bitset
    over the groups' positions, computed once when first asked: a search per attempt walked the
    whole program again each time, which made fusing a 30-layer model take minutes."""

    def __init__(self, groups: list[_Group], by_var: dict[int, _Group]) -> None:
        self.by_var = by_var
        self.index = {id(g): i for i, g in enumerate(groups)}
        self._reads: dict[int, list[_Group]] = {}
        self._up: dict[int, int] = {}

    def reads(self, g: _Group) -> list[_Group]:
        got = self._reads.get(id(g))
        if got is None:
            got = self._reads[id(g)] = _reads(g, self.by_var)
        return got

    def upstream(self, g: _Group) -> int:
        """Bitset of the groups ``g`` depends on (directly or not)."""
        if id(g) in self._up:
            return self._up[id(g)]
        stack: list[tuple[_Group, bool]] = [(g, False)]
        visiting: set[int] = set()  # (kernels never form a cycle; this only guards the walk)
        while stack:  # iterative post-order: a long chain of layers would exceed recursion
            h, done = stack.pop()
            if id(h) in self._up:
                continue
            if not done:
                if id(h) in visiting:
                    continue
                visiting.add(id(h))
                stack.append((h, True))
                stack.extend((r, False) for r in self.reads(h) if id(r) not in self._up)
                continue
            bits = 0
            for r in self.reads(h):
                bits |= self._up.get(id(r), 0) | (1 << self.index[id(r)])
            self._up[id(h)] = bits
        return self._up[id(g)]

    def through_other(self, start: _Group, target: _Group) -> bool:
        """Does ``start`` read a kernel other than ``target`` that depends on ``target``?"""
        bit = 1 << self.index[id(target)]
        return any(self.upstream(r) & bit for r in self.reads(start) if r is not target)


def fuse(prog: Program, enabled: bool = True, max_bindings: int = 8,
         row_max: int = ROW_MAX, target: str = "gpu", scalar_sides: bool = False,
         subgroups: int = 0) -> Program:
    """``scalar_sides``: elementwise kernels may also write 0-d results, from one thread (loop
    bodies: the counter's increment rides in another kernel instead of a dispatch of its own).
    ``subgroups``: the device's subgroup operations (Options.subgroups), put on each row kernel:
    codegen._reduce combines a row's threads through them where its strategy has several."""
    planner = _Planner(prog, enabled, max_bindings, row_max, target, scalar_sides)
    groups, aliases = planner.plan()
    bodies = {id(g): planner.body(g, groups, aliases) for g in groups}

    # order kernels and aliases so that every value is written before it is read
    items: list[_Group | Eqn] = [*groups, *aliases]
    made_by: dict[int, int] = {}
    for i, it in enumerate(items):
        for o in (bodies[id(it)].outputs if isinstance(it, _Group) else [it.out]):
            made_by[id(o)] = i
    deps = {i: {made_by[id(v)] for v in (bodies[id(it)].inputs if isinstance(it, _Group)
                                         else [it.inputs[0]]) if id(v) in made_by}
            for i, it in enumerate(items)}

    def position(i: int) -> int:
        it = items[i]
        roots = it.roots if isinstance(it, _Group) else [it]
        return max(planner.order[id(r)] for r in roots)

    done: set[int] = set()
    eqns: list[Eqn] = []
    counter = 0
    while len(done) < len(items):
        ready = [i for i in range(len(items)) if i not in done and deps[i] <= done]
        if not ready:
            raise AssertionError("fusion produced a cycle between kernels")
        i = min(ready, key=position)
        done.add(i)
        it = items[i]
        if isinstance(it, Eqn):
            eqns.append(it)
            continue
        if it.kind == "loop":
            eqns.append(it.roots[0])  # the loop as it is: its body has its own kernels
            continue
        body = bodies[id(it)]
        ops: list[str] = []
        for e in body.eqns:
            if e.op not in MOVEMENT and e.op.value not in ops:
                ops.append(e.op.value)
        name = f"k{counter}_{KIND_ABBR.get(it.kind, it.kind)}" + "".join(
            f"_{o}" for o in ops[:4])
        counter += 1
        params = {"kind": it.kind, "name": name, "body": body}
        if it.kind == "reduce" and subgroups:
            params["subgroups"] = subgroups
        if len(it.roots) == 1 and "writes_into" in it.roots[0].params:
            # the op updates its operand's buffer in place (scatter): body input j is output k
            params["inplace"] = tuple(it.roots[0].params["writes_into"])
        if len(it.roots) == 1 and "zero_init" in it.roots[0].params:
            # outputs accumulated into buffers zero-filled before each call (scatter-add)
            params["zero_init"] = tuple(it.roots[0].params["zero_init"])
        eqns.append(Eqn(Op.KERNEL, tuple(body.inputs), tuple(body.outputs),  # type: ignore[arg-type]
                        params))
    return Program(list(prog.inputs), eqns, list(prog.outputs))
