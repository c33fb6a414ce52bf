"""The GPU path, checked on a CPU machine: CUDA traces, the choice of backend, the labels, the skips.

No line here needs a GPU. CUDA traces are built as the PyTorch profiler writes them (kernels on
``pid`` = device and ``tid`` = stream with their ``args``, ``cudaLaunchKernel`` on the host thread
with the same correlation id, ``ac2g`` flow arrows, ``gpu_user_annotation`` ranges on the GPU
timeline, NCCL kernels on a stream of their own with the ``Collective name`` args); the layout of
ranks on GPUs is a pure function (``workbook.runtime.gpu.plan``); where torch is asked about CUDA
(``doctor``, the launcher, the benchmarks) ``torch.cuda`` is mocked. What only a GPU can show
(the labs graded on CUDA, overlap from real kernels) is ``tests/gpu``, which skips here.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workbook import trace
from workbook.runtime import gpu
from workbook.trace import intervals as iv

ROOT = Path(__file__).resolve().parents[2]
H100 = "NVIDIA H100 80GB HBM3"
PID, MAIN, AUTOGRAD = 4242, 4242, 4300          # host process, its main and autograd threads
BASE = 6_901_234_567.125                         # Kineto's microseconds, with nanoseconds


# --------------------------------------------------------------------------- CUDA traces
def _x(name, ts, dur, pid, tid, cat, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": BASE + ts,
            "dur": dur, "args": args}


def op(name, ts, dur, tid=MAIN, cat="cpu_op"):
    return _x(name, ts, dur, PID, tid, cat, **{"External id": 1, "Record function id": 0})


def launch(ts, corr, tid=MAIN, name="cudaLaunchKernel", cat="cuda_runtime"):
    """The host call that queued a kernel, and the flow arrow Kineto draws from it."""
    return [_x(name, ts, 4.0, PID, tid, cat, **{"External id": corr + 900, "cbid": 211,
                                                "correlation": corr}),
            {"ph": "s", "id": corr, "pid": PID, "tid": tid, "ts": BASE + ts, "cat": "ac2g",
             "name": "ac2g"}]


def kernel(name, ts, dur, stream, corr, device=0, cat="kernel", **args):
    return _x(name, ts, dur, device, stream, cat, **{
        "External id": corr + 900, "queued": 0, "device": device, "context": 1, "stream": stream,
        "correlation": corr, "registers per thread": 128, "shared memory": 0, "blocks per SM": 1.2,
        "warps per SM": 4.8, "grid": [132, 1, 1], "block": [256, 1, 1],
        "est. achieved occupancy %": 6, **args})


def nccl(name, ts, dur, stream, corr, coll, nelems, dtype="Float", **extra):
    return kernel(name, ts, dur, stream, corr, **{
        "Collective name": coll, "In msg nelems": nelems, "Out msg nelems": nelems,
        "Group size": 2, "dtype": dtype, "In split size": "[]", "Out split size": "[]",
        "Process Group Name": "0", "Process Group Description": "default_pg",
        "Process Group Ranks": "[0, 1]", "Rank": 0, "Seq": 1, **extra})


def meta(streams, device=0):
    ev = [{"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": "python"}},
          {"ph": "M", "name": "thread_name", "pid": PID, "tid": MAIN, "args": {"name": "thread 1"}},
          {"ph": "M", "name": "process_name", "pid": device, "tid": 0,
           "args": {"name": f"GPU {device}"}}]
    return ev + [{"ph": "M", "name": "thread_name", "pid": device, "tid": s,
                  "args": {"name": f"stream {s} "}} for s in streams]


def document(events, rank=0, world=2):
    return {"schemaVersion": 1, "deviceProperties": [
                {"id": 0, "name": H100, "totalGlobalMem": 85_000_000_000, "computeMajor": 9,
                 "computeMinor": 0, "numSms": 132}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world,
                                "pg_count": 1, "nccl_version": "2.21.5"},
            "traceEvents": events, "traceName": f"rank{rank}.trace.json",
            "displayTimeUnit": "ms", "baseTimeNanoseconds": 1_700_000_000_000_000_000}


def one_step_two_phases():
    """Two profiler steps of a TP rank on one GPU (hand-checked figures in the test below).

    host: ProfilerStep#1 [0, 1000], ProfilerStep#2 [1000, 2000]; forward [0, 400] and backward
    [400, 1000] on the main thread; backward kernels launched by the autograd thread.
    stream 7:  gemm [50, 350] (launched 20), gemm [450, 700] (launched 420, autograd),
               gemm [1150, 1400] (launched 1010, step 2)
    stream 13: elementwise [600, 800] (launched 430, autograd): a second compute stream
    stream 20: NCCL all-reduce [300, 500] (launched 200, forward), 1M floats;
               NCCL reduce-scatter [750, 1100] (launched 650, backward; it runs past step 1)
    stream 22: memcpy DtoD [900, 1000] (launched 880)
    GPU timeline: gpu_user_annotation "forward" [50, 500] (not compute); a "Stream Wait Event".
    """
    ev = meta([7, 13, 20, 22]) + [
        op("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        op("ProfilerStep#2", 1000, 1000, cat="user_annotation"),
        op("forward", 0, 400, cat="user_annotation"), op("backward", 400, 600, cat="user_annotation"),
        op("aten::mm", 15, 10), op("c10d::allreduce_", 190, 20), op("record_param_comms", 195, 10),
        op("nccl:all_reduce", 190, 20, cat="user_annotation"),
        op("autograd::engine::evaluate_function: MmBackward0", 415, 30, tid=AUTOGRAD),
        *launch(20, 1), *launch(200, 2, name="cuLaunchKernelEx", cat="cuda_driver"),
        *launch(420, 3, tid=AUTOGRAD), *launch(430, 4, tid=AUTOGRAD),
        *launch(650, 5, tid=AUTOGRAD, name="cuLaunchKernelEx", cat="cuda_driver"),
        *launch(880, 6, name="cudaMemcpyAsync"), *launch(1010, 7),
        kernel("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", 50, 300, 7, 1),
        kernel("sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x128x32", 450, 250, 7, 3),
        kernel("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl"
               "(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}>(int, ...)",
               600, 200, 13, 4),
        nccl("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
             300, 200, 20, 2, "allreduce", 1 << 20),
        nccl("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
             750, 350, 20, 5, "_reduce_scatter_base", 1 << 20),
        kernel("Memcpy DtoD (Device -> Device)", 900, 100, 22, 6, cat="gpu_memcpy"),
        kernel("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", 1150, 250, 7, 7),
        kernel("forward", 50, 450, 7, -1, cat="gpu_user_annotation"),
        kernel("Stream Wait Event", 450, 0, 7, 3, cat="cuda_sync"),
        {"ph": "f", "id": 2, "pid": 0, "tid": 20, "ts": BASE + 300, "cat": "ac2g", "name": "ac2g",
         "bp": "e"}]
    return document(ev)


def write(tmp_path, doc, name="rank0.trace.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_a_cuda_step_hand_checked(tmp_path):
    t = trace.load_trace(write(tmp_path, one_step_two_phases()))
    assert t.device == "cuda" and t.rank == 0
    s1, s2 = trace.step_metrics(t)
    # comm C = [300,500] u [750,1100] = 550; compute P = [50,350] u [450,800] (+ [1150,1400])
    assert (s1.step, s1.step_us, s1.comm_us, s1.compute_us) == (1, 1100, 550, 650)
    assert (s1.overlap_us, s1.exposed_comm_us, s1.memcpy_us, s1.idle_us) == (150, 400, 100, 50)
    assert s1.overlap_pct == pytest.approx(100 * 150 / 550)
    assert s1.overlap_pct_ex_skew == s1.overlap_pct and s1.skew_us == 0     # no skew on a GPU
    assert s1.collectives == {"all_reduce": {"count": 1, "bytes": 4 << 20},
                              "reduce_scatter": {"count": 1, "bytes": 4 << 20}}
    assert (s2.step, s2.step_us, s2.comm_us, s2.compute_us, s2.idle_us) == (2, 1000, 0, 250, 750)
    m = trace.analyse(t)
    assert m.device == f"cuda ({H100})"
    # phases go by the host launch, whichever thread launched (the autograd thread in backward)
    assert trace.overlap_pct(t, within="forward") == pytest.approx(50.0)          # 100 of 200
    assert trace.overlap_pct(t, within="backward") == pytest.approx(100 * 50 / 350)
    assert set(trace.collectives(t, within="backward")) == {"reduce_scatter"}
    assert trace.collectives(t, step=2) == {}


def test_each_kernel_is_the_kind_hta_says(tmp_path):
    from workbook.trace.classify import COMM, COMPUTE, KINDS, MEMCPY, OTHER, classify
    t = trace.load_trace(write(tmp_path, one_step_two_phases()))
    kinds = classify(t)
    got = {}
    for i in range(len(t)):
        if t.cats[t.cat_id[i]] in ("kernel", "gpu_memcpy", "gpu_user_annotation", "cuda_sync"):
            got[t.names[t.name_id[i]].split("(")[0][:40]] = KINDS[kinds[i]]
    assert got == {
        "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_t": KINDS[COMPUTE],
        "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_t": KINDS[COMPUTE],
        "void at::native::vectorized_elementwise_": KINDS[COMPUTE],
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL": KINDS[COMM],
        "ncclDevKernel_ReduceScatter_Sum_f32_RING": KINDS[COMM],
        "Memcpy DtoD ": KINDS[MEMCPY], "forward": KINDS[OTHER], "Stream Wait Event": KINDS[OTHER]}
    # host spans of a GPU trace are host activity, never the rank's compute or its waits
    host = [KINDS[kinds[i]] for i in range(len(t)) if t.tracks[t.track_id[i]].pid == PID]
    assert set(host) <= {"host", "step", "range"}, set(host)


def test_nccl_kernel_names_and_args_give_the_collective(tmp_path):
    ev = meta([20, 24]) + [
        kernel("sm80_gemm", 0, 1000, 7, 1),
        nccl("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)", 10, 10, 20, 2, "allgather",
             256, dtype="BFloat16"),
        nccl("ncclDevKernel_Generic_4(ncclDevComm*, unsigned long, ncclWork*)", 30, 10, 20, 3,
             "allreduce", 100, dtype="Half"),
        nccl("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", 50, 10, 24, 4,
             "send", 64, dtype="Double"),
        kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", 70, 10, 24, 5)]        # no args
    t = trace.load_trace(write(tmp_path, document(ev)))
    assert trace.collectives(t) == {"all_gather": {"count": 1, "bytes": 512},
                                    "all_reduce": {"count": 1, "bytes": 200},
                                    "send": {"count": 1, "bytes": 512},
                                    "send_recv": {"count": 1, "bytes": None}}
    assert trace.overlap_pct(t) == 100.0                # every NCCL kernel under the long GEMM


def test_streams_say_where_nccl_ran(tmp_path):
    rows = trace.kernel_streams(trace.load_trace(write(tmp_path, one_step_two_phases())))
    assert [(r["device"], r["stream"]) for r in rows] == [(0, 7), (0, 13), (0, 20), (0, 22)]
    by = {r["stream"]: r for r in rows}
    assert (by[7]["compute_kernels"], by[7]["compute_us"], by[7]["comm_kernels"]) == (3, 800, 0)
    assert (by[13]["compute_kernels"], by[13]["compute_us"]) == (1, 200)
    assert (by[20]["comm_kernels"], by[20]["comm_us"], by[20]["compute_kernels"]) == (2, 550, 0)
    assert (by[22]["memcpy_kernels"], by[22]["memcpy_us"]) == (1, 100)
    assert by[7]["name"] == "stream 7 "
    assert trace.kernel_streams(trace.load_run(ROOT / "tests/package/data/traces/sim_run"),
                                rank=0) == []                        # a CPU trace has no streams


def _hta_overlap_pct(kernels) -> float:
    """Holistic Trace Analysis' comm/compute overlap, written out independently: merge the NCCL
    kernels and the compute kernels (neither memcpy nor memset) into unions, then sweep their
    end points: the time both are running, over the communication time."""
    def merged(spans):
        out = []
        for s, e in sorted(spans):
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            else:
                out.append([s, e])
        return out
    comm = merged([(s, e) for name, cat, s, e in kernels if cat == "kernel" and "nccl" in name])
    comp = merged([(s, e) for name, cat, s, e in kernels if cat == "kernel" and "nccl" not in name])
    points = sorted([(s, 1) for s, _ in comm] + [(e, -1) for _, e in comm] +
                    [(s, 2) for s, _ in comp] + [(e, -2) for _, e in comp])
    both, running, last = 0.0, 0, None
    for time, step in points:
        if running == 3:
            both += time - last
        running, last = running + step, time
    return 100 * both / sum(e - s for s, e in comm)


@pytest.mark.parametrize("seed", range(5))
def test_hidden_pct_is_holistic_trace_analysis_definition(tmp_path, seed):
    """Random kernels on two compute streams, two NCCL streams and a copy stream (each stream
    runs one kernel at a time, as a GPU does): our figure equals HTA's, computed above."""
    rng = np.random.default_rng(seed)

    def uniform(lo, hi):               # whole 1/1024 µs: exact beside BASE in a float64
        return round(float(rng.uniform(lo, hi)) * 1024) / 1024
    kernels, ev, corr = [], meta([7, 13, 20, 24, 22]), 0
    names = {7: "ampere_sgemm_128x64_tn", 13: "void at::native::reduce_kernel<512, 1>",
             20: "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 24: "ncclDevKernel_SendRecv",
             22: "Memcpy DtoD (Device -> Device)"}
    for stream, name in names.items():
        t = uniform(0, 50)
        for _ in range(int(rng.integers(5, 30))):
            dur = uniform(1, 80)
            cat = "gpu_memcpy" if stream == 22 else "kernel"
            corr += 1
            ev += [kernel(name, t, dur, stream, corr, cat=cat), *launch(max(0.0, t - 5), corr)]
            kernels.append((name, cat, t, t + dur))
            t += dur + uniform(0, 60)
    t = trace.load_trace(write(tmp_path, document(ev)))
    assert trace.overlap_pct(t) == pytest.approx(_hta_overlap_pct(kernels), abs=1e-9)


