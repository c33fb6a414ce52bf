"""Capture the real CPU fixture traces (2 gloo ranks): sync and async all-reduce."""
import os, sys, torch, torch.distributed as dist
from torch.profiler import profile, ProfilerActivity, record_function, schedule
OUT = sys.argv[1]
def main(rank, ws):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29534")
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64)
    x = torch.randn(32, 64)
    big = torch.randn(256, 256)
    for mode in ("sync", "async"):
        os.makedirs(f"{OUT}/real_{mode}", exist_ok=True)
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=2),
                     on_trace_ready=lambda p: p.export_chrome_trace(f"{OUT}/real_{mode}/rank{rank}.trace.json")) as prof:
            for i in range(3):
                with record_function("forward"):
                    y = lin(x).relu().sum()
                with record_function("backward"):
                    y.backward()
                    grads = torch.cat([p.grad.flatten() for p in lin.parameters()])
                    if mode == "sync":
                        dist.all_reduce(grads)
                    else:
                        h = dist.all_reduce(grads, async_op=True)
                        for _ in range(4):
                            big = (big @ big).tanh()
                        h.wait()
                prof.step()
    dist.destroy_process_group()
if __name__ == "__main__":
    import torch.multiprocessing as mp
    mp.spawn(main, args=(2,), nprocs=2)
