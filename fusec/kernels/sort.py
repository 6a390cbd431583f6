"""Kernels of kind "sort": the stages :func:`fusec.passes.sort.lower_sort` lowers a sort into, and
searchsorted.

* ``argsort``, ``sort`` (rows of at most :data:`LOCAL_MAX` elements) and ``sort_blocks``: a
  workgroup sorts one or more whole rows (or blocks of a row) in workgroup memory with a bitonic
  network over (key, index) pairs.
* ``radix_hist``, ``radix_scan``, ``radix_scatter`` (GPUs): one least-significant-digit radix pass
  over 8-bit digits of the keys: digit counts per block, their offsets, and the stable scatter of
  every element to its place. Where the device has subgroup operations the scans go through them,
  and a scatter ranks its block's keys by the whole digit within subgroups (ballots: a match of
  equal digits, as GPU radix sorts' warp-level multisplit does) in place of two 4-bit passes
  through workgroup memory.
* ``sort_merge`` (software adapters): a merge of pairs of sorted runs, a thread per element.
* ``searchsorted``: a thread per query, a binary search.

Every kernel compares order keys (:func:`fusec.ops.sort_keys`): the input words are bound as
``u32`` whatever their dtype, so a float's key comes from its bits, never from float arithmetic
(which may flush subnormals). Each stage computes exactly its numpy reference in
:mod:`fusec.ops`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable

from ..emit import KernelCode, _env, grid_for
from ..ir import Eqn, Op, Program
from ..ops import SORT_DIGITS, SORT_RADIX_BITS, sort_special_keys

LOCAL_MAX = 2048  # longest row sorted in workgroup memory (keys and indices: 16 KiB)
LOCAL_THREADS = 256
RADIX_PER_THREAD = 16  # elements per thread of a scatter workgroup (block / 16 threads)
RADIX_BLOCKS = (8192, 4096, 2048)  # elements per radix workgroup: the largest that fits
HIST_THREADS = 256
HIST_COPIES = 4  # copies of the digit counters in a histogram workgroup
HIST_UNROLL = 8  # keys a histogram thread loads before it counts them
# The scatter's ranking within subgroups with one-word ballots where the device's subgroups have
# at most 32 lanes (Options.subgroups 3: NVIDIA's), in place of four-word ones: the same ranks for
# less arithmetic per key. H100, 2^24 float32, GPU us, 2 interleaved rounds
# (docs/bench/h100-sort-ballot-2026-12-07.log): 791.3-792.1 against 800.8.
NARROW_BALLOT = 1
SCAN_THREADS = 256
SCAN_PER_THREAD = 8
SCAN_COLUMN_MAX = 64  # up to this many blocks per row, a thread scans each digit's counts
SEARCH_THREADS = 256
MERGE_THREADS = 256
FIXUP_THREADS = 256  # sort_specials and sort_fixup: a workgroup per block of the row


def _padded(words: int) -> int:
    """Words of workgroup memory addressed through the scatter's sp(): one pad word every 32."""
    return words + words // 32


def _scatter_words(block: int) -> int:
    """Workgroup memory of a scatter workgroup, in words: the block (or the 16 counters of each
    thread, as many words), a partial sum per thread, an offset per digit."""
    wg = block // RADIX_PER_THREAD
    return _padded(max(block, 16 * wg)) + wg + SORT_DIGITS


def radix_block(workgroup_storage: int) -> int:
    """Elements per radix workgroup: the largest block whose scatter fits ``workgroup_storage``
    bytes of workgroup memory. Larger blocks write longer runs per digit (fewer partly written
    memory sectors) and make the histograms smaller."""
    for block in RADIX_BLOCKS:
        if 4 * _scatter_words(block) <= workgroup_storage:
            return block
    return RADIX_BLOCKS[-1]


