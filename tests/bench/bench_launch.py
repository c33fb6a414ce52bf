"""Benchmark: the cost of one distributed check, warm pool vs spawning ranks for each check.

    python tests/bench/bench_launch.py [--checks 5] [--sizes 2 4]

A "check" is what a grader test does: run a small function with a collective on every rank and
get the results back. Three ways, measured in one run (medians):

* spawn per check: fresh ranks each time, each importing torch (``WORKBOOK_START_METHOD=spawn``);
* fork server per check: fresh ranks forked from a server that imported torch once;
* pool: live ranks, started once, reused for every check.
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from workbook.runtime import launch


def small_check():
    t = torch.arange(1000, dtype=torch.float32) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return float(t.sum())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--checks", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    print(f"{'ranks':>5}  {'spawn per check':>16}  {'fork server per check':>22}  {'pool start':>10}  "
          f"{'pool per check':>15}  {'pool vs spawn':>13}")
    for n in args.sizes:
        spawn, forked = [], []
        for _ in range(args.checks):
            os.environ["WORKBOOK_START_METHOD"] = "spawn"
            t0 = time.perf_counter()
            launch.run(small_check, n, backend="gloo")
            spawn.append(time.perf_counter() - t0)
            del os.environ["WORKBOOK_START_METHOD"]
            t0 = time.perf_counter()
            launch.run(small_check, n, backend="gloo")
            forked.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        pool = launch.RankPool(n, "gloo")
        start = time.perf_counter() - t0
        warm = []
        for _ in range(max(args.checks, 20)):
            t0 = time.perf_counter()
            pool.run(small_check)
            warm.append(time.perf_counter() - t0)
        pool.close()
        s, f, w = statistics.median(spawn), statistics.median(forked), statistics.median(warm)
        print(f"{n:>5}  {s * 1e3:>13.0f} ms  {f * 1e3:>19.0f} ms  {start:>8.1f} s  {w * 1e3:>12.1f} ms  "
              f"{s / w:>12.0f}x")


if __name__ == "__main__":
    main()
