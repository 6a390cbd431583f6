"""Memory planning: decide, for every buffer a kernel writes, where it lives.

The result is recorded on each kernel equation as ``params["slots"]``, one entry per output:

* ``"new"``: the value escapes to the caller (a program output, or aliased by one): a fresh buffer
  every call;
* ``"pN"``: pooled buffer N, owned by the executable and reused across calls. Intermediates whose
  lifetimes do not overlap share a pooled buffer (best fit, by liveness over the kernel order);
* ``"inK"``: the buffer of program input K, donated by the caller (``donate_argnums``), reused once
  every kernel that reads it has run, or by the elementwise kernel that reads it last when every
  thread reads only its own element of it (``params["inplace"]``: body input j is output k, one
  read-write binding: WebGPU forbids binding one buffer both read-only and writable);
* ``"=J"``: the buffer of the kernel's input J, which it updates in place. Fusion presets
  ``params["inplace"]`` for such kernels (a scatter into a copy of its operand): the output is the
  same buffer as that input for the whole program, like a reshape's alias;
A ``loop`` equation's results get slots like a kernel's outputs (an in-place carry's result
is ``"=J"``: the buffer of the loop's input J, a copy of the carry's initial value).

* ``"zN"``: pooled buffer N, filled with zeros at the start of every call (``params["zero_init"]``
  lists such outputs: a scatter-add accumulates into them). It is never shared with another value.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import Eqn, Op, Program, Var


def _roots(prog: Program) -> dict[int, int]:
    """Alias (reshape) results share their source's buffer: map each var to its buffer's owner."""
    root: dict[int, int] = {}
    for e in prog.eqns:
        if e.op is Op.RESHAPE and isinstance(e.inputs[0], Var):
            src = id(e.inputs[0])
            root[id(e.out)] = root.get(src, src)
        if e.op is Op.KERNEL or e.op is Op.LOOP:
            for j, k in e.params.get("inplace", ()):
                src = id(e.inputs[j])
                root[id(e.outs[k])] = root.get(src, src)
    return root


def _inplace_ok(e: Eqn, donor: Var, out: Var) -> bool:
    """Is ``donor`` read only at each thread's own index in elementwise kernel ``e``? Every value
    derived from it must keep the output's flat index: a transpose or broadcast anywhere between
    the donor and an output would read other threads' elements, which are being overwritten."""
    if e.params.get("kind") != "elementwise" or donor.shape != out.shape:
        return False
    body: Program = e.params["body"]
    j = next(i for i, a in enumerate(e.inputs) if a is donor)
    derived = {id(body.inputs[j])}
    for be in body.eqns:
        if any(isinstance(a, Var) and id(a) in derived for a in be.inputs):
            if be.op in (Op.TRANSPOSE, Op.BROADCAST) or be.out.size != out.size:
                return False
            derived.add(id(be.out))  # elementwise ops and reshapes keep the flat index
    return id(body.inputs[j]) not in {id(o) for o in body.outputs if isinstance(o, Var)}


