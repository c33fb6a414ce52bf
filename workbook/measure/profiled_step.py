"""One step, measured: its wall time, the link ops it issued and its profiler trace, then what
the trace says of it (exposed communication, the hidden share of each pass), and the timing of
a step in named phases. What every family's benchmarks and reports share.

Where the traces go: ``trace_folder(trace_dir, lab)`` is the folder the caller named (kept), or,
with ``trace_dir=None``, a temporary one removed when the block ends: a report that reads its own
traces leaves nothing in the temp dir. Two builds (two variants) traced into one file are told
apart as steps: ``workbook.trace.capture.traced_step(n)`` marks each one ``ProfilerStep#n``, the
marker ``workbook trace summary --step n`` and the trace report cut a trace at.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def trace_folder(trace_dir, lab: str):
    """The folder (a ``Path``) the enclosed profiled steps write their traces to: ``trace_dir``
    when given, else a temporary folder removed with what it holds when the block ends (read the
    traces inside the block)."""
    if trace_dir is not None:
        yield Path(trace_dir)
        return
    import tempfile
    with tempfile.TemporaryDirectory(prefix=f"{lab}-report-") as tmp:
        yield Path(tmp)


def profiled_step(step, tdir, rank: int, lab: str):
    """``step()`` after a barrier, inside the profiler (traces in ``tdir``): ``(elapsed ms, the
    link ops it issued, this rank's trace)``. Shared by the model benchmarks."""
    import torch.distributed as dist

    from workbook import link, trace
    from workbook.trace.capture import rank_trace
    sync = _synchronize()
    dist.barrier()
    since = len(link.op_log())
    with rank_trace(tdir, lab=lab):
        sync()
        t0 = time.perf_counter()
        step()
        sync()                                  # on a GPU: until its last kernel has run
        elapsed = (time.perf_counter() - t0) * 1e3
    ops = [r for r in link.op_log()[since:] if r.op != "barrier"]
    return elapsed, ops, trace.load_trace(Path(tdir) / f"rank{rank}.trace.json")


def _synchronize():
    """``torch.cuda.synchronize`` on a rank whose tensors live on a GPU (kernels run after the
    host launched them: a step's time is until the last one ends), else nothing."""
    import torch
    from workbook.runtime import ranks
    return torch.cuda.synchronize if ranks.device().type == "cuda" else (lambda: None)


def overlap_fields(t, ops) -> dict:
    """A step's exposed communication and the hidden share of each pass, from its trace."""
    from workbook import trace
    out = {"exposed_comm_ms": trace.overlap(t).exposed_comm_us / 1e3}
    for phase, key in (("forward", "overlap_fwd_pct"), ("backward", "overlap_bwd_pct")):
        out[key] = trace.overlap_pct(t, within=phase) if ops else None
    return out


def best_time(fn, make_input, iters: int = 5) -> float:
    """The fastest of ``iters`` timed calls ``fn(make_input())``, every rank starting together
    (a barrier before each): the least disturbed measurement on a shared machine."""
    import math
    import time

    import torch.distributed as dist
    best = math.inf
    for _ in range(iters):
        t = make_input()
        dist.barrier()
        start = time.perf_counter()
        fn(t)
        best = min(best, time.perf_counter() - start)
    return best


def phase_figures(trace_dir, rank: int, phases: dict) -> None:
    """Add to ``phases[name]`` what this rank's trace says of each ``record_function`` phase:
    the collectives issued in it, their link time and the compute inside the phase."""
    from pathlib import Path

    from workbook import trace
    from workbook.trace import intervals
    from workbook.trace.analyse import all_compute, phase_ranges
    t = trace.load_trace(Path(trace_dir) / f"rank{rank}.trace.json")
    for phase in phases:
        window, _ = phase_ranges(t, phase)                  # compute inside this phase only
        busy = intervals.measure(intervals.intersect(all_compute(t), window))
        phases[phase].update(trace_calls=trace.collectives(t, within=phase),
                             comm_ms=trace.overlap(t, within=phase).comm_us / 1e3,
                             compute_ms=busy / 1e3)


def run_phases(trace_dir, lab: str, steps: dict) -> dict:
    """Run ``steps`` (phase name -> ``fn(previous result)``) in order, all ranks starting
    together, each inside a ``record_function`` range of its name, and all inside one profiler
    trace per rank when ``trace_dir`` is given. Per phase: its wall time in ms and the calls the
    flight recorder saw (then, with a trace, what ``phase_figures`` reads from it)."""
    import time
    from contextlib import nullcontext

    import torch
    import torch.distributed as dist
    from workbook.runtime.flight import RECORDER
    tracing = nullcontext()
    if trace_dir is not None:
        from workbook.trace.capture import rank_trace
        tracing = rank_trace(trace_dir, lab=lab)
    dist.barrier()
    phases, result = {}, None
    with tracing:
        for phase, step in steps.items():
            RECORDER.reset()
            t0 = time.perf_counter()
            with torch.profiler.record_function(phase):
                result = step(result)
            phases[phase] = {"ms": (time.perf_counter() - t0) * 1e3, "calls": {
                k: v for k, v in RECORDER.counts().items() if v["count"]}}
    if trace_dir is not None:
        phase_figures(trace_dir, dist.get_rank(), phases)
    return phases
