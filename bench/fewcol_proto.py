"""Probe (issue 18): hand-written WGSL for A (M x K) @ B (K x N) with few columns, timed by GPU
timestamps, the partial products over chunks of K only (the sum's kernel not counted), checked
against numpy. The designs behind fusec's few-column template over vec4 rows of A
(``templates/matmul_fewcol4.wgsl.j2``):

- ``coop``: L threads side by side on a row of A (a vec4 each), R rows per thread, B's chunk
  staged in workgroup memory as vec4s along K, loads of A optionally issued ``ahead`` steps at a
  time (the first block before B's staging);
- ``coopd``: the same with B read straight from memory as vec4s, not staged;
- ``rowk``: a whole product in one dispatch, no chunks: L threads on a row of A walk all of K
  a vec4 each (L apart), R rows per thread, and read B's rows 4v .. 4v+3 straight from memory
  as vec4s (128 contiguous bytes for 8 columns), U steps unrolled; the lanes' sums are combined
  through workgroup memory;
- ``stream``: A read once, the bound.

``--reps N`` times N dispatches back to back in one pass (their tails overlap) and reports the
time per dispatch; ``--single`` times one dispatch in a pass, and two, which is what a call
sees. The GPU's clocks are held first (fusec.hold_gpu_clocks): runs before that was added, with
one dispatch between waits, measured reading A once at 46-52 us where it takes 18-21.

    python bench/fewcol_proto.py [--m 4096 --k 4096 --n 8] [--reps 50 | --single] [--rounds 3]
        [--only-current] [--rowk 64:8:1:128,...]

``rowk`` measured on the H100 (2026-12-07, docs/bench/h100-rowk-2026-12-07.log) became
``templates/matmul_rowk.wgsl.j2`` (without the unrolling: U 2 and 4 were no faster).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import wgpu

from fusec.clocks import hold_gpu_clocks

HEAD = """
@group(0) @binding(0) var<storage, read> A: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> B: array<{bty}>;
@group(0) @binding(2) var<storage, read_write> P: array<f32>;
"""


def _combine(rows: int, n: int, lanes: int, m: int, last_barrier: bool) -> list[str]:
    """The lanes' sums of each row added up through workgroup memory (``red``) and stored."""
    out = []
    for r in range(rows):
        out += [f"    red[{j}u * 256u + lid] = acc{r}_{j};" for j in range(n)]
        out.append("    workgroupBarrier();")
        st = lanes // 2
        while st >= 1:
            out.append(f"    if (t < {st}u) {{")
            out += [f"      red[{j}u * 256u + lid] += red[{j}u * 256u + lid + {st}u];"
                    for j in range(n)]
            out += ["    }", "    workgroupBarrier();"]
            st //= 2
        out.append(f"    if (row0 + {r}u < {m}u) {{ for (var j = t; j < {n}u; j += {lanes}u) {{")
        out.append(f"      P[(chunk * {m}u + row0 + {r}u) * {n}u + j] = red[j * 256u + lid - t];"
                   " } }")
        if last_barrier or r + 1 < rows:
            out.append("    workgroupBarrier();")
    return out


