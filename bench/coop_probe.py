"""Cooperative matrices (tensor cores) through wgpu-native's experimental feature: does the
adapter compile them, how fast is a plain float32 product with them, and how exact?

    python bench/coop_probe.py [--n 4096]

A probe outside fusec (wgpu-py directly): a subgroup per workgroup computes a 32x32 block of
C = A @ B as tiles of 8x8 (or 16x16 for float16), loading its A and B tiles straight from
memory; then 4 subgroups per 64x64 (or 128x128) block with A and B staged in workgroup memory.
On the H100 with wgpu-native 0.32 (2026-12-06) the adapter lists "cooperative-matrix", but the
feature is experimental and requesting it fails: "experimental features are not enabled" (the
C API has no switch for them), so nothing here runs yet.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import wgpu

HEAD = "enable wgpu_cooperative_matrix;\n"


def kernel(n: int, ty: str = "f32", t: int = 8) -> str:
    tiles = 32 // t
    mat = f"coop_mat{t}x{t}"
    acc = "\n".join(f"    var acc{i}{j} = {mat}<f32, C>();"
                    for i in range(tiles) for j in range(tiles))
    loads = "\n".join(
        [f"        let a{i} = coopLoad<{mat}<{ty}, A>>(&a[(row0 + {i * t}u) * {n}u + k], {n}u);"
         for i in range(tiles)]
        + [f"        let b{j} = coopLoad<{mat}<{ty}, B>>(&b[k * {n}u + col0 + {j * t}u], {n}u);"
           for j in range(tiles)])
    mma = "\n".join(f"        acc{i}{j} = coopMultiplyAdd(a{i}, b{j}, acc{i}{j});"
                    for i in range(tiles) for j in range(tiles))
    store = "\n".join(
        f"    coopStore(acc{i}{j}, &c[(row0 + {i * t}u) * {n}u + col0 + {j * t}u], {n}u);"
        for i in range(tiles) for j in range(tiles))
    f16 = "enable f16;\n" if ty == "f16" else ""
    return f"""{f16}{HEAD}
