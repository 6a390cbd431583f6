"""Products that share their left operand become one product (XLA's dot merger does the same).

A transformer's attention projects one activation three times, ``x @ wq + bq``, ``x @ wk + bk``,
``x @ wv + bv``. Each product alone has N = d columns, few tiles for a large GPU; joined along N
they are one kernel with three times the tiles. The pass finds products whose left operand is
one value and whose right operands are weight matrices among the program's inputs (2-D, broadcast
over a batch or not), each optionally followed by the add of a bias vector that is also an
input, and rewrites each such group as::

    w = concatenate([w_0, ..., w_n], axis=1)        one elementwise kernel
    y = x @ w [+ concatenate([b_0, ..., b_n])]      one product (the bias its epilogue)
    y_i = y[..., o_i : o_i + n_i]                    slices, read in place by their readers

A group is merged only where the products are small: at most :data:`MAX_ROWS` rows, or each at
most :data:`MAX_TILES` tiles of 128x128. There each is too small to fill the GPU, and one kernel
does the work of several in less time. With more work each product fills the GPU on its own, and
the weights' join (on every call: they are arguments) costs about what one kernel in place of
several saves. Products whose result has other readers than the bias add, or whose bias add is
shared, are left alone; members with a bias and members without form separate groups.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from ..ir import Atom, Eqn, Lit, Op, Program, Var
from ..ops import infer_type

# rows of the left operand (its leading axes' product) up to which products merge; beyond, those
# whose result is at most MAX_TILES tiles of 128x128 each. H200, GPU us of the MiniLM-L6 encoder
# (bench/product_probe.py, best of 2-3 rounds; rows = batch x tokens; its products have 384 or
# 1536 columns), merged / not: 16 rows 797 / 966, 128 1175 / 1379, 512 1293 / 1447, 1024 1542 /
# 1610; since short-K products take 64x64 tiles (codegen.MATMUL_THIN), 2048 (48 tiles) 2130 /
# 2318, 4096 (96 tiles) 3112 / 3235 (the merged product 108 us against 3 x 46.5), but 8192 (192
# tiles) 6476-6514 / 6488-6546. (With the 64x192 tiles before, 2048 rows measured 2432 / 2406 and
# 4096 3462 / 3375.) The bench's transformer block (2048 rows, products of 1024 and 2816
# columns: 128 and 352 tiles) stays as it was.
MAX_ROWS = 1024
MAX_TILES = 96


class _Member:
    """One product of a group: its equation, the weight input, and its bias add if any."""

    def __init__(self, mm: Eqn, weight: Var, bcast: Optional[Eqn], add: Optional[Eqn],
                 bias: Optional[Var]) -> None:
        self.mm, self.weight, self.bcast, self.add, self.bias = mm, weight, bcast, add, bias

    @property
    def out(self) -> Var:
        """The value the group's slice must define: the bias add's result, or the product's."""
        return (self.add or self.mm).outs[0]


def _bind(eqns: list[Eqn], op: Op, inputs: tuple[Atom, ...], params: dict[str, Any],
          out: Optional[Var] = None) -> Var:
    shape, dt = infer_type(op, [(a.shape, a.dtype) for a in inputs], params)
    if out is None:
        out = Var(shape, dt)
    assert (out.shape, out.dtype) == (shape, dt), (op, out.shape, shape)
    eqns.append(Eqn(op, inputs, (out,), params))
    return out


def _join(eqns: list[Eqn], pieces: list[Var]) -> Var:
    """``pieces`` joined along their last axis, as fusec.numpy.concatenate traces it: each padded
    to the whole, and a chain of selects on the last coordinate."""
    axis = len(pieces[0].shape) - 1
    total = sum(p.shape[axis] for p in pieces)
    shape = pieces[0].shape[:axis] + (total,)
    offsets = [sum(p.shape[axis] for p in pieces[:i]) for i in range(len(pieces))]

    def placed(p: Var, off: int) -> Var:
        widths = tuple((0, 0) for _ in range(axis)) + ((off, total - off - p.shape[axis]),)
        return _bind(eqns, Op.PAD, (p,), {"widths": widths})

    pos = _bind(eqns, Op.IOTA, (), {"shape": shape, "axis": axis, "dtype": "uint32"})
    out = placed(pieces[-1], offsets[-1])
    for p, off in reversed(list(zip(pieces[:-1], offsets[:-1]))):
        inside = _bind(eqns, Op.LT, (pos, Lit(off + p.shape[axis], "uint32")), {})
        out = _bind(eqns, Op.WHERE, (inside, placed(p, off), out), {})
    return out


