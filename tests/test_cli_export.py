"""``fusec export``: a function from a .py file saved as an artifact (Python and web targets), run
again with ``fusec.load_exported`` on wgpu, and the one-line errors (exit status 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, pythonpath

import fusec
from fusec.cli import load_function, main
from fusec.exported import VERSION as EXPORT_VERSION
from fusec.ir import Op

F32 = np.float32
LOOP_TRIPS = 40  # well above what fori_loop unrolls: the program keeps a loop equation


def _module(tmp_path: Path, seed: int) -> Path:
    # a unique file name per test: in-process runs import it under a name derived from the stem
    path = tmp_path / f"export_model_{tmp_path.name.replace('-', '_')}.py"
    path.write_text(textwrap.dedent(f"""
        import numpy as np
        import fusec.numpy as fnp
        from fusec import lax, nn

        W = np.random.default_rng({seed}).standard_normal((33, 5)).astype(np.float32)

        def block(x, y, t):  # captures W: the export's one constant
            return {{"h": nn.gelu(x @ W), "s": fnp.tanh(x) * y + t}}

        def first(x, flags):  # flags is never read
            return (x + 1.0,)

        def decay(x):
            return lax.fori_loop(0, {LOOP_TRIPS}, lambda i, c: c * 0.9 + i * 0.01, x)
    """))
    return path


def _weights(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((33, 5)).astype(F32)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.update(FUSEC_BACKEND="gpu", FUSEC_CACHE_DIR="off", XDG_RUNTIME_DIR="/tmp")
    env["PYTHONPATH"] = pythonpath()
    return subprocess.run([sys.executable, "-m", "fusec", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_export_web_target_runs_again_from_the_artifact(tmp_path: Path,
                                                        rng: np.random.Generator) -> None:
    seed = int(rng.integers(2**31))
    module = _module(tmp_path, seed)
    out = tmp_path / "artifact"
    p = _run("export", f"{module}:block", "--arg", "17x33:float32", "--arg", "17,33:float32",
             "--arg", "scalar:float32", "--out", str(out), "--target", "web")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stderr == ""

    # the files, and a manifest that says what they are
    for name in ("manifest.json", "weights.safetensors", "model.js", "model.d.ts", "index.html"):
        assert (out / name).is_file(), name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "fusec-export"
    assert manifest["version"] == EXPORT_VERSION
    assert [(i["name"], i["shape"], i["dtype"]) for i in manifest["inputs"]] == [
        ("x", [17, 33], "float32"), ("y", [17, 33], "float32"), ("t", [], "float32")]
    wgsl = sorted((out / "kernels").glob("*.wgsl"))
    assert len(wgsl) == len(manifest["kernels"]) >= 1
    assert all("@compute" in f.read_text() for f in wgsl)

    # the summary: where, which files, the inputs and outputs, how to view the page
    s = p.stdout
    assert f"exported block to {out}/ (target web" in s
    assert f"{len(wgsl)} WGSL kernel" in s
    for name in ("manifest.json", "weights.safetensors", "model.js", "model.d.ts",
                 "index.html"):
        assert f"  {name} " in s, name
    lines = [ln.split() for ln in s.splitlines()]
    assert ["x", "17x33", "float32"] in lines and ["t", "scalar", "float32"] in lines
    assert ["out['h']", "17x5", "float32"] in lines
    assert ["out['s']", "17x33", "float32"] in lines
    assert f"python -m http.server -d {out}" in s
    assert "http://localhost:8000/" in s and "WebGPU" in s

    # the artifact alone (no module, no tracing) runs on wgpu and matches numpy, for fresh inputs
    ex = fusec.load_exported(out)
    x = rng.standard_normal((17, 33)).astype(F32)
    x[3, 7] = np.nan  # propagates: through tanh into s, through the matmul into row 3 of h
    y = rng.standard_normal((17, 33)).astype(F32)
    t = F32(rng.standard_normal())
    got = ex(x, y, t)
    x64 = x.astype(np.float64)
    want_h = _gelu(x64 @ _weights(seed).astype(np.float64))
    want_s = np.tanh(x64) * y + float(t)
    np.testing.assert_allclose(np.asarray(got["h"]), want_h, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(got["s"]), want_s, rtol=2e-6, atol=2e-6)
    assert np.isnan(np.asarray(got["h"])[3]).all() and np.isnan(np.asarray(got["s"])[3, 7])


def test_export_python_target_writes_no_web_module(tmp_path: Path, rng: np.random.Generator,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    module = _module(tmp_path, 1)
    out = tmp_path / "py"
    assert main(["export", f"{module}:decay", "--arg", "17:float32", "--out", str(out),
                 "--tuning", "cpu"]) == 0
    s = capsys.readouterr().out
    assert (out / "manifest.json").is_file()
    for name in ("model.js", "model.d.ts", "index.html", "weights.safetensors"):
        assert not (out / name).exists(), name
        assert name not in s
    assert "target python, kernels tuned for cpu" in s
    assert "http.server" not in s and "load_exported" in s
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "fusec-export" and manifest["tuning"] == "cpu"
    assert manifest["weights"] is None

    # the Python target keeps the compiled loop, and the artifact runs it
    x = rng.standard_normal(17).astype(F32)
    want = x.astype(np.float64)
    for i in range(LOOP_TRIPS):
        want = want * 0.9 + i * 0.01
    np.testing.assert_allclose(np.asarray(fusec.load_exported(out)(x)), want,
                               rtol=1e-5, atol=1e-5)


def test_export_summary_marks_unused_inputs(tmp_path: Path, rng: np.random.Generator,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    module = _module(tmp_path, 5)
    out = tmp_path / "first"
    assert main(["export", f"{module}:first", "--arg", "7x1:float32", "--arg", "3:bool",
                 "--out", str(out), "--target", "web"]) == 0
    lines = [ln.split() for ln in capsys.readouterr().out.splitlines()]
    assert ["x", "7x1", "float32"] in lines
    (flags,) = [ln for ln in lines if ln[:1] == ["flags"]]
    assert flags[1:3] == ["3", "bool"] and flags[3] == "(unused:"
    assert ["out[0]", "7x1", "float32"] in lines
    x = rng.standard_normal((7, 1)).astype(F32)
    (got,) = fusec.load_exported(out)(x, np.array([True, False, True]))
    np.testing.assert_allclose(np.asarray(got), x.astype(np.float64) + 1.0, rtol=1e-6)


def test_export_compiled_loop_to_web_exits_2(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    module = _module(tmp_path, 2)
    spec = fusec.ShapeDtype((17,), "float32")
    # the case is one the compiler keeps as a loop (not unrolled into straight dispatches)
    assert any(e.op is Op.LOOP for e in load_function(f"{module}:decay").lower(spec).ir.eqns)
    out = tmp_path / "web"
    assert main(["export", f"{module}:decay", "--arg", "17:float32", "--out", str(out),
                 "--target", "web"]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert len(err) == 1, cap.err
    assert err[0].startswith("fusec: error: decay cannot be exported to the web target")
    assert "compiled loop" in err[0]
    assert not out.exists()  # nothing half-written
    assert cap.out == ""


@pytest.mark.parametrize("argv, message", [
    (["--arg", "17x33"], "bad --arg '17x33': expected SHAPE:DTYPE"),
    (["--arg", "17xq:float32"], "must be sizes joined by"),
    (["--arg", "17x33:float31"], "float31"),
    (["--arg", "17x33:float32"], "cannot call"),  # block takes three arguments
    (["--arg", "17x33:float32", "--arg", "17x34:float32", "--arg", "scalar:float32"],
     "ShapeError"),
])
def test_export_bad_arg_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                argv: list[str], message: str) -> None:
    module = _module(tmp_path, 3)
    out = tmp_path / "never"
    assert main(["export", f"{module}:block", *argv, "--out", str(out)]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fusec: error: "), cap.err
    assert message in err[0]
    assert cap.out == ""
    assert not out.exists()


def test_export_without_out_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = _module(tmp_path, 4)
    assert main(["export", f"{module}:block", "--arg", "17x33:float32"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["fusec: error: export: --out DIR is required (the directory the artifact is "
                   "written into)"]
