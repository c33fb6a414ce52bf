"""The trace report in headless Chromium: a 4-rank run of the collectives lab drawn, a 2-rank
run's timeline hovered (bars and the WebGL path) and its bar labels read back from the page, and
the capstone's one picture of a whole step (4 ranks, both configurations) drawn.

Skipped only where no Chromium exists (the test command installs Debian's chromium where it can).
The screenshots are kept as test artifacts: tests/artifacts/collectives_report.png and
capstone_step.png.
"""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from workbook.runtime import launch
from workbook.grading import load_lab
from workbook.trace.capture import rank_trace
from workbook.trace.report import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", "--hide-scrollbars", "--virtual-time-budget=15000"]


def draw(page: Path, artifact: str, tmp_path: Path, window: str) -> tuple[str, Path]:
    """One Chromium draws ``page`` once, then writes its DOM (returned) and its screenshot (the
    test artifact ``artifact``, a fresh one)."""
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / artifact
    shot.unlink(missing_ok=True)
    dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                          f"--screenshot={shot}", f"--window-size={window}", "--dump-dom",
                          page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    return dom, shot


def traced_collectives(trace_dir):
    """Every built-in once, then the lab's own builds of them, traced on the link."""
    import torch
    import torch.distributed as dist
    lab = load_lab("collectives", "solutions")
    n = dist.get_world_size()
    with rank_trace(trace_dir, lab="collectives"):
        lab.use_builtins(root=n - 1)
        x = torch.arange(1000.0)
        lab.broadcast(x.clone(), src=n - 1)
        lab.all_reduce(x.clone())
        lab.all_gather(torch.empty(1000), torch.tensor_split(x, n)[dist.get_rank()].clone())
        lab.barrier()
    return True


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine")
def test_report_timeline_renders_in_chromium(tmp_path):
    run_dir = tmp_path / "run"
    launch.shared_pool(4, "gloo").run(traced_collectives, str(run_dir), link="dgx-h100",
                                      timeout=300)             # warm ranks: the trace is the same
    report = write_report(run_dir, tmp_path / "report.html")
    dom, shot = draw(report, "collectives_report.png", tmp_path, "1400,1000")
    # plotly drew the timeline: its SVG, bars for all four ranks, the simulated-link label
    assert 'class="main-svg"' in dom
    assert len(re.findall(r'class="point"', dom)) >= 8 or dom.count("<path") > 50
    for rank in range(4):
        assert f"rank {rank}" in dom
    assert "simulated link" in dom
    assert shot.exists() and shot.stat().st_size > 20_000      # a blank page is a few KB


# After the page has drawn, hover (plotly's own Fx.hover, at data coordinates) over the middle of
# the longest wait and the longest communication span, and write down what the hover label says
# and which bar labels are visible; --dump-dom then returns it in <pre id="wb-probe">.
PROBE = """<script>
function wbProbe() {
  const gd = document.querySelector('.js-plotly-plot');
  if (!gd || !gd._fullData) { setTimeout(wbProbe, 200); return; }
  const out = {types: gd._fullData.map(d => d.type)};
  for (const kind of ['wait', 'communication']) {
    const d = gd._fullData.find(d => d.name === kind);
    let x, y, best = -1;
    if (d.type === 'bar') {
      for (let j = 0; j < d.x.length; j++)
        if (d.x[j] > best) { best = d.x[j]; x = d.base[j] + d.x[j] / 2; y = d.y[j]; }
    } else {                            // WebGL: start, middle, end, gap per span
      for (let j = 0; 4 * j + 2 < d.x.length; j++) {
        const w = d.x[4 * j + 2] - d.x[4 * j];
        if (w > best) { best = w; x = d.x[4 * j + 1]; y = d.y[4 * j + 1]; }
      }
    }
    Plotly.Fx.hover(gd, {xval: x, yval: y}, 'xy');
    out[kind] = Array.from(document.querySelectorAll('.hoverlayer .hovertext'))
                     .map(n => n.textContent).join(' | ');
    Plotly.Fx.unhover(gd);
  }
  const labels = Array.from(document.querySelectorAll('text.bartext'));
  out.labels = labels.length;
  out.shown = labels.filter(n => n.style.display !== 'none').map(n => n.textContent);
  out.gl = document.querySelectorAll('.gl-canvas').length;
  const pre = document.createElement('pre');
  pre.id = 'wb-probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}
window.addEventListener('load', () => setTimeout(wbProbe, 300));
</script>"""