def test_old_profiler_category_names_read_the_same(tmp_path):
    doc = one_step_two_phases()
    old = {"kernel": "Kernel", "gpu_memcpy": "Memcpy", "cuda_runtime": "Runtime", "cpu_op": "Operator"}
    for e in doc["traceEvents"]:
        e["cat"] = old.get(e.get("cat"), e.get("cat"))
    new = trace.analyse(trace.load_trace(write(tmp_path, one_step_two_phases(), "new.json")))
    got = trace.analyse(trace.load_trace(write(tmp_path, doc, "old.json")))
    assert (got.comm_us, got.compute_us, got.overlap_us, got.memcpy_us, got.step_us) == \
        (new.comm_us, new.compute_us, new.overlap_us, new.memcpy_us, new.step_us)


def test_ranks_sharing_one_gpu_load_as_a_run(tmp_path):
    """Two ranks on device 0 (NCCL 2.30+ or gloo-cuda): one file each, told apart by rank."""
    for rank in (0, 1):
        write(tmp_path, document(one_step_two_phases()["traceEvents"], rank=rank),
              f"rank{rank}.trace.json")
    run = trace.load_run(tmp_path)
    assert run.ranks == [0, 1] and run.label() == f"cuda ({H100})"
    out = trace.summary(run)["ranks"]
    assert [r["overlap_pct"] for r in out] == [pytest.approx(100 * 150 / 550, abs=1e-3)] * 2


