"""A llama of SmolLM2-135M's shapes with random weights (Q4_1 matrices, a Q8_0 head; no model
package needed): where a decode step's wall time goes. Per step, medians of ``--steps``:

- **host ms**: from the call to its return (tracing is cached: recording the kernels, submits);
- **step ms**: from the call to the next token on the host;
- **gpu ms**: the step's GPU time by timestamps (one pass; ``rt.profile``);
- the kernel count, and (``--profile``) each kernel kind's GPU time, each kernel run alone.

    python bench/llama_synthetic.py [--layers 30] [--steps 20] [--batch 1] [--max-len 256]
        [--prompt 8]
        [--profile]
        [--cprofile] [--submit-firsts 4,2,1,0,4/4 [--rounds 3]] [--record-ahead [--rounds 3]]
        [--settings "default;fuse.PROLOGUE_MAX=0" [--rounds 3]] [--stream [--rounds 5]]
        [--hold-clocks]

``--record-ahead`` times streaming steps (call, then the token read back) and a loop of steps
left on the device, with FUSEC_RECORD_AHEAD off, auto and always, in ``--rounds`` interleaved
rounds, with how many steps were submitted as recorded ahead during the wait before.

``--stream`` times ``--steps`` steps after a 32-token prompt (mean per step), in ``--rounds``
interleaved rounds, by how the loop calls them: each step's tokens read before the next call
("read then call"); as ``Llama.generate`` streams them (``copy_to_host_async``, the next call,
then the read), with FUSEC_RECORD_AHEAD as set and off, and FUSEC_SUBMIT_BUSY off; and left on
the device until the end, also with FUSEC_SUBMIT_BUSY off.

``--submit-firsts`` times the step (call to token on the host) with each FUSEC_SUBMIT_FIRST
setting (``F/G``: and FUSEC_SUBMIT_GROWTH G), interleaved over ``--rounds`` rounds in this
process (the GPU's clocks drift between processes), and prints each setting's best round.
``--settings`` does the same for planner settings: each a list of ``module.NAME=value``
overrides (modules ``fuse``, ``codegen``, ``merge``, ``quant``, ``attention``,
``kattention``, ``kquant``: fusec.passes.fuse, fusec.codegen, fusec.passes.merge,
fusec.passes.quant, fusec.passes.attention, fusec.kernels.attention, fusec.kernels.quant),
``default`` for none, each round on a model built afresh (run with ``FUSEC_CACHE_DIR=off``: the
settings are read at lowering); it prints each round's step and GPU time, and each setting's
kernel count and best round.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

import fusec
from fusec import quant
from fusec.models.llama import Llama, LlamaConfig, _merged
from fusec.runtime import get_runtime

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import (  # noqa: E402  (bench/timing.py)
    overridden,
    setting_changes,
    submit_setting,
)


def synthetic(layers: int, seed: int = 0) -> tuple[LlamaConfig, dict]:
    cfg = LlamaConfig(n_layers=layers, d_model=576, n_heads=9, n_kv_heads=3, d_ff=1536,
                      vocab=49152, rope_base=100000.0, eps=1e-5, context=8192)
    rng = np.random.default_rng(seed)

    def mat(o: int, i: int, fmt: str = "q4_1") -> quant.QuantizedMatrix:
        return quant.quantize((rng.standard_normal((o, i)) * 0.05).astype(np.float32), fmt)

    d, f, kv = cfg.d_model, cfg.d_ff, cfg.n_kv_heads * cfg.head_dim
    blocks = []
    for _ in range(layers):
        lw = {"q": mat(d, d), "k": mat(kv, d), "v": mat(kv, d), "o": mat(d, d),
              "gate": mat(f, d), "up": mat(f, d), "down": mat(d, f),
              "attn_norm": np.ones(d, np.float32), "ffn_norm": np.ones(d, np.float32)}
        blocks.append(_merged(lw))
    embed = (rng.standard_normal((cfg.vocab, d)) * 0.5).astype(np.float32)
    w = {"embed": embed, "lm_head": mat(cfg.vocab, d, "q8_0"),
         "norm": np.ones(d, np.float32), "layers": blocks}
    return cfg, w


def timed_steps(model: Llama, nxt: Any, steps: int) -> tuple[list[float], list[float], Any]:
    """Seconds of ``steps`` decode steps: from the call to its return (host) and to the next
    token on the host (step); and the last token."""
    host, step = [], []
    for _ in range(steps):
        t = time.perf_counter()
        nxt = model.step(nxt)
        host.append(time.perf_counter() - t)
        np.asarray(nxt)
        step.append(time.perf_counter() - t)
    return host, step, nxt


def warmed_up(model: Llama, batch: int, prompt: int = 8) -> Any:
    """A prompt of ``prompt`` tokens fed, then 3 decode steps (the step compiled); the next
    token."""
    model.reset(batch)
    nxt = model.step(np.full((batch, prompt), 7, np.int32))
    np.asarray(nxt)
    for _ in range(3):
        nxt = model.step(nxt)
        np.asarray(nxt)
    return nxt


def gpu_steps(model: Llama, nxt: Any, steps: int) -> tuple[list[float], Any]:
    """The GPU time (ms, timestamps, one pass) of ``steps`` decode steps; and the last token."""
    rt = get_runtime()
    assert rt is not None
    rt.profile = True
    gpu = []
    try:
        for _ in range(steps):
            nxt = model.step(nxt)
            ns = rt.last_gpu_ns()
            if ns is not None:
                gpu.append(ns / 1e6)
    finally:
        rt.profile = False
    return gpu, nxt


def kernel_count(model: Llama, nxt: Any) -> int:
    """Kernels of the model's decode step at its position (its lowered plan)."""
    return len(model.lower_step(nxt).kernels)


