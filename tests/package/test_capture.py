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


def late_peer_step(run_dir):
    """Rank 1 issues its all-reduce 300 ms after rank 0, which waits right behind a second op."""
    import time

    import torch
    import torch.distributed as dist

    from workbook import link
    from workbook.trace.capture import rank_trace
    link.set_link(link.Link("dgx-h100", bandwidth_Bps=1e9, latency_s=0.02, local_flops=5e10,
                            scale=1.0))                      # every op takes ~20 ms
    t = torch.ones(1024)
    dist.barrier()
    with rank_trace(run_dir, lab="skew"):
        dist.barrier()              # the profiler has started on both ranks (its start time varies)
        if dist.get_rank() == 1:
            time.sleep(0.3)
        first = dist.all_reduce(t, async_op=True)
        second = dist.all_reduce(t.clone(), async_op=True)
        first.wait()
        second.wait()
    return dist.get_rank()


def test_a_late_peer_shows_as_skew_not_as_the_schedule(tmp_path):
    from workbook import launch, trace
    assert launch.shared_pool(2, "gloo").run(late_peer_step, str(tmp_path), link="dgx-h100") == [0, 1]
    events = json.loads((tmp_path / "rank0.trace.json").read_text())["traceEvents"]
    late = [e for e in events if e.get("cat") == "link_late" and e["name"].startswith("all_reduce")]
    first = min(e["args"]["seq"] for e in events if e.get("cat") == "link" and e["name"] == "all_reduce")
    assert late and late[0]["name"] == "all_reduce: peers late" and late[0]["args"]["seq"] == first
    assert late[0]["dur"] > 200_000          # rank 1 came at least 300 ms late, less ~20 ms modelled
    m = trace.analyse(trace.load_trace(tmp_path / "rank0.trace.json"))
    # op 2's transfer ran while rank 0 was blocked on op 1, whose peer was late: skew, not schedule
    assert m.skew_us > 10_000 and m.overlap_pct_ex_skew > m.overlap_pct
    assert m.skew_us <= m.exposed_comm_us
