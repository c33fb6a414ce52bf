"""Benchmark of the trace toolkit (a script, not a test).

    python tests/bench/bench_trace.py                    # 8 ranks x 200k events, 500 MB file
    python tests/bench/bench_trace.py --ranks 2 --events 20000 --big-mb 50   # quick
    python tests/bench/bench_trace.py --hta /tmp/hta-venv/bin/python          # + HTA 0.5

It writes synthetic GPU-like traces into a temporary directory -- host
operators, CUDA launches, compute kernels on two streams, NCCL kernels (half
of them with their ``Collective name``/``In msg nelems``/``dtype`` args),
memory copies and flow arrows, in the layout ``torch.profiler`` exports --
and then measures:

1. load + analyse of every rank of the run: seconds, events/s, peak RSS;
2. ``workbook trace summary --json`` on one big (~``--big-mb`` MB) file, in a
   fresh process: seconds, MB/s, peak RSS of that process (streaming keeps it
   far below the file size);
3. optionally the same run through Holistic Trace Analysis
   (``TraceAnalysis(...).get_comm_comp_overlap()``), run by the Python given
   with ``--hta`` (a separate venv), with the speed ratio and the difference
   between its overlap % and ours, rank by rank.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
P = 3  # decimals of the generated times (µs); --integer-us sets 0
sys.path.insert(0, str(ROOT))


def rss_mb(who=resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # Linux: KiB


def write_rank(path: Path, rank: int, world: int, n_events: int, seed: int = 0) -> int:
    """Write one synthetic GPU-like rank trace with about ``n_events`` events."""
    rng = random.Random(seed * 1000 + rank)
    pid, tid = 1000 + rank, 1000 + rank
    ops_per_step = 500
    n_ops = max(1, n_events // 6)          # 6 events per op below
    t = 1_700_000_000_000.0 + rank * 3.0   # µs, epoch-like, like kineto
    written = 0
    corr = 0
    with open(path, "w") as fh:
        fh.write('{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Synthetic GPU"}], '
                 f'"distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": {world}}}, '
                 '"displayTimeUnit": "ms", "baseTimeNanoseconds": 1700000000000000000, '
                 '"traceEvents": [\n')
        out = []
        out.append(f'{{"ph": "M", "name": "thread_name", "pid": {pid}, "tid": {tid}, '
                   f'"args": {{"name": "thread {tid} (python)"}}}}')
        for s in (7, 13, 20):
            out.append(f'{{"ph": "M", "name": "thread_name", "pid": 0, "tid": {s}, '
                       f'"args": {{"name": "stream {s}"}}}}')
        dev = t + 20.0
        op = 0
        step = 0
        while op < n_ops:
            n = min(ops_per_step, n_ops - op)
            step_start = t
            phase_events = []
            for i in range(n):
                corr += 1
                d_cpu = 8.0 + rng.random() * 4
                name = "aten::mm" if i % 3 else "aten::linear"
                out.append(f'{{"ph": "X", "cat": "cpu_op", "name": "{name}", "pid": {pid}, '
                           f'"tid": {tid}, "ts": {t:.{P}f}, "dur": {d_cpu:.{P}f}, "args": '
                           f'{{"External id": {corr}, "Record function id": 0, "Ev Idx": {written}}}}}')
                out.append(f'{{"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": {pid}, '
                           f'"tid": {tid}, "ts": {t + 1:.{P}f}, "dur": {d_cpu - 3:.{P}f}, "args": '
                           f'{{"External id": {corr}, "Ev Idx": {written + 1}}}}}')
                out.append(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", '
                           f'"pid": {pid}, "tid": {tid}, "ts": {t + 2:.{P}f}, "dur": 4.000, "args": '
                           f'{{"External id": {corr}, "cbid": 211, "correlation": {corr}}}}}')
                dev = max(dev, t + 10.0)
                if i % 4 == 3:   # communication kernel on its own stream
                    d = 30.0 + rng.random() * 40
                    start = dev - 15.0 * rng.random()
                    if i % 8 == 3:
                        extra = (', "Collective name": "allreduce", "In msg nelems": 262144, '
                                 '"Out msg nelems": 262144, "Group size": %d, "dtype": "Float"' % world)
                    else:
                        extra = ""
                    out.append(f'{{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", '
                               f'"pid": 0, "tid": 20, "ts": {start:.{P}f}, "dur": {d:.{P}f}, "args": '
                               f'{{"External id": {corr}, "device": 0, "stream": 20, "correlation": {corr}{extra}}}}}')
                elif i % 10 == 5:
                    d = 5.0 + rng.random() * 5
                    out.append(f'{{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", '
                               f'"pid": 0, "tid": 7, "ts": {dev:.{P}f}, "dur": {d:.{P}f}, "args": '
                               f'{{"External id": {corr}, "device": 0, "stream": 7, "correlation": {corr}, "bytes": 1048576}}}}')
                    dev += d
                else:
                    d = 10.0 + rng.random() * 20
                    s = 7 if i % 2 else 13
                    out.append(f'{{"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32", '
                               f'"pid": 0, "tid": {s}, "ts": {dev:.{P}f}, "dur": {d:.{P}f}, "args": '
                               f'{{"External id": {corr}, "device": 0, "stream": {s}, "correlation": {corr}, '
                               f'"grid": [132, 1, 1], "block": [384, 1, 1]}}}}')
                    dev += d * (0.5 if s == 13 else 1.0)
                out.append(f'{{"ph": "s", "id": {corr}, "pid": {pid}, "tid": {tid}, "ts": {t + 2:.{P}f}, '
                           f'"cat": "ac2g", "name": "ac2g"}}')
                out.append(f'{{"ph": "f", "id": {corr}, "pid": 0, "tid": 7, "ts": {dev:.{P}f}, '
                           f'"cat": "ac2g", "name": "ac2g", "bp": "e"}}')
                t += d_cpu + 1.0 + rng.random() * 3
                if len(out) > 20000:
                    fh.write(",\n".join(out) + ",\n")
                    written += len(out)
                    out = []
            mid = step_start + (t - step_start) * 0.4
            phase_events.append(f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", '
                                f'"pid": {pid}, "tid": {tid}, "ts": {step_start - 1:.{P}f}, "dur": {t - step_start + 1:.{P}f}}}')
            phase_events.append(f'{{"ph": "X", "cat": "user_annotation", "name": "forward", '
                                f'"pid": {pid}, "tid": {tid}, "ts": {step_start - 0.5:.{P}f}, "dur": {mid - step_start:.{P}f}}}')
            phase_events.append(f'{{"ph": "X", "cat": "user_annotation", "name": "backward", '
                                f'"pid": {pid}, "tid": {tid}, "ts": {mid:.{P}f}, "dur": {t - mid - 0.5:.{P}f}}}')
            out.extend(phase_events)
            t = max(t, dev - 50.0) + 5.0
            op += n
            step += 1
        out.append(f'{{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", '
                   f'"tid": "PyTorch Profiler", "ts": 1700000000000.0, "dur": {t - 1_700_000_000_000.0:.{P}f}}}')
        fh.write(",\n".join(out) + '\n], "traceName": "synthetic"}\n')
        written += len(out)
    return written


def bench_ours(run_dir: Path) -> dict:
    from workbook import trace
    rss0 = rss_mb()
    t0 = time.perf_counter()
    run = trace.load_run(run_dir, strict=True)
    t1 = time.perf_counter()
    result = trace.summary(run)
    t2 = time.perf_counter()
    events = sum(t.events_read for t in run.traces)
    return {"load_s": t1 - t0, "analyse_s": t2 - t1, "events": events,
            "events_per_s": events / (t2 - t0), "peak_rss_mb": rss_mb(), "rss_before_mb": rss0,
            "overlap": {r["rank"]: r["overlap_pct"] for r in result["ranks"]}}


HTA_SCRIPT = textwrap.dedent("""
    import json, resource, sys, time, warnings, logging
    warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
    t0 = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis
    t1 = time.perf_counter()
    ta = TraceAnalysis(trace_dir=sys.argv[1])
    t2 = time.perf_counter()
    df = ta.get_comm_comp_overlap(visualize=False)
    t3 = time.perf_counter()
    col = [c for c in df.columns if "overlap" in c][0]
    print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "analyse_s": t3 - t2,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "overlap": {int(r): float(v) for r, v in zip(df["rank"], df[col])}}))