def probe_report(report: Path, tmp_path) -> dict:
    import html
    import json
    page = tmp_path / f"probe_{report.name}"
    page.write_text(report.read_text().replace("</body></html>", PROBE + "</body></html>"))
    dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                          "--window-size=1400,1000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'<pre id="wb-probe">(.*?)</pre>', dom, re.S)
    assert found, "the probe did not run: " + dom[-500:]
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine")
def test_timeline_hover_and_labels_in_chromium(tmp_path, monkeypatch):
    from test_capture import one_of_each

    from workbook.trace import view
    run_dir = tmp_path / "run"
    launch.shared_pool(2, "gloo").run(one_of_each, str(run_dir), link="dgx-h100")
    bars = probe_report(write_report(run_dir, tmp_path / "bars.html"), tmp_path)
    assert set(bars["types"]) == {"bar"}
    # the hover names the op, its duration, kind, rank and thread; for communication the bytes
    assert re.match(r"link_wait:\w+[\d,.]+ µswait · rank \d · thread \d+ \(python\)$", bars["wait"])
    assert re.match(r"\w+[\d,.]+ µscommunication · rank \d · link\w+, [\d,]+ B$",
                    bars["communication"])
    # labels: one per span, shown only where they fit (plotly hides the others)
    assert 0 < len(bars["shown"]) < bars["labels"]
    assert set(bars["shown"]) & {"broadcast", "all_gather", "gather", "barrier", "all_reduce"}
    assert "empty" not in bars["shown"]            # aten::empty takes a few µs: no room
    monkeypatch.setattr(view, "BAR_LIMIT", 0)             # the WebGL path of 100k+ events
    gl = probe_report(write_report(run_dir, tmp_path / "gl.html"), tmp_path)
    assert set(gl["types"]) == {"scattergl"} and gl["gl"] > 0 and gl["labels"] == 0
    assert gl["wait"] == bars["wait"] and gl["communication"] == bars["communication"]


def _capstone_run(trace_dir):
    """On every rank: the capstone's report run on the reference, at a small size (3 steps of
    both configurations against one device, one traced step of each)."""
    from workbook.capstone import capstone_report
    from workbook.capstone.capstone_train import TrainSetup
    from workbook.model import ModelConfig
    small = TrainSetup(cfg=ModelConfig(vocab_size=256, hidden=64, heads=4, ffn_hidden=256,
                                       n_layers=2, seq_len=32, style="gpt", dtype="float32",
                                       seed=0), batch=8, steps=2)
    return capstone_report.run(trace_dir, "solutions", {"steps": 3, "traced_setup": small})


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine")
def test_capstone_picture_renders_in_chromium(tmp_path):
    """The capstone's one picture of a whole step (``capstone_step.html``, which ``workbook run
    capstone`` writes beside its traces): every rank, both configurations, each group's
    transfers in its colour, the exposed part, the loss curves, drawn by plotly in Chromium."""
    from workbook.capstone import capstone_report
    run_dir = tmp_path / "run"
    results = launch.shared_pool(4, "gloo").run(_capstone_run, str(run_dir), link="dgx-h100",
                                                timeout=300)
    text = capstone_report.describe(results)
    page = run_dir / capstone_report.PICTURE
    assert f"the picture of a whole step: {page}" in text and page.is_file()
    dom, shot = draw(page, "capstone_step.png", tmp_path, "1400,900")
    assert dom.count('class="main-svg"') >= 1 and dom.count("<path") > 50
    for label in ("rank 0", "rank 3", "TP x DP", "PP x DP", "TP communication",
                  "DP communication", "PP communication", "exposed", "one device",
                  "SIMULATED link"):
        assert label in dom, label
    assert shot.exists() and shot.stat().st_size > 20_000
