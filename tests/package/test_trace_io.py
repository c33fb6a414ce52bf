"""Loading edge cases, bad input, the CLI, the views, the report and merge."""
import gzip
import json
import shutil
from pathlib import Path

import pytest

from workbook import trace
from workbook.trace import cli
from workbook.trace.load import rank_from_filename

DATA = Path(__file__).parent / "data" / "traces"
SIM = DATA / "sim_run"


def run_cli(*argv):
    return cli.main(list(argv))


# ---------------------------------------------------------------- loading

def test_rank_from_filename():
    assert rank_from_filename("rank3.trace.json") == 3
    assert rank_from_filename("/x/rank_12.json.gz") == 12
    assert rank_from_filename("worker-3.pt.trace.json") == 3
    assert rank_from_filename("trace.json") is None


def test_streaming_small_chunks_equals_default(monkeypatch):
    from workbook.trace import load
    ref = trace.load_trace(DATA / "real_async" / "rank0.trace.json")
    orig = load._Stream.__init__

    def tiny(self, fh, path, chunk=1 << 20):
        orig(self, fh, path, chunk=7)
    monkeypatch.setattr(load._Stream, "__init__", tiny)
    t = trace.load_trace(DATA / "real_async" / "rank0.trace.json")
    assert len(t) == len(ref) and (t.ts == ref.ts).all() and t.names == ref.names


def test_bare_array_format(tmp_path):
    p = tmp_path / "rank1.json"
    p.write_text(json.dumps([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                              "ts": 10, "dur": 5}]))
    t = trace.load_trace(p)
    assert t.rank == 1 and trace.analyse(t).compute_us == 5


@pytest.mark.parametrize("content, msg", [
    ('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}, {"ph": "X", "na', "truncated"),
    ("this is not json", "not a trace"),
    ('{"schemaVersion": 1}', "no 'traceEvents'"),
    ('{"traceEvents": []}', "empty trace"),
    ("", "not a trace"),
])
def test_bad_files_raise_trace_error_naming_the_file(tmp_path, content, msg):
    p = tmp_path / "rank0.trace.json"
    p.write_text(content)
    with pytest.raises(trace.TraceError, match=msg) as exc:
        trace.load_trace(p)
    assert str(p) in str(exc.value)


def test_truncated_gzip(tmp_path):
    raw = gzip.compress((SIM / "rank0.trace.json").read_bytes())
    p = tmp_path / "rank0.trace.json.gz"
    p.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(trace.TraceError, match="rank0.trace.json.gz"):
        trace.load_trace(p)


def test_partial_run_warns_and_keeps_readable_ranks(tmp_path, capsys):
    d = tmp_path / "run"
    shutil.copytree(SIM, d)
    (d / "rank1.trace.json.gz").write_bytes(b"\x1f\x8b garbage")
    with pytest.warns(UserWarning, match="rank1"):
        run = trace.load_run(d)
    assert run.ranks == [0]
    assert run_cli("trace", "summary", str(d), "--json") == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["ranks"][0]["rank"] == 0
    assert err.startswith("warning:") and "rank1.trace.json.gz" in err