def plan_memory(prog: Program, donated: tuple[int, ...] = ()) -> Program:
    root = _roots(prog)

    def owner(v: Var) -> int:
        return root.get(id(v), id(v))

    end = len(prog.eqns)
    last: dict[int, int] = {}
    for i, e in enumerate(prog.eqns):
        for a in e.inputs:
            if isinstance(a, Var):
                last[owner(a)] = i
    escaping = {owner(a) for a in prog.outputs if isinstance(a, Var)}
    for oid in escaping:
        last[oid] = end

    donors: dict[int, int] = {}  # owner id of a donated input -> input index
    for k in donated:
        v = prog.inputs[k]
        if owner(v) not in escaping:
            donors[id(v)] = k
    free_donors: list[tuple[int, int]] = [(v.nbytes, k) for k, v in enumerate(prog.inputs)
                                          if id(v) in donors and id(v) not in last]
    pool: list[int] = []  # sizes of pooled buffers
    free_pool: list[int] = []
    holder: dict[int, str] = {}  # owner id -> slot name
    eqns: list[Eqn] = []
    for i, e in enumerate(prog.eqns):
        if e.op is not Op.KERNEL and e.op is not Op.LOOP:
            eqns.append(e)
            continue
        slots = []
        inplace: list[tuple[int, int]] = []
        preset = {k: j for j, k in e.params.get("inplace", ())}
        zero = set(e.params.get("zero_init", ()))
        for j, o in enumerate(e.outs):
            if j in preset:
                slot = f"={preset[j]}"  # the same buffer as that input, whoever holds it
            elif j in zero:
                assert owner(o) not in escaping, "a zero-initialised buffer never escapes"
                slot = f"z{len(pool)}"
                pool.append(o.nbytes)  # its own buffer: never in free_pool
            elif owner(o) in escaping:
                fits = sorted((s, k) for s, k in free_donors if s >= o.nbytes)
                here = [k for k in sorted(donors.values())
                        if last.get(id(prog.inputs[k])) == i and not any(
                            k == kk for kk, _ in inplace) and prog.inputs[k] in e.inputs
                        and _inplace_ok(e, prog.inputs[k], o)]
                if fits:
                    free_donors.remove(fits[0])
                    slot = f"in{fits[0][1]}"
                elif here:
                    k = here[0]
                    inplace.append((k, j))
                    slot = f"in{k}"
                    last[id(prog.inputs[k])] = end  # taken: not freed after this kernel
                else:
                    slot = "new"
            else:
                fits_pool = sorted((pool[b], b) for b in free_pool if pool[b] >= o.nbytes)
                if fits_pool:
                    b = fits_pool[0][1]
                    free_pool.remove(b)
                else:
                    b = len(pool)
                    pool.append(o.nbytes)
                slot = f"p{b}"
            if not slot.startswith("="):
                holder[owner(o)] = slot
            slots.append(slot)
        params = {**e.params, "slots": tuple(slots)}
        if inplace:
            pos = {id(a): n for n, a in enumerate(e.inputs)}
            params["inplace"] = tuple(e.params.get("inplace", ())) + tuple(
                (pos[id(prog.inputs[k])], j) for k, j in inplace)
        eqns.append(Eqn(e.op, e.inputs, e.outs, params))
        # buffers whose last reader was this kernel become free for later kernels
        for rid in {owner(a) for a in e.inputs if isinstance(a, Var)}:
            if last.get(rid) != i:
                continue
            slot = holder.get(rid, "")
            if slot.startswith("p"):
                free_pool.append(int(slot[1:]))
            elif rid in donors:
                v = prog.inputs[donors[rid]]
                free_donors.append((v.nbytes, donors[rid]))
    return Program(list(prog.inputs), eqns, list(prog.outputs))


@dataclass(frozen=True)
class MemoryAnalysis:
    """Bytes a compiled program allocates (``lowered.memory_analysis()``)."""

    intermediate_bytes: int  # pooled buffers, allocated once per executable and reused
    intermediate_bytes_unplanned: int  # what one buffer per intermediate would take
    output_bytes: int  # fresh buffers for outputs, every call
    donated_bytes_reused: int  # output bytes written into donated inputs' buffers
    argument_bytes: int  # inputs the kernels read

    def __str__(self) -> str:
        return (f"intermediates {self.intermediate_bytes} B (unplanned "
                f"{self.intermediate_bytes_unplanned} B), outputs {self.output_bytes} B, "
                f"donated reuse {self.donated_bytes_reused} B, arguments {self.argument_bytes} B")


def analyse(prog: Program) -> MemoryAnalysis:
    pool: dict[str, int] = {}
    unplanned = outputs = donated = 0
    for e in prog.eqns:
        if e.op is not Op.KERNEL and e.op is not Op.LOOP:
            continue
        for o, slot in zip(e.outs, e.params.get("slots", ("new",) * len(e.outs))):
            if slot.startswith("="):
                continue  # another value's buffer, counted there
            if slot.startswith(("p", "z")):
                pool[slot] = max(pool.get(slot, 0), o.nbytes)
                unplanned += o.nbytes
            elif slot.startswith("in"):
                donated += o.nbytes
            else:
                outputs += o.nbytes
    used = {id(a) for e in prog.eqns for a in e.inputs if isinstance(a, Var)}
    args = sum(v.nbytes for v in prog.inputs if id(v) in used)
    return MemoryAnalysis(sum(pool.values()), unplanned, outputs, donated, args)
