"""Benchmark: the cost of one distributed check, warm pool vs spawning ranks for each check.

    python tests/bench/bench_launch.py [--checks 5] [--sizes 2 4]

A "check" is what a grader test does: run a small function with a collective on every rank and
get the results back. Spawning pays Python start-up and ``import torch`` on every rank for every
check; the pool pays it once. Prints per-check medians and the ratio, measured in one run.
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist

from workbook import launch


def small_check():
    t = torch.arange(1000, dtype=torch.float32) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return float(t.sum())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--checks", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    print(f"{'ranks':>5}  {'spawn per check':>16}  {'pool start':>10}  {'pool per check':>15}  {'speed-up':>8}")
    for n in args.sizes:
        spawn = []
        for _ in range(args.checks):
            t0 = time.perf_counter()
            launch.run(small_check, n, backend="gloo")
            spawn.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        pool = launch.RankPool(n, "gloo")
        start = time.perf_counter() - t0
        warm = []
        for _ in range(max(args.checks, 20)):
            t0 = time.perf_counter()
            pool.run(small_check)
            warm.append(time.perf_counter() - t0)
        pool.close()
        s, w = statistics.median(spawn), statistics.median(warm)
        print(f"{n:>5}  {s * 1e3:>13.0f} ms  {start:>8.1f} s  {w * 1e3:>12.1f} ms  {s / w:>7.0f}x")


if __name__ == "__main__":
    main()
