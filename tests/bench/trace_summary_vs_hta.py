"""How long ``workbook trace summary`` takes next to Holistic Trace Analysis, on small real traces.

    python tests/bench/trace_summary_vs_hta.py                     # the traces below, 7 rounds
    python tests/bench/trace_summary_vs_hta.py --rounds 11 PATH... # your traces (files or run dirs)
    python tests/bench/trace_summary_vs_hta.py --hta-python /tmp/hta-venv/bin/python
    python tests/bench/trace_summary_vs_hta.py --synthetic-gpu 20000   # + a GPU-like trace

What is timed is a whole process, from its start to its exit, because that is what someone who
types the command waits for: starting Python, the imports, reading the trace, the arithmetic.

* ours: ``python -m workbook.cli trace summary PATH``;
* HTA: a fresh Python that imports ``hta``, builds ``TraceAnalysis`` on the same trace and calls
  ``get_comm_comp_overlap(visualize=False)``: HTA's comm/compute overlap, the number the
  summary's ``overlap %`` column is defined after (see ``workbook/trace/analyse.py``).  Its
  logging is switched off, which only helps it.

The two are *interleaved*: each round runs every trace with both tools, alternating which goes
first, so that a machine that slows down for a while (another job, a hot CPU) slows both.  One
warm-up round fills the file cache and is not counted; the figures are the medians of the
rounds.  This is a benchmark that prints figures, not a test with a threshold.

It installs nothing: HTA must be importable by ``--hta-python`` (this Python by default), else
it says how to install it and exits with status 2.  HTA drags in pandas and more, so a separate
virtual environment is a good place for it::

    python -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install HolisticTraceAnalysis
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

#: The default traces, each with what it is.  All are real ``torch.profiler`` output; none is a
#: GPU trace (HTA's own NCCL test traces are not shipped in its package, and the course's real
#: traces come from CPU ranks over gloo), so HTA's overlap figure is NaN for them: HTA counts
#: GPU kernels only.  It still reads and processes every event, which is what is timed.
TRACES = {
    "tests/package/data/traces/real_sync":
        "2 gloo ranks on CPU, one Linear layer, blocking all-reduce of its gradients "
        "(tests/package/data/traces/capture_real.py)",
    "tests/package/data/traces/real_async":
        "2 gloo ranks on CPU, one Linear layer, asynchronous all-reduce of its gradients "
        "hidden behind matmuls (tests/package/data/traces/capture_real.py)",
    "tests/bench/data/ddp_cpu":
        "2 gloo ranks on CPU, DistributedDataParallel training of a 12-layer MLP, 5 steps, "
        "record_shapes and with_stack on (tests/bench/data/capture_ddp_cpu.py)",
}

SYNTHETIC_GPU = ("not real: 2 GPU-like ranks written by tests/bench/bench_trace.py (host ops, CUDA "
                 "launches, GEMM kernels on two streams, NCCL all-reduce kernels), for HTA to "
                 "compute a real overlap on")

HTA_SCRIPT = """
import json, logging, sys, warnings
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
folder, name = sys.argv[1], sys.argv[2]
files = {0: f"{folder}/{name}"} if name else None
ta = TraceAnalysis(trace_files=files, trace_dir=folder)
df = ta.get_comm_comp_overlap(visualize=False)
col = [c for c in df.columns if "overlap" in c][0]
print(json.dumps({int(r): float(v) for r, v in zip(df["rank"], df[col])}))
"""

HTA_VERSION = ("import importlib.metadata as m; "
               "print(m.version('HolisticTraceAnalysis'), m.version('pandas'))")


def ours_command(path: Path) -> list[str]:
    return [sys.executable, "-m", "workbook.cli", "trace", "summary", str(path)]


def hta_command(hta_python: str, path: Path) -> list[str]:
    """HTA reads a directory, or named files inside one."""
    if path.is_dir():
        return [hta_python, "-c", HTA_SCRIPT, str(path), ""]
    return [hta_python, "-c", HTA_SCRIPT, str(path.parent), path.name]


def run(cmd: list[str]) -> tuple[float, str]:
    """Run ``cmd`` from the repository root; its wall time (start to exit) and its stdout."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd[:4])} ...\n{proc.stderr[-3000:]}")
    return seconds, proc.stdout


