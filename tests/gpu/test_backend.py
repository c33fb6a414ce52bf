"""Where the ranks go on this machine, and that they work there.

For every world size the graders use, ``WORKBOOK_BACKEND=cuda`` (``workbook.runtime.gpu.plan``) picks NCCL
with one GPU per rank, NCCL with ranks sharing a GPU (NCCL 2.30+), or gloo with the tensors on the
GPU; each is started for real and runs an all-reduce of CUDA tensors. ``workbook doctor`` names
the GPUs, the NCCL version and the layout it will use.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _where_am_i() -> dict:
    import torch
    import torch.distributed as dist

    from workbook.runtime import launch
    ctx = launch.context()
    dev = launch.device()
    t = torch.full((1024,), float(dist.get_rank() + 1), device=dev)
    dist.all_reduce(t)
    torch.cuda.synchronize(dev)
    return {"backend": ctx.backend, "process_group": dist.get_backend(), "device": str(dev),
            "tensor_device": str(t.device), "sum": t[0].item(), "all_equal": bool((t == t[0]).all()),
            "gpu": torch.cuda.get_device_name(dev)}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_each_world_size_runs_where_the_plan_says(n, on_gpus):
    from workbook.runtime.launch import RankPool
    layout = on_gpus[n]
    print(f"\n{n} rank(s): {layout.summary()} -- {layout.reason}")
    assert layout.on_gpu, f"WORKBOOK_BACKEND=cuda on a GPU machine must put ranks on the GPU: {layout}"
    with RankPool(n, "cuda") as pool:
        got = pool.run(_where_am_i, timeout=180)
    for rank, r in enumerate(got):
        assert r["backend"] == layout.backend, f"rank {rank}: started {r['backend']}, planned {layout.backend}"
        assert r["device"] == layout.device(rank) == r["tensor_device"], f"rank {rank}: {r}"
        # gloo-cuda: the workbook's gloo wrapper, which moves CUDA tensors through host memory
        assert r["process_group"] == ("nccl" if layout.backend == "nccl" else "gloo_link_cuda"), r
        assert r["all_equal"] and r["sum"] == n * (n + 1) / 2, f"rank {rank}: all-reduce gave {r['sum']}"
        print(f"  rank {rank}: {r['device']} ({r['gpu']}), {r['process_group']}")


def test_doctor_names_the_gpus_nccl_and_layouts():
    from workbook.runtime import gpu
    out = subprocess.run([sys.executable, "-m", "workbook.cli", "doctor"], capture_output=True,
                         text=True, cwd=ROOT, timeout=300, env=dict(os.environ)).stdout
    print(out)
    for name in set(gpu.gpu_names()):
        assert name in out
    assert f"nccl        {gpu.version_text(gpu.nccl_version())}" in out
    assert "2 ranks     " in out and "4 ranks     " in out


def _one_traced_all_reduce(trace_dir: str) -> list[dict]:
    import torch
    import torch.distributed as dist

    from workbook import trace
    from workbook.runtime import launch
    from workbook.trace.capture import rank_trace
    x = torch.ones(1 << 20, device=launch.device())
    dist.all_reduce(x)                                   # the communicator starts outside the trace
    with rank_trace(trace_dir, lab="gpu_smoke"):
        y = x @ x.new_ones(1 << 20, 8)                   # compute kernels on the default stream
        dist.all_reduce(x)
        y.sum().item()
    return trace.kernel_streams(trace.load_trace(f"{trace_dir}/rank{dist.get_rank()}.trace.json"))


def test_nccl_kernels_run_on_a_stream_of_their_own(on_gpus, tmp_path):
    from workbook.runtime.launch import RankPool
    if on_gpus[2].backend != "nccl":
        pytest.skip(f"2 ranks run on {on_gpus[2].summary()} here: no NCCL kernels to look for")
    with RankPool(2, "cuda") as pool:
        streams = pool.run(_one_traced_all_reduce, str(tmp_path), timeout=180)
    for rank, rows in enumerate(streams):
        print(f"rank {rank}: " + "; ".join(f"stream {r['stream']}: {r['comm_kernels']} NCCL, "
                                           f"{r['compute_kernels']} compute" for r in rows))
        nccl = [r for r in rows if r["comm_kernels"]]
        assert nccl, f"rank {rank}: no NCCL kernel in the trace: {rows}"
        assert all(r["compute_kernels"] == 0 for r in nccl), \
            f"rank {rank}: NCCL kernels share a stream with compute kernels: {rows}"
        assert any(r["compute_kernels"] for r in rows), f"rank {rank}: no compute kernel: {rows}"
