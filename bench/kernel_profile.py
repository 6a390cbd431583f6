"""GPU time of each kernel of a jitted call, by timestamp queries around one compute pass per
kernel (a diagnostic: the separate passes add barriers that a normal call does not have).

    from bench.kernel_profile import kernel_times
    rows = kernel_times(jitted_fn, *args)   # [(kernel name, grid, microseconds)], in call order
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fusec.runtime import Array, _Alias, get_runtime


def kernel_times(jf: Any, *args: Any, reps: int = 5) -> list[tuple[str, tuple[int, ...], float]]:
    """Median GPU microseconds of each kernel of ``jf`` for these (device) arguments."""
    compiled = jf.warmup(*args)
    ex = compiled.executable
    rt = get_runtime()
    assert rt is not None and "timestamp-query" in rt.info.features, "needs timestamp queries"
    wgpu = rt.wgpu
    names = [k.name for k in compiled.lowered.kernels]
    launches = [st for st in ex.steps if not isinstance(st, _Alias)]
    n = len(launches)
    qs = rt.device.create_query_set(type=wgpu.QueryType.timestamp, count=2 * n)
    qbuf = rt.device.create_buffer(size=16 * n, usage=wgpu.BufferUsage.QUERY_RESOLVE
                                   | wgpu.BufferUsage.COPY_SRC)
    import fusec

    leaves = [a if isinstance(a, Array) else fusec_array(a)
              for a in fusec.tree_util.tree_leaves(args)]
    inputs = leaves + compiled._const_arrays()
    samples: list[np.ndarray] = []
    for _ in range(reps):
        bufs: list[Any] = [None] * ex.n_slots
        raws: list[Any] = [None] * ex.n_slots
        for i, a in enumerate(inputs):
            b = a.device_buffer(rt)
            bufs[i], raws[i] = b, b.raw
        enc = rt.device.create_command_encoder()
        for z in ex.zeroed:
            b = ex.pool.get(z) or ex.pool.setdefault(z, rt.buffer(ex.pool_sizes[z]))
            enc.clear_buffer(b.raw)
        k = 0
        for st in ex.steps:
            if isinstance(st, _Alias):
                bufs[st.dst], raws[st.dst] = bufs[st.src], raws[st.src]
                continue
            for w, kind, arg in st.alloc:
                if kind == 0:
                    b = rt.buffer_of_class(arg)
                elif kind == 1:
                    b = ex.pool.get(arg) or ex.pool.setdefault(arg, rt.buffer(ex.pool_sizes[arg]))
                else:
                    b = bufs[arg]
                bufs[w], raws[w] = b, b.raw
            cpass = enc.begin_compute_pass(timestamp_writes={
                "query_set": qs, "beginning_of_pass_write_index": 2 * k,
                "end_of_pass_write_index": 2 * k + 1})
            if st.grid[0]:
                bound = st.gather(raws)
                bg = st.bind_groups.get(bound) or ex._bind_group(st, bound)
                cpass.set_pipeline(st.pipeline)
                cpass.set_bind_group(0, bg)
                cpass.dispatch_workgroups(*st.grid)
            cpass.end()
            k += 1
        enc.resolve_query_set(qs, 0, 2 * n, qbuf, 0)
        rt.device.queue.submit([enc.finish()])
        rt.submitted += 1
        t = np.frombuffer(rt.read(qbuf, 16 * n), dtype=np.uint64).astype(np.int64)
        samples.append((t[1::2] - t[0::2]) / 1e3)
    med = np.median(np.stack(samples), axis=0)
    return [(names[i] if i < len(names) else f"k{i}", tuple(launches[i].grid), float(med[i]))
            for i in range(n)]


def fusec_array(x: Any) -> Array:
    import fusec

    return fusec.device_put(np.asarray(x))


def report(rows: list[tuple[str, tuple[int, ...], float]], top: int = 0) -> str:
    total = sum(r[2] for r in rows)
    order = sorted(rows, key=lambda r: -r[2])[: top or len(rows)]
    lines = [f"{len(rows)} kernels, {total:.1f} us in all"]
    lines += [f"{us:9.1f} us {100 * us / total:5.1f}%  {name}  grid={grid}"
              for name, grid, us in order]
    return "\n".join(lines)