def test_overlap_checks_grade_a_cuda_trace(tmp_path):
    """The graders' helpers read NCCL kernels as they read the simulated link's spans."""
    from workbook.grading.trace_checks import assert_hidden, overlap_figures, ranks_hidden_pct
    t = trace.load_trace(write(tmp_path, one_step_two_phases()))
    fwd, bwd = overlap_figures(t, "forward"), overlap_figures(t, "backward")
    assert fwd == {"pct": pytest.approx(50.0), "comm_ms": pytest.approx(0.2),
                   "exposed_ms": pytest.approx(0.1), "skew_ms": 0.0, "count": 1}
    assert bwd["comm_ms"] == pytest.approx(0.35) and bwd["exposed_ms"] == pytest.approx(0.3)
    res = [{"forward": fwd, "backward": bwd}, {"forward": fwd, "backward": bwd}]
    assert ranks_hidden_pct(res, "forward") == pytest.approx(50.0)
    assert ranks_hidden_pct(res, "backward") == pytest.approx(100 * 0.05 / 0.35)
    assert_hidden(fwd["pct"], 40, rank=0, where="w", what="x", details="d", advice="a")
    with pytest.raises(AssertionError, match=r"rank 1: domino on 2 GPUs: 14% of the all-reduces' "
                                             r"NCCL kernels \(0.35 ms\) was hidden .* at least 30%"):
        assert_hidden(bwd["pct"], 30, rank=1, where="domino on 2 GPUs",
                      what="the all-reduces' NCCL kernels", details="0.35 ms", advice="")


