"""How a benchmark or a report writes its figures: the label of where they were measured, byte
sizes in words, phase timing columns, and the ``--json`` and ``--figure`` files.

Figures on the simulated link are labelled SIMULATED: they are a CPU in slow motion, not
measured hardware.
"""
from __future__ import annotations


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


_UNITS = {"G": 1 << 30, "M": 1 << 20, "K": 1 << 10}


def human(size: int) -> str:
    """1048576 -> "1M"; 1048572 -> "1.0M" (not a whole number of units: one decimal)."""
    for unit in ("G", "M", "K"):
        if size >= _UNITS[unit]:
            value = size / _UNITS[unit]
            return f"{value:.0f}{unit}" if value.is_integer() else f"{value:.1f}{unit}"
    return f"{size}B"


def save_outputs(result: dict, json_path=None, html_path=None, make_figure=None) -> None:
    """A model benchmark's ``--json`` (the result, indented) and ``--figure`` (plotly HTML from
    ``make_figure(result)``), each written only when its path is given (folders made)."""
    import json
    from pathlib import Path
    for path, write in ((json_path, lambda p: p.write_text(json.dumps(result, indent=2) + "\n")),
                        (html_path, lambda p: make_figure(result).write_html(p))):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            write(Path(path))


def traces_line(trace_dir, parts=(), what: str = "variant") -> str:
    """Where a report's traces are: ``traces: DIR`` and, for a report that traces each of
    ``parts`` apart, ``(a folder per variant: naive, bucketed, ...)``. Real paths only: a
    report whose traces were temporary (no ``trace_dir``) prints no such line."""
    where = f"traces: {trace_dir}"
    return f"{where} (a folder per {what}: {', '.join(parts)})" if parts else where


def steps_line(trace_dir, steps) -> str:
    """Where a report's traces are when one file holds several builds, each a step of its own
    (``workbook.trace.capture.traced_step``): ``traces: DIR (a step per build: 0 vanilla TP,
    1 Domino; workbook trace summary DIR --step N)``."""
    named = ", ".join(f"{k} {s}" for k, s in enumerate(steps))
    return (f"traces: {trace_dir} (a step per build: {named}; "
            f"workbook trace summary DIR --step N)")
