"""Trace capture: per-rank Chrome traces with the link's own track, and the run's metadata."""
import json

from workbook.demo import run_demo


def test_demo_writes_traces_with_link_spans(tmp_path, capsys):
    assert run_demo(nproc=2, link="dgx-h100", out=str(tmp_path)) == 0
    printed = capsys.readouterr().out
    assert "simulated link" in printed and "all-reduce result correct on every rank: True" in printed
    meta = json.loads((tmp_path / "run.json").read_text())
    assert meta["world_size"] == 2 and meta["backend"] == "gloo" and meta["link"]["simulated"]
    for rank in (0, 1):
        trace = json.loads((tmp_path / f"rank{rank}.trace.json").read_text())
        assert trace["distributedInfo"]["rank"] == rank
        assert trace["workbook"]["run_id"] == meta["run_id"]
        events = trace["traceEvents"]
        link_spans = [e for e in events if e.get("cat") == "link"]
        names = [e["name"] for e in link_spans]
        for op in ("broadcast", "all_reduce", "all_gather", "reduce_scatter", "barrier"):
            assert op in names
        ar = next(e for e in link_spans if e["name"] == "all_reduce")
        assert ar["args"]["bytes"] == 4 * 2**18 and ar["dur"] > 0
        # the link track sits inside the profiled window, on the same clock as the compute ranges
        ranges = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == "all_reduce"]
        assert ranges and abs(ranges[0]["ts"] - ar["ts"]) < 5000         # within 5 ms
        assert any(e.get("name", "").startswith("link_wait:") for e in events)
