"""A trace of two builds stays two steps.

A comparison report (vanilla TP against Domino) traces both builds into one file per rank, each
inside ``traced_step(n)`` (a ``ProfilerStep#n`` range). The analysis must give each step its own
figures (``workbook trace summary --step N``, the per-step rows of the summary and of the HTML
report, the dashed split on the timeline), not one figure that averages two schedules; what runs
between two steps (the barrier that lines the ranks up) belongs to neither.

The hand-made trace below: one rank on the simulated link, in µs.

* step 0 [0, 1000] "vanilla step": compute [0, 400], then an all-reduce [400, 900] nothing hides
  (0 % hidden);
* between the steps, a barrier on the link [1050, 1150] (belongs to no step);
* step 1 [1200, 2200] "overlapped step": compute [1200, 2000], an all-reduce [1300, 1700]
  under it (100 % hidden).

The whole trace: 500 + 100 + 400 µs of communication, 400 hidden: 40 %, neither build's figure.
"""
import json
import re
from pathlib import Path

import pytest

from workbook import trace
from workbook.trace import cli
from workbook.trace.view import step_splits, timeline_figure

PID = 7


def _x(name, ts, dur, tid=1, cat="cpu_op", **args):
    e = {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur}
    return {**e, "args": args} if args else e


def _link(name, ts, dur):
    return _x(name, ts, dur, tid="link", cat="link", bytes=4096, seq=ts, group_size=2,
              modelled_us=float(dur))


def two_builds(path):
    events = [{"ph": "M", "name": "thread_name", "pid": PID, "tid": "link", "args": {"name": "link"}},
              _x("ProfilerStep#0", 0, 1000, cat="user_annotation"),
              _x("vanilla step", 0, 950, cat="user_annotation"),
              _x("aten::mm", 0, 400),
              _link("all_reduce", 400, 500),
              _x("link_wait:all_reduce", 400, 500, cat="user_annotation"),
              _link("barrier", 1050, 100),
              _x("link_wait:barrier", 1050, 100, cat="user_annotation"),
              _x("ProfilerStep#1", 1200, 1000, cat="user_annotation"),
              _x("overlapped step", 1200, 900, cat="user_annotation"),
              _x("aten::mm", 1200, 800),
              _link("all_reduce", 1300, 400)]
    path.write_text(json.dumps({"traceEvents": events,
                                "distributedInfo": {"rank": 0, "world_size": 2}}))
    return path


def test_each_step_has_its_own_overlap_and_the_gap_belongs_to_neither(tmp_path):
    t = trace.load_trace(two_builds(tmp_path / "rank0.trace.json"))
    s0, s1 = trace.step_metrics(t)
    assert (s0.step, s0.label, s0.comm_us, s0.overlap_pct) == (0, "vanilla step", 500, 0.0)
    assert (s1.step, s1.label, s1.comm_us, s1.overlap_pct) == (1, "overlapped step", 400, 100.0)
    assert s0.collectives == {"all_reduce": {"count": 1, "bytes": 4096}}      # no barrier
    assert trace.overlap_pct(t, step=1) == 100.0
    assert trace.overlap_pct(t) == pytest.approx(40.0)                 # the average of neither
    assert trace.analyse(t).steps == [s0, s1]


