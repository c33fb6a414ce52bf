"""Benchmark: an async all-reduce hidden behind independent compute on the simulated link.

    python tests/bench/bench_link_overlap.py [--link dgx-h100] [--nproc 2] [--repeats 5]

On every rank: an all-reduce whose *modelled* time on the preset is T, and matmuls that take
about T on this CPU. Serial: compute, then a synchronous all-reduce (about 2T). Overlapped: issue
the all-reduce with ``async_op=True``, compute, then ``wait()`` (about T when overlap works).
Prints both wall times and their ratio (ideal 0.5), measured in the same run. Simulated link.
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist

from workbook import link
from workbook.runtime import launch


def compute_for(a, seconds):
    """Matmuls for about ``seconds`` (calibrated once per rank by the caller)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a = torch.tanh(a @ a)
    return a


def one_rank(repeats, numel):
    x = torch.ones(numel)
    modelled = link.current_link().op_time("all_reduce", numel * 4, dist.get_world_size())
    a = torch.randn(256, 256) / 16
    serial, overlapped = [], []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        compute_for(a, modelled)
        dist.all_reduce(x)
        serial.append(time.perf_counter() - t0)
        dist.barrier()
        t0 = time.perf_counter()
        work = dist.all_reduce(x, async_op=True)
        compute_for(a, modelled)
        work.wait()
        overlapped.append(time.perf_counter() - t0)
    return modelled, statistics.median(serial), statistics.median(overlapped)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--link", default="dgx-h100")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mib", type=float, default=4.0, help="all-reduce size per rank")
    args = parser.parse_args()
    numel = int(args.mib * 2**20 / 4)
    res = launch.run(one_rank, args.nproc, args.repeats, numel, backend="gloo", link=args.link)
    modelled, serial, over = max(r[0] for r in res), max(r[1] for r in res), max(r[2] for r in res)
    print(f"simulated link {args.link}, {args.nproc} CPU ranks, {args.mib:g} MiB all-reduce")
    print(f"modelled all-reduce time T     {modelled * 1e3:8.1f} ms (compute per step ~T)")
    print(f"serial: compute, then all-reduce {serial * 1e3:8.1f} ms")
    print(f"async all-reduce || compute      {over * 1e3:8.1f} ms")
    print(f"ratio overlapped / serial        {over / serial:8.2f}   (ideal 0.50)")


if __name__ == "__main__":
    main()
