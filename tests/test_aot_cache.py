"""Issue 4: ahead-of-time compilation and caching users can trust.

The staged API (trace/lower/compile with ShapeDtype, cost_analysis), warm-up (``f.warmup``,
recorded manifests, ``fusec.warmup_from``, ``fusec warmup``), the persistent cache under
``FUSEC_CACHE_DIR`` (cross-process hits, concurrent writers, corrupt entries, LRU bound, ``fusec
cache``), explained cache misses and the retrace warning, asynchronous dispatch (no readbacks in a
chain of calls) and ``FUSEC_LOG_COMPILES``.

Cross-process behaviour runs in subprocesses: a user module written to ``tmp_path`` is run with
the settings under test, and prints ``cache_info()`` deltas as JSON for these tests to check.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import REPO, Delta, pythonpath, spy_sizes

import fusec
import fusec.numpy as fnp
from fusec import diskcache

S = fusec.ShapeDtype

requires_gpu = pytest.mark.skipif(
    fusec.default_device().is_cpu_fallback,
    reason="needs a wgpu adapter (FUSEC_BACKEND=cpu runs the numpy interpreter)")


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.uniform(-1, 1, shape).astype(np.float32)


# --- subprocess helpers ---------------------------------------------------------------------------


def _env(**settings: str | None) -> dict[str, str]:
    """The parent's environment (PYTHONPATH kept: the GPU machine needs it) with the repository
    first on the path, and ``settings`` set (None removes one)."""
    env = dict(os.environ)
    env["XDG_RUNTIME_DIR"] = env.get("XDG_RUNTIME_DIR") or "/tmp"
    env["PYTHONPATH"] = pythonpath()
    for k in ("FUSEC_RECORD_SIGNATURES", "FUSEC_EXPLAIN_CACHE_MISSES", "FUSEC_LOG_COMPILES",
              "FUSEC_CACHE_MAX_BYTES"):
        env.pop(k, None)
    env["FUSEC_CACHE_DIR"] = "off"
    for k, v in settings.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def _start(args: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, *args], cwd=cwd or REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _run(args: list[str], env: dict[str, str], cwd: Path | None = None
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd or REPO, env=env, text=True,
                          capture_output=True, timeout=300)


def _json_out(p: subprocess.CompletedProcess[str]) -> Any:
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


# A user module of programs for the persistent-cache tests. Run as a script, it takes jobs
# [[name, [shape, ...], fuse], ...] and prints, per job, the cache_info() delta of the first call
# of a fresh jitted function and whether its result matches numpy.
PROGS = '''
import json
import sys

import numpy as np

import fusec
import fusec.numpy as fnp


def mlp(x, w):
    return fnp.tanh(x @ w) * 0.5 + x.sum(axis=-1, keepdims=True)


def chain(x):
    return fnp.exp(-x * x) * 2.0 - x


def norm(x):
    c = x - x.mean(axis=-1, keepdims=True)
    return c / fnp.sqrt((c * c).mean(axis=-1, keepdims=True) + 1e-5)


def _norm_ref(x):
    c = x - x.mean(axis=-1, keepdims=True)
    return c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + 1e-5)


FUNCS = {"mlp": mlp, "chain": chain, "norm": norm}
REFS = {
    "mlp": lambda x, w: np.tanh(x @ w) * 0.5 + x.sum(axis=-1, keepdims=True),
    "chain": lambda x: np.exp(-x * x) * 2.0 - x,
    "norm": _norm_ref,
}


def job(name, shapes, fuse=True):
    rng = np.random.default_rng(0)
    args = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
    f = fusec.gpu_jit(FUNCS[name], fuse=fuse)
    before = fusec.cache_info()
    y = np.asarray(f(*args))
    d = fusec.cache_info() - before
    ok = bool(np.allclose(y, REFS[name](*args), rtol=1e-4, atol=1e-4))
    return {"job": [name, shapes, fuse], "traces": d.traces, "lowerings": d.lowerings,
            "disk_hits": d.disk_hits, "ok": ok}


if __name__ == "__main__":
    fusec.default_device()
    print(json.dumps([job(*j) for j in json.loads(sys.argv[1])]))
'''

MLP = ["mlp", [[8, 16], [16, 8]], True]
CHAIN = ["chain", [[64]], True]
NORM = ["norm", [[4, 32]], True]
CHAIN2D = ["chain", [[32, 32]], True]


@pytest.fixture
def progs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The PROGS module, written to tmp_path and imported here too (the same programs, so this
    process and the subprocesses share cache keys)."""
    (tmp_path / "fusec_progs.py").write_text(PROGS)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("fusec_progs", None)
    import fusec_progs  # type: ignore[import-not-found]

    yield fusec_progs
    sys.modules.pop("fusec_progs", None)


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The persistent cache turned on, in a fresh directory, for this process."""
    d = tmp_path / "cache"
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(d))
    monkeypatch.delenv("FUSEC_CACHE_MAX_BYTES", raising=False)
    return d


def _run_jobs(tmp_path: Path, cache: Path, jobs: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = _json_out(_run([str(tmp_path / "fusec_progs.py"), json.dumps(jobs)],
                                               _env(FUSEC_CACHE_DIR=str(cache))))
    return out


def _start_jobs(tmp_path: Path, cache: Path, jobs: list[Any]) -> subprocess.Popen[str]:
    return _start([str(tmp_path / "fusec_progs.py"), json.dumps(jobs)],
                  _env(FUSEC_CACHE_DIR=str(cache)))


# --- 1. staged API --------------------------------------------------------------------------------


def test_trace_lower_compile_accept_shapedtype(rng: np.random.Generator) -> None:
    f = fusec.gpu_jit(lambda x, p: fnp.tanh(x @ p["w"] + p["b"]))
    specs = (S((6, 5)), {"w": S((5, 3)), "b": S((3,))})
    with Delta() as d:
        traced = f.trace(*specs)
        lowered = traced.lower()
    assert isinstance(traced, fusec.Traced) and isinstance(lowered, fusec.Lowered)
    assert d.traces == 1 and d.pipelines_compiled == 0 and d.hits == 0 and d.misses == 0
    assert "f32[6,5]" in str(traced.ir) and "f32[5,3]" in str(traced.ir)
    assert "@compute" in lowered.as_text("wgsl")
    assert "kernel" in lowered.as_text("ir")
    compiled = lowered.compile()
    assert isinstance(compiled, fusec.Compiled)
    x, w, b = rand(rng, 6, 5), rand(rng, 5, 3), rand(rng, 3)
    with Delta() as run:
        out = compiled(x, {"w": w, "b": b})
    assert run.traces == 0 and run.lowerings == 0 and run.pipelines_compiled == 0
    np.testing.assert_allclose(np.asarray(out), np.tanh(x @ w + b), rtol=1e-4, atol=1e-5)
    # f.lower is the same as f.trace(...).lower()
    assert f.lower(*specs).as_text("wgsl") == lowered.as_text("wgsl")


def test_compiled_rejects_other_signatures_naming_the_argument(rng: np.random.Generator) -> None:
    f = fusec.gpu_jit(lambda x, p, n: (x @ p["w"]) * n, static_argnames=("n",))
    compiled = f.lower(S((4, 5)), {"w": S((5, 2))}, n=3).compile()
    x, w = rand(rng, 4, 5), rand(rng, 5, 2)
    np.testing.assert_allclose(np.asarray(compiled(x, {"w": w}, n=3)), (x @ w) * 3, rtol=1e-4)
    with pytest.raises(fusec.SignatureError, match=r"'p\['w'\]'") as info:
        compiled(x, {"w": rand(rng, 5, 7)}, n=3)
    assert "[5,2]" in str(info.value) and "[5,7]" in str(info.value)
    with pytest.raises(fusec.SignatureError, match="'x'") as info:
        compiled(x.astype(np.int32), {"w": w}, n=3)
    assert "int32" in str(info.value) or "i32" in str(info.value)
    with pytest.raises(fusec.SignatureError, match="'n'") as info:
        compiled(x, {"w": w}, n=4)
    assert "3" in str(info.value) and "4" in str(info.value)


def test_compiled_structure_mismatch_is_readable(rng: np.random.Generator) -> None:
    # "a clear error": the argument and its structures as a user writes them, not fusec's
    # internal tree encoding
    f = fusec.gpu_jit(lambda p: p["w"] * 2.0)
    compiled = f.lower({"w": S((3,))}).compile()
    with pytest.raises(fusec.SignatureError, match="'p'|p=") as info:
        compiled({"v": rand(rng, 3)})
    msg = str(info.value)
    assert "'w'" in msg and "'v'" in msg
    assert "('leaf',)" not in msg and "'args'" not in msg, msg


def test_cost_analysis_elementwise_exact() -> None:
    f = fusec.gpu_jit(lambda x, y: x * y + 1.0)
    cost = f.lower(S((3, 4)), S((3, 4))).cost_analysis()
    assert cost["flops"] == 2 * 12  # one multiply and one add per element
    assert cost["bytes accessed"] == 3 * 12 * 4  # two inputs read, one output written, float32
    assert cost["kernels"] == 1
    # unfused, the intermediate goes through memory: written once, read once
    unfused = fusec.gpu_jit(lambda x, y: x * y + 1.0, fuse=False)
    cost = unfused.lower(S((3, 4)), S((3, 4))).cost_analysis()
    assert cost["flops"] == 2 * 12
    assert cost["bytes accessed"] == 5 * 12 * 4
    assert cost["kernels"] == 2


@pytest.mark.parametrize("m, n, k", [(8, 4, 16), (5, 7, 3)])
def test_cost_analysis_matmul_exact(m: int, n: int, k: int) -> None:
    f = fusec.gpu_jit(lambda a, b: a @ b)
    cost = f.lower(S((m, k)), S((k, n))).cost_analysis()
    assert cost["flops"] == 2 * m * n * k
    assert cost["bytes accessed"] == 4 * (m * k + k * n + m * n)
    # a fused bias epilogue adds one add per output element and reads the bias once
    g = fusec.gpu_jit(lambda a, b, c: a @ b + c)
    cost = g.lower(S((m, k)), S((k, n)), S((n,))).cost_analysis()
    assert cost["kernels"] == 1
    assert cost["flops"] == 2 * m * n * k + m * n
    assert cost["bytes accessed"] == 4 * (m * k + k * n + n + m * n)


# --- 2. warm-up -----------------------------------------------------------------------------------


@requires_gpu
def test_warmup_multi_kernel_signature_then_first_call_compiles_nothing(
        rng: np.random.Generator) -> None:
    @fusec.gpu_jit(static_argnames=("axis",))
    def f(x, p, s, axis):
        h = fnp.tanh(x @ p["w"]) * s
        return h - h.max(axis=axis, keepdims=True), h.sum()

    specs = (S((9, 6)), {"w": S((6, 5))}, 1.0)
    with Delta() as w:
        compiled = f.warmup(*specs, axis=1)
    assert isinstance(compiled, fusec.Compiled)
    assert w.traces == 1 and w.lowerings == 1 and w.pipelines_compiled >= 2
    assert w.readbacks == 0 and w.hits == 0 and w.misses == 0  # nothing ran
    x, wt = rand(rng, 9, 6), rand(rng, 6, 5)
    with Delta() as d:
        a, total = f(x, {"w": wt}, 2.0, axis=1)
    assert d.traces == 0 and d.lowerings == 0 and d.pipelines_compiled == 0
    assert d.hits == 1 and d.misses == 0
    h = np.tanh(x @ wt) * 2
    np.testing.assert_allclose(np.asarray(a), h - h.max(axis=1, keepdims=True), atol=1e-5)
    np.testing.assert_allclose(float(np.asarray(total)), h.sum(), rtol=1e-4, atol=1e-4)
    # warming up a signature again is free; another static value is a new signature
    with Delta() as again:
        assert f.warmup(*specs, axis=1) is compiled
    assert again.traces == 0 and again.pipelines_compiled == 0
    with Delta() as other:
        f.warmup(*specs, axis=0)
    assert other.traces == 1


# --- 3. manifests ---------------------------------------------------------------------------------

APP = '''
import dataclasses
import json
import sys

import numpy as np

import fusec
import fusec.numpy as fnp


@fusec.gpu_jit(static_argnames=("axis",))
def reduce(x, axis):
    return fnp.sum(x * 2.0, axis=axis)


@fusec.gpu_jit
def affine(x, params):
    return fnp.tanh(x @ params["w"] + params["b"])


@fusec.gpu_jit
def scale(x, s):
    return x * s + 1.0


double = fusec.gpu_jit(lambda x: x * 2.0)  # a lambda cannot be imported by name: not recorded


def run(with_lambda):
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)
    p = {"w": np.linspace(0, 1, 18, dtype=np.float32).reshape(6, 3),
         "b": np.ones(3, np.float32)}
    y = np.ones((2, 2), np.float32)
    got = [reduce(x, axis=0), reduce(x, axis=0), reduce(x, axis=1), affine(x, p),
           scale(x, 3.0), scale(x, 4.0), scale(y, 3.0)]
    want = [(x * 2).sum(0), (x * 2).sum(0), (x * 2).sum(1), np.tanh(x @ p["w"] + p["b"]),
            x * 3 + 1, x * 4 + 1, y * 3 + 1]
    if with_lambda:
        got.append(double(x))
        want.append(x * 2)
    return all(np.allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5) for g, w in zip(got, want))


if __name__ == "__main__":
    fusec.default_device()
    mode = sys.argv[1]
    res = None
    if mode == "record":
        ok = run(with_lambda=True)
    else:
        if mode == "serve":
            res = fusec.warmup_from(sys.argv[2], progress=False)
        before = fusec.cache_info()
        ok = run(with_lambda=False)
    delta = dataclasses.asdict(fusec.cache_info() - before) if mode != "record" else None
    print(json.dumps({"ok": ok, "warmup": res, "delta": delta}))
'''

N_RECORDED = 5  # reduce axis=0, reduce axis=1, affine, scale (4, 6), scale (2, 2)


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[Path, Path]:
    """The APP script run once with FUSEC_RECORD_SIGNATURES: (script, manifest)."""
    app = tmp_path / "app.py"
    app.write_text(APP)
    manifest = tmp_path / "signatures.jsonl"
    out = _json_out(_run([str(app), "record"], _env(FUSEC_RECORD_SIGNATURES=str(manifest))))
    assert out["ok"]
    return app, manifest


def test_manifest_records_one_line_per_new_signature(recorded: tuple[Path, Path]) -> None:
    app, manifest = recorded
    lines = manifest.read_text().splitlines()
    assert len(lines) == N_RECORDED, lines
    recs = [json.loads(line) for line in lines]
    by_fn: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        assert r["function"].startswith(str(app.resolve()) + ":"), r["function"]
        by_fn.setdefault(r["function"].rpartition(":")[2], []).append(r)
    assert sorted(by_fn) == ["affine", "reduce", "scale"]  # the lambda is skipped
    assert "lambda" not in manifest.read_text()
    # static arguments are recorded by value, arrays by shape and dtype
    reduce_args = sorted((r["arguments"] for r in by_fn["reduce"]), key=lambda a: a["axis"])
    assert [a["axis"] for a in reduce_args] == [0, 1]
    assert reduce_args[0]["x"] == {"spec": [[4, 6], "float32"]}
    assert by_fn["reduce"][0]["options"]["static_argnames"] == ["axis"]
    (aff,) = by_fn["affine"]
    assert aff["arguments"]["params"] == {"dict": {"w": {"spec": [[6, 3], "float32"]},
                                                   "b": {"spec": [[3], "float32"]}}}
    scales = by_fn["scale"]
    assert len(scales) == 2  # 3.0 and 4.0 are one signature (weak scalars); (2, 2) another
    assert {tuple(r["arguments"]["x"]["spec"][0]) for r in scales} == {(4, 6), (2, 2)}
    assert all(r["arguments"]["s"] == {"scalar": "float"} for r in scales)


@requires_gpu
def test_warmup_from_in_a_new_process_then_first_calls_compile_nothing(
        recorded: tuple[Path, Path]) -> None:
    app, manifest = recorded
    out = _json_out(_run([str(app), "serve", str(manifest)], _env()))
    assert out["ok"]
    assert out["warmup"]["signatures"] == N_RECORDED
    assert out["warmup"]["pipelines"] >= N_RECORDED
    d = out["delta"]
    assert d["pipelines_compiled"] == 0, d
    assert d["traces"] == 0 and d["lowerings"] == 0 and d["misses"] == 0, d
    assert d["hits"] == 7, d  # every call of run() hit a warmed signature


@requires_gpu
def test_warmup_cli_progress_bar_then_persistent_cache_serves_a_new_process(
        recorded: tuple[Path, Path], tmp_path: Path) -> None:
    app, manifest = recorded
    cache = tmp_path / "cache"
    p = _run(["-m", "fusec", "warmup", str(manifest)], _env(FUSEC_CACHE_DIR=str(cache)))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "fusec warmup" in p.stderr and "[" in p.stderr and "#" in p.stderr
    assert f"{N_RECORDED}/{N_RECORDED}" in p.stderr
    assert f"warmed up {N_RECORDED} signature(s)" in p.stdout
    assert str(cache) in p.stdout
    assert "Traceback" not in p.stderr
    assert len(list(cache.glob("*.fcache"))) == N_RECORDED
    # a later process, without warmup_from, lowers nothing: everything comes from disk
    out = _json_out(_run([str(app), "cold"], _env(FUSEC_CACHE_DIR=str(cache))))
    assert out["ok"]
    assert out["delta"]["lowerings"] == 0 and out["delta"]["disk_hits"] == N_RECORDED


@requires_gpu
def test_warmup_cli_as_installed_finds_dotted_modules_of_the_current_directory(
        tmp_path: Path) -> None:
    # A program run as `python -c "import userapp; ..."` (or `python -m userapp`) records
    # "userapp:scale". The installed `fusec` script does not have the current directory on
    # sys.path (unlike `python -m fusec`); `fusec warmup` run from the project directory must
    # still find the module, as `fusec show userapp:scale` does.
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "userapp.py").write_text(
        "import numpy as np\nimport fusec\n\n\n@fusec.gpu_jit\ndef scale(x):\n"
        "    return x * 3.0\n\n\ndef run():\n    scale(np.ones(4, np.float32))\n")
    manifest = proj / "m.jsonl"
    p = _run(["-c", "import userapp; userapp.run()"],
             _env(FUSEC_RECORD_SIGNATURES=str(manifest)), cwd=proj)
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(manifest.read_text())["function"] == "userapp:scale"
    launcher = tmp_path / "bin" / "fusec"  # what pip's console-script wrapper does
    launcher.parent.mkdir()
    launcher.write_text("import sys\nfrom fusec.cli import main\nsys.exit(main())\n")
    show = _run([str(launcher), "show", "userapp:scale", "--arg", "4:float32", "--ir"], _env(),
                cwd=proj)
    assert show.returncode == 0, show.stdout + show.stderr
    warm = _run([str(launcher), "warmup", "m.jsonl"], _env(), cwd=proj)
    assert warm.returncode == 0, warm.stdout + warm.stderr
    assert "warmed up 1 signature(s)" in warm.stdout


def test_warmup_cli_missing_manifest_exits_2(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    p = _run(["-m", "fusec", "warmup", str(missing)], _env())
    assert p.returncode == 2, p.stdout + p.stderr
    assert "fusec: error:" in p.stderr
    assert "no warm-up manifest" in p.stderr and str(missing) in p.stderr
    assert "FUSEC_RECORD_SIGNATURES" in p.stderr  # says how to make one
    assert "Traceback" not in p.stderr


VARARGS_APP = '''
import dataclasses
import json
import sys

import numpy as np

import fusec


@fusec.gpu_jit
def total(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return out


@fusec.gpu_jit
def shifted(x, /, by):
    return x + by


if __name__ == "__main__":
    fusec.default_device()
    a = np.ones(3, np.float32)
    if sys.argv[1] == "serve":
        res = fusec.warmup_from(sys.argv[2], progress=False)
    before = fusec.cache_info()
    ok = (np.asarray(total(a, a, a)) == 3).all() and (np.asarray(shifted(a, a)) == 2).all()
    delta = dataclasses.asdict(fusec.cache_info() - before)
    print(json.dumps({"ok": bool(ok), "delta": delta}))
'''


@requires_gpu
def test_manifest_of_varargs_and_positional_only_functions_warms_up(tmp_path: Path) -> None:
    # Signatures are recorded by parameter name; replaying them must bind *args and
    # positional-only parameters positionally, as the original call did.
    app = tmp_path / "varargs_app.py"
    app.write_text(VARARGS_APP)
    manifest = tmp_path / "m.jsonl"
    assert _json_out(_run([str(app), "record"],
                          _env(FUSEC_RECORD_SIGNATURES=str(manifest))))["ok"]
    assert len(manifest.read_text().splitlines()) == 2
    out = _json_out(_run([str(app), "serve", str(manifest)], _env()))
    assert out["ok"]
    assert out["delta"]["traces"] == 0 and out["delta"]["pipelines_compiled"] == 0, out


# --- 4. persistent cache --------------------------------------------------------------------------


@requires_gpu
def test_second_process_hits_the_disk_and_other_options_or_shapes_miss(
        progs: Any, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _run_jobs(tmp_path, cache, [MLP])
    assert first[0]["ok"] and first[0]["lowerings"] == 1 and first[0]["disk_hits"] == 0
    assert len(list(cache.glob("*.fcache"))) == 1
    second = _run_jobs(tmp_path, cache, [MLP, ["mlp", MLP[1], False],
                                         ["mlp", [[8, 16], [16, 4]], True]])
    hit, unfused, reshaped = second
    assert all(r["ok"] for r in second), second
    assert hit["disk_hits"] == 1 and hit["lowerings"] == 0, hit
    assert unfused["disk_hits"] == 0 and unfused["lowerings"] == 1, unfused
    assert reshaped["disk_hits"] == 0 and reshaped["lowerings"] == 1, reshaped
    assert len(list(cache.glob("*.fcache"))) == 3


@requires_gpu
def test_concurrent_writers_leave_the_cache_valid(progs: Any, tmp_path: Path,
                                                  cache_dir: Path) -> None:
    groups = [[MLP, CHAIN, NORM], [MLP, NORM, CHAIN2D], [CHAIN2D, CHAIN, MLP]]
    procs = [_start_jobs(tmp_path, cache_dir, g) for g in groups]
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stdout + stderr
        assert all(r["ok"] for r in json.loads(stdout.strip().splitlines()[-1]))
    assert not [p.name for p in cache_dir.iterdir() if p.name.startswith(".tmp-")]
    files = sorted(cache_dir.glob("*.fcache"))
    assert len(files) == 4  # four distinct programs
    for f in files:
        assert diskcache.load(f.stem) is not None, f"{f.name} does not load"
    # a third process finds every program on disk
    check = _run_jobs(tmp_path, cache_dir, [MLP, CHAIN, NORM, CHAIN2D])
    for r in check:
        assert r["ok"] and r["disk_hits"] == 1 and r["lowerings"] == 0, check


STRESS = '''
import hashlib, json, os, sys
from fusec import diskcache

me, rounds = int(sys.argv[1]), int(sys.argv[2])
bad = loaded = 0
for i in range(rounds):
    key = f"k{i % 4}"
    diskcache.store(key, {"writer": me, "i": i, "pad": "x" * (20000 + 997 * me + i)})
    other = f"k{(i - 1) % 4}"  # written just before: the LRU bound keeps it
    path = diskcache.cache_dir() / (other + diskcache.SUFFIX)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        continue
    head, _, body = raw.partition(b"\\n")
    if head.decode(errors="replace") != diskcache.MAGIC + " " + hashlib.sha256(body).hexdigest():
        bad += 1
    data = diskcache.load(other)
    if data is not None:
        loaded += 1
        bad += len(data["pad"]) != 20000 + 997 * data["writer"] + data["i"]
print(json.dumps({"bad": bad, "loaded": loaded}))
'''


def test_concurrent_stores_of_the_same_keys_never_expose_partial_entries(
        tmp_path: Path) -> None:
    script = tmp_path / "stress.py"
    script.write_text(STRESS)
    cache = tmp_path / "cache"
    # a bound of about three entries: evictions race with writes and reads too
    env = _env(FUSEC_CACHE_DIR=str(cache), FUSEC_CACHE_MAX_BYTES=str(70000))
    procs = [_start([str(script), str(i), "150"], env) for i in range(3)]
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stdout + stderr
        res = json.loads(stdout.strip().splitlines()[-1])
        assert res["bad"] == 0, res
        assert res["loaded"] > 0, res
    assert not [p.name for p in cache.iterdir() if p.name.startswith(".tmp-")]
    for f in cache.glob("*.fcache"):
        head = f.read_bytes().partition(b"\n")[0].decode()
        assert head.startswith(diskcache.MAGIC + " ")


def _damage(path: Path, how: str) -> None:
    whole = path.read_bytes()
    if how == "truncated":
        path.write_bytes(whole[: len(whole) // 2])
    elif how == "garbage":
        path.write_bytes(np.random.default_rng(1).integers(0, 256, len(whole), np.uint8).tobytes())
    elif how == "flipped":  # a valid header, one byte of the body changed
        i = len(whole) - 10
        path.write_bytes(whole[:i] + bytes([whole[i] ^ 0x20]) + whole[i + 1:])
    elif how == "empty":
        path.write_bytes(b"")
    else:
        raise AssertionError(how)


@requires_gpu
@pytest.mark.parametrize("how", ["truncated", "garbage", "flipped", "empty"])
def test_damaged_entry_is_ignored_and_replaced(progs: Any, cache_dir: Path, how: str) -> None:
    x = np.linspace(-2, 2, 64, dtype=np.float32)
    want = np.exp(-x * x) * 2.0 - x
    with Delta() as first:
        fusec.gpu_jit(progs.chain)(x)
    assert first.lowerings == 1 and first.disk_hits == 0
    (entry,) = diskcache.entries()
    whole = entry.read_bytes()
    _damage(entry, how)
    with Delta() as d:
        out = fusec.gpu_jit(progs.chain)(x)  # a new function object: looks on disk
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-6)
    assert d.lowerings == 1 and d.disk_hits == 0  # a miss: the damaged entry was not loaded
    assert entry.read_bytes() == whole  # replaced by a whole entry
    with Delta() as again:
        fusec.gpu_jit(progs.chain)(x)
    assert again.disk_hits == 1 and again.lowerings == 0


@requires_gpu
def test_truncated_entry_is_replaced_for_the_next_process(progs: Any, tmp_path: Path,
                                                         cache_dir: Path) -> None:
    rows = _run_jobs(tmp_path, cache_dir, [NORM])
    assert rows[0]["lowerings"] == 1
    (entry,) = diskcache.entries()
    _damage(entry, "truncated")
    rows = _run_jobs(tmp_path, cache_dir, [NORM])
    assert rows[0]["ok"] and rows[0]["lowerings"] == 1 and rows[0]["disk_hits"] == 0, rows
    rows = _run_jobs(tmp_path, cache_dir, [NORM])
    assert rows[0]["ok"] and rows[0]["lowerings"] == 0 and rows[0]["disk_hits"] == 1, rows


@requires_gpu
def test_cache_cli_info_and_clear(progs: Any, tmp_path: Path, cache_dir: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    from fusec.cli import main

    x = np.ones((3, 5), np.float32)
    fusec.gpu_jit(progs.chain)(x)
    fusec.gpu_jit(progs.norm)(x)
    info = diskcache.info()
    assert info["entries"] == 2 and info["bytes"] > 0
    p = _run(["-m", "fusec", "cache", "info"], _env(FUSEC_CACHE_DIR=str(cache_dir)))
    assert p.returncode == 0, p.stdout + p.stderr
    assert str(cache_dir) in p.stdout
    assert re.search(r"entries:\s+2\b", p.stdout), p.stdout
    assert re.search(rf"size:\s+{info['bytes']} bytes", p.stdout), p.stdout
    assert main(["cache", "clear"]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert diskcache.entries() == []
    assert main(["cache", "info"]) == 0
    assert re.search(r"entries:\s+0\b", capsys.readouterr().out)
    with Delta() as d:  # an empty cache: a miss again
        fusec.gpu_jit(progs.chain)(x)
    assert d.disk_hits == 0 and d.lowerings == 1


def test_lru_eviction_keeps_the_size_bound(cache_dir: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    payload = {"pad": "y" * 4000}
    diskcache.store("probe", payload)
    (probe,) = diskcache.entries()
    size = probe.stat().st_size
    probe.unlink()
    monkeypatch.setenv("FUSEC_CACHE_MAX_BYTES", str(3 * size + size // 2))  # room for three
    t0 = time.time() - 1000
    for i in range(6):
        diskcache.store(f"k{i}", payload)
        # explicit, well separated use times (file systems' clocks can be coarse)
        os.utime(cache_dir / f"k{i}{diskcache.SUFFIX}", (t0 + i, t0 + i))
    assert sorted(p.stem for p in diskcache.entries()) == ["k3", "k4", "k5"]
    assert diskcache.info()["bytes"] <= diskcache.max_bytes()
    assert diskcache.load("k0") is None  # evicted
    assert diskcache.load("k3") == payload  # a load makes k3 the most recently used ...
    diskcache.store("k6", payload)
    assert sorted(p.stem for p in diskcache.entries()) == ["k3", "k5", "k6"]  # ... so k4 goes
    # evict() with an explicit limit; entries() lists only whole entries
    assert diskcache.evict(limit=size) == 2
    assert [p.stem for p in diskcache.entries()] == ["k6"]
    (cache_dir / f".tmp-partial{diskcache.SUFFIX}").write_bytes(b"half an entr")
    assert [p.stem for p in diskcache.entries()] == ["k6"]


@requires_gpu
def test_size_bound_applies_to_real_entries(progs: Any, cache_dir: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    fusec.gpu_jit(progs.chain)(np.ones(8, np.float32))
    (first,) = diskcache.entries()
    monkeypatch.setenv("FUSEC_CACHE_MAX_BYTES", str(first.stat().st_size * 3 // 2))
    old = time.time() - 100
    os.utime(first, (old, old))
    fusec.gpu_jit(progs.chain)(np.ones(9, np.float32))  # a new entry: the old one is evicted
    (second,) = diskcache.entries()
    assert second != first and not first.exists()


# --- 5. explained cache misses and the retrace warning --------------------------------------------


@pytest.fixture
def explain() -> Any:
    fusec.config.set("explain_cache_misses", 1)
    yield
    fusec.config.set("explain_cache_misses", None)


def _misses(err: str) -> list[str]:
    return [line for line in err.splitlines() if "cache miss for" in line]


def test_explain_shape_dtype_and_first_call(explain: None,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    f = fusec.gpu_jit(lambda x: x * 2.0)
    f(np.ones((3, 4), np.float32))
    f(np.ones((5, 4), np.float32))
    f(np.ones((5, 4), np.int32))
    f(np.ones((5, 4), np.int32))  # a hit: no message
    first, shape, dtype = _misses(capsys.readouterr().err)
    assert "first call" in first
    assert "test_aot_cache.py" in first  # where the function is
    assert "argument 'x' changed shape from (3, 4) to (5, 4)" in shape
    assert "argument 'x' changed dtype from float32 to int32" in dtype


def test_explain_names_the_argument_of_the_closest_signature(
        explain: None, capsys: pytest.CaptureFixture[str]) -> None:
    f = fusec.gpu_jit(lambda x, y: x.sum() + y.sum())
    f(np.ones((3, 4), np.float32), np.ones(2, np.float32))
    f(np.ones((5, 4), np.float32), np.ones(2, np.float32))
    f(np.ones((5, 4), np.float32), np.ones(7, np.float32))
    last = _misses(capsys.readouterr().err)[-1]
    assert "argument 'y' changed shape from (2,) to (7,)" in last
    assert "'x'" not in last  # the closest signature differs in y only
    assert "2 compiled signatures" in last


def test_explain_python_scalar_vs_array(explain: None,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    f = fusec.gpu_jit(lambda x, s: x * s)
    f(np.ones(3, np.float32), 2.0)
    f(np.ones(3, np.float32), 5.0)  # weak scalars: a hit
    f(np.ones(3, np.float32), np.float32(2.0))
    misses = _misses(capsys.readouterr().err)
    assert len(misses) == 2
    assert "argument 's' changed from a Python scalar to an array" in misses[1]


def test_explain_static_value(explain: None, capsys: pytest.CaptureFixture[str]) -> None:
    f = fusec.gpu_jit(lambda x, n: x * n, static_argnames=("n",))
    f(np.ones(3, np.float32), n=2)
    f(np.ones(3, np.float32), n=3)
    last = _misses(capsys.readouterr().err)[-1]
    assert "static argument 'n' changed value from 2 to 3" in last


def test_explain_pytree_structure(explain: None, capsys: pytest.CaptureFixture[str]) -> None:
    f = fusec.gpu_jit(lambda d: d["a"] + d.get("b", 0.0))
    x = np.ones(3, np.float32)
    f({"a": x})
    f({"a": x, "b": x})
    last = _misses(capsys.readouterr().err)[-1]
    assert "pytree structure changed" in last
    assert "d={'a': *}" in last and "d={'a': *, 'b': *}" in last


def test_explain_function_object_is_new(explain: None,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    a = np.ones(4, np.float32)
    for _ in range(2):
        fusec.gpu_jit(lambda x: x * 2)(a)
    first, second = _misses(capsys.readouterr().err)
    assert "first call" in first
    assert "function object is new" in second
    assert "loop" in second  # the likely cause


def test_explain_two_lambdas_on_one_line_are_different_functions(
        explain: None, capsys: pytest.CaptureFixture[str]) -> None:
    # Different code that happens to share a line and a name (two lambdas) is not "the same
    # code through a new function object": each one's first call is a first call.
    inc, dbl = fusec.gpu_jit(lambda x: x + 1.0), fusec.gpu_jit(lambda x: x * 2.0)
    a = np.ones(3, np.float32)
    inc(a)
    dbl(a)
    first, second = _misses(capsys.readouterr().err)
    assert "first call" in first
    assert "first call" in second, second
    assert "function object is new" not in second


def test_explain_from_the_environment(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    f = fusec.gpu_jit(lambda x: x - 1.0)
    f(np.ones(2, np.float32))
    monkeypatch.setenv("FUSEC_EXPLAIN_CACHE_MISSES", "1")
    f(np.ones(6, np.float32))
    monkeypatch.delenv("FUSEC_EXPLAIN_CACHE_MISSES")
    f(np.ones(7, np.float32))
    (only,) = _misses(capsys.readouterr().err)
    assert "argument 'x' changed shape from (2,) to (6,)" in only


def test_explain_is_off_by_default(monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("FUSEC_EXPLAIN_CACHE_MISSES", raising=False)
    f = fusec.gpu_jit(lambda x: x + 3.0)
    f(np.ones(2, np.float32))
    f(np.ones(3, np.float32))
    assert _misses(capsys.readouterr().err) == []


def test_retrace_warning_exactly_once() -> None:
    fusec.config.set("retrace_warn", 3)
    try:
        f = fusec.gpu_jit(lambda x: x * 4.0)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            f(np.ones(1, np.float32))
            f(np.ones(2, np.float32))
            f(np.ones(2, np.float32))  # a hit
            assert [w for w in seen if "traced" in str(w.message)] == []
            for n in range(3, 8):
                f(np.ones(n, np.float32))
    finally:
        fusec.config.set("retrace_warn", None)
    retrace = [w for w in seen if "traced" in str(w.message)]
    assert len(retrace) == 1, [str(w.message) for w in seen]
    assert issubclass(retrace[0].category, RuntimeWarning)
    assert "3 times" in str(retrace[0].message)
    assert "FUSEC_EXPLAIN_CACHE_MISSES" in str(retrace[0].message)
    assert retrace[0].filename == __file__  # points at the user's call


def test_retrace_warning_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUSEC_RETRACE_WARN", "2")
    f = fusec.gpu_jit(lambda x: x * 5.0)
    f(np.ones(1, np.float32))
    with pytest.warns(RuntimeWarning, match="traced 2 times"):
        f(np.ones(2, np.float32))


# --- 6. asynchronous dispatch ---------------------------------------------------------------------


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of every device-to-host copy (readbacks and waits alike)."""
    return spy_sizes(monkeypatch, "read", lambda buffer, nbytes: nbytes, "needs a wgpu adapter")