def describe(path: Path) -> tuple[str, dict]:
    """What is in a trace (files, size, events, device), and our overlap % per rank."""
    from workbook.trace import load_run, summary
    run_ = load_run(path)
    size_kb = sum(Path(t.path).stat().st_size for t in run_.traces) / 1e3
    events = sum(t.events_read for t in run_.traces)
    devices = ", ".join(sorted({t.device_name for t in run_.traces}))
    overlap = {r["rank"]: r["overlap_pct"] for r in summary(run_)["ranks"]}
    return (f"{len(run_.traces)} file(s), {size_kb:,.0f} kB on disk, {events:,} events, "
            f"{devices}"), overlap


def write_synthetic_gpu_run(events: int) -> Path:
    """A 2-rank GPU-like run in a temporary directory, from ``bench_trace.py``'s generator."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_trace import write_rank
    run_dir = Path(tempfile.mkdtemp(prefix="trace_vs_hta_")) / "synthetic_gpu"
    run_dir.mkdir()
    for rank in range(2):
        write_rank(run_dir / f"rank{rank}.trace.json", rank, 2, events)
    return run_dir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="trace files or run directories (default: the "
                                             "course's real traces, see TRACES)")
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds (default 7)")
    ap.add_argument("--hta-python", default=sys.executable,
                    help="a Python that can import hta (default: this one)")
    ap.add_argument("--synthetic-gpu", type=int, default=0, metavar="EVENTS",
                    help="also time a generated GPU-like run of 2 ranks x EVENTS events")
    args = ap.parse_args()

    check = subprocess.run([args.hta_python, "-c", HTA_VERSION], capture_output=True, text=True)
    if check.returncode != 0:
        print(f"HTA is not importable by {args.hta_python}; install it (this script installs "
              "nothing), for instance in a virtual environment of its own:\n"
              "    pip install HolisticTraceAnalysis\n"
              "then run this again (with --hta-python PYTHON if it is another Python).",
              file=sys.stderr)
        return 2
    hta_version, pandas_version = check.stdout.split()

    paths = [Path(p) for p in args.paths] or [ROOT / p for p in TRACES]
    if args.synthetic_gpu:
        paths.append(write_synthetic_gpu_run(args.synthetic_gpu))
    try:
        report(paths, args.rounds, args.hta_python, f"HTA {hta_version} (pandas {pandas_version})")
    finally:
        if args.synthetic_gpu:
            shutil.rmtree(paths[-1].parent)
    return 0


def report(paths: list[Path], rounds: int, hta_python: str, hta_version: str) -> None:
    """Time every trace with both tools, interleaved, and print the table."""
    jobs = {p: {"ours": ours_command(p), "HTA": hta_command(hta_python, p)} for p in paths}
    times = {p: {"ours": [], "HTA": []} for p in paths}
    hta_overlap = {}
    for round_ in range(rounds + 1):              # round 0 warms the file cache
        for i, (path, commands) in enumerate(jobs.items()):
            order = ["ours", "HTA"] if (round_ + i) % 2 == 0 else ["HTA", "ours"]
            for tool in order:
                seconds, out = run(commands[tool])
                if round_ > 0:
                    times[path][tool].append(seconds)
                if tool == "HTA":
                    hta_overlap[path] = json.loads(out.strip().splitlines()[-1])

    print(f"machine: {platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores, "
          f"Python {platform.python_version()}; {hta_version}")
    print(f"wall time of a whole process (start to exit), median of {rounds} interleaved "
          "rounds after one warm-up round\n")
    name_width = max(len(p.name) for p in paths)
    print(f"{'trace':<{name_width}}  {'ours s':>7}  {'HTA s':>7}  {'HTA / ours':>10}")
    for path in paths:
        ours, hta = (statistics.median(times[path][tool]) for tool in ("ours", "HTA"))
        print(f"{path.name:<{name_width}}  {ours:7.3f}  {hta:7.3f}  {hta / ours:9.1f}x")
    print("\nwhat each trace is (overlap % per rank, ours / HTA's):")
    for path in paths:
        rel = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
        print(f"  {path.name}: {rel}")
        if str(rel) in TRACES or path.name == "synthetic_gpu":
            print(f"    {TRACES.get(str(rel), SYNTHETIC_GPU)}")
        what, ours = describe(path)
        pairs = ", ".join(f"rank {r}: {_pct(ours.get(r))} / {_pct(hta_overlap[path].get(str(r)))}"
                          for r in sorted(ours))
        print(f"    {what}; {pairs}")


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1f}"


if __name__ == "__main__":
    sys.exit(main())
