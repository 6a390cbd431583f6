"""What would one persistent kernel with grid-wide barriers save over one dispatch per phase
(issue 19: a batch-1 decode step is ~150 dependent dispatches)? A chain of L dependent
matrix-vector phases (y = tanh(W_p x / sqrt(D)), D = 576, as a decode step's projections) run
two ways, GPU time by timestamps and wall clock (submit + wait), medians:

- ``dispatch``: one dispatch per phase in one compute pass (wgpu puts a barrier between them);
- ``persistent``: one dispatch of G workgroups that loops over the phases and meets at a grid
  barrier after each (an atomic counter in a storage buffer; thread 0 of each workgroup spins on
  it, bounded: a spin that passes its bound sets a failure flag, so a GPU that does not keep all G
  workgroups resident returns a flagged wrong answer, never hangs);
- ``persistent, atomic reads``: the same with the vector that crosses each barrier read and
  written by atomics;
- ``barriers``: the persistent kernel with no work, the grid barriers alone.

The final vector is checked against numpy (float64) for both.

    python bench/grid_barrier_probe.py [--phases 150] [--groups 72,132,264] [--reps 50]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np

D = 576
TEAM = 32  # threads per row
WG = 256  # threads per workgroup: 8 rows at a time
SPIN_LIMIT = 1 << 22

_ROW = """
fn row_dot(row: u32, lid: u32, woff: u32, xoff: u32) -> f32 {{
    let lane = lid % {team}u;
    let team = lid / {team}u;
    var s = 0.0;
    if (row < {d}u) {{
        for (var k = lane; k < {d}u; k += {team}u) {{
            s += w[woff + row * {d}u + k] * {xread};
        }}
    }}
    red[lid] = s;
    workgroupBarrier();
    for (var h = {team}u / 2u; h > 0u; h = h / 2u) {{
        if (lane < h) {{ red[lid] += red[lid + h]; }}
        workgroupBarrier();
    }}
    let r = red[team * {team}u];
    workgroupBarrier();
    return r;
}}
"""

_DISPATCH = """
@group(0) @binding(0) var<storage, read> w: array<f32>;
@group(0) @binding(1) var<storage, read_write> xy: array<f32>;
@group(0) @binding(2) var<uniform> ph: vec4<u32>;
var<workgroup> red: array<f32, {wg}>;
{row}
@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let p = ph.x;
    let row = wid.x * {rows}u + lid / {team}u;
    let s = row_dot(row, lid, p * {d}u * {d}u, (p % 2u) * {d}u);
    if (lid % {team}u == 0u && row < {d}u) {{
        xy[((p + 1u) % 2u) * {d}u + row] = tanh(s * {scale});
    }}
}}
"""

_PERSISTENT = """
@group(0) @binding(0) var<storage, read> w: array<f32>;
@group(0) @binding(1) var<storage, read_write> xy: array<{xty}>;
@group(0) @binding(2) var<storage, read_write> bar: array<atomic<u32>, 2>;
var<workgroup> red: array<f32, {wg}>;
{row}
fn grid_barrier(lid: u32, goal: u32) {{
    storageBarrier();
    if (lid == 0u) {{
        atomicAdd(&bar[0], 1u);
        var spins = 0u;
        loop {{
            if (atomicLoad(&bar[0]) >= goal) {{ break; }}
            spins += 1u;
            if (spins > {spin}u) {{ atomicStore(&bar[1], 1u); break; }}
        }}
    }}
    workgroupBarrier();
    storageBarrier();
}}