def test_bench_domino_figures_from_a_cuda_trace(tmp_path):
    from workbook.tensor_parallel.domino_bench import _gpu_figures
    f = _gpu_figures(12.5, trace.load_trace(write(tmp_path, one_step_two_phases())))
    assert f == {"step_ms": 12.5, "comm_ms": pytest.approx(0.55), "exposed_comm_ms": pytest.approx(0.4),
                 "overlap_fwd_pct": pytest.approx(50.0),
                 "overlap_bwd_pct": pytest.approx(100 * 50 / 350),
                 "gloo_arrival_ms": None, "beyond_modelled_ms": None}


# --------------------------------------------------------------------------- the layout of ranks
@pytest.mark.parametrize("world, gpus, version, env, asked, backend, per_gpu, sets", [
    (2, 0, None, {}, None, "gloo", 0, {}),
    (4, 8, (2, 21, 5), {}, None, "nccl", 1, {}),
    (2, 1, (2, 21, 5), {}, None, "gloo", 0, {}),                     # the one-GPU learner
    (2, 1, (2, 30, 3), {}, None, "gloo", 0, {}),                     # experimental: not by default
    (2, 1, (2, 30, 3), {gpu.MULTI_RANK_ENV: "1"}, None, "nccl", 2, {gpu.MULTI_RANK_ENV: "1"}),
    (4, 1, (2, 21, 5), {}, "cuda", "gloo-cuda", 4, {}),
    (4, 1, (2, 30, 3), {}, "cuda", "nccl", 4, {gpu.MULTI_RANK_ENV: "1"}),
    (4, 1, (2, 30, 3), {gpu.MULTI_RANK_ENV: "0"}, "cuda", "gloo-cuda", 4, {}),
    (3, 2, (2, 21, 5), {}, "cuda", "gloo-cuda", 2, {}),
    (2, 2, (2, 21, 5), {}, "cuda", "nccl", 1, {}),
    (4, 1, (2, 31, 0), {}, "nccl", "nccl", 4, {gpu.MULTI_RANK_ENV: "1"}),
    (2, 4, (2, 21, 5), {}, "gloo-cuda", "gloo-cuda", 1, {}),
    (2, 4, (2, 21, 5), {}, "gloo", "gloo", 0, {}),
    (2, 1, (2, 21, 5), {gpu.ENV_BACKEND: "cuda"}, None, "gloo-cuda", 2, {}),   # the default request
])
def test_plan_picks_a_layout_that_works(world, gpus, version, env, asked, backend, per_gpu, sets):
    layout = gpu.plan(world, gpus, version, env, asked)
    assert (layout.backend, layout.ranks_per_gpu, layout.env) == (backend, per_gpu, sets), layout
    assert layout.reason and layout.summary()
    devices = [layout.device(r) for r in range(world)]
    assert devices == (["cpu"] * world if backend == "gloo" else
                       [f"cuda:{r % gpus}" for r in range(world)])


