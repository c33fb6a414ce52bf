"""The labs' figures: what a finished lab measures, printed after its self-check.

The self-check's verdicts (``workbook.grading.engine``) say whether a lab is right; a report
says what it does: bandwidths, hidden communication, activation memory, predictions. A report
is one module per lab, ``workbook.reports.<lab>``, with

* ``run(trace_dir=None)``: runs on every rank (``trace_dir``: a folder for the profiler traces,
  or ``None``); imports the implementation being checked with
  ``workbook.grading.labs.load_lab("<lab>")`` and returns this rank's figures (plain data);
* ``describe(results) -> str``: the figures of every rank (``results[r]`` is rank r's), as text;
* optionally ``WORLD_SIZE`` (default 2) and ``LINK`` (default ``"none"``): the ranks and the
  simulated link preset the figures are taken on, unless ``--nproc`` / ``--link`` say otherwise
  (under torchrun, the job's ranks).

``workbook.selfcheck`` runs it after the checks; a notebook runs it with
``workbook.lessons.on_ranks(report.run, n, trace_dir, link=PRESET)``. A lab that is not finished
raises ``NotImplementedError`` from ``run``, and the figures are skipped. Figures on a simulated
link are labelled so: they are a CPU in slow motion, not measured hardware.
"""


def block_case(sequence_parallel: bool = False):
    """``(cfg, x, dy)`` for the tp and sp figures: a GPT config in fp64 with dropout that splits
    over this job's ranks, and a full ``[B=2, S, H]`` input and output gradient (same on every
    rank)."""
    import torch

    from workbook.model import ModelConfig
    from workbook.tp import rank_device, tp_world_size
    cfg = ModelConfig(dtype="float64", dropout=0.1)
    try:
        cfg.validate(tp=tp_world_size(), sequence_parallel=sequence_parallel)
    except ValueError:
        cfg = ModelConfig.odd_shapes(dtype="float64", dropout=0.1)
    g = torch.Generator().manual_seed(0)
    shape = (2, cfg.seq_len, cfg.hidden)
    x = torch.randn(*shape, generator=g, dtype=torch.float64).to(rank_device())
    dy = torch.randn(*shape, generator=g, dtype=torch.float64).to(rank_device())
    return cfg, x, dy


def where_measured(link_label, without: str = "gloo") -> str:
    """How a figure was taken: the simulated link, labelled so, or ``without`` (plain gloo)."""
    return link_label.replace("simulated", "SIMULATED", 1) if link_label else without


PHASE_TIMES_HEADER = f"{'wall ms':>9}{'comm ms':>9}{'compute ms':>11}"


def phase_times(p: dict) -> str:
    """``wall ms``, ``comm ms`` and ``compute ms`` columns of one phase (``run_phases``);
    the last two need a trace (``-`` without one)."""
    comm = f"{p['comm_ms']:.2f}" if "comm_ms" in p else "-"
    comp = f"{p['compute_ms']:.2f}" if "compute_ms" in p else "-"
    return f"{p['ms']:>9.2f}{comm:>9}{comp:>11}"


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
    from workbook.flight import RECORDER
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
