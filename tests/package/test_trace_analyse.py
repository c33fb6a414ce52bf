"""Hand-checked metrics of the trace toolkit on small committed traces.

The synthetic traces and the reasoning behind every expected number are in
tests/package/data/traces/make_synthetic.py.
"""
from pathlib import Path

import numpy as np
import pytest

from workbook import trace
from workbook.trace import intervals as iv
from workbook.trace.classify import canonical_collective

DATA = Path(__file__).parent / "data" / "traces"
SIM = DATA / "sim_run"
GPU = DATA / "gpu_rank_2.json"
NS = DATA / "ns_trace.json"


def approx(x):
    return pytest.approx(x, abs=1e-6)


# ---------------------------------------------------------------- intervals

def test_interval_union_intersection_difference():
    u = iv.union([0, 1, 5, 2, 10], [4, 2, 6, 3, 12])
    assert u[0].tolist() == [0, 5, 10] and u[1].tolist() == [4, 6, 12]
    b = iv.union([3, 5.5, 11], [5.2, 7, 20])
    x = iv.intersect(u, b)
    assert list(zip(*[a.tolist() for a in x])) == [(3, 4), (5, 5.2), (5.5, 6), (11, 12)]
    d = iv.subtract(u, b)
    assert list(zip(*[a.tolist() for a in d])) == [(0, 3), (5.2, 5.5), (10, 11)]
    assert iv.measure(iv.join(u, b)) == 17
    assert iv.measure(iv.clip(u, 1, 11)) == 3 + 1 + 1
    assert iv.measure(iv.union([], [])) == 0


def test_interval_union_matches_bruteforce():
    rng = np.random.default_rng(0)
    s = rng.integers(0, 1000, 300).astype(float)
    e = s + rng.integers(1, 30, 300)
    grid = np.zeros(1100, bool)
    for a, b in zip(s.astype(int), e.astype(int)):
        grid[a:b] = True
    assert iv.measure(iv.union(s, e)) == grid.sum()


# ---------------------------------------------------------------- simulated-link CPU run

def test_sim_run_rank0_metrics_exact_40_percent_step():
    run = trace.load_run(SIM)
    assert run.ranks == [0, 1]
    assert run.label() == "simulated link: dgx-h100-nvlink"
    s1, s2 = trace.step_metrics(run.rank(0))
    assert (s1.step, s2.step) == (1, 2)
    assert (s1.step_us, s1.compute_us, s1.comm_us, s1.overlap_us) == (1000, 500, 500, 200)
    assert s1.overlap_pct == approx(40.0)
    assert (s1.exposed_comm_us, s1.wait_us, s1.idle_us) == (300, 250, 200)
    assert s1.collectives == {"all_reduce": {"count": 1, "bytes": 4096}}
    assert (s2.compute_us, s2.comm_us, s2.overlap_pct, s2.exposed_comm_us, s2.idle_us) == (
        400, 400, 50.0, 200, 400)


def test_sim_run_summary_json_both_ranks_gz():
    out = trace.summary(SIM)
    r0, r1 = out["ranks"]
    assert set(r0) == {"rank", "file", "device", "step_us", "compute_us", "comm_us",
                       "overlap_pct", "exposed_comm_us", "idle_us", "collectives", "steps"}
    # each step's own figures beside their sum: 40 % and 50 %, not the 44.4 % of both
    assert [(s["step"], s["label"], s["comm_us"], s["overlap_pct"]) for s in r0["steps"]] == [
        (1, "forward", 500, 40.0), (2, "backward", 400, 50.0)]
    assert r0["rank"] == 0 and r0["device"] == "cpu"
    assert (r0["step_us"], r0["compute_us"], r0["comm_us"], r0["exposed_comm_us"],
            r0["idle_us"]) == (2000, 900, 900, 500, 600)
    assert r0["overlap_pct"] == approx(44.444)
    assert r0["collectives"] == {"all_gather": {"count": 1, "bytes": 1000},
                                 "all_reduce": {"count": 1, "bytes": 4096},
                                 "reduce_scatter": {"count": 1, "bytes": 2000}}
    assert r1["file"].endswith(".json.gz")
    assert (r1["comm_us"], r1["exposed_comm_us"], r1["idle_us"]) == (1000, 600, 500)
    assert r1["overlap_pct"] == approx(40.0)