def merge_products(prog: Program) -> Program:
    """Merge each group of products that share their left operand (see the module's
    docstring)."""
    mms = [e for e in prog.eqns if e.op is Op.MATMUL]
    if len(mms) < 2:
        return prog
    inputs = {id(v) for v in prog.inputs}
    producer = {id(o): e for e in prog.eqns for o in e.outs}
    readers: dict[int, list[Eqn]] = {}
    for e in prog.eqns:
        for a in e.inputs:
            if isinstance(a, Var):
                readers.setdefault(id(a), []).append(e)
    outputs = {id(a) for a in prog.outputs if isinstance(a, Var)}

    def sole_reader(v: Var) -> Optional[Eqn]:
        rs = readers.get(id(v), [])
        return rs[0] if len(rs) == 1 and id(v) not in outputs else None

    def weight(mm: Eqn) -> Optional[tuple[Var, Optional[Eqn]]]:
        """The product's weight input, and the broadcast that batches it (if any)."""
        b = mm.inputs[1]
        if not isinstance(b, Var):
            return None
        if id(b) in inputs and len(b.shape) == 2:
            return b, None
        e = producer.get(id(b))
        if (e is not None and e.op is Op.BROADCAST and sole_reader(b) is mm
                and isinstance(e.inputs[0], Var) and id(e.inputs[0]) in inputs
                and len(e.inputs[0].shape) == 2 and b.shape[-2:] == e.inputs[0].shape):
            return e.inputs[0], e
        return None

    groups: dict[tuple[Any, ...], list[_Member]] = {}
    for mm in mms:
        x = mm.inputs[0]
        w = weight(mm)
        if not isinstance(x, Var) or w is None or len(x.shape) < 2 or x.dtype != "float32":
            continue
        rows = math.prod(x.shape[:-1])
        # (tiles as the product's kernel makes them: of each matrix of a batched x)
        tiles = math.prod(x.shape[:-2]) * -(-x.shape[-2] // 128) * -(-w[0].shape[1] // 128)
        if rows > MAX_ROWS and tiles > MAX_TILES:
            continue  # each fills the GPU on its own
        if w[0].dtype != x.dtype or w[0].shape[1] == 0:
            continue  # (a weight of no columns: no piece to join)
        out = mm.outs[0]
        if id(out) in outputs:
            continue  # a result of the program's own: its slice would be copied out
        add = sole_reader(out)
        bias: Optional[Var] = None
        if add is not None and add.op is Op.ADD and add.outs[0].shape == out.shape:
            other = add.inputs[1] if add.inputs[0] is out else add.inputs[0]
            # (a bias of one value broadcast over the columns is not a piece to join)
            if (isinstance(other, Var) and id(other) in inputs
                    and other.shape == out.shape[-1:] and other.dtype == out.dtype):
                bias = other
        if bias is not None and add is not None and id(add.outs[0]) in outputs:
            continue
        key = (id(x), w[0].shape[0], w[1] is not None, bias is not None,
               tuple(sorted(mm.params.items())))
        groups.setdefault(key, []).append(
            _Member(mm, w[0], w[1], add if bias is not None else None, bias))
    merged = [g for g in groups.values() if len(g) > 1]
    if not merged:
        return prog
    drop: set[int] = set()
    insert: dict[int, list[Eqn]] = {}
    for group in merged:
        first = group[0].mm
        new: list[Eqn] = []
        x = first.inputs[0]
        assert isinstance(x, Var)
        joined = _join(new, [m.weight for m in group])
        if group[0].bcast is not None:
            joined = _bind(new, Op.BROADCAST, (joined,), {"shape": x.shape[:-2] + joined.shape})
        y = _bind(new, Op.MATMUL, (x, joined), dict(first.params))
        if group[0].bias is not None:
            y = _bind(new, Op.ADD, (y, _join(new, [m.bias for m in group if m.bias])), {})
        off = 0
        for m in group:
            n = m.out.shape[-1]
            nd = len(y.shape)
            _bind(new, Op.SLICE, (y,), {"starts": (0,) * (nd - 1) + (off,),
                                        "steps": (1,) * nd, "shape": m.out.shape},
                  out=m.out)
            off += n
            drop.update(id(e) for e in (m.mm, m.bcast, m.add) if e is not None)
        insert[id(first)] = new
    eqns: list[Eqn] = []
    for e in prog.eqns:
        eqns += insert.get(id(e), [])
        if id(e) not in drop:
            eqns.append(e)
    return Program(list(prog.inputs), eqns, list(prog.outputs))