def compare_record_ahead(model: Llama, nxt: Any, a: argparse.Namespace) -> None:
    """Streaming steps and a device loop under each FUSEC_RECORD_AHEAD mode (see the
    docstring), interleaved over ``--rounds`` rounds."""
    from fusec import config

    rt = get_runtime()
    assert rt is not None
    rows: dict[str, list[float]] = {}
    try:
        for r in range(a.rounds):
            for mode in ("off", "auto", "always"):
                config.set("record_ahead", mode)
                if model.pos + 2 * a.steps + 3 > 250:
                    model.reset(a.batch)
                    nxt = model.step(np.full((a.batch, 8), 7, np.int32))
                for _ in range(3):
                    nxt = model.step(nxt)
                    np.asarray(nxt)
                used = rt.ahead_used
                _, step, nxt = timed_steps(model, nxt, a.steps)
                used = rt.ahead_used - used
                t = time.perf_counter()
                for _ in range(a.steps):
                    nxt = model.step(nxt)
                np.asarray(nxt)
                dev = (time.perf_counter() - t) / a.steps
                med = statistics.median(step)
                rows.setdefault(mode, []).append(med)
                print(f"  round {r + 1}, {mode}: streaming step {1e3 * med:.3f} ms "
                      f"({a.batch / med:.0f} tokens/s), {used}/{a.steps} recorded ahead; "
                      f"device loop {1e3 * dev:.3f} ms per step", flush=True)
    finally:
        config.set("record_ahead", None)
    for mode, meds in rows.items():
        print(f"record_ahead={mode}: streaming step {1e3 * min(meds):.3f}-{1e3 * max(meds):.3f} "
              f"ms over {a.rounds} rounds (medians of {a.steps})")


STREAM_MODES = ("read then call", "generate", "generate, record-ahead off",
                "generate, submit-busy off", "device loop", "device loop, submit-busy off")


