"""Two `fusec bench` results side by side: the fused plan's GPU time (timestamps) and wall clock
per workload, before and after, with the ratios (issue 18's "nothing gets slower on the GPU").

    python bench/compare_runs.py BEFORE/results.json AFTER/results.json [--md]
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _us(x: Any) -> str:
    return "n/a" if not isinstance(x, (int, float)) else f"{1e6 * x:.1f}"


def main(argv: list[str]) -> int:
    md = "--md" in argv
    paths = [a for a in argv if a != "--md"]
    before, after = (json.load(open(p)) for p in paths[:2])
    old = {w["name"]: w["results"]["fused"] for w in before["workloads"]}
    head = ["workload", "GPU before (us)", "GPU after (us)", "after/before", "wall before (us)",
            "wall after (us)"]
    rows = []
    for w in after["workloads"]:
        a, b = w["results"]["fused"], old.get(w["name"], {})
        ratio = (a["time_s"] / b["time_s"] if isinstance(a.get("time_s"), float)
                 and isinstance(b.get("time_s"), float) else None)
        rows.append([w["name"], _us(b.get("time_s")), _us(a.get("time_s")),
                     "n/a" if ratio is None else f"{ratio:.3f}", _us(b.get("wall_s")),
                     _us(a.get("wall_s"))])
    if md:
        print("| " + " | ".join(head) + " |")
        print("|---" + "|---:" * (len(head) - 1) + "|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        for r in [head, *rows]:
            print("  ".join(c.rjust(16) for c in r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