def sort_key_wgsl(dtype: str, descending: bool = False) -> str:
    """``fn sort_key(b: u32) -> u32``: the order key of a stored word of ``dtype``."""
    if dtype == "float32":
        # (selects, not branches: a scatter's loads stay in flight side by side)
        body = ("    let mag = b & 0x7fffffffu;\n"
                "    var k = select(b | 0x80000000u, ~b, (b >> 31u) != 0u);\n"
                "    k = select(k, 0x80000000u, mag == 0u);\n"
                "    k = select(k, 0xffffffffu, mag > 0x7f800000u);\n")
    elif dtype == "int32":
        body = "    let k = b ^ 0x80000000u;\n"
    elif dtype == "bool":
        body = "    let k = select(0u, 1u, b != 0u);\n"
    else:
        body = "    let k = b;\n"
    ret = "~k" if descending else "k"
    return f"fn sort_key(b: u32) -> u32 {{\n{body}    return {ret};\n}}\n"


def sort_value_wgsl(dtype: str, descending: bool = False) -> str:
    """``fn sort_value(k: u32) -> u32``: the word of the value whose order key is ``k`` (a zero's
    key gives +0.0, a NaN's 0x7fffffff; :func:`fusec.ops.sort_value_words`)."""
    inv = "~k" if descending else "k"
    if dtype == "float32":
        body = (f"    let u = {inv};\n"
                "    return select(~u, u ^ 0x80000000u, (u >> 31u) != 0u);\n")
    elif dtype == "int32":
        body = f"    return {inv} ^ 0x80000000u;\n"
    else:
        body = f"    return {inv};\n"
    return f"fn sort_value(k: u32) -> u32 {{\n{body}}}\n"