def compare_streaming(model: Llama, a: argparse.Namespace) -> None:
    """Per step, each way of --stream's (see the docstring), interleaved over --rounds rounds."""
    from fusec import config

    rt = get_runtime()
    assert rt is not None
    ids = np.tile(np.arange(100, 132, dtype=np.int32), (a.batch, 1))

    def run(mode: str) -> tuple[float, int]:
        model.reset(a.batch)
        nxt = model.step(ids)
        np.asarray(nxt)
        config.set("record_ahead", "off" if mode.endswith("record-ahead off") else None)
        config.set("submit_busy", 0 if mode.endswith("submit-busy off") else None)
        used = rt.ahead_used
        t = time.perf_counter()
        for _ in range(a.steps):
            if mode.startswith("generate"):
                t0 = time.perf_counter()
                nxt.copy_to_host_async()
                t1 = time.perf_counter()
                called = model.step(nxt)
                t2 = time.perf_counter()
                np.asarray(nxt)
                parts.setdefault(mode, []).append((t1 - t0, t2 - t1, time.perf_counter() - t2))
                nxt = called
            else:
                nxt = model.step(nxt)
                if mode == "read then call":
                    np.asarray(nxt)
        np.asarray(nxt)
        per = (time.perf_counter() - t) / a.steps
        config.set("record_ahead", None)
        config.set("submit_busy", None)
        return per, rt.ahead_used - used

    # a generate loop's host time per step: the early copy, the call, the read (seconds)
    parts: dict[str, list[tuple[float, float, float]]] = {}
    for mode in STREAM_MODES:
        run(mode)  # every context bucket compiled
    parts.clear()
    rows: dict[str, list[float]] = {}
    for r in range(a.rounds):
        for mode in STREAM_MODES:
            per, used = run(mode)
            rows.setdefault(mode, []).append(per)
            print(f"  round {r + 1}, {mode}: {1e3 * per:.3f} ms per step "
                  f"({a.batch / per:.0f} tokens/s), {used}/{a.steps} recorded ahead", flush=True)
    for mode, v in rows.items():
        med = statistics.median(v)
        print(f"{mode}: {1e3 * min(v):.3f}-{1e3 * max(v):.3f} ms per step, median {1e3 * med:.3f} "
              f"({a.batch / med:.0f} tokens/s; {a.rounds} rounds of {a.steps} steps)")
    for mode, p in parts.items():
        cols = [1e3 * statistics.median(x[i] for x in p) for i in range(3)]
        print(f"{mode}, host per step (medians): copy_to_host_async {cols[0]:.3f} ms, "
              f"the call {cols[1]:.3f}, the read {cols[2]:.3f}")


