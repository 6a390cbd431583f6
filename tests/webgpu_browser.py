"""A real browser for the export tests: Debian's Chromium, headless, driven by Playwright's Python
package, with WebGPU on a software adapter (SwiftShader), serving exports over HTTP.

Chromium comes from Debian (``apt-get install chromium``; ``.ci/setup.sh`` installs it): browsers
cannot be downloaded here, so Playwright launches it by path. Without it the browser tests fail
(they never skip: a skipped browser test would prove nothing).

Why these flags: ``--enable-unsafe-webgpu`` turns WebGPU on where Chrome's GPU blocklist would
leave it off (no GPU, Linux); ``--use-webgpu-adapter=swiftshader`` gives Dawn's CPU Vulkan
(lavapipe did not work: Chrome's Vulkan set-up on it fails with "samplerYcbcrConversion is not
supported"); the rest keep Chromium from reaching for the network, which this machine refuses.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_ARGS = [
    "--no-sandbox", "--enable-unsafe-webgpu", "--use-webgpu-adapter=swiftshader",
    "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]


def chromium_path() -> str:
    """The Chromium binary: $FUSEC_CHROMIUM, else Debian's."""
    for cand in (os.environ.get("FUSEC_CHROMIUM"), shutil.which("chromium"),
                 "/usr/bin/chromium"):
        if cand and Path(cand).exists():
            return cand
    pytest.fail("the export browser tests need Chromium: apt-get install chromium (bash "
                ".ci/setup.sh installs it), or set FUSEC_CHROMIUM to a Chromium binary")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-store")  # exports are rewritten between tests
        super().end_headers()


class Site:
    """A directory served on localhost; exports are saved into subdirectories."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "blank.html").write_text("<!doctype html><meta charset=utf-8>"
                                         "<link rel=icon href='data:,'><title>blank</title>")
        handler = functools.partial(_Quiet, directory=str(root))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    s = Site(tmp_path_factory.mktemp("web"))
    yield s
    s.close()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    path = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, site: Site) -> Iterator[Any]:
    """A fresh page on the site's blank document; its console is kept in ``page.console``."""
    ctx = browser.new_context()
    pg = ctx.new_page()
    pg.console = []  # type: ignore[attr-defined]
    pg.on("console", lambda m: pg.console.append(f"{m.type}: {m.text}"))
    pg.goto(site.url + "blank.html")
    yield pg
    ctx.close()


# Runs in the page: load the export at `url`, run it on `inputs` (a list, in the model's input
# order), return the outputs flattened to plain arrays with their structure, or the error.
RUN_JS = """
async ([url, inputs, runs]) => {
  try {
    const { load } = await import(url + "model.js");
    const model = await load(url);
    let out;
    for (let i = 0; i < runs; i++) out = await model.run(inputs);
    const plain = (o) => o === null ? null : ArrayBuffer.isView(o) ? Array.from(o)
      : Array.isArray(o) ? o.map(plain)
      : Object.fromEntries(Object.entries(o).map(([k, v]) => [k, plain(v)]));
    const kinds = (o) => o === null ? null : ArrayBuffer.isView(o) ? o.constructor.name
      : Array.isArray(o) ? o.map(kinds)
      : Object.fromEntries(Object.entries(o).map(([k, v]) => [k, kinds(v)]));
    // the leaves in the manifest's order (its output structure walked as model.js builds it)
    const flat = (t, o) => t === 0 ? [Array.from(o)] : t === null ? []
      : t.tuple ? t.tuple.flatMap((c, i) => flat(c, o[i]))
      : t.list ? t.list.flatMap((c, i) => flat(c, o[i]))
      : t.dict.flatMap(([k, c]) => flat(c, o[k]));
    return { out: plain(out), leaves: flat(model.manifest.out_tree, out), kinds: kinds(out),
             errors: model.errors };
  } catch (e) {
    return { error: String(e && e.message || e), name: e && e.name };
  }
}
"""


def run_in_browser(page: Any, site: Site, name: str, inputs: list[Any], runs: int = 1
                   ) -> dict[str, Any]:
    """Run the export saved in ``site.root / name`` in ``page``; inputs as lists."""
    return page.evaluate(RUN_JS, [f"{site.url}{name}/", inputs, runs])  # type: ignore[no-any-return]
