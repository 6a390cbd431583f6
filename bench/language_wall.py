"""Wall-clock time per call of the array-language workloads (gather, cumsum, argmax, sort) with
fusec, torch eager and JAX jit, side by side in one process: what a user waits for one call and
its result (fusec: call + ``block_until_ready``; torch: call + ``cuda.synchronize``; JAX: call +
``block_until_ready``), median of ``--reps`` calls after warm-up, inputs already on the device.

    python bench/language_wall.py [--reps 30] [--out results.json]

torch and JAX are optional: a library that does not import (or has no GPU) is skipped.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

try:  # torch first: its compiler stack must load before fusec opens a Vulkan adapter
    import torch
except Exception:  # noqa: BLE001 - optional
    torch = None

from timing import median_wall  # noqa: E402  (bench/timing.py)

import fusec  # noqa: E402
import fusec.numpy as fnp  # noqa: E402


def _inputs(rng: np.random.Generator) -> dict[str, tuple[np.ndarray, ...]]:
    return {
        "gather": (rng.standard_normal((50257, 768), dtype=np.float32),
                   rng.integers(0, 50257, 4096, dtype=np.int32)),
        "cumsum": (rng.standard_normal(1 << 26, dtype=np.float32),),
        "argmax": (rng.standard_normal((8192, 8192), dtype=np.float32),),
        "sort": (rng.standard_normal(1 << 24, dtype=np.float32),),
    }


FUSEC = {
    "gather": lambda t, i: fnp.take(t, i, axis=0),
    "cumsum": lambda x: fnp.cumsum(x),
    "argmax": lambda x: fnp.argmax(x, axis=-1),
    "sort": lambda x: fnp.sort(x),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    inputs = _inputs(np.random.default_rng(0))
    res: dict[str, dict[str, float]] = {}
    for name, host in inputs.items():
        row: dict[str, float] = {}
        f = fusec.gpu_jit(FUSEC[name])
        dev = [fusec.device_put(a) for a in host]
        row["fusec"] = median_wall(lambda: f(*dev).block_until_ready(), args.reps)
        if torch is not None and torch.cuda.is_available():
            tdev = [torch.from_numpy(a.astype(np.int64) if a.dtype == np.int32 else a).cuda()
                    for a in host]
            tfn = {"gather": lambda t, i: torch.index_select(t, 0, i),
                   "cumsum": lambda x: torch.cumsum(x, 0),
                   "argmax": lambda x: torch.argmax(x, dim=-1),
                   "sort": lambda x: torch.sort(x).values}[name]

            def torch_call() -> None:
                tfn(*tdev)
                torch.cuda.synchronize()

            row["torch_eager"] = median_wall(torch_call, args.reps)
            del tdev
        try:
            import jax
            import jax.numpy as jnp

            if jax.default_backend() == "gpu":
                jfn = jax.jit({"gather": lambda t, i: jnp.take(t, i, axis=0),
                               "cumsum": lambda x: jnp.cumsum(x),
                               "argmax": lambda x: jnp.argmax(x, axis=-1),
                               "sort": lambda x: jnp.sort(x)}[name])
                jdev = [jax.device_put(a) for a in host]
                row["jax_jit"] = median_wall(lambda: jfn(*jdev).block_until_ready(), args.reps)
                del jdev
        except Exception as exc:  # noqa: BLE001 - optional
            print(f"{name}: JAX skipped ({type(exc).__name__}: {exc})")
        res[name] = row
        print(name, "  ".join(f"{k} {v * 1e6:.1f} us" for k, v in row.items()), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"device": str(fusec.default_device()), "reps": args.reps,
                       "wall_s": res}, fh, indent=1)


if __name__ == "__main__":
    main()
