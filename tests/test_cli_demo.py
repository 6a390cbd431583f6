"""The demo (``python -m fusec.demo``) and the ``fusec`` command line, run as subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import REPO, pythonpath


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("XDG_RUNTIME_DIR", "/tmp")
    env["PYTHONPATH"] = pythonpath()
    return env


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd or REPO, env=_env(),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def module(tmp_path: Path) -> Path:
    path = tmp_path / "small_model.py"
    path.write_text(textwrap.dedent("""
        import fusec
        import fusec.numpy as fnp
        from fusec import nn

        @fusec.gpu_jit
        def block(x, w, b):
            return nn.gelu(x @ w + b)

        def scaled_exp(x, s):  # a plain function: `fusec show` wraps it with gpu_jit
            return fnp.exp(x) * s
    """))
    return path


def test_demo_runs_and_prints_kernels() -> None:
    p = run("-m", "fusec.demo")
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "device:" in out
    assert "@compute" in out  # the WGSL of a kernel
    assert "kernel kind=" in out  # the lowered IR
    assert "cache_info()" in out
    assert "all results match numpy" in out


def test_info_prints_adapter() -> None:
    import fusec

    p = run("-m", "fusec", "info")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "adapters found:" in p.stdout
    assert "chosen device:" in p.stdout
    dev = fusec.default_device()
    assert dev.adapter in p.stdout
    if not dev.is_cpu_fallback:
        assert "max-storage-buffer-binding-size" in p.stdout


def test_show_file_module_ir_and_wgsl(module: Path, tmp_path: Path) -> None:
    p = run("-m", "fusec", "show", f"{module}:block", "--arg", "8x16:float32",
            "--arg", "16,80:float32", "--arg", "80:float32")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "kernel kind=matmul" in p.stdout
    assert "kernel kind=elementwise" not in p.stdout  # bias and gelu: the matmul's epilogue
    assert "exp(" in p.stdout  # the gelu
    assert "@compute" in p.stdout


def test_show_dotted_module_plain_function(module: Path) -> None:
    # a dotted name is imported from the current directory; --ir and --wgsl select one part
    p = run("-m", "fusec", "show", "small_model:scaled_exp", "--arg", "5:float32",
            "--arg", "scalar:float32", "--ir", cwd=module.parent)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "kernel" in p.stdout and "exp" in p.stdout
    assert "@compute" not in p.stdout
    p = run("-m", "fusec", "show", "small_model:scaled_exp", "--arg", "5:float32",
            "--arg", "scalar:float32", "--wgsl", cwd=module.parent)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "@compute" in p.stdout
    assert "kernel kind=" not in p.stdout


@pytest.mark.parametrize("arg, message", [
    ("8x16", "expected SHAPE:DTYPE"),
    ("8xq:float32", "must be sizes joined by"),
    ("8x16:bytes", "bytes"),
    ("8x16:complex64", "complex64"),
])
def test_show_bad_arg_exits_2(module: Path, arg: str, message: str) -> None:
    p = run("-m", "fusec", "show", f"{module}:scaled_exp", "--arg", arg,
            "--arg", "scalar:float32")
    assert p.returncode == 2, p.stdout + p.stderr
    assert "fusec: error: bad --arg" in p.stderr
    assert message in p.stderr
    assert "Traceback" not in p.stderr


def test_show_missing_module_exits_2(tmp_path: Path) -> None:
    p = run("-m", "fusec", "show", "no_such_module_xyz:f", "--arg", "4:float32", cwd=tmp_path)
    assert p.returncode == 2
    assert "module 'no_such_module_xyz' not found" in p.stderr
    p = run("-m", "fusec", "show", str(tmp_path / "missing.py") + ":f", "--arg", "4:float32")
    assert p.returncode == 2
    assert "no such file" in p.stderr


def test_show_shape_error_exits_2(module: Path) -> None:
    p = run("-m", "fusec", "show", f"{module}:block", "--arg", "8x16:float32",
            "--arg", "15x4:float32", "--arg", "4:float32")
    assert p.returncode == 2
    assert "ShapeError" in p.stderr and "Traceback" not in p.stderr


def test_main_in_process(module: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fusec.cli import main, parse_spec

    assert parse_spec("64x512:float32").shape == (64, 512)
    assert parse_spec("64,512:int32").dtype == "int32"
    assert parse_spec("scalar:bool").shape == ()
    assert main(["show", f"{module}:block", "--arg", "bad"]) == 2
    assert "bad --arg" in capsys.readouterr().err
