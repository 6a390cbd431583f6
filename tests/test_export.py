"""fusec.export, Exported.save and load_exported, from Python (on the test device): the artifact
round-trips and runs the exported kernels without the function; bad use gets clear errors."""

from __future__ import annotations

import json
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
from export_cases import CASES, Case, check, leaves

import fusec
import fusec.numpy as fnp
from fusec import lax, nn

S = fusec.ShapeDtype


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_saved_export_runs_from_python(case: Case, rng: np.random.Generator, tmp_path: Path
                                       ) -> None:
    f, args, ref = case.make(rng)
    exp = fusec.export(f, *[S(a.shape, a.dtype) for a in args], tuning=case.tuning)
    exp.save(tmp_path / "a", target="web")
    loaded = fusec.load_exported(tmp_path / "a")
    got, want = leaves(loaded(*args)), leaves(ref(*args))
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        check(g, w, f"{case.name} output {i}")
    # the artifact's kernels are the export's own, and the same function gives the same files
    assert [k.wgsl for k in loaded.kernels] == [k.wgsl for k in exp.kernels]
    fusec.export(f, *[S(a.shape, a.dtype) for a in args], tuning=case.tuning).save(
        tmp_path / "b", target="web")
    for p in sorted((tmp_path / "a").rglob("*")):
        if p.is_file():
            assert p.read_bytes() == (tmp_path / "b" / p.relative_to(tmp_path / "a")
                                      ).read_bytes(), f"{p.name} differs between two exports"


def test_manifest_describes_the_program(rng: np.random.Generator, tmp_path: Path) -> None:
    w = rng.standard_normal((33, 9)).astype(np.float32)

    def f(x, y):  # type: ignore[no-untyped-def]
        h = nn.relu(x @ w)
        return {"h": h, "s": nn.softmax(h * y[:, None], axis=-1)}

    exp = fusec.export(f, S((17, 33)), S((17,)))
    out = exp.save(tmp_path, target="web")
    m = json.loads((out / "manifest.json").read_text())
    assert (m["format"], m["version"]) == ("fusec-export", 1)
    assert [i["name"] for i in m["inputs"]] == ["x", "y"]
    assert [(o["shape"], o["dtype"]) for o in m["outputs"]] == [([17, 9], "float32")] * 2
    assert m["out_tree"] == {"dict": [["h", 0], ["s", 0]]}
    assert len(m["kernels"]) == len(exp.kernels) == len(m["dispatches"])
    for k in m["kernels"]:
        assert (out / k["file"]).read_text().strip()
        assert all(n > 0 for n in k["workgroup_size"])
    # the captured weight is the one constant, saved as it is
    from safetensors.numpy import load_file
    t = load_file(str(out / "weights.safetensors"))
    np.testing.assert_array_equal(t[m["constants"][0]["tensor"]], w)
    # every binding names a buffer big enough for its value
    sizes = [b["size"] for b in m["buffers"]]
    for d in m["dispatches"]:
        assert all(0 <= b < len(sizes) for b in d["bindings"])
    assert all(sizes[o["buffer"]] >= 17 * 9 * 4 for o in m["outputs"])
    assert m["requires"] == {"features": [], "limits": {}}
    for name in ("model.js", "model.d.ts", "index.html"):
        assert (out / name).stat().st_size > 100


def test_python_target_writes_no_web_files(tmp_path: Path) -> None:
    fusec.export(lambda x: x * 2.0, S((5,))).save(tmp_path)
    assert (tmp_path / "manifest.json").exists() and not (tmp_path / "model.js").exists()
    assert not (tmp_path / "weights.safetensors").exists()  # nothing captured


def test_grid_over_65535_workgroups(rng: np.random.Generator, tmp_path: Path) -> None:
    n = 65536 * 64 + 3
    x = rng.standard_normal(n).astype(np.float32)
    exp = fusec.export(lambda x: fnp.sqrt(fnp.abs(x)) + 1.0, S((n,)))
    assert any(d["grid"][1] > 1 for d in exp.plan.dispatches) or \
        max(d["grid"][0] for d in exp.plan.dispatches) <= 65535
    exp.save(tmp_path)
    got = np.asarray(fusec.load_exported(tmp_path)(x))
    np.testing.assert_allclose(got, np.sqrt(np.abs(x.astype(np.float64))) + 1, rtol=1e-6)


def test_float16_export_requires_shader_f16(rng: np.random.Generator, tmp_path: Path) -> None:
    x = rng.standard_normal(11).astype(np.float16)
    exp = fusec.export(lambda x: x * 2 + 1, S((11,), "float16"))
    assert exp.manifest()["requires"]["features"] == ["shader-f16"]
    exp.save(tmp_path)
    got = np.asarray(fusec.load_exported(tmp_path)(x))
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, (x.astype(np.float32) * 2 + 1).astype(np.float16))


