"""The course site: it builds, and every page of it works in a real browser.

One build (``workbook.site.build``, as ``python -m workbook.site build`` runs it) into a temporary
folder, with one lesson given as "executed": a copy of the lesson with a plotly figure and an
ipywidgets control in its outputs, made without a kernel, so the build's handling of saved
outputs is exercised in seconds. The site is served on 127.0.0.1 by a thread of this process and
opened in headless Chromium through chromedriver (the W3C WebDriver protocol over plain HTTP, as
``test_browser.py`` drives it). Every page must load with no error in the browser's console,
every figure on it (an image, an SVG, a plotly plot) must be drawn at a size above zero, and
every link between pages must reach a page (and the anchor it names) that exists.

Skipped, with the reason, where MkDocs and its plugins or Chromium and chromedriver are missing
(``pip install -e '.[dev]'``; ``apt-get install chromium chromium-driver``).
"""
from __future__ import annotations

import functools
import http.server
import json
import re
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

for _mod in ("mkdocs", "material", "mkdocs_jupyter", "latex2mathml", "nbformat"):
    pytest.importorskip(_mod, reason=f"no {_mod}: the site tools are in the dev extra "
                                     f"(pip install -e '.[dev]')")

from test_browser import (CHROMEDRIVER, CHROMIUM, CHROMIUM_FLAGS, _http,  # noqa: E402
                          _stop, _wait_until)

from workbook import site  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXECUTED_LESSON = "01_collectives.ipynb"
needs_chromium = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="no Chromium/chromedriver (apt-get install chromium chromium-driver)")


def _executed_copy(dest: Path) -> None:
    """The lesson ``EXECUTED_LESSON`` as if it had been run: a plotly figure and a widget in the
    outputs of its first code cell (no kernel needed)."""
    import nbformat
    import plotly.graph_objects as go
    nb = nbformat.read(ROOT / "lessons" / EXECUTED_LESSON, as_version=4)
    fig = go.Figure(go.Bar(x=["rank 0", "rank 1"], y=[3, 4]), layout={"height": 320})
    figure = json.loads(fig.to_json())
    cell = next(c for c in nb.cells if c.cell_type == "code")
    cell.execution_count = 1
    cell.outputs = [
        nbformat.v4.new_output("display_data", data={
            "application/vnd.plotly.v1+json": figure, "text/plain": "Figure()"}),
        nbformat.v4.new_output("display_data", data={
            "application/vnd.jupyter.widget-view+json": {"model_id": "0" * 32, "version_major": 2,
                                                         "version_minor": 0},
            "text/plain": "IntSlider(value=1)"}),
    ]
    dest.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest / EXECUTED_LESSON)


@pytest.fixture(scope="module")
def built():
    tmp = Path(tempfile.mkdtemp(prefix="workbook-site-test-"))
    try:
        _executed_copy(tmp / "executed")
        t0 = time.perf_counter()
        out = site.build(tmp / "site", executed_dir=tmp / "executed")
        print(f"site built in {time.perf_counter() - t0:.1f} s")
        yield out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _pages(out: Path) -> list[str]:
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*.html"))


def test_site_has_every_page_and_loads_nothing_from_the_network(built):
    pages = set(_pages(built))
    lessons = [p.stem for p in site.lesson_notebooks()]
    expected = {"index.html", "lessons/index.html"} | {f"lessons/{n}.html" for n in lessons}
    expected |= {p.with_suffix(".html").name for p in (ROOT / "docs").glob("*.md")}
    assert not expected - pages, f"pages missing from the site: {sorted(expected - pages)}"
    remote = []
    for page in pages:
        html = (built / page).read_text()
        remote += [f"{page}: {src}" for src in re.findall(r'<script[^>]*\ssrc="([^"]+)"', html)
                   if re.match(r"(https?:)?//", src)]
        remote += [f"{page}: {href}" for href in re.findall(
            r'<link[^>]*rel="stylesheet"[^>]*href="([^"]+)"', html) if re.match(r"(https?:)?//", href)]
    assert not remote, "pages load scripts or styles from the network:\n" + "\n".join(remote)
    assert 'src="figures/layers.svg"' in (built / "architecture.html").read_text()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