@requires_gpu
def test_a_chain_of_100_calls_reads_nothing_back_until_the_end(
        reads: list[int], rng: np.random.Generator) -> None:
    f = fusec.gpu_jit(lambda a: fnp.tanh(a) * 0.9 + 0.05)
    x0 = rand(rng, 16, 64)
    y = fusec.device_put(x0)
    f(y)  # compile outside the loop (compiling reads nothing back either)
    start = fusec.cache_info()
    for _ in range(100):
        y = f(y)
    assert isinstance(y, fusec.Array)
    assert (fusec.cache_info() - start).readbacks == 0
    assert reads == []  # not even a wait
    assert not y.is_ready()  # the last call returned without waiting for its work
    got = np.asarray(y)
    assert (fusec.cache_info() - start).readbacks == 1
    want = x0
    for _ in range(100):
        want = np.tanh(want) * np.float32(0.9) + np.float32(0.05)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.asarray(y)  # read once: the host copy is kept
    assert (fusec.cache_info() - start).readbacks == 1


@requires_gpu
def test_a_call_returns_an_array_without_reading_back(reads: list[int]) -> None:
    f = fusec.gpu_jit(lambda a, b: a @ b + 1.0)
    a = fusec.device_put(np.ones((32, 32), np.float32))
    f(a, a)
    with Delta() as d:
        out = f(a, a)
    assert isinstance(out, fusec.Array) and out.shape == (32, 32)
    assert d.readbacks == 0 and reads == []
    assert not out.is_ready()
    assert out.block_until_ready() is out and out.is_ready()
    assert reads == []  # the wait blocks in wgpu-native's poll: no copy, no mapped read ...
    with Delta() as w:
        np.testing.assert_array_equal(out.numpy(), np.full((32, 32), 33.0, np.float32))
    assert w.readbacks == 1  # ... and one readback, of the data