def test_phase_queries():
    run = trace.load_run(SIM)
    assert trace.collectives(run, rank=0, within="forward") == {
        "all_reduce": {"count": 1, "bytes": 4096}}
    assert set(trace.collectives(run, rank=0, within="backward")) == {"all_gather", "reduce_scatter"}
    assert trace.overlap_pct(run, rank=0, within="forward") == approx(40.0)
    assert trace.overlap_pct(run, rank=0, within="backward") == approx(50.0)
    assert trace.overlap_pct(run, rank=1, within="forward") == approx(100 * 200 / 600)
    assert trace.exposed_comm_us(run, rank=0, within="backward") == approx(200)
    assert trace.collectives(run, rank=0, step=2) == trace.collectives(run, rank=0, within="backward")
    with pytest.raises(trace.TraceError, match="no record_function range"):
        trace.collectives(run, rank=0, within="optimizer")


def test_gloo_spans_ignored_when_link_track_exists():
    t = trace.load_trace(SIM / "rank0.trace.json")
    assert "gloo:all_reduce" in t.names
    assert trace.analyse(t).collectives["all_reduce"]["count"] == 1


# ---------------------------------------------------------------- GPU-like

def test_gpu_multistream_nccl_with_and_without_args():
    t = trace.load_trace(GPU)
    assert t.rank == 2 and t.rank_source == "file name"
    assert t.device == "cuda"
    m = trace.analyse(t)
    assert m.device == "cuda (NVIDIA H100 80GB HBM3)"
    assert (m.step_us, m.compute_us, m.comm_us, m.overlap_us) == (500, 340, 180, 90)
    assert m.overlap_pct == approx(50.0)
    assert (m.exposed_comm_us, m.memcpy_us, m.idle_us) == (90, 40, 30)
    assert m.collectives == {"all_reduce": {"count": 1, "bytes": 4096},
                             "all_gather": {"count": 1, "bytes": None}}
    # phases through the launch (correlation id) on the host
    assert set(trace.collectives(t, within="backward")) == {"all_reduce", "all_gather"}
    assert trace.collectives(t, within="forward") == {}
    assert [s.step for s in trace.step_metrics(t)] == [5]


# ---------------------------------------------------------------- odd traces

def test_nanosecond_times_no_step_no_rank():
    with pytest.warns(UserWarning, match="no rank recorded"):
        run = trace.load_run(NS)
    t = run.traces[0]
    assert t.rank == 0 and t.rank_source == "assumed"
    m = trace.analyse(t)
    assert [s.step for s in m.steps] == [0]
    assert (m.step_us, m.compute_us, m.comm_us, m.overlap_us) == (15.25, 10.5, 10.0, 5.25)
    assert m.overlap_pct == approx(52.5)
    assert (m.exposed_comm_us, m.idle_us) == (4.75, 0.0)
    assert trace.load_trace(NS).rank is None


