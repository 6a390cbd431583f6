"""The exported transformer block, timed from Python and in a browser on the same machine.

    python bench/export_browser.py [--out DIR] [--runs 20] [--small] [--chromium PATH]
                                   [--node PATH]

Exports a 2-layer pre-norm transformer (the block tests/test_export_web.py checks, at MiniLM's
width: d 384, 12 heads, MLP 1536; batch 8 x 128 tokens; --small: 2 x 19 x 48) to a web
directory, then times one call, inputs given as host arrays and outputs read back to the host
(what the browser's ``model.run`` does), median of ``--runs``:
- from Python: ``fusec.load_exported(dir)(x)`` and ``numpy.asarray`` of the result; also with the
  input already on the device and only the output read back;
- in headless Chromium (Playwright), if it can be started: ``await model.run({x})``, timed in the
  page with ``performance.now()``; the adapter the page got is reported (SwiftShader unless
  Chrome can use the GPU's Vulkan driver);
- under Node with Dawn (``--node``: a node binary that can import the npm package ``webgpu``;
  bench/export_node.mjs), the same model.js on the machine's GPU, where no Chromium can run.
Prints one JSON object (and writes it to DIR/timings.json).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_cases import block_weights, transformer  # noqa: E402  (the tests' block)
from timing import median_wall  # noqa: E402

import fusec  # noqa: E402
import fusec.numpy as fnp  # noqa: E402

GPU_ARGS = ["--no-sandbox", "--enable-unsafe-webgpu", "--enable-features=Vulkan",
            "--use-vulkan=native", "--use-angle=vulkan", "--ignore-gpu-blocklist",
            "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"]


def _median_ms(fn: Any, runs: int) -> float:
    return 1e3 * median_wall(fn, runs, warmup=1)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _serving(d: Path) -> Iterator[str]:
    """``d`` served over HTTP on localhost while the block runs; yields its URL."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                          functools.partial(_Quiet, directory=str(d)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/"
    finally:
        srv.shutdown()


def browser_time(d: Path, name: str, x: np.ndarray, runs: int, chromium: str, args: list[str]
                 ) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    with _serving(d) as root:
        url = f"{root}{name}/"
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=chromium, headless=True, args=args)
            pg = b.new_page()
            pg.goto(url + "index.html")
            r = pg.evaluate("""async ([url, x, runs]) => {
                const { load } = await import(url + "model.js");
                const a = await navigator.gpu.requestAdapter({powerPreference: "high-performance"});
                const info = a.info || {};
                const model = await load(url, { adapter: a });
                const input = Float32Array.from(x);
                let out = await model.run([input]);
                const ts = [];
                for (let i = 0; i < runs; i++) {
                    const t0 = performance.now();
                    out = await model.run([input]);
                    ts.push(performance.now() - t0);
                }
                ts.sort((p, q) => p - q);
                return { ms: ts[ts.length >> 1], first: Array.from(out.slice(0, 8)),
                         adapter: [info.vendor, info.architecture, info.device,
                                   info.description].filter((s) => s).join(" ") };
            }""", [url, x.ravel().tolist(), runs])
            b.close()
        return r  # type: ignore[no-any-return]


def node_time(d: Path, name: str, x: np.ndarray, runs: int, node: str) -> dict[str, Any]:
    import subprocess

    (d / name / "x.bin").write_bytes(x.astype("<f4").tobytes())
    with _serving(d) as root:
        p = subprocess.run([node, str(Path(__file__).with_name("export_node.mjs")),
                            f"{root}{name}/", str(d / name), str(runs)],
                           capture_output=True, text=True, timeout=300)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"error": f"node exited {p.returncode}: {p.stderr[-1500:]}"}
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--chromium", default=os.environ.get("FUSEC_CHROMIUM") or
                    shutil.which("chromium") or "")
    ap.add_argument("--swiftshader", action="store_true",
                    help="give the browser SwiftShader (the CPU) instead of the GPU")
    ap.add_argument("--node", default="", help="a node binary (with the npm package webgpu)")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    if a.small:
        d, ff, heads, shape = 48, 96, 4, (2, 19, 48)
    else:
        d, ff, heads, shape = 384, 1536, 12, (8, 128, 384)
    ws = block_weights(rng, d=d, ff=ff, layers=2)
    x = rng.standard_normal(shape).astype(np.float32)
    out = Path(a.out or tempfile.mkdtemp(prefix="fusec-export-bench-"))
    exp = fusec.export(lambda x: transformer(fnp, ws, x, heads=heads), fusec.ShapeDtype(shape))
    exp.save(out / "block", target="web")
    f = fusec.load_exported(out / "block")
    xd = fusec.device_put(x)
    res: dict[str, Any] = {
        "device": str(fusec.default_device()), "shape": list(shape), "d": d, "ff": ff,
        "kernels": len(exp.kernels), "runs": a.runs,
        "python_host_ms": _median_ms(lambda: np.asarray(f(x)), a.runs),
        "python_device_input_ms": _median_ms(lambda: np.asarray(f(xd)), a.runs),
    }
    want = np.asarray(f(x)).ravel()[:8]
    if a.chromium:
        args = GPU_ARGS if not a.swiftshader else [
            g for g in GPU_ARGS if "vulkan" not in g.lower()] + ["--use-webgpu-adapter=swiftshader"]
        try:
            r = browser_time(out, "block", x, a.runs, a.chromium, args)
            res.update(browser_ms=r["ms"], browser_adapter=r["adapter"],
                       browser_max_diff_first8=float(np.max(np.abs(np.array(r["first"]) - want))))
        except Exception as exc:  # report why, with the Python figures
            res["browser_error"] = f"{type(exc).__name__}: {exc}"[:2000]
    else:
        res["browser_error"] = "no Chromium found (set --chromium or FUSEC_CHROMIUM)"
    if a.node:
        r = node_time(out, "block", x, a.runs, a.node)
        if "error" in r:
            res["node_error"] = r["error"]
        else:
            res.update(node_dawn_ms=r["ms"], node_adapter=r["adapter"], node_errors=r["errors"],
                       node_max_diff_first8=float(np.max(np.abs(np.array(r["first"]) - want))))
    (out / "timings.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
