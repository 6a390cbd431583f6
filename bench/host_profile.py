"""cProfile of the host side of a cached call (the transformer training step by default): where
the time between the call and its submit goes (Python, wgpu-py, wgpu-native's submit).

    python bench/host_profile.py [--calls 200] [--seq 2048 --d 1024 --heads 8 --ffn 2816]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_step import fusec_step, make_inputs  # noqa: E402

import fusec  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=2816)
    a = ap.parse_args()
    x, p = make_inputs(a.seq, a.d, a.ffn)
    step = fusec_step(a.heads)
    xd = fusec.device_put(x)
    pd = {k: fusec.device_put(v) for k, v in p.items()}
    out = step(pd, xd)
    out[1]["w_down"].block_until_ready()
    prof = cProfile.Profile()
    for _ in range(a.calls):
        prof.enable()
        out = step(pd, xd)
        prof.disable()
        out[1]["w_down"].block_until_ready()
    st = pstats.Stats(prof)
    st.sort_stats("tottime").print_stats(12)
    st.print_callers("proxy_func")


if __name__ == "__main__":
    main()