@group(0) @binding(0) var<storage, read> a: array<{ty}>;
@group(0) @binding(1) var<storage, read> b: array<{ty}>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@compute @workgroup_size(32, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>) {{
    let row0 = wid.y * 32u;
    let col0 = wid.x * 32u;
{acc}
    for (var k = 0u; k < {n}u; k += {t}u) {{
{loads}
{mma}
    }}
{store}
}}
"""


def _stage(src: str, dst: str, row: str, col0: str, width: int, vecs: int, n: int) -> str:
    """A loop of the 128 threads copying a tile ``width`` wide from ``src`` (vec4s of an n x n
    matrix, rows ``row`` from column ``col0``) into workgroup array ``dst``, ``vecs`` vec4s a
    thread."""
    put = "".join(f" {dst}[r * {width}u + q * 4u + {c}u] = x.{'xyzw'[c]};" for c in range(4))
    return f"""        for (var v = 0u; v < {vecs}u; v += 1u) {{
            let e = lid + v * 128u;
            let r = e / {width // 4}u;
            let q = e % {width // 4}u;
            let x = {src}[(({row}) * {n}u + {col0}) / 4u + q];
           {put}
        }}"""


def shared_kernel(n: int, bm: int = 64, bn: int = 64, bk: int = 32) -> str:
    """128 threads (4 subgroups of 32) per bm x bn block of C, A and B staged bk at a time in
    workgroup memory (as vec4s); each subgroup computes a (bm/2) x (bn/2) quarter as 8x8 tiles."""
    tm, tn = bm // 2 // 8, bn // 2 // 8
    acc = "\n".join(f"    var acc{i}_{j} = coop_mat8x8<f32, C>();"
                    for i in range(tm) for j in range(tn))
    mat = "coop_mat8x8"
    a_frag = "\n".join(
        f"            let a{i} = coopLoad<{mat}<f32, A>>(&sa[(wr + {i * 8}u) * {bk}u + kk], {bk}u);"
        for i in range(tm))
    b_frag = "\n".join(
        f"            let b{j} = coopLoad<{mat}<f32, B>>(&sb[kk * {bn}u + wc + {j * 8}u], {bn}u);"
        for j in range(tn))
    mma = "\n".join(f"            acc{i}_{j} = coopMultiplyAdd(a{i}, b{j}, acc{i}_{j});"
                    for i in range(tm) for j in range(tn))
    store = "\n".join(
        f"    coopStore(acc{i}_{j}, &c[(row0 + wr + {i * 8}u) * {n}u + col0 + wc + {j * 8}u],"
        f" {n}u);" for i in range(tm) for j in range(tn))
    a_vec = bm * bk // 4 // 128
    b_vec = bk * bn // 4 // 128
    return f"""{HEAD}
@group(0) @binding(0) var<storage, read> a: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
var<workgroup> sa: array<f32, {bm * bk}>;
var<workgroup> sb: array<f32, {bk * bn}>;
@compute @workgroup_size(128, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
        @builtin(subgroup_id) sg: u32) {{
    let row0 = wid.y * {bm}u;
    let col0 = wid.x * {bn}u;
    let wr = (sg / 2u) * {bm // 2}u;
    let wc = (sg % 2u) * {bn // 2}u;
{acc}
    for (var k0 = 0u; k0 < {n}u; k0 += {bk}u) {{
{_stage("a", "sa", "row0 + r", "k0", bk, a_vec, n)}
{_stage("b", "sb", "k0 + r", "col0", bn, b_vec, n)}
        workgroupBarrier();
        for (var kk = 0u; kk < {bk}u; kk += 8u) {{
{a_frag}
{b_frag}
{mma}
        }}
        workgroupBarrier();
    }}
{store}
}}
"""


def _msg(e: Exception) -> str:
    return " | ".join(str(e).split("\n"))[:600]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    a = ap.parse_args()
    n = a.n
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    print("adapter:", adapter.info["device"], "| cooperative-matrix listed:",
          "cooperative-matrix" in adapter.features, flush=True)
    feats = [f for f in ("cooperative-matrix", "shader-f16", "timestamp-query", "subgroup")
             if f in adapter.features]
    try:
        dev = adapter.request_device_sync(required_features=feats)
    except Exception as e:  # noqa: BLE001
        print("no device with", feats, ":", _msg(e), flush=True)
        return
    for ty, t in (("f32", 8), ("f16", 16), ("f16", 8), ("f32", 16)):
        try:
            dev.create_shader_module(code=kernel(256, ty, t))
            print(f"compiles: {ty} {t}x{t}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"fails: {ty} {t}x{t}: {_msg(e)}", flush=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, n)).astype(np.float32)
    y = rng.standard_normal((n, n)).astype(np.float32)
    ref = x[:64].astype(np.float64) @ y.astype(np.float64)
    for ty, t in (("f32", 8), ("f16", 16), ("shared", 8), ("shared128", 8)):
        try:
            if ty == "shared":
                src, bm = shared_kernel(n), 64
            elif ty == "shared128":
                src, bm = shared_kernel(n, 128, 128, 16), 128
            else:
                src, bm = kernel(n, ty, t), 32
            mod = dev.create_shader_module(code=src)
            pipe = dev.create_compute_pipeline(layout="auto", compute={"module": mod,
                                                                     "entry_point": "main"})
        except Exception as e:  # noqa: BLE001
            print(f"{ty} {t}x{t}: no pipeline: {_msg(e)}", flush=True)
            continue
        xs, ys = (x, y) if ty != "f16" else (x.astype(np.float16), y.astype(np.float16))
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        ba = dev.create_buffer_with_data(data=xs.tobytes(), usage=usage)
        bb = dev.create_buffer_with_data(data=ys.tobytes(), usage=usage)
        bc = dev.create_buffer(size=4 * n * n, usage=usage)
        bg = dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
            {"binding": i, "resource": {"buffer": buf, "offset": 0, "size": buf.size}}
            for i, buf in enumerate((ba, bb, bc))])
        qs = dev.create_query_set(type=wgpu.QueryType.timestamp, count=2)
        qb = dev.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE
                               | wgpu.BufferUsage.COPY_SRC)
        times = []
        for rep in range(6):
            enc = dev.create_command_encoder()
            p = enc.begin_compute_pass(timestamp_writes={"query_set": qs,
                                                         "beginning_of_pass_write_index": 0,
                                                         "end_of_pass_write_index": 1})
            p.set_pipeline(pipe)
            p.set_bind_group(0, bg)
            p.dispatch_workgroups(n // bm, n // bm, 1)
            p.end()
            enc.resolve_query_set(qs, 0, 2, qb, 0)
            t0 = time.perf_counter()
            dev.queue.submit([enc.finish()])
            ts = np.frombuffer(dev.queue.read_buffer(qb), dtype=np.uint64)
            wall = time.perf_counter() - t0
            times.append((int(ts[1]) - int(ts[0])) / 1e6)
        got = np.frombuffer(dev.queue.read_buffer(bc, 0, 4 * 64 * n), dtype=np.float32
                            ).reshape(64, n)
        err = np.abs(got - ref).max() / np.abs(ref).max()
        flops = 2 * n ** 3
        med = sorted(times[1:])[len(times[1:]) // 2]
        print(f"{ty} {t}x{t}: {n}^3 gpu {med:.3f} ms ({flops / med / 1e9:.1f} TFLOP/s), "
              f"times {[round(v, 3) for v in times]}, last wall {1e3 * wall:.2f} ms, "
              f"max rel err {err:.2e} (float32 SIMT ~1e-6, tf32 ~1e-3)", flush=True)


if __name__ == "__main__":
    main()
