"""The trace report of a 4-rank run of the collectives lab, opened in headless Chromium.

Skipped only where no Chromium exists (the test command installs Debian's chromium where it can).
The screenshot is kept as a test artifact: tests/artifacts/collectives_report.png.
"""
import functools
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from workbook import launch
from workbook.grading import load_lab
from workbook.trace.capture import rank_trace
from workbook.trace.report import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", "--hide-scrollbars", "--virtual-time-budget=15000"]


def traced_collectives(trace_dir):
    lab = load_lab("collectives", "solutions")
    with rank_trace(trace_dir, lab="collectives"):
        return lab.self_check()


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine")
def test_report_timeline_renders_in_chromium(tmp_path):
    run_dir = tmp_path / "run"
    launch.run(functools.partial(traced_collectives, str(run_dir)), 4, backend="gloo",
               link="dgx-h100", timeout=300)
    report = write_report(run_dir, tmp_path / "report.html")
    common = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*common, "--dump-dom", report.as_uri()], capture_output=True,
                         text=True, timeout=120).stdout
    # plotly drew the timeline: its SVG, bars for all four ranks, the simulated-link label
    assert 'class="main-svg"' in dom
    assert len(re.findall(r'class="point"', dom)) >= 8 or dom.count("<path") > 50
    for rank in range(4):
        assert f"rank {rank}" in dom
    assert "simulated link" in dom
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "collectives_report.png"
    shot.unlink(missing_ok=True)
    subprocess.run([*common, f"--screenshot={shot}", "--window-size=1400,1000", report.as_uri()],
                   capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 20_000      # a blank page is a few KB