def test_summary_prints_each_step_and_step_1_works(tmp_path, capsys):
    two_builds(tmp_path / "rank0.trace.json")
    assert cli.main(["trace", "summary", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\s+0\s+0\s+vanilla step\s.*\s0\.0\s", out, re.M), out
    assert re.search(r"^\s+0\s+1\s+overlapped step\s.*\s100\.0\s", out, re.M), out
    assert cli.main(["trace", "summary", str(tmp_path), "--step", "1", "--json"]) == 0
    rank = json.loads(capsys.readouterr().out)["ranks"][0]
    assert (rank["comm_us"], rank["overlap_pct"]) == (400, 100.0)
    assert [s["step"] for s in rank["steps"]] == [1]
    assert cli.main(["trace", "summary", str(tmp_path), "--step", "2"]) == 2
    assert "no step 2 (steps: [0, 1])" in capsys.readouterr().err


def test_report_and_timeline_split_the_steps(tmp_path):
    from workbook.trace.report import write_report
    two_builds(tmp_path / "rank0.trace.json")
    run = trace.load_run(tmp_path)
    assert step_splits(run.traces) == [(0.0, 0, "vanilla step"), (1200.0, 1, "overlapped step")]
    fig = timeline_figure(run)
    assert [s.x0 for s in fig.layout.shapes] == [0.0, 1200.0]
    assert [a.text for a in fig.layout.annotations] == ["step 0: vanilla step",
                                                        "step 1: overlapped step"]
    assert not timeline_figure(run, step=1).layout.shapes                 # one step: no split
    page = write_report(run, tmp_path / "report.html").read_text()
    assert "<h2>Each step</h2>" in page
    rows = re.findall(r"<tr><td>0</td><td>(\d)</td><td>([^<]*)</td>(?:<td>[^<]*</td>){3}"
                      r"<td>([^<]*)</td>", page)
    assert rows == [("0", "vanilla step", "0.0"), ("1", "overlapped step", "100.0")]


def test_a_trace_of_one_step_has_no_split(tmp_path):
    from workbook.trace.report import write_report
    run = trace.load_run(Path(__file__).parent / "data" / "traces" / "gpu_rank_2.json")
    assert step_splits(run.traces) == []
    assert "Each step" not in write_report(run, tmp_path / "r.html").read_text()


# --------------------------------------------------------------------------- the Domino report
def _terminal_step_pct(text: str, build: str) -> float:
    """The ``step hidden (HTA)`` figure of ``build``'s line in the Domino report."""
    line = next(x for x in text.splitlines() if x.startswith(build + " "))
    return float(line.split()[-1].rstrip("%"))


# the report's comparison at a quarter of its width and sequence, one timed step per build: both
# figures are read from the same trace, whatever its size (the report's own size: 16 s of 35 s)
SMALL = dict(model=dict(hidden=192, heads=4, ffn_hidden=768, n_layers=2, seq_len=64,
                        vocab_size=256), batch=4, steps=1)


def test_domino_trace_steps_match_the_terminal_figures(tmp_path, capsys):
    """The Domino report on 2 ranks (solutions, ``SMALL``): ``--step 0`` and ``--step 1`` of its
    trace give vanilla TP's and Domino's whole-step overlap (all ranks together), each within 1
    point of the report's own line for that build."""
    from workbook.grading import engine
    from workbook.tensor_parallel import domino_report as report
    results = engine.on_ranks(report.WORLD_SIZE, report.run, str(tmp_path), "solutions",
                              link=report.LINK, timeout=300, **SMALL)
    text = report.describe(results)
    assert text.startswith("domino figures: 2 ranks, GPT hidden 192, 2 layers, batch 4 x 64"), text
    assert f"traces: {tmp_path} (a step per build: 0 vanilla TP, 1 Domino" in text, text
    for k, build in enumerate(report.STEPS_NAMED.values()):
        assert cli.main(["trace", "summary", str(tmp_path), "--step", str(k), "--json"]) == 0
        ranks = json.loads(capsys.readouterr().out)["ranks"]
        assert len(ranks) == report.WORLD_SIZE
        comm = sum(r["comm_us"] for r in ranks)
        hidden = sum(r["overlap_pct"] / 100 * r["comm_us"] for r in ranks)
        assert 100 * hidden / comm == pytest.approx(_terminal_step_pct(text, build), abs=1.0), text
    assert cli.main(["trace", "summary", str(tmp_path), "--step", "1"]) == 0
    assert "error" not in capsys.readouterr().err