def test_donated_argument(rng: np.random.Generator, tmp_path: Path) -> None:
    f = fusec.gpu_jit(lambda x, y: x * 3.0 + y, donate_argnums=0)
    x, y = (rng.standard_normal(257).astype(np.float32) for _ in range(2))
    fusec.export(f, S((257,)), S((257,))).save(tmp_path, target="web")
    loaded = fusec.load_exported(tmp_path)
    for _ in range(2):  # the buffers are reused
        np.testing.assert_allclose(np.asarray(loaded(x, y)), x.astype(np.float64) * 3 + y,
                                   rtol=1e-6, atol=1e-6)  # (one rounding of x*3 + y)
    assert loaded.manifest()["donated"] == ["x"]
    # a device array given for the donated argument is used up, as with the jitted call
    xd = fusec.device_put(x)
    out = loaded(xd, y)
    np.testing.assert_allclose(np.asarray(out), x.astype(np.float64) * 3 + y, rtol=1e-6,
                               atol=1e-6)
    assert xd.is_deleted
    with pytest.raises(fusec.FusecError, match="donated"):
        np.asarray(xd)


def test_loop_exports_for_python_not_for_the_web(rng: np.random.Generator, tmp_path: Path
                                                 ) -> None:
    def f(x):  # type: ignore[no-untyped-def]
        return lax.fori_loop(0, 50, lambda i, v: v * 0.9 + fnp.sin(v), x)

    exp = fusec.export(f, S((33,)))
    if not any(e.op.value == "loop" for e in exp.program.eqns):
        pytest.fail("expected the compiled program to keep the loop")
    with pytest.raises(fusec.ExportError, match="loop"):
        exp.save(tmp_path / "web", target="web")
    exp.save(tmp_path / "py")
    x = rng.standard_normal(33).astype(np.float32)
    want = x.astype(np.float64)
    for _ in range(50):
        want = want * 0.9 + np.sin(want)
    np.testing.assert_allclose(np.asarray(fusec.load_exported(tmp_path / "py")(x)), want,
                               rtol=1e-4, atol=1e-5)


def test_call_errors_name_the_argument(tmp_path: Path) -> None:
    def f(x, params):  # type: ignore[no-untyped-def]
        return x @ params["w"]

    fusec.export(f, S((3, 4)), {"w": S((4, 2))}).save(tmp_path)
    g = fusec.load_exported(tmp_path)
    x, w = np.ones((3, 4), np.float32), np.ones((4, 2), np.float32)
    np.testing.assert_array_equal(np.asarray(g(x, params={"w": w})), np.full((3, 2), 4.0))
    with pytest.raises(fusec.SignatureError,
                       match=r"params\['w'\].*float32\[4,2\].*float32\[5,2\]"):
        g(x, {"w": np.ones((5, 2), np.float32)})
    with pytest.raises(fusec.SignatureError, match="missing argument.*params"):
        g(x)
    with pytest.raises(fusec.SignatureError, match="no argument 'z'"):
        g(x, {"w": w}, z=1)
    with pytest.raises(fusec.SignatureError, match="exported for the arrays"):
        g(x, {"v": w})


def test_export_errors(tmp_path: Path) -> None:
    with pytest.raises(fusec.ExportError, match="Python scalars"):
        fusec.export(lambda x, s: x * s, S((3,)), 2.0)
    with pytest.raises(fusec.ExportError, match="static arguments"):
        fusec.export(fusec.gpu_jit(lambda x, n: x * n, static_argnums=1), S((3,)), 2)
    Pair = namedtuple("Pair", "a b")
    with pytest.raises(fusec.ExportError, match="Pair"):
        fusec.export(lambda x: Pair(x, x), S((3,)))
    with pytest.raises(fusec.ExportError, match="target"):
        fusec.export(lambda x: x, S((3,))).save(tmp_path, target="wasm")
    with pytest.raises(fusec.ExportError, match="tuning"):
        fusec.export(lambda x: x, S((3,)), tuning="tpu")


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(fusec.ExportError, match="no manifest.json"):
        fusec.load_exported(tmp_path)
    fusec.export(lambda x: x + 1.0, S((3,))).save(tmp_path)
    m = json.loads((tmp_path / "manifest.json").read_text())
    m["version"] = 99
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(fusec.ExportError, match="version 99"):
        fusec.load_exported(tmp_path)
    m["version"], m["format"] = 1, "something-else"
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(fusec.ExportError, match="not a fusec export"):
        fusec.load_exported(tmp_path)


def test_saving_again_replaces_an_earlier_export(tmp_path: Path) -> None:
    w = np.arange(3, dtype=np.float32)
    fusec.export(lambda x: x * w, S((3,))).save(tmp_path, target="web", sample_inputs=(w,))
    fusec.export(lambda x: x + 1.0, S((4,))).save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernels", "manifest.json"]
    np.testing.assert_array_equal(
        np.asarray(fusec.load_exported(tmp_path)(np.ones(4, np.float32))), np.full(4, 2.0))


def test_scalar_constant_and_readable_files(rng: np.random.Generator, tmp_path: Path) -> None:
    c = np.float32(rng.standard_normal())  # a captured numpy scalar: a 0-d constant

    def f(x):  # type: ignore[no-untyped-def]
        return fnp.where(x > 0, x, c) * np.arange(5, dtype=np.float32)

    fusec.export(f, S((5,))).save(tmp_path, sample_inputs=(np.ones(5, np.float32),))
    x = rng.standard_normal(5).astype(np.float32)
    np.testing.assert_allclose(np.asarray(fusec.load_exported(tmp_path)(x)),
                               np.where(x > 0, x, c) * np.arange(5), rtol=1e-6)
    for name in ("weights.safetensors", "samples.safetensors"):
        assert (tmp_path / name).stat().st_mode & 0o044 == 0o044  # a web server may read them