def test_canonical_collective_names():
    for raw in ("all_reduce", "gloo:all_reduce", "allreduce", "AllReduce",
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ncclKernel_AllReduce_RING_LL_Sum_float"):
        assert canonical_collective(raw) == "all_reduce"
    assert canonical_collective("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL") == "reduce_scatter"
    assert canonical_collective("_allgather_base") == "all_gather"
    assert canonical_collective("my_op") == "my_op"


# ---------------------------------------------------------------- real torch.profiler traces

@pytest.mark.parametrize("mode", ["sync", "async"])
def test_real_cpu_traces(mode):
    run = trace.load_run(DATA / f"real_{mode}")
    assert run.ranks == [0, 1] and run.traces[0].world_size == 2
    for t in run.traces:
        m = trace.analyse(t)
        assert [s.step for s in m.steps] == [1, 2]
        assert m.collectives == {"all_reduce": {"count": 2, "bytes": None}}
        assert 0 < m.compute_us < m.step_us and m.comm_us > 0
        assert m.idle_us >= 0
        assert abs(m.compute_us + m.comm_us - m.overlap_us + m.idle_us - m.step_us) < 1e-3 * m.step_us + 1
        if mode == "sync":   # the host blocks during a synchronous all-reduce
            assert m.overlap_pct < 5
    if mode == "async":      # a matmul runs while the all-reduce is in flight
        assert max(trace.overlap_pct(t) for t in run.traces) > 5
        assert trace.collectives(run, rank=0, within="backward")["all_reduce"]["count"] == 2


# ---------------------------------------------------------------- rank skew on the simulated link

def _skew_trace(tmp_path):
    """One rank, times in µs.  The compute thread multiplies over [0, 100] and [170, 300].

    * op 1 is on the link over [20, 50], hidden by the first matmul; its peer issues it late,
      so the real op ends at 160: a late-peer span [50, 160];
    * op 2 is on the link over [100, 130] while the rank is blocked in a wait [100, 170] (on
      op 1, whose peer is late): exposed, but all of it skew;
    * op 3 is on the link over [300, 340] and waited at once [300, 350]: 40 µs exposed by the
      schedule itself (its late-peer span [340, 350] lies after the transfer).
    """
    import json

    def x(name, ts, dur, tid, cat, **args):
        return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid,
                "cat": cat, "args": args}
    late = "link: peers late"
    events = [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": "link", "args": {"name": "link"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": late, "args": {"name": late}},
        x("aten::mm", 0, 100, 7, "cpu_op"), x("aten::mm", 170, 130, 7, "cpu_op"),
        x("link_wait:all_reduce", 100, 70, 7, "user_annotation"),
        x("link_wait:all_reduce", 300, 50, 7, "user_annotation"),
        x("all_reduce", 20, 30, "link", "link", bytes=64, seq=1),
        x("all_reduce", 100, 30, "link", "link", bytes=64, seq=2),
        x("all_reduce", 300, 40, "link", "link", bytes=64, seq=3),
        x("all_reduce: peers late", 50, 110, late, "link_late", seq=1),
        x("all_reduce: peers late", 340, 10, late, "link_late", seq=3),
    ]
    path = tmp_path / "rank0.trace.json"
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0}}))
    return trace.load_trace(path)


def test_exposed_time_while_a_peer_is_late_is_skew(tmp_path):
    m = trace.analyse(_skew_trace(tmp_path))
    assert (m.comm_us, m.overlap_us, m.exposed_comm_us) == (100, 30, 70)
    assert m.skew_us == 30                       # op 2, blocked behind op 1's late peer
    assert m.overlap_pct == approx(30.0)
    assert m.overlap_pct_ex_skew == approx(60.0)  # op 3's immediate wait still counts
    assert m.collectives == {"all_reduce": {"count": 3, "bytes": 192}}
    assert m.compute_us == 230                   # late-peer spans are neither compute nor comm
    assert m.late_us == 120                      # the two late-peer spans: 110 + 10


def test_metrics_table_shows_late_peer_time_and_skew_apart(tmp_path):
    from workbook.trace.view import METRIC_COLUMNS, metrics_table_html
    table = metrics_table_html(_skew_trace(tmp_path))
    heads = [h for h, _ in METRIC_COLUMNS]
    assert "late-peer µs" in heads and "exposed comm while a peer was late µs" in heads
    cells = table.split("<tr>")[2].replace("</td>", "").split("<td>")[1:]
    assert cells[heads.index("late-peer µs")] == "120.0"
    assert cells[heads.index("exposed comm while a peer was late µs")] == "30.0"


def test_late_peer_spans_drawn_on_their_own_row(tmp_path):
    fig = trace.timeline_figure(_skew_trace(tmp_path))
    late = [d for d in fig.data if d.name == "late peer"]
    assert late and sorted(late[0].base.tolist()) == [50, 340]
    assert set(late[0].text) == {"peers late"}
    assert "late peer · rank 0 · link: peers late" in late[0].hovertext[0]
