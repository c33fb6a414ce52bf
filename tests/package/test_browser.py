"""The lessons work in a real browser: JupyterLab + headless Chromium run a lesson end to end.

One JupyterLab server on 127.0.0.1 (a free port, a token, ``--no-browser``), over a temporary
copy of ``lessons/`` (so autosave cannot touch the committed notebooks), and one headless
Chromium, driven through its chromedriver with the W3C WebDriver protocol (plain HTTP, no extra
Python package), serve every lesson of this module in turn. JupyterLab's page is loaded once
(parsing and starting its scripts took some seconds of the two cores per lesson when each lesson
loaded the page anew); each lesson is then opened in it (``docmanager:open``, the previous
lesson's notebook closed first, so nothing of its layout stays), runs every cell, and must show no
kernel error, a plotly figure and an ipywidgets control (each wait is one WebDriver call, the
page checking the notebook's state every 0.1 s: ``WAIT_JS``); then its kernel (and the rank
pools it started) is shut down. The kernels run the lessons at their test size
(``WORKBOOK_LESSONS_TEST_SIZE=1``, as ``test_notebooks.py`` does). The lessons: the first
one (collectives on ranks), lesson 8 (profiler traces, a benchmark, a widget panel), lesson 9
(training steps on ranks, bucket timelines, memory figures, a widget), lessons 10 to 13
(pipeline schedules, ring attention, interleaved and zero-bubble schedules, MoE all-to-alls, on
ranks). These lessons are therefore not run a second
time through nbclient (``test_notebooks.BROWSER_RUN``) where this test can run. A screenshot per
lesson is kept in ``tests/artifacts/``. JupyterLab and Chromium are stopped at the end, pass or
fail.

Skipped where no Chromium or chromedriver is installed (CI installs Debian's ``chromium`` and
``chromium-driver``).
"""
from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from workbook.runtime.multinode import free_port

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
LESSONS = ["01_collectives.ipynb", "08_tp_overlap.ipynb", "09_dp_overlap.ipynb",
           "10_pp_overlap.ipynb", "11_cp_ring.ipynb", "12_pp_schedules.ipynb",
           "13_ep_overlap.ipynb"]
CHROMIUM = shutil.which("chromium") or (
    "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
CHROMEDRIVER = shutil.which("chromedriver") or (
    "/usr/bin/chromedriver" if Path("/usr/bin/chromedriver").exists() else None)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--no-first-run", "--window-size=1400,1100"]
RUN_TIMEOUT_S = 300

pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="no Chromium/chromedriver (apt-get install chromium chromium-driver)")