@pytest.mark.parametrize("world, gpus, version, env, asked, link, message", [
    (2, 0, None, {}, "nccl", False, "backend nccl needs one GPU per rank: 2 rank"),
    (2, 0, None, {}, "cuda", False, "backend cuda puts the ranks on GPUs, and no GPU is visible"),
    (2, 0, None, {}, "gloo-cuda", False, "no GPU is visible"),
    (2, 1, (2, 21, 5), {}, "nccl", False, "Duplicate GPU detected.*NCCL 2.30\\+.*gloo-cuda"),
    (4, 1, (2, 30, 3), {gpu.MULTI_RANK_ENV: "0"}, "nccl", False, "backend nccl needs one GPU per rank"),
    (2, 2, (2, 21, 5), {}, "nccl", True, "the simulated link runs on gloo"),
    (2, 2, (2, 21, 5), {}, "mpi", False, "unknown backend 'mpi'"),
    (0, 2, (2, 21, 5), {}, None, False, "--nproc must be at least 1"),
])
def test_plan_says_what_to_do_instead(world, gpus, version, env, asked, link, message):
    with pytest.raises(ValueError, match=message):
        gpu.plan(world, gpus, version, env, asked, simulated_link=link)


def test_a_simulated_link_means_cpu_ranks_even_under_a_gpu_default():
    env = {gpu.ENV_BACKEND: "nccl"}
    assert gpu.plan(2, 8, (2, 21, 5), env, simulated_link=True).backend == "gloo"
    assert gpu.plan(2, 8, (2, 21, 5), env).backend == "nccl"