def test_empty_directory_and_mixed_runs(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_cli("trace", "summary", str(empty)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "no trace files" in err and "Traceback" not in err
    other = tmp_path / "other"
    shutil.copytree(SIM, other)
    meta = json.loads((other / "run.json").read_text())
    meta["run_id"] = "another-run"
    (other / "run.json").write_text(json.dumps(meta))
    with pytest.raises(trace.TraceError, match="different runs"):
        trace.load_run([SIM / "rank0.trace.json", other / "rank1.trace.json.gz"])
    # world sizes that disagree
    d = tmp_path / "ws"
    d.mkdir()
    for r, ws in ((0, 2), (1, 4)):
        doc = json.loads((SIM / "rank0.trace.json").read_text())
        doc["distributedInfo"].update(rank=r, world_size=ws)
        (d / f"rank{r}.trace.json").write_text(json.dumps(doc))
    assert run_cli("trace", "summary", str(d)) == 2
    assert "world sizes disagree" in capsys.readouterr().err


# ---------------------------------------------------------------- CLI

def test_cli_summary_json_and_table(capsys):
    assert run_cli("trace", "summary", str(SIM), str(DATA / "gpu_rank_2.json"), "--json") == 0
    ranks = json.loads(capsys.readouterr().out)["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2]
    assert ranks[2]["collectives"]["all_gather"]["bytes"] is None
    assert run_cli("trace", "summary", str(SIM), "--step", "1") == 0
    out = capsys.readouterr().out
    assert "simulated link: dgx-h100-nvlink" in out and "40.0" in out


def test_register_into_a_parent_parser():
    import argparse
    parser = argparse.ArgumentParser(prog="workbook")
    sub = parser.add_subparsers(dest="command")
    cli.register(sub)
    args = parser.parse_args(["trace", "merge", "RUN", "-o", "m.json"])
    assert args.func is cli.cmd_merge and args.run_dir == "RUN" and args.output == "m.json"


# ---------------------------------------------------------------- view, report, merge

def test_timeline_bars_and_webgl(monkeypatch):
    from workbook.trace import colors
    from workbook.trace import view
    fig = trace.timeline_figure(SIM)
    kinds = {d.name: d for d in fig.data}
    assert set(kinds) == {"compute", "communication", "wait", "exposed"}
    assert all(d.type == "bar" for d in fig.data)
    assert kinds["compute"].marker.color == colors.COMPUTE
    assert kinds["exposed"].marker.color == colors.EXPOSED
    # top-level only: aten::addmm nested in aten::mm is not drawn
    assert not any("aten::addmm" in h for h in kinds["compute"].hovertext)
    assert any("4,096 B" in h for h in kinds["communication"].hovertext)
    assert "rank 1 · link" in fig.layout.yaxis.ticktext
    # every bar names its op on hover (name, duration, kind, thread) and carries a label inside,
    # which plotly hides where it does not fit
    comm = kinds["communication"]
    assert len(comm.text) == len(comm.hovertext) == len(comm.base)
    assert "all_reduce" in comm.text and "reduce_scatter" in comm.text
    assert all(h.startswith("<b>") and " µs<br>communication · rank " in h for h in comm.hovertext)
    assert any(h.endswith("· link<br>all_reduce, 4,096 B") for h in comm.hovertext)
    assert (comm.textposition, comm.insidetextanchor, comm.constraintext) == (
        "inside", "middle", "inside")
    assert fig.layout.uniformtext.mode == "hide" and fig.layout.uniformtext.minsize >= 8
    assert "mm" in kinds["compute"].text                     # aten::mm, labelled "mm"
    assert any(x.startswith("wait ") for x in kinds["wait"].text)
    monkeypatch.setattr(view, "BAR_LIMIT", 3)
    fig = trace.timeline_figure(SIM, ranks=[0], step=2)
    assert {d.type for d in fig.data} == {"scattergl"}
    assert len(fig.layout.shapes) == 0
    # WebGL hover finds points: start, middle and end of each segment carry the hover text
    gl = {d.name: d for d in fig.data}["communication"]
    x, h = list(gl.x), list(gl.hovertext)
    assert x[3] is None and x[1] == (x[0] + x[2]) / 2
    assert h[0] == h[1] == h[2] and h[0].startswith("<b>") and h[3] is None


def test_report_and_explorer(tmp_path):
    out = trace.write_report(SIM, tmp_path / "r.html")
    text = out.read_text()
    assert "simulated link: dgx-h100-nvlink" in text and "reduce_scatter" in text
    assert "plotly" in text and "cdn.plot.ly" not in text.split("<h2>Timeline</h2>")[0]
    pytest.importorskip("ipywidgets")
    box = trace.explorer(SIM)
    assert box.children


def test_merge_one_process_per_rank(tmp_path):
    assert run_cli("trace", "merge", str(SIM), "-o", str(tmp_path / "m.json")) == 0
    doc = json.loads((tmp_path / "m.json").read_text())
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    threads = {(e["pid"], e["args"]["name"]) for e in doc["traceEvents"]
               if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert (1, "link") in threads
    assert all(isinstance(e["tid"], int) for e in doc["traceEvents"])
    merged = trace.load_trace(tmp_path / "m.json")
    assert "all_reduce" in merged.names


#: What ``workbook trace summary`` must not import: torch (seconds on a laptop), pytest, the
#: grader and its engine (the full ``workbook`` parser imports them to list its commands), plotly.
HEAVY_FOR_TRACE = ("torch", "pytest", "workbook.instructor.autograder", "workbook.grading.engine",
                   "workbook.selfcheck", "plotly")


def test_trace_summary_imports_only_what_it_needs():
    """``workbook trace summary`` reads traces without importing torch, pytest or the grader."""
    import subprocess
    import sys
    trace_file = "tests/package/data/traces/real_sync/rank0.trace.json"
    code = ("import sys; from workbook.cli import main; "
            f"status = main(['trace', 'summary', {trace_file!r}]); "
            f"print(status, [m for m in {HEAVY_FOR_TRACE!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "0 []", out.stdout