def _http(method: str, url: str, body=None, timeout: float = 60.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def _wait_until(what: str, check, timeout: float, every: float = 0.5):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")


class WebDriver:
    """The few W3C WebDriver commands this test needs, over HTTP."""

    def __init__(self, base: str, user_data_dir: str):
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": CHROMIUM, "args": CHROMIUM_FLAGS + [f"--user-data-dir={user_data_dir}"]}}}}
        self.base = base
        self.session = _http("POST", f"{base}/session", caps)["value"]["sessionId"]

    def _cmd(self, method, path, body=None, timeout=60.0):
        return _http(method, f"{self.base}/session/{self.session}{path}", body, timeout)["value"]

    def get(self, url):
        self._cmd("POST", "/url", {"url": url})

    def js(self, script, *args):
        return self._cmd("POST", "/execute/sync", {"script": script, "args": list(args)})

    def js_async(self, script, *args, timeout: float = 60.0):
        """``script`` as the body of an async function; its value once its promise settles."""
        body = ("const done = arguments[arguments.length - 1];"
                f"(async () => {{ {script} }})().then(done, e => done({{error: String(e)}}));")
        self._cmd("POST", "/timeouts", {"script": int(timeout * 1000)})
        value = self._cmd("POST", "/execute/async", {"script": body, "args": list(args)},
                          timeout=timeout + 10)
        if isinstance(value, dict) and set(value) == {"error"}:
            raise AssertionError(f"in the browser: {value['error']}")
        return value

    def screenshot(self, path: Path):
        path.write_bytes(base64.b64decode(self._cmd("GET", "/screenshot")))

    def quit(self):
        try:
            _http("DELETE", f"{self.base}/session/{self.session}", timeout=20)
        except Exception:                                   # noqa: BLE001 - cleanup
            pass


def _stop(proc: subprocess.Popen | None, grace: float = 10.0) -> None:
    """Stop a process started in its own session, and everything in its process group."""
    if proc is None or proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# The notebook's state, read through the JupyterLab application object (exposed with
# --LabApp.expose_app_in_browser): kernel status, cells run, errors, and what was drawn.
# The shell's current widget follows the window's focus, which a headless browser may never
# give: without it, the notebook is the main-area widget that has a session.
STATE_JS = """
const app = window.jupyterapp;
const cur = app && app.shell.currentWidget;
const w = app && (cur && cur.sessionContext ? cur      // not a Launcher the empty area opened
                  : Array.from(app.shell.widgets('main')).find(x => x.sessionContext));
if (!w || !w.content || !w.sessionContext || !w.sessionContext.session) return null;
const kernel = w.sessionContext.session.kernel;
const cells = w.content.model.cells;
let code = 0, done = 0, errors = [];
for (let i = 0; i < cells.length; i++) {
  const c = cells.get(i);
  if (c.type !== 'code') continue;
  code += 1;
  if (c.executionCount) done += 1;
  for (let j = 0; j < c.outputs.length; j++) {
    const o = c.outputs.get(j);                // only an error output is serialised
    if (o.type === 'error') { const e = o.toJSON(); errors.push(e.ename + ': ' + e.evalue); }
  }
}
return {status: kernel ? kernel.status : 'none', code: code, done: done, errors: errors,
        plots: document.querySelectorAll('.js-plotly-plot .main-svg').length,
        widgets: document.querySelectorAll('.jp-OutputArea-output .widget-slider, '
                                           + '.jp-OutputArea-output .widget-dropdown').length};
"""

# Waiting for a state, inside the page: STATE_JS every ``every`` ms until ``until(state)`` holds or
# ``seconds`` pass; then {ok, state} (the last state read). One WebDriver call per wait, where a
# poll from Python cost an HTTP round trip through chromedriver four or five times a second.
WAIT_JS = """
const [until, seconds, every] = arguments;
const read = new Function(%s);
const holds = new Function('s', 'return (' + until + ');');
const deadline = performance.now() + 1000 * seconds;
let s = null;
for (;;) {
  try { s = read(); } catch (e) { s = null; }
  if (s && holds(s)) return {ok: true, state: s};
  if (performance.now() >= deadline) return {ok: false, state: s};
  await new Promise(r => setTimeout(r, every));
}
""" % json.dumps(STATE_JS)


# A lesson opened in the page already loaded: every notebook of the main area closed first (marked
# saved, so that no "save your work?" dialog stops it; its kernel was shut down already), then
# the lesson opened and made the shell's current widget.
OPEN_JS = """
const app = window.jupyterapp;
for (const w of Array.from(app.shell.widgets('main'))) {
  if (w.context && w.context.model) w.context.model.dirty = false;
  w.dispose();
}
const w = await app.commands.execute('docmanager:open', {path: arguments[0], factory: 'Notebook'});
await w.context.ready;
app.shell.activateById(w.id);
return w.id;
"""

# after a scroll, two animation frames: the page has painted what the screenshot will show
PAINTED_JS = """
await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
return true;
"""


def _wait_in_page(driver: "WebDriver", what: str, until: str, timeout: float,
                  every_ms: int = 100) -> dict:
    """The notebook's state (STATE_JS) once the JavaScript condition ``until`` (on ``s``) holds,
    waited for in the page (WAIT_JS), checked every ``every_ms`` ms; an AssertionError naming
    ``what`` and the last state after ``timeout`` seconds."""
    got = driver.js_async(WAIT_JS, until, timeout, every_ms, timeout=timeout + 30)
    if not got["ok"]:
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what} "
                             f"(last: {got['state']!r})")
    return got["state"]