""")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--events", type=int, default=200_000, help="events per rank")
    ap.add_argument("--big-mb", type=float, default=500.0, help="size of the big single file")
    ap.add_argument("--hta", default=None, help="python of a venv with HolisticTraceAnalysis")
    ap.add_argument("--dir", default=None, help="keep the generated traces here")
    ap.add_argument("--integer-us", action="store_true",
                    help="whole-microsecond times (HTA truncates fractions; this compares like with like)")
    args = ap.parse_args()
    global P
    P = 0 if args.integer_us else 3
    tmp = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench_trace_"))
    run_dir = tmp / "run"
    run_dir.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    total = 0
    for r in range(args.ranks):
        total += write_rank(run_dir / f"rank{r}.trace.json", r, args.ranks, args.events)
    size = sum(p.stat().st_size for p in run_dir.iterdir()) / 1e6
    print(f"generated {args.ranks} ranks x ~{args.events:,} events ({total:,} events, "
          f"{size:.0f} MB) in {time.perf_counter() - t0:.1f} s -> {run_dir}")

    ours = bench_ours(run_dir)
    print(f"[workbook] load {ours['load_s']:.2f} s + analyse {ours['analyse_s']:.2f} s "
          f"= {ours['events_per_s']:,.0f} events/s; peak RSS {ours['peak_rss_mb']:.0f} MB "
          f"(before: {ours['rss_before_mb']:.0f} MB)")

    if args.big_mb > 0:
        big = tmp / "big" / "rank0.trace.json"
        big.parent.mkdir(exist_ok=True)
        n = int(args.big_mb * 1e6 / 170)   # ~170 bytes per synthetic event
        t0 = time.perf_counter()
        write_rank(big, 0, 1, n)
        mb = big.stat().st_size / 1e6
        print(f"generated {big} ({mb:.0f} MB) in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "workbook.trace.cli", "trace", "summary",
                               str(big), "--json"], cwd=ROOT, capture_output=True, text=True)
        dt = time.perf_counter() - t0
        if proc.returncode:
            print(proc.stderr)
            return 1
        r0 = json.loads(proc.stdout)["ranks"][0]
        print(f"[workbook] trace summary on {mb:.0f} MB: {dt:.1f} s ({mb / dt:.0f} MB/s), "
              f"peak RSS {rss_mb(resource.RUSAGE_CHILDREN):.0f} MB; overlap {r0['overlap_pct']:.2f} %")

    if args.hta:
        proc = subprocess.run([args.hta, "-c", HTA_SCRIPT, str(run_dir)], capture_output=True,
                              text=True)
        if proc.returncode:
            print("[HTA] failed:\n" + proc.stderr[-3000:])
            return 1
        hta = json.loads(proc.stdout.strip().splitlines()[-1])
        hta["overlap"] = {int(k): v for k, v in hta["overlap"].items()}
        ours_s = ours["load_s"] + ours["analyse_s"]
        hta_s = hta["load_s"] + hta["analyse_s"]
        print(f"[HTA 0.5] load {hta['load_s']:.2f} s + overlap {hta['analyse_s']:.2f} s "
              f"(import {hta['import_s']:.1f} s not counted); peak RSS {hta['peak_rss_mb']:.0f} MB")
        print(f"speed ratio HTA / workbook: {hta_s / ours_s:.1f}x")
        for r in sorted(ours["overlap"]):
            a, b = ours["overlap"][r], hta["overlap"].get(r)
            if b is not None and b <= 1.0 and a is not None and a > 1.0:
                b *= 100.0   # some HTA versions report a fraction
            diff = "n/a" if b is None or a is None else f"{a - b:+.3f}"
            print(f"  rank {r}: overlap workbook {a:.3f} %  HTA {b if b is None else round(b, 3)} %  "
                  f"diff {diff} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
