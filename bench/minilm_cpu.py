"""The MiniLM-L6 encoder on a machine without a GPU (issue 18): seconds per batch with fusec's
default backend, fusec's numpy interpreter (``FUSEC_BACKEND=cpu``), the software adapter
(``FUSEC_BACKEND=gpu``: lavapipe on CI) and torch on the CPU, side by side in one run. Each fusec
backend runs in a subprocess of its own (``examples/minilm_encoder.py``); torch runs here.

    python bench/minilm_cpu.py [--batch 24 --seq 37] [--reps 5] [--no-gpu] [--out r.json]

Where the only adapter is a software one the default is the interpreter (see
docs/architecture.md, "The backend on a machine without a GPU").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

try:  # torch first: its compiler stack must load before fusec opens a Vulkan adapter
    import torch
except Exception:  # noqa: BLE001 - optional reference
    torch = None

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import minilm_encoder as ex  # noqa: E402
from timing import median_wall  # noqa: E402  (bench/timing.py)


class TorchNN:
    """The nn functions ``ex.encode`` uses, in torch."""

    @staticmethod
    def layer_norm(x: Any, g: Any, b: Any, eps: float) -> Any:
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), g, b, eps)

    @staticmethod
    def softmax(x: Any, axis: int = -1) -> Any:
        return torch.softmax(x, dim=axis)

    @staticmethod
    def gelu(x: Any, approximate: str = "none") -> Any:
        return torch.nn.functional.gelu(x)


class TorchNP:
    """The numpy functions ``ex.encode`` uses, in torch."""

    @staticmethod
    def take(t: Any, i: Any, axis: int = 0) -> Any:
        return torch.index_select(t, axis, i.reshape(-1)).reshape(*i.shape, t.shape[-1])

    transpose = staticmethod(lambda t, perm: t.permute(*perm))
    reshape = staticmethod(lambda t, shape: t.reshape(shape))
    sum = staticmethod(lambda t, axis, keepdims=False: t.sum(dim=axis, keepdim=keepdims))
    maximum = staticmethod(lambda t, v: torch.clamp_min(t, v))
    sqrt = staticmethod(torch.sqrt) if torch is not None else None


def run_fusec(backend: str, a: argparse.Namespace) -> dict[str, Any]:
    """examples/minilm_encoder.py with ``--backend backend`` in a fresh process."""
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "minilm_encoder.py"),
                          "--batch", str(a.batch), "--seq", str(a.seq), "--reps", str(a.reps),
                          "--backend", backend], capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout[out.stdout.index("{"):]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--seq", type=int, default=37)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-gpu", action="store_true",
                    help="skip FUSEC_BACKEND=gpu (about 7 s a batch on lavapipe)")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    w, config = ex.load_weights()
    eps = float(config["layer_norm_eps"])
    ids, mask = ex.make_batch(a.batch, a.seq, int(config["vocab_size"]))
    res: dict[str, Any] = {"batch": a.batch, "seq": a.seq}
    if torch is not None:
        tw = {k: torch.from_numpy(v) for k, v in w.items()}
        ti = torch.from_numpy(ids.astype(np.int64))
        tm = torch.from_numpy(mask.astype(np.float32))
        tm.astype = lambda dt: tm  # type: ignore[attr-defined]  (encode casts the mask)

        def run_torch() -> Any:
            with torch.no_grad():
                return ex.encode(TorchNP, TorchNN, tw, ti, tm, eps)

        res["torch_cpu_threads"] = torch.get_num_threads()
        res["torch_cpu_s"] = median_wall(run_torch, a.reps, warmup=1)
        want = ex.reference(w, ids, mask, eps)
        res["torch_max_abs_err_vs_float64"] = float(np.abs(run_torch().numpy() - want).max())
    for backend in ("default", "cpu") + (() if a.no_gpu else ("gpu",)):
        r = run_fusec(backend, a)
        res[f"fusec_{backend}"] = {k: r[k] for k in ("device", "reason", "s_per_batch",
                                                     "first_call_s", "max_abs_err_vs_float64")}
        if "torch_cpu_s" in res:
            res[f"fusec_{backend}"]["over_torch"] = r["s_per_batch"] / res["torch_cpu_s"]
    if torch is not None:  # the torch time again, after the subprocesses: a noisy machine shows
        res["torch_cpu_s_after"] = median_wall(run_torch, a.reps, warmup=1)
    print(json.dumps(res, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