class Browser:
    """One JupyterLab server and one Chromium session, shared by every lesson of the module."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.work = tmp_path / "lessons"
        shutil.copytree(ROOT / "lessons", self.work,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        self.lab = self.driver_proc = self.driver = None
        self.log = open(tmp_path / "jupyterlab.log", "w")

    def start(self) -> "Browser":
        env = dict(os.environ, WORKBOOK_LESSONS_NO_GRADE="1", WORKBOOK_LESSONS_TEST_SIZE="1",
                   JUPYTER_RUNTIME_DIR=str(self.tmp / "rt"), JUPYTER_CONFIG_DIR=str(self.tmp / "cfg"))
        self.lab = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
             f"--port={self.port}", f"--IdentityProvider.token={self.token}",
             f"--ServerApp.root_dir={self.work}", "--LabApp.expose_app_in_browser=True",
             f"--LabApp.workspaces_dir={self.tmp / 'ws'}", "--ServerApp.port_retries=0",
             "--allow-root",                                   # CI containers run as root
             "--LabApp.extension_manager=readonly",
             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             # no language servers to look for (jupyter_lsp's search took seconds of the start)
             # nor terminals: the lessons use neither
             '--ServerApp.jpserver_extensions={"jupyter_lsp": False, '
             '"jupyter_server_terminals": False}'],
            cwd=self.work, env=env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)
        _wait_until("JupyterLab to answer", lambda: self.api("GET", "status", timeout=5), 90)
        dport = free_port()
        self.driver_proc = subprocess.Popen([CHROMEDRIVER, f"--port={dport}"],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                            start_new_session=True)
        dbase = f"http://127.0.0.1:{dport}"
        _wait_until("chromedriver",
                    lambda: _http("GET", f"{dbase}/status", timeout=5)["value"]["ready"], 30)
        self.driver = WebDriver(dbase, str(self.tmp / "chromium-profile"))
        # the page, once, in a workspace of its own; lessons are opened in it (OPEN_JS)
        self.driver.get(f"{self.base}/lab/workspaces/lessons?reset&token={self.token}")
        _wait_until("JupyterLab's page to start", lambda: self.driver.js(
            "const a = window.jupyterapp; return !!(a && a.shell && a.commands"
            " && a.commands.hasCommand('docmanager:open')"
            " && a.commands.hasCommand('notebook:run-all-cells'));"), 120)
        self.driver.js_async("await window.jupyterapp.restored; return true;", timeout=120)
        return self

    def api(self, method: str, path: str, timeout: float = 20.0):
        return _http(method, f"{self.base}/api/{path}?token={self.token}", timeout=timeout)

    def shut_kernels(self) -> None:
        """Every kernel (and its rank pools) stopped, so the next lesson starts with free memory."""
        try:
            for kernel in self.api("GET", "kernels") or []:
                self.api("DELETE", f"kernels/{kernel['id']}", timeout=60)
        except Exception:                                   # noqa: BLE001 - cleanup
            pass

    def stop(self) -> None:
        if self.driver is not None:
            self.driver.quit()
        _stop(self.driver_proc)
        if self.lab is not None and self.lab.poll() is None:
            try:                                       # shuts its kernels down, then itself
                self.api("POST", "shutdown", timeout=20)
                self.lab.wait(timeout=30)
            except Exception:                           # noqa: BLE001 - fall back to signals
                pass
        _stop(self.lab)
        self.log.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Browser(tmp_path_factory.mktemp("browser"))
    try:
        yield b.start()
    finally:
        b.stop()


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda name: name.split("_")[0])
def test_lesson_runs_in_chromium(browser, lesson):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"browser_{Path(lesson).stem}.png"
    driver = browser.driver
    try:
        # in the page loaded once: the previous lesson's notebook closed, this one opened
        driver.js_async(OPEN_JS, lesson, timeout=120)
        _wait_in_page(driver, "the notebook and its kernel", "s.status === 'idle'", 120)
        driver.js("window.jupyterapp.commands.execute('notebook:run-all-cells'); return true;")
        state = _wait_in_page(driver, "every cell to run", "s.errors.length > 0 || "
                              "(s.done === s.code && s.status === 'idle')", RUN_TIMEOUT_S)
        # the widget panel re-renders its figure asynchronously: give the renderers a moment
        if not state["errors"]:
            state = _wait_in_page(driver, "a plotly figure and a widget",
                                  "s.plots > 0 && s.widgets > 0", 30)
        driver.js("const w = document.querySelector('.jp-OutputArea-output .widget-dropdown');"
                  "if (w) w.scrollIntoView({block: 'start'}); return true;")   # controls + figure
        driver.js_async(PAINTED_JS)
        driver.screenshot(shot)
        assert not state["errors"], f"{lesson} raised in the browser: {state['errors']}"
        assert state["plots"] > 0, f"no plotly figure rendered in {lesson}: {state}"
        assert state["widgets"] > 0, f"no ipywidgets control rendered in {lesson}: {state}"
        assert shot.stat().st_size > 10_000, f"screenshot {shot} looks empty"
    finally:
        browser.shut_kernels()
