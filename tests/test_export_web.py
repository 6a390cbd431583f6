"""Exports run in a real browser: headless Chromium with WebGPU (SwiftShader), driven by
Playwright (see tests/webgpu_browser.py). The outputs must equal what the same artifact gives in
Python within float32 rounding; bad inputs and small adapters get clear errors in the page."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from export_cases import CASES, Case, check, leaves
from webgpu_browser import Site, browser, page, run_in_browser, site  # noqa: F401

import fusec
import fusec.numpy as fnp

S = fusec.ShapeDtype


def _save(site: Site, name: str, f: Any, args: tuple[Any, ...], **kw: Any) -> fusec.Exported:
    exp = fusec.export(f, *[S(a.shape, a.dtype) for a in args], **kw)
    exp.save(site.root / name, target="web")
    return exp


def _js_value(a: np.ndarray) -> list[Any]:
    return [bool(v) for v in a.ravel()] if a.dtype == bool else a.ravel().tolist()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_browser_matches_python(case: Case, rng: np.random.Generator, site: Site,
                                page: Any) -> None:
    f, args, ref = case.make(rng)
    _save(site, case.name, f, args, tuning=case.tuning)
    py = leaves(fusec.load_exported(site.root / case.name)(*args))
    r = run_in_browser(page, site, case.name, [_js_value(a) for a in args], runs=2)
    assert "error" not in r, (r, page.console)
    assert r["errors"] == [], r["errors"]
    got = r["leaves"]
    want = leaves(ref(*args))
    assert len(got) == len(py) == len(want)
    for i, (g, p, w) in enumerate(zip(got, py, want)):
        p = np.asarray(p)
        g = np.asarray(g, dtype=np.float64).reshape(p.shape)
        check(g, w, f"{case.name} output {i}: browser vs numpy")
        # the same kernels on another adapter: equal within float32 rounding of the results
        if p.dtype.kind == "f":
            scale = max(float(np.nanmax(np.abs(np.where(np.isfinite(p), p, 0)))), 1.0)
            np.testing.assert_allclose(g, p, rtol=1e-5, atol=1e-6 * scale,
                                       err_msg=f"{case.name} output {i}: browser vs Python")
            np.testing.assert_array_equal(np.isnan(g), np.isnan(p))
        else:
            np.testing.assert_array_equal(g, p.astype(np.float64))
    if case.name == "dtypes":  # typed arrays of the outputs' dtypes, in the output structure
        assert r["kinds"] == {"pair": ["Float32Array", None], "pos": "Uint8Array",
                              "sum": "Int32Array", "u": "Uint32Array"}


def test_bad_input_is_a_clear_error(site: Site, page: Any) -> None:
    _save(site, "bad_input", lambda x, k: x * 2.0 + k, (np.zeros(5, np.float32),
                                                         np.zeros(5, np.int32)))
    r = run_in_browser(page, site, "bad_input", [[1, 2, 3], [1] * 5])
    assert r.get("name") == "FusecWebError"
    assert "input 'x': expected 5 values (float32, shape [5]); got 3" in r["error"]
    r = page.evaluate("""async (url) => {
        const { load } = await import(url + "model.js");
        const m = await load(url);
        try { await m.run({ x: new Float32Array(5) }); } catch (e) { return e.message; }
    }""", f"{site.url}bad_input/")
    assert r == "run: missing input 'k'"


def test_adapter_too_small_is_a_clear_error(site: Site, page: Any) -> None:
    d = site.root / "too_big"
    _save(site, "too_big", lambda x: x + 1.0, (np.zeros(3, np.float32),))
    m = json.loads((d / "manifest.json").read_text())
    m["requires"]["limits"]["maxStorageBufferBindingSize"] = 2 ** 50
    (d / "manifest.json").write_text(json.dumps(m))
    r = run_in_browser(page, site, "too_big", [[1, 2, 3]])
    assert "too small for this model" in r["error"]
    assert f"maxStorageBufferBindingSize >= {2 ** 50}" in r["error"]
    assert any("too small for this model" in line for line in page.console), page.console


def test_float16_needs_shader_f16(site: Site, page: Any) -> None:
    _save(site, "half", lambda x: x * 2, (np.zeros(4, np.float16),))
    has_f16 = page.evaluate(
        "async () => (await navigator.gpu.requestAdapter()).features.has('shader-f16')")
    r = run_in_browser(page, site, "half", [[1, 2, 3, 4]])
    if has_f16:  # (SwiftShader has not: the error path is the one checked on CI)
        assert r["leaves"] == [[2, 4, 6, 8]]
    else:
        assert "feature 'shader-f16' (the program uses float16)" in r["error"]


def test_demo_page_screenshot(rng: np.random.Generator, site: Site, page: Any) -> None:
    """The demo page draws the similarity matrix of unit rows as a heatmap: the screenshot's
    diagonal cells have the colour of the maximum, and the page says it matches Python."""
    from PIL import Image

    x = rng.standard_normal((6, 40)).astype(np.float32)
    x[1] = x[0] + 0.05 * x[1]  # a near pair: one bright off-diagonal cell

    def sim(x: Any) -> Any:
        e = x / fnp.sqrt((x * x).sum(-1, keepdims=True))
        return e @ e.T

    exp = fusec.export(sim, S(x.shape))
    exp.save(site.root / "demo", target="web", sample_inputs=(x,),
             demo={"title": "similarity", "cell": 40, "labels": [f"row {i}" for i in range(6)]})
    page.goto(f"{site.url}demo/index.html")
    page.wait_for_function("window.fusecDemo && window.fusecDemo.done", timeout=120_000)
    res = page.evaluate("window.fusecDemo")
    assert res.get("ok") is True, (res, page.console)
    assert res["maxDiff"] < 1e-5
    assert page.title() == "fusec: similarity"
    assert "matches Python" in page.inner_text("#status")
    png = page.locator("#heatmap").screenshot()
    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    cell = 40
    assert img.shape[0] >= 6 * cell and img.shape[1] >= 6 * cell

    def at(r: int, c: int) -> np.ndarray:
        return img[r * cell + cell // 2, c * cell + cell // 2]

    top = np.array([253, 231, 37])  # the colour scale's top (index.html's STOPS)
    sims = np.corrcoef(x)  # (not the test's check: which off-diagonal cell is brightest)
    for i in range(6):
        assert np.abs(at(i, i) - top).max() <= 3, (i, at(i, i))
    assert np.abs(at(0, 1) - top).max() < np.abs(at(0, 2) - top).max()
    off = [at(i, j) for i in range(6) for j in range(6) if i != j and {i, j} != {0, 1}]
    assert all(np.abs(c - top).max() > 30 for c in off)
    assert sims.shape == (6, 6)


def test_served_files_are_what_python_wrote(site: Site) -> None:
    """(The browser tests read these files over HTTP: the site serves the directory as is.)"""
    import urllib.request
    _save(site, "files", lambda x: x - 1.0, (np.zeros(2, np.float32),))
    with urllib.request.urlopen(f"{site.url}files/manifest.json") as r:
        assert json.loads(r.read())["format"] == "fusec-export"
    assert Path(site.root / "files" / "model.js").read_text().startswith("// fusec web runtime")


def test_sentence_embedding_demo_page(site: Site, page: Any) -> None:
    """examples/export_web.py's page (MiniLM's first layer, to keep it quick on SwiftShader):
    the browser's embeddings and similarity matrix match Python's, and the page draws the
    matrix, its diagonal (each sentence with itself) at the top of the colour scale."""
    import importlib.util

    from PIL import Image

    path = Path(__file__).resolve().parent.parent / "examples" / "export_web.py"
    spec = importlib.util.spec_from_file_location("export_web_example", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.build(site.root / "minilm", layers=1, runs=1)
    page.goto(f"{site.url}minilm/index.html")
    page.wait_for_function("window.fusecDemo && window.fusecDemo.done", timeout=300_000)
    res = page.evaluate("({ok: fusecDemo.ok, maxDiff: fusecDemo.maxDiff, error: fusecDemo.error,"
                        " heatmap: fusecDemo.heatmap, errors: fusecDemo.errors})")
    assert res["ok"] is True, (res, page.console)
    assert res["maxDiff"] < 1e-5 and res["errors"] == []
    n = len(mod.SENTENCES)
    assert (res["heatmap"]["rows"], res["heatmap"]["cols"]) == (n, n)
    cell = res["heatmap"]["cell"]
    img = np.asarray(Image.open(io.BytesIO(page.locator("#heatmap").screenshot())).convert("RGB"))
    top = np.array([253, 231, 37])
    for i in range(n):
        px = img[i * cell + cell // 2, i * cell + cell // 2].astype(int)
        assert np.abs(px - top).max() <= 3, (i, px)
    assert page.inner_text("#labels").startswith(f"0: {mod.SENTENCES[0]}")


SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, -2.5, 0.5, 2.0, 3.0, -3.0,
                    100.0, 1e-30, -1e-30, 1e30], np.float32)
UNARY = {"exp": (fnp.exp, np.exp), "log": (fnp.log, np.log), "log1p": (fnp.log1p, np.log1p),
         "log2": (fnp.log2, np.log2), "expm1": (fnp.expm1, np.expm1), "sqrt": (fnp.sqrt, np.sqrt),
         "sin": (fnp.sin, np.sin), "cos": (fnp.cos, np.cos), "tan": (fnp.tan, np.tan),
         "tanh": (fnp.tanh, np.tanh), "sinh": (fnp.sinh, np.sinh), "cosh": (fnp.cosh, np.cosh),
         "arctan": (fnp.arctan, np.arctan), "arcsin": (fnp.arcsin, np.arcsin),
         "arcsinh": (fnp.arcsinh, np.arcsinh), "sign": (fnp.sign, np.sign),
         "recip": (lambda x: 1.0 / x, lambda x: 1 / x)}
BINARY = {"pow": (lambda x, y: x ** y, np.power), "max": (fnp.maximum, np.maximum),
          "min": (fnp.minimum, np.minimum), "arctan2": (fnp.arctan2, np.arctan2),
          "mod": (fnp.mod, np.mod), "fmod": (fnp.fmod, np.fmod), "div": (fnp.divide, np.divide)}


def test_special_values_match_numpy_in_the_browser(site: Site, page: Any) -> None:
    """NaN, infinities, signed zeros and extreme magnitudes through the transcendental and
    special-cased ops: the browser's WebGPU (SwiftShader) gives numpy's values, as Python's does,
    although WGSL leaves most of them to the implementation (fusec's helpers pin them down).
    sin/cos/tan are checked for |x| < 4096 (beyond, fusec uses the builtins)."""
    xs, ys = (a.ravel() for a in np.meshgrid(SPECIAL, SPECIAL))

    def f(x: Any, y: Any) -> Any:
        return tuple(g(x) for g, _ in UNARY.values()) + tuple(g(x, y) for g, _ in BINARY.values())

    _save(site, "special", f, (xs, ys))
    r = run_in_browser(page, site, "special", [xs.tolist(), ys.tolist()])
    assert "error" not in r, r
    x64, y64 = xs.astype(np.float64), ys.astype(np.float64)
    with np.errstate(all="ignore"):
        refs = [ref(x64) for _, ref in UNARY.values()] + [
            ref(x64, y64) for _, ref in BINARY.values()]
    names = list(UNARY) + list(BINARY)
    py = [np.asarray(a) for a in fusec.load_exported(site.root / "special")(xs, ys)]
    for (name, want), got in zip(list(zip(names, refs)) * 2, r["leaves"] + py):
        g = np.asarray(got, np.float64)
        with np.errstate(all="ignore"):
            w = np.asarray(want, np.float64).astype(np.float32).astype(np.float64)
        keep = np.abs(x64) < 4096 if name in ("sin", "cos", "tan") else np.ones(len(g), bool)
        with np.errstate(invalid="ignore"):
            ok = (g == w) | (np.isnan(g) & np.isnan(w)) | (np.abs(g - w) <= 2e-6 * np.abs(w))
        bad = np.where(keep & ~ok)[0]
        assert bad.size == 0, (name, [(xs[i], ys[i], g[i], w[i]) for i in bad[:5]])
        # signed zeros too, where numpy gives one (but sign's: numpy's sign(+-0) is +0, and
        # lavapipe's compiler, which assumes zeros have no sign, gave -0 for both)
        zero = keep & (w == 0) & (name != "sign")
        assert np.array_equal(np.signbit(g[zero]), np.signbit(w[zero])), name
