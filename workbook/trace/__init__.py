"""The trace toolkit: read what a profiled run really did.

Load a rank's PyTorch-profiler trace (or a whole run directory), classify
its spans into compute, communication, memory copies and waits, and measure
step time, overlap and exposed communication::

    from workbook import trace
    run = trace.load_run("runs/tp-2024")          # every rank
    trace.summary(run)                            # the numbers, per rank
    trace.collectives(run, rank=0, within="backward")
    trace.overlap_pct(run, rank=0, within="backward")
    trace.timeline_figure(run, step=3)            # plotly figure
    trace.write_report(run, "report.html")        # standalone HTML
    trace.merge("runs/tp-2024", "merged.json")    # one file for Perfetto

Modules, one concept each: :mod:`.load` (reading, streaming),
:mod:`.classify` (which span is which kind of time), :mod:`.intervals`
(union/intersection arithmetic), :mod:`.analyse` (the metrics),
:mod:`.view` (timelines, explorer), :mod:`.report` (HTML), :mod:`.merge`
(Perfetto), :mod:`.cli` (the ``workbook trace`` commands).
"""

from .analyse import (Metrics, RankMetrics, StepMetrics, analyse, collectives, exposed_comm_us,
                      kernel_streams, overlap, overlap_pct, step_metrics, summary)
from .classify import canonical_collective, classify
from .load import Run, Trace, TraceError, load_run, load_trace

__all__ = [
    "Metrics", "RankMetrics", "Run", "StepMetrics", "Trace", "TraceError", "analyse",
    "canonical_collective", "classify", "collectives", "exposed_comm_us", "explorer", "load_run",
    "kernel_streams", "load_trace", "merge", "overlap", "overlap_pct", "step_metrics", "summary",
    "timeline_figure", "write_report",
]


def __getattr__(name):
    # plotly-based parts are imported on first use, so that analysis stays light.
    if name in ("timeline_figure", "explorer"):
        from . import view
        return getattr(view, name)
    if name == "write_report":
        from .report import write_report
        return write_report
    if name == "merge":
        from .merge import merge
        return merge
    raise AttributeError(name)