def coop(m: int, k: int, n: int, lanes: int, rows: int, kc: int, ahead: int,
         staged: bool) -> tuple[str, int, int]:
    groups = 256 // lanes
    wrows, kv, s = groups * rows, kc // 4, k // kc
    steps = kv // lanes
    rb = -(-m // wrows)
    pre: list[str] = []
    body: list[str] = []
    for b0 in range(0, steps, ahead):
        blk = range(b0, min(b0 + ahead, steps))
        for st in blk:
            for r in range(rows):
                (pre if b0 == 0 and staged else body).append(
                    f"    let a{st}_{r} = A[min(row0 + {r}u, {m - 1}u) * {k // 4}u + kbase"
                    f" + {st * lanes}u + t];")
        for st in blk:
            v = f"({st * lanes}u + t)"
            for j in range(n):
                if staged:
                    body.append(f"    let b{st}_{j} = sb[{j * kv}u + {v}];")
                else:  # B's rows 4v .. 4v+3, column j, from memory as scalars of vec4s
                    q4 = ", ".join(f"B[(chunk * {kc}u + 4u * {v} + {q}u) * {n // 4}u + {j // 4}u]"
                                   f"[{j % 4}]" for q in range(4))
                    body.append(f"    let b{st}_{j} = vec4<f32>({q4});")
                for r in range(rows):
                    body.append(f"    acc{r}_{j} += dot(a{st}_{r}, b{st}_{j});")
    stage = f"""    for (var e = lid; e < {n * kv}u; e += 256u) {{
        let j = e / {kv}u;
        let kk = chunk * {kc}u + 4u * (e % {kv}u);
        sb[e] = vec4<f32>(B[kk * {n}u + j], B[(kk + 1u) * {n}u + j], B[(kk + 2u) * {n}u + j],
                          B[(kk + 3u) * {n}u + j]);
    }}
    workgroupBarrier();""" if staged else ""
    acc = "\n".join(f"    var acc{r}_{j} = 0.0;" for r in range(rows) for j in range(n))
    nl = "\n"
    src = HEAD.format(bty="f32" if staged else "vec4<f32>") + f"""
{"var<workgroup> sb: array<vec4<f32>, " + str(n * kv) + ">;" if staged else ""}
var<workgroup> red: array<f32, {n * 256}>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let chunk = wid.x % {s}u;
    let t = lid % {lanes}u;
    let row0 = (wid.x / {s}u) * {wrows}u + (lid / {lanes}u) * {rows}u;
    let kbase = chunk * {kv}u;
{nl.join(pre)}
{stage}
{acc}
{nl.join(body)}
{nl.join(_combine(rows, n, lanes, m, False))}
}}
"""
    return src, rb * s, s


def rowk(m: int, k: int, n: int, lanes: int, rows: int, unroll: int,
         wg: int) -> tuple[str, int, int]:
    h4, kv = n // 4, k // 4
    wrows = wg // lanes * rows
    assert kv % (lanes * unroll) == 0 and n % 4 == 0
    body: list[str] = []
    for u in range(unroll):
        body.append(f"        let v{u} = i + {u * lanes}u + t;")
        for r in range(rows):
            body.append(f"        let a{u}_{r} = A[ab{r} + v{u}];")
        for q in range(4):
            for h in range(h4):
                body.append(f"        let b{u}_{q}_{h} = B[(4u * v{u} + {q}u) * {h4}u + {h}u];")
    for u in range(unroll):
        for q in range(4):
            for r in range(rows):
                for h in range(h4):
                    body.append(f"        acc{r}_{h} = fma(vec4<f32>(a{u}_{r}[{q}]), b{u}_{q}_{h},"
                                f" acc{r}_{h});")
    comb: list[str] = []
    for r in range(rows):
        comb += [f"    red[{h}u * {wg}u + lid] = acc{r}_{h};" for h in range(h4)]
        comb.append("    workgroupBarrier();")
        st = lanes // 2
        while st >= 1:
            comb.append(f"    if (t < {st}u) {{")
            comb += [f"        red[{h}u * {wg}u + lid] += red[{h}u * {wg}u + lid + {st}u];"
                     for h in range(h4)]
            comb += ["    }", "    workgroupBarrier();"]
            st //= 2
        comb.append(f"    if (t < {h4}u && row0 + {r}u < {m}u) {{")
        comb.append(f"        let s = red[t * {wg}u + lid - t];")
        comb.append(f"        for (var c = 0u; c < 4u; c += 1u) {{ P[(row0 + {r}u) * {n}u"
                    " + 4u * t + c] = s[c]; }")
        comb += ["    }", "    workgroupBarrier();"]
    nl = "\n"
    src = HEAD.format(bty="vec4<f32>") + f"""
var<workgroup> red: array<vec4<f32>, {h4 * wg}>;
@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let t = lid % {lanes}u;
    let row0 = wid.x * {wrows}u + (lid / {lanes}u) * {rows}u;
{nl.join(f"    let ab{r} = min(row0 + {r}u, {m - 1}u) * {kv}u;" for r in range(rows))}
{nl.join(f"    var acc{r}_{h} = vec4<f32>(0.0);" for r in range(rows) for h in range(h4))}
    for (var i = 0u; i < {kv}u; i += {lanes * unroll}u) {{
{nl.join(body)}
    }}
{nl.join(comb)}
}}
"""
    return src, -(-m // wrows), 1


def stream(m: int, k: int) -> tuple[str, int, int]:
    src = HEAD.format(bty="f32") + """
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    var s = vec4<f32>(0.0);
    for (var i = 0u; i < 8u; i++) { s += A[wid.x * 2048u + lid + i * 256u]; }
    if (s.x == 123.0) { P[wid.x] = s.y + B[0]; }
}
"""
    return src, m * k // 4 // 2048, 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--single", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only-current", action="store_true",
                    help="of the coop variants, only fusec's (L4 R2 KC512)")
    ap.add_argument("--rowk", type=lambda t: [tuple(int(x) for x in v.split(":"))
                                              for v in t.split(",") if v],
                    default="32:2:2:256,32:2:4:256,32:1:4:256,32:4:2:128,16:2:2:256,"
                            "16:4:2:256,8:2:4:256,32:2:1:256",
                    help="rowk variants, lanes:rows:unroll:threads, comma-separated")
    a = ap.parse_args()
    m, k, n = a.m, a.k, a.n
    # full clocks, as beside JAX or torch: without a CUDA context an NVIDIA GPU lowers them
    # whenever it idles, and one dispatch between waits ran at a third of its speed
    print(hold_gpu_clocks())
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    print(adapter.info["device"], adapter.info["backend_type"])
    dev = adapter.request_device_sync(
        required_features=["timestamp-query"],
        required_limits={"max_compute_workgroup_storage_size": 32768})
    rng = np.random.default_rng(0)
    am = rng.standard_normal((m, k), dtype=np.float32)
    bm = rng.standard_normal((k, n), dtype=np.float32)
    ref = am.astype(np.float64) @ bm.astype(np.float64)
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    ba = dev.create_buffer_with_data(data=am.tobytes(), usage=usage)
    bb = dev.create_buffer_with_data(data=bm.tobytes(), usage=usage)
    qs = dev.create_query_set(type=wgpu.QueryType.timestamp, count=2)
    qb = dev.create_buffer(size=16,
                           usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
    variants: list[tuple[str, tuple[str, int, int]]] = []
    for lanes, rows, kc, ahead in ((4, 2, 512, 1), (4, 2, 256, 1), (4, 2, 128, 1),
                                   (4, 1, 512, 1), (4, 1, 256, 1), (4, 1, 128, 1),
                                   (2, 1, 512, 1), (2, 1, 256, 1), (8, 1, 256, 1),
                                   (8, 2, 128, 1), (2, 2, 256, 2), (8, 4, 512, 2)):
        if a.only_current and (lanes, rows, kc, ahead) != (4, 2, 512, 1):
            continue
        variants.append((f"coop L{lanes} R{rows} KC{kc} ahead{ahead}",
                         coop(m, k, n, lanes, rows, kc, ahead, True)))
    if n % 4 == 0 and not a.only_current:
        for lanes, rows, kc, ahead in ((4, 4, 512, 2), (4, 2, 512, 4)):
            variants.append((f"coopd L{lanes} R{rows} KC{kc} ahead{ahead}",
                             coop(m, k, n, lanes, rows, kc, ahead, False)))
    if n % 4 == 0:
        for lanes, rows, unroll, wg in a.rowk:
            variants.append((f"rowk L{lanes} R{rows} U{unroll} wg{wg}",
                             rowk(m, k, n, lanes, rows, unroll, wg)))
    variants.append(("stream (reads A once)", stream(m, k)))
    built: list[tuple[str, Any, Any, Any, int, int]] = []
    for name, (src, groups, s) in variants:
        mod = dev.create_shader_module(code=src)
        pipe = dev.create_compute_pipeline(layout="auto",
                                           compute={"module": mod, "entry_point": "main"})
        bp = dev.create_buffer(size=4 * s * m * n, usage=usage)
        bg = dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
            {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}}
            for i, b in enumerate((ba, bb, bp))])
        built.append((name, pipe, bg, bp, groups, s))

    def timed(pipe: Any, bg: Any, groups: int, reps: int) -> float:
        enc = dev.create_command_encoder()
        cp = enc.begin_compute_pass(timestamp_writes={
            "query_set": qs, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1})
        cp.set_pipeline(pipe)
        cp.set_bind_group(0, bg)
        for _ in range(reps):
            cp.dispatch_workgroups(groups, 1, 1)
        cp.end()
        enc.resolve_query_set(qs, 0, 2, qb, 0)
        dev.queue.submit([enc.finish()])
        t = np.frombuffer(dev.queue.read_buffer(qb), dtype=np.uint64)
        return (int(t[1]) - int(t[0])) / 1e3

    for rnd in range(a.rounds):
        for name, pipe, bg, bp, groups, s in built:
            if a.single:
                one = sorted(timed(pipe, bg, groups, 1) for _ in range(15))[7]
                two = sorted(timed(pipe, bg, groups, 2) for _ in range(15))[7]
                got = f"one dispatch {one:.1f} us, two {two:.1f} us"
            else:
                per = sorted(timed(pipe, bg, groups, a.reps) / a.reps for _ in range(5))[2]
                got = f"{per:.1f} us per dispatch, {a.reps} back to back"
            if rnd == 0 and not name.startswith("stream"):
                out = np.frombuffer(dev.queue.read_buffer(bp), dtype=np.float32)
                err = np.max(np.abs(out.reshape(s, m, n).sum(0) - ref)) / np.max(np.abs(ref))
                got += f"; {groups} workgroups, {s} chunks, error {err:.1e}"
            print(f"round {rnd} {name}: {got}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
