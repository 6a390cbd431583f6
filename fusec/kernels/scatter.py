"""Kernels of kind "scatter": the stages ``scatter_add`` and ``scatter_into`` that
:func:`fusec.passes.scatter.lower_scatter` makes of a scatter.

A thread per update (per element of S, the shape the updates and index arrays broadcast to)
computes its update and its indices (the :class:`~fusec.emit.Emitter` does, from the buffers and
through the elementwise ops, iotas and broadcasts the fusion pass put in the kernel before the
stage), drops the update if an index is outside its axis, and combines
the update into the output element with an atomic operation, since other threads may update the
same element:

* int32/uint32 add, min, max: ``atomicAdd``/``atomicMin``/``atomicMax`` (adds wrap, as numpy's);
* bool (stored as u32 0/1): or-like modes (add = or, max) store 1 for a true update, and-like
  ones (multiply = and, min) store 0 for a false one; set stores 0/1;
* set: ``atomicStore`` of the value's bits (of several updates of one element, one wins);
* float32 add, multiply, min, max and integer multiply: a compare-exchange loop on the bits
  (WGSL has no float atomics). min/max propagate NaN as numpy's ``minimum``/``maximum`` do.

The output binding is an array of ``atomic<i32>`` for int32 arrays, ``atomic<u32>`` otherwise.

The compare-exchange loop is bounded, as every loop fusec generates: a try fails only when
another thread changed the element between this thread's read and its exchange, and every
thread writes the element at most once (a thread whose combination equals the element's value
writes nothing), so a thread fails fewer times than there are updates: ``n + 16`` tries always
suffice (16: slack for the spurious failures a weak exchange may have). On the "cpu" target
(lavapipe, which ends a shader's loops after 65535 iterations in all) the bound is capped at
:data:`fusec.emit.LOOP_BUDGET`: few threads run at once there (lanes of 8 on a few cores), so a
thread fails at most a handful of times whatever the number of updates. (Measured on 2 cores,
16.8M float adds into 49 elements: bounds of 6 tries or fewer lost updates, 8 never did.)
"""

from __future__ import annotations

import hashlib
import math

from ..dtypes import WGSL_TYPE
from ..emit import (
    LOOP_BUDGET,
    WORKGROUP,
    Emitter,
    Idx,
    KernelCode,
    _bindings,
    _env,
    _helpers,
    grid_for,
    strides,
)
from ..ir import Atom, Eqn, Lit, Op, Program, Var
from ..ops import broadcast_shapes

CAS_SLACK = 16  # extra tries for spurious failures of atomicCompareExchangeWeak


def _coordinate(em: Emitter, a: Atom, here: Idx, d: int) -> str:
    """Index ``a`` at ``here`` as a u32 coordinate along an axis of ``d``: a negative int32
    counts from the end; out of range, the coordinate is >= d (a negative one wraps to a large
    u32)."""
    if isinstance(a, Lit):
        # computed here: WGSL would evaluate i + d on the literal at compile time, and refuse
        # it where it overflows
        v = int(a.value)
        v = v + d if v < 0 else v
        return f"{v if 0 <= v < d else d}u"
    i = em.value(a, em.unbroadcast(here, a.shape))
    if a.dtype == "uint32":
        return i
    return em.let(f"u32(select({i}, {i} + {d}i, {i} < 0i))", "c")


def _combine(mode: str, dtype: str, old: str, u: str) -> str:
    """The new bits of an element holding bits ``old`` after combining update ``u`` into it."""
    if dtype == "float32":
        a = f"bitcast<f32>({old})"
        expr = {"add": f"({a} + {u})", "multiply": f"({a} * {u})",
                "min": f"fusec_min_f32({a}, {u})", "max": f"fusec_max_f32({a}, {u})"}[mode]
        return f"bitcast<u32>({expr})"
    assert mode == "multiply", f"{mode} of {dtype} needs no compare-exchange loop"
    return f"({old} * {u})"  # wraps modulo 2^32, as numpy's int32/uint32 products


def _update(mode: str, dtype: str, u: str) -> str:
    """The atomic statement combining update ``u`` into ``out0[at]`` (no loop needed)."""
    ref = "&out0[at]"
    if dtype == "bool":
        if mode == "set":
            return f"atomicStore({ref}, select(0u, 1u, {u}));"
        if mode in ("add", "max"):  # or
            return f"if ({u}) {{ atomicStore({ref}, 1u); }}"
        return f"if (!{u}) {{ atomicStore({ref}, 0u); }}"  # multiply, min: and
    if mode == "set":
        return f"atomicStore({ref}, {'bitcast<u32>(' + u + ')' if dtype == 'float32' else u});"
    fn = {"add": "atomicAdd", "min": "atomicMin", "max": "atomicMax"}[mode]
    return f"{fn}({ref}, {u});"


def generate(kernel: Eqn, target: str = "gpu", workgroup_storage: int = 16384) -> KernelCode:
    """WGSL for a kernel of kind "scatter" (a scatter_add or scatter_into stage, after the ops
    of its body that compute the stage's updates and indices); a thread per update."""
    body: Program = kernel.params["body"]
    e = body.eqns[-1]  # the stage; the eqns before it compute its updates and indices
    if e.op is Op.SCATTER_ADD:
        mode, rest = "add", e.inputs
    else:
        assert e.op is Op.SCATTER_INTO, f"scatter kernels compute scatter stages, not {e.op}"
        mode, rest = str(e.params["mode"]), e.inputs[1:]
    out = body.outputs[0]
    assert isinstance(out, Var)
    u_atom, idx_atoms = rest[0], rest[1:]
    dtype = out.dtype
    shape = broadcast_shapes(*(a.shape for a in rest))
    n = math.prod(shape)

    inplace = tuple(kernel.params.get("inplace", ()))
    binds, names = _bindings(body, inplace)
    atomic = "atomic<i32>" if dtype == "int32" else "atomic<u32>"
    binds[-1] = {**binds[-1], "type": atomic}

    em = Emitter(body, names)
    here = Idx(shape, flat="gid")
    u = em.value(u_atom, em.unbroadcast(here, u_atom.shape))
    coords: list[str] = []
    inside: list[str] = []
    for a, d in zip(idx_atoms, out.shape):
        c = _coordinate(em, a, here, d)
        coords.append(c)
        inside.append(f"{c} < {d}u")
    terms = [c if s == 1 else f"{c} * {s}u" for c, s in zip(coords, strides(out.shape))]
    at = " + ".join(terms) if terms else "0u"

    cas = ""
    update = ""
    if (dtype == "float32" and mode != "set") or (dtype in ("int32", "uint32")
                                                   and mode == "multiply"):
        cas = _combine(mode, dtype, "old", u)
    else:
        update = _update(mode, dtype, u)
    bound = n + CAS_SLACK if target == "gpu" else min(n + CAS_SLACK, LOOP_BUDGET)
    bound = min(bound, 2**32 - 1)
    body_code = "\n".join(em.lines)
    wgsl = _env().get_template("scatter.wgsl.j2").render(
        bindings=binds, helpers=_helpers(body_code + cas + update),
        mode=f"{WGSL_TYPE[dtype]} {mode}", n=n, size=out.size, wg=WORKGROUP,
        body=body_code, inside=" && ".join(inside), at=at, cas=cas, update=update, bound=bound)
    key = hashlib.sha256(wgsl.encode()).hexdigest()
    return KernelCode(kernel.params["name"], "scatter", wgsl, grid_for(-(-n // WORKGROUP)),
                      len(body.inputs) - len(inplace), len(body.outputs), key=key)
