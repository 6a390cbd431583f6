"""Where the host time of a cached multi-kernel call goes (issue 18): the jitted call, the
executable's run alone (no argument flattening or signature lookup), and the same dispatches
recorded straight through wgpu-native, without and with ``finish`` and ``submit``. Each call is
submitted at once (``FUSEC_SUBMIT_FIRST=0``) and timed after the GPU is idle.

    python bench/record_breakdown.py [--cases sort,bert1x16,bert32x128,decode] [--reps 30]
        [--profile]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="sort,bert1x16,bert32x128")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args(argv)
    import fusec
    import fusec.numpy as fnp
    from fusec import nn, runtime
    from fusec.runtime import GpuExecutable, _Launch

    rt = runtime.get_runtime()
    assert rt is not None and rt.native is not None
    fusec.config.set("submit_first", 0)
    cases: list[tuple[str, Callable[[], Any]]] = []
    for c in a.cases.split(","):
        if c == "sort":
            x = fusec.device_put(np.random.default_rng(0).standard_normal(1 << 24)
                                 .astype(np.float32))
            fs = fusec.gpu_jit(lambda x: fnp.sort(x))
            cases.append((c, lambda fs=fs, x=x: fs(x)))
        elif c.startswith("bert"):
            import bert_encoder as be
            import minilm_encoder as ex

            b, s = (int(v) for v in c[4:].split("x"))
            wd = {k: fusec.device_put(v) for k, v in be.random_weights().items()}
            ids, mask = ex.make_batch(b, s, 30522)
            idd, md = fusec.device_put(ids), fusec.device_put(mask)
            fb = fusec.gpu_jit(lambda w, i, m: ex.encode(fnp, nn, w, i, m, 1e-12))
            cases.append((c, lambda fb=fb, wd=wd, idd=idd, md=md: fb(wd, idd, md)))
        elif c == "decode":
            # the SmolLM2-shaped decode step at batch 1 (bench/llama_synthetic.py), 64 keys
            from llama_synthetic import synthetic, warmed_up

            from fusec.models.llama import Llama

            cfg, w = synthetic(30)
            model = Llama(cfg, w, max_len=1024)
            nxt = warmed_up(model, 1, 60)
            fusec.config.set("record_ahead", "off")
            cases.append((c, lambda model=model, nxt=nxt: model.step(nxt)))
    seen: list[tuple[Any, Any]] = []
    real_run = GpuExecutable.run

    def spy(self: Any, inputs: Any) -> Any:
        seen.append((self, list(inputs)))
        return real_run(self, inputs)

    def med(fn: Callable[[], Any]) -> float:
        ts = []
        for _ in range(a.reps):
            rt.wait_idle()
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        rt.wait_idle()
        return 1e6 * statistics.median(ts)

    n = rt.native
    for name, call in cases:
        call().block_until_ready()
        GpuExecutable.run = spy  # type: ignore[method-assign]
        call().block_until_ready()
        GpuExecutable.run = real_run  # type: ignore[method-assign]
        exe, inputs = seen[-1]
        launches = [st for st in exe.steps if isinstance(st, _Launch) and st.grid[0]]
        cmds = [(st.pipeline._internal, next(iter(st.bind_groups.values()))._internal, st.grid)
                for st in launches]

        def record() -> Any:
            enc = n.create_encoder(n.device, n.enc_desc)
            cp = n.begin(enc, n.pass_desc)
            for pipe, bg, g in cmds:
                n.set_pipeline(cp, pipe)
                n.set_bind_group(cp, 0, bg, 0, n.null)
                n.dispatch(cp, g[0], g[1], g[2])
            n.end(cp)
            n.release_pass(cp)
            return enc

        def rec_only() -> None:
            n.release_encoder(record())

        def rec_finish() -> None:
            enc = record()
            cb = n.finish(enc, n.cb_desc)
            n.release_encoder(enc)
            n.release_cb(cb)

        def rec_submit() -> None:
            enc = record()
            cb = n.finish(enc, n.cb_desc)
            n.release_encoder(enc)
            n.cbs[0] = cb
            n.submit(n.queue, 1, n.cbs)
            n.release_cb(cb)

        row = {"call": med(call), "exe.run": (med(lambda: exe.run(inputs)) if name != "decode"
                                           else float("nan")),  # (its cache is donated)
               "native record": med(rec_only), "+ finish": med(rec_finish),
               "+ submit": med(rec_submit)}
        print(f"{name}: {len(cmds)} dispatches, {len(inputs)} inputs; " +
              ", ".join(f"{k} {v:.1f} us" for k, v in row.items()), flush=True)
        if a.profile:
            import cProfile
            import pstats

            pr = cProfile.Profile()
            for _ in range(a.reps):
                rt.wait_idle()
                pr.enable()
                call()
                pr.disable()
            rt.wait_idle()
            pstats.Stats(pr).sort_stats("tottime").print_stats(14)
    fusec.config.set("submit_first", None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
