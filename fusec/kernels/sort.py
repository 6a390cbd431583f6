"""Kernels of kind "sort": the stages :func:`fusec.passes.sort.lower_sort` lowers a sort into, and
searchsorted.

* ``argsort`` (rows of at most :data:`LOCAL_MAX` elements): a workgroup sorts one or more whole
  rows in workgroup memory with a bitonic network over (key, index) pairs.
* ``radix_hist``, ``radix_scan``, ``radix_scatter``: one least-significant-digit radix pass over
  4-bit digits of the keys (longer rows): digit counts per block, their offsets, and the stable
  scatter of every element to its place.
* ``searchsorted``: a thread per query, a binary search.

Every kernel compares order keys (:func:`fusec.ops.sort_keys`): the input words are bound as
``u32`` whatever their dtype, so a float's key comes from its bits, never from float arithmetic
(which may flush subnormals). Each stage computes exactly its numpy reference in
:mod:`fusec.ops`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from ..emit import KernelCode, _env, grid_for
from ..ir import Eqn, Op, Program
from ..ops import SORT_DIGITS

LOCAL_MAX = 2048  # longest row sorted in workgroup memory (keys and indices: 16 KiB)
LOCAL_THREADS = 256
RADIX_BLOCK = 2048  # elements per workgroup of a radix pass
RADIX_THREADS = 128  # threads of a scatter workgroup (RADIX_BLOCK / RADIX_THREADS each)
HIST_THREADS = 256
HIST_COPIES = 8  # copies of the digit counters in a histogram workgroup
SCAN_THREADS = 256
SCAN_PER_THREAD = 8
SEARCH_THREADS = 256


def sort_key_wgsl(dtype: str, descending: bool = False) -> str:
    """``fn sort_key(b: u32) -> u32``: the order key of a stored word of ``dtype``."""
    if dtype == "float32":
        body = ("    let mag = b & 0x7fffffffu;\n"
                "    var k = select(b | 0x80000000u, ~b, (b >> 31u) != 0u);\n"
                "    if (mag == 0u) {\n        k = 0x80000000u;\n    }\n"
                "    if (mag > 0x7f800000u) {\n        k = 0xffffffffu;\n    }\n")
    elif dtype == "int32":
        body = "    let k = b ^ 0x80000000u;\n"
    elif dtype == "bool":
        body = "    let k = select(0u, 1u, b != 0u);\n"
    else:
        body = "    let k = b;\n"
    ret = "~k" if descending else "k"
    return f"fn sort_key(b: u32) -> u32 {{\n{body}    return {ret};\n}}\n"


def _header(body: Program) -> str:
    binds = [{"name": f"in{i}", "access": "read", "type": "u32"}
             for i in range(len(body.inputs))]
    binds += [{"name": f"out{j}", "access": "read_write", "type": "u32"}
              for j in range(len(body.outputs))]
    return str(_env().get_template("bindings.wgsl.j2").render(bindings=binds))


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _doublings(threads: int) -> list[int]:
    return [1 << s for s in range(threads.bit_length() - 1)]


def _local(e: Eqn) -> tuple[str, int]:
    x = e.inputs[0]
    n = x.shape[-1]
    rows = x.size // n if n else 0
    if n > LOCAL_MAX:
        raise AssertionError(f"argsort rows of {n} > {LOCAL_MAX} elements must be lowered")
    p = _pow2_at_least(n)
    block = min(LOCAL_MAX, p * _pow2_at_least(max(rows, 1)))
    wg = max(1, min(LOCAL_THREADS, block // 2))
    per_group = block // p
    groups = -(-rows // per_group) if n else 0
    src = _env().get_template("sort_local.wgsl.j2").render(
        key_fn=sort_key_wgsl(x.dtype, bool(e.params.get("descending", False))),
        rows=rows, n=n, p=p, block=block, wg=wg, rows_per_group=per_group, groups=groups,
        pairs_per_thread=max(1, block // 2 // wg) if p > 1 else 0)
    return src, groups


def _radix_access(e: Eqn) -> tuple[int, int, Callable[[str, str], str], Callable[[str, str], str]]:
    """(rows, n, key_at, idx_at) of a radix pass's source: WGSL for the key and the index of the
    element at (row, position)."""
    src = e.inputs[0]
    if e.params["first"]:
        rows, n = src.shape

        def key_first(r: str, pos: str) -> str:
            return f"sort_key(in0[{r} * {n}u + {pos}])"

        return rows, n, key_first, lambda r, pos: pos
    _, rows, n = src.shape

    def key_state(r: str, pos: str) -> str:
        return f"in0[{r} * {n}u + {pos}]"

    def idx_state(r: str, pos: str) -> str:
        return f"in0[{rows * n}u + {r} * {n}u + {pos}]"

    return rows, n, key_state, idx_state


def _key_fn(e: Eqn) -> str:
    if e.params["first"]:
        return sort_key_wgsl(e.inputs[0].dtype, bool(e.params["descending"]))
    return ""


def _hist(e: Eqn) -> tuple[str, int]:
    rows, n, key_at, _ = _radix_access(e)
    block = int(e.params["block"])
    nb = e.out.shape[2]
    src = _env().get_template("sort_radix_hist.wgsl.j2").render(
        key_fn=_key_fn(e), key_at=key_at, rows=rows, n=n, nb=nb, block=block,
        wg=HIST_THREADS, copies=HIST_COPIES, digits=SORT_DIGITS, shift=int(e.params["shift"]))
    return src, rows * nb


def _scan(e: Eqn) -> tuple[str, int]:
    rows, _, nb = e.inputs[0].shape
    src = _env().get_template("sort_radix_scan.wgsl.j2").render(
        rows=rows, nb=nb, digits=SORT_DIGITS, wg=SCAN_THREADS, per=SCAN_PER_THREAD,
        own=" + ".join(f"v{i}" for i in range(SCAN_PER_THREAD)),
        halves=[SCAN_THREADS >> s for s in range(1, SCAN_THREADS.bit_length())],
        doublings=_doublings(SCAN_THREADS))
    return src, rows * SORT_DIGITS


def _scatter(e: Eqn) -> tuple[str, int]:
    rows, n, key_at, idx_at = _radix_access(e)
    block = int(e.params["block"])
    wg = RADIX_THREADS
    if block % wg:
        raise AssertionError(f"radix block {block} is not a multiple of {wg} threads")
    nb = e.inputs[1].shape[2]
    last = bool(e.params["last"])
    src = _env().get_template("sort_radix_scatter.wgsl.j2").render(
        key_fn=_key_fn(e), key_at=key_at, idx_at=idx_at, rows=rows, n=n, nb=nb, block=block,
        wg=wg, per=block // wg, digits=SORT_DIGITS, shift=int(e.params["shift"]), last=last,
        shared=max(SORT_DIGITS * wg, block), doublings=_doublings(wg),
        idx_plane="" if last else f"{rows * n}u + ")
    return src, rows * nb


def _search(e: Eqn) -> tuple[str, int]:
    a, v = e.inputs
    n, m = a.shape[0], v.size
    src = _env().get_template("sort_search.wgsl.j2").render(
        key_fn=sort_key_wgsl(a.dtype), n=n, m=m, steps=n.bit_length(), wg=SEARCH_THREADS,
        side=e.params["side"])
    return src, -(-m // SEARCH_THREADS)


_STAGES: dict[Op, Callable[[Eqn], tuple[str, int]]] = {
    Op.ARGSORT: _local,
    Op.RADIX_HIST: _hist,
    Op.RADIX_SCAN: _scan,
    Op.RADIX_SCATTER: _scatter,
    Op.SEARCHSORTED: _search,
}


def generate(kernel: Eqn, target: str = "gpu", workgroup_storage: int = 16384) -> KernelCode:
    """WGSL for a kernel of kind "sort" (its body holds one stage op). Every kernel fits in the
    16 KiB of workgroup memory every device offers, so ``workgroup_storage`` is not consulted;
    nor is ``target``: the loops stay far below the software adapters' iteration limit."""
    body: Program = kernel.params["body"]
    (e,) = body.eqns
    if kernel.params.get("inplace"):
        raise AssertionError("sort kernels never write into their inputs")
    wgsl, groups = _STAGES[e.op](e)
    full = _header(body) + wgsl
    key = hashlib.sha256(full.encode()).hexdigest()
    return KernelCode(kernel.params["name"], "sort", full, grid_for(groups), len(body.inputs),
                      len(body.outputs), key=key)