@pytest.fixture
def fake_gpus(monkeypatch):
    """``torch.cuda`` as on a machine with the given GPUs and NCCL (nothing else is touched)."""
    import torch

    def install(names, version=(2, 21, 5)):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(names))
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(names))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: names[
            i if isinstance(i, int) else (i.index or 0)])
        monkeypatch.setattr(torch.cuda.nccl, "version", lambda: version)
        monkeypatch.delenv(gpu.ENV_BACKEND, raising=False)
        monkeypatch.delenv(gpu.MULTI_RANK_ENV, raising=False)
    return install


def test_the_launcher_asks_torch_for_the_machine(fake_gpus):
    from workbook.runtime.ranks import choose_backend, rank_layout
    fake_gpus([H100, H100])
    assert gpu.nccl_version() == (2, 21, 5) and gpu.gpu_names() == [H100, H100]
    assert choose_backend(None, 2) == "nccl"
    assert choose_backend(None, 4) == "gloo"
    assert choose_backend(None, 2, "dgx-h100") == "gloo"
    assert choose_backend("cuda", 4) == "gloo-cuda"
    assert rank_layout("cuda", 4).device(3) == "cuda:1"
    with pytest.raises(ValueError, match="Duplicate GPU detected"):
        choose_backend("nccl", 4)


def test_old_torch_reports_nccl_as_one_number(fake_gpus):
    fake_gpus([H100], version=21805)
    assert gpu.nccl_version() == (2, 18, 5)
    fake_gpus([H100], version=2708)
    assert gpu.nccl_version() == (2, 7, 8)


