"""Write the hand-made synthetic fixture traces of tests/package/test_trace_*.py.

Run ``python tests/package/data/traces/make_synthetic.py`` to regenerate them.
Every number here was chosen so that the expected metrics can be checked by
hand; the expected values are written next to each trace and in the tests.
(The real traces ``real_sync/`` and ``real_async/`` come from
``capture_real.py``: 2 gloo ranks on CPU, torch.profiler.)
"""
import gzip
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
PID = 4242


def X(name, ts, dur, tid, cat="cpu_op", pid=PID, **args):
    e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def M(tid, name, pid=PID):
    return {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}


def link(name, ts, dur, nbytes, seq):
    return X(name, ts, dur, "link", cat="link", bytes=nbytes, seq=seq, group_size=2,
             modelled_us=float(dur), **{"async": True})


def sim_rank(rank, ar_end):
    """CPU rank on a simulated link, 2 steps.

    step 1 [0, 1000]: forward range [50, 650] wrapping aten::mm [100, 600]
      (with aten::addmm nested in it); link all_reduce [400, ar_end];
      link_wait:all_reduce [650, ar_end] on the main thread; a gloo span that
      must be ignored because a link track exists.
      rank 0 (ar_end 900): compute 500, comm 500, overlap 200 (40 %),
      exposed 300, wait 250, idle 1000 - |[100, 900]| = 200.
    step 2 [1000, 2000]: backward range [1000, 1800] wrapping aten::mm
      [1000, 1400]; link all_gather [1100, 1300] (hidden), link
      reduce_scatter [1500, 1700] (exposed).
      compute 400, comm 400, overlap 200 (50 %), exposed 200, idle 400.
    """
    ev = [M(1, "thread 1 (python)"), M(77, "thread 77 (pt_gloo_runloop)"), M("link", "link"),
          X("ProfilerStep#1", 0, 1000, 1, cat="user_annotation"),
          X("forward", 50, 600, 1, cat="user_annotation"),
          X("aten::mm", 100, 500, 1), X("aten::addmm", 150, 150, 1),
          X("link_wait:all_reduce", 650, ar_end - 650, 1, cat="user_annotation"),
          link("all_reduce", 400, ar_end - 400, 4096, 0),
          X("gloo:all_reduce", 410, 10, 77, cat="user_annotation"),
          X("ProfilerStep#2", 1000, 1000, 1, cat="user_annotation"),
          X("backward", 1000, 800, 1, cat="user_annotation"),
          X("aten::mm", 1000, 400, 1),
          link("all_gather", 1100, 200, 1000, 1),
          link("reduce_scatter", 1500, 200, 2000, 2)]
    return {"schemaVersion": 1, "deviceProperties": [],
            "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2},
            "displayTimeUnit": "ms", "traceEvents": ev}


def gpu_rank():
    """GPU-like rank without distributedInfo (rank 2 from the file name).

    ProfilerStep#5 [0, 300] on the host; forward [0, 100], backward [100, 300].
    stream 7: gemm [50, 250] (launched at 10), gemm [260, 400] (launched 150);
    stream 20: NCCL all-reduce [200, 300] (launched 160) with args,
      1024 Float elements = 4096 bytes; NCCL all-gather [420, 500]
      (launched 200) without args: bytes unknown;
    stream 21: memcpy [0, 40] (launched 5).
    Expected: step 500 (window [0, 500]), compute 340, comm 180, overlap 90
    (50 %), exposed 90, memcpy 40, idle 30.
    """
    G = 0  # pid of GPU 0 in kineto traces

    def k(name, ts, dur, stream, corr, cat="kernel", **args):
        return X(name, ts, dur, stream, cat=cat, pid=G, correlation=corr, stream=stream, **args)

    def launch(ts, corr):
        return X("cudaLaunchKernel", ts, 3, 1, cat="cuda_runtime", correlation=corr)

    ev = [M(1, "thread 1 (python)"), M(7, "stream 7", pid=G), M(20, "stream 20", pid=G),
          M(21, "stream 21", pid=G),
          X("ProfilerStep#5", 0, 300, 1, cat="user_annotation"),
          X("forward", 0, 100, 1, cat="user_annotation"),
          X("backward", 100, 200, 1, cat="user_annotation"),
          X("aten::mm", 8, 10, 1), X("aten::mm", 148, 5, 1),
          launch(5, 5), launch(10, 1), launch(150, 2), launch(160, 3), launch(200, 4),
          k("Memcpy HtoD (Pageable -> Device)", 0, 40, 21, 5, cat="gpu_memcpy"),
          k("sm90_xmma_gemm_f32f32", 50, 200, 7, 1),
          k("sm90_xmma_gemm_f32f32", 260, 140, 7, 2),
          k("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 200, 100, 20, 3,
            **{"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
               "Group size": 4, "dtype": "Float"}),
          k("ncclKernel_AllGather_RING_LL_Sum_int8", 420, 80, 20, 4),
          {"ph": "s", "id": 1, "pid": PID, "tid": 1, "ts": 10, "cat": "ac2g", "name": "ac2g"}]
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
            "traceEvents": ev}


def ns_trace():
    """CPU trace, no ProfilerStep, no rank anywhere, sub-microsecond times.

    aten::mm [0.25, 10.75] on the main thread; gloo:all_reduce [5.5, 15.5]
    on a gloo thread (no link track: it counts as communication).
    Expected: step 15.25, compute 10.5, comm 10, overlap 5.25 (52.5 %),
    exposed 4.75, idle 0.
    """
    base = 123456789.0
    ev = [X("aten::mm", base + 0.25, 10.5, 1), X("aten::view", base + 1.125, 0.5, 1),
          X("gloo:all_reduce", base + 5.5, 10.0, 2, cat="user_annotation")]
    return {"schemaVersion": 1, "displayTimeUnit": "ns",
            "baseTimeNanoseconds": 1700000000000000000, "traceEvents": ev}


def main():
    run = HERE / "sim_run"
    run.mkdir(exist_ok=True)
    (run / "run.json").write_text(json.dumps({
        "run_id": "fixture-sim-1", "lab": "async_overlap", "world_size": 2, "backend": "gloo",
        "link": {"preset": "dgx-h100-nvlink", "simulated": True, "bandwidth_GBps": 900.0,
                 "latency_us": 5.0},
        "hardware": "2-core CPU", "torch": "2.13.0"}, indent=1))
    (run / "rank0.trace.json").write_text(json.dumps(sim_rank(0, 900)))
    # rank 1: all-reduce until 1000 -> comm 600, overlap 200 in step 1; gzipped.
    with gzip.open(run / "rank1.trace.json.gz", "wt") as fh:
        fh.write(json.dumps(sim_rank(1, 1000)))
    (HERE / "gpu_rank_2.json").write_text(json.dumps(gpu_rank(), indent=0))
    (HERE / "ns_trace.json").write_text(json.dumps(ns_trace()))


if __name__ == "__main__":
    main()
