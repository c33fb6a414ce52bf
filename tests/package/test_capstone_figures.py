"""The capstone's picture of a whole step (``workbook.capstone.capstone_figures``), on paper: from a
hand-made step of 4 ranks, the figure has a row per rank in each configuration's timeline,
compute grey, each group's transfers in its own colour, the exposed part drawn, the hidden share
in each panel's title, the loss curves beside, and it survives JSON (what a notebook, a
recording and the report's HTML carry). Which group a set of ranks forms follows the mesh's
layout. The report's own run on ranks is exercised by ``workbook run capstone`` and the browser
test; the lesson's by the notebook tests."""
from __future__ import annotations

import json

import plotly.io as pio
import pytest

from workbook.capstone import capstone_figures as figures
from workbook.capstone import capstone_report as report


def _rank(rank: int, kind: str) -> dict:
    """One rank's traced step: compute 0-10 ms and 20-30 ms; an inner-group transfer 5-15 ms
    (half under compute), a DP all-reduce 25-40 ms (a third under compute)."""
    inner = kind.upper()
    t0 = 1e9                                                     # microseconds, any origin
    return {"rank": rank, "link": "simulated link: dgx-h100 (calibrated to 50 GFLOP/s local)",
            "hidden": {inner: {"comm_ms": 10.0, "exposed_ms": 5.0},
                       "DP": {"comm_ms": 15.0, "exposed_ms": 10.0}},
            "spans": {"compute": [[t0, t0 + 1e4], [t0 + 2e4, t0 + 3e4]],
                      "link": [[t0 + 5e3, t0 + 15e3, inner, "send", 1 << 20],
                               [t0 + 25e3, t0 + 40e3, "DP", "all_reduce", 4 << 20]],
                      "exposed": {inner: [[t0 + 1e4, t0 + 15e3]],
                                  "DP": [[t0 + 3e4, t0 + 4e4]]}}}


def _results() -> list[dict]:
    single = [5.5, 5.3, 5.0]
    return [{"rank": r, "steps": 3, "single": single if r == 0 else None,
             "training": {k: {"losses": [x + 1e-16 * r for x in single]} for k in figures.KINDS},
             "traced": {k: _rank(r, k) for k in figures.KINDS}} for r in range(4)]


def test_the_picture_of_a_step():
    fig = figures.figure(_results())
    doc = json.loads(pio.to_json(fig))                   # what HTML, a notebook, a recording hold
    names = {t.get("name") for t in doc["data"]}
    assert {"compute", "TP communication", "PP communication", "DP communication",
            "exposed (no compute beside it)", "one device", "TP x DP (4 ranks)",
            "PP x DP (4 ranks)"} <= names, names
    bars = [t for t in doc["data"] if t["type"] == "bar"]
    color = {t["name"]: t["marker"]["color"] for t in bars}
    assert color["compute"] == figures.COMPUTE_GREY
    assert len({color["TP communication"], color["DP communication"], color["PP communication"],
                color["exposed (no compute beside it)"], color["compute"]}) == 5
    # a row per rank in each timeline; the step starts at 0 ms; each span drawn where it was
    compute = [t for t in bars if t["name"] == "compute"]
    assert len(compute) == 8 and sorted({y for t in compute for y in t["y"]}) == [0, 1, 2, 3]
    assert all(t["base"] == [0.0, 20.0] and t["x"] == [10.0, 10.0] for t in compute)
    dp = [t for t in bars if t["name"] == "DP communication"]
    assert all(t["base"] == [25.0] and t["x"] == [15.0] for t in dp)
    titles = [a["text"] for a in doc["layout"]["annotations"]]
    assert any(t.startswith("TP x DP") and "TP 50%" in t and "DP 33%" in t for t in titles)
    assert any(t.startswith("PP x DP") and "PP 50%" in t for t in titles)
    assert "SIMULATED link: dgx-h100" in doc["layout"]["title"]["text"]
    one = json.loads(pio.to_json(figures.figure(_results(), kinds=("pp",))))
    assert not any(t.get("name") == "TP communication" for t in one["data"])


def test_groups_loss_gap_and_hidden_rows():
    tp, pp = figures.groups_of("tp"), figures.groups_of("pp")
    assert tp([0, 1]) == tp([3, 2]) == "TP" and pp([2, 3]) == "PP"
    assert tp([0, 2]) == tp([1, 3]) == "DP" and tp([1, 2]) == "other" and tp([0]) == "TP"
    assert figures.loss_gap(_results()) == {k: pytest.approx(3e-16, abs=1e-15)
                                            for k in figures.KINDS}
    rows = figures.hidden_rows([_rank(r, "tp") for r in range(4)], "tp")
    assert [(r["group"], r["comm_ms"], r["exposed_ms"]) for r in rows] == \
        [("TP", 40.0, 20.0), ("DP", 60.0, 40.0)]
    assert rows[0]["pct"] == pytest.approx(50.0) and rows[1]["pct"] == pytest.approx(100 / 3)


def test_the_report_is_wired_for_workbook_run():
    from workbook.grading.labs import lab_module
    assert lab_module("capstone", "report") == report.__name__
    assert report.WORLD_SIZE == 4 and report.LINK == "dgx-h100"
    assert callable(report.run) and callable(report.describe)