def _doctor(capsys, monkeypatch) -> str:
    import torch
    import torch.distributed as dist

    from workbook import cli, link
    monkeypatch.setattr(link, "measure_local_flops", lambda *a, **k: 5e10)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    threads = torch.get_num_threads()
    try:
        assert cli.main(["doctor"]) == 0
    finally:
        torch.set_num_threads(threads)
    return capsys.readouterr().out


def test_doctor_on_a_two_gpu_node(fake_gpus, capsys, monkeypatch):
    fake_gpus([H100, H100])
    out = _doctor(capsys, monkeypatch)
    assert f"gpus        2 ({H100} x2)" in out
    assert "nccl        2.21.5 (the NCCL torch loaded); several ranks per GPU: no (needs NCCL 2.30+)" in out
    assert "2 ranks     nccl, one GPU per rank (cuda:0..cuda:1)" in out
    assert "4 ranks     gloo on CPU ranks (more ranks than GPUs" in out
    assert "WORKBOOK_BACKEND=cuda: gloo-cuda (gloo, tensors on the GPU), up to 2 ranks per GPU" in out
    assert "pytest tests/gpu -rs" in out


def test_doctor_for_the_one_gpu_learner_with_a_new_nccl(fake_gpus, capsys, monkeypatch):
    fake_gpus(["NVIDIA GeForce RTX 4090"], version=(2, 30, 3))
    out = _doctor(capsys, monkeypatch)
    assert "gpus        1 (NVIDIA GeForce RTX 4090)" in out
    assert "several ranks per GPU: yes (2.30+, experimental)" in out
    assert "2 ranks     gloo on CPU ranks (more ranks than GPUs" in out
    assert ("WORKBOOK_BACKEND=cuda: nccl, up to 4 ranks per GPU on cuda:0 "
            "(NCCL_MULTI_RANK_GPU_ENABLE=1, experimental)") in out


def test_doctor_says_when_the_default_request_cannot_start():
    lines = gpu.doctor_lines([H100], (2, 21, 5), {gpu.ENV_BACKEND: "nccl"})
    assert lines[2].startswith("2 ranks     will not start (WORKBOOK_BACKEND=nccl): backend nccl "
                               "needs one GPU per rank")


def test_doctor_without_a_gpu(capsys, monkeypatch):
    out = _doctor(capsys, monkeypatch)
    assert "gpus        0 (none)" in out and "2 ranks     gloo on CPU ranks (no GPU)" in out
    assert "tests/gpu" not in out


def test_grading_runs_link_checks_on_cpu_ranks_and_the_rest_where_the_machine_says(monkeypatch):
    from workbook.runtime import launch
    from workbook.grading import engine
    asked = []

    class FakePool:
        def run(self, fn, *args, link, timeout, **kwargs):
            return [link]

    monkeypatch.setattr(launch, "shared_pool", lambda n, backend=None, **kw: asked.append(
        (n, backend)) or FakePool())
    assert engine.on_ranks(2, print, link="dgx-h100") == ["dgx-h100"]
    assert engine.on_ranks(2, print) == ["none"]
    assert asked == [(2, "gloo"), (2, None)]


def test_traces_record_cuda_only_on_a_rank_whose_tensors_are_on_a_gpu(fake_gpus):
    from workbook.runtime import ranks
    from workbook.trace import capture
    fake_gpus([H100])
    assert capture.profiled_device().type == "cuda" and capture.hardware() == H100   # a plain script
    ranks._CONTEXT, saved = ranks.RankContext(0, 2, 0, "gloo", "cpu"), ranks._CONTEXT
    try:
        assert capture.profiled_device().type == "cpu" and capture.hardware().startswith("CPU")
    finally:
        ranks._CONTEXT = saved


