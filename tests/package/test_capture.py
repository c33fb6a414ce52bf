"""Trace capture: per-rank Chrome traces with the link's own track, and the run's metadata."""
import json

import numpy as np
import pytest

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
    from workbook import trace
    from workbook.runtime import launch
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
    assert m.late_us >= late[0]["dur"] > m.skew_us          # late-peer time: the spans themselves


def one_of_each(run_dir):
    """Each collective called exactly once inside the trace (the all-reduce twice: once async,
    behind a matmul), each inside a range of its own name."""
    import torch
    import torch.distributed as dist
    from torch.profiler import record_function

    from workbook.trace.capture import rank_trace
    world, rank = dist.get_world_size(), dist.get_rank()
    x = torch.ones(1024)                                      # 4 KiB
    chunk, gathered = torch.empty(1024 // world), torch.empty(1024)
    dist.barrier()
    with rank_trace(run_dir, lab="one_of_each"):
        calls = {"broadcast": lambda: dist.broadcast(x, src=0),
                 "all_gather": lambda: dist.all_gather_into_tensor(gathered, chunk),
                 "gather": lambda: dist.gather(chunk, list(gathered.chunk(world)) if rank == 0
                                               else None, dst=0),
                 "barrier": dist.barrier, "all_reduce": lambda: dist.all_reduce(x)}
        for name, call in calls.items():
            with record_function(name):
                call()
        with record_function("overlap"):
            work = dist.all_reduce(x, async_op=True)
            torch.randn(64, 64) @ torch.randn(64, 64)
            work.wait()
    return rank


@pytest.mark.parametrize("link_name", ["dgx-h100", "none"])
def test_each_call_counted_once_and_runtime_threads_hidden(tmp_path, link_name):
    from workbook import trace
    from workbook.runtime import launch
    from workbook.trace.classify import COMPUTE, classify
    from workbook.trace.report import collectives_table_html, issued_in
    assert launch.shared_pool(2, "gloo").run(one_of_each, str(tmp_path), link=link_name) == [0, 1]
    run = trace.load_run(tmp_path)
    for t in run.traces:
        got = trace.analyse(t).collectives
        assert {n: c["count"] for n, c in got.items()} == {
            "broadcast": 1, "all_gather": 1, "gather": 1, "barrier": 1, "all_reduce": 2}
        if link_name == "dgx-h100":        # the link records every call's size; a barrier moves none
            assert {n: c["bytes"] for n, c in got.items()} == {
                "broadcast": 4096, "all_gather": 4096, "gather": 4096, "barrier": 0,
                "all_reduce": 8192}
        assert issued_in(t) == {"broadcast": {"broadcast": 1}, "all_gather": {"all_gather": 1},
                                "gather": {"gather": 1}, "barrier": {"barrier": 1},
                                "all_reduce": {"all_reduce": 1, "overlap": 1}}
        # gloo's thread copies gathered chunks with aten ops: the collective's, not compute
        gloo = [i for i, tr in enumerate(t.tracks) if "gloo" in tr.name]
        assert gloo and any(t.names[n].startswith("aten::")
                            for n in t.name_id[np.isin(t.track_id, gloo)])
        assert not (np.isin(t.track_id, gloo) & (classify(t) == COMPUTE)).any()
        for marker in ("workbook_warmup", "workbook_clock_sync"):
            assert not (classify(t)[t.name_id == t.names.index(marker)] == COMPUTE).any()
    rows = trace.timeline_figure(run).layout.yaxis.ticktext
    if link_name == "dgx-h100":          # gloo's threads only hold the real transfer: no row
        assert not any("gloo" in r for r in rows) and "rank 1 · link" in rows
    else:                                # without a link they carry the communication itself
        assert any("pt_gloo_runloop" in r for r in rows)
    table = collectives_table_html(run)
    assert "<td>barrier</td><td>1 · " in table and "1 in barrier" in table


def test_the_clocks_are_tied_by_the_shortest_sync_marker():
    """A rank descheduled inside a sync marker (its host read 8 ms after the range began) must
    not shift the link's spans by 8 ms: the shortest marker, at its middle, gives the offset."""
    from workbook.trace.capture import SYNC_MARKER, _clock_offset
    profiler_minus_host_us = 1_000.0
    reads_ns = [5_000_000, 20_000_000, 30_000_000]
    # marker 0 was preempted: its range is 8 ms long and the read came at its end
    events = [{"ph": "X", "name": SYNC_MARKER, "pid": 7, "ts": 5_000 + profiler_minus_host_us - 8_000,
               "dur": 8_000.2},
              {"ph": "X", "name": SYNC_MARKER, "pid": 7, "ts": 20_000 + profiler_minus_host_us - 1.0,
               "dur": 2.0},
              {"ph": "X", "name": SYNC_MARKER, "pid": 7, "ts": 30_000 + profiler_minus_host_us - 3.0,
               "dur": 6.0}]
    pid, offset = _clock_offset(events, reads_ns)
    assert pid == 7 and offset == pytest.approx(profiler_minus_host_us, abs=1.0)
    assert _clock_offset([], reads_ns)[1] == 0.0