# What a page shows: the content area's figures (an image must have loaded), its links, its ids.
# Icons the theme hides until hovered (copy buttons, permalinks) are not figures of the page.
PAGE_JS = r"""
const content = document.querySelector('.md-content') || document.body;
const skip = 'button, clipboard-copy, .md-clipboard, .md-content__button, .headerlink, .zeroclipboard-container';
const figures = [];
for (const el of content.querySelectorAll('img, svg, figure, .js-plotly-plot')) {
  if (el.tagName.toLowerCase() === 'svg' && (el.closest(skip) || el.closest('.js-plotly-plot'))) continue;
  const r = el.getBoundingClientRect();
  const loaded = el.tagName.toLowerCase() !== 'img' || (el.complete && el.naturalWidth > 0);
  figures.push({what: el.tagName.toLowerCase() + (el.getAttribute('src') ? ' ' + el.getAttribute('src') : '')
                      + (el.id ? '#' + el.id : ''),
                w: r.width, h: r.height, loaded: loaded});
}
return {ready: document.readyState,
        figures: figures,
        plotly: content.querySelectorAll('.js-plotly-plot .main-svg').length,
        links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
        ids: Array.from(document.querySelectorAll('[id]')).map(e => e.id)};
"""


class Chromium:
    """One headless Chromium through chromedriver, its console log kept (goog:loggingPrefs)."""

    def __init__(self, profile: Path):
        import subprocess
        from workbook.runtime.multinode import free_port
        port = free_port()
        self.proc = subprocess.Popen([CHROMEDRIVER, f"--port={port}"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self.base = f"http://127.0.0.1:{port}"
        _wait_until("chromedriver", lambda: _http("GET", f"{self.base}/status",
                                                  timeout=5)["value"]["ready"], 30)
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome", "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {"binary": CHROMIUM,
                                   "args": CHROMIUM_FLAGS + [f"--user-data-dir={profile}"]}}}}
        self.session = _http("POST", f"{self.base}/session", caps)["value"]["sessionId"]

    def _cmd(self, method, path, body=None):
        return _http(method, f"{self.base}/session/{self.session}{path}", body)["value"]

    def get(self, url):
        self._cmd("POST", "/url", {"url": url})

    def js(self, script):
        return self._cmd("POST", "/execute/sync", {"script": script, "args": []})

    def console_errors(self) -> list[str]:
        entries = self._cmd("POST", "/se/log", {"type": "browser"})
        return [e["message"] for e in entries if e.get("level") == "SEVERE"]

    def quit(self):
        try:
            _http("DELETE", f"{self.base}/session/{self.session}", timeout=20)
        except Exception:                                   # noqa: BLE001 - cleanup
            pass
        _stop(self.proc)


@needs_chromium
def test_every_page_works_in_chromium(built, tmp_path):
    handler = functools.partial(_Quiet, directory=str(built))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    browser = None
    problems, seen, links = [], {}, {}
    try:
        browser = Chromium(tmp_path / "profile")
        browser.console_errors()                            # start from an empty log
        for page in _pages(built):
            browser.get(base + page)
            state = _wait_until(f"{page} to load", lambda: (
                lambda s: s if s and s["ready"] == "complete" else None)(browser.js(PAGE_JS)), 30,
                every=0.1)
            if page == f"lessons/{Path(EXECUTED_LESSON).stem}.html":
                state = _wait_until("the plotly figure to draw", lambda: (
                    lambda s: s if s["plotly"] else None)(browser.js(PAGE_JS)), 20, every=0.2)
            seen[page] = set(state["ids"])
            problems += [f"{page}: console: {m}" for m in browser.console_errors()]
            problems += [f"{page}: {f['what']} drawn at {f['w']:.0f} x {f['h']:.0f}"
                         + ("" if f["loaded"] else " (not loaded)")
                         for f in state["figures"] if not (f["w"] > 0 and f["h"] > 0 and f["loaded"])]
            for href in state["links"]:
                if href.startswith(base):
                    links.setdefault(href, page)
        # every link between pages reaches a page that exists, and the anchor it names
        for href, page in sorted(links.items()):
            target, _, anchor = href[len(base):].partition("#")
            target = urllib.parse.unquote(target) or "index.html"
            if target.endswith("/"):
                target += "index.html"
            if target in seen:
                if anchor and urllib.parse.unquote(anchor) not in seen[target]:
                    problems.append(f"{page}: link {href}: no element #{anchor} on {target}")
                continue
            try:
                with urllib.request.urlopen(href.partition("#")[0], timeout=10) as resp:
                    ok = resp.status == 200
            except urllib.error.URLError:
                ok = False
            if not ok:
                problems.append(f"{page}: link {href} is broken")
    finally:
        if browser is not None:
            browser.quit()
        server.shutdown()
        server.server_close()
    assert seen, "no page was opened"
    lesson = f"lessons/{Path(EXECUTED_LESSON).stem}.html"
    assert lesson in seen, f"{lesson} was not built"
    assert not problems, f"{len(problems)} problems on the site:\n" + "\n".join(problems)