# --------------------------------------------------------------------------- labels of the benchmarks
def test_bench_names_the_gpu_and_simulates_nothing_unasked():
    from workbook.communication.bandwidth_bench import source
    first = {"device": H100, "backend": "nccl", "link": None}
    one_each = gpu.plan(2, 2, (2, 21, 5), {})
    assert source(first, one_each) == f"real {H100} (nccl), no simulated link"
    shared = gpu.plan(4, 1, (2, 30, 3), {}, "cuda")
    assert "4 ranks share each GPU" in source(first, shared)
    sim = {"device": "cpu", "backend": "gloo", "link": "dgx-h100 (simulated)"}
    assert source(sim, gpu.plan(2, 0)).endswith("SIMULATED numbers")


def test_bench_domino_picks_no_link_on_gpus_and_dgx_h100_on_cpu(fake_gpus):
    from workbook.tensor_parallel.domino_bench import resolve
    fake_gpus([H100, H100])
    layout, link = resolve(None, None, 2)
    assert (layout.backend, link) == ("nccl", "none")
    layout, link = resolve(None, "dgx-h100", 2)                       # asked for: CPU ranks
    assert (layout.backend, link) == ("gloo", "dgx-h100")
    with pytest.raises(ValueError, match="the simulated link runs on gloo"):
        resolve("nccl", "dgx-h100", 2)
    fake_gpus([])
    layout, link = resolve(None, None, 2)
    assert (layout.backend, link) == ("gloo", "dgx-h100")


def test_bench_domino_report_on_gpus_names_them():
    from workbook.tensor_parallel.domino_bench import _combine, report
    row = {"step_ms": 10.0, "comm_ms": 2.0, "exposed_comm_ms": 0.5, "overlap_fwd_pct": 80.0,
           "overlap_bwd_pct": 70.0, "gloo_arrival_ms": None, "beyond_modelled_ms": None}
    per_rank = [{"variants": {"vanilla_tp": dict(row, exposed_comm_ms=2.0, overlap_fwd_pct=1.0),
                              "domino": row, "no_comm": dict(row, step_ms=8.0, comm_ms=0.0)}}] * 2
    variants = _combine(per_rank)
    assert variants["domino"]["gloo_arrival_ms"] is None
    opts = dict(style="gpt", hidden=768, ffn=3072, heads=12, layers=2, batch=16, seq=256,
                vocab=1024, p=4, lookahead=1, steps=3)
    result = {"link": "none", "nproc": 2, "options": opts, "backend": "nccl", "hardware": H100,
              "ranks_per_gpu": 1, "link_label": "none", "variants": variants,
              "comm_fraction_pct": 20.0}
    text = report(result)
    assert text.splitlines()[0] == f"Domino benchmark: 2 ranks, {H100} (nccl), real figures, no simulated link"
    assert "(vanilla TP's NCCL kernel time)" in text and f"measured on {H100}" in text
    assert "simulated" not in text.replace("no simulated link", "") and "None" not in text
    assert "share each GPU" in report(dict(result, ranks_per_gpu=4))


# --------------------------------------------------------------------------- the GPU suite here
@pytest.mark.skipif(bool(gpu.gpu_names()), reason="CUDA is present: tests/gpu runs for real here")
def test_the_gpu_suite_skips_every_test_with_its_reason():
    """``pytest tests/gpu -rs`` on this machine: every test collected is skipped, each with the
    one reason, and nothing errors (no fixture, no rank, no CUDA call runs)."""
    import re
    text = (ROOT / "tests" / "gpu" / "conftest.py").read_text()
    reason = text.split('NO_CUDA = "', 1)[1].split('"', 1)[0]
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/gpu", "-rs", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    collected = int(re.search(r"collected (\d+) items", out).group(1))
    assert re.search(rf"=+ {collected} skipped in ", out), out
    assert not re.search(r"\d+ (passed|failed|errors?|xfailed|xpassed)", out), out
    skipped = re.findall(r"SKIPPED \[(\d+)\] (\S+): (.*)", out)
    assert sum(int(n) for n, _, _ in skipped) == collected >= 15, out
    assert {why for _, _, why in skipped} == {reason}, out
    assert f"GPU suite: {reason}" in out                             # the run's header says it too