# --- 7. FUSEC_LOG_COMPILES ------------------------------------------------------------------------


@requires_gpu
def test_log_compiles(monkeypatch: pytest.MonkeyPatch,
                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FUSEC_LOG_COMPILES", "1")
    monkeypatch.setenv("FUSEC_DEBUG", "0")
    f = fusec.gpu_jit(lambda x: fnp.cos(x) * 0.318309 - 1.7724539)  # a kernel no other test has
    f(np.ones((7, 13), np.float32))
    err = capsys.readouterr().err
    traced = r"fusec: traced \S*<lambda>\S* for .*f32\[7,13\].* in \d+(\.\d+)? ms"
    assert re.search(traced, err), err
    assert re.search(r"fusec: compiled pipeline \S+ in \d+(\.\d+)? ms", err), err
    f(np.ones((7, 13), np.float32))  # a hit: nothing to log
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("FUSEC_LOG_COMPILES", "0")
    fusec.gpu_jit(lambda x: x * 0.5772157)(np.ones(3, np.float32))
    assert "traced" not in capsys.readouterr().err


@requires_gpu
def test_log_compiles_reports_disk_loads(progs: Any, cache_dir: Path,
                                         monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    x = np.ones((2, 3), np.float32)
    fusec.gpu_jit(progs.norm)(x)
    capsys.readouterr()
    monkeypatch.setenv("FUSEC_LOG_COMPILES", "1")
    fusec.gpu_jit(progs.norm)(x)
    err = capsys.readouterr().err
    assert re.search(r"loaded \S*norm from the persistent cache in \d+(\.\d+)? ms", err), err



def test_codegen_tuning_is_part_of_the_disk_cache_key(tmp_path, monkeypatch):
    # a kernel generated under one tuning setting must never be loaded under another
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path))
    from fusec import codegen

    f = fusec.gpu_jit(lambda a, b: a @ b)
    spec = fusec.ShapeDtype((64, 64))
    before = fusec.cache_info()
    f.lower(spec, spec)
    monkeypatch.setattr(codegen, "MATMUL_BLOCK", (128, 128, 8, 8, 8))
    f.lower(spec, spec)
    delta = fusec.cache_info() - before
    assert delta.lowerings == 2 and delta.disk_hits == 0


@pytest.mark.parametrize("module,name,value", [("fusec.passes.merge", "MAX_ROWS", 0),
                                               ("fusec.passes.fuse", "PROLOGUE_MAX", 0),
                                               ("fusec.passes.fuse", "PROLOGUE_ROWS", 4),
                                               ("fusec.passes.splitk", "RB_MIN_K", 64)])
def test_pass_settings_are_part_of_the_disk_cache_key(tmp_path, monkeypatch, module, name,
                                                      value):
    # a plan lowered under one pass setting (merge_products' MAX_ROWS, the prologues,
    # split_k's thresholds) must never be loaded under another
    import importlib

    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path))
    f = fusec.gpu_jit(lambda x, a, b: (x @ a) * (x @ b))
    specs = (fusec.ShapeDtype((40, 8)), fusec.ShapeDtype((8, 8)), fusec.ShapeDtype((8, 8)))
    before = fusec.cache_info()
    f.lower(*specs)
    monkeypatch.setattr(importlib.import_module(module), name, value)
    f.lower(*specs)
    delta = fusec.cache_info() - before
    assert delta.lowerings == 2 and delta.disk_hits == 0