def compare_settings(cfg: LlamaConfig, w: dict, a: argparse.Namespace) -> None:
    """Each setting of ``--settings`` in ``--rounds`` interleaved rounds (see the docstring)."""
    import importlib

    # (the attribute fusec.passes.fuse is the pass's function: modules by their names)
    modules = {name: importlib.import_module(path) for name, path in (
        ("fuse", "fusec.passes.fuse"), ("codegen", "fusec.codegen"),
        ("merge", "fusec.passes.merge"), ("quant", "fusec.passes.quant"),
        ("attention", "fusec.passes.attention"), ("kattention", "fusec.kernels.attention"),
        ("kquant", "fusec.kernels.quant"))}
    best: dict[str, tuple[float, float, float, int]] = {}
    for r in range(a.rounds):
        for setting in a.settings.split(";"):
            with overridden(setting_changes(setting, modules)):
                model = Llama(cfg, w, max_len=a.max_len)
                nxt = warmed_up(model, a.batch, a.prompt)
                count = kernel_count(model, nxt)
                host, step, nxt = timed_steps(model, nxt, a.steps)
                gpu, nxt = gpu_steps(model, nxt, a.steps)
            med = statistics.median
            row = (1e3 * med(host), 1e3 * med(step), med(gpu) if gpu else float("nan"), count)
            print(f"  round {r + 1}, {setting}: host {row[0]:.2f} ms, step {row[1]:.2f} ms, "
                  f"gpu {row[2]:.2f} ms", flush=True)
            if setting not in best or row[1] < best[setting][1]:
                best[setting] = row
    for setting, (h, st, g, count) in best.items():
        print(f"{setting}: {count} kernels, host {h:.2f} ms, step {st:.2f} ms, gpu {g:.2f} ms "
              f"(best of {a.rounds} rounds, medians of {a.steps})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=8,
                    help="tokens fed before the timed steps (their attention spans them)")
    ap.add_argument("--max-len", type=int, default=256,
                    help="the KV cache's length (bench/smollm2_bench.py uses 1024)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--submit-firsts", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settings", default="")
    ap.add_argument("--record-ahead", action="store_true")
    ap.add_argument("--stream", action="store_true",
                    help="time the ways a decode loop can call and read the steps")
    ap.add_argument("--cprofile", action="store_true",
                    help="cProfile the host side of --steps steps: where the host time goes")
    ap.add_argument("--hold-clocks", action="store_true",
                    help="keep an NVIDIA GPU at full clocks (fusec.hold_gpu_clocks): else a step's "
                         "GPU time depends on the clock the last second's load left")
    a = ap.parse_args()
    if a.hold_clocks:
        print(f"GPU clocks {fusec.hold_gpu_clocks()}")
    t0 = time.perf_counter()
    cfg, w = synthetic(a.layers)
    if a.settings:
        compare_settings(cfg, w, a)
        return
    model = Llama(cfg, w, max_len=a.max_len)
    print(f"weights made and uploaded in {time.perf_counter() - t0:.1f} s; "
          f"{fusec.default_device()}")
    if a.stream:
        compare_streaming(model, a)
        return
    nxt = warmed_up(model, a.batch, a.prompt)
    if a.record_ahead:
        compare_record_ahead(model, nxt, a)
        return
    host, step, nxt = timed_steps(model, nxt, a.steps)
    gpu, nxt = gpu_steps(model, nxt, a.steps)
    med = statistics.median
    print(f"decode batch {a.batch}, {a.layers} layers, pos {model.pos}: host {1e3 * med(host):.2f} "
          f"ms, step {1e3 * med(step):.2f} ms, gpu {med(gpu) if gpu else float('nan'):.2f} ms "
          f"(medians of {a.steps})")
    if a.submit_firsts:
        # "F" or "F/G": FUSEC_SUBMIT_FIRST, and FUSEC_SUBMIT_GROWTH (timing.submit_setting)
        firsts = [v for v in a.submit_firsts.split(",") if v]
        best: dict[str, tuple[float, float]] = {}
        for _ in range(a.rounds):
            for first in firsts:
                submit_setting(first)
                hs, ss, nxt = timed_steps(model, nxt, a.steps)
                if first not in best or med(ss) < best[first][1]:
                    best[first] = (med(hs), med(ss))
                if model.pos > 200:
                    model.reset(a.batch)
                    nxt = model.step(np.full((a.batch, 8), 7, np.int32))
        submit_setting(None)
        for first in firsts:
            print(f"submit_first {first}: host {1e3 * best[first][0]:.2f} ms, step "
                  f"{1e3 * best[first][1]:.2f} ms (best of {a.rounds} rounds, medians of "
                  f"{a.steps})")
    if a.cprofile:
        import cProfile
        import pstats

        prof_host = cProfile.Profile()
        prof_host.enable()
        for _ in range(a.steps):
            nxt = model.step(nxt)
            np.asarray(nxt)
        prof_host.disable()
        pstats.Stats(prof_host).sort_stats("tottime").print_stats(18)
    if a.profile:
        with fusec.profile(print_report=False) as prof:
            nxt = model.step(nxt)
            np.asarray(nxt)
        kinds: Counter[str] = Counter()
        counts: Counter[str] = Counter()
        for name, _calls, total, _mean in prof.rows:
            kind = re.sub(r"^k\d+_", "", name)
            kinds[kind] += total
            counts[kind] += 1
        print(f"kernels: {len(prof.kernels)} ({len(prof.kernels) / a.layers:.1f} per layer), "
              f"{sum(kinds.values()) / 1e3:.2f} ms of GPU time each run alone")
        for kind, us in kinds.most_common(25):
            print(f"  {us:9.1f} us  {counts[kind]:4d}  {kind}")


if __name__ == "__main__":
    main()
