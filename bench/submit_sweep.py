"""Wall clock of multi-kernel calls against when their dispatches are submitted
(``FUSEC_SUBMIT_FIRST``), side by side in one process, with the host's share of each call:
the call alone (recording up to its last submit), and the time in wgpu-native's ``finish`` and
``submit`` per call (issue 18).

    python bench/submit_sweep.py [--only sort,transformer,...] [--firsts 0,1,2,3,4,8,8/0]
                                 [--rounds 3] [--reps 20] [--bert 32x128,1x16] [--jax]

Per workload (``fusec bench``'s full set, inputs on the device) and per setting, the median of
``--reps`` calls of call + ``block_until_ready``, the settings interleaved over ``--rounds``
rounds; the table gives each setting's best round. ``--bert`` adds the MiniLM-L6 encoder of
bench/bert_encoder.py (random weights) at those shapes; ``--jax`` JAX jit's wall clock of the
same workloads in the same process.
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
from timing import submit_setting  # noqa: E402  (bench/timing.py)

DEFAULT = "sort,transformer,mlp,matmul_skinny_m_bias_gelu,matmul_square_bias_gelu,cumsum,argmax"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=DEFAULT)
    ap.add_argument("--firsts", default="0,1,2,3,4,8",
                    help="FUSEC_SUBMIT_FIRST values, each optionally /FUSEC_SUBMIT_GROWTH")
    ap.add_argument("--calls", type=int, default=10, help="calls per back-to-back run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--bert", default="")
    ap.add_argument("--jax", action="store_true")
    a = ap.parse_args(argv)
    jax = None
    if a.jax:
        try:
            import jax

            # float32 as written, as fusec bench times it (XLA otherwise rounds to TF32)
            jax.config.update("jax_default_matmul_precision", "highest")
        except ImportError:
            jax = None
    import fusec
    from fusec import bench, native

    # time spent in finish + submit (the native recorder's Encoder.submit), per call
    spent = [0.0, 0]
    orig = native.Encoder.submit

    def timed_submit(self: Any) -> None:
        t = time.perf_counter()
        try:
            orig(self)
        finally:
            spent[0] += time.perf_counter() - t
            spent[1] += 1

    native.Encoder.submit = timed_submit  # type: ignore[method-assign]
    rng = np.random.default_rng(0)
    cases: list[tuple[str, Callable[[], Any], Any]] = []
    for w in bench.select(bench.workloads(quick=False), a.only.split(",")):
        host = w.make_inputs(rng)
        dev = [fusec.device_put(x) for x in host]
        f = fusec.gpu_jit(w.bind(bench.FusecOps))
        jf: Any = None
        if jax is not None:
            jfn = jax.jit(w.bind(bench.JaxOps()))
            jargs = [jax.device_put(x) for x in host]
            def jf(jfn: Any = jfn, jargs: Any = jargs) -> Any:
                return jfn(*jargs).block_until_ready()

        cases.append((w.name, (lambda f=f, dev=dev: f(*dev)), jf))
    if a.bert:
        import bert_encoder as be
        import minilm_encoder as ex

        import fusec.numpy as fnp
        from fusec import nn

        wts = {k: fusec.device_put(v) for k, v in be.random_weights().items()}
        enc = fusec.gpu_jit(lambda w, i, m: ex.encode(fnp, nn, w, i, m, 1e-12))
        for shape in a.bert.split(","):
            b, s = (int(v) for v in shape.split("x"))
            ids, mask = ex.make_batch(b, s, 30522)
            idd, md = fusec.device_put(ids), fusec.device_put(mask)
            cases.append((f"bert {shape}", (lambda idd=idd, md=md: enc(wts, idd, md)), None))
    # "F" or "F/G": the first chunk's dispatches, and each later chunk's growth (0: the rest)
    firsts = [v for v in a.firsts.split(",") if v]
    best: dict[tuple[str, str], float] = {}
    b2b: dict[tuple[str, str], float] = {}
    host: dict[tuple[str, str], tuple[float, float, float]] = {}
    jax_t: dict[str, float] = {}
    for name, call, jf in cases:
        call().block_until_ready()
        for rnd in range(a.rounds):
            for first in firsts:
                submit_setting(first)
                call().block_until_ready()
                ts, alone = [], []
                spent[0], spent[1] = 0.0, 0
                for _ in range(a.reps):
                    t = time.perf_counter()
                    r = call()
                    t1 = time.perf_counter()
                    r.block_until_ready()
                    ts.append(time.perf_counter() - t)
                    alone.append(t1 - t)
                m = statistics.median(ts)
                if m < best.get((name, first), float("inf")):
                    best[name, first] = m
                    host[name, first] = (statistics.median(alone), spent[0] / a.reps,
                                         spent[1] / a.reps)
                t = time.perf_counter()
                rs = [call() for _ in range(a.calls)]
                rs[-1].block_until_ready()
                per = (time.perf_counter() - t) / a.calls
                b2b[name, first] = min(b2b.get((name, first), float("inf")), per)
            if jf is not None:
                jf()
                ts = []
                for _ in range(a.reps):
                    t = time.perf_counter()
                    jf()
                    ts.append(time.perf_counter() - t)
                jax_t[name] = min(jax_t.get(name, float("inf")), statistics.median(ts))
        submit_setting(None)
        line = [f"{name:28s}"]
        for first in firsts:
            line.append(f"{first}: {1e6 * best[name, first]:8.1f}")
        if name in jax_t:
            line.append(f"jax: {1e6 * jax_t[name]:8.1f}")
        print("  ".join(line), flush=True)
        for first in firsts:
            al, sp, ns = host[name, first]
            print(f"    first {first}: call alone {1e6 * al:7.1f} us, finish+submit "
                  f"{1e6 * sp:7.1f} us in {ns:.1f} submits; back to back "
                  f"{1e6 * b2b[name, first]:8.1f} us per call", flush=True)
    native.Encoder.submit = orig  # type: ignore[method-assign]
    return 0


if __name__ == "__main__":
    sys.exit(main())
