"""Capture ``ddp_cpu/``: the real trace that ``trace_summary_vs_hta.py`` times.

    python tests/bench/data/capture_ddp_cpu.py          # writes tests/bench/data/ddp_cpu/

Two gloo ranks on CPU train a small MLP under ``DistributedDataParallel``, so
the gradient all-reduces of the backward pass run in buckets beside the
remaining backward compute.  ``torch.profiler`` records five steps with every
option a real profiling session tends to switch on (``record_shapes``,
``with_stack``): operator arguments, Python frames and flow arrows make the
file look like what users bring, not like a hand-made fixture.  The traces
are written gzipped, as ``tensorboard_trace_handler`` does.
"""
import gzip
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile, record_function, schedule

OUT = Path(__file__).resolve().parent / "ddp_cpu"


def export(prof, rank: int) -> None:
    plain = OUT / f"rank{rank}.trace.json"
    prof.export_chrome_trace(str(plain))
    with open(plain, "rb") as src, gzip.open(f"{plain}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    plain.unlink()


def run(rank: int, world: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DistributedDataParallel(torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU()) for _ in range(12)]),
        bucket_cap_mb=0.25)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=True,
                 schedule=schedule(wait=0, warmup=1, active=5),
                 on_trace_ready=lambda p: export(p, rank)) as prof:
        for _ in range(6):
            with record_function("forward"):
                loss = model(x).square().mean()
            with record_function("backward"):
                loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    torch.multiprocessing.spawn(run, args=(2,), nprocs=2)