@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    for (var p = 0u; p < {phases}u; p += 1u) {{
        if ({work}) {{
            for (var base = wid.x * {rows}u; base < {d}u; base += {groups}u * {rows}u) {{
                let row = base + lid / {team}u;
                let s = row_dot(row, lid, p * {d}u * {d}u, (p % 2u) * {d}u);
                if (lid % {team}u == 0u && row < {d}u) {{
                    {xwrite}
                }}
            }}
        }}
        grid_barrier(lid, (p + 1u) * {groups}u);
    }}
}}
"""


def _fmt(src: str, **kw: Any) -> str:
    base = dict(d=D, team=TEAM, wg=WG, rows=WG // TEAM, scale=f"{1.0 / np.sqrt(D):.9f}",
                spin=SPIN_LIMIT, xty="f32", xread="xy[xoff + k]",
                xwrite="xy[((p + 1u) % 2u) * {d}u + row] = tanh(s * {scale});")
    if kw.pop("coherent", False):
        # every value that crosses a grid barrier read and written by atomics (L2), not by
        # plain loads, which may hit a stale cache line of this SM
        base.update(xty="atomic<u32>", xread="bitcast<f32>(atomicLoad(&xy[xoff + k]))",
                    xwrite="atomicStore(&xy[((p + 1u) % 2u) * {d}u + row], "
                           "bitcast<u32>(tanh(s * {scale})));")
    base.update(kw)
    base["xwrite"] = base["xwrite"].format(**base)
    base["row"] = _ROW.format(**base)
    return src.format(**base)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phases", type=int, default=150)
    ap.add_argument("--groups", default="72,132,264")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    from fusec import runtime

    rt = runtime.get_runtime()
    assert rt is not None, "needs a GPU adapter"
    wgpu, dev = rt.wgpu, rt.device
    L = a.phases
    rng = np.random.default_rng(0)
    w = rng.standard_normal((L, D, D)).astype(np.float32)
    x0 = rng.standard_normal(D).astype(np.float32)
    ref = x0.astype(np.float64)
    for p in range(L):
        ref = np.tanh(w[p].astype(np.float64) @ ref / np.sqrt(D))
    BU = wgpu.BufferUsage
    wbuf = dev.create_buffer_with_data(data=w.tobytes(), usage=BU.STORAGE)
    xy = dev.create_buffer(size=2 * D * 4, usage=BU.STORAGE | BU.COPY_DST | BU.COPY_SRC)
    bar = dev.create_buffer(size=8, usage=BU.STORAGE | BU.COPY_DST | BU.COPY_SRC)
    ts = "timestamp-query" in dev.features
    qs = dev.create_query_set(type=wgpu.QueryType.timestamp, count=2) if ts else None
    qbuf = dev.create_buffer(size=16, usage=BU.QUERY_RESOLVE | BU.COPY_SRC) if ts else None

    def pipeline(src: str) -> Any:
        mod = runtime._shader_module(dev, src, "probe", checked=False)
        return dev.create_compute_pipeline(layout="auto",
                                           compute={"module": mod, "entry_point": "main"})

    def run(record: Any) -> tuple[float, float]:
        dev.queue.write_buffer(xy, 0, x0.tobytes())
        enc = dev.create_command_encoder()
        enc.clear_buffer(bar)
        tw = ({"query_set": qs, "beginning_of_pass_write_index": 0,
               "end_of_pass_write_index": 1} if ts else None)
        cp = enc.begin_compute_pass(timestamp_writes=tw)
        record(cp)
        cp.end()
        if ts:
            enc.resolve_query_set(qs, 0, 2, qbuf, 0)
        t = time.perf_counter()
        dev.queue.submit([enc.finish()])
        rt.wait_idle()
        wall = time.perf_counter() - t
        gpu = float("nan")
        if ts:
            t0, t1 = np.frombuffer(dev.queue.read_buffer(qbuf), dtype=np.uint64)
            gpu = (int(t1) - int(t0)) * 1e-9
        return gpu, wall

    def check() -> tuple[float, int]:
        out = np.frombuffer(dev.queue.read_buffer(xy), dtype=np.float32)
        got = out[(L % 2) * D:(L % 2 + 1) * D]
        flag = int(np.frombuffer(dev.queue.read_buffer(bar), dtype=np.uint32)[1])
        return float(np.max(np.abs(got - ref))), flag

    rows: list[dict[str, Any]] = []

    def measure(name: str, record: Any, groups: int, checked: bool = True) -> None:
        run(record)  # warm-up
        gpu, wall = [], []
        for _ in range(a.reps):
            g, t = run(record)
            gpu.append(g)
            wall.append(t)
        err, flag = check() if checked else (float("nan"), -1)
        if not checked:
            flag = int(np.frombuffer(dev.queue.read_buffer(bar), dtype=np.uint32)[1])
        rec = {"mode": name, "phases": L, "groups": groups,
               "gpu_us": 1e6 * statistics.median(gpu), "wall_us": 1e6 * statistics.median(wall),
               "gpu_us_per_phase": 1e6 * statistics.median(gpu) / L,
               "max_abs_err": err, "failed_flag": flag}
        print(json.dumps(rec), flush=True)
        rows.append(rec)

    # one dispatch per phase
    pipe = pipeline(_fmt(_DISPATCH))
    ubufs = []
    groups_d = -(-D // (WG // TEAM))
    bgs = []
    for p in range(L):
        u = dev.create_buffer_with_data(data=np.array([p, 0, 0, 0], np.uint32).tobytes(),
                                        usage=BU.UNIFORM)
        ubufs.append(u)
        bgs.append(dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
            {"binding": 0, "resource": {"buffer": wbuf}},
            {"binding": 1, "resource": {"buffer": xy}},
            {"binding": 2, "resource": {"buffer": u}}]))

    def rec_dispatch(cp: Any) -> None:
        cp.set_pipeline(pipe)
        for bg in bgs:
            cp.set_bind_group(0, bg)
            cp.dispatch_workgroups(groups_d)

    for rnd in range(2):
        measure("dispatch", rec_dispatch, groups_d)
        for g in [int(s) for s in a.groups.split(",")]:
            for work, coherent in ((True, False), (True, True), (False, False)):
                pp = pipeline(_fmt(_PERSISTENT, phases=L, groups=g,
                                   work="true" if work else "false", coherent=coherent))
                bg = dev.create_bind_group(layout=pp.get_bind_group_layout(0), entries=[
                    {"binding": 0, "resource": {"buffer": wbuf}},
                    {"binding": 1, "resource": {"buffer": xy}},
                    {"binding": 2, "resource": {"buffer": bar}}])

                def rec_persistent(cp: Any, pp: Any = pp, bg: Any = bg, g: int = g) -> None:
                    cp.set_pipeline(pp)
                    cp.set_bind_group(0, bg)
                    cp.dispatch_workgroups(g)

                measure(("persistent, atomic reads" if coherent else "persistent") if work
                        else "barriers", rec_persistent, g, checked=work)
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({"device": rt.info.adapter, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