def _header(body: Program, inplace: tuple[tuple[int, int], ...] = ()) -> str:
    aliased = dict(inplace)
    binds = [{"name": f"in{i}", "access": "read", "type": "u32"}
             for i in range(len(body.inputs)) if i not in aliased]
    binds += [{"name": f"out{j}", "access": "read_write", "type": "u32"}
              for j in range(len(body.outputs))]
    return str(_env().get_template("bindings.wgsl.j2").render(bindings=binds))


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _local(e: Eqn, target: str) -> tuple[str, int]:
    """argsort / sort of whole rows, or sort_blocks: segments sorted in workgroup memory."""
    x = e.inputs[0]
    n = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    seg = int(e.params["block"]) if e.op is Op.SORT_BLOCKS else n
    if seg > LOCAL_MAX:
        raise AssertionError(f"segments of {seg} > {LOCAL_MAX} elements must be lowered")
    segs = -(-n // seg) if n else 1
    total = rows * segs
    p = _pow2_at_least(seg)
    block = min(LOCAL_MAX, p * _pow2_at_least(max(total, 1)))
    wg = max(1, min(LOCAL_THREADS, block // 2))
    per_group = block // p
    groups = -(-total // per_group) if n else 0
    mode = {Op.ARGSORT: "index", Op.SORT: "value", Op.SORT_BLOCKS: "state"}[e.op]
    src = _env().get_template("sort_local.wgsl.j2").render(
        key_fn=sort_key_wgsl(x.dtype, bool(e.params.get("descending", False))),
        rows=rows, n=n, seg=seg, segs=segs, total=total, p=p, block=block, wg=wg,
        per_group=per_group, groups=groups, mode=mode, values=bool(e.params.get("values")),
        pairs_per_thread=max(1, block // 2 // wg) if p > 1 else 0)
    return src, groups


def _radix_access(e: Eqn) -> tuple[int, int, Callable[[str, str], str], Callable[[str, str], str]]:
    """(rows, n, key_at, payload_at) of a radix pass's source: WGSL for the key and the payload
    of the element at (row, position)."""
    src = e.inputs[0]
    if e.params["first"]:
        rows, n = src.shape

        def key_first(r: str, pos: str) -> str:
            return f"sort_key(in0[{r} * {n}u + {pos}])"

        def pay_first(r: str, pos: str) -> str:
            return f"in0[{r} * {n}u + {pos}]" if e.params.get("values") else pos

        return rows, n, key_first, pay_first
    _, rows, n = src.shape

    def key_state(r: str, pos: str) -> str:
        return f"in0[{r} * {n}u + {pos}]"

    def pay_state(r: str, pos: str) -> str:
        return f"in0[{rows * n}u + {r} * {n}u + {pos}]"

    return rows, n, key_state, pay_state


def _key_fn(e: Eqn) -> str:
    if e.params["first"]:
        return sort_key_wgsl(e.inputs[0].dtype, bool(e.params["descending"]))
    return ""


def _hist(e: Eqn, target: str) -> tuple[str, int]:
    rows, n, key_at, _ = _radix_access(e)
    block = int(e.params["block"])
    nb = e.out.shape[2]
    src = _env().get_template("sort_radix_hist.wgsl.j2").render(
        key_fn=_key_fn(e), key_at=key_at, rows=rows, n=n, nb=nb, block=block,
        wg=HIST_THREADS, copies=HIST_COPIES, digits=SORT_DIGITS, shift=int(e.params["shift"]),
        unroll=HIST_UNROLL)
    return src, rows * nb


def _scan(e: Eqn, target: str) -> tuple[str, int]:
    rows, _, nb = e.inputs[0].shape
    columns = rows * SORT_DIGITS
    if nb <= SCAN_COLUMN_MAX:
        src = _env().get_template("sort_radix_scan.wgsl.j2").render(
            thread_per_column=True, rows=rows, nb=nb, digits=SORT_DIGITS, wg=SCAN_THREADS)
        return src, -(-columns // SCAN_THREADS)
    # as many threads as the blocks need, SCAN_THREADS at most
    wg = min(SCAN_THREADS, _pow2_at_least(-(-nb // SCAN_PER_THREAD)))
    src = _env().get_template("sort_radix_scan.wgsl.j2").render(
        thread_per_column=False, rows=rows, nb=nb, digits=SORT_DIGITS, wg=wg,
        subgroups=bool(e.params.get("subgroups")),
        per=SCAN_PER_THREAD, own=" + ".join(f"v{i}" for i in range(SCAN_PER_THREAD)))
    return src, columns


WLMS_SUBGROUP_MIN = (4, 8, 16, 32, 64)  # the ranking within subgroups: its smallest subgroups


def _wlms_min(wg: int, shared: int, workgroup_storage: int) -> int:
    """The smallest subgroup size whose counters (a row of 256 per subgroup, in the block's
    workgroup memory) fit the scatter workgroup beside the rest of its memory; 0 if none does."""
    rest = max(1, wg // 4) + SORT_DIGITS + 1  # scan_wg's totals, adj, wide
    for size in WLMS_SUBGROUP_MIN:
        if 4 * (max(shared, wg // size * SORT_DIGITS) + rest) <= workgroup_storage:
            return size
    return 0


def _scatter(e: Eqn, target: str, workgroup_storage: int = 16384) -> tuple[str, int]:
    """radix_scatter. With subgroupBarrier, the block is ranked within subgroups when its
    subgroups are at least the smallest size whose counters fit ``workgroup_storage`` and at
    most the workgroup (a test in the kernel: a subgroup's size is known only there); else by
    4-bit passes."""
    rows, n, key_at, pay_at = _radix_access(e)
    block = int(e.params["block"])
    wg = block // RADIX_PER_THREAD
    if block % RADIX_PER_THREAD or (SORT_DIGITS % wg and wg % SORT_DIGITS):
        raise AssertionError(f"radix block {block}: {RADIX_PER_THREAD} elements per thread, "
                             f"{SORT_DIGITS} digits spread evenly over the threads")
    nb = e.inputs[1].shape[2] - 1
    last = bool(e.params["last"])
    keys_only = int(e.params.get("planes", 2)) == 1
    value_fn = ""
    if keys_only and last:
        value_fn = sort_value_wgsl(str(e.params["dtype"]), bool(e.params["descending"]))
    shared = _padded(max(16 * wg, block))
    subgroups = bool(e.params.get("subgroups"))
    # ranking within subgroups needs subgroupBarrier (a counter one lane advances, read by another)
    sz_min = (_wlms_min(wg, shared, workgroup_storage)
              if subgroups and e.params.get("subgroup_barrier") else 0)
    if sz_min:
        shared = max(shared, wg // sz_min * SORT_DIGITS)
    src = _env().get_template("sort_radix_scatter.wgsl.j2").render(
        key_fn=_key_fn(e), value_fn=value_fn, keys_only=keys_only, key_at=key_at, idx_at=pay_at,
        # the stored word (a state's key; in x, the word sort_key makes a key of)
        word_at=lambda r, pos: f"in0[{r} * {n}u + {pos}]", first=bool(e.params["first"]),
        rows=rows, n=n, nb=nb, block=block,
        wg=wg, per=RADIX_PER_THREAD, digits=SORT_DIGITS, nibbles=SORT_RADIX_BITS // 4,
        shift=int(e.params["shift"]), last=last, shared=shared,
        subgroups=subgroups, wlms=bool(sz_min), sz_min=sz_min, dpt=max(1, SORT_DIGITS // wg),
        narrow=bool(NARROW_BALLOT and e.params.get("narrow")) and 0 < sz_min <= 32,
        idx_plane="" if last else f"{rows * n}u + ")
    return src, rows * nb


def _specials(e: Eqn, target: str) -> tuple[str, int]:
    """sort_specials (count a block's zeros and NaNs) or sort_fixup (move them into place)."""
    rows, n = e.inputs[1].shape
    descending = bool(e.params["descending"])
    nb = (e.out if e.op is Op.SORT_SPECIALS else e.inputs[2]).shape[2]  # the counts' blocks
    block = int(e.params["block"])
    # the fixup scans the last pass's digit totals a thread per digit, and counts a block's zeros
    # and NaNs in 16 bits each
    assert FIXUP_THREADS == SORT_DIGITS and block < 1 << 16, "see sort_specials.wgsl.j2"
    src = _env().get_template("sort_specials.wgsl.j2").render(
        key_fn=sort_key_wgsl("float32", descending), rows=rows, n=n, nb=nb,
        block=block, wg=FIXUP_THREADS, fixup=e.op is Op.SORT_FIXUP, digits=SORT_DIGITS,
        per=-(-block // FIXUP_THREADS), special_keys=sort_special_keys(descending))
    return src, rows * nb


def _merge(e: Eqn, target: str) -> tuple[str, int]:
    _, rows, n = e.inputs[0].shape
    run = int(e.params["run"])
    src = _env().get_template("sort_merge.wgsl.j2").render(
        rows=rows, n=n, run=run, steps=run.bit_length(), wg=MERGE_THREADS,
        last=bool(e.params["last"]))
    return src, -(-(rows * n) // MERGE_THREADS)


def _search(e: Eqn, target: str) -> tuple[str, int]:
    a, v = e.inputs
    n, m = a.shape[0], math.prod(v.shape)
    src = _env().get_template("sort_search.wgsl.j2").render(
        key_fn=sort_key_wgsl(a.dtype), n=n, m=m, steps=n.bit_length(), wg=SEARCH_THREADS,
        side=e.params["side"])
    return src, -(-m // SEARCH_THREADS)


_STAGES: dict[Op, Callable[[Eqn, str], tuple[str, int]]] = {
    Op.ARGSORT: _local,
    Op.SORT: _local,
    Op.SORT_BLOCKS: _local,
    Op.RADIX_HIST: _hist,
    Op.RADIX_SCAN: _scan,
    Op.SORT_MERGE: _merge,
    Op.SORT_SPECIALS: _specials,
    Op.SORT_FIXUP: _specials,
    Op.SEARCHSORTED: _search,
}


def generate(kernel: Eqn, target: str = "gpu", workgroup_storage: int = 16384) -> KernelCode:
    """WGSL for a kernel of kind "sort" (its body holds one stage op). The lowering chose the
    radix block for ``workgroup_storage``; every other kernel fits in the 16 KiB every device
    offers, and their loops stay far below the software adapters' iteration limit."""
    body: Program = kernel.params["body"]
    (e,) = body.eqns
    inplace = tuple(kernel.params.get("inplace", ()))
    if inplace != (((0, 0),) if e.op is Op.SORT_FIXUP else ()):
        raise AssertionError("only sort_fixup writes into its input (the sorted values)")
    if e.op is Op.RADIX_SCATTER:
        wgsl, groups = _scatter(e, target, workgroup_storage)
    else:
        wgsl, groups = _STAGES[e.op](e, target)
    full = _header(body, inplace) + wgsl
    key = hashlib.sha256(full.encode()).hexdigest()
    return KernelCode(kernel.params["name"], "sort", full, grid_for(groups),
                      len(body.inputs) - len(inplace), len(body.outputs), key=key)
